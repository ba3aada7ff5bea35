"""A hostile operator against `ckptfs mirror` / `ckptfs restore`, through the real executable:
unreadable files where a run's newest point is, damaged points in a mirror, restores killed
mid-copy."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_cli_commands import cli
from test_mirror import POLICY, work

from ckptfs import CheckpointStore


def _newest_log(root: Path, run_id: str) -> Path:
    return sorted((root / "runs" / run_id / "log").iterdir())[-1]


def _hostile(path: Path, kind: str, tmp_path: Path) -> None:
    """Replace `path` by a link to its own bytes outside the store, or by a FIFO."""
    if kind == "symlink":
        outside = tmp_path / f"outside-{path.name}"
        shutil.move(path, outside)
        path.symlink_to(outside)
    else:
        path.unlink()
        os.mkfifo(path)


@pytest.mark.parametrize("side", ["source", "mirror"])
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_an_unreadable_newest_file_of_one_run_does_not_stop_the_pass(
        side: str, kind: str, tmp_path: Path) -> None:
    """The newest file of run `a` became a link out of the store (or a FIFO), at the source or
    in the mirror. The check that the mirror's newest point is the source's read it, and the
    refusal escaped the pass: `ckptfs mirror` printed one line "corrupt: ...", exit 1, no
    table, and run `b`, new since the last pass, was never mirrored, on every pass. Now the
    run is `incomplete`, naming the file; the others are mirrored."""
    src, dst = tmp_path / "src", tmp_path / "mirror"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "a", 8)
    code, out, err = cli("mirror", str(src), str(dst), "--once", "--no-progress")
    assert code == 0, (out, err)
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "b", 5)
    root = src if side == "source" else dst
    target = _newest_log(root, "a")
    _hostile(target, kind, tmp_path)
    code, out, err = cli("mirror", str(src), str(dst), "--once", "--no-progress", "--json",
                         timeout=30)
    doc = json.loads(out)
    assert code == 1, (out, err)
    runs = {r["run_id"]: r for r in doc["runs"]}  # was: no runs at all, one "corrupt" error
    assert runs["b"]["status"] == "mirrored", runs
    assert runs["a"]["status"] == "incomplete", runs["a"]
    error = runs["a"]["error"]
    assert target.name in error and ("link" in error or "FIFO" in error), error
    assert CheckpointStore(str(dst)).load_run("b") == CheckpointStore(str(src)).load_run("b")
    assert os.path.islink(target) or target.is_fifo()  # never replaced, never followed


def test_a_damaged_newest_file_at_the_source_is_named_not_called_another_history(
        tmp_path: Path) -> None:
    """A bit flipped in the source's newest record, which the mirror holds intact: the pass
    said "conflict: the mirror holds a different file under this name (another store's history
    of run?)", sending the operator after a second store that does not exist. The source's
    file is the one that does not decode: the run is incomplete and the message says so."""
    src, dst = tmp_path / "src", tmp_path / "mirror"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "a", 8)
    assert cli("mirror", str(src), str(dst), "--once", "--no-progress")[0] == 0
    target = _newest_log(src, "a")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    code, out, err = cli("mirror", str(src), str(dst), "--once", "--no-progress", "--json")
    assert code == 1, (out, err)
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "incomplete", run
    assert "source" in run["error"] and target.name in run["error"], run["error"]
    assert "another store" not in run["error"]
    mirrored = (dst / target.relative_to(src)).read_bytes()
    assert mirrored != bytes(data)  # the mirror's intact copy is untouched


def test_a_damaged_newest_file_in_the_mirror_is_named_not_called_another_history(
        tmp_path: Path) -> None:
    """The same flip in the mirror's copy: "conflict ... another store's history?" too. It is
    the mirror's file that does not decode; the run is incomplete, the file left for verify."""
    src, dst = tmp_path / "src", tmp_path / "mirror"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "a", 8)
    assert cli("mirror", str(src), str(dst), "--once", "--no-progress")[0] == 0
    target = _newest_log(dst, "a")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    code, out, err = cli("mirror", str(src), str(dst), "--once", "--no-progress", "--json")
    assert code == 1, (out, err)
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "incomplete", run
    assert "mirror's file does not decode" in run["error"] and target.name in run["error"], run
    assert target.read_bytes() == bytes(data)  # never overwritten
    code, out, err = cli("verify", str(dst), "--json")
    assert code == 1 and target.name in out


