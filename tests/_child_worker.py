"""Child process for the multi-worker tests: one Worker on a shared run.

argv: url, storage options (JSON), worker id, lease ttl, side-effect file, slow step id,
seconds the slow step sleeps after its paid call. Each real "paid" call appends a line to the
side-effect file (as a paid API would bill it); a line "started <step>" marks the slow step's
start so the parent knows when to kill or stop this process. The report goes to stdout as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ckptfs import CheckpointStore, Step, ToolCall
from ckptfs.runtime.worker import Worker


def main() -> None:
    url, opts, wid, ttl, side, slow, nap = sys.argv[1:8]
    store = CheckpointStore(url, json.loads(opts))
    worker = Worker(store, worker_id=wid, lease_ttl=float(ttl), poll_interval=0.1)

    def bill(step_id: str) -> str:
        with open(side, "a") as f:
            f.write(f"paid {step_id} {wid}\n")
        return f"answer for {step_id}"

    def executor(step: Step, prior: list[ToolCall]) -> str:
        answer = worker.tools().run("paid", {"step": step.id}, lambda **_: bill(step.id))
        if step.id == slow:
            with open(side, "a") as f:
                f.write(f"started {step.id} {wid}\n")
            time.sleep(float(nap))
        return f"{answer} by {wid}"

    report = worker.work("shared", executor, idle_timeout=60)
    out: dict[str, Any] = {"completed": report.completed, "lost": report.lost,
                           "status": report.run_status}
    print(json.dumps(out), flush=True)
    store.close()


if __name__ == "__main__":
    main()
