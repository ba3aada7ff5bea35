"""Threads migrated in from another LangGraph saver: what `ckptfs import-langgraph` runs.

Every thread of a SqliteSaver file or a PostgresSaver database is copied into a ckptfs store
(CkptfsSaver's layout): every checkpoint of every namespace, with its metadata, its parent
link and its pending writes, so a graph compiled with CkptfsSaver resumes where the old saver
left it (an interrupt waits on its resume, time travel finds the old checkpoints).

* Checkpoints are read through the source's own saver (`list`), so its storage format and its
  migrations of old rows are its business; their channel versions are strings, which CkptfsSaver
  continues (`versions.py`).
* Pending writes are read as rows (task id, task path, idx, channel, serde type, bytes) and
  stored byte for byte: a saver's `pending_writes` drops the idx and task path that fix the
  order DeltaChannel replays a super-step's writes in. A saver that is neither (any other
  `BaseCheckpointSaver`) is copied through `pending_writes`, in the order it gives them.
* Oldest first per namespace, each checkpoint's writes before the checkpoint itself, and a
  checkpoint already in the store is skipped (its missing write objects are added): a rerun
  after a crash or an interruption converges, and an import of a grown source adds the rest;
  it also stores again the name of a long thread (`langgraph/names/`) that the store lost.
* Each thread is written under its lease (one writer per thread), taken before the store is
  looked at (so two imports at once never both copy an object) and given back at once.
* A thread that cannot be copied (another process writes it in the store; an id the saver
  refuses, e.g. over its length limit; a row of it the source cannot read back, or a damaged
  page of its file; another history under its id in the store, none of whose checkpoints is the
  source's, which the import would merge with it) is reported in `ImportReport.failed` with the reason,
  and the others are copied: one bad thread does not stop an import of thousands.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointTuple

from ckptfs.errors import CkptfsError, ConfigError, InvalidIdError
from ckptfs.integrations.langgraph.keys import (
    lg_checkpoint_key,
    lg_hashed,
    lg_ns_prefix,
    lg_thread_segment,
    lg_write_key,
    lg_write_slot,
    lg_writes_prefix,
)
from ckptfs.integrations.langgraph.ownership import ThreadBusyError, shown
from ckptfs.integrations.langgraph.plans import checkpoint_keys
from ckptfs.integrations.langgraph.saver import CkptfsSaver
from ckptfs.storage.redact import redact_url

logger = logging.getLogger(__name__)

Row = tuple[str, str, int, str, str, bytes]  # task id, task path, idx, channel, serde type, bytes
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
SQLITE_READONLY_DIRECTORY = 1544  # sqlite3.h: SQLITE_READONLY | (6 << 8)


@dataclass
class ImportReport:
    """What one import did, per thread and in total; `ok` unless a thread could not be copied."""

    source: str
    threads: int = 0
    checkpoints: int = 0  # copied now
    skipped: int = 0  # already in the store
    writes: int = 0  # pending-write objects copied now
    failed: dict[str, str] = field(default_factory=dict)  # thread -> why

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "ok": self.ok, "threads": self.threads,
                "checkpoints": self.checkpoints, "skipped": self.skipped, "writes": self.writes,
                "failed": dict(self.failed)}


class UnreadableThreadError(CkptfsError):
    """A thread of the source that cannot be read (a row its serializer refuses, a damaged page)."""


class ForeignThreadError(CkptfsError):
    """The store holds another history under the thread's id: importing would merge the two."""


class Source:
    """A saver to copy from: its threads, its checkpoints (through the saver), its write rows."""

    def __init__(self, saver: BaseCheckpointSaver[Any], display: str) -> None:
        self.saver = saver
        self.display = display

    def thread_ids(self) -> list[str]:
        """Every thread id; this generic one reads every checkpoint once to find them."""
        return sorted({str(t.config["configurable"]["thread_id"]) for t in self.saver.list(None)})

    def rows(self, thread_id: str, ns: str, checkpoint_id: str) -> list[Row] | None:
        """The checkpoint's pending writes as stored, or None: use the tuple's pending_writes."""
        return None

    def close(self) -> None:
        """Close what the source opened (connections)."""


