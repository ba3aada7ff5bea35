"""The compactor of short-lived writers on S3, over real HTTP against the embedded moto server.

A writer that lives less than `fence_seconds` retires the journal records earlier processes
left once the store says they were written that long ago; records younger than that by the
store's clock stay as fences, whatever this machine's clock says. A writer that exits without
close() has its pending compaction done at exit. CompactionPolicy refuses bools and
non-finite values in every field, naming it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
import types
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.errors import ConfigError
from ckptfs.format.keys import parse_run_key
from ckptfs.maintenance.verify import verify
from ckptfs.storage.registry import open_storage

ROOT = str(Path(__file__).resolve().parents[1])
# S3 times are whole seconds: a margin over their rounding, and room for a writer on a loaded
# machine to do its load, four commits and close well within it (its own records must stay)
FENCE = 8.0
LONG_FENCE = 600.0  # for writers whose records must all stay fences however slow the machine


def _policy(fence: float = FENCE) -> CompactionPolicy:
    # a snapshot every few records (max_plan), only the newest kept, no superseded grace: every
    # journal record below it is waiting for its fence time alone
    return CompactionPolicy(fanout=2, max_plan=2, min_snapshot_bytes=1, keep_last=1,
                            fence_seconds=fence, superseded_grace=0.0, background=False)


def _writer(url: str, opts: dict[str, Any], steps: int, done: list[str], fence: float = FENCE) -> None:
    """One short-lived writer: load (or start) run "one", complete `steps` new steps one commit
    each, close; far less than fence_seconds from its first snapshot to its exit."""
    store = CheckpointStore(url, opts, policy=_policy(fence))
    run = store.load_run("one")
    if run is None:
        run = AgentRun(run_id="one", goal="outlive the writers")
        store.save_run(run)
    for _ in range(steps):
        sid = f"s{len(done)}"
        run.add_step(Step(id=sid, title=sid))
        step = run.steps[sid]
        step.status, step.result = StepStatus.COMPLETED, f"result of {sid}"
        store.commit(run, [step])
        done.append(sid)
    store.close()


def _versions(url: str, opts: dict[str, Any], kind: str) -> list[int]:
    """The versions of run "one"'s files of `kind` ("log", "snap", "delta": where one ends)."""
    listed = (parse_run_key(k) for k in open_storage(url, opts).list("runs/one/"))
    return sorted(rf.version for rf in listed if rf is not None and rf.kind == kind)


def _wait_past_fence(s3: EmbeddedS3, url: str, opts: dict[str, Any]) -> None:
    """Until the store's clock is more than FENCE + 1 s past the newest journal record's time
    (read from a probe object the server dates, under another prefix)."""
    storage = open_storage(url, opts)
    newest = storage.modified(f"runs/one/log/{_versions(url, opts, 'log')[-1]:012d}.ckpt")
    probe = open_storage(s3.url("clock-probe"), opts)
    while True:
        probe.put("now", b"x")
        if probe.modified("now") - newest > FENCE + 1:
            return
        time.sleep(0.25)


def _assert_whole(url: str, opts: dict[str, Any], done: list[str]) -> None:
    loaded = CheckpointStore(url, opts).load_run("one")
    assert loaded is not None and sorted(loaded.steps) == sorted(done)
    assert all(s.status == StepStatus.COMPLETED and s.result == f"result of {s.id}"
               for s in loaded.steps.values())
    report = verify(url, storage_options=opts, level="data")
    assert report.ok, [f"{f.code}: {f.message}" for f in report.problems]


def test_short_lived_writers_retire_records_the_store_says_are_past_their_fence(
        s3: EmbeddedS3, s3_url: str) -> None:
    """Each writer adopts the snapshots it lists as known only from its own start, and exits
    before fence_seconds: without the store's times no writer ever removed a journal record."""
    opts, done = s3.storage_options, []
    for _ in range(4):  # (with FENCE, 3 s then, four writers once took longer than that)
        _writer(s3_url, opts, 4, done, fence=LONG_FENCE)
    before = _versions(s3_url, opts, "log")
    assert before == list(range(1, len(done) + 2))  # all young so far: every record a fence
    _wait_past_fence(s3, s3_url, opts)
    _writer(s3_url, opts, 4, done)
    logs, snaps = _versions(s3_url, opts, "log"), _versions(s3_url, opts, "snap")
    assert len(snaps) == 1 and snaps[0] > before[-1]
    assert logs == [v for v in range(before[-1] + 1, len(done) + 2)], logs  # the last one's stay
    _assert_whole(s3_url, opts, done)


