"""`ckptfs import-langgraph` from sources a hostile review found mishandled, run as the real
executable: a SQLite file whose name holds '#', '?' or '%', one this user may not read, one in a
directory this user may not write (a read-only mount), PostgreSQL DSNs libpq refuses or that
carry a password, and sources whose rows cannot be read back.

Permission bits are made real even when the tests run as root: the child drops
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER from its bounding set before exec (as in
test_hostile_files.py), so the kernel checks the bits for it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _privileges import drop_dac
from langgraph.checkpoint.sqlite import SqliteSaver
from test_cli_commands import cli, cli_json
from test_cli_terminal import in_terminal
from test_langgraph_import import START_STATE, build, fill, history

from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.integrations.langgraph import CkptfsSaver


def _cli_bound(*args: str) -> tuple[int, str, str]:
    """The real `ckptfs`, with permission bits binding it."""
    script = Path(sys.executable).parent / "ckptfs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    proc = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60,
                          env={**env, "COLUMNS": "250"}, preexec_fn=drop_dac)
    return proc.returncode, proc.stdout, proc.stderr


def _saver_file(path: Path) -> Path:
    with SqliteSaver.from_conn_string(str(path)) as saver:
        fill(saver)
    return path


def _same_threads(src: Path, url: str) -> None:
    with SqliteSaver.from_conn_string(str(src)) as source:
        dest = CkptfsSaver(url)
        for thread in ("waiting", "done", "twice"):
            assert history(dest, thread) == history(source, thread) != [], thread
        dest.close()


@pytest.mark.parametrize("name", ["my#1.sqlite", "a?b.sqlite", "50%41.sqlite"])
def test_a_file_name_with_uri_characters_imports_that_file(tmp_path: Path, name: str) -> None:
    """The name went into SQLite's URI unescaped: for my#1.sqlite SQLite opened "my" (creating
    it, read-write: '#' ended the name and dropped mode=ro) and the import said "not a SqliteSaver
    database", exit 2; for a?b.sqlite the same with "a"; 50%41.sqlite was exit 3 (unexpected
    OperationalError: '%41' decoded to 'A', no such file)."""
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = _saver_file(src_dir / name)
    store = tmp_path / "store"
    code, doc, err = cli_json("import-langgraph", str(src), str(store))
    assert code == 0 and doc["ok"] and doc["threads"] == 3, (doc, err)
    assert sorted(p.name for p in src_dir.iterdir() if not p.name.startswith(name)) == []  # no "my"
    assert cli("verify", str(store))[0] == 0
    _same_threads(src, str(store))


def test_a_file_this_user_may_not_read_is_a_usage_error(tmp_path: Path) -> None:
    """sqlite3.connect raised outside the error handling: exit 3, 'unexpected OperationalError:
    unable to open database file'. Now exit 2 naming the file."""
    src = _saver_file(tmp_path / "locked.sqlite")
    src.chmod(0)
    store = tmp_path / "store"
    code, out, err = _cli_bound("import-langgraph", str(src), str(store))
    assert code == 2, (out, err)
    assert f"error: cannot open {src}: unable to open database file" in err and "unexpected" not in err
    assert not store.exists()


def test_a_file_in_a_read_only_directory_imports(tmp_path: Path) -> None:
    """A SqliteSaver file is in WAL mode, and a read-only reader of one creates its -shm index
    beside it: on a read-only directory (a mounted backup) every import failed with exit 2,
    'cannot read ...: attempt to write a readonly database'. Now the file is read as immutable
    (there is no WAL content to index) and nothing is created beside it."""
    src_dir = tmp_path / "backup"
    src_dir.mkdir()
    src = _saver_file(src_dir / "agent.sqlite")
    assert [p.name for p in src_dir.iterdir()] == ["agent.sqlite"]  # closed cleanly: no -wal
    src_dir.chmod(0o555)
    store = tmp_path / "store"
    try:
        code, out, err = _cli_bound("import-langgraph", str(src), str(store))
        assert code == 0 and "imported: 3 thread(s)" in out, (out, err)
        assert [p.name for p in src_dir.iterdir()] == ["agent.sqlite"]
    finally:
        src_dir.chmod(0o755)
    assert cli("verify", str(store))[0] == 0
    _same_threads(src, str(store))