class SqliteSource(Source):
    """A SqliteSaver file, opened read-only: importing never changes (or creates) it."""

    def __init__(self, path: str) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        if not Path(path).is_file():
            raise ConfigError(f"no SQLite file at {path}")
        # The name goes into a URI, so it is percent-encoded: SQLite reads '?' and '#' as the end
        # of the name and '%' as an escape, and it opened "my" (created, read-write) for my#1.db.
        uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
        try:
            self.conn = sqlite3.connect(_reader_uri(path, uri), uri=True, check_same_thread=False)
            self.conn.execute("PRAGMA query_only=1")  # a read-write connection too writes nothing
        except sqlite3.Error as exc:  # a file this user may not read: bad input, not a crash
            raise ConfigError(f"cannot open {path}: {exc}") from None
        try:
            try:
                tables = _table_names(self.conn)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != SQLITE_READONLY_DIRECTORY:
                    raise
                self.conn.close()
                self.conn = _open_immutable(path, uri)
                tables = _table_names(self.conn)
        except sqlite3.DatabaseError as exc:
            # connect() reads nothing: a file of other bytes fails here ("file is not a database"),
            # and is a SOURCE that is not a saver's like any other (exit 2), not a crash
            self.conn.close()
            if isinstance(exc, sqlite3.OperationalError):  # locked, unreadable: a database, not now
                raise ConfigError(f"cannot read {path}: {exc}") from None
            raise ConfigError(f"{path} is not a SqliteSaver database (SQLite: {exc})") from None
        if not {"checkpoints", "writes"} <= tables:
            self.conn.close()
            raise ConfigError(f"{path} is not a SqliteSaver database (no checkpoints/writes tables)")
        self.has_path = any(r[1] == "task_path" for r in self.conn.execute("PRAGMA table_info(writes)"))
        saver = SqliteSaver(self.conn)
        # its setup switches the file to WAL and adds a column: writes, which a rollback-journal
        # file refused ("attempt to write a readonly database", every thread); the tables are
        # known to be there, and whether writes has task_path is known too
        saver.is_setup = True
        saver._has_task_path = self.has_path  # an attribute newer savers read; older ones ignore it
        super().__init__(saver, path)

    def thread_ids(self) -> list[str]:
        try:
            return [str(r[0]) for r in self.conn.execute(
                "SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id")]
        except sqlite3.DatabaseError as exc:  # a damaged page: which threads there are is unknown
            raise ConfigError(f"cannot list the threads of {self.display}: {exc}") from None

    def rows(self, thread_id: str, ns: str, checkpoint_id: str) -> list[Row] | None:
        path = "task_path" if self.has_path else "''"
        cur = self.conn.execute(
            f"SELECT task_id, {path}, idx, channel, type, value FROM writes WHERE thread_id = ? "
            "AND checkpoint_ns = ? AND checkpoint_id = ?", (thread_id, ns, checkpoint_id))
        return [(str(t), str(p or ""), int(i), str(c), str(ty), bytes(v or b"")) for t, p, i, c, ty, v in cur]

    def close(self) -> None:
        self.conn.close()


