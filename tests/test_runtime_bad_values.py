"""Bad values in the agent runtime: policies built from nonsense, and executors that leave in
their step a value no record can hold.

A policy is checked when it is built, by field and value, instead of failing (or not) deep in
a run. A NaN or a 5,000-digit int the executor puts in its step stops the run at that step
with RunStoppedError, committed, instead of escaping `execute_run` as the store's refusal
with the run left "running".
"""

from __future__ import annotations

import asyncio
import math
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


# ------------------------------------------------------------------------------ policies

_BAD_RETRY: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"max_delay": NAN}, ValueError, r"RetryPolicy: max_delay must be a finite number, got nan"),
    ({"max_delay": math.inf}, ValueError, r"max_delay must be a finite number, got inf"),
    ({"max_delay": 10**400}, ValueError, r"max_delay must be a finite number, got an int of about 40"),
    ({"max_delay": 10**5000}, ValueError, r"max_delay must be a finite number, got an int of about 50"),
    ({"max_attempts": -(10**5000)}, ValueError, r"max_attempts must be >= 1, got an int of about 50"),
    ({"max_delay": 1e300}, ValueError, r"max_delay must be within \[0, 3153600000\] seconds"),
    ({"base_delay": -1.0}, ValueError, r"base_delay must be within .*, got -1\.0"),
    ({"base_delay": "0.5"}, TypeError, r"base_delay must be a number, got '0\.5' \(str\)"),
    ({"base_delay": NAN}, ValueError, r"base_delay must be a finite number, got nan"),
    ({"max_retry_after": math.inf}, ValueError, r"max_retry_after must be a finite number, got inf"),
    ({"max_retry_after": -5}, ValueError, r"max_retry_after must be within .*, got -5"),
    ({"multiplier": NAN}, ValueError, r"multiplier must be a finite number, got nan"),
    ({"multiplier": 0.5}, ValueError, r"multiplier must be >= 1, got 0\.5"),
    ({"jitter": NAN}, ValueError, r"jitter must be a finite number, got nan"),
    ({"jitter": 1.5}, ValueError, r"jitter must be within \[0, 1\], got 1\.5"),
    ({"jitter": True}, TypeError, r"jitter must be a number, got True \(bool\)"),
    ({"max_attempts": "3"}, TypeError, r"max_attempts must be a whole number, got '3' \(str\)"),
    ({"max_attempts": True}, TypeError, r"max_attempts must be a whole number, got True \(bool\)"),
    ({"max_attempts": 3.0}, TypeError, r"max_attempts must be a whole number, got 3\.0 \(float\)"),
    ({"max_attempts": NAN}, TypeError, r"max_attempts must be a whole number, got nan"),
    ({"max_attempts": -1}, ValueError, r"max_attempts must be >= 1, got -1"),
    ({"max_total_attempts": 0}, ValueError, r"max_total_attempts must be >= 1, got 0"),
    ({"max_total_attempts": NAN}, TypeError, r"max_total_attempts must be a whole number, got nan"),
    ({"max_total_attempts": True}, TypeError, r"max_total_attempts must be a whole number, got True"),
    ({"seed": "abc"}, TypeError, r"seed must be a whole number, got 'abc'"),
    ({"retry_on": ("ConnectionError",)}, TypeError, r"retry_on must be a tuple of exception classes"),
    ({"never_retry": (1,)}, TypeError, r"never_retry must be a tuple of exception classes"),
]


def _id(kwargs: dict[str, Any]) -> str:
    (k, v), = kwargs.items()
    big = isinstance(v, int) and abs(v) > 10**100  # repr() of a 5,000-digit int raises
    return f"{k}={'-' if big and v < 0 else ''}{'huge-int' if big else repr(v)}"


@pytest.mark.parametrize(("kwargs", "kind", "message"), _BAD_RETRY,
                         ids=[_id(kw) for kw, _, _ in _BAD_RETRY])
def test_retry_policy_refuses_a_bad_value_by_field_and_value(kwargs: dict[str, Any],
                                                             kind: type[Exception], message: str) -> None:
    """NaN passed every `<` check (a NaN max_delay made every delay NaN, which time.sleep
    refuses mid-run) and "3" raised a comparison's TypeError naming no field."""
    with pytest.raises(kind, match=message):
        RetryPolicy(**kwargs)