def test_records_younger_than_the_fence_by_the_store_clock_stay(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose clock runs an hour ahead of the store's: records the store wrote less
    than fence_seconds ago are still fences (a stale writer's PUT must keep meeting them); the
    ones past it by the store's own clock go."""
    opts, done = s3.storage_options, []
    _writer(s3_url, opts, 4, done)
    old = _versions(s3_url, opts, "log")
    _wait_past_fence(s3, s3_url, opts)
    _writer(s3_url, opts, 4, done)
    young = [v for v in _versions(s3_url, opts, "log") if v > old[-1]]
    ahead = types.SimpleNamespace(time=lambda: time.time() + 3600, monotonic=time.monotonic)
    monkeypatch.setattr("ckptfs.store.compactor.time", ahead)  # retention's reading of now
    monkeypatch.setattr("ckptfs.store.retention.time", ahead)
    # a fence of ten minutes: the young records are an hour old by this clock, and well under
    # ten minutes by the store's however slow a loaded machine is (with a 3 s fence, a full run
    # once took longer than that between the two writers, and the young ones rightly went)
    _writer(s3_url, opts, 4, done, fence=LONG_FENCE)
    monkeypatch.undo()
    logs = _versions(s3_url, opts, "log")
    assert not set(old) & set(logs), logs  # past the fence by the store's clock: gone
    assert set(young) <= set(logs), (young, logs)  # an hour old by ours, seconds by the store's
    _assert_whole(s3_url, opts, done)


EXIT_CHILD = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
    from ckptfs.store.compactor import Compactor
    # the thread takes nothing before it is flushed: everything is pending when the process exits
    Compactor.WAKE_SECONDS, Compactor.BATCH = 600.0, 10**9
    url, opts = sys.argv[1], json.loads(sys.argv[2])
    store = CheckpointStore(url, opts, policy=CompactionPolicy(fanout=4, max_plan=8,
                                                               min_snapshot_bytes=4096))
    run = AgentRun(run_id="one", goal="exit without close")
    store.save_run(run)
    for i in range(40):
        run.add_step(Step(id=f"s{i}", title=f"s{i}"))
        step = run.steps[f"s{i}"]
        step.status, step.result = StepStatus.COMPLETED, "r" * 2000
        store.commit(run, [step])
    print("committed", flush=True)
""")

LOAD_CHILD = textwrap.dedent("""
    import json, sys
    from ckptfs import CheckpointStore
    run = CheckpointStore(sys.argv[1], json.loads(sys.argv[2])).load_run("one")
    print(run.completed_count if run is not None else -1)
""")


def test_compaction_pending_at_exit_is_done_before_the_thread_pools_stop(
        s3: EmbeddedS3, s3_url: str) -> None:
    """A process that exits without close(): its compaction was flushed from an atexit handler,
    after s3fs's own had closed the client, and every request needing a new connection failed
    ('cannot schedule new futures after shutdown', once per pending record)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    args = [s3_url, json.dumps(s3.storage_options)]
    got = subprocess.run([sys.executable, "-c", EXIT_CHILD, *args], env=env,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stdout.strip() == "committed", got.stderr
    assert "cannot schedule new futures" not in got.stderr, got.stderr[-3000:]
    assert "compactor" not in got.stderr, got.stderr[-3000:]
    assert _versions(s3_url, s3.storage_options, "snap"), "no snapshot: the exit flush did nothing"
    assert _versions(s3_url, s3.storage_options, "delta")
    fresh = subprocess.run([sys.executable, "-c", LOAD_CHILD, *args], env=env,
                           capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0 and fresh.stdout.strip() == "40", fresh.stderr


@pytest.mark.parametrize(("field", "value", "error", "words"), [
    ("fence_seconds", True, TypeError, "fence_seconds must be a number of seconds"),
    ("fence_seconds", math.nan, ConfigError, "fence_seconds must be finite and >= 0"),
    ("fence_seconds", math.inf, ConfigError, "fence_seconds must be finite and >= 0"),
    ("fence_seconds", -1, ConfigError, "fence_seconds must be finite and >= 0"),
    pytest.param("fence_seconds", 10**400, ConfigError, "fence_seconds must be finite and >= 0",
                 id="fence_seconds-10**400"),
    ("fence_seconds", "600", TypeError, "fence_seconds must be a number of seconds"),
    ("snapshot_ratio", True, TypeError, "snapshot_ratio must be a number"),
    ("snapshot_ratio", math.inf, ConfigError, "snapshot_ratio must be finite and > 0"),
    ("snapshot_ratio", math.nan, ConfigError, "snapshot_ratio must be finite and > 0"),
    ("snapshot_ratio", 0, ConfigError, "snapshot_ratio must be finite and > 0"),
    ("fanout", True, TypeError, "fanout must be a whole number"),
    ("fanout", 16.0, TypeError, "fanout must be a whole number"),
    ("fanout", 1, ConfigError, "fanout must be >= 2"),
    ("max_plan", False, TypeError, "max_plan must be a whole number"),
    ("max_plan", math.inf, TypeError, "max_plan must be a whole number"),
    ("keep_last", True, TypeError, "keep_last must be a whole number"),
    pytest.param("keep_last", -(10**400), ConfigError,
                 "keep_last must be >= 0, got an int of about 401 digits", id="keep_last--10**400"),
    ("min_snapshot_bytes", True, TypeError, "min_snapshot_bytes must be a whole number"),
    ("min_snapshot_bytes", math.nan, TypeError, "min_snapshot_bytes must be a whole number"),
    ("min_snapshot_bytes", -1, ConfigError, "min_snapshot_bytes must be >= 0"),
])
def test_policy_refuses_bools_and_non_finite_values_naming_the_field(
        field: str, value: object, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=f"^CompactionPolicy: {words}"):
        CompactionPolicy(**{field: value})  # type: ignore[arg-type]


def test_policy_keeps_the_checked_numbers() -> None:
    policy = CompactionPolicy(fence_seconds=Fraction(1, 2), snapshot_ratio=2,  # type: ignore[arg-type]
                              min_snapshot_bytes=0, keep_last=0)
    assert (policy.fence_seconds, type(policy.fence_seconds)) == (0.5, float)
    assert (policy.snapshot_ratio, type(policy.snapshot_ratio)) == (2.0, float)
    assert CompactionPolicy(fence_seconds=0).fence_seconds == 0.0  # no fences: still allowed
