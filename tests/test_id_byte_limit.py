"""Ids are measured in bytes, as local disk measures a name: 64 x U+1F600 is 64 characters (under
the 200-character limit) but 256 bytes of UTF-8, past the 255 a name holds on ext4, XFS, btrfs,
ZFS, tmpfs and APFS. It passed, `save_run` to a directory then failed with a raw "File name too
long", and a run of that id committed on S3 (keys take 1024 bytes) made `ckptfs restore` and
`ckptfs mirror` to a directory stop with "unexpected OSError", exit 3, every other run of the
store left uncopied. A step id goes into a longer name still: its lease's temp file,
`.<step id>.lease.tmp-<hex>`. Tested at the limits and one byte past them, on local disk, and
through the real `ckptfs` against S3 data written before the limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cli_commands import cli, cli_json

from backends.s3.embedded import FAKE_CREDENTIALS, EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import InvalidIdError
from ckptfs.format import models
from ckptfs.format.keys import lease_key
from ckptfs.storage.registry import open_storage
from ckptfs.store.leases import LeaseManager

SMILE = "\U0001f600"  # 4 bytes of UTF-8
LONG_RUN = SMILE * 64  # 256 bytes: one past a name on disk
RUN_AT_LIMIT = SMILE * 63 + "abc"  # 255 bytes
STEP_AT_LIMIT = SMILE * 54 + "abc"  # 219 bytes: its lease's temp name fits 255
LONG_STEP = SMILE * 60  # 240 bytes: its lease name fits, the lease's temp name does not


def _run(run_id: str, step_id: str = "s") -> AgentRun:
    run = AgentRun(run_id=run_id, goal="g")
    run.add_step(Step(id=step_id, title="t"))
    return run


def _commit_done(store: CheckpointStore, run: AgentRun, step_id: str = "s") -> None:
    store.save_run(run)
    step = run.steps[step_id]
    step.status = StepStatus.COMPLETED
    step.result = "r"
    store.commit(run, [step])


def test_run_id_past_255_bytes_is_refused_before_any_write(tmp_path: Path) -> None:
    assert len(LONG_RUN) <= models.MAX_ID_LENGTH and len(LONG_RUN.encode()) == 256
    root = tmp_path / "st"
    store = CheckpointStore(str(root))
    with pytest.raises(ValueError, match=r"run id .* is 256 bytes long in UTF-8; the limit is 255 bytes"):
        AgentRun(run_id=LONG_RUN, goal="g")
    for call in (lambda: store.load_run(LONG_RUN), lambda: store.list_versions(LONG_RUN)):
        with pytest.raises(InvalidIdError, match="256 bytes long in UTF-8; the limit is 255 bytes"):
            call()
    assert not root.exists() or not any(root.rglob("*"))


def test_step_id_whose_lease_temp_name_would_pass_255_bytes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"step id .* is 240 bytes long in UTF-8; the limit is 219 bytes"):
        Step(id=LONG_STEP, title="t")
    with pytest.raises(InvalidIdError, match="the limit is 219 bytes"):
        lease_key("r", LONG_STEP)
    root = tmp_path / "st"
    leases = LeaseManager(open_storage(str(root)), "w", ttl=30)
    with pytest.raises(InvalidIdError, match="240 bytes long"):
        leases.acquire("r", LONG_STEP)
    assert not root.exists() or not any(root.rglob("*.lease"))


def test_ids_at_the_byte_limits_work_on_local_disk_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    """The limits are what disk holds, not tighter: a run id of 255 bytes is a folder, a step id
    of 219 bytes a lease that is created, renewed (through its temp file) and released."""
    assert len(RUN_AT_LIMIT.encode()) == 255 and len(STEP_AT_LIMIT.encode()) == 219
    store = CheckpointStore(str(tmp_path / "st"))
    _commit_done(store, _run(RUN_AT_LIMIT, STEP_AT_LIMIT), STEP_AT_LIMIT)
    loaded = store.load_run(RUN_AT_LIMIT)
    assert loaded.steps[STEP_AT_LIMIT].result == "r"
    assert (tmp_path / "st" / "runs" / RUN_AT_LIMIT).is_dir()
    leases = LeaseManager(open_storage(str(tmp_path / "st")), "w", ttl=30)
    lease = leases.acquire(RUN_AT_LIMIT, STEP_AT_LIMIT)
    assert lease is not None
    lease = leases.renew(leases.renew(lease))
    assert leases.release(lease)
    with pytest.raises(ValueError, match="256 bytes long in UTF-8; the limit is 255 bytes"):
        AgentRun(run_id=RUN_AT_LIMIT + "d", goal="g")
    with pytest.raises(ValueError, match="220 bytes long in UTF-8; the limit is 219 bytes"):
        Step(id=STEP_AT_LIMIT + "d", title="t")


@pytest.fixture
def legacy_s3(s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An S3 store holding, beside an ordinary run, a committed run of a 256-byte id, written as
    a version before the limit wrote it: this process is allowed S3's 1024 bytes; the `ckptfs`
    run by the tests has the real limit."""
    with monkeypatch.context() as m:
        m.setattr(models, "MAX_NAME_BYTES", 1024, raising=False)
        store = CheckpointStore(s3_url, storage_options=s3.storage_options)
        for rid in (LONG_RUN, "ok-run"):
            _commit_done(store, _run(rid))
        store.close()
    return s3_url


def _s3_env(s3: EmbeddedS3) -> dict[str, str]:
    return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_DEFAULT_REGION": s3.region}


@pytest.mark.parametrize("command", ["restore", "mirror"])
def test_restore_and_mirror_to_disk_copy_the_other_runs_past_an_over_long_run_id(
        command: str, legacy_s3: str, s3: EmbeddedS3, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    extra = ["--once"] if command == "mirror" else []
    code, report, err = cli_json(command, legacy_s3, str(dst), *extra, env=_s3_env(s3))
    assert "unexpected" not in err
    assert code == 1, err  # a run left uncopied: a scheduled mirror must not report clean passes
    by_id = {r["run_id"]: r for r in report["runs"]}
    assert by_id["ok-run"]["status"] == ("restored" if command == "restore" else "mirrored")
    odd = by_id[f"runs/{LONG_RUN}/"]
    assert odd["status"] == "incomplete"
    assert any("256 bytes long in UTF-8; the limit is 255 bytes" in n for n in odd["notes"]), odd
    if command == "restore":
        assert CheckpointStore(str(dst)).load_run("ok-run").steps["s"].result == "r"
    assert sorted(os.listdir(dst / "runs")) == ["ok-run"]


def test_restore_of_the_over_long_run_by_name_is_refused_naming_the_limit(
        legacy_s3: str, s3: EmbeddedS3, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    code, out, err = cli("restore", legacy_s3, str(dst), "--run", LONG_RUN, env=_s3_env(s3))
    assert code == 2, (code, out, err)
    assert "256 bytes long in UTF-8; the limit is 255 bytes" in err
    assert "unexpected" not in err
    assert not dst.exists() or not any(dst.rglob("*.ckpt"))
