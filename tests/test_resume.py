"""The three resume strategies: exact, fuzzy (validator), context (brief + new run)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ckptfs import CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.errors import RetriesExhaustedError
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.policy import RetryPolicy
from ckptfs.runtime.resume import ResumeBrief, build_brief

FAST = RetryPolicy(max_attempts=1, base_delay=0.0)


@pytest.fixture
def url() -> Iterator[str]:
    u = f"memory://resume-{uuid.uuid4().hex[:10]}"
    yield u
    st = CheckpointStore(u)
    for key in st.storage.list(""):
        st.storage.delete(key)
    st.close()


def graph() -> list[Step]:
    return [Step(id="a", title="collect sources", description="find papers"),
            Step(id="b", title="summarise", dependencies=["a"]),
            Step(id="c", title="write report", dependencies=["b"]),
            Step(id="d", title="unrelated chore")]


def test_resume_of_unknown_run_is_none_and_bad_strategy_is_refused(url: str) -> None:
    agent = CheckpointedAgent(CheckpointStore(url))
    assert agent.resume_run("no-such-run") is None
    with pytest.raises(ValueError, match="strategy"):
        agent.resume_run("no-such-run", strategy="magic")
    with pytest.raises(ValueError, match="validator"):
        agent.resume_run("no-such-run", strategy="fuzzy")


def test_fuzzy_invalidates_rejected_steps_and_everything_downstream(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("report", graph())
    world = {"version": 1}
    real_calls: list[str] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        def fetch(step_id: str) -> str:
            real_calls.append(step_id)
            return f"{step_id}@v{world['version']}"

        return str(agent.tools().run("fetch", {"step_id": step.id}, fetch))

    agent.execute_run(run, ex)
    assert run.steps["b"].result == "b@v1" and sorted(real_calls) == ["a", "b", "c", "d"]
    store.close()

    world["version"] = 2  # the data under 'b' changed while we were away
    store2 = CheckpointStore(url)
    agent2 = CheckpointedAgent(store2)
    again = agent2.resume_run(run.run_id, strategy="fuzzy", validator=lambda s: s.id != "b")
    assert again is not None
    status = {sid: s.status for sid, s in again.steps.items()}
    assert status == {"a": StepStatus.COMPLETED, "b": StepStatus.PENDING, "c": StepStatus.PENDING,
                      "d": StepStatus.COMPLETED}
    assert CheckpointStore(url).load_run(run.run_id).steps["c"].status == StepStatus.PENDING  # type: ignore[union-attr]

    real_calls.clear()

    def ex2(step: Step, prior: list[ToolCall]) -> str:
        assert prior == []  # the stale tool results are fenced off
        def fetch(step_id: str) -> str:
            real_calls.append(step_id)
            return f"{step_id}@v{world['version']}"

        return str(agent2.tools().run("fetch", {"step_id": step.id}, fetch))

    agent2.execute_run(again, ex2)
    assert sorted(real_calls) == ["b", "c"]  # re-fetched, not served from the old log
    assert again.steps["b"].result == "b@v2" and again.steps["a"].result == "a@v1"
    assert again.status == "completed"


def test_retry_failed_puts_failed_and_skipped_steps_back(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=1, on_exhausted="fail"))
    run = agent.start_run("r", graph())
    broken = {"a"}

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id in broken:
            raise RuntimeError("nope")
        return "ok"

    agent.execute_run(run, ex)
    assert run.status == "completed_with_errors" and run.steps["c"].status == StepStatus.SKIPPED
    broken.clear()
    again = agent.resume_run(run.run_id, retry_failed=True)
    assert again is not None and again.steps["a"].status == StepStatus.PENDING
    agent.execute_run(again, ex)
    assert again.status == "completed" and again.completed_count == 4


@pytest.mark.parametrize("irreversible", [False, True])
def test_retry_failed_replays_the_calls_the_failed_attempt_paid_for(url: str, irreversible: bool) -> None:
    """A step that paid for a call (an email sent) and then raised, FAILED, and retried with
    `resume_run(retry_failed=True)`: the retry fenced off the step's tool log as a fuzzy
    invalidation does, so it sent the email again. A failed step retried is the same execution
    going on, as a retry within execute_run is: its paid calls replay from the log, once paid."""
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=1, on_exhausted="fail"))
    run = agent.start_run("r", graph())
    sent: list[str] = []
    broken = {"a"}

    def send(to: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    def ex(step: Step, prior: list[ToolCall]) -> str:
        got = agent.tools().run("send", {"to": f"{step.id}@example.com"}, send, irreversible=irreversible)
        if step.id in broken:
            raise RuntimeError("the step failed after the email went out")
        return str(got)

    agent.execute_run(run, ex)
    assert run.steps["a"].status == StepStatus.FAILED and sent.count("a@example.com") == 1
    broken.clear()
    again = agent.resume_run(run.run_id, retry_failed=True)
    assert again is not None
    agent.execute_run(again, ex)
    assert again.status == "completed" and again.steps["a"].result == "sent to a@example.com"
    assert sent.count("a@example.com") == 1, sent  # replayed, not sent again
    assert sorted(sent) == sorted({f"{s}@example.com" for s in "abcd"})


def test_context_restart_builds_a_brief_and_a_new_linked_run(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=FAST)
    run = agent.start_run("Write a literature report", graph())

    def ex(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "b":
            raise TimeoutError("model overloaded")
        return {"a": "found 12 papers on X", "d": "chore done"}[step.id]

    with pytest.raises(RetriesExhaustedError):
        agent.execute_run(run, ex)
    store.close()

    store2 = CheckpointStore(url)
    agent2 = CheckpointedAgent(store2)
    new = agent2.resume_run(run.run_id, strategy="context")
    assert new is not None and new.run_id != run.run_id
    assert set(new.steps) == {"b", "c"}
    assert new.steps["b"].dependencies == [] and new.steps["c"].dependencies == ["b"]
    assert all(s.status == StepStatus.PENDING and s.attempt_count == 0 for s in new.steps.values())
    assert "Original goal: Write a literature report" in new.goal
    assert "found 12 papers on X" in new.goal and "do not redo" in new.goal
    brief = ResumeBrief.from_dict(new.metadata["resume_brief"])
    assert [i.id for i in brief.done] == ["a", "d"] and brief.done[0].result == "found 12 papers on X"
    assert [i.id for i in brief.remaining] == ["b", "c"]
    assert brief.to_prompt() == new.goal
    assert new.metadata["resumed_from"] == run.run_id

    fresh = CheckpointStore(url)
    old = fresh.load_run(run.run_id)
    assert old is not None and old.status == "superseded" and old.metadata["superseded_by"] == new.run_id
    assert fresh.load_run(new.run_id) is not None
    assert [r["run_id"] for r in fresh.find_resumable_runs()] == [new.run_id]
    with pytest.raises(ValueError, match="superseded"):
        CheckpointedAgent(fresh).resume_run(run.run_id)

    agent2.execute_run(new, lambda step, prior: f"{step.id} done with the brief")
    assert new.status == "completed"


def test_prompt_clips_long_results() -> None:
    from ckptfs import AgentRun

    run = AgentRun(goal="g")
    run.add_step(Step(id="x", title="big", status=StepStatus.COMPLETED, result="z" * 5000))
    text = build_brief(run).to_prompt(max_result_chars=100)
    assert "z" * 99 in text and "z" * 101 not in text
    assert build_brief(run).done[0].result == "z" * 5000  # the structured brief keeps it whole


def test_fuzzy_with_retry_failed_fences_a_failed_step_downstream_of_a_rejected_one(url: str) -> None:
    """`resume_run("fuzzy", validator=..., retry_failed=True)`: retry_failed put the FAILED
    step back to PENDING first, so the invalidation passed over it as already pending and did
    not fence its log, and the retry served the price fetched from the world the validator had
    just called stale. Without retry_failed the same step was reset and fenced."""
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=1, on_exhausted="fail"))
    run = agent.start_run("r", [Step(id="a", title="quote"), Step(id="b", title="buy", dependencies=["a"])])
    world = {"price": 10}
    fetched: list[int] = []

    def price() -> int:
        fetched.append(world["price"])
        return world["price"]

    def ex(step: Step, prior: list[ToolCall]) -> str:
        got = agent.tools().run("price", {}, price)
        if step.id == "b" and world["price"] == 10:
            raise RuntimeError("the broker was down")
        return f"{step.id}@{got}"

    agent.execute_run(run, ex)
    assert run.steps["b"].status == StepStatus.FAILED and fetched == [10, 10]
    world["price"] = 12
    again = agent.resume_run(run.run_id, "fuzzy", validator=lambda s: s.id != "a", retry_failed=True)
    assert again is not None
    agent.execute_run(again, ex)
    assert again.status == "completed", again.steps["b"].error
    assert again.steps["a"].result == "a@12" and again.steps["b"].result == "b@12"
