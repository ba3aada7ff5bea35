"""Hostile review: what readers see while a writer with an aggressive retention policy is live.

A writer with keep_last=1 and a snapshot every commit deletes, at each snapshot, the previous
snapshot and every journal record up to the new one: a reader that listed the run a moment
before finds its files gone. A reader must never turn that into an error (load_run's
FileNotFoundError, `ckptfs verify` exit 1 on a healthy store). The first two tests turn the
superseded grace off to race retention directly; the live writer keeps the default grace.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.maintenance.verify import verify

AGGRESSIVE = CompactionPolicy(fanout=2, max_plan=2, snapshot_ratio=0.0001, min_snapshot_bytes=0,
                              keep_last=1, fence_seconds=0.0, superseded_grace=0.0,
                              background=False)


def _writer(url: str, steps: int = 40) -> tuple[CheckpointStore, AgentRun]:
    store = CheckpointStore(url, policy=AGGRESSIVE)
    run = AgentRun(run_id="live", goal="race retention")
    for i in range(steps):
        run.add_step(Step(id=f"s{i:03d}", title=f"step {i}"))
    store.save_run(run)
    return store, run


def _advance(store: CheckpointStore, run: AgentRun, n: int) -> None:
    todo = [s for s in run.steps.values() if s.status != StepStatus.COMPLETED][:n]
    for step in todo:
        step.status, step.result = StepStatus.COMPLETED, f"done {step.id}"
        store.commit(run, [step])


def test_load_survives_retention_racing_several_attempts_in_a_row(tmp_path: Path) -> None:
    """Each of a reader's first `races` reads of a run file meets the writer's retention: the
    writer commits (snapshot, then retention) just before the read, so the file listed is
    gone. Before: three attempts, then FileNotFoundError out of load_run (36 of 200 loads
    beside a live writer in another process). After: the load is made again until it lands."""
    url = str(tmp_path / "store")
    writer, run = _writer(url)
    _advance(writer, run, 3)
    reader = CheckpointStore(url)
    inner_get = reader.storage.get
    races = {"left": 6, "met": 0}

    def racing_get(key: str) -> bytes:
        if races["left"] and key.startswith("runs/live/"):
            races["left"] -= 1
            _advance(writer, run, 1)  # a snapshot at the next version: what we listed goes
            try:
                return inner_get(key)
            except FileNotFoundError:
                races["met"] += 1
                raise
        return inner_get(key)

    reader.storage.get = racing_get  # type: ignore[method-assign]
    got = reader.load_run("live")
    assert races["met"] >= 4, races  # the race really happened on several attempts
    assert got is not None
    assert reader.last_load is not None
    newest = writer.last_load.version if writer.last_load else None
    done = sum(s.status == StepStatus.COMPLETED for s in got.steps.values())
    assert done == sum(s.status == StepStatus.COMPLETED for s in run.steps.values()), (done, newest)


def test_verify_beside_retention_reports_nothing(tmp_path: Path) -> None:
    """verify lists a run, then the writer's retention removes files before they are read.
    Before: each one a "vanished" warning (exit 1 on a healthy store, 3 of 10 passes beside a
    live writer). After: the run is listed and checked again, and the report is clean."""
    url = str(tmp_path / "store")
    writer, run = _writer(url)
    _advance(writer, run, 5)
    from ckptfs.storage.registry import open_target

    storage = open_target(url, None)
    inner_get = storage.get
    state = {"raced": 0}

    def racing_get(key: str) -> bytes:
        if not state["raced"] and key.startswith("runs/live/"):
            state["raced"] += 1
            _advance(writer, run, 2)
        return inner_get(key)

    storage.get = racing_get  # type: ignore[method-assign]
    report = verify(storage)
    assert state["raced"] == 1
    assert [f for f in report.findings if f.severity != "info"] == [], report.findings[:5]
    assert report.ok


_LIVE_WRITER = textwrap.dedent("""
    import os, sys
    from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
    url, stop = sys.argv[1], sys.argv[2]
    policy = CompactionPolicy(fanout=2, max_plan=3, snapshot_ratio=0.05, min_snapshot_bytes=0,
                              keep_last=1, fence_seconds=0.0, superseded_grace=5.0)
    store = CheckpointStore(url, policy=policy)
    run = AgentRun(run_id="live", goal="race")
    for i in range(800):
        run.add_step(Step(id=f"s{i:05d}", title=f"step {i}"))
    store.save_run(run)
    print("ready", flush=True)
    for i, step in enumerate(list(run.steps.values())):
        if os.path.exists(stop):
            break
        step.status, step.result = StepStatus.COMPLETED, f"r{i}"
        store.commit(run, [step])
""")


def test_readers_beside_a_live_writer_process(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """A writer process commits small steps with keep_last=1 and a snapshot every few commits;
    this process loads the run in a bounded loop and counts outcomes: every load returns a
    state at its first attempt (no file it listed vanished), versions never go backwards, and
    verify in between finds no error."""
    caplog.set_level(logging.INFO, logger="ckptfs.store.checkpoint_store")
    url, stop = str(tmp_path / "store"), tmp_path / "stop"
    script = tmp_path / "writer.py"
    script.write_text(_LIVE_WRITER)
    proc = subprocess.Popen([sys.executable, str(script), url, str(stop)], stdout=subprocess.PIPE,
                            text=True)
    outcomes: dict[str, int] = {}
    bad: list[Any] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        last = 0
        for i in range(100):
            reader = CheckpointStore(url)
            try:
                got = reader.load_with_tool_log("live") if i % 2 else reader.load_run("live")
            except Exception as exc:  # counted, then asserted on
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                bad.append(repr(exc))
                continue
            assert got is not None and reader.last_load is not None
            v = reader.last_load.version
            key = "older" if v < last else "ok"
            outcomes[key] = outcomes.get(key, 0) + 1
            last = max(last, v)
            if i % 50 == 49:
                # Errors only: on a loaded machine a writer snapshotting every few commits
                # can outrun all of verify's re-checks of the run, leaving "vanished"
                # warnings (documented: "listed, then gone ... concurrent retention?").
                report = verify(url)
                errors = [f for f in report.findings if f.severity == "error"]
                if errors:
                    outcomes["verify-error"] = outcomes.get("verify-error", 0) + 1
                    bad.append(json.dumps([f.to_dict() for f in errors[:3]]))
    finally:
        stop.write_text("")
        proc.wait(timeout=60)
    # Retrying alone was a race this writer (a snapshot every few commits, keep_last=1, no
    # fences) could still win on a starved machine: 1 load in 100 failed after 25 reloads in a
    # full suite run on 2 cores (36 in 200 before the retries; 50 of 100 loads here met a
    # vanished file and reloaded). The writer's superseded grace (5 s, 50 times a load here:
    # the default minute kept ~800 superseded snapshots for verify to read) keeps what a load
    # listed: no load may reload, fail, return an older version, or make verify find an error.
    assert outcomes == {"ok": 100}, (outcomes, bad[:5])
    reloads = [r for r in caplog.records if "vanished during load" in r.getMessage()]
    assert not reloads, len(reloads)