@pytest.mark.parametrize("damage", ["flip", "symlink", "fifo"])
def test_a_restore_that_falls_back_past_the_mirrors_newest_point_says_so(
        damage: str, tmp_path: Path) -> None:
    """The mirror's newest record damaged (a flipped bit, a link out of the store, a FIFO):
    `ckptfs restore` restored the version before it, "restored", the note column empty, exit
    0, with one WARNING among the progress lines: the agent resumed a version short and paid
    again, and nothing in the report said the mirror held more. The fallback is in the note."""
    src, dst, out_dir = tmp_path / "src", tmp_path / "mirror", tmp_path / "restored"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "a", 8)
    assert cli("mirror", str(src), str(dst), "--once", "--no-progress")[0] == 0
    target = _newest_log(dst, "a")
    newest = int(target.stem)
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    else:
        _hostile(target, damage, tmp_path)
    code, out, err = cli("restore", str(dst), str(out_dir), "--no-progress", "--json", timeout=30)
    assert code == 0, (out, err)
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "restored" and run["version"] == newest - 1, run
    note = "; ".join(run["notes"])
    assert f"v{newest}" in note and target.name in note, run  # was: no note at all
    got = CheckpointStore(str(out_dir)).load_run("a")
    assert got == CheckpointStore(str(src)).load_run("a", version=newest - 1)


