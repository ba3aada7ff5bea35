"""Hostile review of "a value the store refuses stops the run" and the policies' build checks.

Three gaps: a NaN the executor puts in the *run's* fields (a closure over the run) still
escaped execute_run with the run left "running" (and, under every-n, the finished steps lost);
a step never saved before had its whole metadata (its inputs) reset to {} by the put-back; and
a whole number that is not an int (numpy.int64, from a config or a DataFrame), which every
policy took before the build checks, was refused.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction
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
    StepResult,
    StepStatus,
)

NAN = float("nan")
CLI = str(Path(sys.executable).with_name("ckptfs"))


def _execute(agent: CheckpointedAgent, run: Any, fn: Any, mode: str) -> None:
    if mode == "sync":
        agent.execute_run(run, fn)
        return

    async def ex(step: Step, prior: Any) -> Any:
        await asyncio.sleep(0)
        return fn(step, prior)

    asyncio.run(agent.aexecute_run(run, ex, concurrency=3))


def _verify_clean(url: str) -> None:
    got = subprocess.run([CLI, "verify", url], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    shown = subprocess.run([CLI, "show", url, "r"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("every_n", [False, True], ids=["every-step", "every-n"])
def test_a_nan_put_in_the_runs_own_metadata_stops_the_run_committed(tmp_path: Path, mode: str,
                                                                    every_n: bool) -> None:
    """Before: NonFiniteValueError out of execute_run, the store's run "running" (every commit,
    the stop's and the crash flush's, carried the run's fields), and under every-n the
    finished, acknowledged step "a" never saved. Now the run stops like a bad step value."""
    url = str(tmp_path / "store")
    policy = CheckpointPolicy.every_n_steps(10) if every_n else None
    agent = CheckpointedAgent(CheckpointStore(url), policy=policy)
    run = agent.start_run("g", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"]),
                                Step(id="c", title="c", dependencies=["a"])],
                          run_id="r", metadata={"owner": "me"})
    ran: list[str] = []

    def bad(step: Step, prior: Any) -> StepResult:
        ran.append(step.id)
        if step.id == "b":
            run.metadata["score"] = NAN  # the executor's closure over the run
        return StepResult(f"{step.id} done", tokens=10, cost_usd=0.5)

    with pytest.raises(RunStoppedError, match=r"step 'b' left a value in the run the store "
                                              r"cannot keep \(metadata\.score: nan"):
        _execute(agent, run, bad, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["owner"] == "me" and "score" not in stored.metadata
    assert stored.metadata["stopped"]["step_id"] == "b"
    assert stored.steps["a"].status == StepStatus.COMPLETED  # acknowledged, so kept
    assert stored.steps["b"].status == StepStatus.PENDING
    assert "score" not in run.metadata  # put back in memory too
    _verify_clean(url)

    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, lambda step, prior: StepResult(f"{step.id} ok", tokens=10, cost_usd=0.5),
             mode)
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed" and "stopped" not in done.metadata
    assert ran.count("a") == 1  # not run again
    assert done.total_tokens == 30 == sum(s.tokens for s in done.steps.values())
    assert done.total_cost_usd == 1.5 == sum(s.cost_usd for s in done.steps.values())
    _verify_clean(url)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_step_never_saved_keeps_its_inputs_when_its_bad_value_is_put_back(tmp_path: Path,
                                                                            mode: str) -> None:
    """A step added to a started run is stored only when it first commits. Its put-back had no
    stored value and reset all of `metadata` to {}: the input its executor reads ("url") was
    gone in memory and in the store, so the resume could not run it."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url))
    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    run.add_step(Step(id="b", title="b", metadata={"url": "http://x", "n": [1, 2]}))
    fixed = {"on": False}

    def ex(step: Step, prior: Any) -> str:
        if step.id == "b":
            assert step.metadata["url"] == "http://x"  # what the step was given
            if not fixed["on"]:
                step.metadata["score"] = NAN
        return f"{step.id} done"

    with pytest.raises(RunStoppedError, match=r"step 'b' left a value .*metadata\.score: nan"):
        _execute(agent, run, ex, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.steps["b"].metadata == {"url": "http://x", "n": [1, 2]}
    fixed["on"] = True
    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, ex, mode)
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed" and done.steps["b"].result == "b done"


class WholeLike:
    """What numpy.int64 is to a policy: a whole number with `__index__`, not an int subclass."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n


class RefusesIndex:
    def __index__(self) -> int:  # numpy.bool_'s refuses
        raise TypeError("not an index")


def test_a_whole_number_that_is_not_an_int_is_still_taken_as_an_int(tmp_path: Path) -> None:
    """numpy.int64 counts and numpy/Fraction delays worked before the build checks (only `<`
    and arithmetic were asked of them); refused, a config read from numpy or pandas stopped
    working. Taken, and held as plain int/float (random.Random refuses a numpy seed)."""
    pol = RetryPolicy(max_attempts=WholeLike(3), max_total_attempts=WholeLike(9),  # type: ignore[arg-type]
                      seed=WholeLike(7), base_delay=Fraction(0), max_delay=Fraction(1, 2))  # type: ignore[arg-type]
    assert type(pol.max_attempts) is int and pol.max_attempts == 3
    assert type(pol.seed) is int and pol.seed == 7 and pol.max_total_attempts == 9
    assert type(pol.max_delay) is float and pol.max_delay == 0.5
    every = CheckpointPolicy.every_n_steps(WholeLike(2))  # type: ignore[arg-type]
    assert type(every.every_n) is int and every.every_n == 2
    with pytest.raises(TypeError, match=r"max_attempts must be a whole number"):
        RetryPolicy(max_attempts=RefusesIndex())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"base_delay must be a number, got Decimal"):
        RetryPolicy(base_delay=Decimal("0.5"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"max_attempts must be a whole number"):
        RetryPolicy(max_attempts=3.0)  # type: ignore[arg-type]

    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), WholeLike(3), retry=pol)  # type: ignore[arg-type]
    assert agent.checkpoint_every_n == 3
    run = agent.start_run("g", [Step(id=f"s{i}", title="x") for i in range(4)], run_id="r")
    fails: list[str] = []

    async def ex(step: Step, prior: Any) -> str:
        if step.id == "s1" and len(fails) < 2:
            fails.append(step.id)
            raise ConnectionError("429")
        return "ok"

    asyncio.run(agent.aexecute_run(run, ex, concurrency=WholeLike(2)))  # type: ignore[arg-type]
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed"
    assert done.steps["s1"].attempt_count == 3
