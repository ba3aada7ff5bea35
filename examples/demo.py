"""`make demo` until the paper agent lands: write, crash (SIGKILL), reload, on disk and S3."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.s3.embedded import EmbeddedS3  # noqa: E402
from ckptfs import AgentRun, CheckpointStore, StepStatus  # noqa: E402

CHILD = """
import json, sys
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
url, opts = sys.argv[1], json.loads(sys.argv[2])
store = CheckpointStore(url, storage_options=opts)
run = AgentRun(run_id="demo-run", goal="process 500 papers")
for i in range(500):
    run.add_step(Step(id=f"paper-{i:03d}", title=f"paper {i}"))
store.save_run(run)
for i in range(500):
    s = run.steps[f"paper-{i:03d}"]
    s.status, s.result = StepStatus.COMPLETED, f"findings of paper {i}"
    store.commit(run, [s])
    print(i, flush=True)
"""


def crash_and_reload(url: str, opts: dict[str, object], label: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, json.dumps(opts)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    last = -1
    for line in child.stdout:
        last = int(line)
        if last >= 346:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    store = CheckpointStore(url, storage_options=opts)
    run = store.load_run("demo-run")
    assert isinstance(run, AgentRun)
    done = run.completed_count
    nxt = next(s.id for s in run.steps.values() if s.status != StepStatus.COMPLETED)
    print(f"[{label}] killed after paper {last} was acknowledged; reloaded {done} completed "
          f"papers; resume at {nxt}")
    if done < last + 1:
        raise SystemExit(f"[{label}] LOST acknowledged work: {done} < {last + 1}")


def main() -> None:
    workdir = ROOT / ".demo"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir()
    t0 = time.time()
    crash_and_reload(str(workdir / "local"), {}, "local disk")
    with EmbeddedS3(bucket="ckptfs-demo") as s3:
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        crash_and_reload(s3.url("runs-demo"), s3.storage_options, "embedded S3")
    print(f"demo ok in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
