"""Two agents on one run: the second stops with ConflictError; nothing is overwritten.

`CheckpointedAgent` runs a run in one process (a `Worker` is how several share one). A hostile
review (2026-12-07) resumed one run twice, as a restarted supervisor does:

* two stores (two processes): the second agent met ConflictError inside a step's tool call,
  retried the step as a failure, caught up through its tool-call log (which rebases) and then
  committed its older copy of every step over the first's. Both returned "completed", every
  completion was acknowledged twice and the last writer's results were kept;
* two real processes at once: 46-48 paid calls for 24 distinct ones;
* two agents of one store, on two threads: 8 of 10 calls paid twice.

Now a ConflictError stops the execution with nothing more written, a plain commit of a step
another writer changed since this copy was loaded is refused (StaleStepsError), and one store
runs one execution per run at a time (RunBusyError).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    AgentRun,
    CheckpointedAgent,
    CheckpointStore,
    IdempotentToolRunner,
    Step,
    StepStatus,
    ToolCall,
)
from ckptfs.errors import ConflictError, RunBusyError, StaleStepsError

RUN = "shared"


def _new_run(url: str, opts: dict[str, Any], steps: int = 4) -> None:
    run = AgentRun(run_id=RUN, goal="one run, resumed twice")
    for i in range(steps):
        run.add_step(Step(id=f"s{i}", title=f"step {i}"))
    with CheckpointStore(url, opts) as st:
        st.save_run(run)


def test_an_agent_whose_run_another_finished_stops_and_overwrites_nothing(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = shared_url
    _new_run(url, opts)
    paid: list[tuple[str, str]] = []
    acked: list[tuple[str, str]] = []

    def executor_of(agent: CheckpointedAgent, tag: str) -> Any:
        def executor(step: Step, prior: list[ToolCall]) -> str:
            receipt = IdempotentToolRunner(agent, RUN, step.id).run(
                "charge", {"step": step.id}, lambda step: paid.append((step, tag)) or f"receipt-{step}")
            return f"{tag}:{receipt}"
        return executor

    with CheckpointStore(url, opts) as store_a, CheckpointStore(url, opts) as store_b:
        agent_a = CheckpointedAgent(store_a, on_progress=lambda e: e.kind == "step_completed"
                                    and acked.append((str(e.step_id), "A")))
        agent_b = CheckpointedAgent(store_b, on_progress=lambda e: e.kind == "step_completed"
                                    and acked.append((str(e.step_id), "B")))
        run_a = agent_a.resume_run(RUN)  # both read the run before either executes it
        run_b = agent_b.resume_run(RUN)
        assert agent_b.execute_run(run_b, executor_of(agent_b, "B")).status == "completed"
        with pytest.raises(ConflictError):
            agent_a.execute_run(run_a, executor_of(agent_a, "A"))
    with CheckpointStore(url, opts) as st:
        final = st.load_run(RUN)
        assert final is not None and final.status == "completed"
        assert {s.id: s.result for s in final.steps.values()} == {
            f"s{i}": f"B:receipt-s{i}" for i in range(4)}
        assert all(len(st.get_tool_call_history(RUN, f"s{i}")) == 1 for i in range(4))
    assert sorted(paid) == [(f"s{i}", "B") for i in range(4)]
    assert sorted(acked) == [(f"s{i}", "B") for i in range(4)]  # A acknowledged nothing


def test_a_plain_commit_of_a_step_another_writer_changed_is_refused(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """The store's side: caught up through a tool-call record (which rebases), a writer still
    holds its older copy of the step; committing it is refused and writes nothing, until the
    run is loaded (or refreshed) again."""
    url, opts = shared_url
    _new_run(url, opts)
    with CheckpointStore(url, opts) as mine, CheckpointStore(url, opts) as other:
        run = mine.load_run(RUN)
        theirs = other.load_run(RUN)
        assert run is not None and theirs is not None
        theirs.steps["s0"].status, theirs.steps["s0"].result = StepStatus.COMPLETED, "theirs"
        other.commit(theirs, ["s0"])
        mine.log_tool_call(RUN, "s1", ToolCall(tool_name="t", arguments={}, result="r",
                                               idempotency_key="k1"))  # rebases over their record
        run.steps["s0"].status, run.steps["s0"].result = StepStatus.COMPLETED, "mine"
        with pytest.raises(StaleStepsError) as info:
            mine.commit(run, ["s0"])
        assert info.value.step_ids == ["s0"] and "reload the run" in str(info.value)
        run.steps["s2"].result = "a step nobody else touched"
        mine_again = mine.load_run(RUN)  # a fresh copy: its s0 is theirs
        assert mine_again is not None and mine_again.steps["s0"].result == "theirs"
        mine_again.steps["s2"].status, mine_again.steps["s2"].result = StepStatus.COMPLETED, "s2"
        mine.commit(mine_again, ["s2"])
        # refresh hands over a current copy too: what it returns commits
        other_run = other.refresh(RUN)
        assert other_run is not None and other_run.steps["s2"].status == StepStatus.COMPLETED
        other_run.steps["s2"].result = "after refresh"
        other.commit(other_run, ["s2"])
    with CheckpointStore(url, opts) as st:
        final = st.load_run(RUN)
        assert final is not None
        assert final.steps["s0"].result == "theirs" and final.steps["s2"].result == "after refresh"


def test_two_agents_of_one_store_do_not_execute_one_run_at_once(tmp_path: Path) -> None:
    with CheckpointStore(str(tmp_path / "store")) as store:
        run = AgentRun(run_id=RUN, goal="g")
        run.add_step(Step(id="a", title="a"))
        store.save_run(run)
        first, second = CheckpointedAgent(store), CheckpointedAgent(store)
        inside, release = threading.Event(), threading.Event()
        paid: list[str] = []

        def slow(step: Step, prior: list[ToolCall]) -> str:
            inside.set()
            release.wait(30)
            runner = IdempotentToolRunner(first, RUN, step.id)
            return runner.run("charge", {}, lambda: paid.append("x") or "r")

        done: list[str] = []
        worker = threading.Thread(target=lambda: done.append(first.execute_run(run, slow).status))
        worker.start()
        try:
            assert inside.wait(30)
            with pytest.raises(RunBusyError, match="being executed by another agent"):
                second.execute_run(second.resume_run(RUN), slow)
        finally:
            release.set()
            worker.join(60)
        assert done == ["completed"] and paid == ["x"]
        # once the first is over, the run may be executed again (nothing left to do)
        assert second.execute_run(second.resume_run(RUN), slow).status == "completed"
        assert paid == ["x"]


CHILD = textwrap.dedent("""
    import json, os, sys, time
    from ckptfs import CheckpointStore, CheckpointedAgent, IdempotentToolRunner
    url, opts, side, tag = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]

    def note(line):
        fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)

    store = CheckpointStore(url, opts)
    agent = CheckpointedAgent(store, on_progress=lambda e: e.kind == "step_completed"
                              and note(f"DONE {e.step_id} {tag}"))

    def tool(x):
        note(f"PAID {x} {tag}")
        time.sleep(0.1)
        return f"r-{x}"

    def executor(step, prior):
        first = IdempotentToolRunner(agent, "shared", step.id).run("paid", {"x": step.id}, tool)
        second = IdempotentToolRunner(agent, "shared", step.id).run("paid", {"x": step.id + "/2"}, tool)
        return f"{tag}:{first}:{second}"

    try:  # resuming writes too: the one that meets the other's versions there stops there
        agent.execute_run(agent.resume_run("shared"), executor)
        print(tag, "completed")
    except Exception as exc:
        print(tag, type(exc).__name__)
    store.close()
