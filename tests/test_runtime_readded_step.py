"""An executor (or a progress callback) that adds a step under an id the run already has.

`run.add_step` is a plain dict assignment (the seed's API), so it replaces the step object
under that id. The schedule only told added and removed ids apart: the replacement of a
finished step was never run nor committed and the run ended "failed" with nothing saying why;
that of a pending step ran on the replaced step's schedule and was committed, its graph never
checked (one depending on no step of the run made the store refuse the whole commit). Now the
run stops naming the step, the step as the run had it put back, everything acknowledged
committed, and a resume continues from the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    ProgressEvent,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
)
from tests._runtime_graph import IDS, POLICIES, execute, ok, resume, start, stored_run


def _stop_names(err: pytest.ExceptionInfo[RunStoppedError], sid: str) -> None:
    assert err.value.step_id == sid
    assert f"step {sid!r} was replaced by a step with the same id during execution" in str(err.value)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(("victim", "done_before", "resume_runs"), [
    ("a", "abcde", []),         # finished before the executor ran: met only at the end
    ("c", "abc", ["d", "e"]),   # the executor's own step, re-added while it runs
    ("e", "abcd", ["e"]),       # pending: met when its dependency completes, never run
])
def test_a_step_added_again_under_its_id_stops_the_run_naming_it(
        tmp_path: Path, mode: str, policy: str, victim: str, done_before: str,
        resume_runs: list[str]) -> None:
    url = str(tmp_path / "store")
    agent, run = start(url, policy)
    original = run.steps[victim]
    ran: list[str] = []

    def fn(step: Step) -> StepResult:
        ran.append(step.id)
        if step.id == "c":
            run.add_step(Step(id=victim, title="planned again"))  # no dependencies: runnable now
        return ok(step)

    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, fn, mode)
    _stop_names(err, victim)
    assert ran == list(done_before)  # the replacement never ran
    assert run.steps[victim] is original and run.status == "failed"
    stored = stored_run(url)
    assert stored.status == "failed" and stored.metadata["stopped"]["step_id"] == victim
    assert {s.id for s in stored.steps.values() if s.status == StepStatus.COMPLETED} == set(done_before)
    assert all(stored.steps[s].result == f"{s} ok" for s in done_before)
    assert stored.steps[victim].title == victim  # the store never got the replacement
    assert stored.steps[victim].dependencies == original.dependencies
    assert stored.total_cost_usd == 0.5 * len(done_before)
    done, again = resume(url, mode)
    assert again == resume_runs and len(done.steps) == 5
    assert all(s.result == f"{s.id} ok" for s in done.steps.values())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pending_step_replaced_with_a_graph_the_store_refuses_stops_by_name(
        tmp_path: Path, mode: str) -> None:
    """The replacement ran on the old step's schedule and its commit, depending on no step of
    the run, was refused: InvalidGraphError out of execute_run, the run left "running"."""
    url = str(tmp_path / "store")
    agent, run = start(url, "every-step")

    def fn(step: Step) -> StepResult:
        if step.id == "b":
            run.add_step(Step(id="d", title="d", dependencies=["nowhere"]))
        return ok(step)

    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, fn, mode)
    _stop_names(err, "d")
    stored = stored_run(url)
    assert stored.status == "failed" and stored.steps["d"].dependencies == ["c"]
    assert [s for s in IDS if stored.steps[s].status == StepStatus.COMPLETED] == ["a", "b", "c"]
    done, again = resume(url, mode)
    assert again == ["d", "e"] and done.steps["d"].dependencies == ["c"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_progress_callback_that_re_adds_a_finished_step_stops_the_run(
        tmp_path: Path, mode: str) -> None:
    url = str(tmp_path / "store")
    run: Any = None

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "step_completed" and event.step_id == "b":
            run.add_step(Step(id="b", title="b again"))

    agent, run = start(url, "every-n", on_progress=on_progress)
    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, ok, mode)
    _stop_names(err, "b")
    stored = stored_run(url)
    assert stored.metadata["stopped"]["step_id"] == "b" and stored.steps["b"].result == "b ok"
    assert all(stored.steps[s].status == StepStatus.COMPLETED for s in IDS)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_steps_added_under_new_ids_run_and_are_guarded_like_the_others(
        tmp_path: Path, mode: str) -> None:
    """New ids run and are committed as before; once added, they are the run's own: adding one
    again replaces it, and stops the run like any other step's id."""
    url = str(tmp_path / "store")
    agent, run = start(url, "every-step")
    ran: list[str] = []

    def fn(step: Step) -> StepResult:
        ran.append(step.id)
        if step.id == "c":
            run.add_step(Step(id="c2", title="follow-up", dependencies=["c"]))
            run.add_step(Step(id="c3", title="after it", dependencies=["c2"]))
        if step.id == "c3":
            run.add_step(Step(id="c2", title="follow-up again"))
        return ok(step)

    with pytest.raises(RunStoppedError) as err:
        execute(agent, run, fn, mode)
    _stop_names(err, "c2")
    assert sorted(ran) == sorted([*IDS, "c2", "c3"]) and ran.index("c3") > ran.index("c2")
    stored = stored_run(url)
    assert len(stored.steps) == 7 and stored.steps["c2"].title == "follow-up"
    assert all(s.status == StepStatus.COMPLETED and s.result == f"{s.id} ok"
               for s in stored.steps.values())
    done, again = resume(url, mode)
    assert again == [] and len(done.steps) == 7
