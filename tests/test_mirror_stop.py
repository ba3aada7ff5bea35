"""Stopping a mirror: Ctrl-C of a pass over many runs, and MirrorJob's last pass at shutdown.

Found by a hostile review (2026-12-07) of the day's changes (runs mirrored several at once,
their records one at a time; a last pass at shutdown):
- Ctrl-C of `ckptfs mirror` over 30 runs behind 2 s uploads took 18 s to exit (2 s before):
  every run under way finished its whole pass. Now nothing more is begun after the Ctrl-C.
- One bad run id given to `notify()` failed the last pass for every run, on every exit.
- The last pass, with an end that stopped answering, held `shutdown()` for two minutes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_mirror import POLICY, work

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore
from ckptfs.errors import InvalidIdError
from ckptfs.replication.job import FINAL_ATTEMPTS, MirrorJob
from tests._fault_proxy import Fault, FaultProxy, Request

CLI = str(Path(sys.executable).parent / "ckptfs")


def test_ctrl_c_of_a_pass_over_many_runs_begins_nothing_more(s3: EmbeddedS3, tmp_path: Path) -> None:
    src = tmp_path / "src"
    with CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024) as store:
        for i in range(12):
            work(store, f"run-{i:02d}", 12, stop_after=10)
    arrivals: list[float] = []
    lock = threading.Lock()

    def rule(req: Request) -> Fault | None:
        if req.method == "PUT":
            with lock:
                arrivals.append(time.monotonic())
            return Fault(delay=1.0)
        return None

    opts = s3.storage_options
    env = dict(os.environ, AWS_ACCESS_KEY_ID=opts["key"], AWS_SECRET_ACCESS_KEY=opts["secret"],
               AWS_DEFAULT_REGION="us-east-1")
    with FaultProxy(s3.endpoint, rule) as proxy:
        proc = subprocess.Popen([CLI, "mirror", str(src), s3.url("stop-many"), "--once", "--latest",
                                 "--no-progress", "--workers", "4", "--json", "--to-option",
                                 f"client_kwargs.endpoint_url={proxy.endpoint}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while len(arrivals) < 6 and time.monotonic() < deadline:  # several runs under way
            time.sleep(0.05)
        assert len(arrivals) >= 6, "the pass never got going"
        proc.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err[-2000:])
    # what was in flight ends; nothing is begun after the Ctrl-C (each run under way went on
    # to its next file, one a second here, until its pass was done)
    late = [t for t in arrivals if t > stopped + 0.5]
    assert late == [], f"{len(late)} uploads begun after the Ctrl-C"
    checked = subprocess.run([CLI, "verify", s3.url("stop-many"), "--json", "-o",
                              f"client_kwargs.endpoint_url={s3.endpoint}"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout[-2000:]  # never half-way


def test_a_bad_run_id_is_refused_at_notify_and_the_last_pass_mirrors_the_others(
        tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    with CheckpointStore(src, policy=POLICY, artifact_threshold=1024) as store:
        work(store, "good", 40, stop_after=6)
        job = MirrorJob(src, memory_url, every_n=100).start()
        trigger = job.step_trigger()
        job.notify("good", store.list_versions("good")[-1])
        for bad in ("team/x", "../x", "", "r0\n", "x" * 5000):
            with pytest.raises(InvalidIdError):
                job.notify(bad, 1)
            with pytest.raises(InvalidIdError):
                trigger(bad, 1)
        job.shutdown()
        mirrored = CheckpointStore(memory_url)
        assert mirrored.load_run("good") == store.load_run("good")  # was: the pass failed, None


def test_the_last_pass_makes_few_tries_and_is_made_after_a_failed_pass_too(
        s3: EmbeddedS3, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Bounded by tries, not skipped for what an earlier pass met: a second review found a
    run left with nothing on a mirror that had come back, because one pass before had failed."""
    src = str(tmp_path / "src")
    with CheckpointStore(src, policy=POLICY, artifact_threshold=1024) as store:
        work(store, "r", 40, stop_after=4)
        down = threading.Event()
        seen: list[tuple[str, str]] = []

        def rule(req: Request) -> Fault | None:
            if down.is_set():
                seen.append((req.method, req.path))
                return Fault(status=503, code="SlowDown")
            return None

        with FaultProxy(s3.endpoint, rule) as proxy:
            opts: dict[str, Any] = dict(s3.storage_options)
            opts["client_kwargs"] = {**opts["client_kwargs"], "endpoint_url": proxy.endpoint}
            # the mirror stops answering (503 to everything) after notify: few tries
            job = MirrorJob(src, s3.url("final-down"), every_n=100, attempts=6, base_delay=0.01,
                            dst_options=opts).start()
            job.notify("r", 4)
            down.set()
            with caplog.at_level(logging.INFO, logger="ckptfs"):
                job.shutdown()
            assert seen, "the last pass sent nothing"
            per_request = {r: seen.count(r) for r in seen}
            assert max(per_request.values()) <= FINAL_ATTEMPTS, per_request  # not 6 each
            assert f"still failing after {FINAL_ATTEMPTS} attempts" in caplog.text
            # a pass fails, the mirror comes back, the run goes on: the last pass mirrors it
            down.clear()
            job = MirrorJob(src, s3.url("final-back"), every_n=100, attempts=2, base_delay=0.01,
                            dst_options=opts).start()
            job.notify("r", 4)
            down.set()
            failed = job.run_now()  # raised inside (job.last_error), or came back not ok
            assert job.last_error is not None or (failed is not None and not failed.ok)
            down.clear()
            work(store, "r", 40, stop_after=3)
            job.notify("r", store.list_versions("r")[-1])
            job.shutdown()
            mirrored = CheckpointStore(s3.url("final-back"), s3.storage_options)
            assert mirrored.load_run("r") == store.load_run("r")
