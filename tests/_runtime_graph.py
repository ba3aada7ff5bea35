"""A five-step chain run under each commit policy, sync or async, for the tests of what an
executor changes in the run's graph mid-run (test_runtime_readded_step.py,
test_runtime_added_nonstep.py): start it, execute it, read it back as a new process would, and
resume it to the end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ckptfs import CheckpointedAgent, CheckpointPolicy, CheckpointStore, Step, StepResult

IDS = ["a", "b", "c", "d", "e"]
POLICIES: dict[str, Callable[[], CheckpointPolicy]] = {
    "every-step": CheckpointPolicy.every_step,
    "every-n": lambda: CheckpointPolicy.every_n_steps(10),
    "milestones": CheckpointPolicy.at_milestones,
}


def start(url: str, policy: str, **kw: Any) -> tuple[CheckpointedAgent, Any]:
    agent = CheckpointedAgent(CheckpointStore(url), policy=POLICIES[policy](), **kw)
    steps = [Step(id=s, title=s, dependencies=[IDS[i - 1]] if i else []) for i, s in enumerate(IDS)]
    return agent, agent.start_run("g", steps, run_id="r")


def ok(step: Step) -> StepResult:
    return StepResult(f"{step.id} ok", tokens=10, cost_usd=0.5)


def execute(agent: CheckpointedAgent, run: Any, fn: Callable[[Step], Any], mode: str) -> None:
    if mode == "sync":
        agent.execute_run(run, lambda step, prior: fn(step))
        return

    async def ex(step: Step, prior: Any) -> Any:
        await asyncio.sleep(0)
        return fn(step)

    asyncio.run(agent.aexecute_run(run, ex, concurrency=3))


def stored_run(url: str) -> Any:
    run = CheckpointStore(url).load_run("r")  # a fresh store: what a new process would load
    assert run is not None
    return run


def resume(url: str, mode: str, ids: list[str] | None = None) -> tuple[Any, list[str]]:
    """Resume run "r" to its end; the run as stored then, and the steps the resume ran. With
    `ids`, the run must end with exactly those steps, each with its executor's result."""
    agent = CheckpointedAgent(CheckpointStore(url))
    run = agent.resume_run("r")
    assert run is not None
    ran: list[str] = []

    def fn(step: Step) -> StepResult:
        ran.append(step.id)
        return ok(step)

    execute(agent, run, fn, mode)
    done = stored_run(url)
    assert done.status == "completed" and "stopped" not in done.metadata
    if ids is not None:
        assert sorted(done.steps) == ids and all(s.result == f"{s.id} ok" for s in done.steps.values())
    assert done.total_tokens == sum(s.tokens for s in done.steps.values())
    return done, ran
