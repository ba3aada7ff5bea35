"""Seams of the agent runtime found by a hostile review: each test is a defect that was real.

Tool arguments the store would refuse, a run's totals that counted a step twice after a
crash, ...: each is checked against a real store on local disk, the paid calls counted
outside the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from ckptfs import (  # noqa: E402
    CheckpointedAgent,
    CheckpointPolicy,
    CheckpointStore,
    Step,
    StepResult,
    ToolCall,
)
from ckptfs.errors import RunStoppedError  # noqa: E402
from ckptfs.runtime.tools import ARGUMENTS_NOT_KEPT, UNKEPT, IdempotentToolRunner  # noqa: E402


@pytest.mark.parametrize("args, where", [
    ({"x": (1, 2)}, "arguments.x"),                 # a tuple: a load returns a list
    ({"x": {1: "a"}}, "arguments.x"),               # an int key: a load returns "1"
    ({"x": {True: 1}}, "arguments.x"),              # a bool key
    ({"x": ["ok", {"y": frozenset()}]}, "arguments.x[1].y"),
    ({"x": "\ud800"}, "arguments.x"),               # a lone surrogate: no UTF-8 for it
    ({"\udc80": 1}, "arguments"),
])
def test_arguments_the_store_would_refuse_are_refused_before_the_call(
        tmp_path: Path, args: dict[str, Any], where: str) -> None:
    """json.dumps takes a tuple or an int key, the store does not: the call was paid, then its
    record (and the 'unkept' record meant to say it was paid, which carries the same
    arguments) was refused, so the log held nothing and every resume paid again."""
    store = CheckpointStore(str(tmp_path / "s"))
    agent = CheckpointedAgent(store)
    run = agent.start_run("g", [Step(id="s", title="t")], run_id="r")
    paid: list[int] = []
    runner = IdempotentToolRunner(agent, run.run_id, "s")
    with pytest.raises(TypeError) as err:
        runner.run("tool", args, lambda **kw: paid.append(1))
    assert paid == []
    assert where in str(err.value) and "tool 'tool'" in str(err.value)
    assert store.get_tool_call_history("r", "s") == []
    # the same runner goes on with a call the store can keep
    assert runner.run("tool", {"x": [1, 2]}, lambda x: sum(x)) == 3
    assert [c.phase for c in CheckpointStore(str(tmp_path / "s")).get_tool_call_history("r", "s")] == [
        "completed"]


def test_a_step_with_unstorable_arguments_is_never_paid_for_across_resumes(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "s"))
    paid: list[int] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        return str(agent.tools().run("charge", {"items": ("a", "b")}, lambda items: paid.append(1)))

    agent = CheckpointedAgent(store)
    run = agent.start_run("g", [Step(id="s", title="t")], run_id="r")
    for _ in range(3):
        agent.execute_run(run, ex)  # a TypeError: the step fails at once, as for NaN arguments
        assert run.steps["s"].status.value == "failed"
        assert "arguments.items" in (run.steps["s"].error or "")
        agent = CheckpointedAgent(CheckpointStore(str(tmp_path / "s")))
        got = agent.resume_run("r", retry_failed=True)
        assert got is not None
        run = got
    assert paid == []


def test_a_paid_call_with_arguments_too_large_to_store_is_not_paid_again(tmp_path: Path) -> None:
    """Arguments of 2 MB against `max_decoded_bytes` of 1 MB: the call is paid, its record is
    refused by size, and so was the 'unkept' record with the same arguments; the log held
    nothing, and each resume paid again. Now the paid record is kept without its arguments,
    and a resume asks for a guard instead of paying."""
    url = str(tmp_path / "s")
    paid: list[int] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        return str(agent.tools().run("tool", {"doc": "x" * 2_000_000},
                                     lambda doc: paid.append(1) or "ok"))

    agent = CheckpointedAgent(CheckpointStore(url, max_decoded_bytes=1_000_000))
    run = agent.start_run("g", [Step(id="s", title="t")], run_id="r")
    for _ in range(2):
        with pytest.raises(RunStoppedError):
            agent.execute_run(run, ex)
        agent = CheckpointedAgent(CheckpointStore(url, max_decoded_bytes=1_000_000))
        got = agent.resume_run("r")
        assert got is not None
        run = got
    assert paid == [1]
    (call,) = CheckpointStore(url).get_tool_call_history("r", "s")
    assert call.phase == UNKEPT and "RecordTooLargeError" in (call.error or "")
    assert call.arguments == {ARGUMENTS_NOT_KEPT: "the arguments were too large for the store to keep"}


def papers_child(url: str, side: str, kill_at: int) -> None:
    """Ten steps, each with a paid call counted in `side`, every 5 steps committed; SIGKILL
    itself once step `kill_at` made its call (0: never), as a crash before the step returns."""
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(5))
    run = agent.resume_run("papers") or agent.start_run(
        "g", [Step(id=f"p{i:02d}", title=str(i)) for i in range(1, 11)], run_id="papers")

    def paid(paper: str) -> str:
        with open(side, "a") as f:
            f.write(paper + "\n")
        return f"summary of {paper}"

    def ex(step: Step, prior: list[ToolCall]) -> StepResult:
        out = agent.tools().run("extract", {"paper": step.id}, paid)
        if int(step.id[1:]) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return StepResult(out, tokens=100, cost_usd=0.25)

    agent.execute_run(run, ex)
    agent.store.close()


def test_a_crash_under_every_n_does_not_count_a_deferred_steps_spend_twice(tmp_path: Path) -> None:
    """every_n_steps(5): step 6 finishes (100 tokens, $0.25) and waits for the 5th; step 7's
    first tool call commits its RUNNING mark, with the run's totals, which already held step
    6's spend, but not step 6. SIGKILL; the resume runs step 6 again and adds its spend again:
    the run said 1,100 tokens and $2.75 for ten steps of 100 tokens and $0.25. The commit now
    carries the finished steps its totals count."""
    url, side = str(tmp_path / "s"), str(tmp_path / "paid")
    cmd = [sys.executable, __file__, "child", url, side]
    first = subprocess.run([*cmd, "7"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    crashed = CheckpointStore(url).load_run("papers")
    assert crashed is not None
    done = [s for s in crashed.steps.values() if s.status.value == "completed"]
    assert crashed.total_tokens == sum(s.tokens for s in done)  # what a load says is consistent
    second = subprocess.run([*cmd, "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-2000:]
    run = CheckpointStore(url).load_run("papers")
    assert run is not None and run.status == "completed"
    assert sum(s.tokens for s in run.steps.values()) == 1000
    assert (run.total_tokens, round(run.total_cost_usd, 6)) == (1000, 2.5)
    papers = Path(side).read_text().split()
    assert sorted(papers) == sorted(set(papers)) and len(papers) == 10  # no call paid twice


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    papers_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))


def test_a_step_output_with_a_lone_surrogate_stops_the_run_like_a_nan_cost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A result text with a lone surrogate (text decoded with errors='surrogateescape') was
    marked done, then refused at commit: a bare UnstorableValueError naming 'Step', a second
    refusal logged with its traceback while 'stopping', and the stored run still 'running'.
    Now it is refused before the step is touched and the run stops there, as for a NaN cost."""
    url = str(tmp_path / "s")
    agent = CheckpointedAgent(CheckpointStore(url))
    run = agent.start_run("g", [Step(id="s", title="t")], run_id="r")
    with pytest.raises(RunStoppedError, match=r"result: .*surrogate"):
        agent.execute_run(run, lambda step, prior: "caf\udce9")
    assert not [r for r in caplog.records if "could not save" in r.getMessage()]
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.steps["s"].status.value == "pending" and stored.metadata["stopped"]["step_id"] == "s"
    again = CheckpointedAgent(CheckpointStore(url))
    resumed = again.resume_run("r")
    assert resumed is not None
    assert again.execute_run(resumed, lambda step, prior: "café").steps["s"].result == "café"


