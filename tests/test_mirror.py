"""Mirror and restore: machine loss over the moto server, copy order, skips, conflicts, retention."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall
from ckptfs.format.keys import artifact_key, parse_artifact_key, parse_run_key
from ckptfs.maintenance.verify import verify
from ckptfs.replication.mirror import mirror
from ckptfs.replication.restore import restore, restore_points
from ckptfs.storage.base import Storage
from ckptfs.storage.memory import MemoryStorage
from ckptfs.storage.registry import open_storage
from tests._forwarding import Forwarding

RUN = "paper-run"
POLICY = CompactionPolicy(fanout=4, max_plan=6, min_snapshot_bytes=4096, keep_last=0, background=False)


def result_of(i: int) -> str:
    """Deterministic step output; every 4th is large enough to become an artifact."""
    return f"findings of paper {i}; " * (150 if i % 4 == 0 else 2)


def work(store: CheckpointStore, run_id: str, n: int, stop_after: int | None = None) -> AgentRun:
    """A tiny deterministic agent: one tool call per step (reused from the log on replay)."""
    run = store.load_run(run_id)
    if run is None:
        run = AgentRun(run_id=run_id, goal=f"read {n} papers", created_at=0.0, updated_at=0.0)
        for i in range(n):
            run.add_step(Step(id=f"p{i:03d}", title=f"paper {i}",
                              dependencies=[f"p{i - 1:03d}"] if i else []))
        run.updated_at = 0.0
        store.commit(run)
    done = 0
    for i in range(n):
        s = run.steps[f"p{i:03d}"]
        if s.status == StepStatus.COMPLETED:
            continue
        if not store.get_tool_call_history(run_id, s.id):
            big = "x" * 3000 if i % 3 == 0 else "ok"
            store.log_tool_call(run_id, s.id, ToolCall(id=f"t{i}", tool_name="fetch",
                                                       arguments={"i": i}, result=big, timestamp=0.0))
        s.status, s.result = StepStatus.COMPLETED, result_of(i)
        store.commit(run, [s])
        done += 1
        if stop_after is not None and done >= stop_after:
            return run
    store.mark_run_complete(run_id)
    return run


def state(store: CheckpointStore, run_id: str) -> dict[str, Any]:
    """What must survive: steps, results, tool history, status (not wall-clock fields)."""
    run = store.load_run(run_id)
    assert run is not None
    return {"status": run.status,
            "steps": {k: s.model_dump(exclude={"started_at", "completed_at"}) for k, s in run.steps.items()},
            "tools": {k: [c.model_dump() for c in store.get_tool_call_history(run_id, k)]
                      for k in run.steps}}


class Recording(Forwarding):
    """Records every write a Storage receives, in order (to check the copy order)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.writes: list[str] = []

    def put(self, key: str, data: bytes) -> str:
        self.writes.append(key)
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self.writes.append(key)
        return self.inner.put_if_absent(key, data)

    def put_stream(self, key: str, src: Any, exclusive: bool = False) -> None:
        self.writes.append(key)
        self.inner.put_stream(key, src, exclusive)


def test_machine_loss_restore_from_s3_mirror_equals_crash_free_run(
        tmp_path: Path, s3: EmbeddedS3, s3_url: str) -> None:
    opts = s3.storage_options
    reference = CheckpointStore(str(tmp_path / "reference"), policy=POLICY, artifact_threshold=1024)
    work(reference, RUN, 30)

    machine = tmp_path / "machine"
    store = CheckpointStore(str(machine), policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 30, stop_after=18)
    report = mirror(str(machine), s3_url, every_n=5, dst_options=opts)
    assert report.ok and report.runs[0].status == "mirrored"
    mirrored = report.runs[0].version
    work(store, RUN, 30, stop_after=3)  # progress after the last mirror: lost with the machine
    store.close()
    shutil.rmtree(machine)  # the machine is gone

    fresh = tmp_path / "elsewhere"
    rep = restore(s3_url, str(fresh), src_options=opts)
    assert rep.ok and rep.runs[0].status == "restored" and rep.runs[0].version == mirrored
    resumed = CheckpointStore(str(fresh), policy=POLICY, artifact_threshold=1024)
    before = resumed.load_run(RUN)
    assert before is not None and before.completed_count == 18  # lost only what was not mirrored
    work(resumed, RUN, 30)
    assert state(resumed, RUN) == state(reference, RUN)
    # big results came back as artifacts, verified by sha256 on the way
    arts = [k for k in open_storage(str(fresh)).list("artifacts")]
    assert arts and all(hashlib.sha256((fresh / k).read_bytes()).hexdigest() == parse_artifact_key(k)
                        for k in arts)


