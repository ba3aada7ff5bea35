"""`ckptfs import-langgraph`: threads from a real SqliteSaver file and a real PostgreSQL server
(started by the fixture below) into ckptfs; then `ckptfs verify` is clean, the history reads
the same, and a graph resumes on ckptfs where it left off. Rerunnable.

The PostgreSQL server is Debian's `postgresql` package: installed with apt-get if it is missing
(as root), run as the `postgres` user on a private port of 127.0.0.1 with a temporary data
directory (initdb, pg_ctl), and stopped at the end of the session.
"""

from __future__ import annotations

import glob
import hashlib
import json
import operator
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from test_cli_commands import cli, cli_json

from ckptfs.cli import main
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph.importer import SqliteSource, import_threads, sqlite_path


class Inner(TypedDict):
    notes: Annotated[list[str], operator.add]


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    notes: Annotated[list[str], operator.add]
    approved: bool


def build(saver: BaseCheckpointSaver[Any]) -> Any:
    """draft -> research (a subgraph: its own namespace) -> review (interrupts) -> publish."""
    def note(state: Inner) -> dict[str, Any]:
        return {"notes": ["sources: a, b"]}

    sub = StateGraph(Inner)
    sub.add_node("note", note)
    sub.add_edge(START, "note")
    sub.add_edge("note", END)

    def draft(state: State) -> dict[str, Any]:
        return {"log": ["draft " + "x" * 300]}

    def review(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "approve?", "notes": state["notes"]})
        return {"log": [f"review:{answer}"], "approved": answer == "yes"}

    def publish(state: State) -> dict[str, Any]:
        return {"log": ["published" if state["approved"] else "dropped"]}

    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("research", sub.compile())
    g.add_node("review", review)
    g.add_node("publish", publish)
    g.add_edge(START, "draft")
    g.add_edge("draft", "research")
    g.add_edge("research", "review")
    g.add_edge("review", "publish")
    g.add_edge("publish", END)
    return g.compile(checkpointer=saver)


START_STATE: Any = {"log": [], "notes": [], "approved": False}


def _cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def fill(saver: BaseCheckpointSaver[Any]) -> None:
    """Three threads: one waiting on its interrupt, one finished, one finished and run again."""
    graph = build(saver)
    graph.invoke(START_STATE, _cfg("waiting"))
    graph.invoke(START_STATE, _cfg("done"))
    graph.invoke(Command(resume="yes"), _cfg("done"))
    graph.invoke(START_STATE, _cfg("twice"))
    graph.invoke(Command(resume="no"), _cfg("twice"))
    graph.invoke({"log": ["again"]}, _cfg("twice"))


def history(saver: BaseCheckpointSaver[Any], thread: str) -> list[tuple[Any, ...]]:
    """What a user sees of a thread: every state, newest first, with its pending tasks."""
    return [(s.values, s.next, s.config["configurable"]["checkpoint_id"],
             {k: v for k, v in s.metadata.items() if k != "thread_id"},
             [(t.name, [i.value for i in t.interrupts]) for t in s.tasks])
            for s in build(saver).get_state_history(_cfg(thread))]


def check_imported(source: BaseCheckpointSaver[Any], url: str, opts: dict[str, Any]) -> None:
    dest = CkptfsSaver(url, opts)
    for thread in ("waiting", "done", "twice"):
        assert history(dest, thread) == history(source, thread), thread
    graph = build(dest)
    state = graph.get_state(_cfg("waiting"), subgraphs=True)
    assert state.next == ("review",)
    assert state.tasks[0].interrupts[0].value == {"question": "approve?", "notes": ["sources: a, b"]}
    done = graph.invoke(Command(resume="yes"), _cfg("waiting"))
    assert done["log"][-2:] == ["review:yes", "published"] and done["notes"] == ["sources: a, b"]
    # and the resumed thread goes on like any other
    again = graph.invoke({"log": ["more"]}, _cfg("waiting"))
    assert "__interrupt__" in again
    dest.close()


def run_cli(*argv: str) -> tuple[int, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*argv, "--json"])
    return code, json.loads(buf.getvalue())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------- SQLite


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent.sqlite"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        fill(saver)
    return path


