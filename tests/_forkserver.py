"""The multiprocessing forkserver of the kill tests, with what their children import preloaded.

A child forked from it starts in milliseconds instead of importing ckptfs (and s3fs, and the
test module its target lives in) afresh, about 0.3-0.6 s of CPU per child: the kill tests start
dozens. Each child is still a process of its own, killed for real.

multiprocessing (3.11) starts the forkserver with the parent's environment but not its
sys.path, so the preload of a module under tests/ failed silently (ImportError is ignored) and
every child imported it itself; PYTHONPATH names this checkout and tests/ while it starts. A
process has one forkserver: whichever test starts it, the list covers all of them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PRELOAD = ["ckptfs.replication.mirror", "s3fs", "_child_committer", "test_mirror_kill"]


def context() -> ForkServerContext:
    """The forkserver context, its server running with PRELOAD imported from this checkout."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # heeded when the server starts (below, or earlier)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), *([before] if before else [])])
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    return ctx
