"""Catching up with other writers of a run: their journal records folded into this head.

Several workers commit to one run. A writer that lost a race (or has seen others commit)
lists the journal after its head's own record and applies what it finds, one GET per new
record (in parallel on remote backends), instead of reloading the run. Whenever the shortcut
cannot be sure (a gap, a damaged record, the head's own record pruned) it returns None and
the caller reloads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from pydantic import ValidationError

from ckptfs.errors import CorruptFileError
from ckptfs.format import codec
from ckptfs.format.changes import Changes
from ckptfs.format.keys import log_key, parse_run_key, run_prefix
from ckptfs.format.models import AgentRun, Step, ToolCall
from ckptfs.format.reader import REFS_FIELD
from ckptfs.storage.base import Storage
from ckptfs.store.compactor import Entry
from ckptfs.store.head import Head
from ckptfs.store.loader import RunLoader

logger = logging.getLogger(__name__)

Submit = Callable[[str, Any], None]  # the compactor's submit(kind, payload)


def _get_or_error(storage: Storage, key: str) -> bytes | BaseException:
    try:
        return storage.get(key)
    except FileNotFoundError as exc:
        return exc


def catch_up(storage: Storage, loader: RunLoader, head: Head, submit: Submit,
             pool: Callable[[], ThreadPoolExecutor]) -> int | None:
    """Apply the journal records committed after the head; how many, or None if unsure."""
    run_id = head.run_id
    # Listed from the head's own record on: finding nothing after it means nothing new only
    # if that record is still there. Retention (keep_last=1 at the newest version) can
    # have removed every record, newer ones included, once a snapshot holds them.
    try:
        keys = storage.list(f"{run_prefix(run_id)}log/",
                                 start_after=log_key(run_id, head.version - 1))
    except FileNotFoundError:
        return None
    files = [rf for k in keys if (rf := parse_run_key(k)) is not None and rf.kind == "log"]
    if not files or files[0].version != head.version:
        return None  # the head's record is gone: a full load sorts it out
    files = files[1:]
    if files and files[-1].version != head.version + len(files):
        return None  # a gap: retention or a branch
    fetched: Iterator[bytes | BaseException]
    if storage.capabilities.remote and len(files) > 1:  # round trips overlap
        fetched = pool().map(partial(_get_or_error, storage), [rf.key for rf in files])
    else:
        fetched = (_get_or_error(storage, rf.key) for rf in files)
    applied = 0
    for rf, data in zip(files, fetched, strict=True):
        key = rf.key
        try:
            if isinstance(data, BaseException):
                raise data
            rec = loader.decode(rf, data, run_id)
            if rec.header.base != head.version or rec.header.base_hash != head.hash:
                return None
            apply_record(loader, head, rec, submit)
        except (FileNotFoundError, ValidationError, CorruptFileError, ValueError, TypeError,
                AttributeError, KeyError, IndexError) as exc:
            logger.info("run %s: cannot catch up at %s (%s); reloading", run_id, key, exc)
            return None
        applied += 1
    if applied:
        head.shared = True
    return applied


def apply_record(loader: RunLoader, head: Head, rec: codec.Record, submit: Submit) -> None:
    """Fold another writer's journal record into the head and the compactor's replica.

    Everything is parsed and validated before the head changes, so a bad record leaves
    the head as it was.
    """
    body, h = rec.body, rec.header
    if not isinstance(body, dict):
        raise ValueError("record body is not an object")
    changes = Changes()
    run_json = None
    if body.get("run") is not None:
        changes.run = codec.dumps(body["run"])
        run_json = AgentRun.model_validate({**body["run"], "steps": {}}).model_dump_json(
            exclude={"steps"}).encode()
    steps: dict[str, Step] = {}
    for sid, doc in body.get("steps", {}).items():
        changes.steps[sid] = codec.dumps(doc)
        doc = dict(doc)
        refs = doc.pop(REFS_FIELD, None)
        if refs:
            loader.resolve_refs(doc, refs)
        steps[sid] = Step.model_validate(doc)
    removed = [str(sid) for sid in body.get("removed", [])]
    for sid in removed:
        changes.steps[sid] = None
    calls: dict[str, list[ToolCall]] = {}
    for sid, docs in body.get("tool_log", {}).items():
        changes.tool_log[sid] = [codec.dumps(c) for c in docs]
        out = []
        for c in docs:
            c = dict(c)
            refs = c.pop(REFS_FIELD, None)
            if refs:
                loader.resolve_refs(c, refs)
            out.append(ToolCall.model_validate(c))
        calls[sid] = out
    new_status = {sid: st.status.value for sid, st in steps.items()}
    head.counts = head.counts_after(new_status, removed)
    for sid, st in steps.items():
        head.steps_cmp[sid] = st.model_dump_json().encode()
        head.deps[sid] = tuple(st.dependencies)
        head.status[sid] = new_status[sid]
    for sid in removed:
        head.steps_cmp.pop(sid, None)
        head.deps.pop(sid, None)
        head.status.pop(sid, None)
    head.others.update(steps, removed)
    for sid, out in calls.items():
        head.tool_log.setdefault(sid, []).extend(out)
    if run_json is not None:
        head.run_json = run_json
    info: dict[str, Any] = {k: h.summary[k] for k in ("goal", "status", "updated_at")
                            if k in h.summary}
    if info:
        head.run_info = info
    entry = Entry(0, head.version, head.hash, h.version, h.hash, changes, rec.stored_size,
                  summary=dict(h.summary))
    head.version, head.hash = h.version, h.hash
    head.next_version = max(head.next_version, h.version + 1)
    submit("commit", (head.run_id, entry))