def test_sqlite_threads_import_verify_clean_and_resume(tmp_path: Path, sqlite_file: Path) -> None:
    url = str(tmp_path / "store")
    before = _digest(sqlite_file)
    code, doc = run_cli("import-langgraph", f"sqlite:///{sqlite_file}", url)  # sqlite:////abs/path
    assert code == 0 and doc["ok"] and doc["threads"] == 3, doc
    assert doc["checkpoints"] >= 20 and doc["skipped"] == 0 and doc["writes"] > 0
    assert _digest(sqlite_file) == before  # opened read-only
    code, report = run_cli("verify", url)
    assert code == 0 and report["ok"], report
    with SqliteSaver.from_conn_string(str(sqlite_file)) as source:
        check_imported(source, url, {})


def test_a_rerun_skips_what_is_there_and_a_partial_import_converges(tmp_path: Path,
                                                                    sqlite_file: Path) -> None:
    url = str(tmp_path / "store")
    code, first = run_cli("import-langgraph", str(sqlite_file), url, "--thread", "done")
    assert code == 0 and first["threads"] == 1
    # a crash midway through a thread: its newest checkpoints never arrived
    saver = CkptfsSaver(url)
    newest = list(saver.list(_cfg("done"), limit=2))
    for tup in newest:
        conf = tup.config["configurable"]
        from ckptfs.integrations.langgraph.keys import lg_checkpoint_key
        saver.storage.delete(lg_checkpoint_key("done", conf["checkpoint_ns"], conf["checkpoint_id"]))
    saver.close()
    code, second = run_cli("import-langgraph", str(sqlite_file), url)
    assert code == 0 and second["threads"] == 3
    assert second["skipped"] == first["checkpoints"] - 2 and second["checkpoints"] > 2
    code, third = run_cli("import-langgraph", str(sqlite_file), url)
    assert code == 0 and third["checkpoints"] == 0 and third["writes"] == 0
    assert third["skipped"] == first["checkpoints"] + second["checkpoints"] - 2
    code, report = run_cli("verify", url)
    assert code == 0 and report["ok"], report
    with SqliteSaver.from_conn_string(str(sqlite_file)) as source:
        check_imported(source, url, {})


def test_writes_keep_their_task_path_idx_and_bytes(tmp_path: Path, sqlite_file: Path) -> None:
    """The rows' exact serialized bytes and slots land in the store (pending_writes drop them)."""
    source = SqliteSource(str(sqlite_file))
    dest = CkptfsSaver(str(tmp_path / "store"))
    report = import_threads(source, dest)
    assert report.ok and report.threads == 3
    path = "task_path" if source.has_path else "''"  # the column came with sqlite saver 3.1.2
    rows = source.conn.execute(
        f"SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, {path}, idx, channel, type, value "
        "FROM writes").fetchall()
    assert rows and (any(r[4] for r in rows) or not source.has_path)  # task paths are there to keep
    for thread, ns, cid, task, path, idx, channel, typ, value in rows:
        assert stored_writes(dest, thread, ns, cid)[(task, idx)] == (path, channel, typ, bytes(value))
        tup = dest.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                               "checkpoint_id": cid}})
        assert tup is not None
        assert (task, channel, dest.serde.loads_typed((typ, value))) in (tup.pending_writes or [])
    source.close()
    dest.close()


def stored_writes(saver: CkptfsSaver, thread: str, ns: str, cid: str) -> dict[tuple[str, int], Any]:
    """(task, idx) -> (task path, channel, serde type, bytes) as the store holds them."""
    from ckptfs.integrations.langgraph import codec as fmt
    from ckptfs.integrations.langgraph.keys import lg_writes_prefix

    out: dict[tuple[str, int], Any] = {}
    for key in saver.storage.list(lg_writes_prefix(thread, ns, cid)):
        obj = fmt.unpack(saver.storage.get(key), key)
        offset = 0
        for idx, channel, typ, n in obj.header["items"]:
            out[(obj.header["task"], idx)] = (obj.header["path"], channel, typ, obj.raw[offset:offset + n])
            offset += n
    return out


def test_any_saver_imports_through_its_pending_writes(tmp_path: Path) -> None:
    """A saver that is neither SQLite nor Postgres (here InMemorySaver) goes through its API."""
    from langgraph.checkpoint.memory import InMemorySaver

    from ckptfs.integrations.langgraph.importer import Source

    mem = InMemorySaver()
    fill(mem)
    report = import_threads(Source(mem, "memory"), CkptfsSaver(str(tmp_path / "store")))
    assert report.ok and report.threads == 3 and report.checkpoints >= 20 and report.writes > 0
    again = import_threads(Source(mem, "memory"), CkptfsSaver(str(tmp_path / "store")))
    assert again.checkpoints == 0 and again.writes == 0 and again.skipped == report.checkpoints
    assert run_cli("verify", str(tmp_path / "store"))[0] == 0
    check_imported(mem, str(tmp_path / "store"), {})


