"""A grouped record writes the run's totals as they were when its commit was decided.

`aexecute_run` hands each commit to the group committer with the live `AgentRun`. The writer
thread used to read the run-level fields (total_tokens, total_cost_usd, metadata) only when it
wrote the record, so a RUNNING mark queued for step B, written after step A had finished in
memory (its spend added to the run's totals) but before A's own record, made the totals
durable with A's spend while A itself was not. A SIGKILL then lost A's completion and kept
its spend: the resume ran A again and counted it twice (found with random SIGKILLs of a
60-step run at concurrency 8: run total 1280 tokens for steps summing to 1200).

Here that order is forced: the child holds the writer thread on B's mark until A has been
accounted, lets the mark's record land, and is SIGKILLed as A's record is about to be written.

The same loss came from the README's executor made async: a sync `agent.tools().run` inside
an `aexecute_run` executor committed B's mark on the event loop's thread, ahead of A's
completion still queued on the writer thread ("sync" below).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptfs import CheckpointedAgent, CheckpointStore, Step, StepResult, StepStatus

ROOT = str(Path(__file__).resolve().parent.parent)
RUN = "totals"
A_TOKENS, B_TOKENS = 100, 1


def _steps() -> list[Step]:
    return [Step(id="a", title="a"), Step(id="b", title="b")]


def _child(url: str, how: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("totals", _steps(), run_id=RUN)
    real = store.commit_many
    real_commit = store.commit
    b_marked = False

    def commit(run: Any, steps: Any = None) -> int:  # the sync path's direct commit
        nonlocal b_marked
        version = real_commit(run, steps)
        b_marked = b_marked or any(s.id == "b" for s in steps or ())
        return version

    def hooked(parts: Any) -> None:
        if how == "sync" and any(p.steps and p.steps[0].id == "a" for p in parts):
            deadline = time.monotonic() + 1
            while not b_marked and time.monotonic() < deadline:
                time.sleep(0.005)  # B's sync mark may go first, if nothing holds it back
            os.kill(os.getpid(), signal.SIGKILL)  # the machine dies before A's record
        if any(p.steps and p.steps[0].id == "b" and p.steps[0].status == StepStatus.RUNNING
               for p in parts):
            deadline = time.monotonic() + 10
            while run.total_tokens < A_TOKENS and time.monotonic() < deadline:
                time.sleep(0.005)  # hold B's mark until A is accounted in memory
            real(parts)
            return
        if any(p.steps and p.steps[0].id == "a" and p.steps[0].status == StepStatus.COMPLETED
               for p in parts):
            os.kill(os.getpid(), signal.SIGKILL)  # the machine dies before A's record
        real(parts)

    store.commit_many = hooked  # type: ignore[method-assign]
    store.commit = commit  # type: ignore[method-assign]

    async def executor(step: Step, prior: list[Any]) -> StepResult:
        if how == "sync":
            if step.id == "a":
                return StepResult("a done", tokens=A_TOKENS)
            await asyncio.sleep(0.05)  # A's completion is queued by now
            agent.tools().run("pay", {"x": 1}, lambda x: x)
            return StepResult("b done", tokens=B_TOKENS)
        if step.id == "a":
            await asyncio.sleep(0.05)  # B's mark is queued by now
            return StepResult("a done", tokens=A_TOKENS)
        await agent.tools().arun("pay", {"x": 1}, lambda x: x)
        return StepResult("b done", tokens=B_TOKENS)

    asyncio.run(agent.aexecute_run(run, executor, concurrency=2))


@pytest.mark.parametrize("how", ["arun", "sync"])
def test_a_mark_does_not_make_a_lost_steps_spend_durable(tmp_path: Path, how: str) -> None:
    url = str(tmp_path / "store")
    child = subprocess.run([sys.executable, __file__, url, how], env={**os.environ, "PYTHONPATH": ROOT},
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    store = CheckpointStore(url)
    run = store.load_run(RUN)
    assert run is not None
    assert run.steps["a"].status != StepStatus.COMPLETED  # its record never landed
    spent = sum(s.tokens for s in run.steps.values())
    assert run.total_tokens == spent, (
        f"the stored totals count {run.total_tokens} tokens, the stored steps {spent}")

    agent = CheckpointedAgent(store)
    resumed = agent.resume_run(RUN)
    assert resumed is not None

    async def executor(step: Step, prior: list[Any]) -> StepResult:
        if step.id == "b":
            await agent.tools().arun("pay", {"x": 1}, lambda x: x)
        return StepResult(f"{step.id} done", tokens=A_TOKENS if step.id == "a" else B_TOKENS)

    asyncio.run(agent.aexecute_run(resumed, executor, concurrency=2))
    store.close()
    final = CheckpointStore(url).load_run(RUN)
    assert final is not None
    assert all(s.status == StepStatus.COMPLETED for s in final.steps.values())
    assert final.total_tokens == A_TOKENS + B_TOKENS


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
