"""Crash safety by killing for real: every acknowledged commit survives SIGKILL."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from _child_committer import commit_after_ready
from _forkserver import context

from ckptfs import CheckpointStore, StepStatus

# Each child is forked from a forkserver that has imported ckptfs (and s3fs) once, so a kill
# costs its random delay and the check, not an interpreter start (about 0.3 s): the children
# are still separate processes, each SIGKILLed mid-commit.


def kill_loop(url: str, opts: dict[str, Any], side: Path, kills: int, seed: int,
              max_delay: float = 0.15) -> int:
    rng = random.Random(seed)
    ctx = context()
    acknowledged = 0
    for _ in range(kills):
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=commit_after_ready, args=(url, json.dumps(opts), str(side), send))
        child.start()
        send.close()
        assert recv.poll(60) and recv.recv() == "ready"
        time.sleep(rng.uniform(0.0, max_delay))
        child.kill()  # SIGKILL
        child.join()
        recv.close()
        recorded = side.read_text().split()
        with CheckpointStore(url, storage_options=opts) as checker:  # compactor done before the next child
            run = checker.load_run("crash")
        assert run is not None
        for sid in recorded:
            step = run.steps[sid]
            assert step.status == StepStatus.COMPLETED, f"{sid} was acknowledged, then lost"
            assert step.result == f"result of {sid}"
        acknowledged = len(recorded)
    return acknowledged


def test_sigkill_local_disk_50_times(tmp_path: Path) -> None:
    side = tmp_path / "acked.txt"
    side.touch()
    n = kill_loop(str(tmp_path / "store"), {}, side, kills=50, seed=1)
    assert n > 100  # the children really committed work between kills


def test_sigkill_s3_over_http(tmp_path: Path, s3_url: str, s3_opts: dict[str, Any]) -> None:
    side = tmp_path / "acked.txt"
    side.touch()
    n = kill_loop(s3_url, s3_opts, side, kills=8, seed=2, max_delay=0.4)  # S3 commits are slower
    assert n > 10
