"""Bad input to the `ckptfs` executable is exit 2 with one line naming what is wrong, and
nothing is written: an --output that cannot be a file, a --run or --version the source does
not hold (mirror, restore). And `versions` lists every restore point it does not elide.

Each case here was found by a hostile review, where the command exited 3 ("unexpected ..."),
1 ("incomplete") or 0 (a mirror of a run that does not exist, every pass, forever).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli_commands import cli, cli_json

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus

RUN = "main"


def make_store(root: Path, versions: int, run_id: str = RUN) -> Path:
    """A run with exactly `versions` versions (journal records only, no snapshot): each is a
    restore point of the store itself."""
    store = CheckpointStore(str(root), policy=CompactionPolicy(background=False, keep_last=0))
    run = AgentRun(run_id=run_id, goal="bad input")
    for i in range(versions):
        run.add_step(Step(id=f"s{i}", title=f"step {i}"))
    store.save_run(run)
    for i in range(versions - 1):
        run.steps[f"s{i}"].status = StepStatus.COMPLETED
        run.steps[f"s{i}"].result = "ok"
        store.save_run(run)
    store.close()
    return root


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")) if root.exists() else []


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("bad-input") / "store", 3)


# ------------------------------------------------------------------------------------ export


def test_export_to_an_output_that_cannot_be_a_file_is_exit_2(store: Path, tmp_path: Path) -> None:
    before = files_under(tmp_path)
    missing = tmp_path / "no" / "such" / "dir" / "x.json"
    code, out, err = cli("export", str(store), RUN, "--output", str(missing))
    assert code == 2, err
    assert f"--output {missing}: its directory {missing.parent} does not exist" in err
    assert "unexpected" not in err and out == ""
    code, out, err = cli("export", str(store), RUN, "--output", str(tmp_path))
    assert code == 2, err
    assert f"--output {tmp_path}: is a directory" in err and out == ""
    code, doc, _ = cli_json("export", str(store), RUN, "--output", str(missing))
    assert code == 2 and doc["error"]["code"] == "usage" and str(missing) in doc["error"]["message"]
    assert files_under(tmp_path) == before  # nothing written, not even a temporary file
    # and a writable path still gets the whole document, with no temporary file left beside it
    good = tmp_path / "v2.json"
    code, _, err = cli("export", str(store), RUN, "--version", "2", "--output", str(good))
    assert code == 0, err
    assert '"version": 2' in good.read_text() and files_under(tmp_path) == [good]


def test_export_into_a_fifo_writes_in_place_and_never_replaces_it(store: Path, tmp_path: Path) -> None:
    """An --output that exists and is no regular file (a FIFO, /dev/stdout, a device) is written
    in place: the write-beside-then-rename of a file renamed a regular file over /dev/full in a
    review (as root), and reported success for a write that had no space."""
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = cli("export", str(store), RUN, "--output", str(fifo))
    reader.join(30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, not a file renamed over it
    assert got and b'"run_id": "main"' in got[0]


# ------------------------------------------------------------------------------------ mirror


def test_mirror_of_a_run_the_source_does_not_hold_is_exit_2(tmp_path: Path) -> None:
    src = make_store(tmp_path / "src", 3)
    make_store(src, 2, run_id="other")
    dst = tmp_path / "mirror"
    code, out, err = cli("mirror", str(src), str(dst), "--run", "nosuch", "--once", "--no-progress")
    assert code == 2, (out, err)
    assert f"run 'nosuch' not found in {src}" in err and "empty" not in out
    code, doc, _ = cli_json("mirror", str(src), str(dst), "--run", "nosuch", "--once")
    assert code == 2 and doc["error"]["code"] == "not-found"
    # one unknown among several: refused before anything is copied, every unknown one named
    code, _, err = cli("mirror", str(src), str(dst), "--run", RUN, "--run", "nosuch", "--run", "typo",
                       "--once", "--no-progress")
    assert code == 2 and f"runs 'nosuch', 'typo' not found in {src}" in err
    # a scheduled mirror is refused at once too, not left to mirror nothing every 5 minutes
    code, _, err = cli("mirror", str(src), str(dst), "--run", "nosuch", "--interval", "5m",
                       "--no-progress", timeout=30)
    assert code == 2 and "run 'nosuch' not found" in err
    assert not dst.exists()
    # runs it holds, repeated: each mirrored once
    code, doc, err = cli_json("mirror", str(src), str(dst), "--run", RUN, "--run", "other", "--run", RUN,
                              "--latest", "--once", "--no-progress")
    assert code == 0, err
    assert [(r["run_id"], r["status"]) for r in doc["runs"]] == [(RUN, "mirrored"), ("other", "mirrored")]


def test_mirror_of_a_whole_store_without_runs_is_fine(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "runs").mkdir(parents=True)  # a store that holds no run yet: nothing to mirror, no error
    code, doc, err = cli_json("mirror", str(src), str(tmp_path / "mirror"), "--once", "--no-progress")
    assert code == 0 and doc["ok"] and doc["runs"] == [], err


# ---------------------------------------------------------------------------------- versions


@pytest.mark.parametrize(("n", "listed"), [
    (5, "v1, v2, v3, v4, v5"),
    (6, "v1, v2, v3, v4, v5, v6"),  # was 'v1, v2, v3, v4, v5': the newest point lost, no '...'
    (7, "v1, v2, v3, v4, v5 ... v7"),
])
def test_versions_never_drops_the_newest_restore_point(tmp_path: Path, n: int, listed: str) -> None:
    root = make_store(tmp_path / "store", n)
    code, doc, _ = cli_json("versions", str(root), RUN)
    assert code == 0 and doc["restore_points"] == list(range(1, n + 1))
    code, out, err = cli("versions", str(root), RUN)
    assert code == 0, err
    assert f"{n} version(s); a restore can target {n}: {listed}\n" in out


# ----------------------------------------------------------------------------------- restore


def test_restore_of_a_run_or_version_the_mirror_does_not_hold_is_exit_2(tmp_path: Path) -> None:
    src = make_store(tmp_path / "src", 6)
    mirror = tmp_path / "mirror"
    code, _, err = cli("mirror", str(src), str(mirror), "--latest", "--once", "--no-progress")
    assert code == 0, err
    dst = tmp_path / "restored"
    code, out, err = cli("restore", str(mirror), str(dst), "--run", "nosuch", "--no-progress")
    assert code == 2, (out, err)
    assert f"run 'nosuch' not found in {mirror}" in err and "failed" not in out
    code, out, err = cli("restore", str(mirror), str(dst), "--run", RUN, "--version", "99", "--no-progress")
    assert code == 2, (out, err)
    assert (f"run {RUN!r} has no version 99 in {mirror}; a restore can target 6: "
            "v1, v2, v3, v4, v5, v6") in err
    code, doc, _ = cli_json("restore", str(mirror), str(dst), "--run", RUN, "--version", "99")
    assert code == 2 and doc["error"]["code"] == "not-found" and "version 99" in doc["error"]["message"]
    assert not dst.exists()  # nothing written
    # a version it does hold restores
    code, doc, err = cli_json("restore", str(mirror), str(dst), "--run", RUN, "--version", "4",
                              "--no-progress")
    assert code == 0 and doc["runs"][0]["version"] == 4, err


def test_show_of_a_version_the_run_does_not_have_names_the_ones_it_has(store: Path) -> None:
    """It said only "version 99 is not available"; restore's refusal names what exists."""
    code, out, err = cli("show", str(store), RUN, "--version", "99")
    assert code == 2 and out == "", err
    assert f"run {RUN!r} has no version 99" in err and "it has 3: v1, v2, v3" in err, err


def test_export_over_an_existing_file_keeps_its_permissions(store: Path, tmp_path: Path) -> None:
    """The replace-by-rename made a 0600 file 0644 (a second hostile review): an export may
    hold what its owner kept private."""
    target = tmp_path / "private.json"
    target.write_text("old")
    target.chmod(0o600)
    code, _, err = cli("export", str(store), RUN, "--output", str(target))
    assert code == 0, err
    assert (target.stat().st_mode & 0o777) == 0o600 and '"run_id"' in target.read_text()
