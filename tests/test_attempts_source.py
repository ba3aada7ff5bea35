"""`--attempts N` bounds every request of mirror and restore, their first look at an S3 source
included.

Found by a hostile review (2026-12-07): with an S3 answering 503 to everything, `restore` from
it and `mirror` from it with `--attempts 2` sent 25 requests over 25-38 s before exit 2. Their
first look at the source (does it hold anything, the runs `--run` names) used the client's own
retries, 5 inside each of s3fs's 5. The destination side already sent 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from backends.s3.embedded import EmbeddedS3
from tests._fault_proxy import Fault, FaultProxy, Request

CLI = str(Path(sys.executable).parent / "ckptfs")


@pytest.mark.parametrize("command", ["restore", "mirror"])
def test_attempts_bound_the_look_at_an_s3_source(s3: EmbeddedS3, tmp_path: Path, command: str) -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def throttled(req: Request) -> Fault:
        with lock:
            seen.append(req.method)
        return Fault(status=503, code="SlowDown")

    opts = s3.storage_options
    env = dict(os.environ, AWS_ACCESS_KEY_ID=opts["key"], AWS_SECRET_ACCESS_KEY=opts["secret"],
               AWS_DEFAULT_REGION="us-east-1")
    with FaultProxy(s3.endpoint, throttled) as proxy:
        once = ["--once"] if command == "mirror" else []
        done = subprocess.run([CLI, command, s3.url("throttled"), str(tmp_path / "dst"), *once,
                               "--no-progress", "--attempts", "2",
                               "--from-option", f"client_kwargs.endpoint_url={proxy.endpoint}"],
                              capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "still failing after 2 attempts" in done.stderr, done.stderr
    assert len(seen) == 2, seen  # was 25
