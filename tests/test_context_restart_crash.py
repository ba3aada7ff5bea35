"""A restart with context after a crash: nothing paid again, and one restart however often asked.

Found by a hostile review of the seed API (2026-12-07), on disk and S3:

* `resume_run(id, "context")` built the new run's steps without their tool logs, so the new
  run paid again for every call the crashed step had made (CHARGED twice), and an irreversible
  call's open intent never reached the guard (EMAILED twice). The article: the new execution
  "treats the prior results as given facts rather than re-executing them".
* A context restart SIGKILLed between its two writes (the new run saved, the old one not yet
  marked superseded) made a second new run when called again: both were listed resumable,
  both holding the remaining work.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from ckptfs import CheckpointedAgent, CheckpointStore, Done, Step, StepStatus, ToolCall

ROOT = str(Path(__file__).resolve().parents[1])

CRASH_IN_A_STEP = textwrap.dedent("""
    import json, os, signal, sys
    from ckptfs import CheckpointedAgent, CheckpointStore, Step
    url, opts, side = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    agent = CheckpointedAgent(CheckpointStore(url, opts))
    run = agent.start_run("send invoices", [
        Step(id=f"inv-{i}", title=f"invoice {i}", dependencies=[f"inv-{i-1}"] if i else [])
        for i in range(3)], run_id="invoices")

    def note(line):
        with open(side, "a") as f:
            f.write(line + "\\n")

    def charge(customer):
        note(f"CHARGED {customer}")
        return {"charged": customer}

    def send_email(to):
        note(f"EMAILED {to}")
        os.kill(os.getpid(), signal.SIGKILL)  # between the side effect and its record

    def executor(step, prior):
        tools = agent.tools()
        tools.run("charge", {"customer": step.id}, charge)  # logged: durable
        if step.id == "inv-1":
            tools.run("email", {"to": step.id}, send_email, irreversible=True)  # intent first
        return "ok"

    agent.execute_run(run, executor)
""")


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_context_restart_replays_what_the_crashed_step_paid_for(
        shared_url: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, opts = shared_url
    side = tmp_path / "side.txt"
    side.touch()
    died = _child(CRASH_IN_A_STEP, url, json.dumps(opts), str(side))
    assert died.returncode == -9, died.stderr
    with CheckpointStore(url, opts) as store:
        logged = [c.tool_name for c in store.get_tool_call_history("invoices", "inv-1")]
        assert logged == ["charge", "email"], logged  # the charge's result, the email's intent
        agent = CheckpointedAgent(store)
        guarded: list[str] = []

        def guard(intent: ToolCall) -> object:
            guarded.append(intent.tool_name)
            return Done(None) if f"EMAILED {intent.arguments['to']}" in side.read_text() else False

        def charge(customer: str) -> dict[str, str]:
            with side.open("a") as f:
                f.write(f"CHARGED {customer}\n")
            return {"charged": customer}

        def send_email(to: str) -> str:
            with side.open("a") as f:
                f.write(f"EMAILED {to}\n")
            return "sent"

        new = agent.resume_run("invoices", "context")
        assert new is not None and sorted(new.steps) == ["inv-1", "inv-2"]

        def executor(step: Step, prior: list[ToolCall]) -> str:
            tools = agent.tools()
            tools.run("charge", {"customer": step.id}, charge)
            if step.id == "inv-1":
                tools.run("email", {"to": step.id}, send_email, irreversible=True, guard=guard)
            return "ok"

        assert agent.execute_run(new, executor).status == "completed"
    effects = collections.Counter(side.read_text().splitlines())
    assert effects == {"CHARGED inv-0": 1, "CHARGED inv-1": 1, "EMAILED inv-1": 1,
                       "CHARGED inv-2": 1}, effects  # inv-1 charged and emailed twice before
    assert guarded == ["email"]  # the open intent went to the guard (never consulted before)


KILLED_RESTART = textwrap.dedent("""
    import json, os, signal, sys
    from ckptfs import CheckpointedAgent, CheckpointStore
    url, opts = sys.argv[1], json.loads(sys.argv[2])
    store = CheckpointStore(url, opts)
    real = store.commit

    def commit(run, steps=None):  # the old run's "superseded" commit comes right after the new save
        if run.run_id == "papers" and run.status == "superseded":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(run, steps)

    store.commit = commit
    CheckpointedAgent(store).resume_run("papers", "context")
""")


def test_a_context_restart_killed_midway_and_asked_again_makes_one_run(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = shared_url
    with CheckpointStore(url, opts) as store:
        agent = CheckpointedAgent(store)
        run = agent.start_run("summarise", [Step(id=f"p{i}", title="t") for i in range(4)],
                              run_id="papers")
        run.steps["p0"].status, run.steps["p0"].result = StepStatus.COMPLETED, "done"
        store.save_run(run)
    died = _child(KILLED_RESTART, url, json.dumps(opts))
    assert died.returncode == -9, died.stderr
    with CheckpointStore(url, opts) as store:
        new = CheckpointedAgent(store).resume_run("papers", "context")  # the operator retries
        assert new is not None and sorted(new.steps) == ["p1", "p2", "p3"]
        resumable = [r["run_id"] for r in store.find_resumable_runs()]
        assert resumable == [new.run_id], resumable  # was two new runs, both resumable
        assert sorted(store.list_runs()) == sorted(["papers", new.run_id])
        old = store.load_run("papers")
        assert old is not None and old.status == "superseded"
        assert old.metadata["superseded_by"] == new.run_id
