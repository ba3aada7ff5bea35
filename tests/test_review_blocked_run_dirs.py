"""A run folder (`log/`, `delta/`, `snap/`) replaced by a symlink (never followed) or a plain file
while the run's other folders still hold good versions, through the real `ckptfs` executable.

The loader fell back to an older version in silence (v15 from `snap/` while the linked `log/`
held v16 and v17): `show` and `export` said nothing, `mirror` printed "papers mirrored 15" and
exited 0 with a replica missing v16-v17, and `prune` pruned the run and collected artifacts
whose only references were behind the link. Each names the path now and exits non-zero;
`prune` removes nothing of such a run, keeps every artifact, and follows no link."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli_commands import cli
from test_review_readonly_cli import RUN, pristine, store

__all__ = ["pristine", "store"]  # the fixtures: papers v1..v17, snapshots at 3..15; finished v1..v2

NOT_A_DIR = "not a directory (a symlink, never followed, or a file)"


def _files(root: Path) -> dict[Path, bytes]:
    """Every regular file below `root`, links not followed (what a prune may delete)."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def _block(store: Path, folder: str, how: str, elsewhere: Path) -> Path:
    """Put a symlink (to a copy of the folder's files outside the store) or a plain file where
    the run's `folder` was; returns what the link leads to (or the file)."""
    where = store / "runs" / RUN / folder
    if how == "symlink":
        elsewhere.mkdir(parents=True)
        if where.exists():
            shutil.move(str(where), str(elsewhere / folder))
        else:
            (elsewhere / folder).mkdir()
        where.symlink_to(elsewhere / folder)
        return elsewhere / folder
    if where.exists():
        shutil.rmtree(where)
    where.write_text("not a folder")
    return where


@pytest.mark.parametrize(("folder", "how", "version"), [
    ("log", "symlink", 15), ("log", "file", 15), ("snap", "symlink", 17), ("delta", "file", 17)])
