"""Hostile entries in a local store (issue 11, items 5-8): links, FIFOs, /dev/zero, no access.

DESIGN.md: "Only regular files inside the store root are read or written; links are never
followed out of it." Each test plants something where a file or directory of ours should be,
fingerprints every directory outside the store (sha256 of each file, each link's target) before
and after, and runs the real code in subprocesses with a timeout (a FIFO must not hang anything)
and a memory cap (a link to /dev/zero must not eat the machine): library loads and commits, and
the real `ckptfs` executable (`verify`, `runs`, `show`, `prune`, `restore`).

The unprivileged reader: the interpreter here lives under /root (0700), so a child that
setuid()s to nobody cannot even exec Python. Instead the child stays uid 0 but drops every
capability before exec (PR_CAPBSET_DROP on the whole bounding set; root's execve then grants
none): without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER the kernel checks mode bits
exactly as for any user, so `chmod 000` blocks reads, and a store owned by another uid with
0755/0644 is read-only to it.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import pickle
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ckptfs.errors as errors
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.format.keys import parse_run_key
from ckptfs.storage.local import LocalStorage

CKPTFS = Path(sys.executable).parent / "ckptfs"
TIMEOUT = 20.0  # per subprocess: a FIFO that blocks a reader blocks it forever
MEMORY_CAP = 2 << 30  # address space of each child: reading /dev/zero fails fast, never OOMs the box
POLICY = CompactionPolicy(fanout=4, max_plan=5, min_snapshot_bytes=10**9, keep_last=0, background=False)
N = 30  # steps, one commit each: several snapshots, deltas and journal records
OTHER_UID = 12345  # owns the read-only store: neither the test nor the unprivileged reader
_PR_CAPBSET_DROP = 24


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def area() -> Iterator[Path]:
    """A fresh directory every user may traverse (pytest's tmp_path can sit under 0700 parents)."""
    d = Path(tempfile.mkdtemp(prefix="ckptfs-hostile-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def build(root: Path, run_id: str = "c", result: str = "ours", n: int = N) -> list[int]:
    """A store at `root` with one run of `n` committed steps (results `<result><i>`)."""
    store = CheckpointStore(str(root), policy=POLICY)
    try:
        run = AgentRun(run_id=run_id, goal="g")
        for i in range(n):
            run.add_step(Step(id=f"s{i}", title="t"))
        store.save_run(run)
        done = []
        for i in range(n):
            s = run.steps[f"s{i}"]
            s.status, s.result = StepStatus.COMPLETED, f"{result}{i}"
            done.append(store.commit(run, [s]))
        return done
    finally:
        store.close()


def newest(root: Path, kind: str, run_id: str = "c") -> str:
    """Key of the run's newest file of `kind` (log, delta, snap)."""
    keys = []
    for dirpath, _dirs, files in os.walk(root / "runs" / run_id):
        for name in files:
            key = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            rf = parse_run_key(key)
            if rf is not None and rf.kind == kind:
                keys.append(rf)
    return max(keys).key


def fingerprint(root: Path) -> dict[str, str]:
    """Every entry below `root` (not following links): file sha256 and mode, link targets."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link -> " + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[rel] = f"file {stat.S_IMODE(st.st_mode):o} {hashlib.sha256(f.read()).hexdigest()}"
            else:
                out[rel] = f"{stat.S_IFMT(st.st_mode):o} {stat.S_IMODE(st.st_mode):o}"
    return out


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _unprivileged() -> None:
    """preexec_fn: drop the whole capability bounding set, so the exec'd child has none."""
    _limits()
    libc = ctypes.CDLL(None, use_errno=True)
    cap = 0
    while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1  # EINVAL past the last capability the kernel knows


def _run(argv: list[str], unprivileged: bool) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd="/",
                          preexec_fn=_unprivileged if unprivileged else _limits,
                          env={**os.environ, "COLUMNS": "200"})
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    assert "MemoryError" not in both, both
    return proc


def cli(*args: str | Path, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    """The real `ckptfs` executable; no traceback, whatever the exit code."""
    return _run([str(CKPTFS), *map(str, args)], unprivileged)


_PRELUDE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
def report(doc):
    print(json.dumps(doc))
def failure(exc):
    return {"error": type(exc).__name__, "message": str(exc)}
"""

LOAD = """
run = CheckpointStore(sys.argv[1]).load_run(sys.argv[2])
report(None if run is None else {"completed": run.completed_count,
                                 "results": sorted(s.result or "" for s in run.steps.values())})
"""

COMMIT = """
store = CheckpointStore(sys.argv[1], policy=CompactionPolicy(background=False, keep_last=0))
run = AgentRun(run_id=sys.argv[2], goal="new")
run.add_step(Step(id="a", title="t"))
try:
    store.save_run(run)
    s = run.steps["a"]
    s.status, s.result = StepStatus.COMPLETED, "x" * int(sys.argv[3])
    store.commit(run, [s])
except Exception as exc:
    report(failure(exc))
else:
    report({"ok": True})
"""


def py(script: str, *args: str | Path, unprivileged: bool = False) -> Any:
    """Run `script` (after the prelude) in a child; its last stdout line is JSON."""
    proc = _run([sys.executable, "-c", _PRELUDE + script, *map(str, args)], unprivileged)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def findings(proc: subprocess.CompletedProcess[str]) -> dict[str, set[str]]:
    """verify --json: finding codes by key."""
    out: dict[str, set[str]] = {}
    for f in json.loads(proc.stdout)["findings"]:
        out.setdefault(f["key"] or "", set()).add(f["code"])
    return out


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without log records (the CLI logs as `LEVEL name: message`)."""
    levels = ("DEBUG ", "INFO ", "WARNING ", "ERROR ", "CRITICAL ")
    return [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(levels)]


def operate(store: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """What an operator runs on a store, each command bounded by TIMEOUT."""
    return {"verify": cli("verify", store, "--json"), "runs": cli("runs", store, "--json"),
            "show": cli("show", store, "c"),
            "prune": cli("prune", store, "--keep-last", "1", "--json")}


# ------------------------------------------------------------------ 5: links are not ours


def test_a_run_linked_to_another_store_is_not_read_written_or_pruned(area: Path) -> None:
    other, ours = area / "other", area / "ours"
    build(other, "victim", result="theirs")
    build(ours, "good")
    (ours / "runs" / "victim").symlink_to(other / "runs" / "victim")
    before = fingerprint(other)

    runs = cli("runs", ours, "--json")
    assert runs.returncode == 0 and [r["run_id"] for r in json.loads(runs.stdout)["runs"]] == ["good"]
    show = cli("show", ours, "victim")
    lines = error_lines(show)
    assert show.returncode == 2 and len(lines) == 1 and f"run 'victim' not found in {ours}" in lines[0]
    verify = cli("verify", ours, "--json")
    assert verify.returncode == 1 and "stray" in findings(verify)["runs/victim"]
    prune = cli("prune", ours, "--keep-last", "1", "--json")
    assert prune.returncode in (0, 1)
    assert all("victim" not in key for key in json.loads(prune.stdout)["runs"][0]["deleted"])
    got = py(COMMIT, ours, "victim", 10)
    assert got["error"] == "StoreNotWritableError" and "runs/victim" in got["message"]
    assert str(ours) in got["message"]

    assert fingerprint(other) == before
    assert py(LOAD, ours, "good")["completed"] == N  # ours is intact after all of it


def test_a_linked_artifacts_directory_is_not_collected_or_written(area: Path) -> None:
    shared, ours = area / "shared", area / "ours"
    old = shared / "sha256" / "ab" / ("ab" + "0" * 62)  # looks like an unreferenced artifact
    old.parent.mkdir(parents=True)
    old.write_bytes(b"someone else's bytes")
    three_days_ago = time.time() - 3 * 86400
    os.utime(old, (three_days_ago, three_days_ago))
    build(ours, "c")
    (ours / "artifacts").symlink_to(shared)
    before = fingerprint(shared)

    prune = cli("prune", ours, "--keep-last", "1", "--json")
    assert prune.returncode in (0, 1) and json.loads(prune.stdout)["artifacts"]["deleted"] == []
    big = py(COMMIT, ours, "big", 200_000)  # a result over 64 KiB goes to artifacts/ first
    assert big["error"] == "StoreNotWritableError" and "'artifacts' is a symbolic link" in big["message"]
    verify = cli("verify", ours, "--json")
    assert verify.returncode == 1 and "stray" in findings(verify)["artifacts"]

    assert fingerprint(shared) == before


def test_restore_never_writes_through_a_link_in_the_destination(area: Path) -> None:
    src, mirror, dst, outside = area / "src", area / "mirror", area / "dst", area / "outside"
    build(src, "good")
    assert cli("mirror", src, mirror, "--latest").returncode == 0
    (dst / "runs").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("not yours")
    (dst / "runs" / "good").symlink_to(outside)
    before = fingerprint(outside)

    restore = cli("restore", mirror, dst, "--run", "good")
    assert restore.returncode != 0
    assert fingerprint(outside) == before
    assert os.readlink(dst / "runs" / "good") == str(outside)


def test_a_snapshot_linked_to_another_stores_file_is_not_served(area: Path) -> None:
    other, ours = area / "other", area / "ours"
    build(other, "c", result="theirs")
    build(ours, "c", result="ours")
    key = newest(ours, "snap")
    assert (other / key).is_file()  # same run id, same versions: the header would match the name
    (ours / key).unlink()
    (ours / key).symlink_to(other / key)
    before = fingerprint(other)

    proc = _run([sys.executable, "-c", _PRELUDE + LOAD, str(ours), "c"], False)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["completed"] == N and all(r.startswith("ours") for r in loaded["results"])
    assert key in proc.stderr  # the skip is a warning naming the file
    verify = cli("verify", ours, "--json")
    assert verify.returncode == 1 and "unreadable" in findings(verify)[key]
    assert cli("show", ours, "c").returncode == 0
    assert fingerprint(other) == before


# ---------------------------------------------------------- 6: only regular files are read


@pytest.mark.parametrize("kind", ["snap", "log"])
def test_a_fifo_in_place_of_a_file_hangs_nothing(area: Path, kind: str) -> None:
    ours = area / "ours"
    build(ours)
    key = newest(ours, kind)
    (ours / key).unlink()
    os.mkfifo(ours / key)

    loaded = py(LOAD, ours, "c")
    assert loaded["completed"] == (N if kind == "snap" else N - 1)  # the newest record is gone
    out = operate(ours)
    assert out["verify"].returncode == 1 and "unreadable" in findings(out["verify"])[key]
    assert out["runs"].returncode == 0 and json.loads(out["runs"].stdout)["runs"][0]["run_id"] == "c"
    assert out["show"].returncode == 0 and "ours" in out["show"].stdout
    assert out["prune"].returncode in (0, 1)
    assert py(LOAD, ours, "c")["completed"] == loaded["completed"]  # prune kept what loads


def test_links_to_dev_zero_are_never_read(area: Path) -> None:
    ours = area / "ours"
    build(ours)
    planted = [newest(ours, "snap"), newest(ours, "log")]
    for key in planted:
        (ours / key).unlink()
        (ours / key).symlink_to("/dev/zero")

    assert py(LOAD, ours, "c")["completed"] == N - 1
    out = operate(ours)
    for key in planted:
        assert "unreadable" in findings(out["verify"])[key]
    assert out["runs"].returncode == 0 and out["show"].returncode == 0
    assert out["prune"].returncode in (0, 1)
    assert os.path.realpath("/dev/zero") == "/dev/zero" and stat.S_ISCHR(os.stat("/dev/zero").st_mode)


# ----------------------------------------------------- 7: fall back past what cannot be read


def test_a_dangling_link_and_a_directory_in_place_of_files_fall_back(area: Path) -> None:
    ours = area / "ours"
    build(ours)
    snap, log = newest(ours, "snap"), newest(ours, "log")
    (ours / snap).unlink()
    (ours / snap).symlink_to(area / "gone")
    (ours / log).unlink()
    (ours / log).mkdir()

    assert py(LOAD, ours, "c")["completed"] == N - 1
    out = operate(ours)
    assert "unreadable" in findings(out["verify"])[snap]
    assert out["show"].returncode == 0 and out["runs"].returncode == 0
    assert out["prune"].returncode in (0, 1)


def test_an_unreadable_snapshot_falls_back_for_an_unprivileged_reader(area: Path) -> None:
    ours = area / "ours"
    build(ours)
    key = newest(ours, "snap")
    (ours / key).chmod(0)

    proc = _run([sys.executable, "-c", _PRELUDE + LOAD, str(ours), "c"], True)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["completed"] == N
    assert key in proc.stderr and "Permission denied" in proc.stderr
    show = cli("show", ours, "c", "--json", unprivileged=True)
    assert show.returncode == 0 and json.loads(show.stdout)["completed"] == N
    runs = cli("runs", ours, "--json", unprivileged=True)
    assert runs.returncode == 0 and json.loads(runs.stdout)["runs"][0]["completed_steps"] == N
    verify = cli("verify", ours, "--json", unprivileged=True)
    assert verify.returncode == 1 and "unreadable" in findings(verify)[key]

    for dirpath, _dirs, files in os.walk(ours / "runs"):
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0)
    show = cli("show", ours, "c", unprivileged=True)
    # one line naming the run, no traceback; the exit code of "files exist, none loads" is the
    # CLI's (2 as a usage-level failure, or 1 where the CLI counts it as a problem found)
    assert show.returncode in (1, 2)
    lines = error_lines(show)
    assert len(lines) == 1 and "run 'c'" in lines[0] and "no stored version" in lines[0], lines


# --------------------------------------------------- 8: reading needs no write permission


_READ_ALL = """
from ckptfs.storage.registry import open_storage
import hashlib
st = open_storage(sys.argv[1])
st.check()
keys = st.list("")
doc = {"keys": keys, "sizes": [st.size(k) for k in keys],
       "sha": [hashlib.sha256(st.get(k)).hexdigest() for k in keys], "dirs": st.list_dirs("runs")}
for name, op in (("put", lambda: st.put_if_absent("runs/c/log/999999999999.ckpt", b"x")),
                 ("delete", lambda: st.delete(keys[0])), ("touch", lambda: st.touch(keys[0]))):
    try:
        op()
        doc[name] = "no error"
    except Exception as exc:
        doc[name] = failure(exc)
report(doc)
"""


def test_a_read_only_store_reads_fully_and_refuses_writes_clearly(area: Path) -> None:
    ours = area / "ours"
    build(ours)
    expected_keys = sorted(
        os.path.relpath(os.path.join(d, f), ours).replace(os.sep, "/")
        for d, _dirs, files in os.walk(ours) for f in files)
    for dirpath, _dirs, files in os.walk(ours):
        os.chown(dirpath, OTHER_UID, OTHER_UID)
        os.chmod(dirpath, 0o755)
        for name in files:
            os.chown(os.path.join(dirpath, name), OTHER_UID, OTHER_UID)
            os.chmod(os.path.join(dirpath, name), 0o644)
    before = fingerprint(ours)

    doc = py(_READ_ALL, ours, unprivileged=True)
    assert doc["keys"] == expected_keys and doc["dirs"] == ["c"]
    assert doc["sha"] == [hashlib.sha256((ours / k).read_bytes()).hexdigest() for k in expected_keys]
    for op in ("put", "delete", "touch"):
        assert doc[op]["error"] == "StoreNotWritableError", doc[op]
        assert str(ours) in doc[op]["message"]
    got = py(COMMIT, ours, "new", 10, unprivileged=True)
    assert got["error"] == "StoreNotWritableError" and str(ours) in got["message"]
    assert cli("runs", ours, unprivileged=True).returncode == 0
    show = cli("show", ours, "c", "--json", unprivileged=True)
    assert show.returncode == 0 and json.loads(show.stdout)["completed"] == N
    assert cli("verify", ours, unprivileged=True).returncode == 0

    assert fingerprint(ours) == before


# ------------------------------------------------------------- the storage contract, direct


def _outside_and_store(area: Path) -> tuple[Path, LocalStorage]:
    outside = area / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "f").write_bytes(b"outside")
    (outside / "file").write_bytes(b"outside file")
    st = LocalStorage(str(area / "root"), str(area / "root"), {"fsync": False})
    st.put("a/real", b"ours")
    (area / "root" / "runs").mkdir()
    (area / "root" / "runs" / "x").symlink_to(outside / "dir")
    (area / "root" / "a" / "link").symlink_to(outside / "file")
    (area / "root" / "a" / "dangling").symlink_to(area / "nowhere")
    return outside, st


def test_list_reports_links_as_names_and_never_descends(area: Path) -> None:
    _outside, st = _outside_and_store(area)
    assert st.list("") == ["a/dangling", "a/link", "a/real", "runs/x"]
    assert st.list("runs/x/") == [] and st.list("runs/x") == []
    assert st.list_dirs("runs") == [] and st.list_dirs("") == ["a", "runs"]
    for key in ("a/link", "a/dangling", "runs/x/f"):
        with pytest.raises(errors.UnreadableFileError, match="symbolic link"):
            st.get(key)
        with pytest.raises(errors.UnreadableFileError):
            st.size(key)
        with pytest.raises(errors.UnreadableFileError):
            st.open_read(key)
    assert st.modified("a/link") == os.lstat(area / "root" / "a" / "link").st_mtime


def test_writes_and_deletes_never_go_through_links(area: Path) -> None:
    outside, st = _outside_and_store(area)
    before = fingerprint(outside)
    for write in (lambda: st.put("runs/x/new", b"1"), lambda: st.put_if_absent("runs/x/f", b"1"),
                  lambda: st.put_stream("runs/x/s", io.BytesIO(b"1"))):
        with pytest.raises(errors.StoreNotWritableError, match="'runs/x' is a symbolic link"):
            write()
    with pytest.raises(FileExistsError):
        st.put_if_absent("a/link", b"mine")  # the name is taken; its target is not written
    with pytest.raises(errors.UnreadableFileError):
        st.touch("a/link")
    st.delete("runs/x/f")  # not in this store: nothing deleted
    st.delete("a/dangling")  # the link itself goes
    assert not os.path.lexists(area / "root" / "a" / "dangling")
    st.put("a/link", b"mine")  # replaces the link with our file
    assert not (area / "root" / "a" / "link").is_symlink() and st.get("a/link") == b"mine"
    st.delete("a/link")
    assert fingerprint(outside) == before


def test_the_root_itself_may_be_a_link(area: Path) -> None:
    (area / "data").mkdir()
    (area / "agent").symlink_to(area / "data")
    st = LocalStorage(str(area / "agent"), str(area / "agent"), {"fsync": False})
    st.check()
    st.put_if_absent("runs/r/log/000000000001.ckpt", b"v1")
    assert (area / "data" / "runs" / "r" / "log" / "000000000001.ckpt").read_bytes() == b"v1"
    assert st.list("runs/") == ["runs/r/log/000000000001.ckpt"] and st.list_dirs("runs") == ["r"]


def test_a_log_of_the_log_storage_is_never_followed(area: Path) -> None:
    from ckptfs.storage.logstore import LOG_NAME, LogStorage

    outside = area / "outside.records"
    outside.write_bytes(b"not a log of ours")
    before = fingerprint(area / "root") if (area / "root").exists() else {}
    inner = LocalStorage(str(area / "root"), str(area / "root"), {"fsync": False})
    (area / "root" / "g").mkdir(parents=True)
    (area / "root" / "g" / LOG_NAME).symlink_to(outside)
    logs = LogStorage(inner, lambda key: "g/" if key.startswith("g/") else None)
    with pytest.raises(errors.UnreadableFileError, match="symbolic link"):
        logs.put("g/k", b"1")
    assert outside.read_bytes() == b"not a log of ours" and before == {}


def test_errors_keep_the_families_callers_catch() -> None:
    assert issubclass(errors.UnreadableFileError, errors.CorruptFileError)
    assert issubclass(errors.StoreNotWritableError, errors.StorageUnavailableError)
    assert issubclass(errors.StoreNotWritableError, PermissionError)
    exc = pickle.loads(pickle.dumps(errors.UnreadableFileError("k", "why")))
    assert isinstance(exc, errors.UnreadableFileError) and str(exc) == "k: why"
    ro = pickle.loads(pickle.dumps(errors.StoreNotWritableError("/s: cannot write k")))
    assert isinstance(ro, PermissionError) and str(ro) == "/s: cannot write k"
