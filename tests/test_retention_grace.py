"""Retention's grace for superseded snapshots (CompactionPolicy.superseded_grace).

A writer with keep_last=1 and a snapshot every commit retired, at each snapshot, the one
before it and every record up to the new one: a reader that had just listed the run found its
files gone and had to list and load again (on a starved machine 1 load in 100 ran out of its 25
reloads). Now a snapshot stays, with what a load from it reads, until the next one is
`superseded_grace` seconds old; the retention after that removes it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.cli import main as cli_main
from ckptfs.format.keys import parse_run_key
from ckptfs.maintenance.prune import prune

# A snapshot at every commit, keep_last=1, no fences: retention as aggressive as it gets.
AGGRESSIVE = CompactionPolicy(fanout=2, max_plan=2, snapshot_ratio=0.0001, min_snapshot_bytes=0,
                              keep_last=1, fence_seconds=0.0, background=False)


def _policy(grace: float, **kw: Any) -> CompactionPolicy:
    return dataclasses.replace(AGGRESSIVE, superseded_grace=grace, **kw)


def _writer(url: str, policy: CompactionPolicy, opts: dict[str, Any] | None = None,
            steps: int = 60) -> tuple[CheckpointStore, AgentRun]:
    store = CheckpointStore(url, opts, policy=policy)
    run = AgentRun(run_id="live", goal="grace")
    for i in range(steps):
        run.add_step(Step(id=f"s{i:03d}", title=f"step {i}"))
    store.save_run(run)
    return store, run


def _advance(store: CheckpointStore, run: AgentRun, n: int = 1) -> None:
    todo = [s for s in run.steps.values() if s.status != StepStatus.COMPLETED][:n]
    for step in todo:
        step.status, step.result = StepStatus.COMPLETED, f"done {step.id}"
        store.commit(run, [step])


def _files(store: CheckpointStore, kind: str) -> list[int]:
    return sorted(rf.version for key in store.storage.list("runs/live/")
                  if (rf := parse_run_key(key)) is not None and rf.kind == kind)


def _wait_past(start: float, seconds: float) -> None:
    """Let `seconds` of monotonic time pass since `start` (the grace is the condition itself)."""
    while time.monotonic() - start <= seconds:
        time.sleep(0.02)


def test_policy_validates_the_grace() -> None:
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="superseded_grace"):
            CompactionPolicy(superseded_grace=bad)
    assert CompactionPolicy().superseded_grace > 0
    assert CompactionPolicy(superseded_grace=0).superseded_grace == 0


def test_superseded_snapshot_outlives_the_next_retention_then_goes(tmp_path: Path) -> None:
    """The snapshot a reader may have listed is on disk after the writer's next retention,
    with the records after it; once the grace has passed, the retention after that removes it."""
    grace = 1.0
    writer, run = _writer(str(tmp_path), _policy(grace))
    _advance(writer, run)
    superseded = _files(writer, "snap")[-1]
    _advance(writer, run)  # a newer snapshot, then retention (keep_last=1)
    newer = time.monotonic()
    snaps = _files(writer, "snap")
    assert snaps[-2:] == [superseded, snaps[-1]] and snaps[-1] > superseded, snaps
    # what a load from the superseded snapshot reads is there too
    assert set(range(superseded + 1, snaps[-1] + 1)) <= set(_files(writer, "log"))
    _wait_past(newer, grace)
    _advance(writer, run)
    snaps_after = _files(writer, "snap")
    assert superseded not in snaps_after and snaps_after[0] == snaps[-1], snaps_after
    assert min(_files(writer, "log")) > snaps[-1]
    assert writer.load_run("live") == run


def test_files_stay_bounded_by_what_the_grace_covers(tmp_path: Path) -> None:
    """Snapshots kept for the grace go at the first retention after it: this process's, and
    those earlier processes left (their times come from the store, not from when this process
    met them), so a run's files stay bounded by what the grace covers."""
    writer, run = _writer(str(tmp_path), _policy(30.0))
    _advance(writer, run, 6)
    writer.close()
    for _process in range(3):  # short-lived writers: each loads, snapshots twice, exits
        store = CheckpointStore(str(tmp_path), policy=_policy(30.0))
        again = store.load_run("live")
        assert again is not None
        _advance(store, again, 2)
        store.close()
    assert len(_files(writer, "snap")) >= 12  # all superseded within the grace: all kept
    grace = 0.3
    _wait_past(time.monotonic(), grace)
    store = CheckpointStore(str(tmp_path), policy=_policy(grace))
    again = store.load_run("live")  # the snapshot it loads counts from now in this process
    assert again is not None
    _advance(store, again)
    snaps = _files(store, "snap")
    assert len(snaps) == 2, snaps  # the newest, and the one superseded just now
    assert min(_files(store, "log")) > snaps[0] and len(_files(store, "log")) <= 2
    assert not _files(store, "delta") or min(_files(store, "delta")) > snaps[0]
    assert store.load_run("live") == again


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_slow_reader_still_loads_what_it_listed(backend: str, tmp_path: Path,
                                                request: pytest.FixtureRequest) -> None:
    """A reader lists the run, then stalls while the writer commits and snapshots (retention
    each time) five times; it then reads what it listed. Before: files it listed were gone
    (FileNotFoundError, then a reload); now none is, and the first load lands."""
    if backend == "s3":
        url, opts = request.getfixturevalue("s3_url"), request.getfixturevalue("s3_opts")
    else:
        url, opts = str(tmp_path / "store"), {}
    writer, run = _writer(url, _policy(30.0), opts)
    _advance(writer, run, 3)
    reader = CheckpointStore(url, opts)
    inner_list, inner_get = reader.storage.list, reader.storage.get
    seen = {"listings": 0, "vanished": 0}

    stalled = threading.Event()

    def stalling_list(prefix: str = "", start_after: str | None = None) -> list[str]:
        if prefix.startswith("runs/live/snap"):
            # the load's early read of the newest snapshot: after the stall, so the snapshot
            # the load starts from is read after retention ran, on every backend
            stalled.wait(30)
            return inner_list(prefix, start_after)
        keys = inner_list(prefix, start_after)
        if prefix == "runs/live/":
            seen["listings"] += 1
            if seen["listings"] == 1:
                _advance(writer, run, 5)  # five snapshots and retentions while the reader stalls
                stalled.set()
        return keys

    def counting_get(key: str) -> bytes:
        try:
            return inner_get(key)
        except FileNotFoundError:
            seen["vanished"] += 1
            raise

    listed = _files(writer, "snap")[-1]
    reader.storage.list = stalling_list  # type: ignore[method-assign]
    reader.storage.get = counting_get  # type: ignore[method-assign]
    got = reader.load_run("live")
    assert seen == {"listings": 1, "vanished": 0}
    assert got is not None and reader.last_load is not None
    assert reader.last_load.snapshot_version == listed  # the load it started, not a reload
    assert _files(writer, "snap")[-1] >= listed + 5