def test_retry_policy_still_takes_what_it_always_took() -> None:
    pol = RetryPolicy(max_attempts=5, base_delay=0, multiplier=1, max_delay=2, jitter=0,
                      max_retry_after=0, max_total_attempts=9, seed=7, retry_on=ConnectionError)
    assert pol.is_retryable(ConnectionError()) and not pol.is_retryable(KeyError())
    assert RetryPolicy.never().max_attempts == 1
    assert RetryPolicy(seed=-(10**30)).seed == -(10**30)  # any int seeds random.Random


@pytest.mark.parametrize(("n", "kind"), [(0, ValueError), (-1, ValueError), (True, TypeError),
                                         (NAN, TypeError), (2.0, TypeError), ("3", TypeError)])
def test_every_n_steps_refuses_a_count_that_is_not_a_positive_int(n: Any, kind: type[Exception]) -> None:
    """every_n_steps(nan) was accepted, and `finished >= nan` is never true: no step was
    committed until the run ended, whatever n promised."""
    with pytest.raises(kind, match=rf"CheckpointPolicy: every_n must be .*got {n!r}"):
        CheckpointPolicy.every_n_steps(n)


def test_checkpoint_policy_refuses_a_durable_attempts_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match=r"durable_attempts must be True or False, got 'no'"):
        CheckpointPolicy(durable_attempts="no")  # type: ignore[arg-type]


