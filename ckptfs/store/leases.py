"""Leases: which worker may work on a step, coordinated by the bucket's conditional writes alone.

Several workers can share one run through one bucket. A worker claims a step by *creating* its
lease object exclusively (If-None-Match), keeps it by *replacing* it with compare-and-swap
(If-Match on the etag it last wrote) and gives it up by writing it back as released. No server,
no clock agreement:

* **Expiry is observed, never computed from timestamps.** Another machine's clock may be minutes
  off, so a lease carries no expiry time that anyone trusts. A contender that finds a lease
  notes its etag and the time *on its own monotonic clock*; only when the very same etag is
  still there a full `ttl` later may it take the lease over (by CAS, so one contender wins).
  The holder, for its part, trusts its lease for `ttl * SAFETY` after the moment it *sent* the
  write that created or renewed it. The contender's wait starts after that write landed, so the
  holder's trust ends first as long as the two clocks tick at rates within 1 - SAFETY of each
  other (the Chubby/Gray-Cheriton argument).
* **Every takeover raises the generation.** The generation is the fencing token: the store
  records, per step, the generation of the lease a commit was made under, and refuses a commit
  with a lower one (`CheckpointStore.commit_step`). A worker that stalled past its lease (a GC
  pause, a suspended VM) and then writes is rejected, instead of overwriting its successor.
* **An ambiguous write is settled by reading back.** A PUT whose response was lost may have
  landed; each write carries a random nonce, so the writer recognises its own record instead
  of mistaking it for a rival's.

A lease object is small JSON, readable with `cat`; it is not a checkpoint file: verify skips
`runs/<run>/lease/`, the mirror does not copy it and restore never brings one back.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ckptfs.errors import ConfigError, CorruptFileError, LeaseLostError
from ckptfs.format.keys import lease_key
from ckptfs.format.models import validate_id
from ckptfs.storage.base import PreconditionFailed, Storage

logger = logging.getLogger(__name__)

LEASE_FORMAT = "ckptfs-lease"
SAFETY = 0.8  # the holder trusts a lease for this share of its ttl; contenders wait all of it
DEFAULT_TTL = 30.0
_MAX_OBSERVED = 10_000  # bound on what a manager remembers about others' leases


class LeaseRecord(BaseModel):
    """The stored lease object. `time` is the writer's wall clock, for people; nothing uses it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["ckptfs-lease"] = "ckptfs-lease"
    format_version: Literal[1] = 1
    run_id: str
    step_id: str
    holder: str = Field(min_length=1, max_length=256)
    generation: int = Field(ge=1)
    ttl: float = Field(gt=0, le=86_400)
    released: bool = False
    renewals: int = Field(default=0, ge=0)
    nonce: str = Field(min_length=1, max_length=64)
    time: float


@dataclass(frozen=True)
class Lease:
    """A lease this process holds: `generation` is the fencing token to commit under."""

    run_id: str
    step_id: str
    holder: str
    generation: int
    ttl: float
    etag: str
    deadline: float  # on the manager's clock: trust the lease only before this
    renewals: int = 0
    created: bool = False  # no lease object existed: no worker ever held this step

    @property
    def key(self) -> str:
        return lease_key(self.run_id, self.step_id)


def read_leases(storage: Storage, run_id: str, step_ids: Iterable[str] | None = None,
                unread: list[str] | None = None) -> dict[str, LeaseRecord]:
    """The stored leases of a run (of `step_ids` only, if given), for people and reports:
    one LIST, then a GET per lease object wanted. Unreadable objects are left out; a key the
    storage will not read at all (a FIFO, a link, never followed) is added to `unread` as
    "key: why". It once raised, and one such name made `show` of the run and `forget` of it
    (`--force` too) exit 1 with nothing shown or deleted, while `verify` called the store
    clean: leases are hints for people, and no worker writes anything but a regular file there.
    """
    wanted = None if step_ids is None else set(step_ids)
    prefix = lease_key(run_id, "x").rsplit("/", 1)[0] + "/"
    out: dict[str, LeaseRecord] = {}
    for key in storage.list(prefix):
        name = key.rsplit("/", 1)[-1]
        if not name.endswith(".lease"):
            continue
        sid = name[: -len(".lease")]
        if wanted is not None and sid not in wanted:
            continue
        try:
            rec = LeaseManager._parse(key, storage.get(key))
        except FileNotFoundError:
            continue
        except CorruptFileError as exc:
            if unread is not None:
                unread.append(f"{key}: {exc.reason or exc}")
            continue
        if rec is not None:
            out[sid] = rec
    return out


