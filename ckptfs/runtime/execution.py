"""What running a step graph is made of: an executor's output, progress events, and the schedule.

`Execution` is the in-memory schedule of one run being executed (ready queue by dependency
counts, retry timers, what is not yet committed); `complete_step` is the one meaning of "done"
the agent and a Worker share; `StepResult` and `ProgressEvent` are what executors and progress
callbacks see. Nothing here writes: the agent decides when to commit.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import (
    InvalidGraphError,
    NonFiniteValueError,
    RunStoppedError,
    UnstorableValueError,
    error_text,
)
from ckptfs.format import codec
from ckptfs.format.models import AgentRun, Step, StepStatus, ToolCall, find_cycle
from ckptfs.runtime.policy import CheckpointPolicy, RetryPolicy
from ckptfs.runtime.resume import SKIP_REASON
from ckptfs.store.values import ValuePlanner


@dataclass
class StepResult:
    """What an executor may return instead of a plain string, to report what the step cost."""

    result: str
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class ProgressEvent:
    """One thing that happened in a run, for a progress callback (a bar, a metrics counter)."""

    kind: str  # run_started, step_started, step_completed, step_retry, step_failed, step_skipped,
    #            checkpoint, run_paused, run_stopped, run_finished
    run_id: str
    step_id: str | None
    completed: int
    total: int
    attempt: int = 0
    message: str = ""
    delay: float | None = None


ProgressCallback = Callable[[ProgressEvent], None]
Executor = Callable[[Step, list[ToolCall]], Any]
AsyncExecutor = Callable[[Step, list[ToolCall]], Awaitable[Any]]


@dataclass
class Execution:
    """The in-memory schedule of one execute_run: ready queue, retry timers, uncommitted steps."""

    run: AgentRun
    policy: CheckpointPolicy
    retry: RetryPolicy
    callback: ProgressCallback | None
    rng: random.Random
    dependants: dict[str, list[str]] = field(default_factory=dict)
    deps_left: dict[str, int] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    delayed: list[tuple[float, int, str]] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    dirty: dict[str, Step] = field(default_factory=dict)
    finished_since_commit: int = 0
    running: dict[str, Step] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)
    completed: int = 0
    failed: int = 0
    stop_error: RunStoppedError | None = None
    pause_requested: bool = False
    seq: int = 0
    # A finished step's (result, tokens, cost) as acknowledged, until its commit: under a
    # deferred policy another executor can spoil it meanwhile, and the store's copy is older
    # than what `step_completed` announced and the run's totals count.
    acked: dict[str, tuple[str | None, int, float]] = field(default_factory=dict)
    # The run's totals as the agent last counted them (the stored ones lag every finished
    # step a deferred policy has not committed yet).
    totals: tuple[int, float] = (0, 0.0)
    # Steps COMPLETED whose dependants are not readied yet (`CheckpointedAgent._release`, after
    # the commit the policy asks for): a step added meanwhile waits for that release too.
    unreleased: set[str] = field(default_factory=set)
    # Steps the schedule knows (`dependants`) that are no longer in the run (`reconcile`).
    removed: list[str] = field(default_factory=list)
    # The Step object the schedule has for each id it knows: one the run holds another
    # object for was replaced under its id (`live`), and goes into `replaced`; so does one
    # whose id was changed in place, the id it was given noted in `renamed` when it is put
    # back (the stop, deferred while the step runs, names it).
    held: dict[str, Step] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)

    @property
    def stopping(self) -> bool:
        return self.stop_error is not None or self.pause_requested

    def take(self, extra: list[Step] | None = None) -> list[Step]:
        """Everything not yet committed (plus `extra`), to go into one commit."""
        batch = list(self.dirty.values())
        if extra:
            batch += [s for s in extra if s.id not in self.dirty]
        self.dirty = {}
        self.finished_since_commit = 0
        return batch

    def next_ready(self) -> str | None:
        if self.delayed and self.delayed[0][0] <= time.monotonic():
            _, _, sid = heapq.heappop(self.delayed)
            return sid
        return self.ready.popleft() if self.ready else None

    def next_delay(self) -> float | None:
        if not self.delayed:
            return None
        return max(0.0, self.delayed[0][0] - time.monotonic())

    def retry_later(self, sid: str, delay: float) -> None:
        self.seq += 1
        heapq.heappush(self.delayed, (time.monotonic() + delay, self.seq, sid))

    def live(self, sid: str) -> Step | None:
        """The step `sid` as the schedule has it; None if the run no longer has it, removed
        (`reconcile`) or replaced: `run.add_step` of an id the run has is a plain dict
        assignment, and the replacement, scheduled or committed, ran on dependency counts and
        a status that were not its own (or put a graph the store refuses into the commit).
        A step whose id was changed in place (`step.id = "x"`, by the executor holding it or
        through `run.steps`) counts as replaced: a commit writes a step under its id, so the
        store refused the commit (the finished steps with it) or, grouped, stored a step the
        run does not have under that name. The id is noted in `replaced` for the agent to put
        the step right and stop the run on it.

        Asked wherever the schedule goes from an id to its step, so a replacement is met at
        no extra cost before it is ever run, skipped or committed; one met nowhere (a finished
        step's, with nothing left depending on it) is found by `find_replaced`, once."""
        step = self.run.steps.get(sid)
        held = self.held.get(sid)
        if step is None or held is None or (step is held and step.id == sid):
            return step
        if sid not in self.replaced:
            self.replaced.append(sid)
        return None

    def find_replaced(self) -> None:
        """Note every replaced step in `replaced` (see `live`): one walk of the steps, made once
        per execution (at its end, beside `is_complete`'s), never per executor return."""
        steps = self.run.steps
        for sid, step in self.held.items():
            now = steps.get(sid)
            if now is not None and (now is not step or step.id != sid) and sid not in self.replaced:
                self.replaced.append(sid)

    def complete(self, sid: str) -> None:
        for d in self.dependants.get(sid, ()):
            left = self.deps_left.get(d)
            if left is None:
                continue
            left -= 1
            self.deps_left[d] = left
            step = self.live(d)  # None: removed from the run meanwhile, or replaced
            if left == 0 and step is not None and step.status == StepStatus.PENDING:
                self.ready.append(d)

    def reconcile(self) -> tuple[list[Step], list[str], list[tuple[str, str, Exception]]]:
        """Steps added to the run since the schedule was last brought up to date, now scheduled;
        the ids of the steps removed from it (all of them, each time); and the keys of added
        entries no commit could hold, with why and the refusal (taken back out of the run,
        unscheduled; see `_refuse_unholdable`). Asked each time an executor returns, so that
        what it added goes into the same commit as its step, and once nothing is left to run.

        An executor can plan more work (`run.add_step(...)`), as the seed's loop over
        `get_ready_steps()` allowed. Asked only once nothing was left to run, such a step was
        committed by no checkpoint before then: a crash after its adder's completion was
        durable lost it for good (the resume, finding the adder done, finished the run without
        it), and a stop before the end left it out of the store. A removal cannot be committed
        at all (a commit writes steps, it deletes none), so the caller stops the run naming it.

        O(1) when nothing changed, O(added) when steps were added (they are at the end of the
        dict): a run whose every step adds the next one costs O(n), not O(n^2). A removal costs
        one scan of the run, when it is first seen (the ids stay in `removed` until put back).
        A step replaced under its id changes neither the dict's size nor its last key: it is
        told by identity where the schedule meets it (`live`, `find_replaced`), not here.
        """
        steps = self.run.steps
        known = self.dependants
        if self.removed:
            self.removed = [sid for sid in self.removed if sid not in steps]  # some put back
        expected = len(known) - len(self.removed)
        n = len(steps)
        if n == expected and (not n or next(reversed(steps)) in known):
            return [], list(self.removed), []
        new_keys: list[str] = []
        for sid in reversed(steps):
            if sid in known:
                break
            new_keys.append(sid)
        new_keys.reverse()
        if n - len(new_keys) != expected:  # another removal, or an id removed and put back
            self.removed = [sid for sid in known if sid not in steps]
            seen = set(new_keys)
            new_keys += [sid for sid in steps if sid not in known and sid not in seen]
        removed = list(self.removed)
        refused = self._refuse_unholdable(new_keys)
        for sid, _, _ in refused:  # by its key: a Step filed under another id is refused too
            del steps[sid]
        gone = {sid for sid, _, _ in refused}
        added = [steps[sid] for sid in new_keys if sid not in gone]
        held = self.held
        for step in added:
            known[step.id] = []
            held[step.id] = step
        for step in added:
            for dep in step.dependencies:
                if dep in known:
                    known[dep].append(step.id)
        skipped: list[Step] = []
        for step in added:
            if step.status != StepStatus.PENDING or step.id in self.deps_left:
                continue
            deps = [self.live(d) for d in step.dependencies]
            root = next((d for d, s in zip(step.dependencies, deps, strict=True)
                         if s is not None and s.status in (StepStatus.FAILED, StepStatus.SKIPPED)), None)
            if root is not None:
                skipped += self.skip_downstream(root)
                continue
            # a dependency finished but not yet released (its commit still on its way) counts
            # as not done: its release readies this step, never before its record is durable
            left = sum(1 for d, s in zip(step.dependencies, deps, strict=True)
                       if s is None or s.status != StepStatus.COMPLETED or d in self.unreleased)
            self.deps_left[step.id] = left
            if left == 0:
                self.ready.append(step.id)
        new = {s.id for s in added}
        return added + [s for s in skipped if s.id not in new], removed, refused

    def _refuse_unholdable(self, keys: list[str]) -> list[tuple[str, str, Exception]]:
        """The entries added under `keys` that no commit could hold, with why and the refusal.

        Not a Step (`run.steps["x"] = {...}`, or None: AgentRun does not validate assignment),
        it is what the store refuses by name (`ValuePlanner.require_step`); the schedule met it
        first, as AttributeError out of execute_run with the run left "running". A Step filed
        under a key that is not its id: a commit writes a step under its id, so the store got a
        step the run does not have under that name (and the schedule never ran it). A Step whose
        content the store refuses (a field of a Step subclass, a lone surrogate in its title, a
        NaN: `ValuePlanner.model_json_of` and `check_storable`, the store's own checks): its
        refusal named no step of the schedule, so it escaped execute_run, the run left "running"
        and the steps finished before it not committed (a resume ran, and paid for, them
        again). Each added Step is serialised once more for it, as its commit does. A Step the
        store's graph check would refuse: one depending on itself, on no step of the run, on
        such a step, or on a cycle; one COMPLETED without a result. Committed with the others,
        it made the store refuse the whole commit (and the crash flush's after it):
        InvalidGraphError out of execute_run, the run left "running" and, under every-n, the
        acknowledged steps of the batch lost. Only the added entries are looked at (a cycle
        must go through one of them): O(added)."""
        run_id = self.run.run_id
        steps = self.run.steps
        unstorable: dict[str, tuple[str, Exception]] = {}
        added: list[Step] = []
        for key in keys:
            entry: object = steps[key]
            if not isinstance(entry, Step):
                try:
                    ValuePlanner.require_step(run_id, entry, key)
                except UnstorableValueError as exc:
                    unstorable[key] = (f"is a {type(entry).__name__}, not a Step", exc)
            elif entry.id != key:
                unstorable[key] = (f"is a Step whose id is {entry.id!r}, not the key it was put "
                                   "under", ValueError(f"run.steps[{key!r}] holds step {entry.id!r}"))
            else:
                try:
                    ValuePlanner.model_json_of(entry, run_id, key)
                    ValuePlanner.check_storable(run_id, key, entry)
                except UnstorableValueError as exc:
                    unstorable[key] = (f"holds what the store cannot keep ({exc.field}: "
                                       f"{exc.reason})", exc)
                else:
                    added.append(entry)
        bad: dict[str, str] = {k: why for k, (why, _) in unstorable.items()}
        for step in added:
            if step.status == StepStatus.COMPLETED and step.result is None:
                bad[step.id] = "is COMPLETED without a result"
            elif step.id in step.dependencies:
                bad[step.id] = "depends on itself"
            else:
                missing = next((d for d in step.dependencies if d not in steps), None)
                if missing is not None:
                    bad[step.id] = f"depends on {missing!r}, which is not a step of the run"
        edges = {s.id: s.dependencies for s in added if s.id not in bad and s.dependencies}
        while (cycle := find_cycle(edges)) is not None:
            bad[cycle] = "is on a dependency cycle"
            del edges[cycle]
        grew = bool(bad)
        while grew:  # what depends on a refused added step is refused with it
            grew = False
            for step in added:
                if step.id not in bad:
                    dep = next((d for d in step.dependencies if d in bad), None)
                    if dep is not None:
                        bad[step.id] = f"depends on {dep!r}, which was refused too"
                        grew = True
        return [(k, bad[k], unstorable[k][1] if k in unstorable else InvalidGraphError(
                    f"run {run_id!r}: added step {k!r} {bad[k]}")) for k in keys if k in bad]

    def skip_downstream(self, sid: str) -> list[Step]:
        """Pending steps downstream of a failed one become SKIPPED, each naming the failed step."""
        out: list[Step] = []
        queue = deque([sid])
        while queue:
            cur = queue.popleft()
            for d in self.dependants.get(cur, ()):
                step = self.live(d)  # never a replacement: it would be committed
                if step is None or step.status != StepStatus.PENDING:
                    continue
                reason = f"dependency {sid!r} failed" if cur == sid else \
                    f"dependency {cur!r} was skipped (root cause: {sid!r} failed)"
                step.status = StepStatus.SKIPPED
                step.error = f"skipped: {reason}"
                step.metadata[SKIP_REASON] = reason
                step.completed_at = time.time()
                self.deps_left.pop(d, None)
                out.append(step)
                queue.append(d)
        return out


def unpack_output(out: Any) -> tuple[str, int, float]:
    if isinstance(out, StepResult):
        return out.result, int(out.tokens), float(out.cost_usd)
    if isinstance(out, str):
        return out, 0, 0.0
    if out is None:
        return "", 0, 0.0
    return str(out), 0, 0.0


def complete_step(step: Step, out: Any, run_id: str | None = None) -> None:
    """Record an executor's output on its step (the agent's and a Worker's one meaning of done).

    Assignments are validated (Step has validate_assignment), so no-op ones are skipped.
    An output no load could give back (a NaN or infinite cost, a token count JSON cannot hold)
    raises UnstorableValueError before the step is touched: recorded, it would only be refused
    at commit, with the step already marked done and the run's totals turned NaN too.
    """
    try:
        result, tokens, cost = unpack_output(out)
    except Exception as exc:  # int(nan), float("x"), int(inf); str(out) where __str__ raises
        what = "tokens or cost_usd" if isinstance(out, StepResult) else f"str() of the {type(out).__name__}"
        raise UnstorableValueError(run_id, step.id, "executor output",
                                   f"{what} unreadable: {error_text(exc)}") from None
    if not isinstance(result, str):  # StepResult(None), StepResult(42): result.isascii() below
        # raised AttributeError out of execute_run, the run left "running", no step named
        raise UnstorableValueError(run_id, step.id, "executor output",
                                   f"StepResult.result must be a str, got {type(result).__name__}")
    if not result.isascii():
        try:
            result.encode()
        except UnicodeEncodeError as exc:  # text decoded with errors="surrogateescape", say
            # caught here, not at commit: there the step was already marked done, the refusal
            # named only "Step", and a Worker let it out of work() (the next worker to take the
            # step ran it again and died the same way)
            raise UnstorableValueError(run_id, step.id, "result", (
                f"a lone surrogate ({result[exc.start]!r} at position {exc.start}), which has no "
                "UTF-8, so no record could hold it (decode with errors='replace')")) from None
    for name, value in (("cost_usd", step.cost_usd + cost), ("tokens", step.tokens + tokens)):
        got = codec.json_problem(value, name)
        if got is not None:
            cls = NonFiniteValueError if got.nonfinite else UnstorableValueError
            raise cls(run_id, step.id, name, f"the executor reported a value a load could not give "
                                             f"back: {got.reason}")
    step.result = result
    if tokens:
        step.tokens += tokens
    if cost:
        step.cost_usd += cost
    step.status = StepStatus.COMPLETED
    step.completed_at = time.time()
    if step.error is not None:
        step.error = None
