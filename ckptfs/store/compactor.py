"""The background compactor: journal records merged into deltas and snapshots from memory.

It keeps its own replica of each run this process writes and never reads a file back: every
`fanout` records of one level become one delta of the next level, and a full snapshot is
written once the records a load would need outweigh the last snapshot or grow past
`max_plan` files. Compaction is an optimisation: a failure is logged, commits go on, and loads
fall back to the finer records, which stay until retention removes what a kept snapshot covers.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import RecordTooLargeError
from ckptfs.format import codec
from ckptfs.format.changes import Changes
from ckptfs.format.keys import delta_key, snap_key
from ckptfs.storage.base import Storage

logger = logging.getLogger(__name__)

# encode(kind, run_id, version, base, base_hash, hash, changes) -> file bytes
Encode = Callable[[codec.RecordKind, str, int, int, str, str, Changes], bytes]
# retain(run_id, keep_last, dry_run, check) -> whatever retention reports
Retain = Callable[[str, int, bool, str], Any]


@dataclass(frozen=True)
class CompactionPolicy:
    """How the background compactor bounds total bytes and load cost.

    fanout: records of one level merged into one record of the next.
    max_plan: a snapshot is due once a load would read more than this many records.
    min_snapshot_bytes: no snapshot before the records since the last one reach this size
        (a snapshot is due when they outweigh the last snapshot, or reach this floor).
    keep_last: full snapshots kept per run by automatic retention (0 disables it).
    background: False runs compaction inline in the committing thread (tests, debugging).
    """

    fanout: int = 16
    max_plan: int = 32
    min_snapshot_bytes: int = 256 * 1024
    keep_last: int = 3
    background: bool = True

    def __post_init__(self) -> None:
        if self.fanout < 2 or self.max_plan < 2 or self.keep_last < 0:
            raise ValueError("CompactionPolicy: fanout and max_plan must be >= 2, keep_last >= 0")



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


class Compactor:
    """Merges journal records into deltas and snapshots from memory, off the commit path."""

    IDLE_EXIT_SECONDS = 10.0

    def __init__(self, policy: CompactionPolicy, storage: Storage, encode: Encode,
                 retain: Retain) -> None:
        # Weak: the store owns the compactor, and an idle store must be collectable (its
        # compactor thread exits after a quiet spell; atexit flushes what is still alive).
        self._encode = weakref.WeakMethod(encode)
        self._retain = weakref.WeakMethod(retain)
        self._storage = storage
        self._policy = policy
        self._runs: dict[str, RunCompaction] = {}
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.errors = 0

    def submit(self, kind: str, payload: Any) -> None:
        if not self._policy.background:
            self._handle(kind, payload)
            return
        with self._lock:  # enqueue under the lock the idle thread checks before it exits
            self._queue.put((kind, payload))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ckptfs-compactor",
                                                daemon=True)
                self._thread.start()

    def flush(self, timeout: float | None = None) -> bool:
        if self._thread is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        """Work the queue; exit after a quiet spell so idle stores hold no thread."""
        while True:
            try:
                item = self._queue.get(timeout=self.IDLE_EXIT_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                if item is None:
                    return
                self._handle(*item)
            except Exception:  # compaction is an optimisation: log, keep committing
                self.errors += 1
                logger.exception("ckptfs compactor: %s failed; loads fall back to finer records",
                                 item[0] if item else "stop")
            finally:
                self._queue.task_done()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "init":
            run_id, rc = payload
            self._runs[run_id] = rc
            return
        if kind == "forget":
            self._runs.pop(payload, None)
            return
        run_id, entry = payload
        rc = self._runs.get(run_id)
        if rc is None or rc.version != entry.base:
            return  # this process no longer owns the run's head; nothing consistent to merge
        rc.replica.merge(entry.changes, full_state=True)
        rc.version, rc.hash = entry.version, entry.hash
        rc.stack.append(entry)
        encode = self._encode()
        if encode is None:
            return
        self._merge_levels(encode, run_id, rc)
        reads = rc.carried_reads + len(rc.stack)
        pending = rc.carried_bytes + sum(e.size for e in rc.stack)
        due = max(rc.snapshot_bytes, self._policy.min_snapshot_bytes)
        if reads > self._policy.max_plan or pending >= due:
            self._snapshot(encode, run_id, rc)

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
                              last.hash, merged)
            except RecordTooLargeError as exc:  # a delta is optional: loads read the records
                logger.warning("run %s: not writing delta v%d-v%d: %s", run_id, first.base,
                               last.version, exc)
                size = sum(e.size for e in top)
            else:
                with contextlib.suppress(FileExistsError):
                    self._storage.put_if_absent(delta_key(run_id, first.base, last.version), data)
                size = len(data)
            rc.stack[-f:] = [Entry(level + 1, first.base, first.base_hash, last.version,
                                    last.hash, merged, size)]

    def _snapshot(self, encode: Encode, run_id: str, rc: RunCompaction) -> None:
        try:
            data = encode("snapshot", run_id, rc.version, rc.version, rc.hash, rc.hash, rc.replica)
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
        with contextlib.suppress(FileExistsError):
            self._storage.put_if_absent(snap_key(run_id, rc.version), data)
        rc.stack.clear()
        rc.snapshot_bytes = len(data)
        rc.carried_reads = rc.carried_bytes = 0
        retain = self._retain()
        if self._policy.keep_last and retain is not None:
            retain(run_id, self._policy.keep_last, False, "digest")


