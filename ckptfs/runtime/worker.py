"""Worker: one of several processes, on any machines, that share a run through one bucket.

`CheckpointedAgent` runs a run in one process. When one machine is not enough, start a
`Worker` wherever you like, all pointed at the same `s3://` URL (or a shared local disk):

    Worker(CheckpointStore("s3://bucket/agents")).work(run_id, executor)

Each worker loads the run, picks a ready step, claims it with a lease (`leases.py`: exclusive
create, CAS renewals, observed expiry) and commits the step under the lease's generation
(`CheckpointStore.commit_step`), so:

* a step runs on one worker at a time, and a completed step is never redone;
* a worker that dies (SIGKILL, machine loss) stops renewing; after its lease's ttl another
  worker takes the step over, with the tool calls the dead one logged, so paid calls are not
  repeated;
* a worker that stalls past its lease and wakes up (a suspended VM) is fenced off: its late
  commit is refused with LeaseLostError and it makes no new tool call, since every real call
  first checks the lease is still trusted. The result of a call it had in flight is still
  logged (a tool-log record is never fenced), and its successor looks at the log again before
  each real call, so a result that landed first is replayed rather than paid for again.

Coordination is the bucket's conditional writes and nothing else: no server, no clock
agreement. Commits from different workers merge (each writes only its step) and a worker
whose commit lost a race rebases and retries. A failed attempt that may be retried goes back to
PENDING with a not-before time (`RetryPolicy` backoff, a 429's `retry_after`); when a step's
attempts are used up it is FAILED (workers always "fail": one worker cannot stop the others)
and whatever depends on it is SKIPPED when the run is finished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import (
    ConflictError,
    LeaseLostError,
    RunNotFoundError,
    StepCompletedError,
    UnstorableValueError,
    error_text,
)
from ckptfs.format.models import TERMINAL_STATUSES, AgentRun, Step, StepStatus, ToolCall
from ckptfs.runtime.execution import Executor, StepResult, complete_step
from ckptfs.runtime.host import CURRENT_STEP
from ckptfs.runtime.policy import RetryPolicy
from ckptfs.runtime.resume import SKIP_REASON, TOOL_LOG_START, downstream
from ckptfs.runtime.tool_log import PAID_PHASES, ToolLogs, ToolLogState, write_paid_record
from ckptfs.runtime.tools import IdempotentToolRunner, UnconfirmedActionError
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.leases import DEFAULT_TTL, Heartbeat, Lease, LeaseManager
from ckptfs.store.pools import StorePool

logger = logging.getLogger(__name__)

NOT_BEFORE = "ckptfs.not_before"  # step metadata: wall-clock time before which no retry starts
_FINISHED_RUN = ("completed", "completed_with_errors")

__all__ = ["StepResult", "WorkReport", "Worker"]


@dataclass
class WorkReport:
    """What one `Worker.work` call did; the run's own state is in the store."""

    run_id: str
    worker_id: str
    completed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # steps whose lease was taken from us
    done_elsewhere: list[str] = field(default_factory=list)  # completed by another as we claimed
    run_status: str = ""

    @property
    def taken(self) -> int:
        """Step attempts this worker took on, however they ended."""
        return (len(self.completed) + len(self.failed) + len(self.retried) + len(self.lost)
                + len(self.done_elsewhere))


