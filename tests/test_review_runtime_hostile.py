"""A hostile user of the agent runtime: executors, tools and resumes fed what they should refuse.

Each test is a broken promise found by review: a crash from inside ckptfs instead of the clear
error the README promises, or a run whose acknowledged state a later call replaced.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    CheckpointedAgent,
    CheckpointStore,
    RetriesExhaustedError,
    RetryPolicy,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
)
from ckptfs.runtime.resume import build_brief, context_run


def _agent(tmp_path: Path) -> tuple[CheckpointStore, CheckpointedAgent]:
    store = CheckpointStore(str(tmp_path / "store"))
    return store, CheckpointedAgent(store)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("__str__ of the output raised")


_OUTPUTS = [StepResult(None), StepResult(42), _Unprintable()]  # type: ignore[arg-type]


@pytest.mark.parametrize("output", _OUTPUTS, ids=["StepResult(None)", "StepResult(42)", "str-raises"])
def test_an_output_with_no_text_stops_the_run_by_name_not_with_attributeerror(tmp_path: Path,
                                                                              output: Any) -> None:
    """`StepResult(out.get("summary"))` with no summary, or an int, raised AttributeError
    ('NoneType' object has no attribute 'isascii') out of execute_run, and an output whose
    __str__ raises leaked its error: the run was left "running", nothing said which step or field.
    Now it is refused as any output the store cannot keep: RunStoppedError naming the step and
    the result, the step back to PENDING, and a resume completes it."""
    store, agent = _agent(tmp_path)
    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    refused = r"step 'a' returned an output the store cannot keep \(executor output: "
    with pytest.raises(RunStoppedError, match=refused):
        agent.execute_run(run, lambda step, prior: output)
    stored = CheckpointStore(str(tmp_path / "store")).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.steps["a"].status == StepStatus.PENDING
    again = agent.resume_run("r")
    assert again is not None
    agent.execute_run(again, lambda step, prior: "fine")
    assert store.load_run("r").steps["a"].result == "fine"  # type: ignore[union-attr]


def test_a_step_retried_past_attempt_1024_keeps_retrying_not_overflowerror() -> None:
    """`base_delay * multiplier ** (n - 1)` is 2.0 ** 1024 at attempt 1,025: OverflowError out
    of execute_run for a policy that retries a flaky service for long (and, in a Worker, whose n
    is the step's lifetime attempt count, at any attempt past 1,024 across restarts). The delay
    is capped at max_delay as it always was below that; a zero base delay stays zero."""
    assert RetryPolicy().delay(5000) == pytest.approx(30.0, rel=0.25)
    assert RetryPolicy(base_delay=0.0).delay(5000) == 0.0
    store = CheckpointStore(f"memory://t-{uuid.uuid4().hex[:10]}")
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=2000, base_delay=0.0, max_delay=0.0))
    calls = 0

    def flaky(step: Step, prior: Any) -> str:
        nonlocal calls
        calls += 1
        if calls < 1100:
            raise ConnectionError("429 Too Many Requests")
        return "done at last"

    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    agent.execute_run(run, flaky)
    stored = store.load_run("r")
    assert stored is not None and stored.status == "completed"
    assert stored.steps["a"].result == "done at last" and stored.steps["a"].attempt_count == 1100


class _MuteError(ConnectionError):
    """An error whose message cannot be read (a client library's broken __str__)."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ of the error raised")


def test_retries_exhausted_on_an_error_whose_str_raises_stops_the_run_with_its_checkpoint(
        tmp_path: Path) -> None:
    """The step's error was kept (error_text reads around a raising __str__), but
    RetriesExhaustedError formatted the cause with a bare `{cause}`: the RuntimeError from its
    __str__ escaped execute_run instead, and the stop (run "failed", metadata["stopped"]) was
    never committed. Now it is RetriesExhaustedError naming the step and the error's type."""
    store = CheckpointStore(str(tmp_path / "store"))
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=2, base_delay=0.0))

    def tool(**kw: Any) -> str:
        raise _MuteError()

    def executor(step: Step, prior: Any) -> str:
        return str(agent.tools().run("fetch", {"url": "https://example.com"}, tool))

    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    with pytest.raises(RetriesExhaustedError, match=r"step 'a' failed 2 time\(s\), last with _MuteError"):
        agent.execute_run(run, executor)
    stored = CheckpointStore(str(tmp_path / "store")).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["stopped"]["step_id"] == "a"
    assert stored.steps["a"].status == StepStatus.PENDING and stored.steps["a"].attempt_count == 2


