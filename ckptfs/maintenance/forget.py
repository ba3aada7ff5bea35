"""Forget a run: delete every file under `runs/<run_id>/` (restic's `forget` of one run).

Refused while a worker may still be working on the run: a lease that is not released and was
written less than its ttl plus `LEASE_GRACE` ago (by the writer's clock, which is all a reader
has; expiry proper is observed, not computed, see store/leases.py) is live, and `force=True` is
needed to go on. A lease that has gone silent for longer is reported as stale and does not stop
the forget: its holder would be fenced off anyway.

On a store that fences with its journal keys (S3, `store/retention.py`), a run written to
less than `fence_seconds` ago by the store's own clock (or on a store that does not say its
time) is refused too, `force=True` again to go on. There a writer that committed or loaded
within half of its own `fence_seconds` commits with one conditional PUT of its next key and no
look at its base, so a forget under it left its next commits acknowledged on a run no load
could read (measured: v4 and v5 acknowledged, then CheckpointCorruptError). The default here
is the writers' default, which covers writers whose fence time is up to twice it; writers
given a longer one need the same given here. A writer that loaded an older run checks its
base on its first commit, after its PUT (`CheckpointStore`: a load dates the head by its
newest record), and forget deletes the newest version first, so such a writer meets the
missing base and stops, or its record landed before the second listing a forget makes at its
end, which reports it as an error: the run is then neither kept nor gone, and the writer must
be stopped before forgetting again. Local disk needs none of this: every commit there checks
its base.

Only what is ckptfs's goes (as `format/keys.py` `classify` reads the listing): the run's
journal records, deltas and snapshots, its leases, and ckptfs's own temp files. A file under
the run's prefix whose name does not parse (a user's notes, a filer's `.snapshot`) is not ours
and is never deleted (DESIGN.md): it is kept and named in the report.

Order: versions newest first, each version's journal record, deltas and snapshot together, then
the leases and temp files. A forget interrupted midway therefore
leaves the files of versions 1..k, which load as version k (a state the run really had) or, once
too little is left, as nothing; run it again to finish. Artifacts the run referenced are not
deleted here: other runs may share them (they are stored by content), and `prune` collects the
unreferenced ones after its grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptfs.errors import StoreNotWritableError
from ckptfs.format.keys import StoreListing, classify, parse_run_key, run_prefix
from ckptfs.format.models import validate_id
from ckptfs.format.units import seconds_value
from ckptfs.storage.base import Storage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.retry import RetryingStorage
from ckptfs.store.compactor import CompactionPolicy
from ckptfs.store.leases import read_leases
from ckptfs.store.retention import keeps_fences

logger = logging.getLogger(__name__)

LEASE_GRACE = 60.0  # seconds beyond a lease's ttl that it still counts as live (clock skew, pauses)
# How recent a write refuses the forget on a fencing store: the writers' own default, so that
# every writer that may commit without checking its base (within half of it) is covered.
FENCE_SECONDS = CompactionPolicy.fence_seconds


@dataclass
class LeaseState:
    """A lease found on the run: who holds which step, and whether it is still live."""

    step_id: str
    holder: str
    generation: int
    written_s_ago: float
    ttl: float
    live: bool


@dataclass
class ForgetReport:
    """What a forget found and did (or, with dry_run, would do)."""

    url: str
    run_id: str
    dry_run: bool
    found: bool = False
    refused: bool = False
    versions: int = 0
    deleted: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (key, why): not ckptfs's
    leases: list[LeaseState] = field(default_factory=list)
    unread_leases: list[str] = field(default_factory=list)  # "key: why", see _leases
    # The run's newest file, when a fencing store says it was written within fence_seconds:
    # (key, seconds ago; None when the store gave no clock to date it by).
    recent_write: tuple[str, float | None] | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def live_leases(self) -> list[LeaseState]:
        return [lease for lease in self.leases if lease.live]

    @property
    def ok(self) -> bool:
        return self.found and not self.refused and not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "run_id": self.run_id, "dry_run": self.dry_run, "found": self.found,
                "refused": self.refused, "ok": self.ok, "versions": self.versions,
                "files": len(self.deleted), "deleted": self.deleted,
                "kept": [{"key": k, "why": why} for k, why in self.kept],
                "leases": [asdict(lease) for lease in self.leases],
                "unread_leases": self.unread_leases,
                "recent_write": None if self.recent_write is None else {
                    "key": self.recent_write[0], "written_s_ago": self.recent_write[1]},
                "errors": self.errors}


def _leases(storage: Storage, run_id: str, now: float) -> tuple[list[LeaseState], list[str]]:
    """The run's leases, and the lease keys that cannot be read (a FIFO, a symbolic link).

    Such a key once made the whole forget exit 1, `--force` included, so the run could not be
    forgotten at all. No worker writes anything but a regular file at a lease key, so it is no
    worker's claim: it is named in the report and deleted as what it is (a link, not its target).
    """
    out = []
    unread: list[str] = []
    records = read_leases(storage, run_id, unread=unread)
    for sid, rec in sorted(records.items()):
        if rec.released:
            continue
        ago = now - rec.time
        out.append(LeaseState(sid, rec.holder, rec.generation, round(ago, 1), rec.ttl,
                              live=ago < rec.ttl + LEASE_GRACE))
    return out, unread


def _order(listing: StoreListing) -> list[str]:
    """Newest version first (journal, delta, snapshot of one version together), then the
    leases and temp files: what of the listing is ckptfs's."""
    files = [rf for found in listing.runs.values() for rf in found]
    rank = {"log": 0, "delta": 1, "snap": 2}
    files.sort(key=lambda f: (-f.version, rank[f.kind]))
    return [f.key for f in files] + sorted(listing.leases) + sorted(listing.temp)