def test_prune_keeps_a_snapshot_superseded_within_the_grace(tmp_path: Path) -> None:
    """The listing way (`apply_retention`, `ckptfs prune`) asks the store when the snapshots
    above the oldest kept one were written (a few HEADs at most) and keeps the one superseded
    within the grace, with what a load from it reads."""
    url = str(tmp_path)
    writer, run = _writer(url, _policy(0.0, keep_last=0))  # no automatic retention
    _advance(writer, run, 4)
    snaps = _files(writer, "snap")
    assert len(snaps) >= 5
    now = time.time()
    for age, version in zip((400, 300, 200, 100), snaps[-5:-1], strict=True):
        path = tmp_path / "runs" / "live" / "snap" / f"{version:012d}.ckpt"
        os.utime(path, (now - age, now - age))  # superseded long ago: all but the last two
    store = CheckpointStore(url, policy=_policy(60.0))
    calls: list[str] = []
    inner_modified = store.storage.modified

    def counting_modified(key: str) -> float:
        calls.append(key)
        return inner_modified(key)

    store.storage.modified = counting_modified  # type: ignore[method-assign]
    dry = store.apply_retention("live", 1, dry_run=True)
    assert dry.kept_snapshots == [snaps[-1]] and len(calls) == 2, calls
    assert not any(f"snap/{v:012d}" in k for v in snaps[-2:] for k in dry.deleted)
    # `ckptfs prune` builds its store with the default policy: the grace holds there too
    report = prune(url, 1, run_id="live")
    assert sorted(report.deleted) == sorted(dry.deleted) and report.deleted
    assert _files(writer, "snap") == snaps[-2:]
    assert min(_files(writer, "log")) == snaps[-2] + 1
    assert set(range(snaps[-2] + 1, snaps[-1] + 1)) <= set(_files(writer, "log"))
    # once the newest is old too, the superseded one goes
    newest = tmp_path / "runs" / "live" / "snap" / f"{snaps[-1]:012d}.ckpt"
    os.utime(newest, (now - 90, now - 90))
    assert store.apply_retention("live", 1).kept_snapshots == [snaps[-1]]
    assert _files(writer, "snap") == [snaps[-1]]
    assert CheckpointStore(url).load_run("live") == run


