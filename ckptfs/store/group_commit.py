"""Group commit: changes that arrive while a record is being written share the next record.

A journal record costs one fsync'd file on disk (one PUT on S3) whatever it holds, so when
many callers commit at once (an async agent with 64 steps in flight) the cost that matters is
the number of records, not their size. `GroupCommitter` queues each caller's `GroupPart` and
writes everything queued so far as ONE record on a single writer (the caller's one-thread
executor); parts that arrive meanwhile wait for the next record. There is no batch window:
an idle committer writes a lone part at once, so a paid tool result is never held back to
wait for company. Each part's future resolves only once the record holding it is durable;
that is each caller's acknowledgement.

Why batching is safe for ordering: parts are taken in the order they were queued and every
record is written after the one before it, so a change is never durable before one queued
ahead of it. A caller that releases dependent work only after its own future resolved (as
the agent does) cannot have a dependant's change in the same record as its dependency's.

Errors, decided per part so one bad step does not sink the others in its record:

* a part the store would refuse on its own (a value no load could give back, in a step or in
  its run-level fields; a misfiled step; an invalid id; no saved state) is refused before the
  record is assembled: only that part fails, and nothing of it is written. The record takes
  the run-level fields of the last part ACCEPTED with a run (each part has its own copy, see
  `GroupCommitter.submit`), so a caller that got an error never has its fields loaded back;
* a record refused as a whole for its content (too large, an invalid graph: a ValueError,
  raised before anything is written) is split and each part is committed alone, so the
  innocent ones still land and the guilty one gets its own error;
* anything else (ConflictError, an I/O error, the version limit) fails every part of the
  record with the same error: committing them alone would meet it again. Tool-log parts are
  the exception on a ConflictError: a paid result is retried through `log_tool_call`, which
  rebases on the winner's records as it always did.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckptfs.format.models import AgentRun, Step, ToolCall

logger = logging.getLogger(__name__)


def _frozen(metadata: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the run's metadata as it is now. Something that cannot be copied is no
    value a store holds either: the shallow copy then goes on, and the commit refuses it by
    name."""
    try:
        return copy.deepcopy(metadata)
    except Exception:
        return dict(metadata)


@dataclass
class GroupPart:
    """One caller's share of a grouped record: its steps (and the run-level fields, with a
    run) or its tool-log appends. `future` resolves to the version that made it durable."""

    run_id: str
    run: AgentRun | None = None
    steps: list[Step] = field(default_factory=list)
    tool_calls: list[tuple[str, ToolCall]] = field(default_factory=list)  # (step id, call)
    future: concurrent.futures.Future[int] = field(default_factory=concurrent.futures.Future)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def done(self, version: int) -> None:
        if not self.future.done():
            self.future.set_result(version)


class CommitsMany(Protocol):
    """What the committer writes through: `CheckpointStore.commit_many`."""

    def commit_many(self, parts: Sequence[GroupPart]) -> None: ...


class GroupCommitter:
    """A queue of commits written as few records as possible on one writer thread.

    `submit(...)` queues a part and returns its future at once; if no write is queued on the
    executor yet, it queues one. That write takes everything queued so far (of every run,
    one record per run), so whatever arrives while it runs waits for the next write: one
    record per round trip to the disk, however many callers. The executor should run one
    task at a time (a one-thread pool): then records are written in the order they were
    queued, and in order with anything else the executor runs.
    """

    def __init__(self, store: CommitsMany, executor: concurrent.futures.Executor) -> None:
        self.store = store
        self.executor = executor
        self._lock = threading.Lock()
        self._queue: list[GroupPart] = []
        self._scheduled = False
        self.writes = 0  # grouped writes made (at most one record each), for benchmarks and tests
        self.parts = 0  # parts handed to them

    def submit(self, run_id: str, *, run: AgentRun | None = None, steps: Iterable[Step] = (),
               tool_calls: Iterable[tuple[str, ToolCall]] = ()) -> concurrent.futures.Future[int]:
        """Queue a commit; the future resolves to its version once it is durable (or fails).

        The run-level fields are taken now, not when the writer gets to the part: the caller
        goes on changing the live run meanwhile (another step finishes and adds its spend to
        `total_tokens`), and a record written with those totals but without that step's
        completion made a crash keep the spend and lose the step, so the resume counted it
        twice. The steps stay shared (a part names its own); `metadata` is copied whole, as
        the runtime and executors edit it in place, nested dicts too (a usage counter under
        metadata["usage"] written with another step's record made the same double count).
        """
        if run is not None:
            run = run.model_copy(update={"metadata": _frozen(run.metadata)})
        part = GroupPart(run_id, run, list(steps), list(tool_calls))
        with self._lock:
            self._queue.append(part)
            schedule, self._scheduled = not self._scheduled, True
        if not schedule:
            return part.future
        # Outside the lock: an executor may run the write in this very thread (a StorePool at
        # interpreter exit), and the write takes the lock.
        try:
            self.executor.submit(self._drain)
        except BaseException as exc:
            with self._lock:  # nothing will write what is queued: ours raises, the others fail
                queued, self._queue, self._scheduled = self._queue, [], False
            for other in queued:
                if other is not part:
                    other.fail(exc)
            raise
        return part.future

    def _drain(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
            self._scheduled = False
        self.store.commit_many(batch)
        self.writes += len({p.run_id for p in batch})
        self.parts += len(batch)
