"""Removing checkpoints from a namespace without breaking the ones that stay.

A checkpoint does not hold every channel value: unchanged channels refer to the checkpoint that
stored their version, and a message list is a delta against its previous version. So deleting
`ckpt/<id>` could take a surviving checkpoint's values with it. Before a checkpoint goes, every
version a survivor still reads, directly or as a delta base, is rewritten to `held/<id>`, and
held objects nobody needs any more go. Deletes run newest first, so whatever a crash midway
leaves still reads back whole. prune, delete_for_runs and (through the saver) delete_thread
rely on this.

Functions, not saver methods: they need only the storage, a reader of objects and the
serializer's view of a checkpoint's metadata, so the saver's caches stay its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptfs.integrations.langgraph import codec as fmt
from ckptfs.integrations.langgraph.keys import (
    lg_checkpoint_key,
    lg_decode,
    lg_encode,
    lg_held_key,
    lg_is_plan,
    lg_parse_plan,
)
from ckptfs.integrations.langgraph.memory import Loaded
from ckptfs.integrations.langgraph.plans import checkpoint_keys
from ckptfs.storage.base import Storage

CKPT = "ckpt/"
HELD = "held/"

Choose = Callable[[Sequence[Loaded]], set[str]]  # checkpoints oldest first -> ids to remove


def writes_by_checkpoint(storage: Storage, prefix: str) -> dict[str, list[str]]:
    """Pending-write keys of one namespace by encoded checkpoint id: one listing, not one each."""
    index: dict[str, list[str]] = {}
    start = len(prefix + "writes/")
    for wkey in storage.list(prefix + "writes/"):
        index.setdefault(wkey[start:].split("/", 1)[0], []).append(wkey)
    return index


def of_run(run_id: str) -> Choose:
    """The checkpoints one LangGraph run wrote (`delete_for_runs`)."""
    def choose(items: Sequence[Loaded]) -> set[str]:
        return {str(i.header["id"]) for i in items if i.header.get("run_id") == run_id}
    return choose


def all_but_newest(n: int) -> Choose:
    """Every checkpoint but the newest `n` (`prune(strategy="keep_latest")`)."""
    def choose(items: Sequence[Loaded]) -> set[str]:
        return {str(i.header["id"]) for i in items[:-n]}
    return choose


def delta_ancestors(loaded: Mapping[str, Loaded], cid: str,
                    metadata: Callable[[Loaded], Mapping[str, Any]]) -> list[str]:
    """The ancestors a checkpoint's delta channels (LangGraph's DeltaChannel) rebuild from: up
    to the nearest that stores each channel whose value the checkpoint itself does not store."""
    head = loaded[cid].header
    if not head.get("delta_channels"):
        return []
    counters = metadata(loaded[cid]).get("counters_since_delta_snapshot")
    refs = head.get("refs") or {}
    # without the channels' names (a metadata LangGraph may rename): the whole chain
    pending: set[str] | None = None if not isinstance(counters, dict) else {
        str(ch) for ch in counters if (refs.get(ch) or [None])[0] is None}
    out: list[str] = []
    parent = head.get("parent")
    while isinstance(parent, str) and parent in loaded and (pending is None or pending):
        out.append(parent)
        if pending is not None:
            prefs = loaded[parent].header.get("refs") or {}
            pending = {ch for ch in pending if (prefs.get(ch) or [None])[0] is None}
        parent = loaded[parent].header.get("parent")
    return out


def remove_checkpoints(storage: Storage, thread_id: str, prefix: str, choose: Choose,
                       read: Callable[[str], Loaded],
                       metadata: Callable[[Loaded], Mapping[str, Any]]) -> str | None:
    """Remove the checkpoints `choose` picks from the namespace at `prefix`, keeping what the
    survivors need. Returns the namespace when any went (the caller forgets what it cached of
    it), else None. `read` loads an object, FileNotFoundError when it is gone."""
    listed = storage.list(prefix + CKPT)
    ckpt_keys = checkpoint_keys(listed)
    plan_keys = [k for k in listed if lg_is_plan(k)]
    held_keys = storage.list(prefix + HELD)
    loaded: dict[str, Loaded] = {}
    for key in ckpt_keys:
        try:
            item = read(key)
        except FileNotFoundError:
            continue
        loaded[str(item.header["id"])] = item
    ordered = [loaded[c] for c in sorted(loaded)]
    remove = choose(ordered) & set(loaded)
    if not remove:
        return None
    keep = set(loaded) - remove
    # DeltaChannel rebuilds a value from its ancestors' writes back to the nearest one that
    # stores it (a snapshot): a survivor keeps that stretch of its chain, and so does every
    # ancestor kept that way, for any survivor can be read (history, time travel)
    work = sorted(keep)
    while work:
        for ancestor in delta_ancestors(loaded, work.pop(), metadata):
            if ancestor not in keep:
                keep.add(ancestor)
                work.append(ancestor)
    remove -= keep
    if not remove:
        return None
    holders: dict[str, Loaded] = dict(loaded)
    for key in held_keys:
        try:
            item = read(key)
        except FileNotFoundError:
            continue
        holders.setdefault(str(item.header["id"]), item)
    needed: dict[str, set[str]] = {}
    for cid in keep:
        for channel, (holder, _v) in loaded[cid].header["refs"].items():
            while holder is not None and channel not in needed.get(holder, set()):
                needed.setdefault(holder, set()).add(channel)
                part = holders[holder].obj.parts.get(channel) if holder in holders else None
                holder = part.base if part is not None else None
    ns = str(next(iter(loaded.values())).header["ns"])
    # versions still read move to held/ first; then checkpoints go newest first, so whatever
    # a crash midway leaves still reads back whole
    for cid in sorted(remove & set(needed), reverse=True):
        head = {"kind": "held", "id": cid, "ns": ns, "refs": {}}
        parts = [p for c, p in loaded[cid].obj.parts.items() if c in needed[cid]]
        storage.put(lg_held_key(thread_id, ns, cid), fmt.pack(head, b"", parts))
    writes_of = writes_by_checkpoint(storage, prefix)
    doomed = [lg_checkpoint_key(thread_id, ns, cid) for cid in sorted(remove, reverse=True)]
    doomed += [w for cid in sorted(remove, reverse=True) for w in writes_of.get(lg_encode(cid), [])]
    doomed += [key for key in held_keys if lg_decode(key.rsplit("/", 1)[1]) not in needed]
    # read plans: after the checkpoints (a reader meanwhile takes an older plan or none,
    # and walks what it names wrong); a survivor's plan may now name a pruned checkpoint,
    # whose versions the walk finds in held/
    for k in plan_keys:
        plan = lg_parse_plan(k)
        if plan is None or lg_decode(plan[0]) in remove:
            doomed.append(k)
    storage.delete_many(doomed)
    return ns
