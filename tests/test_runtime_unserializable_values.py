"""A value the store cannot serialise, left by an executor in its step (or in the run): a lone
surrogate passes the store's value check (`check_storable`) and is met only by the commit's
JSON (`model_json_of`).

It escaped execute_run as a bare UnstorableValueError naming no field, the run left
"running" and, under every-n, the finished steps not yet committed lost (a resume ran, and
paid for, them again). Now, as for NaN: RunStoppedError naming the step and the field, the
field put back, the finished steps committed, the run "failed", and a resume runs what is left.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    CheckpointedAgent,
    CheckpointPolicy,
    CheckpointStore,
    RetryPolicy,
    RunStoppedError,
    Step,
    StepStatus,
)

BAD = "bad\udc80"  # text decoded with errors="surrogateescape": no UTF-8 holds it

_POLICIES = {"every-step": CheckpointPolicy.every_step, "every-3": lambda: CheckpointPolicy.every_n_steps(3)}


def _execute(agent: CheckpointedAgent, run: Any, fn: Any, mode: str) -> None:
    if mode == "sync":
        agent.execute_run(run, fn)
        return

    async def ex(step: Step, prior: Any) -> Any:
        await asyncio.sleep(0)
        return fn(step, prior)

    asyncio.run(agent.aexecute_run(run, ex))


def _chain(agent: CheckpointedAgent) -> Any:
    return agent.start_run("g", [
        Step(id="a", title="a"),
        Step(id="b", title="b", dependencies=["a"], metadata={"kept": [1, 2]}),
        Step(id="c", title="c", dependencies=["b"]),
        Step(id="d", title="d", dependencies=["c"]),
    ], run_id="r")


def _spoil(kind: str, step: Step) -> None:
    if kind == "title":
        step.title = BAD
    elif kind == "metadata":
        step.metadata["note"] = {"text": BAD}
    elif kind == "result":
        step.result = BAD  # a partial result, then the attempt fails (a returned one is
        raise ConnectionError("429")  # replaced by the output): retryable, no retry committable
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("policy", list(_POLICIES))
@pytest.mark.parametrize("kind", ["title", "result", "metadata"])
def test_a_lone_surrogate_left_in_the_running_step_stops_the_run_committed(
        tmp_path: Path, mode: str, policy: str, kind: str) -> None:
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=_POLICIES[policy](),
                              retry=RetryPolicy(max_attempts=3, base_delay=0))
    run = _chain(agent)
    ran: list[str] = []

    def spoils_b(step: Step, prior: Any) -> str:
        ran.append(step.id)
        if step.id == "b":
            _spoil(kind, step)
        return f"{step.id} done"

    field = "metadata.note" if kind == "metadata" else kind
    with pytest.raises(RunStoppedError, match=(rf"run 'r': step 'b' left a value in the step the "
                                               rf"store cannot keep \({field}: .*surrogates not "
                                               "allowed")) as info:
        _execute(agent, run, spoils_b, mode)
    assert info.value.step_id == "b" and info.value.attempts == 1
    assert ran == ["a", "b"]  # not retried, "c" never started on it

    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["stopped"]["step_id"] == "b"
    a, b = stored.steps["a"], stored.steps["b"]
    assert a.status == StepStatus.COMPLETED and a.result == "a done"  # under every-3 too
    assert b.status == StepStatus.PENDING and b.title == "b" and b.result is None
    assert b.metadata == {"kept": [1, 2]}
    assert b.error is not None and field in b.error
    assert stored.steps["c"].status == stored.steps["d"].status == StepStatus.PENDING

    ran.clear()
    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, lambda step, prior: ran.append(step.id) or f"{step.id} fine", mode)
    assert ran == ["b", "c", "d"]  # "a" is not run (and paid for) again
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed" and "stopped" not in done.metadata
    assert done.steps["a"].result == "a done" and done.steps["b"].title == "b"
    assert done.steps["d"].result == "d fine"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_lone_surrogate_put_in_a_finished_step_before_its_commit_stops_the_run(
        tmp_path: Path, mode: str) -> None:
    """Under every-3, "b" finished and waits for its commit while "c" runs and writes into it:
    met only by the batch's commit, it raised out of execute_run with "a" and "b" lost. Now the
    stop names "b", its title put back as saved, and the batch lands completed."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(3))
    run = _chain(agent)
    ran: list[str] = []

    def spoils_b_from_c(step: Step, prior: Any) -> str:
        ran.append(step.id)
        if step.id == "c":
            run.steps["b"].title = BAD
        return f"{step.id} done"

    with pytest.raises(RunStoppedError, match=r"step 'b' holds a value .*\(title: .*surrogates"):
        _execute(agent, run, spoils_b_from_c, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert [stored.steps[s].status for s in "abc"] == [StepStatus.COMPLETED] * 3  # the batch
    assert stored.steps["b"].title == "b" and stored.steps["b"].result == "b done"
    assert "title" in stored.metadata["stopped"]["error"]

    ran.clear()
    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, lambda step, prior: ran.append(step.id) or f"{step.id} fine", mode)
    assert ran == ["d"]
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_lone_surrogate_put_in_the_run_stops_the_run_at_the_step_whose_commit_met_it(
        tmp_path: Path, mode: str) -> None:
    """`run.metadata` (the executor's closure over the run) is written by every commit: its
    refusal named no step, so the stop's and the crash flush's commits met it too."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(3))
    run = _chain(agent)
    run.metadata["owner"] = "me"
    agent.store.commit(run)

    def spoils_the_run(step: Step, prior: Any) -> str:
        if step.id == "c":
            run.metadata["owner"] = BAD
        return f"{step.id} done"

    with pytest.raises(RunStoppedError, match=r"met a value in the run .*\(metadata\.owner: .*surrogates"):
        _execute(agent, run, spoils_the_run, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["owner"] == "me"  # put back as saved
    assert [stored.steps[s].status for s in "abc"] == [StepStatus.COMPLETED] * 3