def test_start_run_with_the_id_of_a_stored_run_refuses_instead_of_replacing_it(tmp_path: Path) -> None:
    """A script run twice with a fixed run_id (the README's `run_id="papers"`), or started where
    it should have resumed: `start_run` saved the new run over the stored one, so its next load
    returned the new goal and steps, every acknowledged completion gone from the newest version
    (and the new steps of the same ids were served the old run's tool results). Now it is a
    ValueError saying to resume, with nothing written."""
    store, agent = _agent(tmp_path)
    run = agent.start_run("summarise 3 papers", [Step(id="a", title="a"), Step(id="b", title="b")],
                          run_id="papers")
    agent.execute_run(run, lambda step, prior: f"summary of {step.id}")
    versions = store.list_versions("papers")
    again = CheckpointedAgent(CheckpointStore(str(tmp_path / "store")))
    with pytest.raises(ValueError, match=r"run 'papers' is already stored.*resume_run\('papers'\)"):
        again.start_run("something else", [Step(id="a", title="a")], run_id="papers")
    fresh = CheckpointStore(str(tmp_path / "store"))
    stored = fresh.load_run("papers")
    assert stored is not None and stored.goal == "summarise 3 papers" and stored.status == "completed"
    assert [s.result for s in stored.steps.values()] == ["summary of a", "summary of b"]
    assert fresh.list_versions("papers") == versions


@pytest.mark.parametrize("target", ["other", "old"])
def test_a_context_restart_into_a_stored_run_id_refuses_and_supersedes_nothing(tmp_path: Path,
                                                                              target: str) -> None:
    """`resume_run(id, "context", new_run_id=...)` saved the brief's run over whatever run was
    stored under that id: another run ("other") lost its goal and steps, and the old run's own
    id gave a run that was then marked superseded by itself. Now both are a ValueError before
    anything is written; neither run changes."""
    store, agent = _agent(tmp_path)
    agent.start_run("the old goal", [Step(id="a", title="a")], run_id="old")
    agent.start_run("another goal", [Step(id="z", title="z")], run_id="other")
    before = {rid: store.list_versions(rid) for rid in ("old", "other")}
    with pytest.raises(ValueError, match=rf"new_run_id {target!r}"):
        agent.resume_run("old", "context", new_run_id=target)
    fresh = CheckpointStore(str(tmp_path / "store"))
    old, other = fresh.load_run("old"), fresh.load_run("other")
    assert old is not None and old.status == "running" and old.goal == "the old goal"
    assert other is not None and other.goal == "another goal" and list(other.steps) == ["z"]
    assert {rid: fresh.list_versions(rid) for rid in ("old", "other")} == before


def _nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    cur = top
    for _ in range(depth):
        cur["k"] = {}
        cur = cur["k"]
    return top


def test_tool_arguments_nested_too_deep_for_a_record_are_refused_before_the_call(tmp_path: Path) -> None:
    """Arguments nested 300 deep passed the check made before the call (canonical JSON allows
    1,000 levels) but no record can hold them (pydantic serialises 254): the call was paid, its
    record refused, and so was the `unkept` record saying it was paid, which carries the same
    arguments. Nothing was logged, so every resume paid for the call again. Now it is the
    TypeError "refused before the call, nothing was written" that other bad arguments get."""
    store, agent = _agent(tmp_path)
    paid: list[str] = []
    seen: list[BaseException] = []

    def tool(**kw: Any) -> str:
        paid.append("call")
        return "charged"

    def executor(step: Step, prior: Any) -> str:
        try:
            return str(agent.tools().run("charge", {"order": _nested(300)}, tool))
        except Exception as exc:
            seen.append(exc)
            raise

    for _ in range(2):  # the run, then a resume of it: it paid once more each time
        run = agent.resume_run("r") or agent.start_run("g", [Step(id="a", title="a")], run_id="r")
        with contextlib.suppress(RunStoppedError):
            agent.execute_run(run, executor)
    assert paid == []
    assert isinstance(seen[0], TypeError) and "refused before the call" in str(seen[0])
    assert store.get_tool_call_history("r", "a") == []
    stored = store.load_run("r")
    assert stored is not None and stored.steps["a"].status == StepStatus.FAILED


