"""CheckpointedAgent: execution, checkpoint granularity, failure semantics, accounting, pause."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ckptfs import CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.errors import RetriesExhaustedError
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.execution import ProgressEvent, StepResult
from ckptfs.runtime.policy import CheckpointPolicy, RetryPolicy

FAST = RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0)


def wipe(store: CheckpointStore) -> None:
    store.flush()
    for key in store.storage.list(""):
        store.storage.delete(key)
    store.close()


@pytest.fixture
def url() -> str:
    return f"memory://agent-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(url: str) -> Iterator[CheckpointStore]:
    st = CheckpointStore(url)
    yield st
    wipe(st)


class Counting:
    """Counts the versions the store actually wrote through commit()."""

    def __init__(self, store: CheckpointStore, run_id: str) -> None:
        self.versions: list[int] = []
        last = [store.list_versions(run_id)[-1]]
        real = store.commit

        def commit(run: Any, steps: Any = None) -> int:
            v = real(run, steps)
            if v != last[0]:
                self.versions.append(v)
                last[0] = v
            return v

        store.commit = commit  # type: ignore[method-assign]

    @property
    def n(self) -> int:
        return len(self.versions)


def chain(n: int, **kw: Any) -> list[Step]:
    return [Step(id=f"s{i}", title=f"step {i}", dependencies=[f"s{i - 1}"] if i else [], **kw)
            for i in range(n)]


def echo(step: Step, prior: list[ToolCall]) -> str:
    return f"done {step.id}"


def test_runs_a_dag_in_dependency_order_and_persists_everything(store: CheckpointStore,
                                                                url: str) -> None:
    steps = [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"]),
             Step(id="c", title="c", dependencies=["a"]), Step(id="d", title="d", dependencies=["b", "c"])]
    order: list[str] = []
    agent = CheckpointedAgent(store)
    run = agent.start_run("dag", steps)

    def ex(step: Step, prior: list[ToolCall]) -> str:
        for dep in step.dependencies:
            assert run.steps[dep].status == StepStatus.COMPLETED
        order.append(step.id)
        return step.id.upper()

    agent.execute_run(run, ex)
    assert order[0] == "a" and order[-1] == "d" and sorted(order) == ["a", "b", "c", "d"]
    assert run.status == "completed"
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and loaded.status == "completed"
    assert {s.id: s.result for s in loaded.steps.values()} == {"a": "A", "b": "B", "c": "C", "d": "D"}
    assert all(s.attempt_count == 1 for s in loaded.steps.values())


@pytest.mark.parametrize(("policy", "expected"), [
    (CheckpointPolicy.every_step(), 12),
    (CheckpointPolicy.every_n_steps(4), 3),
    (CheckpointPolicy.at_milestones(), 2),
])
def test_granularity_sets_the_number_of_commits(store: CheckpointStore, policy: CheckpointPolicy,
                                                expected: int) -> None:
    steps = chain(12)
    steps[5].milestone = True
    agent = CheckpointedAgent(store, policy=policy)
    run = agent.start_run("g", steps)
    counter = Counting(store, run.run_id)
    agent.execute_run(run, echo)
    # the final commit carries the run status; when the last step's commit is due it also
    # carries that step, so the count is the due checkpoints plus at most one
    assert counter.n in (expected, expected + 1)
    assert run.completed_count == 12


def test_every_n_keeps_uncommitted_steps_out_of_the_store_until_due(store: CheckpointStore, url: str) -> None:
    agent = CheckpointedAgent(store, checkpoint_every_n_steps=5)
    run = agent.start_run("n", chain(7))
    seen: list[int] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "s6":
            seen.append(CheckpointStore(url).load_run(run.run_id).completed_count)  # type: ignore[union-attr]
        return "ok"

    agent.execute_run(run, ex)
    assert seen == [5]  # s0..s4 were committed together at the 5th; s5 is pending in memory


def test_tool_call_granularity_commits_the_running_step_after_each_call(store: CheckpointStore,
                                                                        url: str) -> None:
    agent = CheckpointedAgent(store, policy=CheckpointPolicy.every_tool_call())
    run = agent.start_run("t", [Step(id="only", title="x")])
    snapshots: list[tuple[str, int, dict[str, Any]]] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        tools = agent.tools()
        for k in range(2):
            step.metadata["progress"] = k + 1
            tools.run("t", {"k": k}, lambda k: k)
            other = CheckpointStore(url).load_run(run.run_id)
            assert other is not None
            s = other.steps["only"]
            snapshots.append((s.status.value, s.attempt_count, dict(s.metadata)))
        return "ok"

    agent.execute_run(run, ex)
    assert snapshots == [("running", 1, {"progress": 1}), ("running", 1, {"progress": 2})]


def test_a_tool_can_force_a_checkpoint_whatever_the_policy(store: CheckpointStore, url: str) -> None:
    agent = CheckpointedAgent(store, policy=CheckpointPolicy.at_milestones())
    run = agent.start_run("f", chain(4))
    seen: list[int] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "s3":
            agent.tools().run("expensive", {}, lambda: 1, checkpoint=True)
            seen.append(CheckpointStore(url).load_run(run.run_id).completed_count)  # type: ignore[union-attr]
        return "ok"

    agent.execute_run(run, ex)
    assert seen == [3]


def test_failed_dependency_skips_dependants_with_the_reason(store: CheckpointStore) -> None:
    steps = [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"]),
             Step(id="c", title="c", dependencies=["b"]), Step(id="z", title="independent")]
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=2, base_delay=0, on_exhausted="fail"))
    run = agent.start_run("skip", steps)

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "a":
            raise ValueError("bad input")
        return "ok"

    agent.execute_run(run, ex)
    assert run.steps["a"].status == StepStatus.FAILED and run.steps["a"].attempt_count == 2
    assert run.steps["b"].status == StepStatus.SKIPPED
    assert "'a' failed" in (run.steps["b"].error or "")
    assert run.steps["c"].status == StepStatus.SKIPPED and "'b' was skipped" in (run.steps["c"].error or "")
    assert run.steps["z"].status == StepStatus.COMPLETED
    assert run.status == "completed_with_errors" and run.is_complete()


def test_non_retryable_errors_fail_at_once(store: CheckpointStore) -> None:
    agent = CheckpointedAgent(store, retry=RetryPolicy(give_up_on=(KeyError,), base_delay=0))
    run = agent.start_run("nr", [Step(id="a", title="a")])
    calls = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        calls.append(1)
        raise KeyError("missing")

    agent.execute_run(run, ex)
    assert len(calls) == 1 and run.steps["a"].status == StepStatus.FAILED


def test_retry_then_success_within_one_execute_run(store: CheckpointStore, url: str) -> None:
    agent = CheckpointedAgent(store, retry=FAST)
    run = agent.start_run("r", chain(3))

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "s1" and step.attempt_count < 3:
            raise ConnectionError("flaky")
        return "ok"

    agent.execute_run(run, ex)
    assert run.status == "completed" and run.steps["s1"].attempt_count == 3
    assert run.steps["s1"].error is None
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and loaded.steps["s1"].attempt_count == 3


class RateLimited(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__("429")
        self.retry_after = retry_after


def test_retry_after_from_the_exception_is_honoured(store: CheckpointStore) -> None:
    agent = CheckpointedAgent(store, retry=RetryPolicy(base_delay=5.0, jitter=0.0))
    run = agent.start_run("ra", [Step(id="a", title="a")])
    times: list[float] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        times.append(time.monotonic())
        if len(times) == 1:
            raise RateLimited(0.2)
        return "ok"

    agent.execute_run(run, ex)
    gap = times[1] - times[0]
    assert 0.18 <= gap < 2.0  # retry_after (0.2 s), not the 5 s backoff


def test_backoff_grows_and_jitter_stays_in_range() -> None:
    pol = RetryPolicy(base_delay=1.0, multiplier=2.0, max_delay=5.0, jitter=0.25)
    import random

    rng = random.Random(7)
    for n, raw in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        d = pol.delay(n, ValueError(), rng)
        assert raw * 0.75 <= d <= raw
    assert pol.delay(1, RateLimited(9999.0)) == pol.max_retry_after
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="granularity"):
        CheckpointPolicy("sometimes")  # type: ignore[arg-type]


def test_exhausted_retries_stop_the_run_and_the_next_process_resumes_there(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=FAST)
    run = agent.start_run("x", chain(5))
    down = True
    calls: list[str] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        calls.append(step.id)
        if step.id == "s2" and down:
            raise ConnectionError("service down")
        return f"r{step.id}"

    with pytest.raises(RetriesExhaustedError, match="'s2' failed 3 time") as info:
        agent.execute_run(run, ex)
    assert info.value.step_id == "s2" and isinstance(info.value.cause, ConnectionError)
    store.close()

    store2 = CheckpointStore(url)
    summary = store2.find_resumable_runs()
    assert [r["run_id"] for r in summary] == [run.run_id] and summary[0]["status"] == "failed"
    down = False
    calls.clear()
    agent2 = CheckpointedAgent(store2, retry=FAST)
    again = agent2.resume_run(run.run_id)
    assert again is not None
    assert again.steps["s2"].status == StepStatus.PENDING and again.steps["s2"].attempt_count == 3
    agent2.execute_run(again, ex)
    assert calls == ["s2", "s3", "s4"]
    assert again.status == "completed" and again.steps["s2"].attempt_count == 4
    assert "stopped" not in again.metadata
    wipe(store2)


def test_tokens_and_cost_are_accounted_and_survive_resume(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=FAST)
    run = agent.start_run("acct", chain(4))

    def ex(step: Step, prior: list[ToolCall]) -> StepResult:
        if step.id == "s2":
            raise RuntimeError("crash-ish")
        step.tokens += 5  # direct reporting is counted too
        return StepResult(f"r{step.id}", tokens=100, cost_usd=0.01)

    with pytest.raises(RetriesExhaustedError):
        agent.execute_run(run, ex)
    assert run.total_tokens == 210 and run.total_cost_usd == pytest.approx(0.02)
    store.close()
    store2 = CheckpointStore(url)
    agent2 = CheckpointedAgent(store2)
    again = agent2.resume_run(run.run_id)
    assert again is not None and again.total_tokens == 210

    def ok(step: Step, prior: list[ToolCall]) -> StepResult:
        return StepResult("fine", tokens=1000, cost_usd=0.5)

    agent2.execute_run(again, ok)
    assert again.total_tokens == 2210 and again.steps["s3"].tokens == 1000
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and loaded.total_tokens == 2210
    assert loaded.total_cost_usd == pytest.approx(1.02)
    wipe(store2)


def test_pause_during_execution_stops_after_the_current_step(store: CheckpointStore, url: str) -> None:
    agent = CheckpointedAgent(store)
    run = agent.start_run("p", chain(6))

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "s2":
            agent.pause_run(run)
        return "ok"

    agent.execute_run(run, ex)
    assert run.status == "paused" and run.completed_count == 3
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and loaded.status == "paused" and loaded.completed_count == 3
    assert [r["run_id"] for r in store.find_resumable_runs()] == [run.run_id]
    agent.execute_run(run, ex)
    assert run.status == "completed" and run.completed_count == 6


def test_progress_goes_to_logging_and_the_callback_never_stdout(
        store: CheckpointStore, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    events: list[ProgressEvent] = []
    agent = CheckpointedAgent(store, retry=FAST, on_progress=events.append)
    run = agent.start_run("cb", chain(3))
    flaky = {"s1": 1}

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if flaky.get(step.id):
            flaky[step.id] -= 1
            raise ConnectionError("once")
        return "ok"

    with caplog.at_level(logging.INFO, logger="ckptfs.runtime.agent"):
        agent.execute_run(run, ex)
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.count("step_completed") == 3 and kinds.count("step_retry") == 1
    done = [e for e in events if e.kind == "step_completed"]
    assert [e.completed for e in done] == [1, 2, 3] and all(e.total == 3 for e in done)
    assert capsys.readouterr().out == ""
    assert any("retrying" in r.getMessage() for r in caplog.records)


def test_a_broken_callback_does_not_break_the_run(store: CheckpointStore) -> None:
    def boom(ev: ProgressEvent) -> None:
        raise RuntimeError("ui died")

    agent = CheckpointedAgent(store, on_progress=boom)
    run = agent.start_run("cb2", chain(2))
    agent.execute_run(run, echo)
    assert run.status == "completed"


def test_executing_a_run_never_saved_saves_it_first(store: CheckpointStore, url: str) -> None:
    from ckptfs import AgentRun

    run = AgentRun(goal="adhoc")
    for s in chain(3):
        run.add_step(s)
    CheckpointedAgent(store).execute_run(run, echo)
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and loaded.completed_count == 3


def test_crash_leaves_running_step_to_be_requeued_with_attempt_count(url: str) -> None:
    """A step durable as RUNNING (it made a tool call) goes back to the queue; count kept."""

    class Crash(BaseException):
        pass

    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("c", chain(3))

    def ex(step: Step, prior: list[ToolCall]) -> str:
        agent.tools().run("t", {"s": step.id}, lambda s: s + "!")
        if step.id == "s1":
            raise Crash()
        return "ok"

    with pytest.raises(Crash):
        agent.execute_run(run, ex)
    store.close()
    store2 = CheckpointStore(url)
    raw = store2.load_run(run.run_id)
    assert raw is not None and raw.steps["s1"].status == StepStatus.RUNNING
    assert raw.steps["s1"].attempt_count == 1
    agent2 = CheckpointedAgent(store2)
    again = agent2.resume_run(run.run_id)
    assert again is not None and again.steps["s1"].status == StepStatus.PENDING
    assert again.steps["s1"].attempt_count == 1
    seen_prior: list[int] = []

    def ex2(step: Step, prior: list[ToolCall]) -> str:
        seen_prior.append(len(prior))
        return agent2.tools().run("t", {"s": step.id}, lambda s: s + "?")

    agent2.execute_run(again, ex2)
    assert again.steps["s1"].result == "s1!"  # served from the log, not called again
    assert again.steps["s1"].attempt_count == 2 and seen_prior[0] == 1
    wipe(store2)


def test_scheduler_never_rescans_the_run_per_step(store: CheckpointStore,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Ready steps come from dependency counts; a rescan per step would be O(steps^2)."""
    from ckptfs import AgentRun

    scans = {"is_complete": 0}
    real_is_complete = AgentRun.is_complete

    def no_rescan(self: AgentRun) -> list[Step]:
        raise AssertionError("get_ready_steps called on the hot path")

    def counted(self: AgentRun) -> bool:
        scans["is_complete"] += 1
        return real_is_complete(self)

    monkeypatch.setattr(AgentRun, "get_ready_steps", no_rescan)
    monkeypatch.setattr(AgentRun, "is_complete", counted)
    steps = [Step(id="root", title="r")] + [Step(id=f"f{i}", title="f", dependencies=["root"])
                                            for i in range(300)]
    steps.append(Step(id="join", title="j", dependencies=[f"f{i}" for i in range(300)]))
    agent = CheckpointedAgent(store, policy=CheckpointPolicy.every_n_steps(100))
    run = agent.start_run("wide", steps)
    order: list[str] = []
    agent.execute_run(run, lambda step, prior: order.append(step.id) or "ok")
    assert order[0] == "root" and order[-1] == "join" and len(order) == 302
    assert run.status == "completed" and scans["is_complete"] <= 1


