"""Retention: keep the newest N valid snapshots of a run and what they need; delete the rest.

Deletion mirrors the write order in reverse (restic's rule): snapshots first, then deltas,
then journal records, so a crash midway leaves every kept snapshot loadable. Nothing is
deleted unless N snapshots validate, so the newest valid one always stays.

Journal records are also the fence of a remote store. A commit is one conditional PUT of the
next journal key, and it fails only while that key is taken, so on S3 a pruned record stays
where it is for at least `fence_seconds`: the writer's compactor deletes it that long after the
snapshot covering it was written, `ckptfs prune` that long after the record itself was (by the
store's clock, `fence_floor`). The compactor's first listing pass of a run also retires, by the
store's own times and clock through the same `fence_floor`, the records earlier processes left.
A writer that confirmed its base more recently than half of that (every writer that committed
or loaded in the last minutes; measured on the monotonic clock and the wall clock, whichever
says longer, because the first stops in a suspend) needs no second request to know its base
was not pruned under it; one idle for longer, or whose PUT itself took that long, checks its
base too (store/checkpoint_store.py). Local disk checks its base with two stats instead, so
its records go at once.

A superseded snapshot gets a grace too (`grace_floor`). A reader lists the run, then reads the
newest snapshot it saw and the records after it; a writer with keep_last=1 and a snapshot
every few commits retired exactly those files in between, and a reader looping `load_run` on a
starved machine ran out of its 25 reloads about once in 100 loads (FileNotFoundError). So a
snapshot stays, with the deltas and journal records after it, until the next one is
`superseded_grace` seconds old: a load that reads its files within that time of listing them
finds every one. Older snapshots go at the retention after that (the writer's next snapshot,
or the next prune), so files still stay bounded by what was written within the grace. On a
fencing store the two rules compose: journal records go up to the lower of the two floors.

The store's times are another machine's clock (an S3 server's, an NFS server's) or whatever a
copy or `touch` set, so `store_age` reads them with a bound: a time ahead of this clock counts
as now, and one more than the grace ahead as unknown (as old): taken as it was, a snapshot
dated a year ahead held every snapshot below it, with their records, through every prune of
that year. A store whose clock runs behind only makes snapshots look older: the grace is then
shorter, never less than no grace at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ckptfs.errors import ConfigError, CorruptFileError
from ckptfs.format import codec
from ckptfs.format.keys import RunFile, log_key
from ckptfs.storage.base import Storage
from ckptfs.store.loader import RunLoader

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionResult:
    run_id: str
    kept_snapshots: list[int]
    deleted: list[str]
    dry_run: bool
    # Why nothing was looked at: the run's folders that are no directory (a symlink, never
    # followed, or a file; `loader.unread_folders`). What they hold is unknown, so nothing of
    # the run is deleted: the newest valid snapshot may be there, or the records after it.
    unread: list[str] = field(default_factory=list)
    # Snapshots below the newest `keep` kept only for the superseded grace (`grace_floor`): why
    # a prune left more than it was told to keep; the retention after the grace removes them.
    graced: list[int] = field(default_factory=list)


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


def grace_floor(snapshots: Iterable[int], oldest: int, written: Callable[[int], float | None],
                grace: float, now: float) -> int:
    """The oldest snapshot to keep once `oldest` is the oldest one retention counts: going down
    from it, each next older snapshot stays while the one above it was written less than
    `grace` ago (module docstring). `written(v)` is snapshot v's time on the clock of `now`,
    None where unknown or gone (as good as old: nothing below it is kept for it). Snapshots are
    written in version order, so the first one old enough ends the walk: every one below was
    superseded earlier still; a walk costs one `written` per graced snapshot, plus one."""
    floor = oldest
    if grace <= 0:
        return floor
    for version in sorted({v for v in snapshots if v < oldest}, reverse=True):
        t = written(floor)
        if t is None or now - t >= grace:
            break
        floor = version
    return floor


def store_age(storage: Storage, key: str, grace: float) -> float | None:
    """How long ago the store says `key` was written, for the superseded grace (module
    docstring), on the store's own clock where it tells it in the same answer
    (`Storage.modified_and_now`: S3's Date header), else on this machine's. Against this
    machine's clock, a time ahead counts as now, so the grace it gives ends at most `grace`
    after this clock reaches that time; one more than `grace` ahead is no write within the
    grace on any clock worth trusting, and is None (unknown: as old). Without the bound a
    stateless prune kept a snapshot for as long as its time stayed ahead. Raises as
    `Storage.modified` does."""
    modified, store_now = storage.modified_and_now(key)
    age = (time.time() if store_now is None else store_now) - modified
    if age < -grace:
        return None
    return max(0.0, age)


def fence_floor(storage: Storage, run_id: str, logs: Iterable[int], oldest: int,
                fence_seconds: float, newest: str) -> int:
    """The highest version up to which journal records may go on a fencing store: the newest
    record at or below `oldest` written more than `fence_seconds` ago by the store's own clock
    (records are written in version order, so every one below it is older still), or 0 while
    that is unknown: a store without times, or `newest` gone meanwhile. A binary search over
    the records' times: a few HEADs, whatever snapshots came and went, plus one of `newest`.

    The store's "now" is what the store says its clock reads, in the same answer as the time of
    `newest` (`Storage.modified_and_now`: S3's Date header): a record counts as old only once
    the store itself dates it `fence_seconds` before its own now. Against this machine's clock
    alone, a machine an hour ahead took every record for an hour old and removed fences a stale
    writer's PUT was still to meet. Where the store does not say its now, it is bounded by the
    lower of this machine's clock and the time of `newest`, a file the store wrote last (the
    snapshot the compactor just wrote; for a listing, the run's newest journal record: every
    commit writes one), a time the store's clock has passed. That bound errs the other way
    only, which is why the store's own word comes first: on a run idle since its last commit
    it keeps the records of the `fence_seconds` before that commit until the run commits
    again, for good on a finished run."""
    versions = sorted(v for v in logs if v <= oldest)
    if not versions:
        return 0
    try:
        written, store_now = storage.modified_and_now(newest)
        now = min(time.time(), written) if store_now is None else store_now
        lo, hi, best = 0, len(versions) - 1, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            try:
                old = now - storage.modified(log_key(run_id, versions[mid])) >= fence_seconds
            except FileNotFoundError:  # deleted meanwhile (another prune): as good as old
                old = True
            if old:
                best, lo = versions[mid], mid + 1
            else:
                hi = mid - 1
    except (FileNotFoundError, NotImplementedError) as exc:  # `newest` gone, or no times
        logger.debug("run %s: the store's times unknown (%s); journal records stay as fences",
                     run_id, exc)
        return 0
    return best


def apply_retention(loader: RunLoader, run_id: str, keep: int, dry_run: bool = False,
                    check: str = "full", fence_seconds: float = 0.0,
                    superseded_grace: float = 0.0) -> RetentionResult:
    """Keep the newest `keep` valid snapshots of `run_id` and what they need (the listing way:
    `ckptfs prune` and the seed API; a writer's compactor prunes from what it knows).

    check="full" decodes each kept snapshot with the reader; "digest" only re-hashes the file
    against its trailer. On a fencing store, journal records stay `fence_seconds` by the
    store's clock (`fence_floor`: its now read with the run's newest record, one HEAD); a snapshot
    superseded less than `superseded_grace` ago stays with what a load from it reads, by the
    store's times of the snapshots above it (module docstring; a few HEADs on S3). A run one
    of whose folders is no directory is left whole (`unread`).
    """
    if keep < 1:
        raise ConfigError("retention must keep at least one snapshot (keep_last >= 1)")
    files, unread = loader.listing(run_id)
    if unread:
        return RetentionResult(run_id, [], [], dry_run, unread)
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
    if superseded_grace > 0:
        keys = {rf.version: rf.key for rf in snaps}
        now = time.time()

        def written(version: int) -> float | None:
            try:
                age = store_age(loader.storage, keys[version], superseded_grace)
            except (FileNotFoundError, NotImplementedError):  # gone, or a store without times
                return None
            return None if age is None else now - age

        oldest = grace_floor(keys, oldest, written, superseded_grace, now)
    graced = [rf.version for rf in snaps if oldest <= rf.version < valid[-1]]  # newest first
    logs_upto = oldest
    logs = [f for f in files if f.kind == "log"]
    if fence_seconds > 0 and keeps_fences(loader.storage) and logs:
        newest = max(logs, key=lambda f: f.version).key  # the run's last commit
        logs_upto = fence_floor(loader.storage, run_id, (f.version for f in logs), oldest,
                                fence_seconds, newest)
    doomed = doomed_files(files, oldest, logs_upto)
    if not dry_run:
        loader.storage.delete_many([f.key for f in doomed])
    return RetentionResult(run_id, valid, [f.key for f in doomed], dry_run, graced=graced)