def test_the_agent_names_a_bad_checkpoint_count_and_a_bad_concurrency(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"))
    with pytest.raises(TypeError, match=r"checkpoint_every_n_steps must be a whole number, got '5'"):
        CheckpointedAgent(store, checkpoint_every_n_steps="5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"checkpoint_every_n_steps must be a whole number, got nan"):
        CheckpointedAgent(store, checkpoint_every_n_steps=NAN)  # type: ignore[arg-type]
    agent = CheckpointedAgent(store, checkpoint_every_n_steps=0)  # the seed's "every step"
    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")

    async def ex(step: Step, prior: Any) -> str:
        return "x"

    # a NaN concurrency started no step at all and called the run "failed"
    with pytest.raises(TypeError, match=r"aexecute_run: concurrency must be a whole number, got nan"):
        asyncio.run(agent.aexecute_run(run, ex, concurrency=NAN))  # type: ignore[arg-type]
    assert store.load_run("r").status == "running"  # type: ignore[union-attr]  # untouched
    asyncio.run(agent.aexecute_run(run, ex, concurrency=2))
    assert store.load_run("r").status == "completed"  # type: ignore[union-attr]


# ------------------------------------------------------------------ executors' bad values

def _spoil(kind: str, step: Step) -> None:
    """What an executor leaves in its step that no record can hold."""
    if kind == "nan-metadata":
        step.metadata["score"] = NAN
    elif kind == "giant-int-metadata":
        step.metadata["score"] = 10**5000
    elif kind == "inf-nested":
        step.metadata["score"] = {"history": [1.0, math.inf]}
    elif kind == "nan-cost":
        step.cost_usd = NAN
    else:
        raise AssertionError(kind)


_KINDS = ["nan-metadata", "giant-int-metadata", "inf-nested", "nan-cost"]
_FIELD = {"nan-metadata": "metadata.score", "giant-int-metadata": "metadata.score",
          "inf-nested": r"metadata.score.history\[1\]", "nan-cost": "cost_usd"}


def _execute(agent: CheckpointedAgent, run: Any, fn: Any, mode: str) -> None:
    if mode == "sync":
        agent.execute_run(run, fn)
        return

    async def ex(step: Step, prior: Any) -> Any:
        await asyncio.sleep(0)
        return fn(step, prior)

    asyncio.run(agent.aexecute_run(run, ex))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("raises", [False, True], ids=["returns", "then-raises"])
def test_a_value_the_executor_leaves_in_its_step_stops_the_run_committed(
        tmp_path: Path, mode: str, kind: str, raises: bool) -> None:
    """It escaped execute_run as the store's NonFiniteValueError/UnstorableValueError, the run
    left "running" (the stop could not be committed: every commit met the same value). Now:
    RunStoppedError naming the step and the field, the run stored "failed" with the stop, the
    step PENDING with the metadata it had before, no retry of a step no commit could hold,
    and a resume with a fixed executor completes the run."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), retry=RetryPolicy(max_attempts=3, base_delay=0))
    run = agent.start_run("g", [Step(id="a", title="a", metadata={"kept": [1, 2]}),
                                Step(id="b", title="b", dependencies=["a"])], run_id="r")
    calls: list[str] = []

    def bad(step: Step, prior: Any) -> str:
        calls.append(step.id)
        _spoil(kind, step)
        if raises:
            raise ConnectionError("429")  # retryable: yet no retry could be committed
        return "out"

    with pytest.raises(RunStoppedError, match=(rf"run 'r': step 'a' left a value in the step the "
                                               rf"store cannot keep \({_FIELD[kind]}: ")) as info:
        _execute(agent, run, bad, mode)
    assert info.value.step_id == "a" and info.value.attempts == 1
    assert calls == ["a"]  # stopped at once: not retried, "b" never started on it
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None
    assert stored.status == "failed" and stored.metadata["stopped"]["step_id"] == "a"
    a = stored.steps["a"]
    assert a.status == StepStatus.PENDING and a.attempt_count == 1
    assert a.metadata == {"kept": [1, 2]} and a.cost_usd == 0.0
    assert a.error is not None and _FIELD[kind].replace("\\", "") in a.error
    assert stored.steps["b"].status == StepStatus.PENDING

    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, lambda step, prior: StepResult(f"{step.id} fine", cost_usd=0.5), mode)
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed" and "stopped" not in done.metadata
    assert done.steps["a"].result == "a fine" and done.steps["b"].result == "b fine"
    assert done.steps["a"].attempt_count == 2 and done.total_cost_usd == 1.0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_under_every_n_the_stop_keeps_finished_steps_and_paid_tool_calls(tmp_path: Path,
                                                                         mode: str) -> None:
    """A deferred policy: "a" finished but not yet committed, "b" paid for a tool call and then
    wrote NaN. The stop commits "a" with its result and keeps "b"'s paid call in the log, so the
    resume neither runs "a" again nor pays for the call twice."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(10))
    run = agent.start_run("g", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"]),
                                Step(id="c", title="c", dependencies=["b"])], run_id="r")
    paid: list[str] = []
    ran: list[str] = []

    def first(step: Step, prior: Any) -> str:
        ran.append(step.id)
        if step.id == "b":
            got = agent.tools().run("search", {"q": "x"}, lambda q: paid.append(q) or "hits")
            step.metadata["confidence"] = NAN
            return got
        return f"{step.id} done"

    with pytest.raises(RunStoppedError, match=r"step 'b' left a value .*metadata\.confidence: nan"):
        _execute(agent, run, first, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.steps["a"].status == StepStatus.COMPLETED and stored.steps["a"].result == "a done"
    assert stored.steps["b"].status == StepStatus.PENDING and "confidence" not in stored.steps["b"].metadata

    def fixed(step: Step, prior: Any) -> str:
        ran.append(step.id)
        if step.id == "b":
            return str(agent.tools().run("search", {"q": "x"}, lambda q: paid.append(q) or "hits"))
        return f"{step.id} done"

    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, fixed, mode)
    assert ran == ["a", "b", "b", "c"] and paid == ["x"]  # the call was served from the log
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed" and done.steps["b"].result == "hits"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_value_refused_at_the_running_mark_before_a_tool_call_stops_the_run(tmp_path: Path,
                                                                              mode: str) -> None:
    """NaN written before the step's first tool call: the RUNNING mark's commit is refused
    inside tools().run (the tool is not called). Before, the stop's own commit met the same NaN
    and escaped; now the run stops at the step, committed, and a resume completes it."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url))
    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    paid: list[str] = []

    def bad(step: Step, prior: Any) -> str:
        step.metadata["score"] = NAN
        return str(agent.tools().run("t", {"q": 1}, lambda q: paid.append("t") or "r"))

    with pytest.raises(RunStoppedError, match=r"step 'a' left a value .*metadata\.score: nan"):
        _execute(agent, run, bad, mode)
    assert paid == []
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.steps["a"].status == StepStatus.PENDING and stored.steps["a"].metadata == {}
    again = agent.resume_run("r")
    assert again is not None
    _execute(agent, again, lambda step, prior: agent.tools().run("t", {"q": 1}, lambda q: "r"), mode)
    assert CheckpointStore(url).load_run("r").status == "completed"  # type: ignore[union-attr]
