"""Ctrl-C of a scheduled `ckptfs mirror --interval` says whether a pass completed.

The first pass runs right away on the main thread, where Ctrl-C lands. Stopped there, the
command exited 0 with no report, though no pass had completed, while `--once` stopped the same
way says 130 (found by a hostile review, 2026-12-07). Stopped between passes, it exits with the
last pass's code, 0 when that pass was ok.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step
from tests._fault_proxy import Fault, FaultProxy, Request

CLI = str(Path(sys.executable).parent / "ckptfs")


def _store(root: Path) -> None:
    with CheckpointStore(str(root)) as st:
        run = AgentRun(run_id="papers", goal="g")
        for i in range(3):
            run.add_step(Step(id=f"p{i}", title=f"paper {i}"))
        st.save_run(run)


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_ctrl_c_during_the_first_pass_is_130_and_between_passes_the_last_pass_code(
        s3: EmbeddedS3, tmp_path: Path, json_out: bool) -> None:
    src = tmp_path / "src"
    _store(src)
    slow = [True]

    def rule(req: Request) -> Fault | None:
        return Fault(delay=1.0) if slow[0] else None

    opts = s3.storage_options
    env = dict(os.environ, AWS_ACCESS_KEY_ID=opts["key"], AWS_SECRET_ACCESS_KEY=opts["secret"],
               AWS_DEFAULT_REGION="us-east-1")
    with FaultProxy(s3.endpoint, rule) as proxy:
        for during_first_pass in (True, False):
            slow[0] = during_first_pass
            dst = s3.url(f"sched-{int(during_first_pass)}-{int(json_out)}")
            cmd = [CLI, "mirror", str(src), dst, "--interval", "60s", "--no-progress",
                   "--to-option", f"client_kwargs.endpoint_url={proxy.endpoint}",
                   *(["--json"] if json_out else [])]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env)
            try:
                if during_first_pass:
                    time.sleep(2.5)  # started, its first requests held by the proxy
                else:
                    deadline = time.monotonic() + 60
                    with CheckpointStore(dst, opts) as mirrored:
                        while not mirrored.list_runs() and time.monotonic() < deadline:
                            time.sleep(0.2)  # until the first pass has copied the run
                    time.sleep(1.0)
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
            if during_first_pass:
                assert proc.returncode == 130, (out, err)  # was 0, with no report
            else:
                assert proc.returncode == 0, (out, err)
                assert "papers" in out
