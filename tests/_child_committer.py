"""Child process for the crash test: commit steps forever, recording each acknowledged one.

`commit_forever` is the child's whole life. The crash test starts it in a process forked from a
multiprocessing forkserver that has ckptfs imported already (a fresh interpreter importing it
costs about 0.3 s, most of each kill's time); run as a script it does the same, saying "ready"
on stdout.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus


def commit_forever(url: str, opts_json: str, side: str, ready: Callable[[], None]) -> None:
    """Load (or create) run "crash" and complete its steps one commit at a time, appending each
    step's id to `side` (fsync'd) only after its commit returned; `ready()` before the first."""
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
        ready()
        for step in pending:
            step.status, step.result = StepStatus.COMPLETED, f"result of {step.id}"
            step.attempt_count += 1
            store.commit(run, [step])
            out.write(step.id + "\n")  # written only after commit() returned
            out.flush()
            os.fsync(out.fileno())


def commit_after_ready(url: str, opts_json: str, side: str, conn: Connection) -> None:
    """`commit_forever` in a multiprocessing child: "ready" goes over `conn`."""
    commit_forever(url, opts_json, side, lambda: conn.send("ready"))


def main() -> None:
    url, opts_json, side = sys.argv[1], sys.argv[2], sys.argv[3]
    commit_forever(url, opts_json, side, lambda: print("ready", flush=True))


if __name__ == "__main__":
    main()
