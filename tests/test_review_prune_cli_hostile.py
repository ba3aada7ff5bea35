"""Hostile review of `ckptfs prune` and of how the CLI reports bad option values, through the
real executable.

Found:

* One run whose files cannot be deleted (its `snap/` or `log/` folder read-only) stopped the
  whole prune with exit 2 ("not-writable"): every run after it in the listing was left
  unpruned and the report was lost. A nightly job must prune every run it can, name the run it
  could not (with the path and the permission problem) and exit 1; what it deleted of that run
  before the failure must still load (older snapshots go first).
* A bad integer option echoed the whole value: `--keep-last` with 5,000 digits wrote 5,000
  digits back (and called them "not a whole number"); one of 4,000 digits was accepted and
  printed in the table title; `verify --subset <5,000 digits>/1` was exit 3 ("internal");
  `--artifact-grace <5,000 digits>` was accepted as infinity and `--json` wrote `Infinity`,
  which is no JSON.
* `-o client_kwargs=5` (an S3 option of the wrong type) reached s3fs and was reported as an
  unreachable store; it is bad input, exit 2, naming the option and the type it takes.

Read-only folders bind even when the suite runs as root: the child drops CAP_DAC_OVERRIDE and
friends from its bounding set before exec (`_privileges.drop_dac`), so the kernel checks the
permission bits for it. That works on any filesystem, where `chattr +i` needs ext2/3/4 or
XFS and root.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _privileges import drop_dac

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus

CLI = str(Path(sys.executable).parent / "ckptfs")
RUNS = ("a", "b", "c")
# a snapshot every two versions and no automatic retention: `prune --keep-last 1` has work
DENSE = CompactionPolicy(fanout=2, max_plan=2, min_snapshot_bytes=1, keep_last=0, background=False)
LONG = "9" * 5000


def ckptfs(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
           preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """The real `ckptfs`, with no CKPTFS_* settings but `env`'s; never a traceback."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    proc = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**base, "COLUMNS": "200", **(env or {})}, preexec_fn=preexec)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Runs a, b, c, each v1..v7 with snapshots at 1, 4 and 7; every file a day old, so no
    grace of any kind keeps a superseded file. Returns the root and the newest version."""
    root = tmp_path_factory.mktemp("prune-hostile") / "store"
    with CheckpointStore(str(root), policy=DENSE) as store:
        for rid in RUNS:
            run = AgentRun(run_id=rid, goal=f"goal {rid}")
            for i in range(6):
                run.add_step(Step(id=f"s{i}", title=f"step {i}"))
            newest = store.save_run(run)
            for i in range(6):
                step = run.steps[f"s{i}"]
                step.status, step.result = StepStatus.COMPLETED, f"{rid}-{i}"
                newest = store.commit(run, [step])
    day_ago = time.time() - 86400
    for p in root.rglob("*"):
        os.utime(p, (day_ago, day_ago))
    return root, newest


@pytest.fixture
def store(pristine: tuple[Path, int], tmp_path: Path) -> Iterator[Path]:
    """This test's copy of the store; write permission given back afterwards."""
    root = tmp_path / "store"
    shutil.copytree(pristine[0], root)
    yield root
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def files(root: Path, run_id: str, folder: str) -> list[str]:
    return sorted(p.name for p in (root / "runs" / run_id / folder).iterdir())


def newest_loaded(root: Path, run_id: str) -> tuple[int, int]:
    """What a load in this process gets: the version and the steps completed."""
    with CheckpointStore(str(root)) as st:
        run = st.load_run(run_id)
        assert run is not None and st.last_load is not None
        return st.last_load.version, run.completed_count