def _big_store(root: Path, run_id: str) -> CheckpointStore:
    """A run whose results include artifacts over restore's single-GET size (staged on disk)."""
    from ckptfs import AgentRun, Step, StepStatus

    store = CheckpointStore(str(root))
    run = AgentRun(run_id=run_id, goal="g", created_at=0.0, updated_at=0.0)
    for i in range(12):
        run.add_step(Step(id=f"s{i:02d}", title=f"s{i}"))
    store.save_run(run)
    for i in range(12):
        step = run.steps[f"s{i:02d}"]
        size = 9 * 1024 * 1024 if i % 4 == 3 else 200_000  # 3 staged on disk, 9 in memory
        step.status, step.result = StepStatus.COMPLETED, os.urandom(size // 2).hex()
        store.commit(run, [step])
    return store


def _staged(tmp: Path) -> list[Path]:
    return [p for p in tmp.iterdir() if p.name.startswith("ckptfs-")]  # any prefix of ours


def test_a_restore_killed_while_staging_leaves_no_staged_copy_behind_after_the_rerun(
        tmp_path: Path) -> None:
    """SIGKILL `ckptfs restore` while it stages a run's big artifacts in the temporary
    directory: every kill left that staging directory behind (27 MB each here; a whole run's
    big artifacts in general), and nothing ever removed it, so an operator retrying a restore
    that keeps being killed (OOM, a deploy) filled /tmp. Each kill leaves the destination as
    nothing that loads (never a wrong state); the rerun converges, verifies clean, loads the
    source's state, and removes the staging copies of restores that are dead."""
    import signal
    import subprocess
    import time

    from test_cli_commands import CLI

    from ckptfs import CheckpointCorruptError

    src, dst, tmp = tmp_path / "src", tmp_path / "restored", tmp_path / "tmp"
    tmp.mkdir()
    source = _big_store(src, "big")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")},
           "TMPDIR": str(tmp)}
    kills = 0
    for _ in range(3):
        proc = subprocess.Popen([CLI, "restore", str(src), str(dst), "--no-progress"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=str(tmp_path))
        before = set(_staged(tmp))
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline and not any(
                any(p.rglob("*")) for p in set(_staged(tmp)) - before if p.is_dir()):
            time.sleep(0.001)  # until this restore has staged something on disk
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        assert len(_staged(tmp)) <= 1, sorted(p.name for p in _staged(tmp))  # was: one per kill
        if dst.exists():  # nothing half-written loads as a wrong state
            try:
                got = CheckpointStore(str(dst)).load_run("big")
            except CheckpointCorruptError:
                got = None
            assert got is None or got == source.load_run("big")
    assert kills >= 2
    code, out, err = cli("restore", str(src), str(dst), "--no-progress", env={"TMPDIR": str(tmp)})
    assert code == 0, (out, err)
    assert cli("verify", str(dst), "--data")[0] == 0
    assert CheckpointStore(str(dst)).load_run("big") == source.load_run("big")
    assert _staged(tmp) == []


@pytest.mark.parametrize("due", [[], ["--latest"]])
def test_a_mirror_ahead_of_the_source_is_a_conflict_not_not_due(due: list[str],
                                                               tmp_path: Path) -> None:
    """The run restored from the mirror and continued elsewhere (r), mirrored back, and then
    the original machine (a), not lost after all, went on too: its run is at v23, the mirror's
    at v33 of r's history. The check of the mirror's point reads only a key the source holds,
    and v33's it does not: `ckptfs mirror a M` said "not-due, -10 new version(s)", exit 0, on
    every pass; with --latest it copied a's point into the mirror ("mirrored 23", exit 0), where
    --keep-last deleted it again in the same pass, the mirror a mix of two histories. A mirror
    never holds versions past its source's newest: that run is a conflict, nothing written."""
    a, m, r = tmp_path / "a", tmp_path / "mirror", tmp_path / "r"
    work(CheckpointStore(str(a), policy=POLICY, artifact_threshold=1024), "shared", 40,
         stop_after=10)
    assert cli("mirror", str(a), str(m), "--once", "--no-progress", "--keep-last", "2")[0] == 0
    assert cli("restore", str(m), str(r), "--no-progress")[0] == 0
    work(CheckpointStore(str(r), policy=POLICY, artifact_threshold=1024), "shared", 40,
         stop_after=5)
    code, out, err = cli("mirror", str(r), str(m), "--once", "--no-progress", "--keep-last", "2")
    assert code == 0, (out, err)
    work(CheckpointStore(str(a), policy=POLICY, artifact_threshold=1024), "shared", 40,
         stop_after=1)
    before = {p: p.read_bytes() for p in m.rglob("*") if p.is_file()}
    mirrored = CheckpointStore(str(m)).load_run("shared")
    for _ in range(2):
        code, out, err = cli("mirror", str(a), str(m), "--once", "--no-progress", "--keep-last",
                             "2", "--json", *due)
        (run,) = json.loads(out)["runs"]
        assert code == 1, (out, err)
        assert run["status"] == "conflict", run  # was not-due (or mirrored), exit 0
        assert "past the source's newest" in run["error"], run["error"]
    assert {p: p.read_bytes() for p in m.rglob("*") if p.is_file()} == before
    assert CheckpointStore(str(m)).load_run("shared") == mirrored
    assert cli("verify", str(m))[0] == 0
    assert cli("mirror", str(r), str(m), "--once", "--no-progress")[0] == 0  # r's own: fine


@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_directory_at_an_artifact_key_of_the_destination_is_named_not_blamed_on_the_source(
        command: str, tmp_path: Path) -> None:
    """A directory where the destination should receive an artifact: the exclusive create met
    it, the check of the upload found no object there, and the report said "referenced
    artifact is missing at the source", of a source that holds it intact (`verify --data`
    clean). The destination's side is named, with what is in the way."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "a", 8)
    if command == "restore":  # restore from a mirror of it
        mirror_dir, src = src, tmp_path / "mirror"
        assert cli("mirror", str(mirror_dir), str(src), "--once", "--no-progress")[0] == 0
    art = sorted((src / "artifacts").rglob("*"))[-1]
    assert art.is_file()
    (dst / art.relative_to(src)).mkdir(parents=True)
    args = ["--once"] if command == "mirror" else []
    code, out, err = cli(command, str(src), str(dst), *args, "--no-progress", "--json")
    assert code == 1, (out, err)
    (run,) = json.loads(out)["runs"]
    assert run["status"] in ("incomplete", "failed"), run
    assert "missing at the source" not in run["error"], run["error"]
    assert art.name in run["error"] and "directory" in run["error"], run["error"]
    assert cli("verify", str(src), "--data")[0] == 0


def test_garbage_past_the_mirrors_newest_point_is_named_as_damage(tmp_path: Path) -> None:
    """Garbage bytes under the next version's name in the mirror (v26 beside the source's v25):
    the pass said "not-due" exit 0 (or, once a mirror ahead was a conflict, called it another
    store's history). It is the mirror's file that does not decode: incomplete, named, kept."""
    src, dst = tmp_path / "src", tmp_path / "mirror"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), "a", 8)
    assert cli("mirror", str(src), str(dst), "--once", "--no-progress")[0] == 0
    newest = _newest_log(dst, "a")
    junk = newest.with_name(f"{int(newest.stem) + 1:012d}.ckpt")
    junk.write_bytes(b"garbage\n")
    code, out, err = cli("mirror", str(src), str(dst), "--once", "--no-progress", "--json")
    assert code == 1, (out, err)
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "incomplete", run
    assert junk.name in run["error"] and "mirror's file does not decode" in run["error"], run
    assert junk.read_bytes() == b"garbage\n"