def _table_names(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _reader_uri(path: str, uri: str) -> str:
    """How to open the file so that nothing is left beside it. A read-only reader of a WAL-mode
    file creates its -wal and -shm and, unlike the last read-write connection, never removes
    them: every import left both beside the user's file. So a WAL-mode file with neither beside
    it (nobody has it open), which this user may write, is opened read-write, query_only (no
    statement writes), and SQLite removes the two at close, the database's bytes unchanged (its
    WAL is empty, so the checkpoint at close copies nothing). Any other file is opened
    read-only: a rollback-journal file's reader creates nothing, and where -wal or -shm already
    stand their owner keeps them."""
    resolved = Path(path).resolve()
    try:
        with resolved.open("rb") as f:
            header = f.read(100)
    except OSError:
        return uri  # connect() names what is wrong
    wal_mode = header.startswith(b"SQLite format 3\0") and header[18:20] == b"\x02\x02"
    if (wal_mode and not Path(f"{resolved}-wal").exists() and not Path(f"{resolved}-shm").exists()
            and os.access(resolved, os.W_OK) and os.access(resolved.parent, os.W_OK)):
        return uri.replace("?mode=ro", "?mode=rw")
    return uri


def _open_immutable(path: str, uri: str) -> sqlite3.Connection:
    """A WAL-mode file (every SqliteSaver's) in a directory this user may not write: a read-only
    mount, a backup. A reader of such a file creates its -shm index beside it, which fails there
    (SQLITE_READONLY_DIRECTORY). With no WAL content to index the file alone is the database,
    read as immutable: nobody can be writing it there, since a writer needs its -wal file."""
    wal = Path(f"{Path(path).resolve()}-wal")
    if wal.exists() and wal.stat().st_size:
        raise ConfigError(f"cannot read {path}: its directory is read-only and {wal.name} holds "
                          "changes SQLite must index beside it; copy both files to a writable directory")
    return sqlite3.connect(f"{uri}&immutable=1", uri=True, check_same_thread=False)


class PostgresSource(Source):
    """A PostgresSaver database, by DSN (postgresql://user:password@host:port/db)."""

    def __init__(self, dsn: str) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        try:
            self.conn: Any = psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        except psycopg.OperationalError as exc:
            raise ConfigError(f"cannot connect to {redact_url(dsn)}: {str(exc).strip()}") from None
        except psycopg.Error as exc:  # a DSN libpq refuses to parse (ProgrammingError); it quotes it
            why = str(exc).strip().replace(dsn, redact_url(dsn))
            raise ConfigError(f"{redact_url(dsn)} is not a valid PostgreSQL DSN: {why}") from None
        # the tables PostgresSaver's unqualified names resolve to (search_path), not a table of
        # that name in any schema: a database holding only checkpoint_writes, or holding it in
        # another schema, failed later with exit 3 (UndefinedTable: relation "checkpoints")
        missing = [t for t in ("checkpoints", "checkpoint_writes")
                   if (self.conn.execute("SELECT to_regclass(%s) AS oid", (t,)).fetchone() or {}).get("oid")
                   is None]
        if missing:
            self.conn.close()
            raise ConfigError(f"{redact_url(dsn)} holds no PostgresSaver tables ({', '.join(missing)} "
                              "not found on its search_path)")
        cols = {r["attname"] for r in self.conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass('checkpoint_writes') "
            "AND attnum > 0 AND NOT attisdropped")}
        self.has_path = "task_path" in cols
        super().__init__(PostgresSaver(self.conn), redact_url(dsn))

    def thread_ids(self) -> list[str]:
        import psycopg

        try:
            return [str(r["thread_id"]) for r in self.conn.execute(
                "SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id")]
        except psycopg.Error as exc:  # a table that is not PostgresSaver's, a connection lost
            raise ConfigError(f"cannot list the threads of {self.display}: {str(exc).strip()}") from None

    def rows(self, thread_id: str, ns: str, checkpoint_id: str) -> list[Row] | None:
        path = "task_path" if self.has_path else "'' AS task_path"
        cur = self.conn.execute(
            f"SELECT task_id, {path}, idx, channel, type, blob FROM checkpoint_writes WHERE "
            "thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s", (thread_id, ns, checkpoint_id))
        return [(str(r["task_id"]), str(r["task_path"] or ""), int(r["idx"]), str(r["channel"]),
                 str(r["type"]), bytes(r["blob"] or b"")) for r in cur]

    def close(self) -> None:
        self.conn.close()


def sqlite_path(spec: str) -> str | None:
    """The file a SOURCE names, if it names a SQLite file: `sqlite:///relative/path`,
    `sqlite:////absolute/path` (SQLAlchemy's spelling) or a path ending .sqlite/.sqlite3/.db."""
    if spec.startswith("sqlite:///"):
        return spec[len("sqlite:///"):]
    if spec.startswith("sqlite:"):
        raise ConfigError(f"{spec!r}: write sqlite:///relative/path or sqlite:////absolute/path")
    if spec.lower().endswith(SQLITE_SUFFIXES):
        return spec
    return None