@pytest.mark.parametrize("folder", ["snap", "log"])
def test_prune_goes_on_past_a_run_it_cannot_delete_from(store: Path, pristine: tuple[Path, int],
                                                       folder: str, tmp_path: Path) -> None:
    """Run b's `snap/` (nothing of b can go) or `log/` (its old snapshots and deltas go first,
    then the journal records fail) is read-only: a and c are pruned all the same, b is named
    with the path and the permission problem, exit 1; every run still loads its newest version
    and verify is clean."""
    newest = pristine[1]
    (store / "runs" / "b" / folder).chmod(0o555)
    if folder == "snap":  # the table and the warnings
        proc = ckptfs("prune", store, "--keep-last", "1", cwd=tmp_path, preexec=drop_dac)
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
        warning = [line for line in proc.stderr.splitlines() if "'b'" in line]
        assert len(warning) == 1 and f"runs/b/{folder}/" in warning[0], proc.stderr
        assert "Permission denied" in warning[0] and "nothing of it was removed" in warning[0]
    else:  # the JSON report lists the failed run, what went of it and what stays
        proc = ckptfs("prune", store, "--keep-last", "1", "--json", cwd=tmp_path, preexec=drop_dac)
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
        doc = json.loads(proc.stdout)
        assert doc["ok"] is False and [f["run"] for f in doc["failed"]] == ["b"], doc["failed"]
        failed = doc["failed"][0]
        assert failed["code"] == "not-writable" and f"runs/b/{folder}/" in failed["reason"]
        assert failed["deleted"] and all("/log/" not in k for k in failed["deleted"])
        assert failed["not_deleted"] and all("/log/" in k for k in failed["not_deleted"])
        assert any(r["run_id"] == "b" and r["deleted"] == failed["deleted"] for r in doc["runs"])
    for rid in ("a", "c"):  # pruned although b, between them, failed
        assert files(store, rid, "snap") == [f"{newest:012d}.ckpt"], rid
        assert files(store, rid, "delta") == []
    b_snaps = files(store, "b", "snap")
    assert b_snaps == ([f"{newest:012d}.ckpt"] if folder == "log" else files(pristine[0], "b", "snap"))

    again = ckptfs("prune", store, "--keep-last", "1", cwd=tmp_path, preexec=drop_dac)
    # a and c have nothing left to prune, b fails again: still one run's problem, not a
    # read-only store (exit 2)
    assert again.returncode == 1 and "run 'b' not pruned" in again.stderr, again.stderr

    assert ckptfs("verify", store, cwd=tmp_path).returncode == 0
    for rid in RUNS:
        assert newest_loaded(store, rid) == (newest, 6), rid


def test_a_store_read_only_as_a_whole(store: Path, tmp_path: Path) -> None:
    """Every folder read-only: a dry run reads and says what it would remove (exit 0); a prune
    is the one error a read-only store is everywhere (exit 2, not-writable), its JSON listing
    each run that failed, and nothing is deleted."""
    before = sorted(str(p) for p in store.rglob("*"))
    for p in [store, *store.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    dry = ckptfs("prune", store, "--keep-last", "1", "--dry-run", "--json", cwd=tmp_path, preexec=drop_dac)
    assert dry.returncode == 0 and all(r["deleted"] for r in json.loads(dry.stdout)["runs"]), dry.stderr
    proc = ckptfs("prune", store, "--keep-last", "1", "--json", cwd=tmp_path, preexec=drop_dac)
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["error"]["code"]) == (2, "not-writable"), proc.stderr
    assert [f["run"] for f in doc["failed"]] == list(RUNS) and "Permission denied" in doc["error"]["message"]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(str(p) for p in store.rglob("*")) == before


BAD_VALUES: list[tuple[str, list[str], str]] = [
    # (case, arguments after the store, the option the message must name)
    ("keep-last-5000-digits", ["prune", "{store}", "--keep-last", LONG, "--dry-run"], "--keep-last"),
    ("keep-last-negative-5000", ["prune", "{store}", "--keep-last", "-" + LONG, "--dry-run"], "--keep-last"),
    ("keep-last-13-digits", ["prune", "{store}", "--keep-last", "1" + "0" * 12, "--dry-run"], "--keep-last"),
    ("keep-last-minus-one", ["prune", "{store}", "--keep-last", "-1", "--dry-run"], "--keep-last"),
    ("artifact-grace", ["prune", "{store}", "--keep-last", "1", "--artifact-grace", LONG, "--dry-run",
                        "--json"], "--artifact-grace"),
    ("subset", ["verify", "{store}", "--subset", LONG + "/1"], "--subset"),
    ("version", ["show", "{store}", "a", "--version", LONG], "--version"),
    ("every-n", ["mirror", "{store}", "{tmp}/mirror", "--once", "--every-n", LONG], "--every-n"),
    ("interval", ["mirror", "{store}", "{tmp}/mirror", "--interval", LONG + "x"], "--interval"),
    ("step", ["show", "{store}", "a", "--step", "x" * 5000], "no step"),
]


