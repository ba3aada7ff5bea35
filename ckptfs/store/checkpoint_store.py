"""CheckpointStore: runs, versions, the journal, compaction, retention and the fallback load.

The seed's methods keep their names and meaning; underneath, a commit costs the size of
its change, not the size of the run:

* every commit is one journal record (`log/<v>`), created exclusively, holding only what
  changed; it is the commit point, durable before the call returns;
* a background compactor keeps its own replica of each run in memory and, without reading
  anything back, merges every `fanout` records of one level into a delta of the next level
  (`delta/<base>-<v>`) and writes a full snapshot (`snap/<v>`) once the records a load
  would need outweigh the last snapshot or grow past `max_plan` files. Total bytes stay a
  small multiple of the state; a load reads one snapshot and a bounded number of records;
* a load takes the newest snapshot that validates, then the largest valid jump at each
  version (a delta, else the next journal record), checking the hash chain at every step.
  Anything that fails is skipped with a warning; if files exist but nothing loads,
  `CheckpointCorruptError`. A writer that resumes after such a fallback continues on a new
  branch (next free version, based on the last valid one), so nothing is overwritten.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, NamedTuple

from pydantic import ValidationError

from ckptfs.errors import (
    BaseRemovedError,
    CheckpointCorruptError,
    ConflictError,
    CorruptFileError,
    InvalidGraphError,
    InvalidIdError,
    KeyOccupiedError,
    LeaseLostError,
    RecordTooLargeError,
    RunNotFoundError,
    StaleStepsError,
    StepCompletedError,
    VersionLimitError,
)
from ckptfs.format import codec
from ckptfs.format.changes import Changes
from ckptfs.format.keys import (
    MAX_VERSION,
    RUNS,
    log_key,
    parse_run_key,
    run_prefix,
    snap_key,
)
from ckptfs.format.models import (
    TERMINAL_STATUSES,
    AgentRun,
    ArtifactRef,
    Step,
    StepStatus,
    ToolCall,
    find_cycle,
    validate_id,
)
from ckptfs.format.reader import REFS_FIELD
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from ckptfs.store.artifacts import ArtifactSource, ArtifactStore
from ckptfs.store.compactor import CompactionPolicy, Compactor, Entry, RunCompaction
from ckptfs.store.group_commit import GroupPart
from ckptfs.store.head import Head, logged
from ckptfs.store.leases import Lease
from ckptfs.store.loader import Loaded, LoadInfo, RunLoader, gc_paused
from ckptfs.store.pools import StorePool
from ckptfs.store.retention import RetentionResult, apply_retention, keeps_fences
from ckptfs.store.sharing import catch_up
from ckptfs.store.values import PendingArtifact, ValuePlanner

logger = logging.getLogger(__name__)

_GroupPlan = tuple[Changes, dict[str, codec.Fragment | None], list[PendingArtifact], list[Step],
              list[tuple[str, ToolCall]], bytes | None]

STREAM_BODIES_OVER = 8 << 20  # a delta or snapshot body larger than this is encoded streaming
RESUMABLE_STATUSES = frozenset({"running", "paused", "failed"})
# Loads of a run whose files vanish under them, before the FileNotFoundError is the caller's.
# A file vanishes only because the writer's retention removed it, which it does only once a
# newer snapshot is written, so each attempt lists a newer run. Three were too few beside a
# writer with an aggressive policy (keep_last=1, a snapshot every few commits): a reader in
# another process looping `load_run` got FileNotFoundError in 36 of 200 loads (a hostile
# review; on S3, 55 of 60). From the third attempt on, each
# waits a few ms (at most ~0.1 s), so a reader never spins against a writer on a busy core.
LOAD_ATTEMPTS = 25
MAX_IDLE = 10 * 365 * 86400.0  # how old a loaded head is taken to be when its time says nothing




class _Dropped(NamedTuple):
    """A head this store let go of without the caller asking (a lost race it could not catch
    up with, a base found gone, one of its own reads seeding a newer head over it): which run
    it was (`_birth`) and the version and hash it stood on, so that the next write can tell
    the same run gone on from another run started under the id after a forget."""

    birth: Any  # `_birth`
    version: int
    hash: str
    base_gone: bool  # the base check found it gone: no need to look again


def _birth(head: Head) -> Any:
    """Which run a head is of, beyond its id: its creation time. A forgotten run started again
    under the same id has another, which a retry after a lost race or base must not write into.
    The goal is no part of it: another writer of the run may edit it (a slow writer whose base
    retention took was refused as a forgotten run for that). Two runs made with the same
    explicit created_at are not told apart."""
    if head.run_json is None:
        return None
    return json.loads(head.run_json).get("created_at")


def _backoff(attempt: int) -> None:
    """Jittered exponential pause before rebasing a commit that lost a race (5 ms .. 0.5 s)."""
    time.sleep(min(0.5, 0.005 * 2 ** attempt) * (0.5 + random.random()))


def _writer_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class CheckpointStore:
    """Durable, versioned checkpoints of agent runs on local disk, S3 or memory.

    `CheckpointStore("/var/lib/agent")`, `CheckpointStore("s3://bucket/prefix",
    storage_options={...})`, `CheckpointStore("memory://name")`. Every write method returns
    once the change is durable on the backend. One process at a time should write a run;
    a second writer gets `ConflictError` rather than overwriting anything.
    """

    def __init__(
        self,
        url: str = "agent_checkpoints",
        storage_options: Mapping[str, Any] | None = None,
        *,
        keep_last: int = 3,
        artifact_threshold: int = 64 * 1024,
        max_decoded_bytes: int = codec.DEFAULT_MAX_DECODED_BYTES,
        compression_level: int = codec.DEFAULT_LEVEL,
        policy: CompactionPolicy | None = None,
        storage: Storage | None = None,
    ) -> None:
        self.storage = storage if storage is not None else open_storage(url, storage_options)
        self.url = self.storage.display_url
        # `keep_last` is the seed-friendly spelling; an explicit policy wins unless both are given.
        if policy is None:
            policy = CompactionPolicy(keep_last=keep_last)
        elif keep_last != CompactionPolicy.keep_last:
            policy = dataclasses.replace(policy, keep_last=keep_last)
        self.policy = policy
        self.artifact_threshold = artifact_threshold
        self.max_decoded_bytes = max_decoded_bytes
        self.compression_level = compression_level
        self.artifacts = ArtifactStore(self.storage)
        self._loader = RunLoader(self.storage, self.artifacts, max_decoded_bytes)
        self._values = ValuePlanner(self.artifacts, artifact_threshold)
        self.writer_id = _writer_id()
        self._heads: dict[str, Head] = {}
        # Runs whose head this store let go of (`_Dropped`), with which run they were: a write
        # that finds another run under the id is refused (`_head`) until the caller's load_run.
        self._gone: dict[str, _Dropped] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self._compactor = Compactor(self.policy, self.storage, self._encode)
        self._pool: ThreadPoolExecutor | None = None
        self.last_load: LoadInfo | None = None
        ref = weakref.ref(self)
        atexit.register(lambda: (s := ref()) is not None and s.flush(timeout=10.0))

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for background compaction to catch up; True if it did within `timeout`."""
        return self._compactor.flush(timeout)

    def close(self) -> None:
        self.flush(timeout=60)
        self._compactor.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.storage.close()

    def _lock(self, run_id: str) -> threading.RLock:
        with self._locks_guard:
            lk = self._locks.get(run_id)
            if lk is None:
                lk = self._locks[run_id] = threading.RLock()
            return lk

    # ------------------------------------------------------------------ encoding helpers

    def _encode(self, kind: codec.RecordKind, run_id: str, version: int, base: int,
                base_hash: str, hash_: str, changes: Changes,
                summary: dict[str, Any] | None = None) -> bytes:
        # A large body (a snapshot is the whole state) is streamed in pieces, twice (hashed,
        # then compressed), so it is never copied whole beside the replica that holds it; a
        # small one (a delta) is assembled once, which spares unpacking its fragments twice.
        parts: list[bytes] = []
        size = 0
        body: bytes | None = None
        for part in changes.chunks():
            parts.append(part)
            size += len(part)
            if size > STREAM_BODIES_OVER:
                break
        else:
            body = b"".join(parts)
        del parts
        if body is not None:
            body_sha, body_len = codec.sha256_hex(body), len(body)
        else:
            body_sha, body_len = codec.body_digest(changes.chunks())
        header = codec.RecordHeader(
            format=codec.FORMAT_NAME, format_version=codec.FORMAT_VERSION, kind=kind,
            run_id=run_id, version=version, base=base, base_hash=base_hash, hash=hash_,
            body_sha256=body_sha, writer=self.writer_id, time=time.time(),
            summary=summary or {},
        )
        # Checked against the reader's limit, as a journal record is: a delta or snapshot no
        # load can decode must not be written (retention would count it as a kept snapshot).
        if body is not None:
            return codec.encode(header, body, self.compression_level, self.max_decoded_bytes)
        return codec.encode_parts(header, changes.chunks, body_len, self.compression_level,
                                  self.max_decoded_bytes)

    # ------------------------------------------------------------------------ commit path

    def _head(self, run_id: str) -> Head:
        head = self._heads.get(run_id)
        if head is None:
            if self._load(run_id, None, resolve=True, seed_head=True) is None:
                head = Head(run_id=run_id)
                self._heads[run_id] = head
                self._compactor.submit("init", (run_id, RunCompaction(Changes(), 0, "", 0)))
            else:
                head = self._heads[run_id]
        if run_id in self._gone:  # one lookup per commit; rare: after a dropped head
            self._check_lineage(run_id, head)
        return head

    def _check_lineage(self, run_id: str, head: Head) -> None:
        """After this store dropped its head (`_drop`), whether the head it holds now (reloaded
        for a retry, or by a read meanwhile) is still the run it wrote to. If the run was
        forgotten and started again by another job, a retry (a tool-log append, a commit of
        the caller's run object) would put this writer's paid calls and results into that
        run: refused until the caller's own load_run of the id. Another creation time is the
        sign, but another writer may have saved a fresh AgentRun under the id: then the version
        the dropped head stood on must still be this chain's (`_base_is_ours`, a GET or two,
        only here). Where the base was found gone, the chain cannot tell (retention may have
        taken it): refused."""
        gone = self._gone[run_id]
        # Kept until the check has answered: a 503 in `_base_is_ours` lost it, and the retry
        # (a paid result's log record is written again for minutes) landed in the new run.
        if (not head.version or _birth(head) == gone.birth
                or (not gone.base_gone and self._base_is_ours(run_id, gone.version, gone.hash))):
            del self._gone[run_id]
            return
        self._heads.pop(run_id, None)
        raise RunNotFoundError(f"run {run_id!r} was forgotten while this writer held it; "
                               "nothing was written (the id may now hold another run: "
                               "load_run it to work on that one)")

    def _drop(self, run_id: str, *, base_gone: bool = False) -> None:
        """`_forget` the head after a conflict or a base found gone, remembering which run it
        was for `_check_lineage`. A head of no version has no lineage to protect: two writers
        creating the same id race as before."""
        head = self._heads.get(run_id)
        # The first head dropped is the run this writer wrote to; a later one may already be
        # the new run's, seeded by a read meanwhile (a refresh reloading past a pruned record
        # put the new run's head in its place, and the guard then passed the write).
        if head is not None and head.version and run_id not in self._gone:
            self._gone[run_id] = _Dropped(_birth(head), head.version, head.hash, base_gone)
        self._forget(run_id)

    def _commit(self, run_id: str, changes: Changes, *, run: AgentRun | None,
                changed_steps: list[Step], removed: Iterable[str] = (),
                run_info: dict[str, Any] | None = None, rebase: bool = False,
                artifacts: Iterable[PendingArtifact] = ()) -> int:
        """Write one journal record with `changes`; the only place versions are created.

        On a lost race the head is dropped (the next call reloads the run), unless the caller
        will `rebase`: catch the head up with the records that won and try again.
        Everything a load would refuse is refused before the first byte is written (the
        planned `artifacts` included): a version past MAX_VERSION, whose key no load parses
        (VersionLimitError), and a record over `max_decoded_bytes` (RecordTooLargeError). A key
        held by something no load sees is KeyOccupiedError, not a race to retry forever.
        """
        head = self._heads[run_id]
        head.adopt_packed()
        new_status = {s.id: s.status._value_ for s in changed_steps}  # not the .value property
        new_deps = {s.id: tuple(s.dependencies) for s in changed_steps}
        removed = list(removed)
        self._check_graph(run_id, head, changed_steps, new_deps, set(removed))
        if changes.is_empty():
            return head.version
        version = head.next_version
        if version > MAX_VERSION:
            raise VersionLimitError(run_id, version, self._version_limit_detail(run_id, head))
        body = changes.to_json()
        body_sha = codec.sha256_hex(body)
        h = codec.chain_hash(head.hash, body_sha, version)
        removed = list(removed)
        counts = head.counts_after(new_status, removed)
        info = run_info or dict(head.run_info)
        if run is not None:
            info = {"goal": run.goal[:200], "status": run.status, "updated_at": run.updated_at}
        header = codec.RecordHeader(
            format=codec.FORMAT_NAME, format_version=codec.FORMAT_VERSION, kind="journal",
            run_id=run_id, version=version, base=head.version, base_hash=head.hash, hash=h,
            body_sha256=body_sha, writer=self.writer_id, time=time.time(),
            summary={**info, **counts},
        )
        try:
            data = codec.encode(header, body, self.compression_level, self.max_decoded_bytes)
        except RecordTooLargeError as exc:
            raise self._values.too_large(run_id, changes, exc) from None
        self._values.store_artifacts(artifacts)
        key = log_key(run_id, version)
        # Exclusive create fences writers only while the key exists, and retention deletes old
        # records, so the commit must know its base is still stored. A remote store keeps
        # pruned records as fences for a while (store/retention.py): a head confirmed within
        # half of that needs nothing but the PUT, one request; an older one checks beside it.
        # Local disk checks every time, with a stat of the base's record beside the create.
        started = (time.monotonic(), time.time())
        fenced = bool(head.version) and keeps_fences(self.storage)
        half = self.policy.fence_seconds / 2
        check_base = bool(head.version) and not (fenced and head.unconfirmed_for(started) < half)
        base_check = None
        base_seen = False
        # Beside the PUT only where no fences are kept (every commit checks there). On a fencing
        # store a check is rare (a head idle past half the fence time) and comes after the PUT:
        # asked beside it, a base that a forget deleted while a slow PUT was still on its way
        # answered "there", and the PUT landed after the forget's last listing (acknowledged,
        # then CheckpointCorruptError). After it, either the check sees the base gone, or the
        # record was there before the forget's last listing, which reports it.
        if check_base and self.storage.capabilities.remote and not fenced:
            base_check = self._io_pool().submit(self._base_exists, run_id, head.version)
        try:
            if check_base and base_check is None and not fenced:
                base_seen = self.storage.put_if_absent_beside(key, data,
                                                              log_key(run_id, head.version))
            else:
                self.storage.put_if_absent(key, data)
        except FileExistsError:
            if not self._listed(run_id, version):
                # No load sees what holds the key (on disk, a directory by that name): a reload
                # would meet it again, so this is no lost race. Nothing of ours was written.
                raise KeyOccupiedError(run_id, version, key, (
                    "is taken by something that is not a stored record (on a filesystem: a "
                    "directory of that name), and no load can see it; move it out of the store, "
                    "then commit again (nothing was written)")) from None
            if not rebase:
                self._drop(run_id)
            raise ConflictError(run_id, version, "reload the run to continue from the newest "
                                "version") from None
        if not check_base and fenced and head.unconfirmed_for() >= half:
            check_base = True  # the PUT itself took long (retried, throttled): check after it
        try:
            if not check_base:
                base_ok = True
            elif fenced:
                base_ok = self._base_is_ours(run_id, head.version, head.hash)
            else:
                base_ok = base_seen or (base_check.result() if base_check is not None
                                        else self._base_exists(run_id, head.version))  # snapshot, delta
        except BaseException:
            # The record may be stored while its base is unknown (the check failed: a 503, a
            # dropped connection): the head is dropped, so the next call reloads and sees
            # whether it landed, instead of taking its own record for another writer's.
            self._drop(run_id)
            raise
        if not base_ok:
            # A writer whose head is older than the oldest kept snapshot (or than a forget)
            # just re-created a removed version: withdraw what we wrote.
            self._drop(run_id, base_gone=True)
            try:
                self._withdraw(key, data)
            except Exception as exc:
                # The refusal stands whatever became of the record. Raised as the storage
                # error, it invited a retry, which reloaded the id (after a forget, perhaps a
                # new run of it) and built on that. The record stays: no load follows it past
                # its missing base, and a new run of the id commits past it.
                logger.warning("run %s: %s could not be withdrawn (%s); it stays, a record no "
                               "load follows (`ckptfs verify` names it)", run_id, key, exc)
                raise BaseRemovedError(run_id, version, head.version) from exc
            raise BaseRemovedError(run_id, version, head.version)
        plain = {sid: mj for sid in changes.steps
                 if (mj := head.steps_cmp.get(sid)) is not None and not codec.is_packed(mj)}
        entry = Entry(0, head.version, head.hash, version, h, changes, len(data),
                      head_plain=plain, packed_back=head.packed_later if plain else None,
                      summary=header.summary)
        head.moved_on(version, steps_changed=bool(changes.steps))
        head.version, head.hash, head.next_version = version, h, version + 1
        head.confirmed_at = started
        head.counts, head.run_info = counts, info
        head.status.update(new_status)
        head.deps.update(new_deps)
        for sid in removed:
            head.deps.pop(sid, None)
            head.status.pop(sid, None)
            head.steps_cmp.pop(sid, None)
        if changes.run is not None:
            head.run_json = changes.run
        self._compactor.submit("commit", (run_id, entry))
        if head.branching:
            # A load that fell back past damaged files always picks the newest snapshot, so a
            # branch is only findable once it has one: write it before acknowledging.
            self._compactor.flush()
            if not self.storage.exists(snap_key(run_id, version)):
                logger.warning("run %s: snapshot of branch at v%d not written; a later load may "
                               "fall back past it", run_id, version)
            head.branching = False
        return version

    def _listed(self, run_id: str, version: int) -> bool:
        """Whether a listing, and so a reload, sees the journal key of `version` (asked after
        its exclusive create failed: one LIST, on the conflict path only)."""
        key = log_key(run_id, version)
        try:
            keys = self.storage.list(f"{run_prefix(run_id)}log/",
                                     start_after=log_key(run_id, version - 1))
        except FileNotFoundError:
            return False
        return key in keys

    def _version_limit_detail(self, run_id: str, head: Head) -> str:
        """Why the next version is past MAX_VERSION: name the file that pushed it there."""
        files = [f for f in self._loader.run_files(run_id) if f.version >= head.next_version - 1]
        top = max(files, default=None)
        culprit = (f"The newest file, {top.key}, " if top is not None
                   else "A file the run had when it was loaded ")
        return (f"it is past {MAX_VERSION}, the largest version a key can name, so no load would "
                f"find it. {culprit}set the next version, while the newest valid version is "
                f"v{head.version}: if that file is not a record of this run (`ckptfs verify` "
                "reports it), move it out of the store and reload the run. Nothing was written")

    def _io_pool(self) -> ThreadPoolExecutor:
        with self._locks_guard:
            if self._pool is None:
                self._pool = StorePool(max_workers=2, thread_name_prefix="ckptfs-io")
            return self._pool

    def _base_exists(self, run_id: str, version: int) -> bool:
        """Whether the version a commit builds on is still stored: its journal record, its
        snapshot, or a delta ending at it. The last is what a restore point or a mirror holds
        below its tail of records, so only that case pays a LIST (of the run's deltas)."""
        if self.storage.exists(log_key(run_id, version)) or self.storage.exists(snap_key(run_id, version)):
            return True
        try:
            deltas = self.storage.list(f"{run_prefix(run_id)}delta/")
        except FileNotFoundError:
            return False
        return any((rf := parse_run_key(k)) is not None and rf.version == version for k in deltas)

    def _base_is_ours(self, run_id: str, version: int, chain_hash: str) -> bool:
        """Whether the version a commit builds on is stored *and* is the one this head built
        on: the first of its journal record, snapshot or deltas ending there that reads must
        carry this head's hash. After a forget, a run of the same id started again holds a
        version of that number of its own (a record, or a snapshot once pruned), and a writer
        of the forgotten run that checked only that some file was there had its commit
        acknowledged on a chain no load follows. A file that does not read is passed over
        (a damaged record beside a good snapshot is no missing base). The rare path of a
        fencing store's check (a head idle past half the fence time): a GET of the record,
        or of the snapshot where retention took the record, whose body is hashed in pieces,
        never parsed (a snapshot of a long run is tens of megabytes decoded)."""
        def candidates() -> Iterator[str]:
            yield log_key(run_id, version)
            yield snap_key(run_id, version)
            try:
                deltas = self.storage.list(f"{run_prefix(run_id)}delta/")
            except FileNotFoundError:
                return
            yield from (k for k in deltas if (rf := parse_run_key(k)) is not None and rf.version == version)

        for key in candidates():
            rf = parse_run_key(key)
            try:
                data = self.storage.get(key)
                header = self._loader.header(rf, data, run_id) if rf is not None else None
            except FileNotFoundError:
                continue
            except CorruptFileError as exc:
                logger.warning("run %s: %s does not read (%s); looking further for the base",
                               run_id, key, exc)
                continue
            if header is not None:
                return header.hash == chain_hash
        return False

    def _withdraw(self, key: str, data: bytes) -> None:
        """Delete the record this commit wrote, if what the key holds is still its bytes: after
        a forget, a run started again may have taken the key meanwhile with a record of its
        own, acknowledged (S3 has no delete conditioned on content; the window left is one
        GET to the DELETE, against the whole check before)."""
        try:
            if self.storage.get(key) == data:
                self.storage.delete(key)
            else:
                logger.warning("%s: now holds another writer's record; ours is not withdrawn", key)
        except FileNotFoundError:
            pass

    def _forget(self, run_id: str) -> None:
        self._heads.pop(run_id, None)
        self._compactor.submit("forget", run_id)

    # ------------------------------------------------------- catching up (several writers)

    def refresh(self, run_id: str) -> AgentRun | None:
        """The run at its newest version, reading only what others committed since this store
        last saw it: one LIST and a GET per new record, where `load_run` reads a snapshot and
        its chain. Workers sharing a run call it before every decision. Whenever the shortcut
        cannot be sure (a gap, a damaged record, a branch) it is a plain `load_run`."""
        validate_id(run_id, "run id")
        with self._lock(run_id):
            head = self._heads.get(run_id)
            if head is not None and head.version and head.run_json is not None and not head.branching:
                if self._catch_up(head) is not None:
                    try:
                        run = head.run()
                        head.others.clear()  # the caller now holds what they wrote
                        return run
                    except (ValidationError, ValueError) as exc:
                        logger.warning("run %s: cached state does not validate (%s); reloading",
                                       run_id, exc)
                self._drop(run_id)
            return self._load_newest(run_id)

    def _catch_up(self, head: Head) -> int | None:
        """Records others committed after the head, applied (see store/sharing.py); None: reload."""
        return catch_up(self.storage, self._loader, head, self._compactor.submit, self._io_pool)

    def _rebase(self, run_id: str) -> None:
        """After a lost race: bring the head up to the records that won, or drop it to reload."""
        head = self._heads.get(run_id)
        if head is not None and (head.branching or not self._catch_up(head)):
            self._drop(run_id)

    def _head_for_shared_commit(self, run_id: str) -> Head:
        """The head, first caught up if others commit to this run too: one LIST instead of a
        commit that fails on a version someone took meanwhile, then the same catching up."""
        head = self._head(run_id)
        if head.shared and not head.branching and self._catch_up(head) is None:
            self._drop(run_id)
            head = self._head(run_id)
        return head

    def _check_graph(self, run_id: str, head: Head, changed: list[Step],
                     new_deps: dict[str, tuple[str, ...]], removed: set[str]) -> None:
        """Refuse a commit that would store an unrunnable graph; costs O(change) normally.

        New steps can only close a cycle among themselves (an old step cannot depend on an
        id that did not exist), so only a changed edge of an existing step or a removal
        needs the whole graph searched.
        """
        problems: list[str] = []
        rewired = bool(removed)
        for s in changed:
            if s.status == StepStatus.COMPLETED and s.result is None:
                problems.append(f"step {s.id!r} is COMPLETED without a result")
            for d in s.dependencies:
                if d in removed or (d not in head.deps and d not in new_deps):
                    problems.append(f"step {s.id!r} depends on unknown step {d!r}")
            old = head.deps.get(s.id)
            if old is not None and old != new_deps[s.id]:
                rewired = True
        if problems:
            raise InvalidGraphError(f"run {run_id!r}: refusing to commit an invalid step graph: "
                             + "; ".join(problems[:5]))
        if not new_deps and not removed:
            return
        if rewired:
            deps = {k: v for k, v in head.deps.items() if k not in removed}
            deps.update(new_deps)
            for k, v in deps.items():
                problems += [f"step {k!r} depends on removed step {d!r}" for d in v if d in removed]
        else:
            deps = new_deps
        cycle = find_cycle(deps)
        if cycle is not None:
            problems.append(f"dependency cycle through step {cycle!r}")
        if problems:
            raise InvalidGraphError(f"run {run_id!r}: refusing to commit an invalid step graph: "
                             + "; ".join(problems[:5]))

    def _step_changes(self, head: Head, steps: Iterable[Step], changes: Changes,
                      undo: dict[str, codec.Fragment | None], pending: list[PendingArtifact]) -> list[Step]:
        """Diff steps against the head; `undo` gets the previous comparison bytes of each
        step touched, so a failed commit can restore exactly those (O(change), not O(run)).
        A changed step is checked (`_check_storable`) before its large values are planned."""
        changed: list[Step] = []
        for given in steps:
            step = self._values.require_step(head.run_id, given)
            model_json = self._values.model_json_of(step, head.run_id, step.id)
            old = head.steps_cmp.get(step.id)
            # The head holds each step's JSON plain (as loaded, or just committed) or packed
            # (codec.pack, by the compactor after a commit): compared unpacked, and only when
            # the lengths agree (the packed frame states its content size).
            if old is not None and (old == model_json if not codec.is_packed(old)
                                    else codec.packed_equals(old, model_json)):
                self._values.check_unchanged(head.run_id, step.id, step, model_json)
                continue
            self._values.check_storable(head.run_id, step.id, step)
            changes.steps[step.id] = self._values.offload_step(step, model_json, pending)
            undo.setdefault(step.id, old)
            head.steps_cmp[step.id] = model_json  # packed off the commit path (_commit)
            changed.append(step)
        return changed

    def _refuse_stale(self, head: Head, changes: Changes) -> None:
        """StaleStepsError if `changes` writes a step another writer changed after this process
        last handed the run out (`Head.others`); the head is dropped, so the next load reads
        the store. Without it, a second agent resuming a run that another process was running
        caught up with that one's records through its tool-call log (which rebases) and then
        committed its own older copy of the same steps over them: both ran the run to the end,
        every completion acknowledged twice, the last writer's results kept. Workers write
        their steps under leases (`commit_step`, which rebases) and refresh before a plain
        commit, so they never meet it."""
        stale = sorted(sid for sid in changes.steps if sid in head.others)
        if stale:
            self._forget(head.run_id)
            raise StaleStepsError(head.run_id, head.version + 1, stale)

    @staticmethod
    def _rollback(head: Head, undo: dict[str, codec.Fragment | None]) -> None:
        for sid, old in undo.items():
            if old is None:
                head.steps_cmp.pop(sid, None)
            else:
                head.steps_cmp[sid] = old

    def commit(self, run: AgentRun, steps: Iterable[Step | str] | None = None) -> int:
        """Commit the run-level fields and the given steps (all steps if None): the fast path.

        Cost is proportional to what is passed, not to the size of the run, which is why
        the agent runtime calls this with just the steps it touched. Returns the version.
        """
        if steps is None:
            return self.save_run(run)
        return self._commit_steps(run.run_id, run, self._values.require_all_given(run, steps))

    def commit_many(self, parts: Sequence[GroupPart]) -> None:
        """Several callers' commits to one run as ONE journal record (group commit).

        One fsync (one PUT) for all of them, where `commit` per caller costs one each; each
        part's future resolves to the version once the record is durable, or fails with the
        error that is that part's own (see store/group_commit.py: a part refused alone fails
        alone, a record refused for its content is split). Never raises. `GroupCommitter`
        is the queue that gathers the parts.
        """
        by_run: dict[str, list[GroupPart]] = {}
        for p in parts:
            by_run.setdefault(p.run_id, []).append(p)
        for run_id, group in by_run.items():
            self._group_commit(run_id, group)

    # ------------------------------------------------- group commit (store/group_commit.py)

    def _group_commit(self, run_id: str, parts: Sequence[GroupPart]) -> None:
        """Write `parts` (all of run `run_id`) as one journal record; resolve every part's future.

        Never raises: each part's outcome is on its future (see the module docstring for which
        error goes to which part).
        """
        try:
            validate_id(run_id, "run id")  # before any key is built from it
            with self._lock(run_id):
                self._group_locked(run_id, list(parts))
        except BaseException as exc:  # _head() failing to load, or a bug: nobody may wait forever
            for p in parts:
                p.fail(exc)

    def _group_locked(self, run_id: str, parts: list[GroupPart]) -> None:
        head = self._head(run_id)
        if head.shared:
            # Others commit to this run: their rules (catch up first, rebase tool results) hold.
            for p in parts:
                self._group_alone_shared(p)
            return
        changes = Changes()
        # The record's run-level fields are those of the last part ACCEPTED with a run, chosen
        # only once every part is planned: a refused part's fields (its caller got an error)
        # must not be written with the others, nor refuse the parts whose own fields are fine.
        run: AgentRun | None = None
        run_json: bytes | None = None
        accepted: list[GroupPart] = []
        undo: dict[str, codec.Fragment | None] = {}
        pending: list[PendingArtifact] = []
        changed: dict[str, Step] = {}
        logged_calls: list[tuple[str, ToolCall]] = []
        for p in parts:
            got = self._group_plan(run_id, head, p, saved=head.version > 0 or run is not None)
            if got is None:
                continue
            part_changes, part_undo, part_pending, part_changed, part_calls, part_run_json = got
            if p.run is not None:
                run, run_json = p.run, part_run_json
            changes.merge(part_changes)
            for sid, old in part_undo.items():
                undo.setdefault(sid, old)  # the oldest bytes: what is really stored
            pending += part_pending
            changed.update((s.id, s) for s in part_changed)
            logged_calls += part_calls
            accepted.append(p)
        if not accepted:
            return
        if run_json is not None and run_json != head.run_json:
            changes.run = run_json
        try:
            version = self._commit(run_id, changes, run=run, changed_steps=list(changed.values()),
                                    artifacts=pending)
        except BaseException as exc:
            self._rollback(head, undo)
            self._group_refused(run_id, accepted, exc)
            return
        for sid, call in logged_calls:
            head.tool_log.setdefault(sid, []).append(call.model_copy(deep=True))
        for p in accepted:
            p.done(version)
        if len(accepted) > 1:
            logger.debug("run %s: v%d holds %d grouped commits", run_id, version, len(accepted))

    def _group_plan(self, run_id: str, head: Head, p: GroupPart, *, saved: bool) -> _GroupPlan | None:
        """Diff one part against the head (which it updates); on a refusal, undo it, fail the part
        and return None. What the store refuses for one part alone must not fail the others.

        A part's run-level fields are checked as `commit` checks them, whether or not they end
        up written (a later part's may be): grouped or alone, a part gets the same answer. They
        are checked first, so a part refused for them has touched nothing of the head.
        `saved`: the run is stored, or an earlier part accepted into this record saves it (the
        run's first save grouped with what followed it must not refuse the followers).
        """
        part_changes = Changes()
        part_undo: dict[str, codec.Fragment | None] = {}
        part_pending: list[PendingArtifact] = []
        calls: list[tuple[str, ToolCall]] = []
        run_json: bytes | None = None
        try:
            if p.run is None and not saved:
                raise RunNotFoundError(f"run {run_id!r} has no saved state; save_run it first")
            if p.run is not None:
                run_json = self._values.model_json_of(p.run, run_id, None, exclude={"steps"})
                if run_json != head.run_json:
                    self._values.check_storable(run_id, None, p.run, exclude=frozenset({"steps"}))
                else:
                    self._values.check_unchanged(run_id, None, p.run, run_json, frozenset({"steps"}))
            # A part with the run has its steps checked against their keys as `commit` does:
            # `run.steps["x"] = Step(id="y")` would be acknowledged as "x" and stored as "y".
            steps = p.steps if p.run is None else self._values.require_all_given(p.run, p.steps)
            if p.run is not None and not saved:
                # a run the store does not hold (forgotten beside the executor): all of it, as
                # `commit` writes it; a run of just this part's steps was acknowledged
                steps = list(p.run.steps.values())
            changed = self._step_changes(head, steps, part_changes, part_undo, part_pending)
            for sid, call in p.tool_calls:
                validate_id(sid, "step id")
                if logged(head, sid, call) or any(c is call for _, c in calls):
                    continue
                frag = self._values.tool_call_json(call, part_pending, run_id, sid)
                part_changes.tool_log.setdefault(sid, []).append(frag)
                calls.append((sid, call))
        except Exception as exc:
            self._rollback(head, part_undo)
            p.fail(exc)
            return None
        return part_changes, part_undo, part_pending, changed, calls, run_json

    def _group_refused(self, run_id: str, parts: list[GroupPart], exc: BaseException) -> None:
        """A record of several parts was refused: split it, or fail its parts (module docstring)."""
        if len(parts) > 1 and isinstance(exc, ValueError):
            logger.info("run %s: a grouped record of %d commits was refused (%s); committing each "
                        "alone so the others still land", run_id, len(parts), type(exc).__name__)
            for i, p in enumerate(parts):
                self._group_locked(run_id, [p])
                lost = p.future.exception() if p.future.done() else None
                if isinstance(lost, ConflictError):  # another writer moved the run on: stop here,
                    self._group_refused(run_id, parts[i + 1:], lost)  # not land the rest on a reload
                    return
            return
        for p in parts:
            if isinstance(exc, ConflictError) and p.tool_calls and not p.steps and p.run is None:
                self._group_log_calls(p)  # a paid result: rebase and retry, as log_tool_call always did
            else:
                p.fail(exc)

    def _group_log_calls(self, p: GroupPart) -> None:
        try:
            version = 0
            for sid, call in p.tool_calls:
                version = self.log_tool_call(p.run_id, sid, call)
        except BaseException as exc:
            p.fail(exc)
        else:
            p.done(version)

    def _group_alone_shared(self, p: GroupPart) -> None:
        """A part of a run others write too: the store's ordinary one-record paths."""
        try:
            if p.tool_calls and not p.steps and p.run is None:
                self._group_log_calls(p)
                return
            if p.run is not None:
                version = self.commit(p.run, p.steps)
            else:
                version = 0
                for s in p.steps:
                    version = self.save_step_checkpoint(p.run_id, s)
            for sid, call in p.tool_calls:
                version = self.log_tool_call(p.run_id, sid, call)
        except BaseException as exc:
            p.fail(exc)
        else:
            p.done(version)

    def save_run(self, run: AgentRun) -> int:
        """Save or update the full run state (seed API). Returns the committed version.

        Writes only the difference from the last committed version, and costs its size: the
        steps report their assignments and in-place changes to the store's head (see
        format/models.py, "change tracking"), so only those, and steps appended since, are
        compared. Whenever the head cannot vouch for the others (the first save of this run
        object, a removal, a replaced step object, another writer's record) every step is
        compared, as before. The record is the same either way.
        """
        run.updated_at = time.time()
        with self._lock(run.run_id):
            head = self._head(run.run_id)
            changed = head.changed_steps(run)
            if changed is None:
                self._values.require_steps(run)
                return self._commit_steps(run.run_id, run, run.steps.values(), full=True)
            self._values.require_filed(run, changed, head.steps_cmp)  # a step appended under another id
            return self._commit_steps(run.run_id, run, changed)

    def save_step_checkpoint(self, run_id: str, step: Step) -> int:
        """Checkpoint one step's state as the run's next version (seed API)."""
        validate_id(run_id, "run id")
        return self._commit_steps(run_id, None, [step])

    def commit_step(self, run_id: str, step: Step, lease: Lease, *, claim: bool = False,
                    tool_call: ToolCall | None = None, attempts: int = 10, tokens: int = 0,
                    cost_usd: float = 0.0) -> int:
        """Commit one step under a lease: the write path of several workers sharing a run.

        Stamps `step.lease_generation` and refuses (LeaseLostError, nothing written) when the
        stored step was committed under a newer generation, or finished (completed, failed for
        good, skipped) under another one: StepCompletedError, its work is done; a successor must
        not redo it, a stale holder must not overwrite it. A `claim` (the first commit under a
        lease) must strictly raise the stored generation, so two holders of one generation (a
        lease object deleted by hand) cannot both claim the step. A `tool_call` goes to the
        step's log in the same record (a worker's claim rides on its first paid call).
        The check is made against the exact version the commit extends: versions are created
        exclusively, so if another worker committed in between, the create fails, the head
        catches up and the check runs again. Only this step's fields are written, so the retry
        merges with whatever the others committed meanwhile. `tokens` and `cost_usd` (what the
        attempt spent) are added to the run's totals in the same record, against the version it
        extends: each worker adds its own, so none overwrites another's.
        """
        if (lease.run_id, lease.step_id) != (run_id, step.id):
            raise ValueError(f"commit_step: lease is for {lease.run_id}/{lease.step_id}, "  # a caller bug
                             f"not {run_id}/{step.id}")

        def write(head: Head) -> int:
            stored = head.steps_cmp.get(step.id)
            if stored is None:
                raise RunNotFoundError(f"run {run_id!r} has no step {step.id!r}")
            doc = json.loads(bytes(codec.unpack(stored)))
            fence = int(doc.get("lease_generation", 0))
            if fence > lease.generation or (claim and fence == lease.generation):
                raise LeaseLostError(run_id, step.id, lease.generation,
                                     f"generation {fence} has committed the step since")
            if doc.get("status") in TERMINAL_STATUSES and fence != lease.generation:  # a str enum
                raise StepCompletedError(run_id, step.id, lease.generation,
                                         f"the step was already {doc['status']} (generation {fence})")
            if step.lease_generation != lease.generation:
                step.lease_generation = lease.generation
            call = None if tool_call is None or logged(head, step.id, tool_call) else tool_call
            totals = self._totals_plus(run_id, head, tokens, cost_usd) if tokens or cost_usd else None
            return self._commit_steps(run_id, None, [step], rebase=True,
                                      tool_calls=[call] if call else None, run_fields=totals)

        return self._rebasing(run_id, attempts, write)

    def _rebasing(self, run_id: str, attempts: int, write: Callable[[Head], int]) -> int:
        """`write(head)` under the run's lock; on a lost race, catch up, back off and try again.

        For writes that merge with any other writer's (one step's fields, a tool-log append),
        so trying again on the newer head is always right.
        """
        for attempt in range(attempts):
            with self._lock(run_id):
                try:
                    return write(self._head_for_shared_commit(run_id))
                except ConflictError:
                    self._rebase(run_id)
                    if attempt == attempts - 1:
                        raise
            _backoff(attempt)
        raise AssertionError("unreachable")

    def _totals_plus(self, run_id: str, head: Head, tokens: int, cost_usd: float) -> bytes:
        """The run-level JSON of `head` with its totals raised (a worker's commit_step)."""
        if head.run_json is None:
            raise RunNotFoundError(f"run {run_id!r} has no saved state")
        doc = json.loads(head.run_json)
        doc["total_tokens"] = int(doc.get("total_tokens", 0)) + tokens
        doc["total_cost_usd"] = float(doc.get("total_cost_usd", 0.0)) + cost_usd
        run = AgentRun.model_validate({**doc, "steps": {}})
        self._values.check_storable(run_id, None, run, exclude=frozenset({"steps"}))
        return self._values.model_json_of(run, run_id, None, exclude={"steps"})

    def _commit_steps(self, run_id: str, run: AgentRun | None, steps: Iterable[Step],
                      full: bool = False, rebase: bool = False,
                      tool_calls: list[ToolCall] | None = None,
                      run_fields: bytes | None = None) -> int:
        """Diff `steps` (and the run-level fields, with a run) against the head and commit.

        With `full`, steps missing from `run` are recorded as removed. On any failure the
        head's comparison bytes are restored, so a retry diffs against what is really stored;
        a value a load could not give back (UnstorableValueError) is such a failure, raised
        before anything is written.
        """
        with self._lock(run_id):
            head = self._head(run_id)
            if run is None and head.version == 0:
                raise RunNotFoundError(f"run {run_id!r} has no saved state; save_run it first")
            if run is not None and head.version == 0 and not full:
                # A run the store does not hold (never saved, or forgotten meanwhile: `ckptfs
                # forget` beside a live writer): all of it, as save_run writes it. Some of its
                # steps made a run of just those, acknowledged, and a load gave 1 step of 5.
                steps, full = run.steps.values(), True
            changes = Changes()
            if run is not None:
                run_json = self._values.model_json_of(run, run_id, None, exclude={"steps"})
                if run_json != head.run_json:
                    self._values.check_storable(run_id, None, run, exclude=frozenset({"steps"}))
                    changes.run = run_json
                else:
                    self._values.check_unchanged(run_id, None, run, run_json, frozenset({"steps"}))
            elif run_fields is not None and run_fields != head.run_json:
                changes.run = run_fields  # checked by whoever built it (`_totals_plus`)
            removed = [sid for sid in head.steps_cmp if sid not in run.steps] if full and run else []
            undo: dict[str, codec.Fragment | None] = {}
            pending: list[PendingArtifact] = []
            base = head.version
            try:
                steps = list(steps)
                changed = self._step_changes(head, steps, changes, undo, pending)
                for sid in removed:
                    changes.steps[sid] = None
                    undo.setdefault(sid, head.steps_cmp.pop(sid, None))
                if not rebase and head.others:
                    self._refuse_stale(head, changes)
                if tool_calls:  # one step's calls (commit_step)
                    sid = steps[0].id
                    changes.tool_log[sid] = [self._values.tool_call_json(c, pending, run_id, sid)
                                             for c in tool_calls]
                version = self._commit(run_id, changes, run=run, changed_steps=changed,
                                       removed=removed, rebase=rebase, artifacts=pending)
                if tool_calls:
                    head.tool_log.setdefault(steps[0].id, []).extend(
                        c.model_copy(deep=True) for c in tool_calls)
            except BaseException:
                self._rollback(head, undo)
                raise
            if self._heads.get(run_id) is head:  # what save_run may skip next time
                head.synced(run, steps, full, base)
            return version

    def log_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall, *,
                      attempts: int = 60) -> int:
        """Append a tool call to the step's durable log (seed API); durable on return.

        Against other writers of the run it rebases and tries again, `attempts` times (about
        half a minute of lost races): the call was paid for, and a record given up on would
        be paid for again.
        """
        validate_id(run_id, "run id")
        validate_id(step_id, "step id")
        pending: list[PendingArtifact] = []
        call_json = self._values.tool_call_json(tool_call, pending, run_id, step_id)

        def write(head: Head) -> int:
            if head.version == 0:
                raise RunNotFoundError(f"run {run_id!r} has no saved state; save_run it first")
            if logged(head, step_id, tool_call):
                return head.version
            changes = Changes(tool_log={step_id: [call_json]})
            version = self._commit(run_id, changes, run=None, changed_steps=[], rebase=True,
                                   artifacts=pending)
            head.tool_log.setdefault(step_id, []).append(tool_call.model_copy(deep=True))
            return version

        return self._rebasing(run_id, attempts, write)

    def mark_run_complete(self, run_id: str, status: str = "completed") -> int:
        """Set the run's status (seed API: also used for 'paused')."""
        validate_id(run_id, "run id")
        with self._lock(run_id):
            head = self._head(run_id)
            if head.run_json is None:
                raise RunNotFoundError(f"run {run_id!r} has no saved state")
            doc = json.loads(head.run_json)
            if doc.get("status") == status:
                return head.version
            doc["status"] = status
            doc["updated_at"] = time.time()
            run_json = AgentRun.model_validate({**doc, "steps": {}}).model_dump_json(
                exclude={"steps"}).encode()
            info = {**head.run_info, "status": status, "updated_at": doc["updated_at"]}
            return self._commit(run_id, Changes(run=run_json), run=None, changed_steps=[],
                                run_info=info)

    # ------------------------------------------------------------------------- load path

    def load_run(self, run_id: str, version: int | None = None, *,
                 resolve_artifacts: bool = True) -> AgentRun | None:
        """The run at its newest valid version (or at `version`); None if it was never saved.

        Raises CheckpointCorruptError when files exist but none yields a valid state, and
        VersionNotFoundError when `version` is not stored.
        """
        validate_id(run_id, "run id")
        with self._lock(run_id):
            self._gone.pop(run_id, None)  # the caller now holds what the id holds
            result = self._load(run_id, version, resolve=resolve_artifacts,
                                seed_head=version is None and resolve_artifacts, mine=True)
        return None if result is None else result[0]

    def _load_newest(self, run_id: str) -> AgentRun | None:
        """`load_run` for the store's own reads (`refresh`, `run_summary`): what it returns is
        not the caller taking the id's run for theirs, so a head dropped on a new run of the id
        stays refused (`_check_lineage`). A worker's retry of a paid call's log record checks
        with `refresh` whether it landed; a supervisor thread lists resumable runs: had those
        cleared the refusal, the call landed in the new run."""
        with self._lock(run_id):
            result = self._load(run_id, None, resolve=True, seed_head=True)
        return None if result is None else result[0]

    def load_with_tool_log(self, run_id: str, version: int | None = None, *, resolve_artifacts: bool = True
                           ) -> tuple[AgentRun, dict[str, list[ToolCall]]] | None:
        """`load_run` plus the tool log as of that same version (what `show`, `diff` and
        `export` print), from the one load: the log is never read apart from the run."""
        validate_id(run_id, "run id")
        with self._lock(run_id):
            got = self._load(run_id, version, resolve=resolve_artifacts,
                             seed_head=version is None and resolve_artifacts)
        if got is None:
            return None
        run, tool_log = got
        return run, {sid: [c.model_copy(deep=True) for c in calls] for sid, calls in tool_log.items()}

    def _load(self, run_id: str, target: int | None, *, resolve: bool,
              seed_head: bool, mine: bool = False) -> tuple[AgentRun, dict[str, Any]] | None:
        """The run and its tool log; with `seed_head`, the head commits build on from now on.
        `mine`: the caller's own load_run, which takes whatever run the id holds for theirs;
        any other seeding over a head that wrote remembers which run that head was
        (`_check_lineage`), since a read (a summary, a tool log, a refresh) that found
        another run under the id must not turn this writer's next write into that run's."""
        # Seeding inside the pause too: what the load and the head keep is promoted at once
        # (gc_paused), not walked by the next young collection.
        with gc_paused(promote=True):
            for attempt in range(LOAD_ATTEMPTS):
                try:
                    got = self._loader.load(run_id, target, resolve)
                    break
                except FileNotFoundError:
                    if attempt == LOAD_ATTEMPTS - 1:
                        raise
                    logger.info("run %s: a file vanished during load (retention?); reloading", run_id)
                    if attempt >= 2:
                        _backoff(min(attempt - 2, 4))
            if got is None:
                return None
            self.last_load = got.info
            if seed_head:
                old = self._heads.get(run_id)
                if not mine and old is not None and old.version and run_id not in self._gone:
                    self._gone[run_id] = _Dropped(_birth(old), old.version, old.hash, False)
                t0 = time.perf_counter()
                self._seed_head(got)
                got.info.phases["seed head"] = time.perf_counter() - t0
            return got.run, got.tool_log

    def _seed_head(self, got: Loaded) -> None:
        run, tool_log, state, info = got.run, got.tool_log, got.state, got.info
        run_id, version, hash_ = run.run_id, info.version, got.hash
        head = Head(run_id=run_id, version=version, hash=hash_, next_version=info.max_version_seen + 1)
        # Dated by when its newest record was written, not by this load: a writer resuming a
        # run idle for longer than half the fence time checks its base on its first commit.
        # Without that, a forget of the idle run beside the resume (it refuses only runs
        # written recently, maintenance/forget.py) left that commit acknowledged on a run no
        # load could read. One request more, once per load of an idle run.
        # A time ahead of this clock (its writer's clock ran fast) dates nothing: as old, so
        # the first commit checks (taken as now, it skipped the check beside a forget).
        idle = time.time() - info.written_at
        if not 0.0 <= idle <= MAX_IDLE:
            idle = MAX_IDLE
        head.confirmed_at = (time.monotonic() - idle, time.time() - idle)
        head.run_json = run.model_dump_json(exclude={"steps"}).encode()
        head.run_info = {"goal": run.goal[:200], "status": run.status, "updated_at": run.updated_at}
        replica = Changes(run=codec.dumps(state["run"]))
        # The head compares against each step's stored bytes as its model JSON, and the
        # replica starts from them, instead of serialising every step again: the commit path
        # writes model JSON (ValuePlanner.model_json_of) and compaction only moves fragments.
        # A step with values in artifacts (`$refs`) is serialised from its model as before
        # (the replica keeps its stored, persisted form). Bytes that differ anyway (another
        # writer's step that catching up re-serialised) only make that step's next commit
        # write it again: equal bytes still mean nothing changed, and they are what is
        # stored. A sample is checked, so a store from another serialiser (an older field
        # set, other float spelling) is seeded from the models throughout.
        steps, state_steps = run.steps, state["steps"]
        # views into the decompressed records, not copies (codec.Fragment)
        stored = {sid: memoryview(raw) for sid, raw in got.step_json.items()}
        refs = {sid for sid, persisted in state_steps.items() if REFS_FIELD in persisted}
        as_model = stored if self._loader.stored_is_model_json(run, stored, state) else {}
        if refs and as_model:
            as_model = {sid: mj for sid, mj in as_model.items() if sid not in refs}
        # One pass per map, reading fields past their tracking descriptors (nothing changes).
        if len(as_model) == len(steps) and list(as_model) == list(steps):
            head.steps_cmp = dict(as_model)  # every step, in run order
        else:
            head.steps_cmp = {sid: as_model.get(sid) or step.model_dump_json().encode()
                              for sid, step in steps.items()}
        head.deps = {sid: tuple(d) if (d := step.__dict__["dependencies"]) else ()
                     for sid, step in steps.items()}
        # `_value_`, the enum member's own attribute: `.value` is a property, 0.7 us a step
        head.status = {sid: step.__dict__["status"]._value_ for sid, step in steps.items()}
        replica.steps = dict(head.steps_cmp)
        for sid in refs:  # their persisted form: references, not the values
            replica.steps[sid] = stored.get(sid) or codec.dumps(state_steps[sid])
        statuses = list(head.status.values())
        head.tool_log = tool_log
        head.counts = {"total": len(steps), "completed": statuses.count(StepStatus.COMPLETED.value),
                       "failed": statuses.count(StepStatus.FAILED.value)}
        replica.tool_log = {}
        for sid, calls in state["tool_log"].items():
            raws = got.call_json.get(sid, [])
            if len(raws) != len(calls):
                raws = [None] * len(calls)
            replica.tool_log[sid] = [codec.dumps(c) if raw is None else bytes(raw)
                                     for raw, c in zip(raws, calls, strict=True)]
        forced = info.max_version_seen > version  # we are branching: snapshot at once
        head.branching = forced
        # The loaded run is the object load_run hands out: its first save_run is O(change).
        head.synced(run, (), True, version, fresh=True)
        self._heads[run_id] = head
        rc = RunCompaction(replica, version, hash_, snapshot_bytes=info.snapshot_bytes,
                            carried_reads=self.policy.max_plan if forced else info.records_read,
                            carried_bytes=info.bytes_read - info.snapshot_bytes)
        if info.snapshot_version:  # decoded by this load: valid, for retention to count
            rc.snapshots.append((info.snapshot_version, time.monotonic()))
            rc.covers.append(rc.snapshots[-1])
        self._compactor.submit("init", (run_id, rc))

    # ---------------------------------------------------------------------- read helpers

    def get_tool_call_history(self, run_id: str, step_id: str, *, fresh: bool = True) -> list[ToolCall]:
        """All logged tool calls of a step, oldest first (seed API), as the store holds them now.

        A store that had read the run before caught up first (one LIST, and a GET per record
        others wrote since): a long-lived monitor kept answering what it saw at its first read,
        missing every call another process logged after, where `load_run` and the article's
        SQLite read the store each time. `fresh=False` answers from what this store already
        holds (the runtime's own bookkeeping, which catches up where it needs to)."""
        validate_id(run_id, "run id")
        with self._lock(run_id):
            head = self._heads.get(run_id)
            if (fresh and head is not None and head.version and not head.branching
                    and self._catch_up(head) is None):
                self._drop(run_id)
                head = None
            if head is None:
                if self._load(run_id, None, resolve=True, seed_head=True) is None:
                    return []
                head = self._heads[run_id]
            return [c.model_copy(deep=True) for c in head.tool_log.get(step_id, [])]

    def list_runs(self) -> list[str]:
        return self.storage.list_dirs(RUNS)

    def list_versions(self, run_id: str) -> list[int]:
        """Versions stored for a run (journal records and snapshots), ascending."""
        validate_id(run_id, "run id")
        return sorted({f.version for f in self._loader.run_files(run_id) if f.kind in ("log", "snap")})

    def run_summary(self, run_id: str) -> dict[str, Any] | None:
        """Status and progress of a run as a load returns it (None if it was never saved).

        Read through the one load path, not from the newest file's header: a newest record that
        is damaged, or off the chain, must not make `runs` say "completed" while `show` (and a
        resume) see the run one step short. Artifacts are resolved and their sha256 checked as
        a resume's load does, so a run whose large values are damaged is not called resumable;
        that reads the run's artifacts too (a listing of many runs with large values costs it).
        """
        validate_id(run_id, "run id")
        run = self._load_newest(run_id)
        if run is None:
            return None
        info = self.last_load
        return {"run_id": run_id, "goal": run.goal, "status": run.status,
                "updated_at": run.updated_at, "completed_steps": run.completed_count,
                "failed_steps": run.failed_count, "total_steps": len(run.steps),
                "version": info.version if info else 0,
                "fallback": bool(info and (info.skipped or info.version < info.max_version_seen))}

    def find_resumable_runs(self) -> list[dict[str, Any]]:
        """Runs not finished (running, paused, or failed and resumable), newest first (seed API)."""
        out = []
        for run_id in self.list_runs():
            try:
                summary = self.run_summary(run_id)
            except (CheckpointCorruptError, InvalidIdError) as exc:
                logger.warning("run %s: cannot summarise: %s", run_id, exc)
                continue
            if summary and summary["status"] in RESUMABLE_STATUSES:
                out.append(summary)
        out.sort(key=lambda r: r.get("updated_at") or 0, reverse=True)
        return out

    # ------------------------------------------------------------------------- artifacts

    def put_artifact(self, source: ArtifactSource, media_type: str = "application/octet-stream",
                     summary: str = "") -> ArtifactRef:
        """Store bytes, a path or a binary file object once, by content; streamed."""
        return self.artifacts.put(source, media_type, summary)

    def open_artifact(self, ref: ArtifactRef) -> IO[bytes]:
        return self.artifacts.open(ref)

    def read_artifact(self, ref: ArtifactRef) -> bytes:
        return self.artifacts.read(ref)

    # ------------------------------------------------------------------------- retention

    def apply_retention(self, run_id: str, keep_last: int | None = None,
                        dry_run: bool = False, check: str = "full") -> RetentionResult:
        """Keep the newest `keep_last` valid snapshots and what they need; delete the rest.

        Never deletes anything when no snapshot validates; never deletes the newest valid
        snapshot; deletes snapshots first, then deltas, then journal records (the reverse of
        the write order), so a crash midway leaves every kept snapshot loadable. A snapshot
        superseded less than `policy.superseded_grace` ago stays too, for readers that listed it.
        """
        keep = self.policy.keep_last if keep_last is None else keep_last
        return apply_retention(self._loader, run_id, keep, dry_run, check,
                               self.policy.fence_seconds, self.policy.superseded_grace)