""")


def test_two_processes_resuming_one_run_at_once(shared_url: tuple[str, dict[str, Any]],
                                                 tmp_path: Path) -> None:
    """Two real processes resume the same run at the same moment. Each step is acknowledged
    completed by one of them only, its result is that one's, and a call is paid twice only
    if both were inside it at the moment they met (at most one per process: the one in flight)."""
    url, opts = shared_url
    _new_run(url, opts, steps=12)
    side = tmp_path / "side.txt"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, url, json.dumps(opts), str(side), tag],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for tag in ("A", "B")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lines = side.read_text().split("\n")
    done = [ln.split()[1:] for ln in lines if ln.startswith("DONE")]
    paid = [ln.split()[1] for ln in lines if ln.startswith("PAID")]
    by_step: dict[str, list[str]] = {}
    for sid, tag in done:
        by_step.setdefault(sid, []).append(tag)
    assert sorted(by_step) == sorted(f"s{i}" for i in range(12))
    assert all(len(tags) == 1 for tags in by_step.values()), by_step  # was every step by both
    assert len(paid) - len(set(paid)) <= 2, paid  # was 22-24 of 24 paid twice
    with CheckpointStore(url, opts) as st:
        final = st.load_run(RUN)
        assert final is not None and final.status == "completed"
        assert all(s.status == StepStatus.COMPLETED for s in final.steps.values())
