"""Issue 11, hostile entries in a local store: links, FIFOs, odd names, unreadable and read-only
files. A store directory is shared with whatever else runs on the machine; none of these may
make ckptfs act outside the store, hang, or stop a whole command.

Everything that could hang or run out of memory runs in a child process with a timeout (and
an address-space cap). Unreadable and read-only files are made real even when the tests run as
root: the child drops CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER from its bounding
set before exec, so the kernel checks the permission bits for it (root is then just the owner
of files whose mode says no). As another user the bits apply anyway and nothing is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _privileges import drop_dac

from ckptfs import AgentRun, CheckpointStore, CkptfsError, CompactionPolicy, Step, StepStatus

TIMEOUT = 20.0
CHILD_MEMORY = 1 << 30  # an address-space cap: enough for the CLI, not for /dev/zero
# Snapshots often and no automatic retention, so `prune --keep-last 1` has work to do.
DENSE = CompactionPolicy(fanout=2, max_plan=2, min_snapshot_bytes=1, keep_last=0, background=False)

_LOAD = """
import json, sys
from ckptfs import CheckpointStore
store = CheckpointStore(sys.argv[1])
run = store.load_run(sys.argv[2])
print(json.dumps({"version": store.last_load.version, "goal": run.goal,
                  "completed": run.completed_count}))