def test_cli_prune_keeps_graced_snapshots_and_says_so_until_told_not_to(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ckptfs prune --keep-last 1` right after a writer keeps the snapshots it superseded
    within the grace, and says why (text and --json), so a prune leaving more than it was told to
    keep is explained; `--superseded-grace 0` removes them; the store then verifies clean."""
    url = str(tmp_path / "store")
    writer, run = _writer(url, _policy(0.0, keep_last=0))  # no automatic retention: prune's work
    _advance(writer, run, 4)
    writer.close()
    snaps = _files(writer, "snap")
    assert len(snaps) >= 5
    assert cli_main(["prune", url, "--keep-last", "1"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"{len(snaps) - 1} superseded snapshot(s) kept for the 60 s grace" in said, said
    assert _files(writer, "snap") == snaps
    assert cli_main(["prune", url, "--keep-last", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["superseded_grace_seconds"] == 60.0
    [result] = doc["runs"]
    assert result["kept_snapshots"] == [snaps[-1]] and result["graced"] == snaps[-2::-1]
    assert not [k for k in result["deleted"] if "/snap/" in k], result["deleted"]
    assert cli_main(["prune", url, "--keep-last", "1", "--superseded-grace", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["superseded_grace_seconds"] == 0.0
    [result] = doc["runs"]
    assert result["kept_snapshots"] == [snaps[-1]] and result["graced"] == []
    assert _files(writer, "snap") == [snaps[-1]]
    assert all(v > snaps[-1] for v in _files(writer, "log") + _files(writer, "delta"))
    assert cli_main(["verify", url]) == 0, capsys.readouterr()
    capsys.readouterr()
    store = CheckpointStore(url)
    assert store.load_run("live") == run
    assert store.last_load is not None and store.last_load.snapshot_version == snaps[-1]


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "5300w", ""])
def test_cli_superseded_grace_usage_errors(bad: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A negative, NaN, infinite, over-100-years or empty grace is bad usage (exit 2) naming the
    option, before anything is removed; mirror refuses one without --keep-last (it would be moot)."""
    url = str(tmp_path / "store")
    writer, run = _writer(url, _policy(0.0, keep_last=0))
    _advance(writer, run, 2)
    writer.close()
    before = {p: p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert cli_main(["prune", url, "--keep-last", "1", "--superseded-grace", bad]) == 2
    assert "--superseded-grace" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()} == before
    mirror = str(tmp_path / "mirror")
    assert cli_main(["mirror", url, mirror, "--once", "--keep-last", "1",
                     "--superseded-grace", bad]) == 2
    assert "--superseded-grace" in capsys.readouterr().err
    assert cli_main(["mirror", url, mirror, "--once", "--superseded-grace", "0"]) == 2
    assert "--superseded-grace needs --keep-last" in capsys.readouterr().err
    assert not (tmp_path / "mirror").exists()


def test_cli_mirror_passes_the_grace_to_the_mirror_side_retention(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every file a mirror pass copies is seconds old: with --keep-last 1 the mirror keeps the
    snapshot the pass superseded, for the mirror's readers; --superseded-grace 0 removes it."""
    url, mirror = str(tmp_path / "store"), str(tmp_path / "mirror")
    writer, run = _writer(url, _policy(0.0, keep_last=0))
    args = ["mirror", url, mirror, "--once", "--latest", "--keep-last", "1", "--no-progress"]
    for _pass in range(2):  # a snapshot at every commit: each pass copies a newer one
        _advance(writer, run)
        assert cli_main(args) == 0
    on_mirror = CheckpointStore(mirror)
    kept = on_mirror.storage.list("runs/live/snap/")
    assert len(kept) == 2, kept  # the newest and the one the second pass superseded
    _advance(writer, run)
    assert cli_main([*args, "--superseded-grace", "0"]) == 0
    capsys.readouterr()
    newest = _files(writer, "snap")[-1]
    assert on_mirror.storage.list("runs/live/snap/") == [f"runs/live/snap/{newest:012d}.ckpt"]
    assert on_mirror.load_run("live") == run
