"""`ckptfs restore` from a `file://` mirror in which a run folder (`log/`, `delta/`, `snap/`) is a
symlink (never followed) or a plain file, through the real `ckptfs` executable.

Restore passed over such a folder in silence: with the mirror's `log/` linked away (v16, v17)
it restored v15 from `snap/`, said "papers restored 15", exit 0, and the restored store verified
clean and showed v15, a run a version short for an agent to resume. With `snap/` a file it said
"no loadable chain" without naming it; with `delta/` one it said "restored 17" though nothing
could tell whether `delta/` held more. As mirror does, the run is `incomplete` (exit 1) and the
folder named, in the one wording; nothing of it is published, the other run is restored as
before, and a link out of the mirror to valid-looking files is never read through."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import _cli_store
import pytest
from _cli_store import RUN
from _fault_proxy import FaultProxy, Request
from test_cli_commands import CLI, cli
from test_review_blocked_run_dirs import NOT_A_DIR, _block, _files

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.format.keys import run_prefix
from ckptfs.replication.restore import restore_points
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from tests._forwarding import Forwarding

pristine, store = _cli_store.pristine, _cli_store.store  # fixtures: papers v1..v17, snaps at 3..15


@pytest.fixture(scope="module")
def pristine_mirror(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store mirrored once a module: papers v15 (snap) + v16, v17 (log); finished v1, v2."""
    root = tmp_path_factory.mktemp("linked-mirror") / "mirror"
    code, out, err = cli("mirror", str(pristine), f"file://{root}", "--once", "--no-progress", "--json")
    assert code == 0, out + err
    assert {r["run_id"]: r["version"] for r in json.loads(out)["runs"]} == {RUN: 17, "finished": 2}
    return root


@pytest.fixture
def mirror(pristine_mirror: Path, tmp_path: Path) -> Path:
    root = tmp_path / "mirror"
    shutil.copytree(pristine_mirror, root, symlinks=True)
    return root


def _restore(mirror: Path, dst: Path, *args: str) -> tuple[int, dict[str, Any], Any]:
    """`ckptfs restore --json` of the mirror into `dst`: exit code, rows by run id, the document."""
    code, out, _ = cli("restore", f"file://{mirror}", str(dst), "--no-progress", "--json", *args)
    doc = json.loads(out)
    return code, {r["run_id"]: r for r in doc["runs"]}, doc


@pytest.mark.parametrize("folder", ["log", "snap", "delta"])
@pytest.mark.parametrize("how", ["symlink", "file"])
def test_restore_of_a_run_with_a_folder_that_is_not_a_directory_is_incomplete(
        mirror: Path, tmp_path: Path, folder: str, how: str) -> None:
    _block(mirror, folder, how, tmp_path / "elsewhere")
    key = f"runs/{RUN}/{folder}"
    dst = tmp_path / "restored"
    code, rows, doc = _restore(mirror, dst)
    assert code == 1 and doc["ok"] is False, doc
    row = rows[RUN]
    assert row["status"] == "incomplete" and row["version"] is None and row["copied"] == 0, row
    assert str(row["error"]).startswith(f"{key}: {NOT_A_DIR}: the versions stored there are not read, "
                                        "so the run is not restored"), row
    assert any(m.startswith(f"{key}: {NOT_A_DIR}") for m in doc["missing"]), doc["missing"]
    assert rows["finished"]["status"] == "restored" and rows["finished"]["version"] == 2, rows
    assert not (dst / "runs" / RUN).exists()  # nothing of the run, so nothing that resumes a version short
    code, out, err = cli("show", str(dst), RUN)
    assert code == 2 and "not found" in err, out + err
    code, out, _ = cli("show", str(dst), "finished", "--json")
    assert code == 0 and json.loads(out)["version"] == 2
    code, out, _ = cli("verify", str(dst), "--json")
    assert code == 0 and json.loads(out)["ok"], out
    # the table and the error line say it too, in the words mirror, prune and show use
    code, out, err = cli("restore", f"file://{mirror}", str(tmp_path / "again"), "--no-progress")
    assert code == 1 and f"run {RUN}: {key}: {NOT_A_DIR}" in " ".join(err.split()), err
    assert "incomplete" in out