def test_show_and_export_name_a_run_folder_that_is_not_a_directory(store: Path, tmp_path: Path, folder: str,
                                                                   how: str, version: int) -> None:
    """show loaded v15 and said nothing of v16-v17 behind the linked log/: the folder is one of
    the load's skip reasons (show's notes, export's `skipped`, the load's one warning)."""
    _block(store, folder, how, tmp_path / "elsewhere")
    key = f"runs/{RUN}/{folder}"
    code, out, err = cli("show", str(store), RUN, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["version"] == version, out
    assert any(s.startswith(f"{key}: {NOT_A_DIR}") for s in doc["skipped"]), doc["skipped"]
    assert f"loaded version {version} after skipping: {key}: not a directory" in " ".join(err.split()), err
    code, out, err = cli("show", str(store), RUN)
    assert code == 0 and f"skipped: {key}: {NOT_A_DIR}" in " ".join(err.split()), err
    target = tmp_path / "export.json"
    code, _, _ = cli("export", str(store), RUN, "--output", str(target))
    exported = json.loads(target.read_text())
    assert code == 0 and exported["version"] == version
    assert any(key in s and "not a directory" in s for s in exported["skipped"]), exported["skipped"]


def test_a_version_asked_for_behind_a_linked_log_is_not_called_absent(store: Path, tmp_path: Path) -> None:
    """`show --version 16` said v16 "is not available" (exit 2, as for a typo) while v16 sits in
    the linked log/: the load cannot tell, and says why."""
    _block(store, "log", "symlink", tmp_path / "elsewhere")
    code, out, _ = cli("show", str(store), RUN, "--version", "16", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["error"]["code"] == "corrupt", out
    assert "version 16 could not be loaded" in doc["error"]["message"]
    assert f"runs/{RUN}/log: not a directory" in doc["error"]["message"]


@pytest.mark.parametrize("how", ["symlink", "file"])
def test_verify_calls_a_blocked_run_folder_an_error_by_name(store: Path, tmp_path: Path, how: str) -> None:
    """verify called a linked log/ a 'stray (unexpected name)' warning, while show, mirror and
    prune name it as the folder no command reads: an error, in the same words."""
    _block(store, "log", how, tmp_path / "elsewhere")
    code, out, _ = cli("verify", str(store), "--json")
    doc = json.loads(out)
    found = [f for f in doc["findings"] if f["key"] == f"runs/{RUN}/log"]
    assert code == 1 and len(found) == 1, out
    assert found[0]["severity"] == "error" and found[0]["code"] == "not-a-directory", found
    assert found[0]["message"].startswith(f"runs/{RUN}/log: {NOT_A_DIR}"), found


def test_mirror_names_a_linked_log_and_exits_1(store: Path, tmp_path: Path) -> None:
    """mirror printed "papers mirrored 15", exit 0, and the replica silently lacked v16-v17: the
    run is incomplete, the path is named, and the other run is mirrored as before. What the
    source can load (v15) is still copied, a consistent restore point; the link is not followed."""
    linked = _block(store, "log", "symlink", tmp_path / "elsewhere")
    outside = _files(linked)
    replica = tmp_path / "replica"
    code, out, err = cli("mirror", str(store), str(replica), "--once", "--no-progress", "--json")
    doc = json.loads(out)
    rows = {r["run_id"]: r for r in doc["runs"]}
    assert code == 1 and doc["ok"] is False, out
    assert rows[RUN]["status"] == "incomplete" and rows[RUN]["version"] == 15, rows[RUN]
    assert any(m.startswith(f"runs/{RUN}/log: {NOT_A_DIR}") for m in rows[RUN]["missing"]), rows[RUN]
    assert rows["finished"]["status"] == "mirrored" and rows["finished"]["version"] == 2
    code, out, err = cli("mirror", str(store), str(replica), "--once", "--no-progress")
    flat = " ".join(err.split())
    assert code == 1 and f"run {RUN}: runs/{RUN}/log: {NOT_A_DIR}" in flat, err
    assert not (replica / "runs" / RUN / "log").is_symlink()
    assert not list((replica / "runs" / RUN).rglob("*16.ckpt")) and not list(
        (replica / "runs" / RUN).rglob("*17.ckpt"))
    code, out, _ = cli("show", str(replica), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == 15
    assert _files(linked) == outside
    code, out, _ = cli("mirror", str(store), str(replica), "--once", "--no-progress", "--run", RUN, "--json")
    assert code == 1 and json.loads(out)["runs"][0]["status"] == "incomplete", out


def test_mirror_of_a_run_whose_only_folder_is_a_link_is_not_empty_and_ok(store: Path, tmp_path: Path) -> None:
    """A run holding nothing but a linked log/ was "empty" to mirror, exit 0: nothing of it is
    readable, and that is said."""
    _block(store, "log", "symlink", tmp_path / "elsewhere")
    shutil.rmtree(store / "runs" / RUN / "snap")
    code, out, _ = cli("mirror", str(store), str(tmp_path / "replica"), "--once", "--no-progress", "--json")
    rows = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert code == 1 and rows[RUN]["status"] == "incomplete", out
    assert any(f"runs/{RUN}/log: not a directory" in m for m in rows[RUN]["missing"])


@pytest.mark.parametrize("how", ["symlink", "file"])
def test_prune_removes_nothing_of_a_run_with_a_folder_that_is_not_a_directory(store: Path, tmp_path: Path,
                                                                              how: str) -> None:
    """prune --keep-last 1 removed four snapshots of papers, exit 0, with v16-v17 unseen behind
    the linked log/: nothing of that run is removed, the path is named, exit 1; the other run is
    pruned as before, and nothing the link leads to is touched."""
    linked = _block(store, "log", how, tmp_path / "elsewhere")
    outside = _files(linked) if how == "symlink" else {}
    before = _files(store)
    code, out, err = cli("prune", str(store), "--keep-last", "1", "--dry-run", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False, out
    assert any(p.startswith(f"runs/{RUN}/log: {NOT_A_DIR}") for p in doc["problems"]), doc["problems"]
    assert all(r["deleted"] == [] for r in doc["runs"] if r["run_id"] == RUN), doc["runs"]
    code, out, err = cli("prune", str(store), "--keep-last", "1", "--artifact-grace", "0s")
    assert code == 1 and f"runs/{RUN}/log: {NOT_A_DIR}" in " ".join(err.split()), err
    assert _files(store) == before  # finished has one snapshot-less chain: nothing of it goes either
    if how == "symlink":
        assert (store / "runs" / RUN / "log").is_symlink() and _files(linked) == outside
    code, out, err = cli("prune", str(store), "--keep-last", "1", "--run", RUN)
    assert code == 1 and f"runs/{RUN}/log: {NOT_A_DIR}" in " ".join(err.split()), err
    assert _files(store) == before


def test_prune_keeps_artifacts_only_a_linked_log_references(store: Path, tmp_path: Path) -> None:
    """With papers' snapshots gone and its log/ a link, no listed file referenced its artifact,
    and `prune --artifact-grace 0s` deleted it (exit 0): the run's references are unknown, so
    artifact collection is skipped, and says why."""
    _block(store, "log", "symlink", tmp_path / "elsewhere")
    shutil.rmtree(store / "runs" / RUN / "snap")
    artifacts = [p for p in (store / "artifacts").rglob("*") if p.is_file()]
    assert artifacts
    code, out, _ = cli("prune", str(store), "--keep-last", "1", "--artifact-grace", "0s", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["artifacts"]["deleted"] == [], out
    assert doc["artifacts"]["gc"].startswith("skipped") and f"runs/{RUN}/log" in doc["artifacts"]["gc"]
    assert all(p.is_file() for p in artifacts)
    code, _, err = cli("prune", str(store), "--keep-last", "1", "--artifact-grace", "0s")
    assert code == 1 and f"runs/{RUN}/log: {NOT_A_DIR}" in " ".join(err.split()), err
    assert all(p.is_file() for p in artifacts)


@pytest.mark.parametrize(("folder", "how"), [("log", "symlink"), ("log", "file"), ("snap", "symlink")])
def test_versions_names_a_run_folder_that_is_not_a_directory(store: Path, tmp_path: Path, folder: str,
                                                             how: str) -> None:
    """`versions` listed v1..v15 (log/ linked away) and said 'a restore can target' them, with
    nothing saying v16 and v17 sit behind the link: the note names the folder, --json `unread`."""
    _block(store, folder, how, tmp_path / "elsewhere")
    key = f"runs/{RUN}/{folder}"
    code, out, err = cli("versions", str(store), RUN, "--json")
    assert code == 0, err
    assert json.loads(out)["unread"] == [key]
    code, out, err = cli("versions", str(store), RUN)
    assert code == 0, err
    assert f"note: {key}: {NOT_A_DIR}: the versions stored there are not listed" in " ".join(out.split()), out
    code, out, err = cli("versions", str(store), "finished", "--json")  # another run: nothing to say
    assert code == 0 and json.loads(out)["unread"] == [], out