def test_bad_sources_are_usage_errors(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    code, doc = run_cli("import-langgraph", str(tmp_path / "missing.sqlite"), url)
    assert code == 2 and "no SQLite file" in doc["error"]["message"]
    assert not (tmp_path / "missing.sqlite").exists()
    other = tmp_path / "other.db"
    import sqlite3
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    code, doc = run_cli("import-langgraph", str(other), url)
    assert code == 2 and "not a SqliteSaver database" in doc["error"]["message"]
    code, doc = run_cli("import-langgraph", "redis://localhost/0", url)
    assert code == 2 and "not a source" in doc["error"]["message"]
    assert sqlite_path("sqlite:///rel/a.db") == "rel/a.db"
    assert sqlite_path("sqlite:////abs/a.db") == "/abs/a.db"


def test_a_file_of_garbage_bytes_is_a_usage_error(tmp_path: Path) -> None:
    """Not a SQLite file at all (an empty one and a 0-byte one already were exit 2): it was
    exit 3, 'unexpected DatabaseError: file is not a database'."""
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"garbage\n")
    store = tmp_path / "imp1"
    code, out, err = cli("import-langgraph", str(junk), str(store))
    assert code == 2, (out, err)
    assert f"error: {junk} is not a SqliteSaver database" in err and "unexpected" not in err
    code, doc, _ = cli_json("import-langgraph", str(junk), str(store))
    assert code == 2 and doc["error"]["code"] == "config" and str(junk) in doc["error"]["message"]
    assert junk.read_bytes() == b"garbage\n" and not store.exists()  # nothing written, either side


def test_a_thread_the_saver_refuses_fails_that_thread_only(tmp_path: Path) -> None:
    """One thread the saver refuses aborted the whole import with exit 2: threads sorting after
    it were never copied. Now it is that thread's failure, with the reason, and the import is
    partial: exit 1. The refused id is a task id of 250 characters (planted in the SQLite file;
    the saver's limit is 200). A thread id that long is no longer refused: it imports whole."""
    src = tmp_path / "src.db"
    long_id = "x" * 250
    threads = ["s1", "s/2", long_id, "ünï"]
    with SqliteSaver.from_conn_string(str(src)) as saver:
        graph = build(saver)
        for thread in threads:
            graph.invoke(START_STATE, _cfg(thread))  # waits on its interrupt: pending writes too
        saver.conn.execute("UPDATE writes SET task_id = ? WHERE thread_id = ?", ("t" * 250, "s/2"))
        saver.conn.commit()
    url = tmp_path / "dst"
    code, doc, err = cli_json("import-langgraph", str(src), str(url))
    assert code == 1, (doc, err)
    assert not doc["ok"] and doc["threads"] == 4 and list(doc["failed"]) == ["s/2"]
    assert "task_id" in doc["failed"]["s/2"] and "limit is 200" in doc["failed"]["s/2"]
    code, out, err = cli("import-langgraph", str(src), str(url))  # a rerun: the rest is there
    assert code == 1 and "incomplete: 4 thread(s)" in out and "0 checkpoint(s) copied" in out
    assert "thread 's/2' not imported: " in err and "too long" in err
    with SqliteSaver.from_conn_string(str(src)) as source:
        dest = CkptfsSaver(str(url))
        for thread in ("s1", long_id, "ünï"):
            assert history(dest, thread) == history(source, thread) != [], thread
        dest.close()
    assert cli("verify", str(url))[0] == 0


def test_a_thread_written_in_the_store_by_another_process_is_reported(tmp_path: Path,
                                                                      sqlite_file: Path) -> None:
    import sys
    url = str(tmp_path / "store")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from ckptfs.integrations.langgraph import CkptfsSaver\n"
         "s = CkptfsSaver(sys.argv[1], lease_ttl=2)\n"
         "s.leases.ensure('done')\nprint('held', flush=True)\ntime.sleep(60)\n", url],
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        code, doc = run_cli("import-langgraph", str(sqlite_file), url)
        assert code == 1 and not doc["ok"] and set(doc["failed"]) == {"done"}
        assert "'done'" in doc["failed"]["done"]
        assert doc["threads"] == 3 and doc["checkpoints"] > 0
    finally:
        holder.kill()
        holder.wait()


