"""What an executor (or a progress callback) puts in `run.steps` under a new id that is not a
Step filed under its own id, and what a stop says a resume does with its step.

AgentRun does not validate assignment, so `run.steps["x"] = {...}` (or None) keeps the value:
the schedule met it as AttributeError ('dict' object has no attribute 'status') out of
execute_run, the run left "running". A Step put under a key that is not its id was committed
under its id, a step the run does not have by that name, and the run then stopped saying that
step had been removed. Now such an entry is refused like an added step whose graph no commit
could hold: the run stops naming its key and what is wrong, the entry taken back out of the run,
what finished committed, and a resume continues from the store.

A stop also said "resume_run(...) continues at this step" for a step removed or replaced after
it had finished, which a resume does not run again, and for an added step the store never had.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    CheckpointedAgent,
    CheckpointStore,
    ProgressEvent,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
)
from tests._runtime_graph import IDS, POLICIES, execute, ok, resume, start, stored_run

# What is put under the new key "x", and how the stop names what is wrong with it.
BAD: dict[str, tuple[Callable[[], Any], str]] = {
    "dict": (lambda: {"id": "x", "title": "t"}, "is a dict, not a Step"),
    "none": (lambda: None, "is a NoneType, not a Step"),
    "other-id": (lambda: Step(id="y", title="t"), "is a Step whose id is 'y', not the key"),
}
AT_STEP = "continues at this step"




def _stopped_without(err: pytest.ExceptionInfo[RunStoppedError], what: str) -> None:
    """The stop names key 'x' and what is wrong, and says the checkpoint has no such step."""
    msg = str(err.value)
    assert err.value.step_id == "x", msg
    assert f"step 'x' was added to the run during execution but {what}" in msg, msg
    assert "taken out of run.steps" in msg and "goes on without it" in msg, msg
    assert AT_STEP not in msg, msg


def _done_then_stopped(url: str, run: Any, done: str, sid: str) -> Any:
    """The run in memory and in a fresh store: stopped at `sid`, `done` completed, no stray id."""
    assert sorted(run.steps) == IDS and run.status == "failed"
    stored = stored_run(url)
    assert stored.status == "failed" and stored.metadata["stopped"]["step_id"] == sid
    assert sorted(stored.steps) == IDS  # neither "x" nor a Step's own id "y"
    assert {s.id for s in stored.steps.values() if s.status == StepStatus.COMPLETED} == set(done)
    assert all(stored.steps[s].result == f"{s} ok" for s in done)
    assert stored.total_cost_usd == 0.5 * len(done) and stored.total_tokens == 10 * len(done)
    return stored


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("bad", list(BAD))
def test_an_entry_that_is_not_a_step_under_its_own_id_stops_the_run_naming_its_key(
        tmp_path: Path, mode: str, policy: str, bad: str) -> None:
    url = str(tmp_path / "store")
    agent, run = start(url, policy)
    make, what = BAD[bad]
    ran: list[str] = []

    def fn(step: Step) -> StepResult:
        ran.append(step.id)
        if step.id == "b":
            run.steps["x"] = make()
        return ok(step)

    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, fn, mode)
    _stopped_without(err, what)
    assert ran == ["a", "b"]  # its own step finished and was committed with the stop
    _done_then_stopped(url, run, "ab", "x")
    _, again = resume(url, mode, IDS)
    assert again == ["c", "d", "e"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_progress_callback_that_puts_none_under_a_new_id_stops_the_run(
        tmp_path: Path, mode: str) -> None:
    url = str(tmp_path / "store")
    run: Any = None

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "step_completed" and event.step_id == "a":
            run.steps["x"] = None

    agent, run = start(url, "every-n", on_progress=on_progress)
    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, ok, mode)
    _stopped_without(err, "is a NoneType, not a Step")
    _done_then_stopped(url, run, "ab", "x")  # met when b's executor returned
    _, again = resume(url, mode, IDS)
    assert again == ["c", "d", "e"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_step_added_on_a_refused_entry_is_refused_with_it(tmp_path: Path, mode: str) -> None:
    """A well-formed step depending on the refused key could never run nor be committed."""
    url = str(tmp_path / "store")
    agent, run = start(url, "every-step")

    def fn(step: Step) -> StepResult:
        if step.id == "b":
            run.steps["x"] = {"id": "x", "title": "t"}
            run.add_step(Step(id="z", title="z", dependencies=["x"]))
        return ok(step)

    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, fn, mode)
    _stopped_without(err, "is a dict, not a Step")
    assert "z" not in run.steps
    stored = _done_then_stopped(url, run, "ab", "x")
    assert "z" not in stored.steps


# ---------------------------------------------------------------- what the stop says of a resume

def _finished_victim(run: Any, how: str) -> Callable[[Step], StepResult]:
    def fn(step: Step) -> StepResult:
        if step.id == "c":
            if how == "replaced":
                run.add_step(Step(id="a", title="planned again"))
            elif how == "removed":
                del run.steps["a"]
            else:  # its own id, while it runs: it completes all the same
                run.add_step(Step(id="c", title="planned again"))
        return ok(step)
    return fn


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("policy", ["every-step", "every-n"])
@pytest.mark.parametrize(("how", "victim", "done", "resume_runs"), [
    ("replaced", "a", "abcde", []),         # finished before: both met once nothing is left
    ("removed", "a", "abcde", []),          # to run (the steps they do not hold up run first)
    ("own-id", "c", "abc", ["d", "e"]),     # replaced while running, then finished
])
def test_a_stop_on_a_step_that_finished_does_not_say_a_resume_continues_at_it(
        tmp_path: Path, mode: str, policy: str, how: str, victim: str, done: str,
        resume_runs: list[str]) -> None:
    url = str(tmp_path / "store")
    agent, run = start(url, policy)
    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, _finished_victim(run, how), mode)
    msg = str(err.value)
    assert err.value.step_id == victim, msg
    assert AT_STEP not in msg, msg
    assert "the step is finished there, so resume_run('r') goes on past it" in msg, msg
    if how == "removed":
        assert "let it run" not in msg and "(completed: put it back)" in msg, msg
    # the usual stop still says it: the step is to run there
    assert AT_STEP in str(RunStoppedError("r", "s", 1, ValueError("boom")))
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.metadata["stopped"]["step_id"] == victim
    assert stored.steps[victim].status == StepStatus.COMPLETED  # what the message says
    assert {s.id for s in stored.steps.values() if s.status == StepStatus.COMPLETED} == set(done)
    resumer = CheckpointedAgent(CheckpointStore(url))
    again = resumer.resume_run("r")
    assert again is not None
    ran: list[str] = []

    def fn(step: Step) -> StepResult:
        ran.append(step.id)
        return ok(step)

    execute(resumer, again, fn, mode)
    assert ran == resume_runs and again.status == "completed"