def test_a_link_out_of_the_mirror_to_valid_files_is_never_read_through(
        mirror: Path, pristine: Path, tmp_path: Path) -> None:
    """The mirror's log/ linked to a directory outside it holding the store's whole log (v1..v17,
    files that verify): only regular files inside the mirror are read, so neither the newest
    point nor a version asked for that sits only behind the link (v1) is restored from it."""
    outside = tmp_path / "outside" / "log"
    shutil.rmtree(mirror / "runs" / RUN / "log")
    shutil.copytree(pristine / "runs" / RUN / "log", outside)
    (mirror / "runs" / RUN / "log").symlink_to(outside)
    before = _files(outside.parent)
    code, rows, _ = _restore(mirror, tmp_path / "a")
    assert code == 1 and rows[RUN]["status"] == "incomplete", rows
    assert not (tmp_path / "a" / "runs" / RUN).exists()
    # v1 is only behind the link: not "no version 1" (exit 2) as if absent, not restored through it
    code, rows, _ = _restore(mirror, tmp_path / "b", "--run", RUN, "--version", "1")
    row = rows[RUN]
    assert code == 1 and row["status"] == "incomplete", row
    assert str(row["error"]).startswith(f"runs/{RUN}/log: {NOT_A_DIR}"), row
    assert "version 1 of run 'papers' is not restorable" in str(row["error"]), row
    assert not (tmp_path / "b" / "runs" / RUN).exists()
    assert _files(outside.parent) == before and (mirror / "runs" / RUN / "log").is_symlink()


def test_a_version_asked_for_that_the_regular_files_hold_whole_is_restored_with_a_note(
        mirror: Path, tmp_path: Path) -> None:
    """`--version 15` is whole from `snap/` alone: restored (exit 0), the linked folder noted."""
    _block(mirror, "log", "symlink", tmp_path / "elsewhere")
    dst = tmp_path / "restored"
    code, rows, _ = _restore(mirror, dst, "--run", RUN, "--version", "15")
    row = rows[RUN]
    assert code == 0 and row["status"] == "restored" and row["version"] == 15, row
    assert any(str(n).startswith(f"runs/{RUN}/log: {NOT_A_DIR}") for n in row["notes"]), row
    code, out, _ = cli("show", str(dst), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == 15


def test_a_run_holding_nothing_but_a_linked_folder_is_named_not_just_absent(mirror: Path,
                                                                            tmp_path: Path) -> None:
    """`restore --run papers` of a mirror whose papers is only a linked log/ said "not found"
    (exit 2) with nothing to go on: the folder is named, as show and mirror name it."""
    _block(mirror, "log", "symlink", tmp_path / "elsewhere")
    shutil.rmtree(mirror / "runs" / RUN / "snap")
    code, _, err = cli("restore", f"file://{mirror}", str(tmp_path / "r"), "--run", RUN, "--no-progress")
    flat = " ".join(err.split())
    assert code == 2 and "not found" in flat and f"runs/{RUN}/log: {NOT_A_DIR}" in flat, err
    code, rows, _ = _restore(mirror, tmp_path / "whole")  # the whole mirror: that run incomplete
    assert code == 1 and rows[RUN]["status"] == "incomplete", rows
    assert "--version" not in str(rows[RUN]["error"])  # no point to offer
    assert rows["finished"]["status"] == "restored"


class _Counting(Forwarding):
    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.lists: list[str] = []

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        self.lists.append(prefix)
        return super().list(prefix, start_after)


def test_restore_points_reads_the_listing_it_is_given_and_names_a_blocked_folder(
        mirror: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`ckptfs versions` listed the run, then restore_points listed it again (a second LIST on
    S3): given the keys it lists nothing. Listing itself, it warns of a folder it cannot read."""
    _block(mirror, "log", "symlink", tmp_path / "elsewhere")
    st = _Counting(open_storage(str(mirror)))
    keys = st.list(run_prefix(RUN))
    st.lists.clear()
    assert restore_points(st, RUN, keys=keys) == [15]
    assert st.lists == []
    with caplog.at_level(logging.WARNING, logger="ckptfs.replication.restore"):
        assert restore_points(st, RUN) == [15]
    assert st.lists == [run_prefix(RUN)]
    assert any(f"runs/{RUN}/log: {NOT_A_DIR}" in r.getMessage() for r in caplog.records), caplog.records


def test_versions_on_s3_lists_the_run_once(s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    """`ckptfs versions` over S3 sent two LISTs of the run (list_versions', then restore_points'
    own): one, counted over real HTTP through a recording proxy."""
    store = CheckpointStore(s3_url, s3.storage_options)
    run = AgentRun(run_id="one", goal="g", steps={f"s{i}": Step(id=f"s{i}", title=f"t{i}") for i in range(3)})
    store.save_run(run)
    for i in range(3):
        step = run.steps[f"s{i}"]
        step.status, step.result = StepStatus.COMPLETED, f"result {i}"
        store.commit(run, [step])
    store.close()
    seen: list[Request] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=s3.region)
    with FaultProxy(s3.endpoint, seen.append) as proxy:
        ep = f"client_kwargs.endpoint_url={proxy.endpoint}"
        got = subprocess.run([CLI, "versions", s3_url, "one", "-o", ep, "--json"], capture_output=True,
                             text=True, env=env, timeout=120, cwd=tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    assert json.loads(got.stdout)["restore_points"] == [1, 2, 3, 4]
    lists = [r.path for r in seen if r.method == "GET" and "list-type" in r.path and "runs%2Fone" in r.path]
    assert len(lists) == 1, [(r.method, r.path) for r in seen]
