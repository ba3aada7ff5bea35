"""A Step in `run.steps` under a key that is not its id, as the store meets it.

A commit writes a step under its id: `save_run` or `commit` of a run holding
`run.steps["x"] = Step(id="y")` acknowledged "x" (the caller's run) and stored "y" (what a load
returns), and `execute_run` of a run holding one at its start ran it to completion the same way.
Now the store's value check refuses it, naming the key and the id, before a byte is written.
`commit(run, ["x"])` of `run.steps["x"] = None` named no step ("a step is a NoneType").

A stop for a value spoiled in a step that had already finished said "resume_run(...) continues
at this step", which a resume does not do: the step is finished in the checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    AgentRun,
    CheckpointedAgent,
    CheckpointPolicy,
    CheckpointStore,
    ProgressEvent,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
    open_storage,
)
from ckptfs.errors import UnstorableValueError

RUN = "r"
IDS = ["a", "b", "c", "d"]
MISFILED = r"step 'x' is a Step whose id is 'y'"
PAST = "the step is finished there, so resume_run('r') goes on past it without running it again"


def _files(url: str) -> dict[str, str]:
    """Every stored key with the sha256 of its bytes."""
    storage = open_storage(url, {})
    try:
        return {k: hashlib.sha256(storage.get(k)).hexdigest() for k in storage.list("")}
    finally:
        storage.close()


def _saved(url: str) -> tuple[CheckpointStore, AgentRun]:
    """A store and a run of two steps it saved, "a" completed since and committed."""
    store = CheckpointStore(url)
    run = AgentRun(run_id=RUN, goal="g")
    for sid in "ab":
        run.add_step(Step(id=sid, title=sid))
    store.save_run(run)
    a = run.steps["a"]
    a.status, a.result = StepStatus.COMPLETED, "a done"
    store.commit(run, [a])
    return store, run


def _assert_intact(url: str, before: dict[str, str]) -> None:
    """Nothing written, and a new store loads the run as last committed."""
    assert _files(url) == before
    loaded = CheckpointStore(url).load_run(RUN)
    assert loaded is not None
    assert sorted(loaded.steps) == ["a", "b"]
    assert loaded.steps["a"].status == StepStatus.COMPLETED and loaded.steps["a"].result == "a done"


# How the caller writes the run holding the misfiled step.
WRITES: dict[str, Callable[[CheckpointStore, AgentRun], Any]] = {
    "save_run": lambda store, run: store.save_run(run),
    "commit-all": lambda store, run: store.commit(run),
    "commit-key": lambda store, run: store.commit(run, ["x"]),
    "commit-step": lambda store, run: store.commit(run, [run.steps["x"]]),
}


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("holder", ["same-run", "loaded-run"])
def test_a_step_under_another_id_is_refused_naming_key_and_id(
        tmp_path: Path, write: str, holder: str) -> None:
    """`run.steps["x"] = Step(id="y")`, in the run the store saved (its head tracks the run's
    changes: only the appended key is looked at) or in one loaded afresh (every step is).
    Before: acknowledged, and a fresh load returned a step "y" the caller's run does not have."""
    url = str(tmp_path / "store")
    store, run = _saved(url)
    if holder == "loaded-run":
        store = CheckpointStore(url)
        loaded = store.load_run(RUN)
        assert loaded is not None
        run = loaded
    run.steps["x"] = Step(id="y", title="y")
    before = _files(url)
    with pytest.raises(UnstorableValueError, match=MISFILED) as info:
        WRITES[write](store, run)
    assert (info.value.run_id, info.value.step_id, info.value.field) == (RUN, "x", "steps")
    _assert_intact(url, before)

    del run.steps["x"]  # put right, the same store commits on from where it was
    run.add_step(Step(id="y", title="y"))
    store.save_run(run)
    loaded = CheckpointStore(url).load_run(RUN)
    assert loaded is not None and sorted(loaded.steps) == ["a", "b", "y"]


def test_a_step_filed_under_two_keys_is_refused_on_the_tracked_path(tmp_path: Path) -> None:
    """The run's own step "a" put under a new key "x" as well: every step the tracked save
    looks at is the run's under its own id, but the store would hold one id fewer than the
    run has keys. Before: acknowledged, "x" never stored."""
    url = str(tmp_path / "store")
    store, run = _saved(url)
    run.steps["x"] = run.steps["a"]
    before = _files(url)
    with pytest.raises(UnstorableValueError, match=r"step 'x' is a Step whose id is 'a'"):
        store.save_run(run)
    _assert_intact(url, before)


def test_a_step_id_changed_to_another_key_is_refused(tmp_path: Path) -> None:
    """`run.steps["b"].id = "y"`: the step the store has as "b" would be written as "y"."""
    url = str(tmp_path / "store")
    store, run = _saved(url)
    run.steps["b"].id = "y"
    before = _files(url)
    with pytest.raises(UnstorableValueError, match=r"step 'b' is a Step whose id is 'y'"):
        store.save_run(run)
    _assert_intact(url, before)


