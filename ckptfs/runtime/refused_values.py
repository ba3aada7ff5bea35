"""What the agent does with a value the store refuses: stop the run at the step, keep the rest.

An executor holds the live Step (and, through a closure, the run), and a progress callback
sees both: either can leave in them a value no record can hold (NaN, inf, a 5,000-digit int,
a set). Met only by the store's commit, such a value was raised out of execute_run with the
run left "running", the stop unsaved and, under every-n or milestones, the finished steps not
yet committed lost, since every later commit met the same value. The contract instead:

* a refused value stops the run with a RunStoppedError naming the step that holds it (a value
  in the run's own fields is charged to the step whose commit met it), the field and why;
* the refused field is put back (`put_back`), to what was acknowledged for a finished step's
  result and spend, else to what was saved, so that the stop itself can be committed, with
  every finished step of its batch: the run "failed" with the reason, the step PENDING, and
  resume_run continues there;
* a field that cannot be put back leaves its step out of the stop's commit (the store keeps
  it as its last commit left it, and a resume runs it again); a stop that could not be
  committed at all says so (`unsaved_stop`) instead of claiming a checkpoint it has not.

Nothing here changes the schedule or commits: each function decides, puts back and words the
stop, and the agent records it and commits (CheckpointedAgent._stop and its commit loop).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

from ckptfs.errors import RunStoppedError, UnstorableValueError, error_text
from ckptfs.format import codec
from ckptfs.format.models import TERMINAL_STATUSES, AgentRun, Step
from ckptfs.runtime.execution import Execution
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.values import ValuePlanner

logger = logging.getLogger(__name__)

# What of an AgentRun a commit writes as the run's own fields (the steps go one by one).
_RUN_ONLY = frozenset({"steps"})

# A finished step's fields `Execution.acked` holds, in its order, and the run's totals
# (`Execution.totals`): put back from those, not from the store, whose copies are older.
_ACKED = ("result", "tokens", "cost_usd")
_TOTALS = ("total_tokens", "total_cost_usd")


@dataclass(frozen=True)
class RefusalStop:
    """A stop decided for a refused value, for the agent to record and commit.

    `left_out`: the value could not be put back, so `step` must not go into the stop's commit
    (the store keeps it as its last commit left it; a resume runs it again)."""

    step: Step
    error: RunStoppedError
    left_out: bool = False


def _refusal(run_id: str, step: Step | None, run: AgentRun | None = None) -> UnstorableValueError | None:
    """What a commit would refuse in `step` (and `run`'s own fields), asked as the commit asks
    it: `model_json_of`, then `check_storable` (Execution._refuse_unholdable's order). The
    latter alone let a lone surrogate (`step.title = "bad\\udc80"`) or a Step subclass's field
    through, to be met by the commit as a refusal naming no field: it escaped execute_run with
    the run left "running" and the batch's finished steps lost. A serialisation failure is
    named by its field (`_located`), so that `put_back` can find it."""
    try:
        if step is not None:
            _check(run_id, step.id, step, frozenset())
        if run is not None:
            _check(run_id, None, run, _RUN_ONLY)
    except UnstorableValueError as exc:
        return exc
    return None


def _check(run_id: str, step_id: str | None, model: Step | AgentRun, exclude: frozenset[str]) -> None:
    try:
        ValuePlanner.model_json_of(model, run_id, step_id, exclude=set(exclude) or None)
    except UnstorableValueError as exc:
        raise _located(exc, model, exclude) from None
    ValuePlanner.check_storable(run_id, step_id, model, exclude=exclude)


def _located(exc: UnstorableValueError, model: Step | AgentRun,
             exclude: frozenset[str]) -> UnstorableValueError:
    """`exc`, a refusal of `model`'s JSON as a whole, named by the first field (and, in a dict,
    entry) that fails alone; `exc` itself when it names a field already (a subclass's). Only
    on the way to a stop: one serialisation per field."""
    fields = type(model).model_fields.keys()
    if exc.field in fields:
        return exc
    for name in [n for n in fields if n not in exclude]:  # in order: the first one named
        try:
            ValuePlanner.model_json_of(model, exc.run_id or "", exc.step_id,
                                       exclude=set(fields - {name}))
        except UnstorableValueError as one:
            value = getattr(model, name)
            key = next((k for k, v in value.items() if not _entry_storable(k, v)), None) \
                if isinstance(value, dict) else None
            where = name if key is None else f"{name}.{_printable(key)}"
            return UnstorableValueError(exc.run_id, exc.step_id, where, one.reason)
    return exc


def _printable(key: object) -> str:
    """A key as text any record can hold (the stop's error is committed): a lone surrogate
    becomes its escape."""
    return str(key).encode("utf-8", "backslashreplace").decode()


def _entry_storable(k: object, v: Any) -> bool:
    """Whether a commit would take `k: v` as an entry of a dict field: a str key, a value
    `json_problem` passes, and both serialisable (a lone surrogate is not)."""
    if not isinstance(k, str) or codec.json_problem(v, k) is not None:
        return False
    try:
        to_json({k: v})
    except PydanticSerializationError:
        return False
    return True


def _storable(run_id: str, step: Step | None, run: AgentRun | None = None) -> bool:
    """Whether a commit would take `step` (and `run`'s own fields) as they are."""
    return _refusal(run_id, step, run) is None


def _without_refused(now: dict[Any, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """`now` with each entry a record cannot hold put back to its `stored` value, or dropped."""
    out: dict[str, Any] = {}
    for k, v in now.items():
        if _entry_storable(k, v):
            out[k] = v
        elif k in stored:
            out[k] = stored[k]
    return out


def refused_output_stop(ex: Execution, step: Step, exc: UnstorableValueError) -> RunStoppedError:
    """An executor output the store cannot keep stops the run at its step.

    Retrying would only run the executor again for the same output, and failing the step
    would fence its paid tool results off from a later retry. Stopping keeps them: the step
    goes back to PENDING untouched, the run is "failed" with the reason, the error says
    which field, and resume_run continues at this step with every paid call served from
    the tool log.
    """
    return RunStoppedError(ex.run.run_id, step.id, ex.attempts.get(step.id, 1), exc,
                           f"returned an output the store cannot keep ({exc.field}: {exc.reason})")


def left_value_stop(store: CheckpointStore, ex: Execution, step: Step, tokens0: int,
                    cost0: float) -> RefusalStop | None:
    """The stop at `step` if the executor left in it a value no commit can hold, else None.

    The executor holds the live Step: a NaN or a 5,000-digit int put in `step.metadata`
    (or a NaN assigned to `step.cost_usd`) was only met by the store's commit, which
    refused it out of execute_run with the run left "running" and the stop unsaved, since
    every later commit of the step met the same value. Checked before the step is marked
    done or its spend counted, with the store's own checks (`_refusal`), so a value is
    refused once, by name, and never after its dependants have started on it.

    What is refused is put back (`put_back`), tokens and cost as they were before the
    attempt, so that the stop itself can be committed: the run is "failed" with the
    reason, the step PENDING, and resume_run runs it again. A step whose value cannot be
    put back is left out of the stop's commit: the store keeps it as its last commit left it.
    """
    run_id = ex.run.run_id
    refused = _refusal(run_id, step)
    if refused is None:
        try:
            # The run's own fields too: every commit writes them, so a NaN an executor put in
            # `run.metadata` (a closure over the run) was refused by each commit, the stop's
            # and the flush's included: the error escaped with the run left "running" and,
            # under every-n or milestones, the finished steps not yet committed were lost.
            # Not serialised here, on every finished step: a commit that meets what this
            # misses in them is stopped by `spoiled_stop`.
            ValuePlanner.check_storable(run_id, None, ex.run, exclude=_RUN_ONLY)
        except UnstorableValueError as exc:
            refused = exc
        else:
            return None
    if step.tokens != tokens0:
        step.tokens = tokens0
    if step.cost_usd != cost0:  # NaN != NaN: put back too
        step.cost_usd = cost0
    how = put_back(store, ex, step)
    where = "the step" if refused.step_id is not None else "the run"
    left_out = how is None and not _storable(run_id, step)
    if how is None:
        how = ("could not be put back: " + ("the step is left out of the stop's commit, "
               "as its last commit left it" if left_out else "the stop cannot be committed"))
    return RefusalStop(step, RunStoppedError(
        run_id, step.id, ex.attempts.get(step.id, 1), refused,
        f"left a value in {where} the store cannot keep ({refused.field}: {refused.reason}); "
        f"that field {how}"), left_out)


def spoiled_stop(store: CheckpointStore, ex: Execution, steps: list[Step],
                 exc: UnstorableValueError, charge: Step | None) -> RefusalStop | None:
    """The stop for a commit of `steps` refused for a value put in one of them (or in the run)
    after its check, with that value put back, so the caller can commit the batch again.

    Under every-n or milestones a finished step waits in memory for its commit while other
    executors (and progress callbacks) run, holding the run: a NaN one of them wrote into
    that step was met only by the batch's commit, which raised it out of execute_run with
    the run left "running" and every acknowledged step of the batch lost (the crash
    flush met it too). Now the stop names the step that holds the value, and the batch
    lands with it. A run-level value is charged to `charge`, the step whose commit met it.

    None, for the caller to raise the refusal, when the value is in a step still running
    (its executor meets the error and `left_value_stop` stops it), in the run with no
    step to charge, or no longer there (a record too large: nothing to put back).
    """
    run_id = ex.run.run_id
    left_out = False
    if exc.step_id is None:
        named = charge
        found = _refusal(run_id, None, ex.run) if named is not None else None
        if named is None or found is None:
            return None
        exc = found  # what the commit refused, by field (its JSON's refusal named none)
        how = put_back(store, ex, None)
        if how is None:
            return None
        why = (f"met a value in the run the store cannot keep ({exc.field}: {exc.reason}), "
               f"left there by an executor or a progress callback; that field {how}")
    else:
        named = next((s for s in steps if s.id == exc.step_id), None)
        found = _refusal(run_id, named) if named is not None else None
        if named is None or named.id in ex.running or found is None:
            return None
        exc = found
        how = put_back(store, ex, named, ex.acked.get(named.id))
        if how is None:
            if not _storable(run_id, None, ex.run):
                return None
            left_out = True  # never write what a load could not give back
            how = "could not be put back, so the step was left out of the commit: a resume runs it again"
        why = (f"holds a value the store cannot keep ({exc.field}: {exc.reason}), put in it "
               f"after it was {named.status.value}, by an executor or a progress callback; "
               f"that field {how}")
    # Committed with the batch, a finished step stays finished in the checkpoint: a resume
    # goes on past it. Left out, the store keeps it as its last commit left it, to run again.
    past = named.status in TERMINAL_STATUSES and not left_out
    return RefusalStop(named, RunStoppedError(
        run_id, named.id, ex.attempts.get(named.id, named.attempt_count), exc, why,
        resume="past_step" if past else "at_step"), left_out)


def put_back(store: CheckpointStore, ex: Execution, step: Step | None,
             acked: tuple[str | None, int, float] | None = None) -> str | None:
    """Make `step` and the run's own fields (`step` None: those alone) storable again by
    putting back what the store refuses in them; say how, or None if that cannot be done.

    Where a refused field goes back to, and why there:
    * a dict (the step's or the run's `metadata`): only its refused entries, each to its
      stored value, or removed if it has none. The rest is not the bad value's: under a
      deferred policy it holds what finished steps wrote and no commit has kept yet.
    * a finished step's result, tokens and cost: as acknowledged (`acked`); the run's
      totals as the agent last counted them. The stored ones are older than both.
    * anything else: its stored value (a load, on this error path only: the agent keeps
      no copy of each step per attempt, which every step would pay).
    The load may fail, the store being what fails; that was raised out of execute_run with
    the run left "running" and no stop recorded. Without it a refused entry is removed and
    a field goes to its default, unless it has none or is `dependencies` (an edge
    dropped lets a step run before its dependency): then None.
    """
    run = ex.run
    run_id = run.run_id
    run_fields = AgentRun.model_fields.keys() - _RUN_ONLY
    stored: AgentRun | None = None
    unread: str | None = None
    loaded = False
    for _ in range(len(Step.model_fields) + len(run_fields) + 1):  # each put back once at most
        exc = _refusal(run_id, step, run)
        if exc is not None:
            name = exc.field.split(".", 1)[0].split("[", 1)[0]
            of_run = exc.step_id is None  # a run-level field (see `left_value_stop`)
        else:
            if not loaded:
                return "was put back as last acknowledged"
            if unread is None:
                return "was put back as last saved"
            return f"was put back without the stored run, which could not be read ({unread})"
        model: Step | AgentRun
        if of_run:
            model, fields = run, run_fields
        elif step is not None:
            model, fields = step, set(Step.model_fields)
        else:
            break
        if name not in fields:
            break
        if not of_run and acked is not None and name in _ACKED:
            setattr(model, name, acked[_ACKED.index(name)])
            continue
        if of_run and name in _TOTALS:
            setattr(model, name, ex.totals[_TOTALS.index(name)])
            continue
        if not loaded:
            loaded = True
            try:
                stored = store.load_run(run_id)
            except Exception as err:  # any failure to read: no stored value to go back to
                unread = error_text(err)
                logger.warning("run %s: could not read the stored run to put back a refused "
                               "value: %s", run_id, unread)
            else:
                if stored is None:
                    unread = "the run is not in the store"
        held: Step | AgentRun | None = stored
        if not of_run and step is not None:
            held = stored.steps.get(step.id) if stored is not None else None
        now = getattr(model, name)
        if isinstance(now, dict):
            old = getattr(held, name) if held is not None else {}
            setattr(model, name, _without_refused(now, old if isinstance(old, dict) else {}))
        elif held is not None:
            setattr(model, name, getattr(held, name))
        else:
            info = type(model).model_fields[name]
            if info.is_required() or name == "dependencies":
                break
            setattr(model, name, info.get_default(call_default_factory=True))
    logger.error("run %s: %s: could not put back what the store refuses", run_id,
                 f"step {step.id}" if step is not None else "the run's fields")
    return None


def unsaved_stop(ex: Execution, exc: BaseException, saved: bool) -> RunStoppedError | None:
    """What execute_run raises for `exc` when it met a stop on a value the store refuses on
    the stop's way to the store (the store failing, as it may have for `put_back`'s read).

    The store's error alone named no run and no stop; the stop's RunStoppedError alone
    says the stop is committed. So: the stop, if the crash flush committed it after all,
    else a RunStoppedError saying it is not. None: raise `exc` as it is.
    """
    stop = ex.stop_error
    if (stop is None or exc is stop or not isinstance(exc, Exception)
            or not isinstance(stop.cause, UnstorableValueError)):
        return None
    if saved:
        return stop
    return RunStoppedError(
        ex.run.run_id, stop.step_id, stop.attempts, stop.cause,
        f"was to stop the run ({error_text(stop.cause)}), but the stop could not be committed "
        f"({error_text(exc)}): the store holds the run as of its last commit, not marked "
        "stopped, and without any step finished since")
