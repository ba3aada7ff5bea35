"""CheckpointedAgent: runs a step graph through a CheckpointStore so that a crash costs one step.

The seed's API and meaning (`start_run`, `resume_run`, `execute_run(run, executor)`,
`record_tool_call`, `pause_run`), made cheap and safe for long runs:

* one `store.commit(run, [changed steps])` per checkpoint, never a rewrite of the run; the
  ready queue is kept with dependency counts, so a step costs O(its edges), not O(run);
* the RUNNING mark of an attempt is lazy: it is committed only when the step makes its
  first real tool call (or when the policy asks for durable attempts). A crash before that
  replays the step with the attempt count it had, which is all a RUNNING mark would say;
  a failed attempt is always committed, so retry budgets and errors survive a crash;
* retries follow a `RetryPolicy` (backoff with jitter, a 429's `retry_after`); exhausting
  them stops the run with `RetriesExhaustedError` and the checkpoint intact; a step whose
  dependency failed is SKIPPED with the reason, never left PENDING;
* `aexecute_run` is the async twin: independent ready steps run concurrently up to a limit,
  store writes run in one worker thread, in order, shielded from cancellation, and are
  group-committed: what arrives while a record is being written goes into the next record
  together (one fsync for many steps; see store/group_commit.py). A step counts as done (its
  await returns, `step_completed` fires, its dependants become ready) only once its record
  is durable, so a dependant never starts on a completion a crash could still take back;
* a value the store refuses (NaN, a giant int) left in a step or in the run stops the run at
  that step, the value put back so the stop and the finished steps commit (refused_values.py).

Progress goes to `logging` and to an optional callback, never to stdout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ckptfs.errors import (
    ConflictError,
    RetriesExhaustedError,
    RunBusyError,
    RunNotFoundError,
    RunStoppedError,
    StorageUnavailableError,
    UnstorableValueError,
    error_text,
)
from ckptfs.format.models import TERMINAL_STATUSES, AgentRun, Step, StepStatus, ToolCall
from ckptfs.runtime.execution import (
    AsyncExecutor,
    Execution,
    Executor,
    ProgressCallback,
    ProgressEvent,
    complete_step,
)
from ckptfs.runtime.host import CURRENT_STEP
from ckptfs.runtime.policy import CheckpointPolicy, RetryPolicy, require_whole
from ckptfs.runtime.refused_values import (
    left_value_stop,
    refused_output_stop,
    spoiled_stop,
    unsaved_stop,
)
from ckptfs.runtime.resume import (
    STRATEGIES,
    TOOL_LOG_START,
    build_brief,
    context_run,
    context_run_id,
    dependants_index,
    invalidate,
    requeue_interrupted,
    reset_failed,
)
from ckptfs.runtime.tool_log import PAID_PHASES, ToolLogs, ToolLogState, write_paid_record
from ckptfs.runtime.tools import IdempotentToolRunner, UnconfirmedActionError
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.group_commit import GroupCommitter
from ckptfs.store.pools import StorePool
from ckptfs.store.values import ValuePlanner

logger = logging.getLogger(__name__)


def _keep_dirty(ex: Execution, steps: list[Step]) -> None:
    """A commit that failed: its steps wait for the next one (or the crash flush)."""
    for s in steps:
        ex.dirty.setdefault(s.id, s)


def _stored_already(run_id: str, what: str) -> ValueError:
    """What a new run of a stored run's id is refused with (saved, it would replace that run)."""
    return ValueError(f"{what} {run_id!r} is already stored; continue it with "
                      f"agent.resume_run({run_id!r}), or give the new run another id")


# Runs executing in this process, by the store they commit to (weak: a store that goes away
# takes its entry with it). One execution per run and store at a time: `_begin`.
_EXECUTING: weakref.WeakKeyDictionary[CheckpointStore, set[str]] = weakref.WeakKeyDictionary()
_EXECUTING_LOCK = threading.Lock()


def _stale(exc: BaseException) -> bool:
    """Whether `exc` says another writer committed to the run since this execution read it
    (ConflictError, from a commit of the agent's or of a tool runner's inside a step). The run
    then stops with it, and nothing more is written: this process's copy is behind the store,
    and a commit of it would land on the other writer's versions, overwriting the steps it
    finished. Retrying the step did just that: two agents resuming one run both ran it to
    the end, the second one's results replacing the first's, every completion acknowledged
    twice. Load the run again to go on. A run forgotten meanwhile (RunNotFoundError: `ckptfs
    forget` beside a live agent) stops it too: the step was retried, its paid call paid again,
    and its commits re-created the run with only the steps they carried."""
    return isinstance(exc, ConflictError | RunNotFoundError)