@pytest.mark.parametrize("dsn", [
    "postgresql://u:hunter2@[::1/db",  # an unclosed IPv6 bracket
    "postgresql://u:hunter2@127.0.0.1:1/db?foo=bar",  # a query parameter libpq does not know
    "postgresql://u:hunter2@127.0.0.1:1/db?connect_timeout=abc",
    "postgresql://%zz:hunter2@127.0.0.1:1/db",  # a bad percent escape
])
def test_a_dsn_libpq_refuses_is_a_usage_error_without_the_password(tmp_path: Path, dsn: str) -> None:
    """libpq refuses these before connecting (psycopg.ProgrammingError), which was not caught:
    exit 3 'unexpected ProgrammingError: invalid URI query parameter: "foo"' (a bug, by the exit
    codes), and the unclosed bracket failed earlier still, in urlsplit (ValueError: Invalid IPv6
    URL). Now exit 2 naming the DSN, password hidden, and libpq's reason."""
    store = tmp_path / "store"
    code, out, err = cli("import-langgraph", dsn, str(store))
    assert code == 2, (out, err)
    assert "is not a valid PostgreSQL DSN: " in err and "unexpected" not in err, err
    assert "hunter2" not in out + err and "postgresql://***@" in err
    code, doc, err = cli_json("import-langgraph", dsn, str(store))
    assert code == 2 and doc["error"]["code"] == "config" and "hunter2" not in str(doc) + err
    assert not store.exists()


@pytest.mark.parametrize("dsn", ["host=127.0.0.1 port=1 password=hunter2 dbname=agents",
                                 "host=127.0.0.1 password = 'hunter2 x' dbname=agents"])
def test_a_keyword_dsn_is_refused_without_printing_its_password(tmp_path: Path, dsn: str) -> None:
    """libpq's other spelling of a DSN, keyword=value: refused as a SOURCE this command does not
    know (exit 2, right), but the message repeated it whole, password in clear: redact_url only
    knows URLs, and no scrubber pattern knew `password=`."""
    store = tmp_path / "store"
    code, out, err = cli("import-langgraph", dsn, str(store))
    assert code == 2 and "not a source this command knows" in err, (out, err)
    assert "hunter2" not in out + err and "password=***" in err.replace(" = ", "=")
    code, doc, err = cli_json("import-langgraph", dsn, str(store))
    assert code == 2 and "hunter2" not in str(doc) + err