"""


def _cli_path() -> str:
    """The real console script of this venv (the CLI's module path is being moved)."""
    script = Path(sys.executable).parent / "ckptfs"
    found = str(script) if script.exists() else shutil.which("ckptfs")
    assert found, "the ckptfs console script is not installed"
    return found



def _cap_memory() -> None:
    """preexec_fn: reading /dev/zero without bound fails fast instead of eating the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def _env() -> dict[str, str]:
    """The test's environment with a wide console, so rich does not fold names in the output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    env["COLUMNS"] = "4000"
    return env


def _command(args: list[str]) -> list[str]:
    """A CLI command line, or a child load_run when args start with 'load'."""
    if args[0] == "load":
        return [sys.executable, "-c", _LOAD, *args[1:]]
    return [_cli_path(), *args]


def _run(args: list[str], cwd: Path,
         preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one child with the timeout; a child that does not finish fails the test by name."""
    try:
        return subprocess.run(_command(args), capture_output=True, text=True, timeout=TIMEOUT,
                              cwd=cwd, env=_env(), preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args[:2])} did not finish within {TIMEOUT:.0f} s")


def _run_all(commands: dict[str, list[str]], cwd: Path,
             preexec: Callable[[], None] | None = None) -> dict[str, subprocess.CompletedProcess[str] | None]:
    """Run children side by side under one deadline: None for each that had to be killed."""
    procs = {name: subprocess.Popen(_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=cwd, env=_env(), preexec_fn=preexec)
             for name, args in commands.items()}
    deadline = time.monotonic() + TIMEOUT
    out: dict[str, subprocess.CompletedProcess[str] | None] = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[name] = None
        else:
            out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


def _crash(proc: subprocess.CompletedProcess[str]) -> str | None:
    """The last line of a traceback a child printed, if it printed one."""
    if "Traceback" not in proc.stderr:
        return None
    return proc.stderr.strip().splitlines()[-1][:200]


def _make_store(root: Path, run_id: str, steps: int = 6, tag: str = "ours",
                big: bool = False) -> int:
    """A local store with one run and several snapshots; its newest version."""
    store = CheckpointStore(str(root), policy=DENSE)
    try:
        run = AgentRun(run_id=run_id, goal=f"goal of {tag}")
        for i in range(steps):
            run.add_step(Step(id=f"s{i}", title=f"step {i}"))
        version = store.save_run(run)
        for i in range(steps):
            step = run.steps[f"s{i}"]
            step.status = StepStatus.COMPLETED
            step.result = ("x" * 70_000 if big else "") + f"{tag}-{i}"
            version = store.commit(run, [step])
        return version
    finally:
        store.close()


def _tree(root: Path) -> dict[str, str]:
    """Everything under root without following links: names, kinds, contents' sha256."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"link:{os.readlink(p)}"
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _snaps(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "snap").iterdir())


def _load(url: Path, run_id: str) -> tuple[AgentRun, int]:
    store = CheckpointStore(str(url))
    try:
        run = store.load_run(run_id)
        assert run is not None and store.last_load is not None
        return run, store.last_load.version
    finally:
        store.close()


# ------------------------------------------------------------------ 5. links out of the store


def test_prune_does_not_follow_a_run_link_into_another_store(tmp_path: Path) -> None:
    """runs/victim links to another store's run: `prune --keep-last 1` deleted 13 of its
    files. Retention is for this store's own files only."""
    _make_store(tmp_path / "other", "victim", big=True)
    _make_store(tmp_path / "mine", "good")
    (tmp_path / "mine" / "runs" / "victim").symlink_to(tmp_path / "other" / "runs" / "victim")
    before = _tree(tmp_path / "other")
    proc = _run(["prune", str(tmp_path / "mine"), "--keep-last", "1", "--artifact-grace", "0s"], tmp_path)
    lost = sorted(set(before) - set(_tree(tmp_path / "other")))
    assert not lost, f"prune deleted {len(lost)} file(s) of the other store, e.g. {lost[:3]}"
    assert _crash(proc) is None, _crash(proc)


def test_commit_to_a_linked_run_does_not_write_into_another_store(tmp_path: Path) -> None:
    """A load through runs/victim returned the other store's state, and the next commit wrote
    its record there. Refusing, or starting the run afresh inside this store, are both fine."""
    _make_store(tmp_path / "other", "victim", tag="theirs")
    (tmp_path / "mine" / "runs").mkdir(parents=True)
    (tmp_path / "mine" / "runs" / "victim").symlink_to(tmp_path / "other" / "runs" / "victim")
    before = _tree(tmp_path / "other")
    store = CheckpointStore(str(tmp_path / "mine"))
    try:
        try:
            run = store.load_run("victim")
            if run is None:
                run = AgentRun(run_id="victim", goal="ours")
                run.add_step(Step(id="s0", title="step 0"))
                store.save_run(run)
            else:
                step = run.steps["s0"]
                step.result = "written by mine"
                store.commit(run, [step])
        except (CkptfsError, OSError, ValueError) as exc:  # a refusal is fine
            assert str(exc)
    finally:
        store.close()
    after = _tree(tmp_path / "other")
    assert after == before, f"the other store changed: new {sorted(set(after) - set(before))[:3]}"


def _foreign_artifact(shared: Path) -> Path:
    """An old artifact of someone else's, in a shared directory laid out like artifacts/."""
    data = b"someone else's artifact"
    sha = hashlib.sha256(data).hexdigest()
    path = shared / "sha256" / sha[:2] / sha
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    old = time.time() - 7 * 86400
    os.utime(path, (old, old))
    return path


@pytest.mark.parametrize("linked", ["artifacts", "artifacts/sha256", "artifacts/sha256/xx"])
def test_prune_does_not_collect_artifacts_through_a_link(linked: str, tmp_path: Path) -> None:
    """artifacts/ (or artifacts/sha256) linked to a shared directory: prune collected every
    'unreferenced' file in it. Nothing outside the store may be deleted."""
    shared = tmp_path / "shared"
    foreign = _foreign_artifact(shared)
    mine = tmp_path / "mine"
    _make_store(mine, "good")
    if linked == "artifacts":
        (mine / "artifacts").symlink_to(shared)
    elif linked == "artifacts/sha256":
        (mine / "artifacts").mkdir()
        (mine / "artifacts" / "sha256").symlink_to(shared / "sha256")
    else:
        (mine / "artifacts" / "sha256").mkdir(parents=True)
        (mine / "artifacts" / "sha256" / foreign.parent.name).symlink_to(foreign.parent)
    before = _tree(shared)
    proc = _run(["prune", str(mine), "--keep-last", "1", "--artifact-grace", "0s"], tmp_path)
    after = _tree(shared)
    assert after == before, f"prune deleted outside the store: {sorted(set(before) - set(after))}"
    assert _crash(proc) is None, _crash(proc)


def test_restore_does_not_write_through_a_linked_run_dir(tmp_path: Path) -> None:
    """The destination's runs/good links elsewhere: restore published the run's files there."""
    _make_store(tmp_path / "mine", "good")
    mirror = _run(["mirror", str(tmp_path / "mine"), str(tmp_path / "mirror"), "--latest",
                   "--no-progress"], tmp_path)
    assert mirror.returncode == 0, mirror.stderr[-300:]
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "dest" / "runs").mkdir(parents=True)
    (tmp_path / "dest" / "runs" / "good").symlink_to(outside)
    proc = _run(["restore", str(tmp_path / "mirror"), str(tmp_path / "dest"), "--no-progress"], tmp_path)
    written = sorted(_tree(outside))
    assert not written, f"restore wrote outside the destination: {written[:4]}"
    assert _crash(proc) is None, _crash(proc)


