"""Group commit: concurrent commits share journal records; each is acknowledged once durable.

What is checked, on a real disk where it matters (a fresh store reads only what is stored):
* aexecute_run at concurrency 64 writes far fewer records than steps, and every
  `step_completed` event, every returned tool result and every started dependant finds its
  completion (or result, or the lazy RUNNING mark) in a fresh load;
* errors go to the part whose change caused them: a part refused alone fails alone, a record
  refused for its content is split so the innocent parts land, a lost race fails the step
  parts and rebases the paid tool results;
* the queue keeps order: parts land in versions that never go backwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.errors import ConflictError, NonFiniteValueError, RunStoppedError
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.execution import ProgressEvent
from ckptfs.store.group_commit import GroupCommitter, GroupPart


def version_of(url: str, run_id: str) -> int:
    store = CheckpointStore(url)
    store.load_run(run_id)
    assert store.last_load is not None
    v = store.last_load.version
    store.close()
    return v


def fresh(url: str, run_id: str) -> AgentRun:
    store = CheckpointStore(url)
    run = store.load_run(run_id)
    store.close()
    assert run is not None
    return run


def test_concurrent_completions_share_records_and_are_durable_when_acknowledged(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    problems: list[str] = []
    checked: list[str] = []

    def on_progress(event: ProgressEvent) -> None:  # a raise here would only be logged
        if event.kind != "step_completed" or event.step_id is None or int(event.step_id[1:]) % 25:
            return
        step = fresh(url, "g").steps[event.step_id]
        checked.append(event.step_id)
        if step.status != StepStatus.COMPLETED or step.result != f"r{event.step_id}":
            problems.append(f"{event.step_id} acknowledged as {step.status}")

    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, on_progress=on_progress)
    run = agent.start_run("group", [Step(id=f"s{i:03d}", title="t") for i in range(400)], run_id="g")
    before = version_of(url, "g")

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        await asyncio.sleep(0)
        return f"r{step.id}"

    asyncio.run(agent.aexecute_run(run, executor, concurrency=64))
    store.close()
    assert run.status == "completed"
    assert not problems and len(checked) == 16
    records = version_of(url, "g") - before
    assert records < 400 / 4, f"{records} records for 400 concurrent completions"
    loaded = fresh(url, "g")
    assert loaded.completed_count == 400 and loaded.status == "completed"


def test_dependants_start_only_once_their_dependencies_are_durable(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    steps = [Step(id="root", title="root")]
    steps += [Step(id=f"m{i:02d}", title="mid", dependencies=["root"]) for i in range(48)]
    steps += [Step(id=f"l{i:02d}", title="leaf", dependencies=[f"m{i:02d}", f"m{(i + 1) % 48:02d}"])
              for i in range(48)]
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("deps", steps, run_id="d")
    early: list[str] = []
    durable: set[str] = set()
    commit = store._commit

    def slow_commit(run_id: str, changes: Any, **kw: Any) -> int:
        time.sleep(0.004)  # a slow disk: completions pile up behind the record being written
        version = commit(run_id, changes, **kw)
        durable.update(s.id for s in kw["changed_steps"] if s.status == StepStatus.COMPLETED)
        return version  # written, and no caller acknowledged yet

    store._commit = slow_commit  # type: ignore[method-assign]

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        if step.dependencies:
            early.extend(f"{step.id} started before {d} was durable" for d in step.dependencies
                         if d not in durable)
        await asyncio.sleep(0.001 * (int(step.id[1:]) % 16) if step.id[0] == "m" else 0.0)  # staggered
        return "ok"

    asyncio.run(agent.aexecute_run(run, executor, concurrency=64))
    store.close()
    assert run.status == "completed" and not early, early


def test_tool_results_and_running_marks_are_durable_before_the_runner_goes_on(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("tools", [Step(id=f"t{i:02d}", title="t") for i in range(40)], run_id="t")
    problems: list[str] = []

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        sid = step.id

        async def pay(key: str) -> str:
            stored = fresh(url, "t").steps[sid]  # the lazy RUNNING mark, before the paid call
            if stored.status != StepStatus.RUNNING or stored.attempt_count != 1:
                problems.append(f"{sid}: {stored.status} attempt {stored.attempt_count} at the call")
            await asyncio.sleep(0.001)
            return f"paid {key}"

        got = await agent.tools().arun("pay", {"key": sid}, pay)
        reader = CheckpointStore(url)
        calls = reader.get_tool_call_history("t", sid)
        reader.close()
        if not any(c.phase == "completed" and c.result == got for c in calls):
            problems.append(f"{sid}: tool result returned before it was durable")
        return str(got)

    asyncio.run(agent.aexecute_run(run, executor, concurrency=40))
    store.close()
    assert run.status == "completed" and not problems


def test_sync_execute_run_acknowledges_a_step_after_its_commit(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    late: list[str] = []

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "step_completed" and event.step_id is not None and \
                fresh(url, "s").steps[event.step_id].status != StepStatus.COMPLETED:
            late.append(event.step_id)

    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, on_progress=on_progress)
    run = agent.start_run("sync", [Step(id=f"s{i}", title="t", dependencies=[f"s{i - 1}"] if i else [])
                                   for i in range(6)], run_id="s")
    agent.execute_run(run, lambda step, prior: "ok")
    store.close()
    assert run.status == "completed" and not late


def test_a_refused_step_fails_alone_and_its_batchmates_land(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("bad", [Step(id=f"s{i}", title="t") for i in range(8)], run_id="b")
    arrived = [0]

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        arrived[0] += 1
        while arrived[0] < 8:  # all eight finish together, so they commit together
            await asyncio.sleep(0.001)
        if step.id == "s3":
            step.metadata["score"] = float("nan")  # no load could give it back
        return "ok"

    # refused by name before its commit, the run stopped at it (RunStoppedError, the stop
    # committed; before, the bare NonFiniteValueError of the record that refused it)
    with pytest.raises(RunStoppedError, match="'s3'") as info:
        asyncio.run(agent.aexecute_run(run, executor, concurrency=8))
    assert isinstance(info.value.cause, NonFiniteValueError)
    store.close()
    loaded = fresh(url, "b")
    assert loaded.steps["s3"].status != StepStatus.COMPLETED
    assert all(loaded.steps[f"s{i}"].status == StepStatus.COMPLETED for i in range(8) if i != 3)


# ------------------------------------------------------------------ store level: commit_many

def saved(url: str, n: int = 3) -> tuple[CheckpointStore, AgentRun]:
    store = CheckpointStore(url)
    run = AgentRun(run_id="m", goal="many")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title="t"))
    store.save_run(run)
    return store, run


def done(step: Step, result: str) -> Step:
    step.status, step.result = StepStatus.COMPLETED, result
    return step


def call(i: int) -> ToolCall:
    return ToolCall(id=f"c{i}", tool_name="pay", arguments={"i": i}, result=f"paid {i}", phase="completed")


def test_commit_many_a_part_refused_alone_fails_alone_in_one_record() -> None:
    url = f"memory://gc-{uuid.uuid4().hex[:8]}"
    store, run = saved(url)
    v0 = version_of(url, "m")
    good = GroupPart("m", run, [done(run.steps["s0"], "zero")])
    bad_step = run.steps["s1"]
    bad_step.metadata["x"] = float("inf")
    bad = GroupPart("m", run, [bad_step])
    paid = GroupPart("m", tool_calls=[("s2", call(2))])
    store.commit_many([good, bad, paid])
    assert good.future.result() == paid.future.result() == v0 + 1  # one record for both
    assert isinstance(bad.future.exception(), NonFiniteValueError)
    loaded = fresh(url, "m")
    assert loaded.steps["s0"].result == "zero" and loaded.steps["s1"].status == StepStatus.PENDING
    assert [c.result for c in CheckpointStore(url).get_tool_call_history("m", "s2")] == ["paid 2"]
    del bad_step.metadata["x"]  # the refused part left nothing behind: fixed, it commits
    assert store.commit(run, [done(bad_step, "one")]) == v0 + 2
    assert fresh(url, "m").steps["s1"].result == "one"


def test_commit_many_a_record_refused_for_its_content_is_split() -> None:
    url = f"memory://gc-{uuid.uuid4().hex[:8]}"
    store, run = saved(url)
    v0 = version_of(url, "m")
    good = GroupPart("m", run, [done(run.steps["s0"], "zero")])
    ghost = run.steps["s1"]
    ghost.dependencies = ["nowhere"]  # only the graph check of the whole record sees it
    bad = GroupPart("m", run, [ghost])
    paid = GroupPart("m", tool_calls=[("s2", call(2))])
    store.commit_many([good, bad, paid])
    assert (good.future.result(), paid.future.result()) == (v0 + 1, v0 + 2)
    exc = bad.future.exception()
    assert isinstance(exc, ValueError) and "unknown step 'nowhere'" in str(exc)
    loaded = fresh(url, "m")
    assert loaded.steps["s0"].result == "zero" and loaded.steps["s1"].dependencies == []
    assert len(CheckpointStore(url).get_tool_call_history("m", "s2")) == 1


def test_commit_many_lost_race_fails_step_parts_and_rebases_paid_results(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store, run = saved(url)
    other = CheckpointStore(url)
    theirs = other.load_run("m")
    assert theirs is not None
    other.commit(theirs, [done(theirs.steps["s1"], "theirs")])  # store's head is now stale
    step_part = GroupPart("m", run, [done(run.steps["s0"], "mine")])
    paid = GroupPart("m", tool_calls=[("s2", call(2))])
    store.commit_many([step_part, paid])
    assert isinstance(step_part.future.exception(), ConflictError)
    assert paid.future.result() > 0
    loaded = fresh(url, "m")
    assert loaded.steps["s1"].result == "theirs" and loaded.steps["s0"].status == StepStatus.PENDING
    assert [c.result for c in CheckpointStore(url).get_tool_call_history("m", "s2")] == ["paid 2"]
    store.close()
    other.close()


def test_group_committer_keeps_order_and_groups_what_arrives_during_a_write(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store, run = saved(url, 60)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    gate = threading.Event()
    pool.submit(gate.wait)  # the writer is busy: everything below queues behind it
    committer = GroupCommitter(store, pool)
    futures = [committer.submit("m", run=run, steps=[done(run.steps[f"s{i}"], f"r{i}")]) for i in range(30)]
    gate.set()
    versions = [f.result(timeout=30) for f in futures]
    assert len(set(versions)) == 1  # queued during one write: one record
    later = []
    for i in range(30, 60):  # one at a time from a thread racing the writer
        later.append(committer.submit("m", run=run, steps=[done(run.steps[f"s{i}"], f"r{i}")]))
        time.sleep(0.0005 * (i % 3))
    got = [f.result(timeout=30) for f in later]
    assert got == sorted(got) and got[0] > versions[0]  # never out of order
    assert committer.parts == 60 and committer.writes <= 31
    pool.shutdown()
    loaded = fresh(url, "m")
    assert all(loaded.steps[f"s{i}"].result == f"r{i}" for i in range(60))
    store.close()
