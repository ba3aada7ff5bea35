"""prune: dry run changes nothing; prune then verify is clean; a lone valid snapshot survives."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.cli import main as cli_main
from ckptfs.errors import ConfigError
from ckptfs.format.keys import parse_artifact_key, parse_run_key
from ckptfs.maintenance.prune import parse_duration, prune
from ckptfs.maintenance.verify import verify
from tests.test_integrity_support import POLICY, THRESHOLD, all_files, build_store


@pytest.fixture(scope="module")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prune") / "store"
    build_store(str(root))
    # A step whose large result is replaced: its first artifact loses every reference once
    # retention removes the records that held it.
    store = CheckpointStore(str(root), policy=POLICY, artifact_threshold=THRESHOLD)
    run = AgentRun(run_id="delta", goal="g")
    run.add_step(Step(id="a", title="t", status=StepStatus.COMPLETED, result="A" * 5000))
    store.save_run(run)
    for i in range(40):
        run.steps["a"].result = f"{i:02d}" * 2500
        store.save_run(run)
    store.close()
    return root


@pytest.fixture
def store_copy(base_store: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(base_store, dst)
    return dst


def contents(root: Path) -> dict[str, bytes]:
    return {k: (root / k).read_bytes() for k in all_files(root)}


def age_all(root: Path, seconds: float) -> None:
    t = time.time() - seconds
    for k in all_files(root):
        os.utime(root / k, (t, t))


def test_dry_run_changes_nothing(store_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    age_all(store_copy, 3 * 86400)
    before = contents(store_copy)
    assert cli_main(["prune", str(store_copy), "--keep-last", "1", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    would = [k for r in doc["runs"] for k in r["deleted"]] + doc["artifacts"]["deleted"]
    assert would and doc["artifacts"]["deleted"]
    assert contents(store_copy) == before
    report = prune(str(store_copy), 1)
    assert sorted(report.deleted) == sorted(would)


def test_prune_then_verify_is_clean(store_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    age_all(store_copy, 3 * 86400)
    unref_before = [f for f in verify(str(store_copy)).findings if f.code == "unreferenced-artifact"]
    had_snap = {k.split("/")[1] for k in all_files(store_copy) if "/snap/" in k}
    assert cli_main(["prune", str(store_copy), "--keep-last", "1"]) == 0
    out = capsys.readouterr().out
    assert "removed" in out
    report = verify(str(store_copy), level="data")
    assert report.findings == [] and report.artifacts > 0
    snaps = [k for k in all_files(store_copy) if "/snap/" in k]
    assert {k.split("/")[1] for k in snaps} == had_snap and "delta" in had_snap
    assert all(not (store_copy / f.key).exists() for f in unref_before if f.key)
    for rid in ("alpha", "beta", "gamma", "delta"):
        assert CheckpointStore(str(store_copy)).load_run(rid) is not None


def test_grace_period_keeps_young_artifacts(store_copy: Path) -> None:
    arts_before = {k for k in all_files(store_copy) if parse_artifact_key(k)}
    report = prune(str(store_copy), 1)  # files are seconds old: all younger than 24 h
    assert report.artifacts_deleted == [] and report.artifacts_young
    assert {k for k in all_files(store_copy) if parse_artifact_key(k)} == arts_before
    report = prune(str(store_copy), 1, artifact_grace=0)
    assert report.artifacts_deleted and not any((store_copy / k).exists() for k in report.artifacts_deleted)
    assert verify(str(store_copy), level="data").ok


def test_every_snapshot_but_one_broken_keeps_the_valid_one(store_copy: Path) -> None:
    snaps = sorted(k for k in all_files(store_copy) if k.startswith("runs/alpha/snap/"))
    assert len(snaps) >= 2
    keep = snaps[0]  # the oldest stays valid; every newer one is damaged
    for k in snaps[1:]:
        p = store_copy / k
        p.write_bytes(p.read_bytes()[:-7])
    age_all(store_copy, 3 * 86400)
    report = prune(str(store_copy), 1, run_id="alpha")
    alpha = report.runs[0]
    assert alpha.kept_snapshots == [parse_run_key(keep).version]  # type: ignore[union-attr]
    assert (store_copy / keep).exists() and keep not in report.deleted
    assert CheckpointStore(str(store_copy)).load_run("alpha") is not None
    # Damaged files make references unknowable: collection refuses to run.
    report = prune(str(store_copy), 1, artifact_grace=0)
    assert report.artifact_gc.startswith("skipped") and report.artifacts_deleted == []
    assert not report.ok


def test_crash_midway_through_retention_is_not_damage(store_copy: Path) -> None:
    # no superseded grace: the copy's snapshots are all young, and the crash order is the point
    store = CheckpointStore(str(store_copy), policy=CompactionPolicy(superseded_grace=0.0))
    doomed = store.apply_retention("alpha", 1, dry_run=True).deleted
    snaps_and_deltas = [k for k in doomed if "/log/" not in k]
    assert snaps_and_deltas and len(snaps_and_deltas) < len(doomed)
    for k in snaps_and_deltas:  # retention deletes these first; "crash" before the journal
        (store_copy / k).unlink()
    assert verify(str(store_copy)).problems == []


def test_empty_policy_and_bad_input_are_refused(store_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = contents(store_copy)
    for args in ([], ["--keep-last", "0"]):  # argparse refuses both: usage, exit 2
        with pytest.raises(SystemExit) as usage:
            cli_main(["prune", str(store_copy), *args])
        assert usage.value.code == 2
    assert cli_main(["prune", str(store_copy), "--keep-last", "1", "--artifact-grace", "soon"]) == 2
    assert cli_main(["prune", str(store_copy), "--keep-last", "1", "--run", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--keep-last" in err and "empty retention policy" in err and "'nope' not found" in err
    assert "soon" in err
    with pytest.raises(ConfigError):
        prune(str(store_copy), 0)
    assert contents(store_copy) == before
    assert parse_duration("24h") == 86400 and parse_duration("90") == 90 and parse_duration("2d") == 172800


def _old_unreferenced_artifact(root: Path) -> tuple[str, bytes]:
    """Bytes stored as an artifact two days ago that no record references any more."""
    from ckptfs.storage.registry import open_storage
    from ckptfs.store.artifacts import ArtifactStore

    data = b"re-referenced " * 5000
    ref = ArtifactStore(open_storage(str(root))).put(data)
    t = time.time() - 2 * 86400
    os.utime(root / ref.uri, (t, t))
    return ref.uri, data


def test_a_writer_re_referencing_old_bytes_touches_them_so_prune_spares_them(store_copy: Path) -> None:
    from ckptfs.storage.registry import open_storage
    from ckptfs.store.artifacts import ArtifactStore

    key, data = _old_unreferenced_artifact(store_copy)
    assert prune(str(store_copy), 1, dry_run=True).artifacts_deleted.count(key) == 1  # collectable now
    ArtifactStore(open_storage(str(store_copy))).put(data)  # a writer dedupes onto it...
    assert time.time() - (store_copy / key).stat().st_mtime < 60  # ...and touched it
    report = prune(str(store_copy), 1)
    assert key not in report.artifacts_deleted and key in report.artifacts_young
    assert (store_copy / key).exists()


def test_prune_reads_each_age_again_right_before_deleting(store_copy: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    prune_module = importlib.import_module("ckptfs.maintenance.prune")

    key, _data = _old_unreferenced_artifact(store_copy)
    real = prune_module._referenced
    calls = []

    def writer_in_between(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:  # after prune listed the artifact as old: a writer re-references it
            os.utime(store_copy / key)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(prune_module, "_referenced", writer_in_between)
    report = prune(str(store_copy), 1)
    assert len(calls) == 2
    assert key not in report.artifacts_deleted and (store_copy / key).exists()


def test_a_writer_does_not_trust_its_memory_of_bytes_prune_collected(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import ckptfs.store.artifacts as artifacts_module
    from ckptfs.storage.registry import open_storage
    from ckptfs.store.artifacts import ArtifactStore

    arts = ArtifactStore(open_storage(str(tmp_path)))
    ref = arts.put(b"x" * 10000)
    (tmp_path / ref.uri).unlink()  # collected behind the writer's back
    assert arts.put(b"x" * 10000) == ref
    assert not (tmp_path / ref.uri).exists()  # within TOUCH_AFTER the writer trusts its memory
    monkeypatch.setattr(artifacts_module, "TOUCH_AFTER", 0.0)
    arts.put(b"x" * 10000)
    assert arts.read(ref) == b"x" * 10000  # past it, it looks again and writes the bytes back


def test_bytes_that_cannot_be_touched_are_written_again(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 refuses to copy an archived (GLACIER) object onto itself: the commit must not fail."""
    from ckptfs.errors import StorageUnavailableError
    from ckptfs.storage.local import LocalStorage
    from ckptfs.storage.registry import open_storage
    from ckptfs.store.artifacts import ArtifactStore

    storage = open_storage(str(tmp_path))
    ref = ArtifactStore(storage).put(b"archived " * 2000)
    t = time.time() - 86400
    os.utime(tmp_path / ref.uri, (t, t))

    def refuse(self: LocalStorage, key: str) -> None:
        raise StorageUnavailableError(f"{key}: ObjectNotInActiveTierError")

    monkeypatch.setattr(LocalStorage, "touch", refuse)
    assert ArtifactStore(storage).put(b"archived " * 2000) == ref
    assert time.time() - (tmp_path / ref.uri).stat().st_mtime < 60  # written afresh: young again
    assert ArtifactStore(storage).read(ref) == b"archived " * 2000
