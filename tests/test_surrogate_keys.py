"""A dict key that is no valid Unicode text (a lone surrogate, as a bad decode of bytes leaves).

A value holding one fails to serialize and was refused; a KEY holding one, at the top of a
model's dict field (`step.metadata["\\udc80"]`), pydantic wrote lossily as U+FFFD: the commit was
acknowledged and a load returned another key. The store now refuses it by name before writing,
and the agent stops the run on it as on any value the store refuses, with what finished kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointedAgent, CheckpointPolicy, CheckpointStore, RunStoppedError, Step
from ckptfs.errors import UnstorableValueError
from ckptfs.format.models import StepStatus

BAD = "note-\udc80"


def _saved(url: str) -> tuple[CheckpointStore, AgentRun]:
    store = CheckpointStore(url)
    run = AgentRun(run_id="r", goal="g")
    run.add_step(Step(id="a", title="a"))
    store.save_run(run)
    return store, run


@pytest.mark.parametrize("where", ["step metadata", "nested in step metadata", "run metadata"])
def test_a_lone_surrogate_key_is_refused_and_nothing_written(tmp_path: Path, where: str) -> None:
    url = str(tmp_path / "store")
    store, run = _saved(url)
    before = {p: p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()}
    step = run.steps["a"]
    step.status, step.result = StepStatus.COMPLETED, "ok"
    if where == "step metadata":
        step.metadata[BAD] = 1
    elif where == "nested in step metadata":
        step.metadata["outer"] = {"fine": 1, BAD: 2}
    else:
        run.metadata[BAD] = 1
    with pytest.raises(UnstorableValueError, match=r"lone surrogate|surrogates not allowed"):
        store.commit(run, [step])
    after = {p: p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert after == before
    loaded = CheckpointStore(url).load_run("r")
    assert loaded is not None and loaded.steps["a"].status == StepStatus.PENDING


def test_an_executor_leaving_one_stops_the_run_with_what_finished_kept(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(3))
    steps = [Step(id=s, title=s, dependencies=[p] if p else []) for s, p in
             (("a", None), ("b", "a"), ("c", "b"))]
    run = agent.start_run("g", steps, run_id="r")

    def executor(step: Step, prior: object) -> str:
        if step.id == "b":
            step.metadata[BAD] = "x"
        return f"{step.id} ok"

    with pytest.raises(RunStoppedError) as stop:
        agent.execute_run(run, executor)
    assert stop.value.step_id == "b"
    loaded = CheckpointStore(url).load_run("r")
    assert loaded is not None and loaded.status == "failed"
    assert loaded.steps["a"].status == StepStatus.COMPLETED and loaded.steps["a"].result == "a ok"
    assert all(BAD not in s.metadata for s in loaded.steps.values())