def test_copy_order_artifacts_then_snapshot_then_records_in_chain_order(
        tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    work(CheckpointStore(src, policy=POLICY, artifact_threshold=1024), RUN, 24)
    dst = Recording(open_storage(memory_url))
    report = mirror(src, dst, every_n=1)
    assert report.ok and report.copied == len(dst.writes)
    files = [parse_run_key(k) for k in dst.writes if not parse_artifact_key(k)]
    kinds = ["art" if parse_artifact_key(k) else parse_run_key(k).kind  # type: ignore[union-attr]
             for k in dst.writes]
    first_file = min(i for i, k in enumerate(kinds) if k != "art")
    assert "art" in kinds and all(k == "art" for k in kinds[:first_file])
    assert all(k != "art" for k in kinds[first_file:])
    assert kinds[first_file] == "snap" and kinds.count("snap") == 1
    versions = [f.version for f in files[1:] if f is not None]
    assert len(versions) >= 2 and versions == sorted(versions) and versions[0] > files[0].version  # type: ignore[union-attr]
    loaded = CheckpointStore(memory_url).load_run(RUN)
    assert loaded == CheckpointStore(src).load_run(RUN)


class Verifying(Recording):
    """Runs `verify` of the destination after every file written to it (what a nightly verify
    of the mirror meets when it runs in the middle of a pass)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.errors: list[tuple[str, list[str]]] = []
        self.checked = 0

    def put_if_absent(self, key: str, data: bytes) -> str:
        etag = super().put_if_absent(key, data)
        if parse_run_key(key) is not None:
            report = verify(self.inner)
            self.checked += 1
            if not report.ok:
                self.errors.append((key, [f"{f.code}: {f.message}" for f in report.problems]))
        return etag


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_verify_of_the_mirror_in_the_middle_of_a_pass_finds_nothing(
        tmp_path: Path, memory_url: str, where: str, request: pytest.FixtureRequest) -> None:
    """Found by a hostile review (2026-12-07): records were copied in parallel, so a `verify`
    of the mirror during a healthy pass found a hole ("journal record v.. missing") and exited
    1, and a pass killed there left it for good. Two passes: the first, and one after the run
    went on past a new snapshot (which the mirror then takes as its new start)."""
    src = str(tmp_path / "src")
    if where == "s3":
        s3: EmbeddedS3 = request.getfixturevalue("s3")
        inner = open_storage(request.getfixturevalue("s3_url"), s3.storage_options)
    else:
        inner = open_storage(memory_url)
    dst = Verifying(inner)
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 40, stop_after=12)
    first = mirror(src, dst, every_n=1)
    assert first.ok and first.runs[0].status == "mirrored", first.to_dict()
    middle = dst.checked
    snaps_before = {k for k in inner.list("runs/") if (rf := parse_run_key(k)) and rf.kind == "snap"}
    work(store, RUN, 40, stop_after=6)
    second = mirror(src, dst, every_n=1)
    assert second.ok and second.runs[0].status == "mirrored", second.to_dict()
    snaps_after = {k for k in inner.list("runs/") if (rf := parse_run_key(k)) and rf.kind == "snap"}
    assert snaps_after - snaps_before, "the run went on past a new snapshot"
    assert middle >= 5 and dst.checked - middle >= 5, (middle, dst.checked)
    assert dst.errors == []
    assert CheckpointStore(storage=inner).load_run(RUN) == store.load_run(RUN)
    store.close()


def test_second_pass_skips_and_every_n_waits(tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 40, stop_after=10)
    first = mirror(src, memory_url, every_n=5)
    point = first.runs[0].version
    assert first.ok and first.copied > 0 and point is not None
    again = mirror(src, memory_url, every_n=5)
    assert again.runs[0].status == "up-to-date" and again.copied == 0
    work(store, RUN, 40, stop_after=1)  # two versions more (tool call + step): fewer than 5
    assert mirror(src, memory_url, every_n=5).runs[0].status == "not-due"
    latest = mirror(src, memory_url, every_n=5, latest=True)
    assert latest.runs[0].status == "mirrored" and latest.runs[0].version == point + 2
    assert 0 < latest.copied < first.copied  # only the new records (and their artifacts)
    work(store, RUN, 40, stop_after=3)
    due = mirror(src, memory_url, every_n=5)
    assert due.runs[0].status == "mirrored" and due.runs[0].version == point + 8


def test_different_file_under_same_key_is_a_conflict_never_overwritten(
        tmp_path: Path, memory_url: str) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    work(CheckpointStore(a, policy=POLICY, artifact_threshold=1024), RUN, 6)
    work(CheckpointStore(b, policy=POLICY, artifact_threshold=1024), RUN, 6)  # same ids, other bytes
    assert mirror(a, memory_url).ok
    before = {k: open_storage(memory_url).get(k) for k in open_storage(memory_url).list("runs")}
    report = mirror(b, memory_url, latest=True)
    assert not report.ok and report.runs[0].status == "conflict"
    assert "different file" in (report.runs[0].error or "")
    after = {k: open_storage(memory_url).get(k) for k in open_storage(memory_url).list("runs")}
    assert after == before


def test_mirror_side_retention_keeps_last_n_snapshots(tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    for _ in range(6):
        work(store, RUN, 60, stop_after=8)
        # every copy is seconds old: the default grace would keep all six snapshots
        assert mirror(src, memory_url, every_n=1, keep_last=2, superseded_grace=0.0).ok
    snaps = [k for k in open_storage(memory_url).list(f"runs/{RUN}/snap")]
    assert len(snaps) == 2
    assert CheckpointStore(memory_url).load_run(RUN) == store.load_run(RUN)


def test_restore_a_given_version_and_refuse_unknown_one(tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 20)
    mirror(src, memory_url)
    points = restore_points(memory_url, RUN)
    target = points[-2]
    rep = restore(memory_url, str(tmp_path / "v"), run_id=RUN, version=target)
    assert rep.ok and rep.runs[0].version == target
    assert CheckpointStore(str(tmp_path / "v")).load_run(RUN) == store.load_run(RUN, version=target)
    bad = restore(memory_url, str(tmp_path / "w"), run_id=RUN, version=1)
    assert not bad.ok and "not restorable" in (bad.runs[0].error or "")
    assert not (tmp_path / "w" / "runs").exists()  # nothing half-written


def test_restore_refuses_a_destination_holding_the_run(tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    work(CheckpointStore(src, policy=POLICY, artifact_threshold=1024), RUN, 8)
    mirror(src, memory_url)
    rep = restore(memory_url, src)
    assert not rep.ok and "fresh URL" in (rep.runs[0].error or "")
    dst = str(tmp_path / "d")
    assert restore(memory_url, dst).ok
    again = restore(memory_url, dst)  # an interrupted or repeated restore converges
    assert again.ok and again.runs[0].status == "up-to-date"


def test_restore_falls_back_when_the_mirror_holds_a_damaged_artifact(
        tmp_path: Path, memory_url: str) -> None:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 16, stop_after=13)  # steps 0..12; step 12's result is a fresh artifact
    assert mirror(src, memory_url).ok
    mem = open_storage(memory_url)
    key = artifact_key(hashlib.sha256(result_of(12).encode()).hexdigest())
    data = bytearray(mem.get(key))
    data[len(data) // 2] ^= 0xFF  # flip real bytes in the mirror
    mem.put(key, bytes(data))
    rep = restore(memory_url, str(tmp_path / "r"))
    assert rep.ok and "incomplete" in rep.runs[0].notes[0] and key in rep.runs[0].notes[0]
    got = CheckpointStore(str(tmp_path / "r")).load_run(RUN)
    point = rep.runs[0].version
    assert got is not None and point is not None and point < rep.runs[0].source_version
    assert 0 < got.completed_count <= 12  # an earlier valid state, not the damaged newest one
    assert got == store.load_run(RUN, version=point)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path, memory_url: str) -> None:
    from ckptfs.errors import ConfigError, StorageUnavailableError

    with pytest.raises(ConfigError, match="every_n"):
        mirror(str(tmp_path), memory_url, every_n=0)
    with pytest.raises(ConfigError, match="keep_last"):
        mirror(str(tmp_path), memory_url, keep_last=0)
    with pytest.raises(ConfigError, match="--run"):
        restore(memory_url, str(tmp_path / "x"), version=3)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageUnavailableError):
        mirror(str(tmp_path / "file"), memory_url)
    assert MemoryStorage  # the memory backend is process-wide: nothing above wrote to it
    assert open_storage(memory_url).list("") == []


def test_a_long_lived_mirror_looks_again_for_artifacts_a_prune_of_the_mirror_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MirrorJob reuses one _Mirror: what it remembers as present is re-checked after
    TOUCH_AFTER, so an artifact collected on the mirror between passes is sent again."""
    import importlib

    from ckptfs.format.keys import parse_artifact_key
    from ckptfs.replication.mirror import Mirror
    from ckptfs.replication.report import NoProgress

    mirror_module = importlib.import_module("ckptfs.replication.mirror")
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 9, stop_after=5)
    m = Mirror(src, dst, src_options=None, dst_options=None, workers=2, attempts=1, base_delay=0.0)
    try:
        assert m.pass_(None, 1, True, None, NoProgress()).ok
        arts = [p for p in (tmp_path / "dst").rglob("*") if p.is_file()
                and parse_artifact_key(str(p.relative_to(tmp_path / "dst"))) is not None]
        assert arts
        arts[0].unlink()  # a prune of the mirror collected it (say its referencing runs were gone)
        work(store, RUN, 9)  # the run moves on and still references it
        monkeypatch.setattr(mirror_module, "TOUCH_AFTER", 0.0)
        assert m.pass_(None, 1, True, None, NoProgress()).ok
    finally:
        m.close()
        store.close()
    assert arts[0].exists()
    assert CheckpointStore(dst).load_run(RUN) is not None