@pytest.mark.parametrize(("case", "argv", "named"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_a_bad_option_value_is_named_and_not_echoed_whole(case: str, argv: list[str], named: str,
                                                          pristine: tuple[Path, int], tmp_path: Path) -> None:
    """Exit 2 naming the option; the value quoted at most 40 characters long (and its length);
    nothing written."""
    args = [a.format(store=pristine[0], tmp=tmp_path) for a in argv]
    proc = ckptfs(*args, cwd=tmp_path)
    assert proc.returncode == 2, (case, proc.returncode, proc.stderr[-300:])
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and named in error[0], proc.stderr[-500:]
    assert len(error[0]) < 300 and "9" * 41 not in error[0] and "x" * 41 not in error[0], error[0][:400]
    if argv[-1] == "--json":  # the document says the same, and is JSON
        assert json.loads(proc.stdout)["error"]["code"] == "usage"
    assert not (tmp_path / "mirror").exists()


def test_the_version_bound_is_the_one_a_key_holds(pristine: tuple[Path, int], tmp_path: Path) -> None:
    """12 digits is a version a store may hold (this one does not: not-found); 13 is no version
    (usage)."""
    ok = ckptfs("show", pristine[0], "a", "--version", "9" * 12, "--json", cwd=tmp_path)
    assert (ok.returncode, json.loads(ok.stdout)["error"]["code"]) == (2, "not-found")
    bad = ckptfs("show", pristine[0], "a", "--version", "1" + "0" * 12, "--json", cwd=tmp_path)
    assert (bad.returncode, json.loads(bad.stdout)["error"]["code"]) == (2, "usage")


def _error(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(proc.stdout)["error"])


CLOSED = '"endpoint_url": "http://127.0.0.1:9"'  # a closed port: reaching it says unreachable


@pytest.mark.parametrize(("argv", "secret", "option", "wants"), [
    (["runs", "s3://ckptfs-review/agents", "-o", "client_kwargs=5"], False, "client_kwargs", "a table"),
    (["runs", "s3://ckptfs-review/agents", "-o", "anon=yes"], False, "anon", "true or false"),
    (["runs", "s3://ckptfs-review/agents"], True, "secret", "a string"),
    (["mirror", "{store}", "s3://ckptfs-review/mirror", "--once", "--to-option", "config_kwargs=5"], False,
     "config_kwargs", "a table"),
    (["restore", "s3://ckptfs-review/mirror", "{tmp}/restored", "--from-option", "client_kwargs=x"], False,
     "client_kwargs", "a table"),
], ids=["client_kwargs", "anon", "secret-from-env", "mirror-to", "restore-from"])
def test_a_storage_option_of_the_wrong_type_is_bad_input(argv: list[str], secret: bool, option: str,
                                                         wants: str, pristine: tuple[Path, int],
                                                         tmp_path: Path) -> None:
    """Refused before any connection, naming the option and what it takes, never its value:
    exit 2, code usage, where it was "unreachable" (s3fs failed on it at the first request)."""
    args = [a.format(store=pristine[0], tmp=tmp_path) for a in argv]
    extra = ', "secret": ["hunter2-s3cret"]' if secret else ""
    proc = ckptfs(*args, "--json", cwd=tmp_path,
                  env={"CKPTFS_STORAGE_OPTIONS": "{" + CLOSED + extra + "}",
                       "CKPTFS_MIRROR_STORAGE_OPTIONS": "{" + CLOSED + "}"})
    error = _error(proc)
    assert (proc.returncode, error["code"]) == (2, "usage"), (proc.returncode, error)
    assert f"storage option {option} must be {wants}" in error["message"], error["message"]
    assert "hunter2" not in proc.stdout + proc.stderr
    assert not (tmp_path / "restored").exists()


def test_a_numeric_looking_string_option_stays_a_string(tmp_path: Path) -> None:
    """`-o profile=2024` is the profile named 2024: kept a string, not made an int s3fs
    cannot use."""
    proc = ckptfs("config", "show", "-o", "profile=2024", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["store"]["options"] == {"profile": "2024"}