def default_holder() -> str:
    """host:pid:random, so two processes (or two managers in one) never share an identity."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseManager:
    """Acquire, renew and release step leases on one storage, as one holder.

    `ttl` is how long a holder may go silent before others may take its steps over: it must
    cover the longest pause between renewals (`Heartbeat` renews every ttl/4). `clock` is
    monotonic seconds; tests pass a fake one.
    """

    def __init__(self, storage: Storage, holder: str | None = None, *, ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        caps = storage.capabilities
        if not (caps.exclusive_create and caps.conditional_put and caps.shared):
            raise ConfigError(f"{storage.display_name}: leases need a shared backend with exclusive "
                              "create and compare-and-swap (local disk, S3); "
                              f"{type(storage).__name__} has not got them")
        if not 0 < ttl <= 86_400:
            raise ConfigError(f"lease ttl must be in (0, 86400] seconds, got {ttl!r}")
        self.storage = storage
        self.holder = holder or default_holder()
        self.ttl = float(ttl)
        self.clock = clock
        self._observed: dict[str, tuple[str, float]] = {}  # key -> (etag, first seen)
        self._guard = threading.Lock()

    # ------------------------------------------------------------------------ records

    def _record(self, run_id: str, step_id: str, generation: int, *, released: bool = False,
                renewals: int = 0) -> tuple[LeaseRecord, bytes]:
        rec = LeaseRecord(run_id=run_id, step_id=step_id, holder=self.holder, generation=generation,
                          ttl=self.ttl, released=released, renewals=renewals,
                          nonce=uuid.uuid4().hex, time=time.time())
        return rec, rec.model_dump_json().encode()

    @staticmethod
    def _parse(key: str, data: bytes) -> LeaseRecord | None:
        try:
            return LeaseRecord.model_validate(json.loads(data))
        except (ValueError, ValidationError):
            logger.warning("lease %s is unreadable; treating it as held until it goes stale", key)
            return None

    def read(self, run_id: str, step_id: str) -> LeaseRecord | None:
        """The stored lease of a step, None if there is none (or it is unreadable)."""
        key = lease_key(run_id, step_id)
        try:
            data = self.storage.get(key)
        except FileNotFoundError:
            return None
        return self._parse(key, data)

    def _mine(self, key: str, rec: LeaseRecord) -> tuple[str, LeaseRecord] | None:
        """After an ambiguous write: (etag, record) if the stored record is the one we sent."""
        try:
            data, etag = self.storage.get_with_etag(key)
        except FileNotFoundError:
            return None
        got = self._parse(key, data)
        return (etag, got) if got is not None and got.nonce == rec.nonce else None

    def _lease(self, rec: LeaseRecord, etag: str, sent_at: float, created: bool = False) -> Lease:
        return Lease(rec.run_id, rec.step_id, rec.holder, rec.generation, rec.ttl, etag,
                     sent_at + rec.ttl * SAFETY, rec.renewals, created)

    # ------------------------------------------------------------------------- acquire

    def acquire(self, run_id: str, step_id: str, *, after: int = 0) -> Lease | None:
        """The step's lease if it is free, released or observed stale; None while another holds it.

        Never blocks: a contender calls again (a worker's scheduling loop does), and the call
        that finds the same record a full ttl after first seeing it takes the lease over.
        `after` is the generation the caller knows the step was committed under: the new
        generation exceeds it even if the lease object is gone (deleted by hand, or a run
        restored from a mirror, which carries no leases).
        """
        validate_id(run_id, "run id")
        validate_id(step_id, "step id")
        key = lease_key(run_id, step_id)
        for _ in range(3):  # a lease deleted between our create and our read: try again
            rec, data = self._record(run_id, step_id, after + 1)
            sent = self.clock()
            try:
                etag = self.storage.put_if_absent(key, data)
            except FileExistsError:
                mine = self._mine(key, rec)
                if mine is not None:  # our create landed; its reply was lost
                    return self._won(key, mine[1], mine[0], sent, created=True)
            else:
                return self._won(key, rec, etag, sent, created=True)
            try:
                current, etag = self.storage.get_with_etag(key)
            except FileNotFoundError:
                continue
            return self._take_over(key, run_id, step_id, current, etag, after)
        return None

    def _take_over(self, key: str, run_id: str, step_id: str, current: bytes,
                   etag: str, after: int) -> Lease | None:
        now = self.clock()
        old = self._parse(key, current)
        if old is not None and (old.run_id, old.step_id) != (run_id, step_id):
            old = None  # a record copied under another name is nobody's lease of this step
        ttl = old.ttl if old is not None else self.ttl
        # What identifies the record we saw: its etag and its nonce. On a local disk the etag is
        # made from stat fields, which a filesystem with coarse timestamps can repeat; the
        # nonce is new in every write.
        seen_as = f"{etag}|{old.nonce if old is not None else current.hex()[:64]}"
        with self._guard:
            seen = self._observed.get(key)
            if seen is None or seen[0] != seen_as:
                if len(self._observed) >= _MAX_OBSERVED:
                    self._observed.pop(next(iter(self._observed)))
                self._observed[key] = (seen_as, now)
                seen = (seen_as, now)
        stale = now - seen[1] >= ttl
        if not (stale or (old is not None and old.released)):
            return None
        generation = max(old.generation if old is not None else 0, after) + 1
        rec, data = self._record(run_id, step_id, generation)
        sent = self.clock()
        try:
            new_etag = self.storage.put_if_match(key, data, etag)
        except (PreconditionFailed, FileNotFoundError):
            mine = self._mine(key, rec)
            if mine is None:
                return None  # another contender (or the holder's renewal) got there first
            new_etag = mine[0]
        if old is not None and not old.released:
            logger.warning("lease %s: taking over generation %d from %s (silent for %.1fs)", key,
                           old.generation, old.holder, now - seen[1])
        return self._won(key, rec, new_etag, sent)

    def _won(self, key: str, rec: LeaseRecord, etag: str, sent: float,
             created: bool = False) -> Lease:
        with self._guard:
            self._observed.pop(key, None)
        logger.debug("lease %s: acquired generation %d as %s", key, rec.generation, self.holder)
        return self._lease(rec, etag, sent, created)

    # -------------------------------------------------------------------- renew/release

    def renew(self, lease: Lease) -> Lease:
        """A fresh deadline for `lease`; LeaseLostError if anyone has written it since.

        A renewal that arrives after the deadline still succeeds if nobody took the lease
        over meanwhile: the CAS proves it, so no work is thrown away needlessly.
        """
        rec, data = self._record(lease.run_id, lease.step_id, lease.generation,
                                 renewals=lease.renewals + 1)
        sent = self.clock()
        try:
            etag = self.storage.put_if_match(lease.key, data, lease.etag)
        except (PreconditionFailed, FileNotFoundError):
            found = self._still_ours(lease, rec)
            if found is None:
                raise LeaseLostError(lease.run_id, lease.step_id, lease.generation,
                                     "another worker has taken it over") from None
            etag, got = found
            if got.nonce != rec.nonce:
                # An earlier write of ours landed though its reply was lost. Adopt its etag,
                # keep the old deadline: when that write was sent is not known, and trusting
                # it from now would be unsafe.
                return Lease(lease.run_id, lease.step_id, lease.holder, lease.generation,
                             lease.ttl, etag, lease.deadline, got.renewals)
        return self._lease(rec, etag, sent)

    def release(self, lease: Lease) -> bool:
        """Give the step back at once (others need not wait for the ttl); False if already lost.

        The object is kept, marked released, rather than deleted: deleting it would let the
        next holder start again at generation 1 and undo the fencing.
        """
        rec, data = self._record(lease.run_id, lease.step_id, lease.generation, released=True,
                                 renewals=lease.renewals + 1)
        etag = lease.etag
        for _ in range(3):
            try:
                self.storage.put_if_match(lease.key, data, etag)
                return True
            except (PreconditionFailed, FileNotFoundError):
                found = self._still_ours(lease, rec)
                if found is None:
                    logger.info("lease %s: already taken over; nothing to release", lease.key)
                    return False
                etag, got = found
                if got.nonce == rec.nonce:
                    return True  # this release landed; its reply was lost
                # a renewal of ours landed after `lease` was taken: release that one
        return False

    def _still_ours(self, lease: Lease, rec: LeaseRecord) -> tuple[str, LeaseRecord] | None:
        """After a refused CAS: (etag, stored record) if the stored record is ours, else None.

        Ours is the record we just sent (its nonce), or any unreleased record of this holder
        and generation: only the holder of a generation writes it, so that is an earlier write
        of ours whose reply was lost, or a renewal newer than the `lease` object in hand.
        """
        try:
            current, etag = self.storage.get_with_etag(lease.key)
        except FileNotFoundError:
            return None
        got = self._parse(lease.key, current)
        if got is None:
            return None
        if got.nonce == rec.nonce or (got.holder == self.holder and not got.released
                                      and got.generation == lease.generation):
            return etag, got
        return None

    def seen_held(self, run_id: str, step_id: str) -> bool:
        """Whether this manager last found the step's lease held by another (and is timing it)."""
        with self._guard:
            return lease_key(run_id, step_id) in self._observed

    def valid(self, lease: Lease) -> bool:
        """Whether the holder may still act on `lease` without renewing it first."""
        return self.clock() < lease.deadline


class Heartbeat:
    """Renews one lease in a background thread until stopped; `lost` says if it could not.

    Renewing every ttl/4 leaves three chances before the holder's own trust runs out at
    ttl * SAFETY, so one slow or failed request never costs the lease. The beat is kept from
    one renewal's *start* to the next: a renewal that was slow to come back (a slow link, a
    request retried) is followed by the next one at once rather than a full interval later,
    since both the holder's trust and a contender's patience are counted from its writes.
    """

    def __init__(self, manager: LeaseManager, lease: Lease, interval: float | None = None) -> None:
        self.manager = manager
        self._lease = lease
        self.interval = interval if interval is not None else lease.ttl / 4
        self.lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"ckptfs-lease-{lease.step_id}",
                                        daemon=True)

    @property
    def lease(self) -> Lease:
        with self._lock:
            return self._lease

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> Lease:
        """The current lease, or LeaseLostError if it was lost or its deadline passed unrenewed."""
        if self.lost is not None:
            raise self.lost
        lease = self.lease
        if not self.manager.valid(lease):
            raise LeaseLostError(lease.run_id, lease.step_id, lease.generation,
                                 "its deadline passed before a renewal got through")
        return lease

    def _loop(self) -> None:
        due = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = time.monotonic() + self.interval
            try:
                renewed = self.manager.renew(self.lease)
            except LeaseLostError as exc:
                self.lost = exc
                logger.warning("%s", exc)
                return
            except Exception as exc:  # a slow or failing backend: try again next beat
                logger.warning("lease %s: renewal failed (%s); retrying", self.lease.key, exc)
                continue
            with self._lock:
                self._lease = renewed
