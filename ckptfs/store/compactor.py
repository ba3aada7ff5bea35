"""The background compactor: journal records merged into deltas and snapshots from memory.

It keeps its own replica of each run this process writes and never reads a file back: every
`fanout` records of one level become one delta of the next level, and a full snapshot is
written once the records a load would need outweigh the last snapshot (`snapshot_ratio`) or
grow past `max_plan` files. Scheduling by bytes is what keeps a long run's bytes written
linear: a snapshot re-encodes the whole state, so it is due after a change of about its own
size, not after a fixed number of commits (snapshots then come at roughly doubling versions).

Retention runs here too, from what the compactor knows instead of a listing: the snapshots it
wrote (and the one the run was loaded from) are the valid ones, the deltas it wrote and the
journal range are the files; only the first pass of a process lists the run once for what
earlier processes left, and counts their snapshots (each checked) towards `keep_last`, so a
process too short-lived to write that many of its own still retires what is below them; on a
fencing store it also reads the store's times of their journal records (a few HEADs), so one
too short-lived to see their fence time pass still removes those whose time is up.
Deletes go in batches (store/retention.py decides what, how long a remote store keeps journal
records as fences, and how long a superseded snapshot stays for readers that listed it).
Compaction is an optimisation: a failure is logged, commits go on, and loads fall back to the
finer records.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import ConfigError, CorruptFileError, RecordTooLargeError
from ckptfs.format import codec
from ckptfs.format.changes import Changes
from ckptfs.format.keys import RunFile, delta_key, log_key, parse_run_key, run_prefix, snap_key
from ckptfs.format.units import require_real, require_whole, shown_number
from ckptfs.format.units import seconds_value as seconds_value  # mirror.py imports it from here
from ckptfs.storage.base import Storage
from ckptfs.store.retention import (
    doomed_files,
    fence_floor,
    grace_floor,
    keeps_fences,
    store_age,
)

logger = logging.getLogger(__name__)

# CompactionPolicy.superseded_grace's default, named for the callers that take a grace of their
# own (`ckptfs prune`, mirror-side retention) and default to what a writer keeps.
DEFAULT_SUPERSEDED_GRACE = 60.0


# Compactors whose thread ran in this process, for `_flush_at_exit`; weak, as in `Compactor`.
_started: weakref.WeakSet[Compactor] = weakref.WeakSet()
_exit_lock = threading.Lock()
_exit_hooked = False
EXIT_FLUSH_SECONDS = 10.0  # for all of them together (the store's atexit flush: 10 s each)


def _flush_at_exit() -> None:
    """Finish the compaction still pending when the interpreter exits, while S3 can still be
    reached: from threading's exit hooks, which run before `concurrent.futures` stops its
    pools and before any atexit handler.

    From a plain atexit handler (the store's) it failed on S3, every request of it: s3fs's
    atexit finalizer, registered at its first request and so after the store's handler, runs
    first and closes the client's HTTP session; the next request opens a new one, which
    aiobotocore builds in the event loop's default executor, and that executor stopped
    taking work when `concurrent.futures` shut its pools ("cannot schedule new futures after
    shutdown", logged once per pending record, and the deltas and snapshots were lost). S3
    storage now gives that loop an executor that still serves at exit (storage/exit_pools.py);
    the early hook stays, so the flush still runs before non-daemon threads are joined."""
    deadline = time.monotonic() + EXIT_FLUSH_SECONDS
    with _exit_lock:  # a WeakSet refuses to be iterated while another thread adds to it
        started = list(_started)
    for compactor in started:
        left = deadline - time.monotonic()
        if left <= 0 or not compactor.flush(left):
            logger.info("ckptfs compactor: exiting with compaction pending; loads read the "
                        "journal records instead")
            return


def _hook_exit(compactor: Compactor) -> None:
    """Have `_flush_at_exit` flush `compactor` (the hook itself is registered once)."""
    global _exit_hooked
    with _exit_lock:
        _started.add(compactor)
        register: Callable[[Callable[[], None]], None] | None = getattr(
            threading, "_register_atexit", None)  # CPython >= 3.9; else the store's atexit flush
        if _exit_hooked or register is None:
            return
        # threading runs its exit hooks newest first: registered after concurrent.futures' own
        # (made at that module's import), this one runs before the pools stop
        importlib.import_module("concurrent.futures.thread")
        try:
            register(_flush_at_exit)
        except RuntimeError:  # started while the interpreter is exiting: too late to register
            return
        _exit_hooked = True


# encode(kind, run_id, version, base, base_hash, hash, changes, summary) -> file bytes
Encode = Callable[[codec.RecordKind, str, int, int, str, str, Changes, dict[str, Any]], bytes]


@dataclass(frozen=True)
class CompactionPolicy:
    """How the background compactor bounds total bytes and load cost.

    fanout: records of one level merged into one record of the next.
    max_plan: a snapshot is due once a load would read more than this many records (with
        fanout 16, 64 is reached only past 65,535 records since the last snapshot: the byte
        rule decides first).
    snapshot_ratio: a snapshot is due once the records since the last one weigh this
        fraction of it (a load then reads at most 1 + ratio times the snapshot's bytes).
    min_snapshot_bytes: no snapshot before the records since the last one reach this size.
    keep_last: full snapshots kept per run by automatic retention (0 disables it).
    fence_seconds: how long a remote store keeps pruned journal records as fences, and twice
        how long a writer may go without confirming its base (store/retention.py).
    superseded_grace: seconds a snapshot outlives the next one, with the records a load from
        it reads (store/retention.py), so a reader that listed the run before that next
        snapshot was written still finds every file it listed. The default covers a load of a
        large run from S3 on a busy machine many times over; what it costs is the superseded
        records of the last minute. 0 retires a superseded snapshot at once.
    background: False runs compaction inline in the committing thread (tests, debugging).
    """

    fanout: int = 16
    max_plan: int = 64
    snapshot_ratio: float = 1.0
    min_snapshot_bytes: int = 256 * 1024
    keep_last: int = 3
    fence_seconds: float = 600.0
    superseded_grace: float = DEFAULT_SUPERSEDED_GRACE
    background: bool = True

    def __post_init__(self) -> None:
        # Each field checked alone, by name, and kept as the checked int or float (frozen:
        # set through object.__setattr__): `fence_seconds=True` was a fence of 1 s, an infinite
        # snapshot_ratio meant no snapshot by size ever, and a NaN min_snapshot_bytes none at all.
        owner = "CompactionPolicy"
        checked: dict[str, object] = {
            "fanout": require_whole(owner, "fanout", self.fanout, 2),
            "max_plan": require_whole(owner, "max_plan", self.max_plan, 2),
            "keep_last": require_whole(owner, "keep_last", self.keep_last, 0),
            "min_snapshot_bytes": require_whole(owner, "min_snapshot_bytes",
                                                self.min_snapshot_bytes, 0),
            "fence_seconds": seconds_value(owner, "fence_seconds", self.fence_seconds),
            "superseded_grace": seconds_value(owner, "superseded_grace", self.superseded_grace),
        }
        ratio = require_real(owner, "snapshot_ratio", self.snapshot_ratio)
        if not (math.isfinite(ratio) and ratio > 0):
            raise ConfigError("CompactionPolicy: snapshot_ratio must be finite and > 0, got "
                              f"{shown_number(self.snapshot_ratio)}")
        checked["snapshot_ratio"] = ratio
        if not isinstance(self.background, bool):  # "false" is true: a background compactor
            raise TypeError(f"{owner}: background must be True or False, got "
                            f"{shown_number(self.background)} ({type(self.background).__name__})")
        for name, value in checked.items():
            object.__setattr__(self, name, value)


@dataclass
class Entry:
    """One record the compactor holds until it is merged: a level-0 journal record or a delta."""

    level: int
    base: int
    base_hash: str
    version: int
    hash: str
    changes: Changes
    size: int
    # What the replica merges: `changes` packed (codec.pack) when None. A level-0 entry keeps
    # `changes` as written, so its delta is encoded without unpacking; merged entries hold
    # packed fragments only.
    replica: Changes | None = None
    # Steps whose model JSON the writer's head took plain (the commit does not pack, 15 us
    # it would wait for): each goes back packed, as (step id, the head's very bytes, packed),
    # for the head to adopt (Head.adopt_packed). The replica's packed fragment is reused
    # where the record holds those same bytes, so the head and the replica share one copy.
    head_plain: dict[str, codec.Fragment] = field(default_factory=dict)
    packed_back: collections.deque[tuple[str, codec.Fragment, bytes]] | None = None
    # The header summary (goal, status, counts) of the journal record at `version`: a delta or
    # snapshot ending there carries it too, so `versions` still tells a version's status once
    # retention has deleted the record itself (every pruned run's oldest kept snapshot).
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunCompaction:
    """The compactor's replica of one run and the records merged since its last snapshot."""

    replica: Changes
    version: int
    hash: str
    snapshot_bytes: int
    stack: list[Entry] = field(default_factory=list)
    carried_reads: int = 0  # records a load needs that this process did not write
    carried_bytes: int = 0
    # What retention knows without listing (module docstring): snapshots known valid with the
    # monotonic time each was known to exist (the loaded one counts from when it was seeded),
    # the snapshots and deltas to delete once below the oldest kept, the journal records
    # already gone (<= logs_gone), and whether earlier processes' files were listed yet.
    snapshots: list[tuple[int, float]] = field(default_factory=list)
    # Every snapshot version known to exist and when it was first known to (monotonic: it
    # stops in a suspend, which only makes the fences last longer), kept past the snapshot's
    # own deletion until the journal records it covers are gone: those go fence_seconds after.
    covers: list[tuple[int, float]] = field(default_factory=list)
    files: list[RunFile] = field(default_factory=list)
    # When listed snapshots were written, by the store's times read in the pass that listed the
    # run (on this monotonic clock): what the superseded grace counts from for snapshots this
    # process did not write; an adopted one's time in `snapshots` is only when it was adopted.
    written: dict[int, float] = field(default_factory=dict)
    logs_gone: int = 0
    listed: bool = False
    # The version of a sound snapshot another writer stored above this replica's, found when
    # one of ours landed below it (`Compactor._overtaken`): records up to it go into the
    # replica only, no file of this process covers them any more.
    passed: int = 0
    summary: dict[str, Any] = field(default_factory=dict)  # the newest merged record's (Entry.summary)


class Compactor:
    """Merges journal records into deltas and snapshots from memory, off the commit path."""

    IDLE_EXIT_SECONDS = 10.0
    # Records are handed over in batches, not one wake-up per commit: waking the thread after
    # each commit cost the committing thread ~0.1 ms (a context switch and a GIL hand-over
    # in the middle of its next commit; p50 815 -> 700 us at 1 KB steps with fsync). The
    # thread takes what is pending once BATCH records are, or WAKE_SECONDS after the first.
    BATCH = 64
    WAKE_SECONDS = 0.05

    def __init__(self, policy: CompactionPolicy, storage: Storage, encode: Encode) -> None:
        # Weak: the store owns the compactor, and an idle store must be collectable (its
        # compactor thread exits after a quiet spell; atexit flushes what is still alive).
        self._encode = weakref.WeakMethod(encode)
        self._storage = storage
        self._policy = policy
        self._runs: dict[str, RunCompaction] = {}
        self._pending: collections.deque[tuple[str, Any] | None] = collections.deque()
        self._working = 0  # items taken from `_pending` and not yet handled
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def submit(self, kind: str, payload: Any) -> None:
        if not self._policy.background:
            self._handle(kind, payload)
            return
        with self._cv:  # enqueue under the lock the idle thread checks before it exits
            self._pending.append((kind, payload))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ckptfs-compactor",
                                                daemon=True)
                self._thread.start()
                _hook_exit(self)
            elif kind != "commit" or len(self._pending) >= self.BATCH:
                self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted is handled; False if `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            if self._thread is None or not self._thread.is_alive():  # none, or a parent's (fork)
                return not self._pending
            self._cv.notify_all()  # the thread takes what is pending now, not at its next tick
            while self._pending or self._working:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(self.WAKE_SECONDS if left is None else min(left, self.WAKE_SECONDS))
        return True

    def stop(self) -> None:
        with self._cv:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._pending.append(None)
            self._cv.notify_all()
        thread.join(timeout=30)

    def _loop(self) -> None:
        """Work the pending records in batches; exit after a quiet spell so idle stores hold
        no thread."""
        idle_since = time.monotonic()
        while True:
            with self._cv:
                if len(self._pending) < self.BATCH:
                    self._cv.wait(self.WAKE_SECONDS)
                if not self._pending:
                    if time.monotonic() - idle_since > self.IDLE_EXIT_SECONDS:
                        self._thread = None
                        self._cv.notify_all()
                        return
                    continue
                batch = list(self._pending)
                self._pending.clear()
                self._working = len(batch)
            for item in batch:
                try:
                    if item is None:
                        with self._cv:
                            self._working = 0
                            self._pending.clear()
                            self._thread = None
                            self._cv.notify_all()
                        return
                    self._handle(*item)
                except Exception:  # compaction is an optimisation: log, keep committing
                    self.errors += 1
                    logger.exception("ckptfs compactor: %s failed; loads fall back to finer "
                                     "records", item[0] if item else "stop")
                finally:
                    with self._cv:
                        self._working = max(0, self._working - 1)
                        if not self._working:
                            self._cv.notify_all()
            idle_since = time.monotonic()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "init":
            run_id, rc = payload
            rc.listed = rc.listed or rc.version == 0  # a run this process began: nothing older
            self._runs[run_id] = rc
            return
        if kind == "forget":
            self._runs.pop(payload, None)
            return
        run_id, entry = payload
        packed = entry.replica if entry.replica is not None else entry.changes.packed()
        entry.replica = None
        self._pack_back(entry, packed)
        rc = self._runs.get(run_id)
        if rc is None or rc.version != entry.base:
            return  # this process no longer owns the run's head; nothing consistent to merge
        rc.replica.merge(packed, full_state=True)
        rc.version, rc.hash, rc.summary = entry.version, entry.hash, entry.summary
        if entry.version <= rc.passed:
            return  # a delta or snapshot ending here would lie below another writer's snapshot
        rc.stack.append(entry)
        encode = self._encode()
        if encode is None:
            return
        self._merge_levels(encode, run_id, rc)
        reads = rc.carried_reads + len(rc.stack)
        pending = rc.carried_bytes + sum(e.size for e in rc.stack)
        due = max(rc.snapshot_bytes * self._policy.snapshot_ratio, self._policy.min_snapshot_bytes)
        if reads > self._policy.max_plan or pending >= due:
            self._snapshot(encode, run_id, rc)

    @staticmethod
    def _pack_back(entry: Entry, packed: Changes) -> None:
        back, plain = entry.packed_back, entry.head_plain
        if back is None or not plain:
            return
        written = entry.changes.steps
        for sid, mj in plain.items():
            frag = packed.steps.get(sid) if written.get(sid) is mj else None
            back.append((sid, mj, bytes(frag) if frag is not None else codec.pack(mj)))
        entry.head_plain = {}

    def _merge_levels(self, encode: Encode, run_id: str, rc: RunCompaction) -> None:
        f = self._policy.fanout
        while len(rc.stack) >= f:
            top = rc.stack[-f:]
            level = top[0].level
            if any(e.level != level for e in top):
                return
            merged = Changes()
            for e in top:
                merged.merge(e.changes)
            first, last = top[0], top[-1]
            try:
                data = encode("delta", run_id, last.version, first.base, first.base_hash,
                              last.hash, merged, last.summary)
            except RecordTooLargeError as exc:  # a delta is optional: loads read the records
                logger.warning("run %s: not writing delta v%d-v%d: %s", run_id, first.base,
                               last.version, exc)
                size = sum(e.size for e in top)
            else:
                key = delta_key(run_id, first.base, last.version)
                with contextlib.suppress(FileExistsError):  # another writer's, as good: ours to prune too
                    self._storage.put_if_absent(key, data)
                rc.files.append(RunFile(last.version, "delta", first.base, key))
                size = len(data)
            if level == 0:  # from here on held packed: the replica is at `last` right now
                steps = rc.replica.steps
                merged = Changes(merged.run, {sid: None if frag is None else steps.get(sid, frag)
                                              for sid, frag in merged.steps.items()},
                                 merged.tool_log).packed()
            rc.stack[-f:] = [Entry(level + 1, first.base, first.base_hash, last.version,
                                    last.hash, merged, size, summary=last.summary)]

    def _snapshot(self, encode: Encode, run_id: str, rc: RunCompaction) -> None:
        try:
            data = encode("snapshot", run_id, rc.version, rc.version, rc.hash, rc.hash, rc.replica,
                          rc.summary)
        except RecordTooLargeError as exc:
            # The state outgrew what a load decodes in one file. Writing it anyway would be
            # worse than useless: retention counts it as a kept snapshot and deletes the
            # records a load really needs. Loads go on reading the older snapshot and the
            # journal and deltas already written; the next try comes after another full plan
            # of records, so an oversized state costs O(state) per max_plan commits, not each.
            logger.warning("run %s: not writing a snapshot at v%d: %s (raise max_decoded_bytes "
                           "to let loads read the state in one file)", run_id, rc.version, exc)
            rc.stack.clear()
            rc.carried_reads = rc.carried_bytes = 0
            return
        key = snap_key(run_id, rc.version)
        try:
            self._storage.put_if_absent(key, data)
        except FileExistsError:  # another writer sharing the run wrote it: counted once it checks
            if self._sound(key):
                rc.snapshots.append((rc.version, time.monotonic()))
            else:
                rc.files.append(RunFile(rc.version, "snap", rc.version, key))
        else:
            if self._overtaken(run_id, rc, key):
                rc.stack.clear()
                rc.carried_reads = rc.carried_bytes = 0
                return
            rc.snapshots.append((rc.version, time.monotonic()))
        rc.covers.append((rc.version, time.monotonic()))
        rc.stack.clear()
        rc.snapshot_bytes = len(data)
        rc.carried_reads = rc.carried_bytes = 0
        if self._policy.keep_last:
            self._retire(run_id, rc)

    def _overtaken(self, run_id: str, rc: RunCompaction, key: str) -> bool:
        """Whether the snapshot just written at `key` lies below a sound one another writer
        stored (one LIST of the snapshots after it, on every store); if so it is withdrawn and
        `rc.passed` set, so nothing more of this process's goes below that one.

        A writer whose compaction lands late (its exit flush runs up to EXIT_FLUSH_SECONDS
        after its last commit) may find the run taken over meanwhile: the successor's first
        listing pass did not see this snapshot, and its retention removes the journal records
        above it (at once, or once their fences are up) but never the snapshot itself. Left
        there, it was a run's oldest snapshot below a missing record: `ckptfs verify` reported
        the record lost, as it must for a record lost above a snapshot retention kept (the
        two look alike in the store), on a run whose every kept version loads. No load needs
        it: a load starts at the newest sound snapshot, and one of a version below that one
        was not kept by any retention that removed the records above this one.
        A successor that has no snapshot yet has not listed the run either: its first pass
        will find this one and count it, so it stays."""
        try:
            later = sorted((rf for k in self._storage.list(f"{run_prefix(run_id)}snap/",
                                                           start_after=key)
                            if (rf := parse_run_key(k)) is not None
                            and rf.kind == "snap" and rf.version > rc.version), reverse=True)
            newer = next((rf.version for rf in later if self._sound(rf.key)), None)
            if newer is None:
                return False
            self._storage.delete(key)
        except OSError as exc:  # unknown: the snapshot stays, as it did before this check
            logger.debug("run %s: could not look for snapshots above v%d (%s)", run_id,
                         rc.version, exc)
            return False
        rc.passed = newer
        logger.info("run %s: snapshot v%d withdrawn: another writer's v%d is newer (this "
                    "process's head fell behind it); nothing of this process up to v%d is "
                    "written", run_id, rc.version, newer, newer)
        return True

    def _adopt(self, run_id: str, rc: RunCompaction, listed: list[RunFile], keep: int) -> None:
        """Count snapshots earlier processes left as kept ones, newest first, each once it
        checks (`_sound`), until `keep` are known.

        A process that lives for one snapshot or two (an agent that crashes, or is restarted,
        every few minutes) never knows `keep` snapshots of its own: without this, retention
        never ran and a run's files grew without bound (a hostile review: 16,157 journal
        records, 1,013 deltas and 13 snapshots after 40 restarts). Their fences, on a remote
        store, count from now: later than they were written, so they only last longer.
        """
        have = {v for v, _t in rc.snapshots}
        for rf in sorted((f for f in listed if f.kind == "snap" and f.version not in have),
                         key=lambda f: f.version, reverse=True):
            if len(rc.snapshots) >= keep:
                break
            if self._sound(rf.key):
                now = time.monotonic()
                rc.snapshots.append((rf.version, now))
                rc.covers.append((rf.version, now))
        rc.snapshots.sort()
        rc.covers.sort()

    def _sound(self, key: str) -> bool:
        """Whether a snapshot another writer wrote matches its own trailer (one GET, on the
        shared-run path only): retention may then count it as a kept snapshot."""
        try:
            codec.verify_digest(self._storage.get(key), key)
        except (CorruptFileError, FileNotFoundError, PermissionError):
            return False
        return True

    def _retire(self, run_id: str, rc: RunCompaction) -> None:
        """Retention from what this compactor knows (module docstring), in one batch of deletes."""
        keep = self._policy.keep_last
        if len(rc.snapshots) < keep and rc.listed:
            return
        lowest: int | None = None
        listed_snaps: set[int] = set()
        listed_logs: list[int] = []
        if not rc.listed:  # once per process: what earlier processes left below
            rc.listed = True
            listed = [rf for key in self._storage.list(run_prefix(run_id))
                      if (rf := parse_run_key(key)) is not None]
            self._adopt(run_id, rc, listed, keep)
            known = {f.key for f in rc.files} | {snap_key(run_id, v) for v, _t in rc.snapshots}
            rc.files += [rf for rf in listed if rf.kind != "log" and rf.key not in known]
            listed_logs = [rf.version for rf in listed if rf.kind == "log"]
            lowest = min(listed_logs, default=-1)
            listed_snaps = {rf.version for rf in listed if rf.kind == "snap"}
        if len(rc.snapshots) < keep:
            return
        oldest = self._grace_floor(run_id, rc, rc.snapshots[-keep][0], listed_snaps)
        if lowest is not None:
            rc.logs_gone = max(rc.logs_gone, oldest) if lowest < 0 else lowest - 1
        logs_upto = oldest
        if keeps_fences(self._storage):
            now, wait = time.monotonic(), self._policy.fence_seconds
            logs_upto = max((v for v, t in rc.covers if v <= oldest and now - t >= wait),
                            default=rc.logs_gone)
            if listed_logs:
                logs_upto = max(logs_upto, self._aged_fences(run_id, rc, listed_logs, oldest))
        own = [RunFile(v, "snap", v, snap_key(run_id, v)) for v, _t in rc.snapshots if v < oldest]
        doomed = doomed_files([*own, *rc.files], oldest, 0)
        logs = [log_key(run_id, v) for v in range(rc.logs_gone + 1, logs_upto + 1)]
        if not doomed and not logs:
            rc.covers = [(v, t) for v, t in rc.covers if v > rc.logs_gone]
            return
        self._storage.delete_many([f.key for f in doomed] + logs)
        gone = {f.key for f in doomed}
        rc.files = [f for f in rc.files if f.key not in gone]
        rc.snapshots = [(v, t) for v, t in rc.snapshots if v >= oldest]
        rc.written = {v: t for v, t in rc.written.items() if v >= oldest}
        rc.logs_gone = max(rc.logs_gone, logs_upto)
        rc.covers = [(v, t) for v, t in rc.covers if v > rc.logs_gone]
        logger.debug("run %s: retention removed %d files (oldest kept snapshot v%d)", run_id,
                     len(doomed) + len(logs), oldest)

    def _aged_fences(self, run_id: str, rc: RunCompaction, logs: list[int], oldest: int) -> int:
        """The newest listed journal record at or below `oldest` that the store says was written
        more than fence_seconds ago (`fence_floor`, a few HEADs), or 0: the listing pass's way to
        retire what earlier processes left.

        Their snapshots' fences count from this process's adoption (`_adopt`), so a writer that
        lives less than fence_seconds never removed a record: every restart adopted them anew
        and exited before the wait was over (46 records left by 15 short writers on S3, for an
        operator's prune to find). The record's own time says how long it has stood, against
        the store's "now": the one the store tells with the time of the snapshot this pass
        follows (S3's Date, the same HEAD), else that time itself, the snapshot having just been
        written (a machine whose clock ran ahead would otherwise take young fences for old
        ones)."""
        try:
            return fence_floor(self._storage, run_id, logs, oldest, self._policy.fence_seconds,
                               snap_key(run_id, rc.version))
        except OSError as exc:  # none now: fences count on
            logger.debug("run %s: journal records' times unknown (%s); they go fence_seconds "
                         "after this process learned of their snapshots", run_id, exc)
            return 0

    def _grace_floor(self, run_id: str, rc: RunCompaction, oldest: int, listed: set[int]) -> int:
        """The oldest snapshot retention keeps: `oldest`, or lower while the snapshot above is
        younger than the superseded grace (store/retention.py). Times come from this process
        (a snapshot it wrote, or a load's) or, for one it listed, from the store, read in the
        pass that listed the run only: a later pass never walks below where that one stopped,
        since snapshots are written in version order, so it needs no request."""
        grace = self._policy.superseded_grace
        if not grace:
            return oldest
        known = dict(rc.snapshots)

        def written(version: int) -> float | None:
            if version in rc.written:
                return rc.written[version]
            if version in listed:
                try:
                    age = store_age(self._storage, snap_key(run_id, version), grace)
                except FileNotFoundError:  # removed meanwhile: nothing below is kept for it
                    return None
                except (NotImplementedError, OSError):  # a store without times: when known
                    return known.get(version)
                # a time far ahead is unknown, as old, in later passes too (not the adoption
                # time `known` holds): else each restart beside a store a year ahead, listing
                # again, kept what it listed one more grace
                rc.written[version] = -math.inf if age is None else time.monotonic() - age
                return rc.written[version]
            return known.get(version)

        snaps = {*known, *(f.version for f in rc.files if f.kind == "snap")}
        return grace_floor(snaps, oldest, written, grace, time.monotonic())