def test_a_fuzzy_validator_that_answers_no_bool_is_a_typeerror_not_every_call_paid_again(
        tmp_path: Path) -> None:
    """A validator that forgets its `return` answers None, which `not validator(step)` took for
    a rejection: every completed step went back to PENDING with its tool log fenced off, and
    the next execute_run paid for every call of the run again. Like a guard, a validator must
    say True or False; anything else is a TypeError naming the step and the answer, and
    nothing is written."""
    store, agent = _agent(tmp_path)
    paid: list[str] = []

    def executor(step: Step, prior: Any) -> str:
        return str(agent.tools().run("fetch", {"s": step.id}, lambda **kw: paid.append(kw["s"]) or "x"))

    run = agent.start_run("g", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"])],
                          run_id="r")
    agent.execute_run(run, executor)
    versions = store.list_versions("r")

    def forgot_return(step: Step) -> bool:
        step.result == "x"  # noqa: B015 - the bug under test: no return
        return None  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"validator.*step 'a'.*None"):
        agent.resume_run("r", "fuzzy", validator=forgot_return)
    assert store.list_versions("r") == versions
    again = agent.resume_run("r", "fuzzy", validator=lambda step: True)
    assert again is not None
    agent.execute_run(again, executor)
    assert paid == ["a", "b"]
    stored = store.load_run("r")
    assert stored is not None and {s.status for s in stored.steps.values()} == {StepStatus.COMPLETED}


def test_a_context_restart_killed_between_its_two_writes_is_finished_by_calling_it_again(
        tmp_path: Path) -> None:
    """A context restart writes the new run, then marks the old one superseded. Killed between
    the two (the state built here with the same two public calls, the second never made), the
    same `resume_run(..., new_run_id=X)` again must finish it, not refuse X as another run's:
    X is this run's own restart (its metadata says `resumed_from`)."""
    store, agent = _agent(tmp_path)
    agent.start_run("the old goal", [Step(id="a", title="a"), Step(id="b", title="b")], run_id="old")
    old = store.load_run("old")
    assert old is not None
    store.save_run(context_run(old, build_brief(old), "new"))  # the first write; then the kill
    again = CheckpointedAgent(CheckpointStore(str(tmp_path / "store")))
    new = again.resume_run("old", "context", new_run_id="new")
    assert new is not None and new.run_id == "new" and new.metadata["resumed_from"] == "old"
    fresh = CheckpointStore(str(tmp_path / "store"))
    stored_old = fresh.load_run("old")
    assert stored_old is not None and stored_old.status == "superseded"
    assert stored_old.metadata["superseded_by"] == "new"
    again.execute_run(new, lambda step, prior: f"done {step.id}")
    assert fresh.load_run("new").status == "completed"  # type: ignore[union-attr]


class _RateLimited(ConnectionError):
    def __init__(self, retry_after: object) -> None:
        super().__init__("429")
        self._after = retry_after

    @property
    def retry_after(self) -> object:
        if self._after == "raise":
            raise RuntimeError("a Retry-After header the client could not parse")
        return self._after


@pytest.mark.parametrize("after", [10**400, "raise"], ids=["int-past-float", "property-raises"])
def test_a_retry_after_that_cannot_be_read_retries_by_the_policy_not_a_crash(after: object) -> None:
    """`retry_after` of 10**400 (a header of digits, int()-ed) made math.isfinite raise
    OverflowError, and a `retry_after` property that raises leaked its error: both escaped
    execute_run instead of a retry. Now the one past a float waits max_retry_after and the
    unreadable one is ignored (the policy's backoff), as a NaN already was."""
    policy = RetryPolicy(base_delay=0.0, max_retry_after=0.0)
    assert policy.delay(1, _RateLimited(after)) == 0.0
    store = CheckpointStore(f"memory://t-{uuid.uuid4().hex[:10]}")
    agent = CheckpointedAgent(store, retry=policy)
    calls = 0

    def executor(step: Step, prior: Any) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise _RateLimited(after)
        return "ok"

    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    agent.execute_run(run, executor)
    assert store.load_run("r").status == "completed"  # type: ignore[union-attr]