def test_stop_and_resume_on_every_backend(any_store_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = any_store_url
    store = CheckpointStore(url, storage_options=opts)
    agent = CheckpointedAgent(store, retry=FAST)
    run = agent.start_run("backends", chain(5))
    real: list[str] = []
    down = True
    agent_now = [agent]  # the executor follows the agent of the current "process"

    def ex(step: Step, prior: list[ToolCall]) -> str:
        value = agent_now[0].tools().run("t", {"s": step.id}, lambda s: real.append(s) or s * 2)
        if step.id == "s3" and down:
            raise ConnectionError("down")
        return str(value)

    with pytest.raises(RetriesExhaustedError):
        agent.execute_run(run, ex)
    store.close()
    down = False
    store2 = CheckpointStore(url, storage_options=opts)
    agent_now[0] = CheckpointedAgent(store2, retry=FAST)
    again = agent_now[0].resume_run(run.run_id)
    assert again is not None and again.completed_count == 3
    agent_now[0].execute_run(again, ex)
    assert again.status == "completed" and again.steps["s4"].result == "s4s4"
    assert real == ["s0", "s1", "s2", "s3", "s4"]  # s3's tool ran once across both processes
    store2.close()


def test_durable_attempts_let_max_total_attempts_end_a_crash_loop(url: str) -> None:
    """A step that kills its process every time (OOM) is counted and finally given up."""

    class Crash(BaseException):
        pass

    policy = CheckpointPolicy(durable_attempts=True)
    retry = RetryPolicy(max_total_attempts=2, base_delay=0, on_exhausted="fail")
    store = CheckpointStore(url)
    run = CheckpointedAgent(store, policy=policy, retry=retry).start_run("oom", chain(3))
    run_id = run.run_id
    store.close()
    entered: list[str] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        entered.append(step.id)
        if step.id == "s1":
            raise Crash()
        return "ok"

    for _ in range(2):
        st_ = CheckpointStore(url)
        agent = CheckpointedAgent(st_, policy=policy, retry=retry)
        again = agent.resume_run(run_id)
        assert again is not None
        with pytest.raises(Crash):
            agent.execute_run(again, ex)
        st_.close()
    st_ = CheckpointStore(url)
    agent = CheckpointedAgent(st_, policy=policy, retry=retry)
    again = agent.resume_run(run_id)
    assert again is not None and again.steps["s1"].attempt_count == 2
    agent.execute_run(again, ex)
    assert entered == ["s0", "s1", "s1"]  # the third process did not run s1 again
    assert again.steps["s1"].status == StepStatus.FAILED
    assert "across restarts" in (again.steps["s1"].error or "")
    assert again.steps["s2"].status == StepStatus.SKIPPED
    wipe(st_)