def test_a_thread_the_source_cannot_read_fails_that_thread_only(tmp_path: Path) -> None:
    """One checkpoint of one thread whose bytes the source's serializer refuses stopped the whole
    import: exit 3, 'unexpected ValueError: invalid type Reserved', and every thread sorting after
    it was never copied, by this run or any rerun. Now it is that thread's failure (exit 1, named
    with the reason, nothing of it written) and the others are imported."""
    src = tmp_path / "src.sqlite"
    with SqliteSaver.from_conn_string(str(src)) as saver:
        fill(saver)
        ids = [r[0] for r in saver.conn.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = 'done' ORDER BY checkpoint_id")]
        saver.conn.execute("INSERT INTO checkpoints SELECT 'bad', checkpoint_ns, checkpoint_id, "
                           "parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints "
                           "WHERE thread_id = 'done'")
        saver.conn.execute("UPDATE checkpoints SET checkpoint = ? WHERE thread_id = 'bad' AND "
                           "checkpoint_id = ?", (b"\xc1\xc1 not msgpack", ids[len(ids) // 2]))
        saver.conn.commit()
    store = tmp_path / "store"
    code, doc, err = cli_json("import-langgraph", str(src), str(store))
    assert code == 1, (doc, err)
    assert doc["threads"] == 4 and list(doc["failed"]) == ["bad"], doc
    assert "cannot be read from" in doc["failed"]["bad"] and "ValueError" in doc["failed"]["bad"]
    code, out, err = cli("import-langgraph", str(src), str(store))  # a rerun: same answer
    assert code == 1 and "thread 'bad' not imported: " in err and "unexpected" not in err, (out, err)
    assert "incomplete: 4 thread(s)" in out and "0 checkpoint(s) copied" in out
    threads = cli_json("threads", str(store))[1]["threads"]
    assert sorted({r["thread_id"] for r in threads}) == ["done", "twice", "waiting"]  # none of 'bad'
    assert cli("verify", str(store))[0] == 0
    _same_threads(src, str(store))


def test_a_damaged_page_of_the_source_never_crashes_the_import(tmp_path: Path) -> None:
    """A run of bytes overwritten in the middle of a SqliteSaver file: 'database disk image is
    malformed' was exit 3 at the first thread it hit, the rest never copied. Now a thread whose
    rows are damaged is that thread's failure, and a thread list that cannot be read is exit 2."""
    src = tmp_path / "src.sqlite"
    with SqliteSaver.from_conn_string(str(src)) as saver:
        graph = build(saver)
        for i in range(30):
            graph.invoke(START_STATE, {"configurable": {"thread_id": f"t{i:02}"}})
    data = bytearray(src.read_bytes())
    data[len(data) // 2:len(data) // 2 + 3000] = b"\xff" * 3000
    src.write_bytes(bytes(data))
    store = tmp_path / "store"
    code, out, err = cli("import-langgraph", str(src), str(store))
    assert code in (1, 2) and "unexpected" not in err, (code, out, err)
    assert "malformed" in err
    if code == 1:
        assert "incomplete: 30 thread(s)" in out and cli("verify", str(store))[0] == 0


def test_paths_that_look_like_markup_are_printed_as_they_are(tmp_path: Path) -> None:
    """Summary lines were printed as rich markup with the path or URL inside: a SOURCE or store
    under a directory named 'x[' ('x[/y]' is a closing tag to rich) made import-langgraph exit 3,
    'unexpected MarkupError', after every thread was imported; so did `runs` and `threads` on such a
    store, and `forget` after deleting the run. '[red]' in a name was swallowed ('o[red]z' shown
    as 'oz')."""
    (tmp_path / "x[").mkdir()
    src = _saver_file(tmp_path / "x[" / "y].sqlite")
    store = tmp_path / "x[" / "store]"
    code, out, err = cli("import-langgraph", str(src), str(store))
    assert code == 0 and "unexpected" not in err, (out, err)
    assert f"from {src}:" in " ".join(out.split()) and f"-> {store}" in " ".join(out.split())
    code, out, err = cli("runs", str(store))
    flat = " ".join(out.split())
    again = f"ckptfs threads {shlex.quote(str(store))}"  # '[' is a glob character: quoted
    assert code == 0 and f"no runs in {store}" in flat and again in flat, (out, err)
    code, out, err = cli("import-langgraph", str(src), str(tmp_path / "o[red]z"))
    assert code == 0 and f"-> {tmp_path / 'o[red]z'}" in " ".join(out.split()), (out, err)
    empty = tmp_path / "e[" / "s]"
    (empty / "langgraph" / "threads").mkdir(parents=True)
    code, out, err = cli("threads", str(empty))
    assert code == 0 and f"no LangGraph threads in {empty}" in " ".join(out.split()), (out, err)
    runs = CheckpointStore(str(store))
    run = AgentRun(run_id="r1", goal="beside the threads")
    run.add_step(Step(id="a", title="a"))
    runs.save_run(run)
    runs.close()
    code, out, err = cli("forget", str(store), "r1")
    assert f"deleted 1 file(s) of run r1 (1 version(s)) in {store}" in " ".join(out.split()), (out, err)
    assert code == 0


def test_a_memory_store_is_refused_as_the_destination(tmp_path: Path) -> None:
    """`import-langgraph SRC memory://x` said 'imported: 3 thread(s) ... -> memory://x', exit 0,
    and kept nothing: a memory store ends with the process. Now exit 2 before the source is read."""
    src = _saver_file(tmp_path / "src.sqlite")
    code, out, err = cli("import-langgraph", str(src), "memory://x")
    assert code == 2 and "memory://x is this process's memory" in err and "imported" not in out, (out, err)


def test_another_history_under_the_same_thread_id_is_not_merged(tmp_path: Path) -> None:
    """Two services' SqliteSaver files, each with its own thread 'waiting', imported into one
    store: the second import said 'imported', exit 0, and the store's 'waiting' held both
    histories interleaved by id; get_tuple served whichever was newer, the other service's state
    buried. Now a thread whose checkpoints in the store are none of the source's is that thread's
    failure (exit 1, nothing of it written); a rerun of the first source still converges."""
    first = _saver_file(tmp_path / "a.sqlite")
    second = _saver_file(tmp_path / "b.sqlite")  # the same thread ids, other checkpoints
    store = tmp_path / "store"
    assert cli("import-langgraph", str(first), str(store))[0] == 0
    before = CkptfsSaver(str(store)).get_tuple({"configurable": {"thread_id": "waiting"}})
    code, doc, err = cli_json("import-langgraph", str(second), str(store))
    assert code == 1 and sorted(doc["failed"]) == ["done", "twice", "waiting"], (doc, err)
    assert "already holds another history" in doc["failed"]["waiting"] and doc["checkpoints"] == 0
    assert doc["writes"] == 0
    after = CkptfsSaver(str(store)).get_tuple({"configurable": {"thread_id": "waiting"}})
    assert before is not None and after is not None and after.config == before.config
    code, doc, err = cli_json("import-langgraph", str(first), str(store))  # the same source again
    assert code == 0 and doc["checkpoints"] == 0 and doc["failed"] == {}, (doc, err)
    assert cli("verify", str(store))[0] == 0
    _same_threads(first, str(store))


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 96 KiB tmpfs (root only): a filesystem that fills up midway through an import."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and mount to make a small filesystem")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_filesystem_is_one_line_exit_2_and_a_rerun_converges(tmp_path: Path, small_fs: Path) -> None:
    """ENOSPC midway through an import was exit 3, 'unexpected OSError: [Errno 28] No space left on
    device', an internal error by the exit codes. Now it is 'no-space', exit 2, one line; once
    there is room, a rerun completes and the store verifies clean."""
    src = tmp_path / "src.sqlite"
    with SqliteSaver.from_conn_string(str(src)) as saver:
        graph = build(saver)
        for i in range(40):
            graph.invoke(START_STATE, {"configurable": {"thread_id": f"t{i:02}"}})
    store = small_fs / "store"
    code, out, err = cli("import-langgraph", str(src), str(store))
    assert code == 2 and "unexpected" not in err, (out, err)
    assert "error: No space left on device: the filesystem being written is full" in err
    code, doc, err = cli_json("import-langgraph", str(src), str(store))
    assert code == 2 and doc["error"]["code"] == "no-space", (doc, err)
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_fs)], check=True)
    code, doc, err = cli_json("import-langgraph", str(src), str(store), timeout=120)  # a lease expires
    assert code == 0 and doc["ok"] and doc["threads"] == 40, (doc, err)
    assert cli("verify", str(store))[0] == 0
    with SqliteSaver.from_conn_string(str(src)) as source:
        dest = CkptfsSaver(str(store))
        for i in range(40):
            assert history(dest, f"t{i:02}") == history(source, f"t{i:02}") != []
        dest.close()


def test_a_thread_id_that_looks_like_markup_is_listed_and_imported_in_a_terminal(tmp_path: Path) -> None:
    """Table cells and the import's progress line were rich markup: one thread named 'a[/b]' made
    `ckptfs threads` exit 3 for the whole store ('unexpected MarkupError: closing tag [/b]'), and an
    import in a terminal exit 3 midway; a thread '[bold]x' was listed as 'x'."""
    src = tmp_path / "src.sqlite"
    ids = ["a[/b]", "[bold]x", "plain"]
    with SqliteSaver.from_conn_string(str(src)) as saver:
        graph = build(saver)
        for thread in ids:
            graph.invoke(START_STATE, {"configurable": {"thread_id": thread}})
    store = tmp_path / "store"
    code, lines = in_terminal("import-langgraph", str(src), str(store))
    assert code == 0 and any("imported: 3 thread(s)" in line for line in lines), lines
    code, out, err = cli("threads", str(store))
    assert code == 0, (out, err)
    listed = {line.split()[0] for line in out.splitlines()[3:] if line.strip()}  # root and subgraph rows
    assert listed == set(ids), out
    code, out, err = cli("show", str(store), "--thread", "a[/b]")
    assert code == 0 and "thread a[/b] in" in out, (out, err)


def _journal_file(path: Path, mode: str) -> Path:
    """A SqliteSaver file left in `mode`: "wal" as SqliteSaver leaves it, "delete" (rollback
    journal) as a user who ran `PRAGMA journal_mode=DELETE` on it, or a copy made by sqlite3's
    backup, leaves it."""
    import sqlite3

    conn = sqlite3.connect(str(path), check_same_thread=False)
    fill(SqliteSaver(conn))
    conn.execute(f"PRAGMA journal_mode={mode}")
    conn.close()
    return path


def _beside(directory: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("mode", ["wal", "delete"])
@pytest.mark.parametrize("read_only_dir", [False, True], ids=["writable-dir", "read-only-dir"])
def test_an_import_adds_and_changes_nothing_beside_the_source(tmp_path: Path, mode: str,
                                                              read_only_dir: bool) -> None:
    """A WAL-mode file in a writable directory was opened mode=ro, and a read-only reader of a
    WAL file leaves its -wal and -shm behind: after every import `agent.sqlite-wal` (0 bytes)
    and `agent.sqlite-shm` (32 KiB) stood beside the user's file. A rollback-journal file
    (journal_mode=DELETE) imported nothing at all: exit 1, every thread 'cannot be read ...:
    attempt to write a readonly database' (SqliteSaver's setup switches the file to WAL). Now
    both import, and the directory holds exactly the bytes it held before."""
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = _journal_file(src_dir / "agent.sqlite", mode)
    before = _beside(src_dir)
    assert list(before) == ["agent.sqlite"]
    store = tmp_path / "store"
    if read_only_dir:
        src_dir.chmod(0o555)
    try:
        code, out, err = _cli_bound("import-langgraph", str(src), str(store))
        assert code == 0 and "imported: 3 thread(s)" in out and "32 checkpoint(s) copied" in out, (out, err)
        assert _beside(src_dir) == before
        code, out, err = _cli_bound("import-langgraph", str(src), str(store))  # a rerun: the same
        assert code == 0 and "0 checkpoint(s) copied, 32 already there" in out, (out, err)
        assert _beside(src_dir) == before
    finally:
        src_dir.chmod(0o755)
    assert cli("verify", str(store))[0] == 0
    _same_threads(src, str(store))


def test_two_imports_at_once_each_count_what_they_wrote(tmp_path: Path) -> None:
    """Two `import-langgraph` of one source into one store at once: each listed a thread's
    objects in the store before taking its lease, and the other import, holding it, wrote the
    thread meanwhile; so both stored the same checkpoints (the second replacing the first's) and
    both counted them: 60 threads of 420 checkpoints and 360 write objects gave reports summing
    to 422 checkpoints and 381 writes. Now a thread's store is read under its lease: together
    the two reports copy each object once and skip it once."""
    import json as _json

    from test_cli_commands import CLI, QUIET_CWD

    src = tmp_path / "many.sqlite"
    with SqliteSaver.from_conn_string(str(src)) as saver:
        graph = build(saver)
        for i in range(60):
            graph.invoke(START_STATE, {"configurable": {"thread_id": f"t{i:03}"}})
        total = saver.conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    for round_ in range(2):
        store = tmp_path / f"store{round_}"
        procs = [subprocess.Popen([CLI, "import-langgraph", str(src), str(store), "--json"], cwd=QUIET_CWD,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        docs = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, (out, err)
            docs.append(_json.loads(out))
        code, alone, err = cli_json("import-langgraph", str(src), str(tmp_path / f"alone{round_}"))
        assert code == 0 and alone["checkpoints"] == total, (alone, err)
        assert sum(d["checkpoints"] for d in docs) == total, docs
        assert sum(d["skipped"] for d in docs) == total, docs
        assert sum(d["writes"] for d in docs) == alone["writes"], (docs, alone)
        code, again, err = cli_json("import-langgraph", str(src), str(store))
        assert code == 0 and again["checkpoints"] == again["writes"] == 0 and again["skipped"] == total
        assert cli("verify", str(store))[0] == 0


def test_a_metadata_step_that_is_not_an_integer_is_never_printed_as_bare_nan(tmp_path: Path) -> None:
    """A source whose checkpoint metadata says step NaN (SqliteSaver keeps metadata as JSON text,
    which Python's json writes NaN into and reads back): `ckptfs show --thread --json` printed
    `"step": NaN`, which is not JSON (JSON.parse, Go and strict parsers refuse the document).
    Now a step that is not an integer, or a source that is not text, is shown as unknown."""
    import json as _json
    import sqlite3

    src = _saver_file(tmp_path / "src.sqlite")
    conn = sqlite3.connect(str(src))
    conn.execute("UPDATE checkpoints SET metadata = ? WHERE thread_id = 'done'",
                 (b'{"source": {"a": [1e999]}, "step": NaN, "parents": {}}',))
    conn.commit()
    conn.close()
    store = tmp_path / "store"
    assert cli("import-langgraph", str(src), str(store))[0] == 0

    def strict(text: str) -> Any:
        return _json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))

    code, out, err = cli("show", str(store), "--thread", "done", "--json")
    assert code == 0, (out, err)
    rows = strict(out)["checkpoints"]
    assert rows and all(r["step"] is None and r["source"] is None for r in rows), rows
    code, out, err = cli("show", str(store), "--thread", "waiting", "--json")
    assert code == 0 and {r["source"] for r in strict(out)["checkpoints"]} >= {"input", "loop"}
    code, out, err = cli("show", str(store), "--thread", "done")
    assert code == 0 and "nan" not in out.lower(), out


def test_a_stray_file_beside_a_log_never_hides_its_namespace(tmp_path: Path) -> None:
    """`ckptfs threads` and `show --thread` copied every file of a namespace, the strays beside
    its log too: a FIFO left there (`.records.fifo`) or a link made the whole namespace
    'skipped', exit 0, its checkpoints missing from the listing, though the saver reads them and
    verify calls the file one stray; a large stray was read into memory whole. Now only the log
    and the saver's own objects are read; the strays are verify's to report."""
    src = _saver_file(tmp_path / "src.sqlite")
    store = tmp_path / "store"
    assert cli("import-langgraph", str(src), str(store))[0] == 0
    code, before, err = cli_json("threads", str(store))
    assert code == 0 and len(before["threads"]) == 7, (before, err)
    shown_before = cli_json("show", str(store), "--thread", "twice")[1]["checkpoints"]
    ns = store / "langgraph" / "threads" / "twice" / "_"
    assert (ns / ".records").is_file()
    os.mkfifo(ns / ".records.fifo")
    (ns / "notes.txt").symlink_to("/etc/passwd")
    with open(ns / "huge.bin", "wb") as f:  # sparse: 4 GiB read whole was the process's memory
        f.truncate(4 << 30)
    code, after, err = cli_json("threads", str(store), timeout=30)
    assert code == 0 and after["threads"] == before["threads"] and "skipped" not in err, (after, err)
    code, doc, err = cli_json("show", str(store), "--thread", "twice", timeout=30)
    assert code == 0 and doc["checkpoints"] == shown_before, err
    code, out, err = cli("verify", str(store))
    assert code == 1 and "0 error(s), 3 warning(s)" in " ".join(out.split()), (out, err)
