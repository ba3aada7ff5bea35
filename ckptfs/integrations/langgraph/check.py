"""The LangGraph saver's data, checked without LangGraph: what `ckptfs verify` runs on `langgraph/`.

A store shared between a `CheckpointStore` and a `CkptfsSaver` (the saver's `store=` option)
holds both; verify must judge the saver's keys rather than call them stray, or the maintenance
job would fail on every healthy shared store. This reads the same bytes the saver reads, with the
same format code (`codec.py`), and never imports LangGraph or runs its serializer: values stay
opaque bytes, but every frame, splice and delta chain is rebuilt and checksum-checked at level
"data", and at level "structure" every object is parsed and every reference resolved.

Findings are plain tuples (severity, code, message, key) so the checker, one layer up, turns
them into its own `Finding`s.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from typing import Any

from ckptfs.errors import CkptfsError, UnreadableFileError
from ckptfs.integrations.langgraph import codec as fmt
from ckptfs.integrations.langgraph.keys import (
    LG_ROOT,
    lg_group_of,
    lg_hashed,
    lg_is_plan,
    lg_leases_prefix,
    lg_name_key,
    lg_names_prefix,
    lg_parse_name,
    lg_parse_plan,
    lg_threads_prefix,
)
from ckptfs.integrations.langgraph.names import read_name_body
from ckptfs.storage.base import Storage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logfile import RecordLog
from ckptfs.storage.logstore import LOG_NAME, LogStorage, damaged_key
from ckptfs.storage.registry import open_storage

Problem = tuple[str, str, str, str]  # severity, code, message, key


def check(storage: Storage, keys: list[str], level: str,
                    max_size: int = fmt.DEFAULT_MAX_DECODED) -> Iterator[Problem]:
    """Check every LangGraph key among `keys` (as the raw storage lists them)."""
    yield from _unnamed_threads(keys)
    yield from _check_keys(storage, keys, level, max_size)


def _check_keys(storage: Storage, keys: list[str], level: str, max_size: int) -> Iterator[Problem]:
    logged = {k[: -len(LOG_NAME)] for k in keys if _is_log(k)}
    if logged and not isinstance(storage, LocalStorage):
        # a mirror of a local store holds its logs as objects: check copies of those namespaces
        # (log and any plain files beside it) as the files they were; findings name the same keys
        local_keys = [k for k in keys if lg_group_of(k) in logged]
        with tempfile.TemporaryDirectory(prefix="ckptfs-verify-") as tmp:
            local = open_storage(tmp, {"fsync": False})
            for key in local_keys:
                local.put(key, storage.get(key))
            yield from _check_keys(local, local_keys, level, max_size)
        keys = [k for k in keys if lg_group_of(k) not in logged]
    view: Storage = storage
    groups: set[str] = set()
    for key in keys:
        if _is_log(key) and isinstance(storage, LocalStorage):
            found = list(_check_log(storage, key))
            yield from found
            if not any(code == "lg-unreadable-log" for _sev, code, _msg, _key in found):
                groups.add(key[: -len(LOG_NAME)])
            continue
        owner = lg_group_of(key)
        if owner is not None:
            groups.add(owner)
        elif key.startswith(lg_leases_prefix()):
            continue  # who writes a thread now: not checkpoint state (as verify skips runs' leases)
        elif key.startswith(f"{LG_ROOT}/runs/"):
            yield from _check_marker(storage, key)
        elif key.startswith(lg_names_prefix()):
            yield from _check_name(storage, key)
        else:
            yield ("warning", "stray", "not a ckptfs LangGraph file (unexpected key)", key)
    if isinstance(storage, LocalStorage):
        view = LogStorage(storage, lg_group_of)
    try:
        for group in sorted(groups):
            yield from _check_group(view, group, level, max_size)
    finally:
        if view is not storage:
            view.close()


def _check_log(storage: LocalStorage, key: str) -> Iterator[Problem]:
    """One namespace's record log, scanned as a reader scans it: each damaged record (with the
    key it was for, where its bytes still say it), a torn tail, or why it cannot be read at all.

    A log that is a symbolic link or a FIFO is one finding, not the end of verify: it is never
    opened (links are not followed, a FIFO could block), and the store's other namespaces are
    checked all the same, as a linked thread directory is one "stray" among the rest.
    """
    path = storage.local_path(key)
    group = key[: -len(LOG_NAME)]
    log = RecordLog(path, fsync=False)
    try:
        try:
            log.refresh()
        except UnreadableFileError as exc:
            yield ("error", "lg-unreadable-log", f"the log {exc.reason}; not read, so what this thread "
                   "namespace holds is not checked (and a saver refuses to read it)", key)
            return
        for offset, why in log.damaged:
            was = damaged_key(path, offset, group)
            what = f"the record of {was}" if was is not None else "a record whose key is unreadable"
            yield ("error", "lg-damaged-record",
                   f"{what} at byte {offset} is damaged ({why}), skipped: what it held is lost", key)
        if log.torn is not None:
            offset, size, why = log.torn
            if why.startswith(("header cut short", "length")):
                # the prefix of a record: a write in progress, or one a crash cut short, which
                # no caller was told had succeeded; the next writer truncates it
                yield ("info", "lg-torn-tail", f"{size} byte(s) at byte {offset} after the last whole "
                       f"record ({why}): an interrupted write, never acknowledged (or one in progress); "
                       "the next writer truncates them", key)
            else:
                # no prefix of a record (its header is damaged) and no proof of a whole one:
                # junk after a crash, or a last record damaged beyond recognition
                yield ("warning", "lg-torn-tail", f"{size} unreadable byte(s) at byte {offset} after the "
                       f"last whole record ({why}): not a record's beginning, nor proven a whole "
                       "record; the next writer truncates them", key)
    finally:
        log.close()


def _is_log(key: str) -> bool:
    group = key[: -len(LOG_NAME)]
    return key.endswith("/" + LOG_NAME) and lg_group_of(group) == group


def _check_marker(storage: Storage, key: str) -> Iterator[Problem]:
    try:
        info = json.loads(storage.get(key))
        ok = isinstance(info, dict) and {"thread_id", "checkpoint_ns"} <= set(info)
    except (ValueError, UnicodeDecodeError):
        ok = False
    except FileNotFoundError:
        return
    except CkptfsError as exc:  # a link, a FIFO, unreadable: one finding, and verify goes on
        yield ("error", "lg-bad-marker", f"run marker cannot be read ({exc})", key)
        return
    if not ok:
        yield ("error", "lg-bad-marker", "run marker is not the JSON delete_for_runs reads", key)


def _unnamed_threads(keys: list[str]) -> Iterator[Problem]:
    """Hashed thread directories with no name object: every listing skips them, with a warning
    that sends its reader here (the checkpoints read back by id, and the next write of the
    thread stores its name again)."""
    threads, names = lg_threads_prefix(), {k for k in keys if k.startswith(lg_names_prefix())}
    segs = {k[len(threads):].split("/", 1)[0] for k in keys if k.startswith(threads)}
    for seg in sorted(s for s in segs if lg_hashed(s)):
        if lg_name_key(seg) not in names:
            yield ("error", "lg-missing-name", f"thread {seg} has no name object: it is left out of "
                   "listings until its next write stores the id again", lg_name_key(seg))


def _check_name(storage: Storage, key: str) -> Iterator[Problem]:
    """A hashed thread's name object: it must hold an id that hashes to its key, or the thread
    drops out of every listing (`list(None)`, `ckptfs threads`)."""
    try:
        body = read_name_body(storage, key)
    except FileNotFoundError:
        return
    except CkptfsError as exc:  # a link, a FIFO, too large: one finding, and verify goes on
        yield ("error", "lg-bad-name", f"thread name cannot be read ({exc}): the thread it names is "
               "left out of listings until its next write replaces it", key)
        return
    if lg_parse_name("~" + key[len(lg_names_prefix()):], body) is None:
        yield ("error", "lg-bad-name", "thread name is not the JSON of an id hashing to its key: "
               "the thread it names is left out of listings", key)


def _check_group(storage: Storage, group: str, level: str, max_size: int) -> Iterator[Problem]:
    """One thread namespace: every object parses, every reference resolves, (data) every value
    rebuilds through its chain."""
    objects: dict[str, fmt.Unpacked] = {}  # checkpoint id -> its ckpt/ (or else held/) object
    where: dict[str, str] = {}
    checkpoints: list[str] = []
    for key in storage.list(group):
        rest = key[len(group):]
        kind = rest.split("/", 1)[0]
        if kind not in ("ckpt", "held", "writes"):
            yield ("warning", "stray", "not a ckptfs LangGraph file (unexpected key)", key)
            continue
        if lg_is_plan(key):  # an empty read hint (S3): names checkpoints, holds nothing
            if lg_parse_plan(key) is None:
                yield ("warning", "stray", "not a ckptfs LangGraph read plan (unexpected key)", key)
            continue
        try:
            obj = fmt.unpack(storage.get(key), key, max_size)
        except FileNotFoundError:
            continue
        except CkptfsError as exc:
            yield ("error", "lg-corrupt", str(exc), key)
            continue
        if kind == "writes":
            yield from _check_writes(obj, key)
            continue
        cid = str(obj.header.get("id"))
        if kind == "ckpt":
            checkpoints.append(cid)
        if kind == "ckpt" or cid not in objects:
            objects[cid], where[cid] = obj, key
    values: dict[tuple[str, str], bytes | None] = {}
    for cid in sorted(checkpoints):
        obj = objects[cid]
        refs = obj.header.get("refs")
        if not isinstance(refs, dict):
            yield ("error", "lg-corrupt", "checkpoint header has no channel references", where[cid])
            continue
        for channel, ref in refs.items():
            holder = ref[0] if isinstance(ref, list) and ref else None
            if holder is None:
                continue
            problem = _resolve(objects, where, str(holder), str(channel), level, max_size, values)
            if problem is not None:
                yield (*problem[:2], f"checkpoint {cid}, channel {channel!r}: {problem[2]}", problem[3])


def _resolve(objects: dict[str, fmt.Unpacked], where: dict[str, str], holder: str, channel: str,
             level: str, max_size: int, values: dict[tuple[str, str], bytes | None],
             depth: int = 0) -> Problem | None:
    """Follow one channel version down its delta chain; at level "data" rebuild its value."""
    if (holder, channel) in values:
        return None if values[(holder, channel)] is not None or level != "data" else (
            "error", "lg-unreadable", "its value cannot be rebuilt (see the first finding)", where[holder])
    obj = objects.get(holder)
    if obj is None:
        return ("error", "lg-missing-version", f"the version it reads lives in checkpoint {holder}, "
                "which is gone", "")
    part = obj.parts.get(channel)
    if part is None:
        return ("error", "lg-missing-version", "referenced here but not stored", where[holder])
    if depth > 512 or (part.base is not None and part.depth < 1):
        return ("error", "lg-corrupt", "delta chain does not end", where[holder])
    base = None
    if part.base is not None:
        problem = _resolve(objects, where, part.base, channel, level, max_size, values, depth + 1)
        if problem is not None:
            values[(holder, channel)] = None
            return problem
        base = values.get((part.base, channel))
    if level == "data":
        try:
            values[(holder, channel)] = fmt.decode_part(part, f"{where[holder]}#{channel}", base, max_size)
        except CkptfsError as exc:
            values[(holder, channel)] = None
            return ("error", "lg-corrupt", str(exc), where[holder])
    else:
        values[(holder, channel)] = b""
    return None


def _check_writes(obj: fmt.Unpacked, key: str) -> Iterator[Problem]:
    items: Any = obj.header.get("items")
    try:
        total = sum(int(item[3]) for item in items)
    except (TypeError, ValueError, IndexError, OverflowError):
        yield ("error", "lg-corrupt", "pending-writes header has no item list", key)
        return
    if total != len(obj.raw):
        yield ("error", "lg-corrupt", f"pending writes hold {len(obj.raw)} bytes, the header says {total}",
               key)



check_langgraph = check  # the name the saver's own tests know it by
group_of = lg_group_of  # the plug-in's other half: which keys share one record log


def is_transient(key: str) -> bool:
    """Keys that are coordination, not checkpoint state (the thread leases): mirror and
    restore leave them behind, as they leave the workers' step leases, so a restored thread
    is not held by a writer on the lost machine."""
    return key.startswith(lg_leases_prefix())