@pytest.mark.parametrize("out, why", [
    (StepResult("x", cost_usd=float("nan")), "cost_usd"),
    ("caf\udce9", "result"),
])
def test_a_worker_fails_a_step_whose_output_the_store_refuses_and_goes_on(
        tmp_path: Path, out: Any, why: str) -> None:
    """A Worker let the refusal out of `work()`: the worker died, the step stayed PENDING, and
    the next worker to take it ran the executor again and died the same way, one after another.
    Now the step fails at once (a retry gives the same output), naming the field, and the
    worker finishes the rest of the run."""
    from ckptfs import AgentRun, Worker

    store = CheckpointStore(str(tmp_path / "s"))
    run = AgentRun(run_id="w", goal="g")
    for sid in ("bad", "good"):
        run.add_step(Step(id=sid, title=sid))
    store.save_run(run)
    ran: list[str] = []

    def ex(step: Step, prior: list[ToolCall]) -> Any:
        ran.append(step.id)
        return out if step.id == "bad" else "fine"

    report = Worker(store, lease_ttl=5, poll_interval=0.05).work("w", ex, idle_timeout=10)
    assert report.failed == ["bad"] and report.completed == ["good"]
    assert sorted(ran) == ["bad", "good"]
    final = CheckpointStore(str(tmp_path / "s")).load_run("w")
    assert final is not None and final.status == "completed_with_errors"
    assert final.steps["bad"].status.value == "failed" and why in (final.steps["bad"].error or "")


def test_a_worker_fails_a_step_whose_commit_the_store_refuses_and_goes_on(tmp_path: Path) -> None:
    """An executor that leaves NaN in `step.metadata` returns a fine output, but the commit of
    the finished step is refused: the refusal left `work()`, the worker died with the step
    RUNNING under its lease, and the next worker to take it ran the executor again and died the
    same way. Now the step fails at once, naming what was refused, with the metadata it had
    before the executor ran, and the worker finishes the rest of the run."""
    from ckptfs import AgentRun, Worker

    store = CheckpointStore(str(tmp_path / "s"))
    run = AgentRun(run_id="w", goal="g")
    for sid in ("bad", "good"):
        run.add_step(Step(id=sid, title=sid, metadata={"source": sid}))
    store.save_run(run)
    ran: list[str] = []

    def ex(step: Step, prior: list[ToolCall]) -> str:
        ran.append(step.id)
        if step.id == "bad":
            step.metadata["score"] = float("nan")
        return "fine"

    report = Worker(store, lease_ttl=5, poll_interval=0.05).work("w", ex, idle_timeout=10)
    assert report.failed == ["bad"] and report.completed == ["good"]
    assert sorted(ran) == ["bad", "good"]
    final = CheckpointStore(str(tmp_path / "s")).load_run("w")
    assert final is not None and final.status == "completed_with_errors"
    bad = final.steps["bad"]
    assert bad.status.value == "failed" and "score" in (bad.error or ""), bad.error
    assert bad.metadata.get("source") == "bad" and "score" not in bad.metadata
    assert final.steps["good"].result == "fine"