def open_source(spec: str) -> Source:
    """The saver SOURCE names: a SQLite file or a PostgreSQL DSN."""
    if spec.startswith(("postgresql://", "postgres://")):
        return PostgresSource(spec)
    path = sqlite_path(spec)
    if path is not None:
        return SqliteSource(path)
    raise ConfigError(f"{redact_url(spec)}: not a source this command knows; give a SqliteSaver file "
                      "(sqlite:///path, or a .sqlite/.db path) or a PostgresSaver DSN (postgresql://...)")


def import_threads(source: Source, dest: CkptfsSaver, thread_ids: Sequence[str] | None = None,
                   progress: Callable[[str, int], None] | None = None) -> ImportReport:
    """Copy the threads (default: all) of `source` into `dest`; see the module docstring."""
    report = ImportReport(source.display)
    for thread_id in thread_ids if thread_ids is not None else source.thread_ids():
        report.threads += 1
        try:
            _import_thread(source, dest, thread_id, report)
        except (ThreadBusyError, InvalidIdError, UnreadableThreadError, ForeignThreadError) as exc:
            # A thread the store cannot take now (another process writes it) or ever (an id
            # over the saver's length limit), or the source cannot give (a damaged row or
            # page): that thread fails, the others are still copied. The id is checked, and
            # the source read, before its first write, so nothing of it is half-imported.
            report.failed[thread_id] = str(exc)
            logger.warning("%s", exc)
        finally:
            dest.release(thread_id)
        if progress is not None:
            progress(thread_id, report.checkpoints)
    return report


def _by_namespace(tuples: Iterator[CheckpointTuple]) -> dict[str, list[CheckpointTuple]]:
    spaces: dict[str, list[CheckpointTuple]] = defaultdict(list)
    for tup in tuples:
        spaces[str(tup.config["configurable"].get("checkpoint_ns") or "")].append(tup)
    for items in spaces.values():
        items.sort(key=lambda t: str(t.config["configurable"]["checkpoint_id"]))  # oldest first
    return spaces


def _read_thread(source: Source, thread_id: str) -> tuple[dict[str, list[CheckpointTuple]],
                                                           dict[tuple[str, str], list[Row] | None]]:
    """Everything of the thread the source holds, read before anything of it is written."""
    try:
        spaces = _by_namespace(source.saver.list({"configurable": {"thread_id": thread_id}}))
        rows = {(ns, cid): source.rows(thread_id, ns, cid) for ns, tuples in spaces.items()
                for cid in (str(t.config["configurable"]["checkpoint_id"]) for t in tuples)}
    except Exception as exc:  # the source's bytes, through its serializer and its database
        raise UnreadableThreadError(f"LangGraph thread {shown(thread_id)} cannot be read from "
                                    f"{source.display}: {type(exc).__name__}: "
                                    f"{str(exc).strip() or 'no detail'}") from exc
    return spaces, rows


def _refuse_foreign(dest: CkptfsSaver, thread_id: str, spaces: dict[str, list[CheckpointTuple]]) -> None:
    """A namespace the store holds checkpoints of, none of them the source's: another thread
    under the same id (two sources' "1"), whose history the import would merge with this one,
    the newest of either then read as the thread's state. Checked before anything is written."""
    for ns, tuples in sorted(spaces.items()):
        theirs = {lg_checkpoint_key(thread_id, ns, str(t.config["configurable"]["checkpoint_id"]))
                  for t in tuples}
        held = checkpoint_keys(dest.storage.list(lg_ns_prefix(thread_id, ns) + "ckpt/"))
        if held and theirs.isdisjoint(held):
            where = f"namespace {ns!r}" if ns else "its root namespace"
            raise ForeignThreadError(
                f"the store already holds another history of LangGraph thread {shown(thread_id)}: "
                f"{len(held)} checkpoint(s) in {where}, none of them this source's (another thread "
                "under the same id, or this one's imported checkpoints all pruned since); importing "
                "would merge the two histories (the newer of either read as the thread's state); "
                "import into another store, or delete the thread there first")


