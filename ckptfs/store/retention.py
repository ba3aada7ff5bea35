"""Retention: keep the newest N valid snapshots of a run and what they need; delete the rest.

Deletion mirrors the write order in reverse (restic's rule): snapshots first, then deltas,
then journal records, so a crash midway leaves every kept snapshot loadable. Nothing is
deleted unless N snapshots validate, so the newest valid one always stays.

Journal records are also the fence of a remote store. A commit is one conditional PUT of the
next journal key, and it fails only while that key is taken, so on S3 a pruned record stays
where it is for `fence_seconds` after the snapshot that covers it was written: a writer that
confirmed its base more recently than half of that (every writer that committed or loaded in
the last minutes) needs no second request to know its base was not pruned under it, and only
one idle for longer checks first (store/checkpoint_store.py). Local disk checks its base with
two stats instead, so its records go at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from ckptfs.errors import ConfigError, CorruptFileError
from ckptfs.format import codec
from ckptfs.format.keys import RunFile, snap_key
from ckptfs.storage.base import Storage
from ckptfs.store.loader import RunLoader


@dataclass(frozen=True)
class RetentionResult:
    run_id: str
    kept_snapshots: list[int]
    deleted: list[str]
    dry_run: bool


def keeps_fences(storage: Storage) -> bool:
    """Whether pruned journal records stay a while as fences (see the module docstring)."""
    caps = storage.capabilities
    return caps.remote and caps.exclusive_create


def doomed_files(files: Iterable[RunFile], oldest: int, logs_upto: int) -> list[RunFile]:
    """What goes once `oldest` is the oldest kept snapshot, in deletion order: older snapshots,
    deltas starting below it, then journal records up to `logs_upto` (`oldest`, or lower where
    younger records stay as fences)."""
    files = list(files)
    return (sorted((f for f in files if f.kind == "snap" and f.version < oldest), reverse=True)
            + sorted(f for f in files if f.kind == "delta" and f.base < oldest)
            + sorted(f for f in files if f.kind == "log" and f.version <= logs_upto))


def fence_floor(storage: Storage, run_id: str, snapshots: Iterable[int], oldest: int,
                fence_seconds: float) -> int:
    """The highest version up to which journal records may go on a fencing store: that of the
    newest snapshot at or below `oldest` written more than `fence_seconds` ago (every record
    it covers is older still). Asks the store's clock, newest first, usually once or twice."""
    now = time.time()
    for v in sorted((s for s in snapshots if s <= oldest), reverse=True):
        try:
            if now - storage.modified(snap_key(run_id, v)) >= fence_seconds:
                return v
        except FileNotFoundError:
            continue
    return 0


def apply_retention(loader: RunLoader, run_id: str, keep: int, dry_run: bool = False,
                    check: str = "full", fence_seconds: float = 0.0) -> RetentionResult:
    """Keep the newest `keep` valid snapshots of `run_id` and what they need (the listing way:
    `ckptfs prune` and the seed API; a writer's compactor prunes from what it knows).

    check="full" decodes each kept snapshot with the reader; "digest" only re-hashes the file
    against its trailer. On a fencing store, journal records stay `fence_seconds` (module
    docstring).
    """
    if keep < 1:
        raise ConfigError("retention must keep at least one snapshot (keep_last >= 1)")
    files = loader.run_files(run_id)
    snaps = sorted((f for f in files if f.kind == "snap"), reverse=True)
    valid: list[int] = []
    for rf in snaps:
        try:
            data = loader.get_run_file(rf.key)
            if check == "digest":
                codec.verify_digest(data, rf.key)
            else:
                loader.decode(rf, data, run_id)
        except (CorruptFileError, FileNotFoundError):
            continue
        valid.append(rf.version)
        if len(valid) == keep:
            break
    if len(valid) < keep:
        return RetentionResult(run_id, valid, [], dry_run)
    oldest = valid[-1]
    logs_upto = oldest
    if fence_seconds > 0 and keeps_fences(loader.storage):
        logs_upto = fence_floor(loader.storage, run_id, (f.version for f in snaps), oldest,
                                fence_seconds)
    doomed = doomed_files(files, oldest, logs_upto)
    if not dry_run:
        loader.storage.delete_many([f.key for f in doomed])
    return RetentionResult(run_id, valid, [f.key for f in doomed], dry_run)