# ----------------------------------------------------------------------------------- Postgres


def _pg_bin() -> Path:
    """The newest installed PostgreSQL's bin directory; apt-get installs it if none is (root)."""
    def found() -> list[str]:
        return sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)

    if not found() and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True, env=env,
                       capture_output=True)
    if not found():
        pytest.fail("PostgreSQL is not installed and could not be (need root and apt-get): "
                    "apt-get install -y postgresql")
    return Path(found()[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    bindir = _pg_bin()
    root = Path(tempfile.mkdtemp(prefix="ckptfs-pg-"))
    data, log = root / "data", root / "log"
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root: its own user, owning the directory
        shutil.chown(root, "postgres")
        root.chmod(0o700)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                    "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                    "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://postgres:hunter2@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_postgres_threads_import_to_s3_verify_clean_and_resume(
        postgres_dsn: str, s3_url: str, s3_opts: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(postgres_dsn) as source:
        source.setup()
        fill(source)
    monkeypatch.setenv("CKPTFS_STORAGE_OPTIONS", json.dumps(s3_opts))
    code, doc = run_cli("import-langgraph", postgres_dsn, s3_url)
    assert code == 0 and doc["ok"] and doc["threads"] == 3 and doc["checkpoints"] >= 20, doc
    assert "hunter2" not in json.dumps(doc) and "hunter2" not in capsys.readouterr().err
    code, again = run_cli("import-langgraph", postgres_dsn, s3_url)
    assert code == 0 and again["checkpoints"] == 0 and again["skipped"] == doc["checkpoints"]
    code, report = run_cli("verify", s3_url)
    assert code == 0 and report["ok"], report
    with PostgresSaver.from_conn_string(postgres_dsn) as source:
        check_imported(source, s3_url, s3_opts)


def test_an_unreachable_postgres_is_a_usage_error_without_the_password(tmp_path: Path) -> None:
    port = _free_port()
    code, doc = run_cli("import-langgraph", f"postgresql://u:s3cret@127.0.0.1:{port}/db", str(tmp_path))
    assert code == 2 and "cannot connect" in doc["error"]["message"]
    assert "s3cret" not in json.dumps(doc)


def test_a_thread_the_source_does_not_hold_is_a_usage_error(tmp_path: Path) -> None:
    """`--thread nosuch` said "imported: 1 thread(s) ... 0 checkpoint(s)" and exit 0: a typo
    imported nothing, silently. Now exit 2 naming it, before the store is touched."""
    src = tmp_path / "src.db"
    with SqliteSaver.from_conn_string(str(src)) as saver:
        build(saver).invoke(START_STATE, _cfg("t1"))
    store = tmp_path / "dst"
    code, out, err = cli("import-langgraph", str(src), str(store), "--thread", "t1", "--thread", "nosuch")
    assert code == 2 and "thread 'nosuch' not found in" in err and "nothing imported" in err, (out, err)
    assert not store.exists()
    code, out, err = cli("import-langgraph", str(src), str(store), "--thread", "t1")
    assert code == 0, (out, err)


def test_a_database_without_both_saver_tables_on_its_search_path_is_a_usage_error(
        tmp_path: Path, postgres_dsn: str) -> None:
    """The source was taken for a PostgresSaver's when a table named checkpoint_writes existed in
    any schema: a database holding only that table, or both in a schema off its search_path, was
    exit 3, 'unexpected UndefinedTable: relation "checkpoints" does not exist'. Now exit 2 naming
    the tables the saver would not find."""
    import psycopg

    base = postgres_dsn.rsplit("/", 1)[0]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE half_saver")
        conn.execute("CREATE DATABASE other_schema")
    with psycopg.connect(f"{base}/half_saver", autocommit=True) as conn:
        conn.execute("CREATE TABLE checkpoint_writes (thread_id text, task_id text)")
    with psycopg.connect(f"{base}/other_schema", autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.checkpoints (thread_id text)")
        conn.execute("CREATE TABLE app.checkpoint_writes (thread_id text)")
    for db, missing in (("half_saver", "(checkpoints not found"),
                        ("other_schema", "(checkpoints, checkpoint_writes not found")):
        code, out, err = cli("import-langgraph", f"{base}/{db}", str(tmp_path / db))
        assert code == 2 and "unexpected" not in err, (db, out, err)
        assert "holds no PostgresSaver tables " + missing in err and "hunter2" not in err, err
        assert not (tmp_path / db).exists()
