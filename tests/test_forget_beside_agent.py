"""`ckptfs forget` of a run while an agent works on it: the agent stops; nothing is re-created.

Found by a hostile review (2026-12-07). The real `ckptfs forget` ran while step p4's paid call
was in flight. Logging the call's result met RunNotFoundError, which the agent retried as a
step failure, paying for p4 again in the same process. Its later commits each wrote a run of
just the steps they carried: `execute_run` said "completed 10" and a new process loaded a
completed run of 7 steps (p4-p10), which `find_resumable_runs` did not list and `verify`
passed. In the library, `commit(run, [s2])` after the run was forgotten was acknowledged as
v1, and a load gave 1 step of 5: now such a commit writes the whole run, as save_run does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointedAgent, CheckpointStore, Step, StepResult, StepStatus
from ckptfs.errors import ConflictError, RunNotFoundError
from ckptfs.maintenance.forget import forget
from ckptfs.store.group_commit import GroupPart

CLI = str(Path(sys.executable).parent / "ckptfs")


def test_an_agent_whose_run_is_forgotten_mid_call_stops_and_pays_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    paid: list[int] = []
    forgot: list[int] = []
    with CheckpointStore(str(root)) as store:
        agent = CheckpointedAgent(store)
        run = agent.start_run("g", [Step(id=f"p{i}", title=f"p{i}") for i in range(1, 11)], run_id="r")

        def tool(i: int) -> dict[str, int]:
            paid.append(i)
            if i == 4 and not forgot:  # the operator's forget lands while this call is in flight
                done = subprocess.run([CLI, "forget", str(root), "r"], capture_output=True, text=True,
                                      timeout=120)
                forgot.append(done.returncode)
            return {"i": i}

        def executor(step: Step, prior: Any) -> StepResult:
            out = agent.tools().run("t", {"i": int(step.id[1:])}, tool)
            return StepResult(f"done {out['i']}")

        with pytest.raises(RunNotFoundError):
            agent.execute_run(run, executor)
    assert forgot == [0]
    assert paid == [1, 2, 3, 4]  # p4 once: was paid again by a retry of the step
    with CheckpointStore(str(root)) as fresh:
        assert fresh.load_run("r") is None  # was a "completed" run of p4-p10
        assert fresh.find_resumable_runs() == []


def _forgotten_beside(store: CheckpointStore, url: str) -> AgentRun:
    """A run of 5 steps saved through `store`, then forgotten by another process's store; the
    next commit of s1 (completed "late") meets its base gone (BaseRemovedError, a conflict)."""
    run = AgentRun(run_id="r", goal="g")
    for i in range(5):
        run.add_step(Step(id=f"s{i}", title=f"s{i}"))
    store.save_run(run)
    with CheckpointStore(url) as other:
        assert forget(other.storage, "r").deleted
    run.steps["s1"].status, run.steps["s1"].result = StepStatus.COMPLETED, "late"
    with pytest.raises(ConflictError):
        store.commit(run, [run.steps["s1"]])
    return run


def test_a_commit_of_a_forgotten_run_writes_all_of_it_not_just_its_steps(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    with CheckpointStore(url) as store:
        run = _forgotten_beside(store, url)
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "later"
        assert store.commit(run, [run.steps["s2"]]) == 1  # the run, re-created whole
    with CheckpointStore(url) as fresh:
        again = fresh.load_run("r")
        assert again is not None and sorted(again.steps) == [f"s{i}" for i in range(5)]  # was ["s2"]
        assert again.steps["s1"].result == "late" and again.steps["s2"].result == "later"


def test_a_grouped_commit_of_a_forgotten_run_writes_all_of_it_as_a_commit_does(tmp_path: Path) -> None:
    """The group-commit path (`commit_many`, what `aexecute_run` writes through) has the same
    answer as `commit`: a part carrying the run, of a run the store does not hold, writes the
    whole run. It wrote a run of just the parts' steps (2 of 5), acknowledged."""
    url = str(tmp_path / "store")
    with CheckpointStore(url) as store:
        run = _forgotten_beside(store, url)
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "later"
        run.steps["s3"].status, run.steps["s3"].result = StepStatus.COMPLETED, "latest"
        parts = [GroupPart("r", run=run, steps=[run.steps["s2"]]),
                 GroupPart("r", run=run, steps=[run.steps["s3"]])]
        store.commit_many(parts)
        assert [p.future.result(timeout=10) for p in parts] == [1, 1]  # one record, the run whole
    with CheckpointStore(url) as fresh:
        again = fresh.load_run("r")
        assert again is not None and sorted(again.steps) == [f"s{i}" for i in range(5)]  # was s2, s3
        assert [again.steps[f"s{i}"].result for i in (1, 2, 3)] == ["late", "later", "latest"]