def test_linked_snapshot_of_another_store_is_not_served(tmp_path: Path) -> None:
    """A snapshot file that links to another store's snapshot (same run id, newer version) was
    loaded as this run's state. It is not ours: load must ignore it and verify must name it."""
    ours = _make_store(tmp_path / "mine", "good", steps=6, tag="ours")
    theirs = _make_store(tmp_path / "other", "good", steps=12, tag="theirs")
    link = tmp_path / "mine" / "runs" / "good" / "snap" / f"{theirs:012d}.ckpt"
    link.symlink_to(tmp_path / "other" / "runs" / "good" / "snap" / f"{theirs:012d}.ckpt")
    run, version = _load(tmp_path / "mine", "good")
    assert (run.goal, version) == ("goal of ours", ours), (
        f"load served the other store's state: {run.goal!r} v{version} (ours is v{ours})")
    proc = _run(["verify", str(tmp_path / "mine"), "--json"], tmp_path)
    keys = [f.get("key") or "" for f in json.loads(proc.stdout)["findings"]]
    assert proc.returncode == 1 and f"runs/good/snap/{theirs:012d}.ckpt" in keys, (
        f"verify exit {proc.returncode} does not name the linked snapshot; findings on {keys}")


# ------------------------------------------------------------------ 6. FIFOs and /dev/zero


def test_fifo_named_as_snapshot_hangs_nothing(tmp_path: Path) -> None:
    """A FIFO at runs/<id>/snap/<12 digits>.ckpt: opening it for reading blocks until a writer
    comes, which never happens. Every reader must finish (it is not a regular file)."""
    url = tmp_path / "store"
    newest = _make_store(url, "good")
    os.mkfifo(url / "runs" / "good" / "snap" / "000000000099.ckpt")
    results = _run_all({
        "load_run": ["load", str(url), "good"],
        "verify": ["verify", str(url)],
        "runs": ["runs", str(url)],
        "prune": ["prune", str(url), "--keep-last", "1"],
        "show": ["show", str(url), "good"],
    }, tmp_path)
    hung = sorted(name for name, proc in results.items() if proc is None)
    assert not hung, f"hung on a FIFO snapshot (killed after {TIMEOUT:.0f} s): {hung}"
    crashed = {name: _crash(p) for name, p in results.items() if p is not None and _crash(p)}
    assert not crashed, crashed
    loaded = results["load_run"]
    assert loaded is not None and json.loads(loaded.stdout)["version"] == newest


