"""`ckptfs threads` and `ckptfs show --thread`: a LangGraph saver's data, read without LangGraph.

A `CkptfsSaver` keeps its threads under `langgraph/threads/<thread>/<ns>/` (ckptfs/integrations/
langgraph/keys.py): `ckpt/<id>` per checkpoint, `held/<id>` for pruned ones still read,
`writes/<id>/...` for pending writes. On local disk one namespace's objects are records of one
log file (`.records`); those are read from a private copy, so that a listing never takes the
log's lock, truncates a torn tail or creates a file in the store it inspects. Checkpoint times
come from the ids (LangGraph's are uuid6, time-ordered); step and source from the metadata
when it is plain JSON or msgpack. A log with damaged records is named (their checkpoints are not
shown, the newest among them perhaps) and the command exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ckptfs.cli._common import EXIT_OK, EXIT_PROBLEMS, CliError, emit_json, out, warn
from ckptfs.cli._render import Col, age, clip, print_table, timestamp
from ckptfs.errors import CkptfsError, UnreadableFileError
from ckptfs.storage.base import Storage

_UUID_EPOCH = 0x01B21DD213814000  # 1582-10-15 in 100 ns units before 1970-01-01


def checkpoint_time(checkpoint_id: str) -> float | None:
    """The time a uuid6 (or uuid1) checkpoint id was made, as a Unix timestamp."""
    try:
        u = uuid.UUID(checkpoint_id)
    except ValueError:
        return None
    if u.version == 6:
        n = u.int >> 64
        ts = ((n >> 32) << 28) | (((n >> 16) & 0xFFFF) << 12) | (n & 0x0FFF)
    elif u.version == 1:
        ts = u.time
    else:
        return None
    return (ts - _UUID_EPOCH) / 1e7


def thread_ids(storage: Storage) -> list[str]:
    """The (encoded) thread directory names under langgraph/threads/."""
    from ckptfs.integrations.langgraph.keys import lg_threads_prefix

    try:
        return storage.list_dirs(lg_threads_prefix().rstrip("/"))
    except FileNotFoundError:
        return []


@dataclass
class Namespace:
    """One thread namespace: its checkpoints (id -> key), held ones and pending writes."""

    ns: str
    checkpoints: dict[str, str] = field(default_factory=dict)
    held: int = 0
    writes: dict[str, int] = field(default_factory=dict)  # checkpoint id -> writes
    reader: Storage | None = None
    damaged: list[int] = field(default_factory=list)  # offsets of damaged records in its log


@contextlib.contextmanager
def _namespaces(storage: Storage, thread_seg: str) -> Iterator[list[Namespace]]:
    """The namespaces of one thread, each with a Storage to read its objects from."""
    from ckptfs.integrations.langgraph.keys import LG_ROOT, lg_decode, lg_group_of
    from ckptfs.storage.logstore import LOG_NAME, LogStorage
    from ckptfs.storage.registry import open_storage

    base = f"{LG_ROOT}/threads/{thread_seg}/"
    keys = storage.list(base)
    groups: dict[str, list[str]] = {}
    for key in keys:
        group = lg_group_of(key)
        if group is not None:
            groups.setdefault(group, []).append(key)
    with tempfile.TemporaryDirectory(prefix="ckptfs-threads-") as tmp:
        local = open_storage(tmp, {"fsync": False})
        out_: list[Namespace] = []
        for group, gkeys in sorted(groups.items()):
            seg = group[len(base):].strip("/")
            ns = Namespace("" if seg == "_" else lg_decode(seg[1:]) if seg.startswith("_") else seg)
            reader: Storage = storage
            if any(k.endswith("/" + LOG_NAME) for k in gkeys):
                # the log and the saver's own objects beside it, never the strays there: a FIFO
                # or a link among those hid the namespace, a large one was read into memory
                # (verify reports them; the saver ignores them)
                ours = [k for k in gkeys if k == group + LOG_NAME
                        or k[len(group):].split("/", 1)[0] in ("ckpt", "held", "writes")]
                try:
                    copies = [(k, storage.get(k)) for k in ours]
                except UnreadableFileError as exc:  # a link or a FIFO at the log: not a thread of ours
                    warn(f"namespace {group} skipped: {exc} (see `ckptfs verify`)")
                    continue
                for k, data in copies:  # a private copy: reading never touches the store's log
                    local.put(k, data)
                view = LogStorage(local, lg_group_of)  # type: ignore[arg-type]
                gkeys = view.list(group)
                reader = view
                # a damaged record is left out of the listing: its checkpoint (perhaps the newest)
                # is missing from what is shown, which must say so
                ns.damaged = [d.offset for d in view.damage(group)]
                if ns.damaged:
                    warn(f"{group}{LOG_NAME}: damaged record(s) at byte "
                         f"{', '.join(map(str, ns.damaged))}: what they held is not shown, and the "
                         "newest checkpoint shown may not be the newest written (see `ckptfs verify`)")
            ns.reader = reader
            for k in gkeys:
                rest = k[len(group):].split("/")
                if rest[0] == "ckpt" and len(rest) == 2:
                    ns.checkpoints[lg_decode(rest[1])] = k
                elif rest[0] == "held":
                    ns.held += 1
                elif rest[0] == "writes" and len(rest) >= 2:
                    cid = lg_decode(rest[1])
                    ns.writes[cid] = ns.writes.get(cid, 0) + 1
            if seg.startswith("~"):
                ns.ns = _hashed_ns(reader, seg, gkeys, group) or ns.ns
            out_.append(ns)
        yield out_


def _hashed_ns(reader: Storage, seg: str, keys: list[str], group: str) -> str | None:
    """The namespace a hashed segment ("~" + sha256) stands for, from its objects' headers.

    A namespace whose encoding passes 200 characters (subgraphs nested four or five deep:
    "outer:<uuid>|inner:<uuid>|...") is stored under a hash and named only inside each object.
    Shown as the segment, `threads` and `show --thread` (and their --json) gave "~9f3c..." where
    the saver's own `list()` gives the namespace, so the two never matched. One header is read
    (the newest checkpoint's, else a held one's), and kept only if it hashes to the segment."""
    from ckptfs.integrations.langgraph import codec as lgcodec
    from ckptfs.integrations.langgraph.keys import lg_ns_segment

    def kind(key: str) -> tuple[str, ...]:
        return tuple(key[len(group):].split("/"))

    ckpts = sorted((k for k in keys if len(kind(k)) == 2 and kind(k)[0] == "ckpt"), reverse=True)
    held = sorted(k for k in keys if len(kind(k)) == 2 and kind(k)[0] == "held")
    for key in ckpts[:1] + held[:1]:
        try:
            ns = lgcodec.unpack(reader.get(key), key).header.get("ns")
            if isinstance(ns, str) and lg_ns_segment(ns) == seg:
                return ns
        except (CkptfsError, FileNotFoundError, ValueError):
            continue
    return None


def thread_name(storage: Storage, seg: str) -> str | None:
    """The thread id a thread directory stands for (None: a hashed one whose name is lost)."""
    from ckptfs.integrations.langgraph.keys import lg_decode, lg_hashed
    from ckptfs.integrations.langgraph.names import read_name

    return read_name(storage, seg) if lg_hashed(seg) else lg_decode(seg)


def list_threads(args: argparse.Namespace, storage: Storage) -> int:
    """`ckptfs threads URL`: one row per thread namespace."""
    from ckptfs.integrations.langgraph.keys import lg_threads_prefix

    rows: list[dict[str, Any]] = []
    damaged = False
    for seg in thread_ids(storage):
        name = thread_name(storage, seg)
        if name is None and not storage.list(f"{lg_threads_prefix()}{seg}/"):
            continue  # the empty directory a deleted thread leaves on local disk
        if name is None:
            warn(f"thread {seg} skipped: its id is not in langgraph/names/ (see `ckptfs verify`)")
            continue
        with _namespaces(storage, seg) as namespaces:
            for ns in namespaces:
                newest = max(ns.checkpoints, default=None)
                damaged = damaged or bool(ns.damaged)
                rows.append({"thread_id": name, "checkpoint_ns": ns.ns,
                             "checkpoints": len(ns.checkpoints), "held": ns.held,
                             "pending_writes": sum(ns.writes.values()), "newest": newest,
                             "newest_time": checkpoint_time(newest) if newest else None,
                             "damaged_records": ns.damaged})
    code = EXIT_PROBLEMS if damaged else EXIT_OK
    if args.json:
        emit_json({"url": storage.display_url, "threads": rows})
        return code
    console = out()
    if not rows:
        console.print(f"no LangGraph threads in {storage.display_name}", markup=False)
        return code
    table = [[clip(r["thread_id"], 40), r["checkpoint_ns"] or "(root)", str(r["checkpoints"]),
              str(r["pending_writes"]), age(r["newest_time"]), r["newest"] or "-"] for r in rows]
    cols = [Col("thread"), Col("ns", 3), Col("ckpts", justify="right"), Col("writes", 2, justify="right"),
            Col("newest", 4), Col("newest checkpoint", flex=True, min_width=12)]
    print_table(console, cols, table, title=f"LangGraph threads in {storage.display_name}")
    return code


def _metadata(obj: Any) -> dict[str, Any]:
    """The checkpoint's metadata if it is plain data (json or msgpack without extensions)."""
    kind = obj.header.get("mt")
    raw = obj.section("mo", "mn")
    try:
        if kind == "json":
            doc = json.loads(raw)
        elif kind == "msgpack":
            import ormsgpack

            doc = ormsgpack.unpackb(raw, ext_hook=lambda _code, _data: None)
        else:
            return {}
    except Exception:  # someone else's serializer: show what the header says, not more
        return {}
    return doc if isinstance(doc, dict) else {}