class _LeaseHost:
    """A Worker's tool host: the log caught up and the lease checked before every real call,
    and every paid result logged, whatever the lease (the store's fence decides what counts)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.logs = ToolLogs(worker.store, worker._tool_log_start)

    def tool_state(self, run_id: str, step_id: str) -> ToolLogState:
        return self.logs.state(run_id, step_id)

    def before_tool_call(self, run_id: str, step_id: str) -> None:
        self.worker._before_call(run_id, step_id)

    async def abefore_tool_call(self, run_id: str, step_id: str) -> None:
        await asyncio.to_thread(self.worker._before_call, run_id, step_id)  # reads the store

    def after_tool_call(self, run_id: str, step_id: str, checkpoint: bool) -> None:
        return None  # a worker commits its claim with the call's record and its outcome after

    async def aafter_tool_call(self, run_id: str, step_id: str, checkpoint: bool) -> None:
        return None

    def record_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        self.worker._log_call(run_id, step_id, tool_call)
        self.logs.add(run_id, step_id, tool_call)

    async def arecord_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        await asyncio.to_thread(self.record_tool_call, run_id, step_id, tool_call)


class Worker:
    """Takes ready steps of a shared run one at a time, under leases, until none is left.

    `lease_ttl` is how long this worker may be silent before others take its step over; the
    heartbeat renews every ttl/4. `poll_interval` is the wait when every ready step is leased
    by others. `clock` is monotonic seconds (tests pass a fake one).

    An attempt's claim (RUNNING, the attempt count and the lease's generation, which fences off
    older holders) is committed with the step's first durable write, its first tool call or its
    outcome, when the step was never leased before: one commit fewer per step. A step taken over
    (or leased before) is claimed before the executor starts, so that the holder it replaced
    cannot commit if it wakes up. With `durable_attempts=True` every claim is committed up
    front, so a step that kills its process every time is counted (and
    `RetryPolicy.max_attempts` ends the loop).
    """

    def __init__(self, store: CheckpointStore, *, worker_id: str | None = None,
                 lease_ttl: float = DEFAULT_TTL, retry: RetryPolicy | None = None,
                 poll_interval: float = 1.0, durable_attempts: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.leases = LeaseManager(store.storage, worker_id, ttl=lease_ttl, clock=clock)
        self.worker_id = self.leases.holder
        self.retry = retry or RetryPolicy()
        self.poll_interval = poll_interval
        self.durable_attempts = durable_attempts
        self._host = _LeaseHost(self)
        self._claimed: set[tuple[str, str]] = set()
        self._claim_lock = threading.Lock()
        self._releases: list[concurrent.futures.Future[bool]] = []
        self._release_pool: StorePool | None = None
        self._beats: dict[tuple[str, str], Heartbeat] = {}
        self._steps: dict[tuple[str, str], Step] = {}
        self._rng = random.Random()

    def _tool_log_start(self, run_id: str, step_id: str) -> int:
        """Where the step's current attempt starts in its tool log (a reset fences off the rest)."""
        step = self._steps.get((run_id, step_id))
        return int(step.metadata.get(TOOL_LOG_START, 0)) if step is not None else 0

    # ----------------------------------------------------------------------- public API

    def tools(self) -> IdempotentToolRunner:
        """The tool runner of the step the calling executor runs (as `agent.tools()`)."""
        cur = CURRENT_STEP.get()
        if cur is None:
            raise RuntimeError("worker.tools() is only available inside an executor")
        return IdempotentToolRunner(self._host, cur[0], cur[1])

    def work(self, run_id: str, executor: Executor, *, max_steps: int | None = None,
             idle_timeout: float | None = None) -> WorkReport:
        """Run ready steps of `run_id` until the run is finished (or `max_steps` were taken on).

        `executor(step, prior_calls) -> str | StepResult`, as for `execute_run`; it may be
        async. Returns when no step is left to run by anyone; while others still run steps
        this one waits (at most `idle_timeout` seconds without work, if given).
        """
        report = WorkReport(run_id, self.worker_id)
        idle_since: float | None = None
        try:
            while max_steps is None or report.taken < max_steps:
                run = self.store.refresh(run_id)
                if run is None:
                    raise RunNotFoundError(f"run {run_id!r} has no saved state; start it first")
                if run.status == "superseded":
                    raise ValueError(f"run {run_id!r} was superseded by "
                                     f"{run.metadata.get('superseded_by')!r}; work on that one")
                if run.status == "paused":
                    logger.info("run %s is paused; worker %s stops", run_id, self.worker_id)
                    break
                runnable, left, blocked = self._classify(run)
                if not left:
                    self._finish(run, blocked)
                    break
                did = False
                for step in runnable:
                    lease = self.leases.acquire(run_id, step.id, after=step.lease_generation)
                    if lease is None:
                        continue
                    did = True
                    if lease.created and not step.lease_generation:  # never held: our view is its state
                        self._run_step(run_id, step, lease, executor, report)
                        break
                    # What we loaded may be stale: another worker may have finished an attempt and
                    # released the lease just before we took it. Now that the step is ours, nobody
                    # else changes it: look again before acting on it.
                    fresh = self.store.refresh(run_id)
                    current = fresh.steps.get(step.id) if fresh is not None else None
                    if (fresh is None or current is None
                            or step.id not in {s.id for s in self._classify(fresh)[0]}):
                        self.leases.release(lease)
                        break
                    self._run_step(run_id, current, lease, executor, report)
                    break  # reload: others have moved the run on meanwhile
                if did:
                    idle_since = None
                    continue
                now = time.monotonic()
                idle_since = idle_since or now
                if idle_timeout is not None and now - idle_since >= idle_timeout:
                    logger.info("run %s: worker %s idle for %.0fs; stopping", run_id, self.worker_id,
                                now - idle_since)
                    break
                time.sleep(self.poll_interval * (0.5 + self._rng.random()))
        finally:
            self._drain_releases()
        final = self.store.load_run(run_id)
        report.run_status = final.status if final is not None else ""
        return report

    # ------------------------------------------------------------------------- internals

    def _classify(self, run: AgentRun) -> tuple[list[Step], bool, list[Step]]:
        """(steps that may start now, whether anything is left to run, steps blocked for good).

        RUNNING steps are candidates too: their holder may be dead, which only acquiring
        (observing the lease go stale) can tell. Steps waiting on a retry's not-before time or
        on unfinished dependencies are left, not runnable.
        """
        steps = run.steps
        failed = [sid for sid, s in steps.items()
                  if s.status in (StepStatus.FAILED, StepStatus.SKIPPED)]
        blocked = {sid for sid in downstream(steps, failed) if steps[sid].status not in TERMINAL_STATUSES}
        now = time.time()
        runnable: list[Step] = []
        left = False
        for sid, s in steps.items():
            if s.status in TERMINAL_STATUSES or sid in blocked:
                continue
            left = True
            if any(steps[d].status != StepStatus.COMPLETED for d in s.dependencies):
                continue
            nb = s.metadata.get(NOT_BEFORE)
            if isinstance(nb, int | float) and nb > now:
                continue
            runnable.append(s)
        # Steps nobody was seen holding first, in random order so that workers spread out; then
        # those held by others (a claim is lazy: a held step may still look PENDING), whose
        # leases are looked at again to see them go stale.
        runnable.sort(key=lambda s: (s.status == StepStatus.RUNNING,
                                     self.leases.seen_held(run.run_id, s.id), self._rng.random()))
        return runnable, left, [steps[sid] for sid in blocked]

    def _run_step(self, run_id: str, step: Step, lease: Lease, executor: Executor,
                  report: WorkReport) -> None:
        key = (run_id, step.id)
        hb = Heartbeat(self.leases, lease)
        try:
            with hb:
                self._beats[key] = hb
                self._steps[key] = step
                if not self._claim(run_id, step, hb, report):
                    return
                self._host.logs.forget(*key)  # another worker may have logged calls
                prior = self._host.logs.prior_calls(run_id, step,
                                                    self._tool_log_start(run_id, step.id))
                token = CURRENT_STEP.set(key)
                try:
                    out: Any = executor(step, prior)
                    if inspect.isawaitable(out):
                        out = _run_coroutine(out)
                except LeaseLostError as exc:
                    logger.warning("%s", exc)
                    report.lost.append(step.id)
                    return
                except Exception as exc:
                    self._failed(run_id, step, hb, exc, report)
                    return
                finally:
                    CURRENT_STEP.reset(token)
                self._succeeded(run_id, step, hb, out, report)
        finally:
            self._beats.pop(key, None)
            self._steps.pop(key, None)
            self._claimed.discard(key)
            self._host.logs.forget(*key)
            # A CAS, a no-op if the lease is no longer ours. Off the critical path: the next
            # step need not wait for it, and until it lands others only see the step held.
            self._release_later(hb.lease)

    def _claim(self, run_id: str, step: Step, hb: Heartbeat, report: WorkReport) -> bool:
        """Mark the attempt; committed at once for a takeover or with `durable_attempts`, else
        with the attempt's first durable write (see the class)."""
        if step.status == StepStatus.RUNNING:
            logger.warning("run %s: worker %s takes over step %s (its holder went silent)", run_id,
                           self.worker_id, step.id)
        step.status = StepStatus.RUNNING
        step.attempt_count += 1
        step.started_at = time.time()
        step.completed_at = None
        step.metadata.pop(NOT_BEFORE, None)
        # A takeover claims at once: until the step's fence is raised, the holder it replaced
        # could still commit if it wakes up. A lease created fresh had no holder before.
        eager = self.durable_attempts or not hb.lease.created
        return self._commit(run_id, step, hb, report) if eager else True

    def _before_call(self, run_id: str, step_id: str) -> None:
        """Before a real (paid) call: the lease must still be trusted, and the step's tool log
        must include what another holder of the step logged since we looked.

        A holder we took the step over from may log the result of a call it had in flight
        after we claimed the step (`_log_call` always writes it). Our index of the log was
        read at the claim; catching up here (one LIST, a GET per new record) lets the runner
        serve that result instead of paying again. A step whose lease we created had no
        holder before us, and costs nothing here. The lease is checked last, right before
        the call: LeaseLostError if it is no longer trusted.
        """
        hb = self._beats.get((run_id, step_id))
        if hb is None:
            return
        lease = hb.lease
        if not (lease.created and lease.generation == 1):
            self.store.refresh(run_id)
            state = self._host.logs.state(run_id, step_id)
            start = self._tool_log_start(run_id, step_id)
            for call in self.store.get_tool_call_history(run_id, step_id, fresh=False)[start:]:
                state.add(call)
        hb.check()

    def _log_call(self, run_id: str, step_id: str, call: ToolCall) -> None:
        """A tool call's durable record, always written: the call happened, whoever may now
        hold the step. Under the lease (carrying the claim, if not yet made) while the store's
        fence accepts it. Once fenced off (a newer generation claimed the step, or it finished)
        the call goes to the step's tool log on its own, a record nobody fences, so that the
        holder replays it instead of paying again; then LeaseLostError goes up through the
        executor: the step is no longer ours."""
        key = (run_id, step_id)
        step, hb = self._steps.get(key), self._beats.get(key)
        if step is None or hb is None:
            self._until_logged(run_id, step_id, call, lambda: self.store.log_tool_call(run_id, step_id, call))
            return
        try:
            self._until_logged(run_id, step_id, call,
                               lambda: self._commit_with_retries(run_id, step, hb, call), claim=key)
        except LeaseLostError as exc:
            self._until_logged(run_id, step_id, call, lambda: self.store.log_tool_call(run_id, step_id, call))
            logger.warning("run %s: step %s: %s; the paid result of %s is logged for the holder",
                           run_id, step_id, exc, call.tool_name)
            raise

    def _until_logged(self, run_id: str, step_id: str, call: ToolCall, write: Callable[[], object],
                      claim: tuple[str, str] | None = None) -> None:
        """`write()` the record of `call` until durable (`tool_log.write_paid_record`).

        A failed write may have landed with its reply lost: the run is caught up, and if this
        very record (id, phase, time) is in the step's log it is durable, and the claim it
        carried (`claim`) is made; a retried claim would be refused by that very record as
        another holder's of the same generation (a review with a 503 burst behind a proxy).
        """
        if call.phase not in PAID_PHASES:  # nothing paid yet (an intent) or nothing to keep: once
            write()
            return

        def landed() -> bool:
            self.store.refresh(run_id)
            ident = (call.id, call.phase, call.timestamp)
            if not any((c.id, c.phase, c.timestamp) == ident
                       for c in self.store.get_tool_call_history(run_id, step_id, fresh=False)):
                return False
            if claim is not None:
                with self._claim_lock:
                    self._claimed.add(claim)
            return True

        write_paid_record(write, f"run {run_id}: step {step_id}: {call.tool_name}", landed, self._rng)

    def _commit_with_retries(self, run_id: str, step: Step, hb: Heartbeat,
                             call: ToolCall | None = None, tokens: int = 0, cost: float = 0.0) -> None:
        """Commit under the lease; a lost race is retried for as long as minutes (60 rounds of
        commit_step's own rebases): what is committed here was paid for.

        The store's fence decides, not our trust in the lease: that trust (0.8 ttl from the
        last renewal sent) is what a *call* needs before it starts, since nothing can take a
        call back. A write can be taken back: commit_step refuses it (LeaseLostError) once a
        newer generation has claimed the step, and a successor's claim is refused once the
        step finished. So a commit made after our trust ran out, with nobody having taken
        over, is simply valid; one that a slow renewal would otherwise throw away is kept.
        Only a lease the heartbeat saw taken over is given up at once."""
        key = (run_id, step.id)
        for rounds in range(60):
            try:
                with self._claim_lock:  # tool calls from several threads: one claim between them
                    if hb.lost is not None:
                        raise hb.lost
                    self.store.commit_step(run_id, step, hb.lease, claim=key not in self._claimed,
                                           tool_call=call, tokens=tokens, cost_usd=cost)
                    self._claimed.add(key)
                return
            except ConflictError as exc:
                if rounds == 59:
                    raise
                logger.info("run %s: step %s: %s; trying again", run_id, step.id, exc)
        raise AssertionError("unreachable")

    def _commit(self, run_id: str, step: Step, hb: Heartbeat, report: WorkReport,
                tokens: int = 0, cost: float = 0.0) -> bool:
        """Commit under the lease, rebasing while it is trusted; False if it is not (or the step
        finished elsewhere). Gives up with ConflictError only after minutes of lost races.
        `tokens`/`cost`: what the attempt spent, for the run's totals (as the agent counts them)."""
        try:
            self._commit_with_retries(run_id, step, hb, tokens=tokens, cost=cost)
        except StepCompletedError as exc:
            logger.info("%s", exc)  # a normal race: we saw the step ready just before
            report.done_elsewhere.append(step.id)
            return False
        except LeaseLostError as exc:
            logger.warning("%s", exc)
            report.lost.append(step.id)
            return False
        return True

    def _succeeded(self, run_id: str, step: Step, hb: Heartbeat, out: Any,
                   report: WorkReport) -> None:
        tokens0, cost0 = step.tokens, step.cost_usd
        try:
            complete_step(step, out, run_id)
        except UnstorableValueError as exc:  # an output no record can hold (a NaN cost): the
            # step fails, as the agent stops there; raised, it ended work() and every worker
            # that took the step next ran it again and ended the same way
            self._failed(run_id, step, hb, exc, report, final=True)
            return
        try:
            done = self._commit(run_id, step, hb, report, step.tokens - tokens0, step.cost_usd - cost0)
        except UnstorableValueError as exc:  # what the executor left in the step (a NaN in its
            # metadata) is refused, the output itself was fine: raised, it ended work() with the
            # step held, and each worker that took it next ran it again and ended the same way.
            # The step fails with the metadata it was claimed with (the store's, from before the
            # executor ran), which the failure's own commit can then hold.
            self._restore_metadata(run_id, step)
            self._failed(run_id, step, hb, exc, report, final=True)
            return
        if done:
            report.completed.append(step.id)
            logger.info("run %s: step %s completed by %s", run_id, step.id, self.worker_id)

    def _restore_metadata(self, run_id: str, step: Step) -> None:
        """Put back the step's metadata as the store holds it (only on the error path: a load)."""
        stored = self.store.load_run(run_id)
        held = stored.steps.get(step.id) if stored is not None else None
        step.metadata = dict(held.metadata) if held is not None else {}

    def _failed(self, run_id: str, step: Step, hb: Heartbeat, exc: Exception,
                report: WorkReport, *, final: bool = False) -> None:
        step.error = error_text(exc)
        # A call whose outcome the log cannot give back (an intent with no completion, a result
        # the store refused), or an output the store refuses (`final`): a retry would only meet
        # the same refusal, attempt after attempt, so the step fails at once, saying why (as
        # the agent stops the run there).
        retry = not final and not isinstance(exc, UnconfirmedActionError) and self.retry.is_retryable(exc)
        if retry and step.attempt_count < self.retry.max_attempts:
            delay = self.retry.delay(step.attempt_count, exc, self._rng)
            step.status = StepStatus.PENDING
            step.started_at = None
            step.metadata[NOT_BEFORE] = time.time() + delay
            if self._commit(run_id, step, hb, report):
                report.retried.append(step.id)
                logger.warning("run %s: step %s attempt %d failed (%s); any worker may retry it "
                               "in %.2fs", run_id, step.id, step.attempt_count, step.error, delay)
            return
        step.status = StepStatus.FAILED
        step.completed_at = time.time()
        if self._commit(run_id, step, hb, report):
            report.failed.append(step.id)
            logger.warning("run %s: step %s failed for good after %d attempts: %s", run_id,
                           step.id, step.attempt_count, step.error)

    def _finish(self, run: AgentRun, blocked: list[Step]) -> None:
        """Nothing is runnable or running: mark what can never run SKIPPED and the run finished.

        Several workers may get here together; the commit of each is a no-op or a conflict
        after the first, so the outcome is the same whoever wins.
        """
        if run.status in _FINISHED_RUN and not blocked:
            return
        for s in blocked:
            s.status = StepStatus.SKIPPED
            s.error = "skipped: a dependency failed"
            s.metadata[SKIP_REASON] = "a dependency failed"
            s.completed_at = time.time()
        run.status = "completed" if run.failed_count == 0 else "completed_with_errors"
        run.updated_at = time.time()
        try:
            self.store.commit(run, blocked)
        except ConflictError:
            logger.info("run %s: another worker finished the run first", run.run_id)
            return
        logger.info("run %s %s: %d/%d steps completed", run.run_id, run.status,
                    run.completed_count, len(run.steps))

    def _release_later(self, lease: Lease) -> None:
        if self._release_pool is None:
            # A release is one CAS on the step's own lease, waiting on nothing the caller holds:
            # done inline at interpreter exit it lands the same, where a refusal escaped `work`
            # of a non-daemon thread that outlived the main thread after its first step.
            self._release_pool = StorePool(1, thread_name_prefix="ckptfs-lease-release")
        self._releases = [f for f in self._releases if not f.done()]
        self._releases.append(self._release_pool.submit(self.leases.release, lease))

    def _drain_releases(self) -> None:
        """Wait for the releases in flight; one that failed only leaves a lease to expire."""
        for fut in self._releases:
            try:
                fut.result(timeout=60)
            except Exception as exc:
                logger.warning("worker %s: a lease release failed (%s); it will expire",
                               self.worker_id, exc)
        self._releases = []
        if self._release_pool is not None:
            self._release_pool.shutdown(wait=True)
            self._release_pool = None


def _run_coroutine(coro: Any) -> Any:
    return asyncio.run(_await(coro))


async def _await(coro: Any) -> Any:
    return await coro