def test_link_to_dev_zero_named_as_record_is_not_read_without_bound(tmp_path: Path) -> None:
    """log/<12 digits>.ckpt -> /dev/zero: a reader that reads the whole file never stops (or,
    under a 2 GiB address-space cap, dies of MemoryError). Every reader must finish cleanly."""
    url = tmp_path / "store"
    newest = _make_store(url, "good")
    (url / "runs" / "good" / "log" / "000000000099.ckpt").symlink_to("/dev/zero")
    results = _run_all({
        "load_run": ["load", str(url), "good"],
        "verify": ["verify", str(url)],
        "runs": ["runs", str(url)],
        "show": ["show", str(url), "good"],
    }, tmp_path, preexec=_cap_memory)
    hung = sorted(name for name, proc in results.items() if proc is None)
    assert not hung, f"did not finish within {TIMEOUT:.0f} s: {hung}"
    bad = {name: _crash(p) or "MemoryError" for name, p in results.items()
           if p is not None and (_crash(p) or "MemoryError" in p.stderr)}
    assert not bad, f"read /dev/zero without bound: {bad}"
    loaded = results["load_run"]
    assert loaded is not None and json.loads(loaded.stdout)["version"] == newest


# ------------------------------------------------------------ 7. one odd entry, whole command


ODD_NAMES = {"netapp-snapshot-dir": ".snapshot", "name-255-chars": "a" * 255}


@pytest.mark.parametrize("odd", list(ODD_NAMES), ids=list(ODD_NAMES))
def test_odd_entry_under_runs_does_not_stop_prune(odd: str, tmp_path: Path) -> None:
    """runs/.snapshot (NetApp) or a 255-character name is not a run id ckptfs would make; prune
    exited 2 for the whole store. It must prune the good run and report the odd entry."""
    name = ODD_NAMES[odd]
    url = tmp_path / "store"
    _make_store(url, "good")
    (url / "runs" / name).mkdir()
    assert len(_snaps(url / "runs" / "good")) > 1
    proc = _run(["prune", str(url), "--keep-last", "1", "--superseded-grace", "0"], tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), f"prune exit {proc.returncode}: {proc.stderr.strip()[:200]}"
    assert len(_snaps(url / "runs" / "good")) == 1, "the good run was not pruned"
    assert name[:40] in output, "the odd entry is not reported"


@pytest.mark.parametrize("odd", list(ODD_NAMES), ids=list(ODD_NAMES))
def test_odd_entry_under_runs_does_not_stop_mirror(odd: str, tmp_path: Path) -> None:
    """The same odd entry made `ckptfs mirror` exit 2 with nothing mirrored: the good run must
    reach the mirror (and load there), the odd entry be reported."""
    name = ODD_NAMES[odd]
    url = tmp_path / "store"
    newest = _make_store(url, "good")
    (url / "runs" / name).mkdir()
    proc = _run(["mirror", str(url), str(tmp_path / "mirror"), "--latest", "--no-progress"], tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), f"mirror exit {proc.returncode}: {proc.stderr.strip()[:200]}"
    run, version = _load(tmp_path / "mirror", "good")
    assert (version, run.completed_count) == (newest, 6)
    assert name[:40] in output, "the odd entry is not reported"


@pytest.fixture
def restore_permissions(tmp_path: Path) -> Iterator[None]:
    """Give write and read permission back after a test, so tmp_path can be cleaned up."""
    yield
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR)


@pytest.mark.parametrize("kind", ["dangling-link", "unreadable"])
@pytest.mark.usefixtures("restore_permissions")
def test_unreadable_snapshot_falls_back(kind: str, tmp_path: Path) -> None:
    """A snapshot that cannot be read (a dangling link; mode 000 for a process the bits bind)
    raised a raw FileNotFoundError / PermissionError out of load_run and a traceback out of
    `ckptfs show`. It is one bad file: load falls back past it, as for a corrupt one."""
    url = tmp_path / "store"
    newest = _make_store(url, "good")
    if kind == "dangling-link":
        (url / "runs" / "good" / "snap" / "000000000099.ckpt").symlink_to(tmp_path / "gone.ckpt")
    else:
        _snaps(url / "runs" / "good")[-1].chmod(0)
    loaded = _run(["load", str(url), "good"], tmp_path, preexec=drop_dac)
    assert loaded.returncode == 0, f"load_run raised: {_crash(loaded)}"
    assert json.loads(loaded.stdout)["version"] == newest
    shown = _run(["show", str(url), "good"], tmp_path, preexec=drop_dac)
    assert "Traceback" not in shown.stderr, f"ckptfs show crashed: {_crash(shown)}"
    assert shown.returncode == 0 and "ours-5" in shown.stdout, shown.stderr[-300:]