def test_commit_by_key_of_none_names_the_key(tmp_path: Path) -> None:
    """Before: "a step is a NoneType", the key it was asked to commit nowhere."""
    url = str(tmp_path / "store")
    store, run = _saved(url)
    run.steps["x"] = None  # type: ignore[assignment]  # AgentRun does not validate assignment
    before = _files(url)
    with pytest.raises(UnstorableValueError, match=r"step 'x' is a NoneType, not a Step") as info:
        store.commit(run, ["x"])
    assert info.value.step_id == "x"
    _assert_intact(url, before)


@pytest.mark.parametrize("known", [True, False], ids=["run-it-saved", "run-new-to-it"])
def test_execute_run_refuses_a_misfiled_step_before_running_anything(
        tmp_path: Path, known: bool) -> None:
    """The agent's start-of-run check, on a run it saved itself (start_run) or one it has not
    seen (saved first). Before: every step ran and the run completed, "y" stored and "x" in
    the caller's run."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url))
    run = agent.start_run("g", [Step(id=s, title=s) for s in "ab"], run_id=RUN)
    run.steps["x"] = Step(id="y", title="y")
    if not known:
        agent = CheckpointedAgent(CheckpointStore(url))
    before = _files(url)
    ran: list[str] = []

    def fn(step: Step, prior: Any) -> StepResult:
        ran.append(step.id)
        return StepResult(f"{step.id} ok")

    with pytest.raises(UnstorableValueError, match=MISFILED):
        agent.execute_run(run, fn)
    assert ran == []
    assert _files(url) == before
    loaded = CheckpointStore(url).load_run(RUN)
    assert loaded is not None and sorted(loaded.steps) == ["a", "b"]
    assert all(s.status == StepStatus.PENDING for s in loaded.steps.values())


def _chain(agent: CheckpointedAgent) -> AgentRun:
    steps = [Step(id=s, title=s, dependencies=[IDS[i - 1]] if i else []) for i, s in enumerate(IDS)]
    return agent.start_run("g", steps, run_id=RUN)


def _resume_runs(url: str) -> list[str]:
    """What a resume runs (to completion)."""
    agent = CheckpointedAgent(CheckpointStore(url))
    again = agent.resume_run(RUN)
    assert again is not None
    ran: list[str] = []

    def fn(step: Step, prior: Any) -> StepResult:
        ran.append(step.id)
        return StepResult(f"{step.id} ok")

    agent.execute_run(again, fn)
    return ran


def test_a_value_spoiled_in_a_finished_step_stops_saying_a_resume_goes_past_it(
        tmp_path: Path) -> None:
    """every_n(3): "c"'s executor puts NaN in finished "a", met by the batch's commit. The
    stop is committed with "a" completed, and a resume does not run it. Before: "resume_run('r')
    continues at this step"."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(3))
    run = _chain(agent)

    def fn(step: Step, prior: Any) -> StepResult:
        if step.id == "c":
            run.steps["a"].metadata["score"] = float("nan")
        return StepResult(f"{step.id} done")

    with pytest.raises(RunStoppedError) as info:
        agent.execute_run(run, fn)
    assert info.value.step_id == "a"
    assert "holds a value the store cannot keep" in str(info.value)
    assert str(info.value).endswith(PAST)
    stored = CheckpointStore(url).load_run(RUN)
    assert stored is not None and stored.steps["a"].status == StepStatus.COMPLETED
    assert _resume_runs(url) == ["d"]


def test_a_run_value_charged_to_a_finished_step_stops_saying_a_resume_goes_past_it(
        tmp_path: Path) -> None:
    """A progress callback puts NaN in run.metadata on the last step's completion, met by the
    final commit of every step: charged to a step of it, committed completed with the stop;
    a resume runs nothing."""
    url = str(tmp_path / "store")
    box: list[AgentRun] = []

    def on_progress(ev: ProgressEvent) -> None:
        if ev.kind == "step_completed" and ev.step_id == "d":
            box[0].metadata["score"] = float("nan")

    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(10),
                              on_progress=on_progress)
    box.append(_chain(agent))
    with pytest.raises(RunStoppedError, match="met a value in the run the store cannot keep") as info:
        agent.execute_run(box[0], lambda step, prior: StepResult(f"{step.id} done"))
    assert str(info.value).endswith(PAST)
    stored = CheckpointStore(url).load_run(RUN)
    assert stored is not None and stored.metadata["stopped"]["step_id"] == info.value.step_id
    assert all(s.status == StepStatus.COMPLETED for s in stored.steps.values())
    assert _resume_runs(url) == []
