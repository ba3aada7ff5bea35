"""Child process for the crash test: commit steps forever, recording each acknowledged one."""

from __future__ import annotations

import json
import os
import sys

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus


def main() -> None:
    url, opts_json, side = sys.argv[1], sys.argv[2], sys.argv[3]
    policy = CompactionPolicy(fanout=4, max_plan=6, min_snapshot_bytes=8192, keep_last=2)
    store = CheckpointStore(url, storage_options=json.loads(opts_json), policy=policy)
    run = store.load_run("crash")
    if run is None:
        run = AgentRun(run_id="crash", goal="survive SIGKILL")
        for i in range(4_000):
            run.add_step(Step(id=f"s{i:05d}", title=f"step {i}"))
        store.save_run(run)
    pending = (s for s in run.steps.values() if s.status != StepStatus.COMPLETED)
    with open(side, "a") as out:
        print("ready", flush=True)
        for step in pending:
            step.status, step.result = StepStatus.COMPLETED, f"result of {step.id}"
            step.attempt_count += 1
            store.commit(run, [step])
            out.write(step.id + "\n")  # written only after commit() returned
            out.flush()
            os.fsync(out.fileno())


if __name__ == "__main__":
    main()