@contextlib.contextmanager
def _holding(dest: CkptfsSaver, thread_id: str) -> Iterator[None]:
    """The thread's lease, held from before the store is looked at until its last write: what
    the store holds of it (present, foreign) is then known, not a guess another import (or a
    running graph) overtook between the look and the first write. That import re-stored the
    other's checkpoints, replacing them, and both reports counted them."""
    if dest.leases is None:
        yield
        return
    tenure = dest.leases.begin(thread_id, wait=dest.busy_timeout)
    done = False
    try:
        yield
        done = True
    finally:
        dest.leases.end(thread_id, tenure, confirm=done)


def _import_thread(source: Source, dest: CkptfsSaver, thread_id: str, report: ImportReport) -> None:
    spaces, rows = _read_thread(source, thread_id)
    if spaces:
        with _holding(dest, thread_id):
            _write_thread(dest, thread_id, report, spaces, rows)


def _write_thread(dest: CkptfsSaver, thread_id: str, report: ImportReport,
                  spaces: dict[str, list[CheckpointTuple]],
                  rows: dict[tuple[str, str], list[Row] | None]) -> None:
    _refuse_foreign(dest, thread_id, spaces)
    if spaces and lg_hashed(lg_thread_segment(thread_id)):
        dest.name_thread(thread_id)  # a rerun that copies nothing still puts back a lost name
    for ns, tuples in sorted(spaces.items()):
        present = set(dest.storage.list(lg_writes_prefix(thread_id, ns)))
        versions: dict[str, dict[str, Any]] = {}
        for tup in tuples:
            cid = str(tup.config["configurable"]["checkpoint_id"])
            cfg: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}
            report.writes += _copy_writes(rows[(ns, cid)], dest, tup, cfg, present)
            versions[cid] = dict(tup.checkpoint.get("channel_versions") or {})
            if dest.storage.exists(lg_checkpoint_key(thread_id, ns, cid)):
                report.skipped += 1
                continue
            parent = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            parent_cfg: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
            if parent is not None:
                parent_cfg["configurable"]["checkpoint_id"] = str(parent)
            before = versions.get(str(parent), {}) if parent is not None else {}
            new_versions = {ch: v for ch, v in versions[cid].items() if before.get(ch) != v}
            dest.put(parent_cfg, tup.checkpoint, tup.metadata, new_versions)
            report.checkpoints += 1


def _copy_writes(rows: list[Row] | None, dest: CkptfsSaver, tup: CheckpointTuple, cfg: Any,
                 present: set[str]) -> int:
    """The checkpoint's pending-write objects the store lacks, written before the checkpoint."""
    conf = cfg["configurable"]
    if rows is None:  # a generic saver: its pending_writes, idx by position within each task
        rows = []
        position: defaultdict[str, int] = defaultdict(int)
        for task_id, channel, value in tup.pending_writes or []:
            idx = WRITES_IDX_MAP.get(channel, position[task_id])
            position[task_id] += 1
            typ, raw = dest.serde.dumps_typed(value)
            rows.append((str(task_id), "", idx, str(channel), typ, raw))
    groups: dict[tuple[str, str], list[tuple[int, str, str, bytes]]] = defaultdict(list)
    for task_id, task_path, idx, channel, typ, raw in rows:
        groups[(task_id, task_path)].append((idx, channel, typ, raw))
    copied = 0
    for (task_id, task_path), items in sorted(groups.items()):
        regular = sorted(i for i in items if i[0] >= 0)
        wanted = [[i] for i in items if i[0] < 0] + ([regular] if regular else [])
        for part in wanted:
            key = lg_write_key(conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"], task_id,
                               lg_write_slot(min(i[0] for i in part)))
            if key in present:
                continue
            with contextlib.suppress(FileExistsError):
                dest.put_serialized_writes(cfg, task_id, task_path, part)
            present.add(key)
            copied += 1
    return copied