def _recent_write(storage: Storage, listing: StoreListing, fence_seconds: float
                  ) -> tuple[str, float | None] | None:
    """The run's newest file and its age, if written less than `fence_seconds` ago by the
    store's own clock: its time and the store's now from one answer (S3: LastModified and the
    reply's Date). A store that does not say its now gives no age (None): refused, since this
    machine's clock, ahead by the fence time, made a run written a second before look old."""
    files = [rf for found in listing.runs.values() for rf in found]
    if not files:
        return None
    rank = {"log": 0, "delta": 1, "snap": 2}  # a commit writes the journal record first
    newest = min(files, key=lambda f: (-f.version, rank[f.kind])).key
    try:
        modified, store_now = storage.modified_and_now(newest)
    except FileNotFoundError:
        return (newest, 0.0)  # replaced or removed this instant: someone is at work on the run
    if store_now is None:
        return (newest, None)
    age = max(0.0, store_now - modified)  # both whole seconds on S3: never below 0 but by rounding
    return (newest, round(age, 1)) if age < fence_seconds else None


def _appeared(storage: Storage, prefix: str, listed: list[str]) -> list[str]:
    """Run files a second listing finds that the first did not: written during the forget."""
    before = set(listed)
    try:
        now = storage.list(prefix)
    except FileNotFoundError:
        return []
    return sorted(key for key in now if key not in before and parse_run_key(key) is not None)


def forget(storage: Storage, run_id: str, *, dry_run: bool = False, force: bool = False,
           fence_seconds: float = FENCE_SECONDS) -> ForgetReport:
    """Delete every file of `run_id` (see the module docstring for the order and the refusals).

    A store this user cannot delete from raises StoreNotWritableError with nothing deleted:
    `check_writable` before the first delete (a read-only mount or directory), else the first
    delete's refusal (a read-only folder of the run, an S3 policy). The CLI says "not-writable",
    exit 2, as `restore` and `mirror` into such a store do; it was a report of one error per
    file, exit 1. A refusal after some files went stops there (see the loop)."""
    validate_id(run_id, "run id")
    fence_seconds = seconds_value("forget", "fence_seconds", fence_seconds)
    report = ForgetReport(storage.display_url, run_id, dry_run)
    prefix = run_prefix(run_id)
    keys = storage.list(prefix)
    if not keys:
        return report
    listing = classify(keys)
    report.found = True
    report.versions = len({rf.version for found in listing.runs.values() for rf in found})
    report.kept = [(key, why) for key, why, _rid in listing.strays]
    report.leases, report.unread_leases = _leases(storage, run_id, time.time())
    for why in report.unread_leases:
        logger.warning("forget %s: lease not read, so it is no worker's claim: %s", run_id, why)
    if keeps_fences(storage) and not force:
        report.recent_write = _recent_write(storage, listing, fence_seconds)
    if (report.live_leases or report.recent_write is not None) and not force:
        report.refused = True
        return report
    ordered = _order(listing)
    if dry_run:
        report.deleted = ordered
        return report
    storage.check_writable()
    for key in ordered:
        try:
            storage.delete(key)
        except FileNotFoundError:
            pass
        except StoreNotWritableError as exc:
            if not report.deleted:
                raise
            # what follows fails the same way, or (a folder read-only, the next one not) goes
            # out of order: the files left must stay versions 1..k, as an interruption leaves
            report.errors.append(f"{key}: {exc}")
            logger.warning("forget %s: stopped, cannot delete %s: %s", run_id, key, exc)
            break
        except OSError as exc:
            report.errors.append(f"{key}: {exc}")
            logger.warning("forget %s: cannot delete %s: %s", run_id, key, exc)
            continue
        report.deleted.append(key)
    for key in _appeared(storage, prefix, keys):
        report.errors.append(f"{key}: written during the forget, so a writer is still at work on "
                             "the run: stop it, then forget the run again")
        logger.warning("forget %s: %s appeared during the forget", run_id, key)
    if not report.errors:
        _remove_empty_dirs(storage, prefix)
    logger.info("forget %s: %d file(s) of %d version(s) deleted", run_id, len(report.deleted),
                report.versions)
    return report


def _remove_empty_dirs(storage: Storage, prefix: str) -> None:
    """On local disk, the run's now empty directories go too, so `runs` no longer lists it."""
    inner = storage.inner if isinstance(storage, RetryingStorage) else storage
    if not isinstance(inner, LocalStorage):
        return
    top = inner.local_path(prefix.rstrip("/"))
    for dirpath, _dirs, _files in sorted(os.walk(top, topdown=False), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):  # not empty (a file arrived meanwhile): leave it
            os.rmdir(dirpath)
