"""Crash safety by killing for real: every acknowledged commit survives SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ckptfs import CheckpointStore, StepStatus

CHILD = str(Path(__file__).with_name("_child_committer.py"))
ROOT = str(Path(__file__).resolve().parent.parent)


def kill_loop(url: str, opts: dict[str, Any], side: Path, kills: int, seed: int,
              max_delay: float = 0.15) -> int:
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": ROOT}
    acknowledged = 0
    for _ in range(kills):
        child = subprocess.Popen([sys.executable, CHILD, url, json.dumps(opts), str(side)],
                                 stdout=subprocess.PIPE, env=env)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, max_delay))
        child.send_signal(signal.SIGKILL)
        child.wait()
        recorded = side.read_text().split()
        run = CheckpointStore(url, storage_options=opts).load_run("crash")
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