# --------------------------------------------------------------------- 8. read-only stores


def _read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            (Path(dirpath) / name).chmod(0o444)
        for name in dirnames:
            (Path(dirpath) / name).chmod(0o555)
    root.chmod(0o555)


@pytest.fixture
def ro_store(tmp_path: Path, restore_permissions: None) -> tuple[Path, int]:
    """A store with prunable files, made read-only for every child run with drop_dac."""
    url = tmp_path / "ro"
    newest = _make_store(url, "good")
    _read_only(url)
    return url, newest


def test_prune_on_read_only_store_is_one_clear_error(ro_store: tuple[Path, int], tmp_path: Path) -> None:
    """Writes are refused correctly, but prune printed a PermissionError traceback. It must be
    exit 2 and one line naming the store or the permission, and nothing deleted."""
    url, _ = ro_store
    before = _tree(url)
    proc = _run(["prune", str(url), "--keep-last", "1"], tmp_path, preexec=drop_dac)
    assert "Traceback" not in proc.stderr, f"prune crashed: {_crash(proc)}"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, f"exit {proc.returncode}, stderr {lines[:3]}"
    assert str(url) in lines[0] or "ermission" in lines[0], lines[0]
    assert _tree(url) == before


def test_mirror_from_read_only_source(ro_store: tuple[Path, int], tmp_path: Path) -> None:
    """Reading a store needs no write permission: mirror refused a read-only SOURCE with
    "no write permission". The mirror (writable) must get the run, loadable there."""
    url, newest = ro_store
    proc = _run(["mirror", str(url), str(tmp_path / "mirror"), "--latest", "--no-progress"], tmp_path,
                preexec=drop_dac)
    assert proc.returncode == 0, f"mirror exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    run, version = _load(tmp_path / "mirror", "good")
    assert (version, run.completed_count) == (newest, 6)


@pytest.mark.parametrize("command", ["verify", "runs", "show"])
def test_read_commands_work_on_read_only_store(command: str, ro_store: tuple[Path, int],
                                               tmp_path: Path) -> None:
    """verify, runs and show only read: a read-only store is an ordinary store for them."""
    url, _ = ro_store
    args = [command, str(url)] + (["good"] if command == "show" else [])
    proc = _run(args, tmp_path, preexec=drop_dac)
    assert "Traceback" not in proc.stderr, f"{command} crashed: {_crash(proc)}"
    assert proc.returncode == 0, f"{command} exit {proc.returncode}: {proc.stderr.strip()[-200:]}"


def test_mirror_reports_an_artifact_behind_a_link_per_run_and_goes_on(tmp_path: Path) -> None:
    """artifacts/ linked out of the store: the artifact is unreadable (never followed), so the
    run's point is incomplete, named in the report, and the pass goes on with the other runs
    instead of stopping with no table."""
    from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
    from ckptfs.replication.mirror import mirror

    url = tmp_path / "store"
    store = CheckpointStore(str(url), artifact_threshold=1024)
    for rid, big in (("big", True), ("small", False)):
        run = AgentRun(run_id=rid, goal="g")
        run.add_step(Step(id="a", title="a"))
        store.save_run(run)
        step = run.steps["a"]
        step.status, step.result = StepStatus.COMPLETED, ("x" * 5000 if big else "ok")
        store.commit(run, [step])
    store.close()
    outside = tmp_path / "outside"
    (url / "artifacts").rename(outside)
    (url / "artifacts").symlink_to(outside, target_is_directory=True)
    report = mirror(str(url), str(tmp_path / "mirror"), latest=True)
    rows = {r.run_id: r for r in report.runs}
    assert rows["small"].status == "mirrored", rows["small"]
    assert rows["big"].status == "incomplete" and rows["big"].missing, rows["big"]
    assert not report.ok