def show_thread(args: argparse.Namespace, storage: Storage) -> int:
    """`ckptfs show URL --thread T`: the thread's checkpoints, newest first."""
    from ckptfs.integrations.langgraph import codec as lgcodec
    from ckptfs.integrations.langgraph.keys import lg_thread_segment, lg_threads_prefix

    seg = lg_thread_segment(args.thread)
    # a deleted thread leaves its empty directory on local disk: `threads` does not list it, and
    # `show --thread` must not show it as a thread with no checkpoints either (exit 0, "[]")
    if seg not in thread_ids(storage) or not storage.list(f"{lg_threads_prefix()}{seg}/"):
        raise CliError(f"thread {clip(args.thread)!r} not found in {storage.display_name}", kind="not-found")
    rows: list[dict[str, Any]] = []
    damaged: list[dict[str, Any]] = []
    with _namespaces(storage, seg) as namespaces:
        for ns in namespaces:
            assert ns.reader is not None
            if ns.damaged:
                damaged.append({"checkpoint_ns": ns.ns, "offsets": ns.damaged})
            for cid in sorted(ns.checkpoints, reverse=True):
                row: dict[str, Any] = {"checkpoint_ns": ns.ns, "checkpoint_id": cid,
                                       "time": checkpoint_time(cid), "pending_writes": ns.writes.get(cid, 0)}
                try:
                    obj = lgcodec.unpack(ns.reader.get(ns.checkpoints[cid]), ns.checkpoints[cid])
                except (CkptfsError, FileNotFoundError) as exc:
                    row["error"] = str(exc)
                    rows.append(row)
                    continue
                md = _metadata(obj)
                # another saver's metadata (an import) says what it likes: a step of NaN was
                # printed as `NaN`, which is not JSON; what is not LangGraph's kind is unknown
                step, source = md.get("step"), md.get("source")
                row.update(parent=obj.header.get("parent"), run_id=obj.header.get("run_id"),
                           step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                           source=source if isinstance(source, str) else None,
                           channels_written=sorted(obj.parts), channels=sorted(obj.header.get("refs") or {}))
                rows.append(row)
    code = EXIT_PROBLEMS if damaged else EXIT_OK
    if args.json:
        emit_json({"url": storage.display_url, "thread_id": args.thread, "checkpoints": rows,
                   "damaged_records": damaged})
        return code
    table = [[r["checkpoint_id"], r["checkpoint_ns"] or "(root)",
              "-" if r.get("step") is None else str(r["step"]), str(r.get("source") or "-"),
              timestamp(r["time"]), str(r["pending_writes"]),
              r.get("error") or ", ".join(r.get("channels_written", [])) or "-"] for r in rows]
    cols = [Col("checkpoint"), Col("ns", 2), Col("step", justify="right"), Col("source", 3),
            Col("at", 4), Col("writes", 1, justify="right"), Col("channels written", flex=True)]
    print_table(out(), cols, table, title=f"thread {clip(args.thread)} in {storage.display_name}")
    return code