class CheckpointedAgent:
    """An agent that checkpoints its step graph as it goes and resumes from any saved state.

    `CheckpointedAgent(store)` keeps the seed's behaviour (a checkpoint after every step);
    `checkpoint_every_n_steps=N` (seed argument) or `policy=CheckpointPolicy...` change the
    granularity; `retry=RetryPolicy(...)` the failure handling.
    """

    def __init__(
        self,
        checkpoint_store: CheckpointStore,
        checkpoint_every_n_steps: int = 1,
        *,
        policy: CheckpointPolicy | None = None,
        retry: RetryPolicy | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        if not isinstance(checkpoint_store, CheckpointStore):
            raise TypeError("CheckpointedAgent takes a CheckpointStore (build it from the URL first)")
        # any int (the seed's API takes <= 1 as "every step"); "5" raised a bare TypeError from
        # the comparison below, and 5.0 or NaN reached CheckpointPolicy unnamed
        checkpoint_every_n_steps = require_whole("CheckpointedAgent", "checkpoint_every_n_steps",
                                                 checkpoint_every_n_steps)
        if policy is None:
            policy = (CheckpointPolicy.every_step() if checkpoint_every_n_steps <= 1
                      else CheckpointPolicy.every_n_steps(checkpoint_every_n_steps))
        self.store = checkpoint_store
        self.policy = policy
        self.retry = retry or RetryPolicy()
        self.on_progress = on_progress
        self.checkpoint_every_n = policy.every_n
        self._rng = random.Random(self.retry.seed)
        self._active: dict[str, Execution] = {}
        self._known: set[str] = set()
        self._tool_logs = ToolLogs(checkpoint_store, self._tool_log_start)
        self._io_pool: StorePool | None = None
        self._io_pending: set[concurrent.futures.Future[Any]] = set()
        self._committer: GroupCommitter | None = None

    # ------------------------------------------------------------------------- seed API

    def start_run(self, goal: str, steps: list[Step], *, run_id: str | None = None,
                  metadata: dict[str, Any] | None = None) -> AgentRun:
        """Create a run and save its first checkpoint (the graph is validated on the way)."""
        run = AgentRun(goal=goal) if run_id is None else AgentRun(run_id=run_id, goal=goal)
        if metadata:
            run.metadata.update(metadata)
        for step in steps:
            if step.id in run.steps:
                raise ValueError(f"start_run: step id {step.id!r} appears twice")
            run.add_step(step)
        # saved over a stored run, its acknowledged steps were replaced
        if run_id is not None and self.store.load_run(run_id) is not None:
            raise _stored_already(run_id, "start_run: run")
        self.store.save_run(run)
        self._known.add(run.run_id)
        logger.info("started run %s with %d steps: %s", run.run_id, len(steps), goal[:80])
        return run

    def resume_run(self, run_id: str, strategy: str = "exact", *,
                   validator: Callable[[Step], bool] | None = None, retry_failed: bool = False,
                   new_run_id: str | None = None) -> AgentRun | None:
        """Load a run to continue it; None if it was never saved (seed behaviour).

        strategy "exact": steps caught RUNNING go back to the queue, attempt counts kept.
        "fuzzy": also re-check completed steps with `validator(step) -> bool`; rejected ones
            and everything downstream go back to PENDING (their old tool results fenced off).
        "context": a new run whose goal is a brief of this one (done work as given facts,
            what remains) and whose steps are what remains, with the tool calls each had
            logged (replayed, not paid again); this run becomes "superseded". The brief is also
            in `new_run.metadata["resume_brief"]` (see `ResumeBrief`). Its id is `new_run_id`,
            else the same id derived from this run's every time (`context_run_id`), so a
            restart killed midway and called again finishes the run it began.
        retry_failed: FAILED and SKIPPED steps are tried again (exact and fuzzy).
        """
        if strategy not in STRATEGIES:
            raise ValueError(f"resume_run: strategy must be one of {STRATEGIES}, got {strategy!r}")
        if strategy == "fuzzy" and validator is None:
            raise ValueError("resume_run(strategy='fuzzy') needs validator=callable(step) -> bool")
        run = self.store.load_run(run_id)
        if run is None:
            logger.warning("no run found with id %s", run_id)
            return None
        if run.status == "superseded":
            raise ValueError(f"run {run_id!r} was superseded by run "
                             f"{run.metadata.get('superseded_by')!r}; resume that one")
        self._known.add(run_id)
        if strategy == "context":
            if new_run_id == run_id:
                raise ValueError(f"resume_run: new_run_id {new_run_id!r} is the run being resumed; "
                                 "a context restart starts a run of another id (or None: one "
                                 "derived from this run's)")
            new_run_id = new_run_id if new_run_id is not None else context_run_id(run_id)
            stored = self.store.load_run(new_run_id)
            if stored is not None and stored.metadata.get("resumed_from") == run_id:
                # this restart, killed between its two writes and called again: finish it
                new = stored
                run.status, run.updated_at = "superseded", time.time()
                run.metadata["superseded_by"] = new.run_id
            else:
                if stored is not None:  # saved over it, another run's steps were replaced
                    raise _stored_already(stored.run_id, "resume_run: new_run_id")
                new = context_run(run, build_brief(run), new_run_id)
                self.store.save_run(new)  # the new run first, so the old one never links to nothing
            self._carry_tool_logs(run, new)
            self.store.commit(run, [])
            self._known.add(new.run_id)
            logger.info("run %s superseded by %s (context restart: %d done, %d remaining)",
                        run_id, new.run_id, run.completed_count, len(new.steps))
            return new

        def log_len(sid: str) -> int:
            return len(self.store.get_tool_call_history(run_id, sid, fresh=False))

        changed = {s.id: s for s in requeue_interrupted(run)}
        # Invalidation first: a failed step downstream of a rejected one is then reset by it,
        # fenced, instead of being taken for an untouched pending step once retry_failed had
        # reset it, and replaying results fetched from the world the validator called stale.
        if strategy == "fuzzy" and validator is not None:
            changed.update((s.id, s) for s in invalidate(run, validator, log_len))
        if retry_failed:
            changed.update((s.id, s) for s in reset_failed(run))
        for sid in changed:
            self._tool_logs.forget(run_id, sid)
        if changed:
            self.store.commit(run, list(changed.values()))
        logger.info("resuming run %s (%s): %d/%d steps completed, %d put back in the queue",
                    run_id, strategy, run.completed_count, len(run.steps), len(changed))
        return run

    def _carry_tool_logs(self, old: AgentRun, new: AgentRun) -> None:
        """Copy into the context restart `new` the tool calls each of its steps logged in `old`
        (from where the current attempt's log starts), so its runners replay them: a result
        paid for is given back, an irreversible call's open intent goes to the guard. Without
        them the new run paid again for every call a step had made before the restart. Only
        the calls not copied yet: a restart killed midway and called again copies the rest."""
        for sid in new.steps:
            step = old.steps.get(sid)
            if step is None:
                continue
            start = int(step.metadata.get(TOOL_LOG_START, 0))
            calls = self.store.get_tool_call_history(old.run_id, sid, fresh=False)[start:]
            have = len(self.store.get_tool_call_history(new.run_id, sid, fresh=False))
            for call in calls[have:]:
                self.store.log_tool_call(new.run_id, sid, call)

    def record_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        """Log a tool call durably, for audit and for the idempotency cache (seed API).

        A paid call's record is written again while the store is unavailable (about two
        minutes, `tool_log.write_paid_record`): given up on at once, the error failed the
        attempt and its retry paid the call again. A write that landed with its reply lost
        is no duplicate: the store's `log_tool_call` catches up and skips a logged call."""
        self._after_queued_writes()
        self._write_logged(run_id, step_id, tool_call)
        self._tool_logs.add(run_id, step_id, tool_call)

    def _write_logged(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        if tool_call.phase in PAID_PHASES:
            write_paid_record(lambda: self._write_tool_call(run_id, step_id, tool_call),
                              f"run {run_id}: step {step_id}: {tool_call.tool_name}")
        else:
            self._write_tool_call(run_id, step_id, tool_call)

    async def arecord_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        """`record_tool_call` off the event loop, in order, never cancelled midway (see `_io`)."""
        if type(self)._write_tool_call is CheckpointedAgent._write_tool_call:
            # Durable on return as ever, but it may share a record with other steps' commits
            # arriving meanwhile; an idle writer writes it at once (no batch window).
            try:
                await self._agroup(run_id, tool_calls=[(step_id, tool_call)])
            except StorageUnavailableError:
                if tool_call.phase not in PAID_PHASES:
                    raise
                # paid: written again alone, in order on the writer's thread (record_tool_call)
                await self._io(self._write_logged, run_id, step_id, tool_call)
        else:  # a subclass's own write: keep it as it is, in order on the same thread
            await self._io(self._write_logged, run_id, step_id, tool_call)
        self._tool_logs.add(run_id, step_id, tool_call)

    def pause_run(self, run: AgentRun) -> None:
        """Pause a run: during execution, after the steps in flight; otherwise at once."""
        ex = self._active.get(run.run_id)
        if ex is not None and ex.run is run:
            ex.pause_requested = True
            logger.info("run %s: pause requested; stopping after the steps in flight", run.run_id)
            return
        run.status = "paused"
        run.updated_at = time.time()
        self._save(run, [])
        logger.info("run %s paused; resume with agent.resume_run(%r)", run.run_id, run.run_id)

    def tools(self) -> IdempotentToolRunner:
        """A tool runner for the step the calling executor is running (sync or async)."""
        cur = CURRENT_STEP.get()
        if cur is None:
            raise RuntimeError("agent.tools() is only available inside an executor; outside, use "
                               "IdempotentToolRunner(agent, run_id, step_id)")
        return IdempotentToolRunner(self, cur[0], cur[1])

    # ------------------------------------------------------------------ execution (sync)

    def execute_run(self, run: AgentRun, executor: Executor, *,
                    on_progress: ProgressCallback | None = None) -> AgentRun:
        """Run every runnable step, checkpointing per policy; return the run when nothing is left.

        `executor(step, prior_calls) -> str | StepResult`. Raises RetriesExhaustedError when a
        step keeps failing (policy "stop") and RunStoppedError when an irreversible call's
        outcome is unknown or the executor returns (or leaves in its step) a value the store
        cannot keep, all after committing the stop; a pause returns early. Steps the executor
        adds to the run are run too, committed with its step; one no commit could hold (not a
        Step under its own id, an unknown dependency, a cycle) or one it removes stops the run
        (no commit can remove it), and so does one it adds under an id the run already has (it
        replaced that step).
        """
        ex = self._begin(run, on_progress)
        try:
            while not ex.stopping:
                sid = ex.next_ready()
                if sid is None:
                    wait = ex.next_delay()
                    if wait is None:
                        if self._reconcile(ex):
                            continue
                        break
                    time.sleep(wait)
                    continue
                step = ex.live(sid)
                if step is None:
                    self._gone(ex, sid)
                    continue
                self._run_step(ex, step, executor)
            plan = self._finish(ex)
            self._commit(ex, plan, charge=plan[0] if plan else None)
        except BaseException as exc:
            if _stale(exc):
                raise
            unsaved = unsaved_stop(ex, exc, self._flush_after_crash(ex))
            if unsaved is not None:
                raise unsaved from exc
            raise
        finally:
            self._leave(run.run_id)
        self._after_finish(ex)
        return run

    def _run_step(self, ex: Execution, step: Step, executor: Executor) -> None:
        plan = self._start_attempt(ex, step)
        if plan:
            self._commit(ex, plan, charge=step)
        if step.status != StepStatus.RUNNING:  # gave up before starting (max_total_attempts)
            return
        prior = self._prior_calls(ex.run.run_id, step)
        tokens0, cost0 = step.tokens, step.cost_usd
        sid = step.id  # the executor holds the step, and may change its id
        token = CURRENT_STEP.set((ex.run.run_id, sid))
        try:
            out = executor(step, prior)
        except Exception as exc:
            if _stale(exc):
                raise  # another writer moved (or forgot) the run: not this step's failure
            plan = self._after_failure(ex, step, exc, tokens0, cost0, sid)
        else:
            plan = self._after_success(ex, step, out, tokens0, cost0, sid)
        finally:
            CURRENT_STEP.reset(token)
        if ex.replaced:  # one put back while it ran: its stop, now its outcome is known
            self._replaced(ex)
        if plan:
            self._commit(ex, plan, charge=step)
        self._release(ex, step)

    # ----------------------------------------------------------------- execution (async)

    async def aexecute_run(self, run: AgentRun, executor: AsyncExecutor, *, concurrency: int = 4,
                           on_progress: ProgressCallback | None = None) -> AgentRun:
        """`execute_run` for an async executor; up to `concurrency` ready steps run at once.

        Store writes go to a worker thread one at a time, in the order they were decided, so
        a step's completion is never durable before the completions it depended on. They are
        group-committed: commits (completions, RUNNING marks, tool results) that arrive while
        a record is being written share the next record, one fsync for all of them, and each
        caller goes on only once its own record is durable. A commit the store refuses fails
        only the step whose change it was (see store/group_commit.py); the run then stops
        with that step's error, as it did with one record per commit.
        """
        # a NaN passed `< 1` and then `len(tasks) < nan` never started a step: the run "failed"
        concurrency = require_whole("aexecute_run", "concurrency", concurrency, 1)
        ex = self._begin(run, on_progress, defer_commit=True)
        tasks: dict[asyncio.Task[None], str] = {}
        try:
            await self._acommit(ex, ex.take(), recover=False)
            while True:
                while not ex.stopping and len(tasks) < concurrency:
                    sid = ex.next_ready()
                    if sid is None:
                        break
                    step = ex.live(sid)
                    if step is None:
                        self._gone(ex, sid)
                        break
                    tasks[asyncio.ensure_future(self._arun_step(ex, step, executor))] = sid
                if not tasks:
                    wait = None if ex.stopping else ex.next_delay()
                    if wait is None:
                        if not ex.stopping and self._reconcile(ex):
                            continue
                        break
                    await asyncio.sleep(wait)
                    continue
                timeout = None if ex.stopping else ex.next_delay()
                done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    tasks.pop(t)
                    t.result()
            plan = self._finish(ex)
            await self._acommit(ex, plan, charge=plan[0] if plan else None)
        except BaseException as exc:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._drain_io()
            if _stale(exc):
                raise
            unsaved = unsaved_stop(ex, exc, self._flush_after_crash(ex))
            if unsaved is not None:
                raise unsaved from exc
            raise
        finally:
            self._leave(run.run_id)
        self._after_finish(ex)
        return run

    async def _arun_step(self, ex: Execution, step: Step, executor: AsyncExecutor) -> None:
        plan = self._start_attempt(ex, step)
        if plan:
            await self._acommit(ex, plan, charge=step)
        if step.status != StepStatus.RUNNING:
            return
        prior = self._prior_calls(ex.run.run_id, step)
        tokens0, cost0 = step.tokens, step.cost_usd
        sid = step.id  # the executor holds the step, and may change its id
        CURRENT_STEP.set((ex.run.run_id, sid))  # this task's own context copy
        try:
            out: Any = executor(step, prior)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:
            if _stale(exc):
                raise  # another writer moved (or forgot) the run: not this step's failure
            plan = self._after_failure(ex, step, exc, tokens0, cost0, sid)
        else:
            plan = self._after_success(ex, step, out, tokens0, cost0, sid)
        if ex.replaced:  # one put back while it ran: its stop, now its outcome is known
            self._replaced(ex)
        if plan:
            await self._acommit(ex, plan, charge=step)
        self._release(ex, step)  # only now: its completion is durable (when the policy commits)

    # ------------------------------------------------------------------ shared machinery

    def _begin(self, run: AgentRun, on_progress: ProgressCallback | None,
               defer_commit: bool = False) -> Execution:
        if run.run_id in self._active:
            raise RuntimeError(f"run {run.run_id!r} is already executing in this agent")
        with _EXECUTING_LOCK:
            executing = _EXECUTING.setdefault(self.store, set())
            if run.run_id in executing:
                # Two agents of one store share its view of the run: neither is "another
                # writer" to the store, so each committed over the other's steps and both
                # paid for every call (8 of 10 twice with two threads).
                raise RunBusyError(run.run_id)
            executing.add(run.run_id)
        try:
            return self._begin_claimed(run, on_progress, defer_commit)
        except BaseException:
            self._leave(run.run_id)
            raise

    def _leave(self, run_id: str) -> None:
        """The execution of `run_id` is over (returned, raised or never began)."""
        self._active.pop(run_id, None)
        with _EXECUTING_LOCK:
            _EXECUTING.get(self.store, set()).discard(run_id)

    def _begin_claimed(self, run: AgentRun, on_progress: ProgressCallback | None,
                       defer_commit: bool) -> Execution:
        if run.status == "superseded":
            raise ValueError(f"run {run.run_id!r} was superseded by "
                             f"{run.metadata.get('superseded_by')!r}; execute that one")
        if run.run_id not in self._known:
            self.store.save_run(run)  # a run this agent never saw: make all of it durable once
            self._known.add(run.run_id)
        # A run it saved already can have had a dict put in its steps since: refused by name
        # here, or the schedule below fails on it with AttributeError ('dict' ... 'status').
        ValuePlanner.require_steps(run)
        ex = Execution(run, self.policy, self.retry, on_progress or self.on_progress, self._rng)
        for step in requeue_interrupted(run):
            ex.dirty[step.id] = step
        steps = run.steps
        ex.held = dict(steps)
        ex.dependants = dependants_index(steps)
        roots = [sid for sid, s in steps.items()
                 if s.status in (StepStatus.FAILED, StepStatus.SKIPPED)]
        for sid in roots:
            for s in ex.skip_downstream(sid):
                ex.dirty[s.id] = s
        for sid, s in steps.items():
            if s.status == StepStatus.COMPLETED:
                ex.completed += 1
            elif s.status == StepStatus.FAILED:
                ex.failed += 1
            elif s.status == StepStatus.PENDING:
                left = sum(1 for d in s.dependencies if steps[d].status != StepStatus.COMPLETED)
                ex.deps_left[sid] = left
                if left == 0:
                    ex.ready.append(sid)
        if run.status != "running" or "stopped" in run.metadata:
            run.status = "running"
            run.metadata.pop("stopped", None)
            run.updated_at = time.time()
        ex.totals = (run.total_tokens, run.total_cost_usd)
        self._active[run.run_id] = ex
        logger.info("executing run %s: %d/%d steps completed, %d ready, checkpoint %s",
                    run.run_id, ex.completed, len(steps), len(ex.ready), self.policy.describe())
        self._emit(ex, "run_started", None)
        if not defer_commit:
            self._commit(ex, ex.take(), recover=False)
        return ex

    def _start_attempt(self, ex: Execution, step: Step) -> list[Step] | None:
        limit = ex.retry.max_total_attempts
        if limit is not None and step.attempt_count >= limit:
            step.error = f"gave up after {step.attempt_count} attempts across restarts"
            return self._fail(ex, step, step.error)
        # Assignments are validated (Step has validate_assignment): skip the no-op ones.
        step.status = StepStatus.RUNNING
        step.attempt_count += 1
        step.started_at = time.time()
        if step.completed_at is not None:
            step.completed_at = None
        ex.attempts[step.id] = ex.attempts.get(step.id, 0) + 1
        ex.running[step.id] = step
        if ex.callback is not None:
            self._emit(ex, "step_started", step)
        if ex.policy.commits_attempt_start:
            ex.marked.add(step.id)
            return ex.take([step])  # with what its totals count: see `_tool_plan`
        return None

    def _account(self, ex: Execution, step: Step, tokens0: int, cost0: float) -> None:
        """Count the attempt's spend in the run, and note what was acknowledged (a refused value
        goes back to it: refused_values.put_back)."""
        dt, dc = step.tokens - tokens0, step.cost_usd - cost0
        run = ex.run
        if dt:
            run.total_tokens += dt
        if dc:
            run.total_cost_usd += dc
        ex.totals = (run.total_tokens, run.total_cost_usd)
        ex.acked[step.id] = (step.result, step.tokens, step.cost_usd)

    def _end_attempt(self, ex: Execution, step: Step) -> None:
        ex.running.pop(step.id, None)
        ex.marked.discard(step.id)
        self._tool_logs.forget(ex.run.run_id, step.id)

    def _after_success(self, ex: Execution, step: Step, out: Any, tokens0: int,
                       cost0: float, sid: str) -> list[Step] | None:
        self._reconcile(ex, removals=False, ran=sid)  # what it added goes into its step's commit
        left = self._left_unstorable(ex, step, tokens0, cost0)
        if left is not None:
            return left
        try:
            complete_step(step, out, ex.run.run_id)
        except UnstorableValueError as exc:
            return self._stop_refused(ex, step, refused_output_stop(ex, step, exc))
        self._account(ex, step, tokens0, cost0)
        self._end_attempt(ex, step)
        ex.completed += 1
        ex.unreleased.add(step.id)
        ex.dirty[step.id] = step
        ex.finished_since_commit += 1
        if ex.policy.due_after_step(step, ex.finished_since_commit):
            return ex.take()
        return None

    def _release(self, ex: Execution, step: Step) -> None:
        """A completed step's acknowledgement: its dependants become ready, `step_completed` fires.

        Called after the step's commit returned (when the policy commits it), never before:
        a dependant started earlier would build on (and pay tool calls for) a result a crash
        could still take back, and a progress consumer would count a step that may be lost;
        with commits waiting for a shared record, that window is no longer one fsync wide.
        Under a policy that defers commits, the step is released at once, as it always was
        (its completion goes into the next record, with or before its dependants').
        """
        ex.unreleased.discard(step.id)
        if step.status != StepStatus.COMPLETED or step.id in ex.running:
            return  # stopped on a refused output, or gave up before starting
        ex.complete(step.id)
        if ex.callback is not None:
            self._emit(ex, "step_completed", step)
        logger.debug("run %s: step %s completed (attempt %d)", ex.run.run_id, step.id, step.attempt_count)

    def _after_failure(self, ex: Execution, step: Step, exc: Exception, tokens0: int,
                       cost0: float, sid: str) -> list[Step]:
        self._reconcile(ex, removals=False, ran=sid)  # what it added goes into the failure's commit
        left = self._left_unstorable(ex, step, tokens0, cost0)
        if left is not None:  # whatever it raised, no commit could hold the step as it is now
            return left
        self._account(ex, step, tokens0, cost0)
        self._end_attempt(ex, step)
        step.error = error_text(exc)
        n = ex.attempts.get(step.id, 1)
        if isinstance(exc, UnconfirmedActionError):  # retrying cannot help; failing would guess
            return self._stop(ex, step, RunStoppedError(
                ex.run.run_id, step.id, n, exc,
                f"will not repeat a call whose outcome the log cannot give back: {exc}"))
        if isinstance(exc, UnstorableValueError):  # e.g. a paid tool result the log refused:
            # a retry would pay for the call again and meet the same refusal; stop and say why
            return self._stop(ex, step, RunStoppedError(
                ex.run.run_id, step.id, n, exc,
                f"produced a value the store cannot keep ({exc.field}: {exc.reason})"))
        if not ex.retry.is_retryable(exc):
            logger.warning("run %s: step %s failed permanently (%s): %s", ex.run.run_id, step.id,
                           ex.retry.why_not_retried(exc), step.error)
            return self._fail(ex, step, step.error)
        if n < ex.retry.max_attempts:
            delay = ex.retry.delay(n, exc, ex.rng)
            step.status = StepStatus.PENDING
            step.started_at = None
            ex.retry_later(step.id, delay)
            logger.warning("run %s: step %s attempt %d failed (%s); retrying in %.2fs",
                           ex.run.run_id, step.id, step.attempt_count, step.error, delay)
            self._emit(ex, "step_retry", step, step.error, delay)
            return ex.take([step])
        if ex.retry.on_exhausted == "fail":
            logger.warning("run %s: step %s failed %d times: %s", ex.run.run_id, step.id, n, step.error)
            return self._fail(ex, step, step.error)
        return self._stop(ex, step, RetriesExhaustedError(ex.run.run_id, step.id, n, exc))

    def _left_unstorable(self, ex: Execution, step: Step, tokens0: int,
                         cost0: float) -> list[Step] | None:
        """Stop the run at `step` if the executor left in it (or in the run) a value no commit
        can hold: before the step is marked done or its spend counted (`left_value_stop`)."""
        stop = left_value_stop(self.store, ex, step, tokens0, cost0)
        if stop is None:
            return None
        batch = self._stop_refused(ex, step, stop.error)
        return [s for s in batch if s is not step] if stop.left_out else batch

    def _spoiled(self, ex: Execution, steps: list[Step], exc: UnstorableValueError,
                 charge: Step | None) -> bool:
        """A commit of `steps` refused for a value put in one of them (or in the run) after its
        check: stop the run at that step, the value put back, so the caller can commit the
        batch again (`spoiled_stop`). False: the caller raises the refusal."""
        stop = spoiled_stop(self.store, ex, steps, exc, charge)
        if stop is None:
            return False
        if stop.left_out:
            steps.remove(stop.step)  # never write what a load could not give back
        if ex.stop_error is None:
            self._record_stop(ex, stop.step.id, stop.step, error_text(stop.error.cause), stop.error)
        else:  # stopping already: this one is told, not raised
            logger.error("%s", stop.error)
        return True

    def _stop_refused(self, ex: Execution, step: Step, error: RunStoppedError) -> list[Step]:
        """End `step`'s attempt and stop the run at it for a value the store refused."""
        self._end_attempt(ex, step)
        step.error = error_text(error.cause)
        return self._stop(ex, step, error)  # _stop logs it, with step.error

    def _stop(self, ex: Execution, step: Step, error: RunStoppedError) -> list[Step]:
        step.status = StepStatus.PENDING
        step.started_at = None
        self._record_stop(ex, step.id, step, step.error or "", error)
        return ex.take([step])

    def _record_stop(self, ex: Execution, sid: str, step: Step | None, text: str,
                     error: RunStoppedError) -> None:
        ex.run.status = "failed"
        ex.run.updated_at = time.time()
        ex.run.metadata["stopped"] = {"step_id": sid, "error": text,
                                      "attempts": error.attempts, "at": ex.run.updated_at}
        ex.stop_error = error
        logger.error("run %s: stopping at step %s (%s); checkpoint kept for resume",
                     ex.run.run_id, sid, text)
        self._emit(ex, "run_stopped", step, text)

    def _removed(self, ex: Execution, sid: str) -> None:
        """Stop the run for a step an executor removed from `run.steps`.

        Met as a bare KeyError out of execute_run, the run left "running". No commit can
        remove a step (a commit writes steps, it deletes none), so the store keeps it as last
        saved and a resume runs it, unless it had finished: the run stops saying so rather
        than finish without it.
        """
        held = ex.held.get(sid)
        done = held.status.value if held is not None and held.status in TERMINAL_STATUSES else ""
        why = ("was removed from run.steps while the run was executing; no commit removes a "
               "step, so the store keeps it as last saved "
               + (f"({done}: put it back)" if done else "(put it back, or let it run)"))
        error = RunStoppedError(ex.run.run_id, sid, ex.attempts.get(sid, 0),
                                LookupError(f"step {sid!r} is not in run.steps"), why,
                                resume="past_step" if done else "at_step")
        if ex.stop_error is None:
            self._record_stop(ex, sid, None, why, error)
        else:  # stopping already: this one is told, not raised
            logger.error("%s", error)

    def _reconcile(self, ex: Execution, *, removals: bool = True, ran: str | None = None) -> bool:
        """Bring the schedule up to date with steps added to the run or removed from it (by an
        executor, a progress callback); True if that gave the run more to do.

        Called when an executor returns (that of the step the schedule knows as `ran`: its
        executor may have changed `step.id`, so not that), before its step's plan is taken, so
        what it added is committed with its step (and never after: a crash between its step's
        commit and theirs lost them for good, the resume finding the step done), and once
        nothing is left to run. An added step no commit could hold stops the run naming it
        (`_refused_added`), and so does a step replaced under its id, once the schedule met it
        (`_replaced`); a removed one stops it too (`_removed`), only once nothing is left to
        run (`removals`) or when its turn comes: the steps it does not hold up run first, as
        they always did."""
        if ran is not None and ex.live(ran) is None:
            # its executor, the likeliest to have added (or renamed) its own id: put right
            # first, so its step filed again under the new id (`step.id = "x";
            # run.add_step(step)`) is met as misfiled, not as a new step
            self._replaced(ex)
        added, removed, refused = ex.reconcile()
        if not removals:
            removed = []
        for s in added:
            ex.dirty[s.id] = s
        if added:
            logger.info("run %s: %d step(s) added during execution, %d ready", ex.run.run_id,
                        len(added), len(ex.ready))
        for sid, why, cause in refused:
            self._refused_added(ex, sid, why, cause)
        replaced = self._replaced(ex)
        if removed:
            self._removed(ex, removed[0])
        return bool(ex.ready) or bool(removed) or bool(refused) or replaced

    def _gone(self, ex: Execution, sid: str) -> None:
        """Stop the run for `sid`, whose turn came with its step no longer in the run as the
        schedule has it (`Execution.live`): replaced under its id, or removed."""
        self._replaced(ex)  # puts a replaced step back: what is still missing was removed
        if sid not in ex.run.steps:
            self._removed(ex, sid)

    def _replaced(self, ex: Execution) -> bool:
        """Stop the run for each step replaced under its id (`Execution.live` noted them);
        True if there was one.

        `run.add_step` of an id the run has replaces the step object: unnoticed, the
        replacement of a finished step was never run nor committed and the run ended "failed"
        with nothing saying why; that of a pending one ran on the replaced step's schedule and
        was committed, its graph unchecked. The step the schedule has is put back in the run,
        as the store keeps it (what it acknowledged stays committed), and the run stops naming
        it, as for `_refused_added`. A step whose id was changed in place (`step.id = "x"`) gets
        its id back: committed as it was, the store refused the commit (bare, the run left
        "running", the finished steps with it) or, grouped, stored it under the new id beside
        the old one, still pending. A step being run is put right at once, so no commit meets
        it otherwise, but its stop waits for its attempt's end (`_run_step` asks again), which
        decides what the store keeps of it: the error says whether a resume runs it."""
        sids, ex.replaced = ex.replaced, []
        for sid in sids:
            held = ex.held[sid]
            if held.id != sid:
                ex.renamed.setdefault(sid, held.id)
                held.id = sid  # its id when the schedule took it, so valid
            ex.run.steps[sid] = held
            if sid in ex.running:
                ex.replaced.append(sid)
                continue
            renamed = ex.renamed.pop(sid, None)
            if renamed is None:
                why = ("was replaced by a step with the same id during execution (run.add_step "
                       "of an id the run already has); the step as the run had it was put back, "
                       "as the store keeps it (give new work a new id)")
                cause = ValueError(f"step id {sid!r} was added again")
            else:
                why = (f"had its id changed to {renamed!r} during execution; a commit writes a "
                       "step under its id, so its id was put back, as the store keeps it (give "
                       "new work a new step: run.add_step(Step(...)))")
                cause = ValueError(f"step {sid!r} was renamed {renamed!r}")
            error = RunStoppedError(ex.run.run_id, sid, ex.attempts.get(sid, 0), cause, why,
                                    resume="past_step" if held.status in TERMINAL_STATUSES
                                    else "at_step")
            if ex.stop_error is None:
                self._record_stop(ex, sid, None, why, error)
            else:  # stopping already: this one is told, not raised
                logger.error("%s", error)
        return bool(sids)

    def _refused_added(self, ex: Execution, sid: str, why: str, cause: Exception) -> None:
        """Stop the run for what was added under `sid` that no commit could hold: not a Step,
        a Step under another id or with content the store refuses, a graph the store refuses
        (`Execution.reconcile` took it back out of `run.steps`, so the run is as the store has
        it). Committed, the store refused the whole batch, and the crash flush's too (or, a
        dict, the schedule met it first as AttributeError): the error out of execute_run, the
        run left "running" and, under every-n, the acknowledged steps not yet committed lost."""
        text = f"was added to the run during execution but {why}, so no commit could hold it: " \
               "it was taken out of run.steps again (add a plain Step under its own id, with " \
               "values a record can hold and dependencies on steps of the run: " \
               "run.add_step(Step(...)))"
        error = RunStoppedError(ex.run.run_id, sid, 0, cause, text, resume="without_step")
        if ex.stop_error is None:
            self._record_stop(ex, sid, None, text, error)
        else:  # stopping already: this one is told, not raised
            logger.error("%s", error)

    def _fail(self, ex: Execution, step: Step, error: str) -> list[Step]:
        self._end_attempt(ex, step)
        step.status = StepStatus.FAILED
        step.error = error
        step.completed_at = time.time()
        ex.failed += 1
        ex.dirty[step.id] = step
        skipped = ex.skip_downstream(step.id)
        for s in skipped:
            ex.dirty[s.id] = s
            if ex.callback is not None:
                self._emit(ex, "step_skipped", s, s.error or "")
        self._emit(ex, "step_failed", step, error)
        if skipped:
            logger.warning("run %s: %d step(s) skipped because %s failed", ex.run.run_id,
                           len(skipped), step.id)
        return ex.take()

    def _finish(self, ex: Execution) -> list[Step]:
        run = ex.run
        ex.find_replaced()  # a replaced step the schedule never met again (a finished one)
        self._replaced(ex)
        if ex.stop_error is None:
            if ex.pause_requested:
                run.status = "paused"
            elif run.is_complete():
                run.status = "completed" if ex.failed == 0 else "completed_with_errors"
            else:  # only reachable if the graph changed under us
                run.status = "failed"
                logger.error("run %s: no runnable step left but the run is not complete", run.run_id)
            run.updated_at = time.time()
        return ex.take()

    def _after_finish(self, ex: Execution) -> None:
        run = ex.run
        if ex.stop_error is not None:
            raise ex.stop_error
        kind = "run_paused" if run.status == "paused" else "run_finished"
        logger.info("run %s %s: %d/%d steps completed, %d failed, %d tokens", run.run_id, run.status,
                    ex.completed, len(run.steps), ex.failed, run.total_tokens)
        self._emit(ex, kind, None, run.status)

    def _flush_after_crash(self, ex: Execution) -> bool:
        """On an interrupt (KeyboardInterrupt, cancellation): keep the finished work, best effort.

        True if nothing is left unsaved: a stop recorded but not yet committed is written even
        with no step to go with it (see `unsaved_stop`)."""
        batch = ex.take()
        if not batch and ex.stop_error is None:
            return True
        try:
            self._commit(ex, batch, charge=batch[0] if batch else None)
        except Exception:
            logger.exception("run %s: could not save %d finished steps while stopping", ex.run.run_id,
                             len(batch))
            return False
        return True

    def _commit(self, ex: Execution, steps: list[Step], *, charge: Step | None = None,
                recover: bool = True) -> None:
        """Commit `steps` with the run's fields. A refusal of a value put in a finished step (or,
        with `charge`, in the run) after its check stops the run and commits again (`_spoiled`);
        `recover=False` raises it, for the commit that opens an execution (the caller's input)."""
        self._after_queued_writes()
        self._put_right_renamed(ex, steps)
        tries = len(steps) + 2  # each put back clears a step, or the run, for good
        while True:
            try:
                self.store.commit(ex.run, steps)
                break
            except BaseException as exc:  # an interrupt mid-write too: the write may not have
                # happened, so its steps wait for the crash flush (`_keep_dirty`)
                tries = self._after_failed_commit(ex, steps, exc, tries, charge, recover)
                if not tries:
                    raise
        self._committed(ex, steps)

    async def _acommit(self, ex: Execution, steps: list[Step], *, charge: Step | None = None,
                       recover: bool = True) -> None:
        """`_commit` off the loop, group-committed with whatever else is being committed."""
        self._put_right_renamed(ex, steps)
        tries = len(steps) + 2
        while True:
            try:
                await self._agroup(ex.run.run_id, run=ex.run, steps=steps)
                break
            except Exception as exc:  # not BaseException, unlike `_commit`: a CancelledError
                # here cancels only this await; the write is shielded and goes on (the crash
                # path drains it), so it is no failed write and its steps are not kept dirty
                tries = self._after_failed_commit(ex, steps, exc, tries, charge, recover)
                if not tries:
                    raise
        self._committed(ex, steps)

    def _put_right_renamed(self, ex: Execution, steps: list[Step]) -> None:
        """Give back its id to each of `steps` whose id was changed in place since the schedule
        last met it, and stop the run on it (`_replaced`), before the commit meets it.

        A sibling executor or a progress callback can rename a finished step waiting in a
        deferred batch, or the running step a tool call's commit carries
        (`run.steps["b"].id = "q"`): the store refused the whole batch naming a key no step
        of it has (nothing to put back, so raised out of execute_run, the run left "running"),
        and a grouped commit stored the step under the new id. A lookup per step of the batch;
        the search for the key of a renamed one is made only when there is one."""
        held = ex.held
        if all(held.get(s.id) is s for s in steps):
            return
        moved = {id(s) for s in steps if held.get(s.id) is not s}
        for sid, step in held.items():
            if id(step) in moved:
                ex.live(sid)  # notes it in `replaced`
        self._replaced(ex)

    def _after_failed_commit(self, ex: Execution, steps: list[Step], exc: BaseException,
                             tries: int, charge: Step | None, recover: bool) -> int:
        """What `_commit` and `_acommit` do when a commit of `steps` raised `exc`: the tries left
        if the commit is to be made again (a refused value put back, `_spoiled`), else 0, the
        steps kept for the next commit, for the caller to raise `exc`."""
        if isinstance(exc, UnstorableValueError):
            tries -= 1
            if recover and tries > 0 and self._spoiled(ex, steps, exc, charge):
                return tries
        _keep_dirty(ex, steps)
        return 0

    def _committed(self, ex: Execution, steps: list[Step]) -> None:
        for s in steps:
            ex.acked.pop(s.id, None)
        if ex.callback is not None and steps:
            self._emit(ex, "checkpoint", None, f"{len(steps)} step(s)")

    def _save(self, run: AgentRun, steps: list[Step]) -> None:
        if run.run_id in self._known:
            self.store.commit(run, steps)
        else:
            self.store.save_run(run)
            self._known.add(run.run_id)

    def _emit(self, ex: Execution, kind: str, step: Step | None, message: str = "",
              delay: float | None = None) -> None:
        if ex.callback is None:
            return
        event = ProgressEvent(kind, ex.run.run_id, step.id if step else None, ex.completed,
                              len(ex.run.steps), step.attempt_count if step else 0, message, delay)
        try:
            ex.callback(event)
        except Exception:
            logger.exception("progress callback failed on %s; ignoring", kind)

    # ------------------------------------------------------------------ async store writes

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a store write off the event loop, in order, and let nothing cancel it midway.

        One worker thread means writes become durable in the order they were decided (a
        step's completion never lands before those it depended on). The write is shielded:
        cancelling the awaiting task (Ctrl-C, a sibling's crash) must not drop a tool result
        that was already paid for, or the call would be repeated on replay.
        """
        return await self._await_io(self._pool().submit(fn, *args))

    async def _agroup(self, run_id: str, *, run: AgentRun | None = None, steps: list[Step] | None = None,
                      tool_calls: list[tuple[str, ToolCall]] | None = None) -> int:
        """Queue a commit on the group committer; return its version once it is durable.

        The committer writes on the same one-thread pool as `_io`, so order is kept with every
        other store write; what is queued while a record is being written shares the next one.
        """
        if self._committer is None:
            self._committer = GroupCommitter(self.store, self._pool())
        fut = self._committer.submit(run_id, run=run, steps=steps or (), tool_calls=tool_calls or ())
        return int(await self._await_io(fut))

    def _pool(self) -> StorePool:
        if self._io_pool is None:
            # ordered: at interpreter exit a write runs in the caller only after those queued
            # before it (refused, an async run in a non-daemon thread could not commit at all)
            self._io_pool = StorePool(1, thread_name_prefix="ckptfs-agent-io", ordered=True)
        return self._io_pool

    async def _await_io(self, fut: concurrent.futures.Future[Any]) -> Any:
        """Await a store write, shielded (see `_io`); tracked so a crash path can drain it."""
        self._io_pending.add(fut)
        fut.add_done_callback(self._io_pending.discard)
        return await asyncio.shield(asyncio.wrap_future(fut))

    def _after_queued_writes(self) -> None:
        """Before a write made here, on the caller's thread: wait for those queued on the
        writer thread. A sync `tools().run` inside an `aexecute_run` executor (the README's
        executor, made async) commits its RUNNING mark directly; written ahead of a queued
        completion, that record carried the run's totals with the finished step's spend but
        not the step, so a crash in between made the resume count that spend twice."""
        pending = list(self._io_pending)
        if pending:
            concurrent.futures.wait(pending)

    def _drain_io(self, timeout: float = 60.0) -> None:
        """Wait for writes already handed to the worker thread (on the way out of a crash)."""
        if self._io_pending:
            concurrent.futures.wait(list(self._io_pending), timeout=timeout)

    # ------------------------------------------------------------------ tool-call support

    def _prior_calls(self, run_id: str, step: Step) -> list[ToolCall]:
        start = step.metadata.get(TOOL_LOG_START, 0) if step.metadata else 0
        return self._tool_logs.prior_calls(run_id, step, int(start))

    def tool_state(self, run_id: str, step_id: str) -> ToolLogState:
        """The step's tool-log index (ToolHost)."""
        return self._tool_logs.state(run_id, step_id)

    def _write_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        """The durable write of a tool call (a Worker's agent claims its step with it)."""
        self.store.log_tool_call(run_id, step_id, tool_call)

    def _tool_log_start(self, run_id: str, step_id: str) -> int:
        """Where the step's current attempt starts in its tool log (a reset fences off the rest)."""
        ex = self._active.get(run_id)
        step = ex.held.get(step_id) if ex is not None else None  # never a replacement's
        return int(step.metadata.get(TOOL_LOG_START, 0)) if step is not None else 0

    def _tool_plan(self, run_id: str, step_id: str, when: str, force: bool) -> tuple[Execution,
                                                                                      list[Step]] | None:
        ex = self._active.get(run_id)
        step = ex.running.get(step_id) if ex is not None else None
        if ex is None or step is None:
            return None
        if when == "start":
            if step_id in ex.marked:
                return None
            ex.marked.add(step_id)
            # The lazy RUNNING mark: attempt count durable before a real call. It carries the
            # finished steps not yet committed too (every_n, milestone): a commit writes the
            # run's totals, which already count their spend, so without them a crash made the
            # resume run them again and count their tokens and cost twice. It costs no commit.
            return ex, ex.take([step])
        if force or ex.policy.granularity == "tool_call":
            return ex, ex.take([step])
        return None

    def before_tool_call(self, run_id: str, step_id: str) -> None:
        """ToolHost: the lazy RUNNING mark, so the attempt count is durable before a real call."""
        plan = self._tool_plan(run_id, step_id, "start", False)
        if plan is not None:
            self._commit(*plan)

    async def abefore_tool_call(self, run_id: str, step_id: str) -> None:
        plan = self._tool_plan(run_id, step_id, "start", False)
        if plan is not None:
            await self._acommit(*plan)

    def after_tool_call(self, run_id: str, step_id: str, checkpoint: bool) -> None:
        """ToolHost: a commit after the call when asked (`checkpoint=True`) or per tool call."""
        plan = self._tool_plan(run_id, step_id, "done", checkpoint)
        if plan is not None:
            self._commit(*plan)

    async def aafter_tool_call(self, run_id: str, step_id: str, checkpoint: bool) -> None:
        plan = self._tool_plan(run_id, step_id, "done", checkpoint)
        if plan is not None:
            await self._acommit(*plan)