class Vanishing(Forwarding):
    """A mirror whose run files vanish between a listing and a read, `times` times (the mirror
    job's retention, or a prune of the mirror, deleting what a restore just listed)."""

    def __init__(self, inner: Storage, times: int) -> None:
        super().__init__(inner)
        self.times = times

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        if self.times > 0 and parse_run_key(key) is not None:
            self.times -= 1
            raise FileNotFoundError(key)
        return self.inner.get_with_etag(key)


def test_a_restore_plans_again_when_a_mirror_file_vanishes_while_it_is_read(tmp_path: Path) -> None:
    """`ckptfs restore` from a mirror whose job was pruning it exited 3: FileNotFoundError
    escaped restore(). Now it plans again from a fresh listing (as a mirror pass does), and a
    mirror that keeps changing is a run reported incomplete, not an exception."""
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, "r", 24)
    m = str(tmp_path / "mirror")
    assert mirror(src, m, latest=True).ok
    rep = restore(Vanishing(open_storage(m), 1), str(tmp_path / "dst"), run_id="r")
    assert rep.ok, [(r.status, r.error) for r in rep.runs]
    assert state(CheckpointStore(str(tmp_path / "dst")), "r") == state(store, "r")
    rep = restore(Vanishing(open_storage(m), 1000), str(tmp_path / "dst2"), run_id="r")
    assert not rep.ok and rep.runs[0].status == "incomplete"
    assert "kept changing" in (rep.runs[0].error or "")
    assert not open_storage(str(tmp_path / "dst2")).list("runs/")  # nothing published


def test_runs_go_together_and_an_artifact_they_share_is_sent_once(tmp_path: Path, memory_url: str) -> None:
    """Runs are mirrored several at once (their records go one at a time, so in turn a store of
    many runs paid a round trip per record per run); content addressing makes runs share
    artifacts, and each run holding one uploaded it again. Each is written once, and every
    run's point loads on the mirror as at the source."""
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    runs = [f"run-{i}" for i in range(6)]
    for run_id in runs:
        work(store, run_id, 12, stop_after=9)  # the same results: the same artifacts
    dst = Recording(open_storage(memory_url))
    report = mirror(src, dst, every_n=1, workers=4)
    assert report.ok and [r.status for r in report.runs] == ["mirrored"] * 6, report.to_dict()
    arts = [k for k in dst.writes if parse_artifact_key(k)]
    assert arts and len(arts) == len(set(arts)), sorted(arts)
    assert {k for k in store.storage.list("artifacts")} == set(arts)
    for run_id in runs:
        assert CheckpointStore(storage=dst.inner).load_run(run_id) == store.load_run(run_id)
    store.close()
