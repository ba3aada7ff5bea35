"""One writer per LangGraph thread, by the storage's conditional writes alone (no server).

LangGraph assumes one writer per thread: two processes running the same thread at once both
extend the checkpoint they started from, and the thread's history forks. CkptfsSaver prevents
that with a lease per thread, `langgraph/leases/<thread>.lease`, the approach of the workers'
step leases (`ckptfs/store/leases.py`), applied to threads:

* **Held while written.** The first write of a thread (put, put_writes, and the maintenance
  calls) creates the lease exclusively (If-None-Match); a background keeper renews it by
  compare-and-swap (If-Match) every ttl/4 and releases it (CAS, marked released, never deleted)
  once the thread has gone `idle` seconds without a write (one in flight between `begin` and
  `end` is use, however long it takes), on `close()`, and at exit.
* **A second writer is refused, or waits.** A process that finds a live lease of another gets
  `ThreadBusyError` naming the thread and the holder; with `busy_timeout` it first waits that
  long for the holder to let go. "Live" is observed: the record changed (a renewal) while the
  contender watched, so proving it takes up to ttl/4.
* **Expiry is observed, not computed.** A crashed holder stops renewing; a contender that sees
  the very same record unchanged for a full ttl on its own monotonic clock takes it over (CAS,
  generation + 1). The holder trusts its lease for 0.8 ttl from when it *sent* its last renewal,
  so no two clocks need to agree, only tick at about the same rate. A holder that stalled past
  that (a suspended VM) finds its lease gone at its next write and gets `ThreadBusyError`.
* **No silent fork after a gap.** A process that let a thread go (idle, or lost it) and writes
  it again without reading it first would extend stale state if another process wrote the
  thread meanwhile: its next write is refused (`ThreadBusyError`) until it reads the thread's
  newest checkpoint again, which every new `invoke` does (`reread`).
* **No silent fork after a read.** The lease says nothing of what a process read before it
  took it: one that read the thread (or found it empty) while another held it, then waited
  for it (`busy_timeout`) or came to write after the holder let go, extended the state it had
  read, not the holder's newer checkpoints. So the saver remembers what each read saw and,
  once it holds the lease, writes only if that is still the newest (else ThreadBusyError,
  nothing written): once per tenure, a read and its writes under one lease need no look.

All savers of one process on one store share one holder identity and one keeper, so a new
saver in the same process (a retry, a second graph) continues the thread rather than
contending with the first.

* **A late write is not acknowledged.** A write that outlasts the lease it started under (slow
  storage retrying, a congested link, a stalled process) may land after a successor took over:
  storage offers no fence across objects. `confirm` after every write turns that into
  ThreadBusyError instead of an acknowledgment: the caller never builds on a checkpoint that is
  off the thread's line, and the successor's newer checkpoints supersede the stray one.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ckptfs.errors import CkptfsError, ConfigError
from ckptfs.format.keys import folded_id
from ckptfs.integrations.langgraph.keys import lg_hashed, lg_lease_key, lg_thread_segment
from ckptfs.storage.base import PreconditionFailed, Storage

logger = logging.getLogger(__name__)

SAFETY = 0.8  # the holder trusts its lease for this share of the ttl; contenders wait all of it
DEFAULT_TTL = 20.0
DEFAULT_IDLE = 30.0
_MAX_KNOWN = 100_000  # bound on the threads a process remembers having written
_MAX_LOCKS = 4096
EXIT_BUDGET = 5.0  # seconds a normal exit spends giving threads back; what is left expires


class ThreadBusyError(CkptfsError):
    """Another process writes this thread, or wrote it since this process last did.

    Nothing was written. `holder` names the other writer (host:pid:tag) when it is known.
    """

    def __init__(self, thread_id: str, holder: str | None, detail: str) -> None:
        self.thread_id = thread_id
        self.holder = holder
        who = holder if holder else "another process"
        super().__init__(f"LangGraph thread {shown(thread_id)} is written by {who}: {detail}")


def shown(thread_id: str) -> str:
    """A thread id for a message or a log line: whole up to 80 characters, else its start (ids
    have no length limit; a megabyte one made every such line a megabyte). `thread_id` on the
    error keeps it whole."""
    if len(thread_id) <= 80:
        return repr(thread_id)
    return f"{thread_id[:60]!r}... ({len(thread_id)} characters)"


class ThreadLeaseRecord(BaseModel):
    """The stored lease object. `time` is the writer's wall clock, for people; nothing uses it.

    `thread_id` is the thread's id, or for a long id (hashed in keys) its key segment: the
    record is rewritten by every renewal, and a megabyte id made it a megabyte each time.
    Records of earlier releases, which hold a long id whole, are honoured too (`names`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["ckptfs-lg-thread-lease"] = "ckptfs-lg-thread-lease"
    format_version: Literal[1] = 1
    thread_id: str
    holder: str = Field(min_length=1, max_length=256)
    generation: int = Field(ge=1)
    ttl: float = Field(gt=0, le=86_400)
    released: bool = False
    renewals: int = Field(default=0, ge=0)
    nonce: str = Field(min_length=1, max_length=64)
    time: float


@dataclass
class _Held:
    """A thread lease this process holds."""

    thread_id: str
    key: str
    generation: int
    etag: str
    renewals: int
    deadline: float  # on our monotonic clock: trust the lease only before this
    last_use: float
    lost_to: str | None = None  # set when another holder was found in our place
    lost: bool = False
    inflight: int = 0  # writes between `begin` and `end`: the keeper does not idle the lease out
    release_pending: bool = False  # released while writes were in flight: given back after the last


# What `begin` hands a write and `end` takes back: the lease object itself (opaque to callers).
Tenure = _Held

_holder_pid = 0
_holder = ""


def process_holder() -> str:
    """host:pid:random of this process (a forked child gets its own)."""
    global _holder_pid, _holder
    if _holder_pid != os.getpid():
        _holder_pid, _holder = os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return _holder


def recorded_id(thread_id: str) -> str:
    """What a lease record names a thread by (see ThreadLeaseRecord)."""
    seg = lg_thread_segment(thread_id)
    return seg if lg_hashed(seg) else thread_id


def names(rec: ThreadLeaseRecord, thread_id: str) -> bool:
    """Whether a record is of this thread, not one copied under another's name."""
    return rec.thread_id == thread_id or rec.thread_id == recorded_id(thread_id)


def twin_hint(recorded: str, thread_id: str) -> str:
    """Why a thread's lease file holds `recorded`'s record, when the two ids differ only in
    case: on a case-insensitive disk (macOS's and Windows' defaults) they share one file, so
    one process at a time writes either ("" otherwise)."""
    if recorded == thread_id or folded_id(recorded) != folded_id(thread_id):
        return ""
    return (f" (the lease file holds thread {shown(recorded)}'s record: thread ids that differ only "
            "in case share one lease file on a case-insensitive disk, as macOS's and Windows' are by "
            "default, so only one of them can be written at a time)")


def parse_record(key: str, data: bytes) -> ThreadLeaseRecord | None:
    try:
        return ThreadLeaseRecord.model_validate(json.loads(data))
    except (ValueError, ValidationError):
        logger.warning("thread lease %s is unreadable; treating it as held until it goes stale", key)
        return None


def read_thread_lease(storage: Storage, thread_id: str) -> ThreadLeaseRecord | None:
    """The stored lease of a thread (None: none, or unreadable), for people and reports."""
    key = lg_lease_key(thread_id)
    try:
        return parse_record(key, storage.get(key))
    except FileNotFoundError:
        return None


class ThreadLeases:
    """The thread leases one process holds on one store; see the module docstring.

    `ensure(thread_id)` before every write: instant while the lease is held, otherwise it
    acquires it (waiting as configured). A keeper thread renews and idles leases out.
    `clock` is monotonic seconds and `sleep` waits; tests pass fakes.
    """

    def __init__(self, storage: Storage, *, ttl: float = DEFAULT_TTL, idle: float = DEFAULT_IDLE,
                 holder: str | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        caps = storage.capabilities
        if not (caps.exclusive_create and caps.conditional_put):
            raise ConfigError(f"{storage.display_name}: one writer per thread needs exclusive create and "
                              f"compare-and-swap, which {type(storage).__name__} has not got")
        if not 0 < ttl <= 86_400:
            raise ConfigError(f"lease_ttl must be in (0, 86400] seconds, got {ttl!r}")
        if not idle > 0:
            raise ConfigError(f"lease_idle must be > 0 seconds, got {idle!r}")
        self.storage = storage
        self.ttl = float(ttl)
        self.idle = float(idle)
        self.holder = holder or process_holder()
        self.clock = clock
        self.sleep = sleep
        self.poll = min(0.5, self.ttl / 10)
        self._held: dict[str, _Held] = {}
        self._known: dict[str, int] = {}  # thread -> the generation this process last held it at
        self._lock = threading.Lock()
        self._thread_locks: dict[str, threading.Lock] = {}
        self._wake = threading.Event()
        self._keeper: threading.Thread | None = None
        _live.add(self)

    def _forked(self) -> None:
        """In a child of a fork: nothing of the parent's is ours. The parent's leases are held by
        the parent (our copy of them would let the child write the parent's thread as if it were
        its holder: two writers, both acknowledged, a forked history); the child gets its own
        holder identity, and its locks and keeper anew (the parent's threads are gone)."""
        self.holder = process_holder()
        self._held = {}
        self._known = {}
        self._lock = threading.Lock()
        self._thread_locks = {}
        self._wake = threading.Event()
        self._keeper = None

    # ----------------------------------------------------------------------------- records

    def _record(self, thread_id: str, generation: int, *, released: bool = False,
                renewals: int = 0) -> tuple[ThreadLeaseRecord, bytes]:
        rec = ThreadLeaseRecord(thread_id=recorded_id(thread_id), holder=self.holder, generation=generation,
                                ttl=self.ttl, released=released, renewals=renewals,
                                nonce=uuid.uuid4().hex, time=time.time())
        return rec, rec.model_dump_json().encode()

    def _mine(self, key: str, rec: ThreadLeaseRecord) -> str | None:
        """After an ambiguous write: the etag if the stored record is the one we sent."""
        try:
            data, etag = self.storage.get_with_etag(key)
        except FileNotFoundError:
            return None
        got = parse_record(key, data)
        return etag if got is not None and got.nonce == rec.nonce else None

    def _thread_lock(self, thread_id: str) -> threading.Lock:
        """Serializes this process's lease I/O for one thread (acquire, renew, release)."""
        with self._lock:
            lock = self._thread_locks.get(thread_id)
            if lock is None:
                if len(self._thread_locks) >= _MAX_LOCKS:  # forget idle threads' locks
                    for tid in [t for t, k in self._thread_locks.items()
                                if t not in self._held and not k.locked()]:
                        del self._thread_locks[tid]
                lock = self._thread_locks[thread_id] = threading.Lock()
            return lock

    # ------------------------------------------------------------------------------ writes

    def begin(self, thread_id: str, *, wait: float = 0.0, fresh: bool = False) -> Tenure:
        """`ensure`, for a write that `end` closes: until then the lease is in use however long
        the write takes (the keeper does not give it back as idle, a `release` waits for it).
        Returns the tenure the write begins under, which `end` is given back: the very lease
        object, not its generation, which a lease dropped and taken again can repeat."""
        self.ensure(thread_id, wait=wait, fresh=fresh)
        with self._lock:
            held = self._held.get(thread_id)
            if held is None or held.lost:  # lost in the instant since ensure: as ensure would say
                raise ThreadBusyError(thread_id, held.lost_to if held else None,
                                      "its lease was lost as the write began; read the thread "
                                      "again (a new invoke) before writing")
            held.inflight += 1
            held.last_use = self.clock()
            return held

    def end(self, thread_id: str, tenure: Tenure, *, confirm: bool = True) -> None:
        """The write `begin` opened is over (done, or failed: `confirm=False`); with `confirm`,
        ThreadBusyError unless the lease held all through it (`confirm`)."""
        held = tenure
        with self._lock:
            if held.inflight > 0:
                held.inflight -= 1
            held.last_use = self.clock()
            give_back = held.release_pending and held.inflight == 0 and self._held.get(thread_id) is held
        try:
            if confirm:
                self.confirm(thread_id, held)
        finally:
            if give_back:
                self.release(thread_id)

    def ensure(self, thread_id: str, *, wait: float = 0.0, fresh: bool = False) -> None:
        """Return once this process holds the thread; ThreadBusyError if another does.

        `wait`: seconds to wait for a live holder to let go before giving up. `fresh`: the
        caller does not continue in-memory state (a delete, a prune, a copy), so a write by
        another process since ours is no reason to refuse.
        """
        if self._fast(thread_id):
            return
        with self._thread_lock(thread_id):
            if self._fast(thread_id):
                return
            with self._lock:
                held = self._held.get(thread_id)
            if held is not None and not held.lost:
                self._renew(held)  # its deadline passed before the keeper renewed it
                with self._lock:
                    if not held.lost and self.clock() < held.deadline:
                        held.last_use = self.clock()
                        return
            if held is not None and held.lost and not fresh:
                raise ThreadBusyError(thread_id, held.lost_to, "this process lost its lease (it, or "
                                      "its storage, stalled longer than the lease ttl) and another "
                                      "took the thread over; read the thread again (a new invoke) "
                                      "before writing")
            self._acquire(thread_id, wait, fresh)

    def confirm(self, thread_id: str, tenure: Tenure | None = None) -> None:
        """After a write returned: ThreadBusyError unless this process held the thread all along
        (in `tenure`, the lease the write began under, when given: a lease lost and taken again
        meanwhile, by another task of this process, says nothing of the time between).

        A write can outlast the lease it started under: storage retrying 503s, a congested
        link (the keeper's renewals are as slow as the write). A successor may then have taken
        the thread over while the write was in flight, and the write, landing late, forked the
        history. So a write is acknowledged only if the lease is still trusted when it returns,
        or, past that, if a renewal by compare-and-swap still succeeds: it can only when nobody
        wrote the lease meanwhile, which a takeover must. A lease this process no longer holds
        (lost, idled out, dropped) is never taken again here: a fresh acquisition would say
        nothing about the time the write was in flight. The write itself may be stored; it is
        then on a branch of its own that the successor's checkpoints, newer, supersede.
        """
        if self._fast(thread_id, tenure):
            return
        why = "the write returned after this process's lease ran out (slow storage?)"
        with self._thread_lock(thread_id):
            with self._lock:
                held = self._held.get(thread_id)
            if held is not None and tenure is not None and held is not tenure:
                raise ThreadBusyError(thread_id, held.lost_to, f"the lease changed hands while the "
                                      f"write was in flight (generation {tenure.generation} -> "
                                      f"{held.generation}); the write is not acknowledged: read "
                                      "the thread again (a new invoke) before writing")
            if held is not None and not held.lost:
                try:
                    self._renew(held)
                except Exception as exc:  # cannot prove the tenure: not acknowledged
                    raise ThreadBusyError(thread_id, None, f"{why}, and renewing it to show that no "
                                          f"one took the thread over failed ({exc}); the write is "
                                          "not acknowledged: read the thread again (a new invoke) "
                                          "before writing") from exc
                with self._lock:
                    if not held.lost and self.clock() < held.deadline:
                        held.last_use = self.clock()
                        return
        lost_to = held.lost_to if held is not None else None
        raise ThreadBusyError(thread_id, lost_to, f"{why}, and another process may have taken the "
                              "thread over while it was in flight; the write is not acknowledged "
                              "(it may be stored, on a branch that the other writer's newer "
                              "checkpoints supersede): read the thread again (a new invoke) "
                              "before writing")

    def trusted(self, thread_id: str) -> Tenure | None:
        """The lease this process holds on the thread if it is trusted now, else None: while it
        is, no other process can have written the thread since the lease was taken (a reader
        may rely on what it last saw). A read does not count as use: it never keeps a lease."""
        now = self.clock()
        with self._lock:
            held = self._held.get(thread_id)
            if held is not None and not held.lost and now < held.deadline:
                return held
        return None

    def _fast(self, thread_id: str, tenure: Tenure | None = None) -> bool:
        now = self.clock()
        with self._lock:
            held = self._held.get(thread_id)
            if (held is not None and not held.lost and now < held.deadline
                    and (tenure is None or held is tenure)):
                held.last_use = now
                return True
        return False

    def _acquire(self, thread_id: str, wait: float, fresh: bool) -> None:
        key = lg_lease_key(thread_id)
        with self._lock:
            known = None if fresh else self._known.get(thread_id)
        give_up = self.clock() + max(0.0, wait)
        seen: tuple[str, float] | None = None  # (what identifies the record seen, when first seen)
        alive = False
        twin = ""  # why the lease file holds another thread's record, when its id says why
        twin_rec: ThreadLeaseRecord | None = None  # that record: who holds the file, and since when
        while True:
            rec, data = self._record(thread_id, (known or 0) + 1)
            sent = self.clock()
            try:
                etag = self.storage.put_if_absent(key, data)
            except FileExistsError:
                mine = self._mine(key, rec)
                if mine is not None:  # our create landed; its reply was lost
                    return self._won(thread_id, rec, mine, sent)
            else:
                return self._won(thread_id, rec, etag, sent)
            try:
                current, etag = self.storage.get_with_etag(key)
            except FileNotFoundError:
                continue  # released and deleted by hand meanwhile: create it again
            old = parse_record(key, current)
            if old is not None and not names(old, thread_id):
                hint = twin_hint(old.thread_id, thread_id)
                if hint:
                    twin, twin_rec = hint, old
                    if old.holder == self.holder:
                        twin = (f"{twin[:-1]}; it is held by this very process ({self.holder}), "
                                f"which writes thread {shown(old.thread_id)})")
                old = None  # a record copied under another name is nobody's lease of this thread
            now = self.clock()
            # the etag and the nonce: a local disk's etag comes from stat fields, which coarse
            # timestamps can repeat; the nonce is new in every write
            ident = f"{etag}|{old.nonce if old is not None else current.hex()[:64]}"
            if seen is None or seen[0] != ident:
                alive = seen is not None  # it changed while we watched: its holder is at work
                seen = (ident, now)
            ours = old is not None and old.holder == self.holder
            if (known is not None and old is not None and not ours and old.generation > known):
                raise ThreadBusyError(thread_id, old.holder, f"it took the thread over (generation {known} "
                                      f"-> {old.generation}) since this process last wrote it, so this "
                                      "process's state of it may be stale; read the thread again (a new "
                                      "invoke) before writing, or its history would fork")
            ttl = old.ttl if old is not None else self.ttl
            if old is not None and (ours or old.released):
                generation = old.generation if ours and not old.released else old.generation + 1
            elif now - seen[1] >= ttl:
                generation = (old.generation if old is not None else known or 0) + 1
                logger.warning("thread lease %s: taking over from %s (silent for %.1fs)", key,
                               old.holder if old is not None else "an unreadable record", now - seen[1])
            else:
                if alive and now >= give_up:
                    waited = f" for {wait:g}s" if wait > 0 else ""
                    shown_rec = old if old is not None else twin_rec
                    raise ThreadBusyError(thread_id, shown_rec.holder if shown_rec is not None else None,
                                          f"its lease (generation "
                                          f"{shown_rec.generation if shown_rec is not None else '?'}) was "
                                          f"renewed while this process waited{waited}; retry later, or "
                                          "give the saver busy_timeout= to wait for the thread" + twin)
                self.sleep(self.poll)
                continue
            rec, data = self._record(thread_id, generation)
            sent = self.clock()
            try:
                new_etag = self.storage.put_if_match(key, data, etag)
            except (PreconditionFailed, FileNotFoundError):
                mine = self._mine(key, rec)
                if mine is None:
                    continue  # another contender, or the holder's renewal, came first: look again
                new_etag = mine
            return self._won(thread_id, rec, new_etag, sent)

    def _won(self, thread_id: str, rec: ThreadLeaseRecord, etag: str, sent: float) -> None:
        held = _Held(thread_id, lg_lease_key(thread_id), rec.generation, etag, rec.renewals,
                     sent + rec.ttl * SAFETY, self.clock())
        with self._lock:
            self._held[thread_id] = held
            self._known.pop(thread_id, None)
            self._known[thread_id] = rec.generation
            while len(self._known) > _MAX_KNOWN:
                self._known.pop(next(iter(self._known)))
        logger.debug("thread lease %s: acquired generation %d as %s", held.key, rec.generation, self.holder)
        self._start_keeper()

    def _renew(self, held: _Held, again: bool = True) -> None:
        """Renew by CAS (the caller holds the thread's lock); marks `held` lost if another has it."""
        rec, data = self._record(held.thread_id, held.generation, renewals=held.renewals + 1)
        sent = self.clock()
        try:
            etag = self.storage.put_if_match(held.key, data, held.etag)
        except (PreconditionFailed, FileNotFoundError):
            try:
                current, etag = self.storage.get_with_etag(held.key)
            except FileNotFoundError:
                current, etag = b"", ""
            got = parse_record(held.key, current) if current else None
            if got is not None and got.nonce == rec.nonce:
                pass  # our renewal landed; its reply was lost
            elif got is not None and got.holder == self.holder and got.generation == held.generation:
                # another saver of this process on the store (its own etag): ours all the same
                with self._lock:
                    held.etag = etag
                if got.released:
                    return self._retake(held, etag)
                return self._renew(held, False) if again else None
            else:
                with self._lock:
                    held.lost = True
                    held.lost_to = got.holder if got is not None else None
                logger.warning("thread lease %s: lost to %s", held.key, held.lost_to or "another process")
                return
        with self._lock:
            held.etag, held.renewals, held.deadline = etag, rec.renewals, sent + self.ttl * SAFETY

    def _retake(self, held: _Held, etag: str) -> None:
        _rec, data = self._record(held.thread_id, held.generation)
        sent = self.clock()
        try:
            new = self.storage.put_if_match(held.key, data, etag)
        except (PreconditionFailed, FileNotFoundError):
            with self._lock:
                held.lost = True
            return
        with self._lock:
            held.etag, held.renewals, held.deadline = new, 0, sent + self.ttl * SAFETY

    def _release(self, held: _Held, at_exit: bool = False) -> bool:
        """Write the lease back as released (the caller holds the thread's lock); False if the
        storage could not be reached."""
        _rec, data = self._record(held.thread_id, held.generation, released=True,
                                 renewals=held.renewals + 1)
        try:
            self.storage.put_if_match(held.key, data, held.etag)
        except (PreconditionFailed, FileNotFoundError):
            logger.info("thread lease %s: already taken over; nothing to release", held.key)
        except Exception as exc:  # unreachable storage (at exit, too): the lease simply expires
            logger.log(logging.INFO if at_exit else logging.WARNING,
                       "thread lease %s: release failed (%s); it expires after %.0fs",
                       held.key, exc, self.ttl)
            return False
        else:
            logger.debug("thread lease %s: released", held.key)
        return True

    # ------------------------------------------------------------------------------ state

    def reread(self, thread_id: str) -> None:
        """The caller just read the thread's newest checkpoint: what it writes next extends that,
        so a write by another process before now is no longer a reason to refuse here. One after
        the read, before this process holds the lease, is: the saver, which knows what the read
        saw, checks that once it holds it."""
        held = self._held.get(thread_id)
        if thread_id not in self._known and (held is None or not held.lost):
            return  # nothing to forget (most reads): no lock taken
        with self._lock:
            self._known.pop(thread_id, None)
            held = self._held.get(thread_id)
            if held is not None and held.lost:
                del self._held[thread_id]

    def holding(self) -> list[str]:
        """The threads this process holds on this store now."""
        with self._lock:
            return sorted(t for t, h in self._held.items() if not h.lost)

    def release(self, thread_id: str | None = None, at_exit: bool = False) -> bool:
        """Give the thread (or every thread) back now, rather than after `idle` seconds.

        At exit, stops at the first failure and returns False: a store that cannot be reached
        would make the process hang on each lease, and an unreleased lease only expires.
        """
        with self._lock:
            threads = list(self._held) if thread_id is None else [thread_id]
        for tid in threads:
            with self._thread_lock(tid):
                with self._lock:
                    held = self._held.get(tid)
                    if held is not None and held.inflight and not at_exit:
                        # another saver of this process writes it now: given back by its `end`
                        held.release_pending = True
                        continue
                    held = self._held.pop(tid, None)
                if held is not None and not held.lost and not self._release(held, at_exit) and at_exit:
                    return False
        return True

    def close(self) -> None:
        self.release()
        self._wake.set()

    # ----------------------------------------------------------------------------- keeper

    def _start_keeper(self) -> None:
        with self._lock:
            if self._keeper is not None and self._keeper.is_alive():
                return
            self._wake.clear()
            self._keeper = threading.Thread(target=self._keep, name="ckptfs-lg-thread-leases", daemon=True)
            self._keeper.start()

    def _keep(self) -> None:
        """Renew every ttl/4; release what went idle; end when nothing is held."""
        interval = self.ttl / 4
        while not self._wake.wait(interval):
            with self._lock:
                threads = list(self._held)
            if not threads:
                with self._lock:
                    if not self._held:
                        self._keeper = None
                        return
            for tid in threads:
                try:
                    self._beat(tid)
                except Exception as exc:  # a slow or failing backend: try again next beat
                    self._failed(tid, exc)

    def _failed(self, thread_id: str, exc: Exception) -> None:
        """A renewal that did not get through: retried until the lease's deadline passes, then
        the lease is dropped (the next write acquires it again, or finds who took it over)."""
        with self._lock:
            held = self._held.get(thread_id)
            gone = held is not None and self.clock() >= held.deadline
            if gone:
                del self._held[thread_id]
        if gone:
            logger.warning("thread lease of %s: not renewed before its deadline (%s); dropped",
                           shown(thread_id), exc)
        elif held is not None:
            logger.info("thread lease of %s: renewal failed (%s); retrying", shown(thread_id), exc)

    def _beat(self, thread_id: str) -> None:
        with self._thread_lock(thread_id):
            with self._lock:
                held = self._held.get(thread_id)
                if held is None or held.lost:
                    return
                idle = held.inflight == 0 and self.clock() - held.last_use >= self.idle
                if idle:
                    del self._held[thread_id]
            if idle:
                self._release(held)
            else:
                self._renew(held)


_live: weakref.WeakSet[ThreadLeases] = weakref.WeakSet()
_registry: dict[tuple[int, str, str, float, float], ThreadLeases] = {}
_registry_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """Every ThreadLeases a forked child inherited forgets the parent's leases (`_forked`)."""
    global _registry_lock
    _registry_lock = threading.Lock()  # another thread may have held it at the fork
    for leases in list(_live):
        leases._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def leases_for(storage: Storage, ttl: float, idle: float) -> ThreadLeases:
    """The one ThreadLeases of this process for a store (savers of one store share it)."""
    ident = (os.getpid(), type(storage).__name__, storage.url, float(ttl), float(idle))
    with _registry_lock:
        found = _registry.get(ident)
        if found is None:
            found = _registry[ident] = ThreadLeases(storage, ttl=ttl, idle=idle)
        return found


def _release_at_exit() -> None:
    """A process that ends normally gives its threads back, so a successor need not wait a ttl."""
    if _holder_pid != os.getpid():
        return
    budget = time.monotonic() + EXIT_BUDGET
    for leases in list(_live):
        if leases.holder != _holder:
            continue  # a forked parent's: not ours to give back
        if time.monotonic() > budget:
            logger.info("thread leases left to expire: no time left at exit")
            return
        try:
            if not leases.release(at_exit=True):
                return  # one store unreachable: likely the network; the rest would hang too
        except Exception as exc:  # nothing to do at exit but say so
            logger.info("releasing thread leases at exit: %s", exc)
            return


# Before the interpreter shuts its thread pools down (S3 clients need them), where the stdlib
# offers the hook; plain atexit runs after that.
_early_exit_hook: Callable[[Callable[[], None]], None] | None = getattr(threading, "_register_atexit", None)
try:
    if _early_exit_hook is not None:
        _early_exit_hook(_release_at_exit)
    else:  # pragma: no cover - every CPython since 3.9 has the hook
        atexit.register(_release_at_exit)
except RuntimeError:  # first imported after main() returned: too late for exit hooks, and the
    pass  # leases it takes then run out by their ttl instead of being released
