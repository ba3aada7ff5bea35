"""Tool calls that survive a crash: served from the durable log on replay, never run twice.

`IdempotentToolRunner.run(tool_name, arguments, fn)` (the seed's API) keys each call by the
tool name plus the canonical JSON of its arguments, the same in every process and Python
version. A successful result is logged durably (`CheckpointStore.log_tool_call`) before it
is returned, so a crash one instruction later does not repeat the call; errors are logged
for the audit trail but never cached.

Actions that must not happen twice (an email, a payment) pass `irreversible=True`: an
intent record is made durable before the call and a completion record after it. On replay,
an intent without a completion means the process died in between; the runner then asks the
caller's `guard` (which checks the outside world: was the email sent?) instead of guessing.
Every call also gets a deterministic idempotency key (run, step, call index, call) that a
tool can hand to an API that deduplicates on one.

Threads and tasks of one process: identical calls of a step (same tool, same arguments) made at
once, from one runner or several, are paid for once. The first caller holds the call until its
record is durable; the others wait for it and are served from the log (`ToolLogState.in_flight`),
or, if it failed, make their own call, as they would have one after the other. Distinct calls
never wait for each other. The call index is the number of calls the runner was asked for
before this one, waiters included: for a runner shared by threads that is arrival order, which
a replay need not repeat, so the key of a call that left no record may differ on replay. A
runner per thread (or per call, `agent.tools()`) numbers only its own thread's calls; and an
irreversible call's intent pins its key, which a replay reuses.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import reprlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptfs.errors import CkptfsError, UnstorableResultError, UnstorableValueError, error_text
from ckptfs.format.models import ToolCall
from ckptfs.runtime.host import ToolHost
from ckptfs.runtime.tool_log import UNKEPT, ToolLogState, cache_key, canonical_json, idempotency_key

__all__ = ["UNKEPT", "Done", "IdempotentToolRunner", "ToolLogState", "UnconfirmedActionError", "cache_key",
           "canonical_json", "idempotency_key"]

logger = logging.getLogger(__name__)

# The key that stands in for the arguments of an `UNKEPT` record the store refused with them.
ARGUMENTS_NOT_KEPT = "ckptfs.arguments_not_kept"


class UnconfirmedActionError(CkptfsError):
    """A call may have taken effect, or did, and the log cannot give back its outcome: an
    irreversible call's intent with no completion (a crash mid-call), or any call whose result
    the store refused to keep (`UNKEPT`). No guard was given to decide, or it did not (it
    raised, or answered something other than its four answers), so it is not repeated."""

    def __init__(self, tool_name: str, idempotency_key: str, detail: str | None = None) -> None:
        self.tool_name = tool_name
        self.idempotency_key = idempotency_key
        super().__init__(detail or (
            f"tool {tool_name!r} (idempotency key {idempotency_key}) recorded an intent but no "
            "completion: the process stopped mid-call. Pass guard= to check whether the action "
            "took effect; refusing to call it again blindly"))



@dataclass(frozen=True)
class Done:
    """What a guard returns when the action already took effect; `result` stands for its result."""

    result: Any = None


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short_repr(value: object) -> str:
    """A guard's answer as an error can quote it: a fetched record can be megabytes, and a
    repr can raise (an int past Python's digit limit, a broken __repr__)."""
    try:
        return _clip(reprlib.repr(value))
    except Exception:
        return f"<{type(value).__name__} that cannot be shown>"


class IdempotentToolRunner:
    """Runs a step's tool calls through the durable log (seed API: `run(tool_name, arguments, fn)`).

    Build it as the seed does, `IdempotentToolRunner(agent, run_id, step_id)`, or inside an
    executor with `agent.tools()`. Runners of the same step share one index of the log, so
    creating one per call is fine, and so is sharing one between threads: identical calls
    racing are paid for once (see the module's docstring).
    """

    def __init__(self, agent: ToolHost, run_id: str, step_id: str) -> None:
        self.agent = agent
        self.run_id = run_id
        self.step_id = step_id
        self._index = 0
        self.real_calls = 0
        self.cache_hits = 0
        self._counting = threading.Lock()  # `+=` is not atomic: a shared runner's threads lost counts

    @property
    def _state(self) -> ToolLogState:
        return self.agent.tool_state(self.run_id, self.step_id)

    def _prepare(self, tool_name: str, arguments: Mapping[str, Any]) -> tuple[str, str]:
        if not isinstance(tool_name, str) or not tool_name:
            raise ValueError("tool_name must be a non-empty string")
        if not isinstance(arguments, Mapping):
            raise TypeError(f"arguments of tool {tool_name!r} must be a dict, got {type(arguments).__name__}")
        try:
            tool_name.encode()
        except UnicodeEncodeError:
            raise ValueError(f"tool_name {tool_name!r} holds a lone surrogate, which has no UTF-8: "
                             "the tool log could not store it") from None
        try:
            key = cache_key(tool_name, arguments)
            # Nesting too deep for a record (pydantic serialises 254 levels) passes canonical
            # JSON; after the call its record was refused, and the `unkept` one with the same
            # arguments too: nothing said the call was paid, so every replay paid again.
            try:
                ToolCall(id="-", tool_name=tool_name, arguments=dict(arguments)).model_dump_json()
            except ValueError as exc:  # pydantic's serialisation error
                raise TypeError(f"tool arguments cannot be stored in a record ({exc})") from None
        except TypeError as exc:  # before the call: refused here, nothing is paid or written
            raise TypeError(f"tool {tool_name!r} of step {self.step_id!r}: {exc}; refused before "
                            "the call, nothing was written") from None
        with self._counting:  # two threads taking one index gave two calls one key
            index = self._index
            self._index += 1
        return key, idempotency_key(self.run_id, self.step_id, index, key)

    def _record(self, tool_name: str, arguments: Mapping[str, Any], key: str, idem: str, phase: str,
                result: Any = None, error: str | None = None, started: float | None = None) -> ToolCall:
        call = ToolCall(id=idem, tool_name=tool_name, arguments=dict(arguments), result=result,
                        error=error, cache_key=key, idempotency_key=idem, phase=phase,
                        duration_ms=None if started is None else (time.perf_counter() - started) * 1000)
        try:
            call.model_dump_json()
        except Exception as exc:  # pydantic raises its own serialisation errors
            # arguments were checked before the call (`_prepare`): this is the result
            raise UnstorableResultError(self.run_id, self.step_id, f"tool {tool_name!r} result",
                                        f"cannot be stored as JSON ({exc})") from exc
        return call

    def _replay(self, tool_name: str, key: str, irreversible: bool,
                guard: Callable[[ToolCall], object] | None) -> tuple[bool, Any, str | None]:
        """(hit, result, idempotency key to reuse) from the log, asking the guard if needed."""
        got = self._lookup(tool_name, key, irreversible, guard)
        if not isinstance(got, ToolCall):
            return got
        assert guard is not None  # _lookup raised without one
        return self._decided(tool_name, got, *self._call_guard(guard, got, asynchronous=False))

    async def _areplay(self, tool_name: str, key: str, irreversible: bool,
                       guard: Callable[[ToolCall], object] | None) -> tuple[bool, Any, str | None]:
        """`_replay` for `arun`, whose guard may be a coroutine function (it checks the world
        with the same async client the tool uses): its answer is awaited, not taken for one."""
        got = self._lookup(tool_name, key, irreversible, guard)
        if not isinstance(got, ToolCall):
            return got
        assert guard is not None
        decision, cause = self._call_guard(guard, got, asynchronous=True)
        if cause is None and inspect.isawaitable(decision):
            try:
                decision = await decision
            except Exception as exc:
                decision, cause = None, exc
        return self._decided(tool_name, got, decision, cause)

    def _lookup(self, tool_name: str, key: str, irreversible: bool,
                guard: Callable[[ToolCall], object] | None) -> tuple[bool, Any, str | None] | ToolCall:
        """What the log answers alone, or the open intent a guard must decide."""
        state = self._state
        hit = state.completed.get(key)
        if hit is not None:
            with self._counting:
                self.cache_hits += 1
            logger.debug("run %s step %s: %s served from the tool log", self.run_id, self.step_id, tool_name)
            return True, hit.result, None
        intent = state.open_intents.get(key)
        if intent is None or (intent.phase != UNKEPT and not irreversible):
            return False, None, None
        reuse = intent.idempotency_key
        if guard is None:
            if intent.phase == UNKEPT:
                raise UnconfirmedActionError(tool_name, reuse or "?", (
                    f"tool {tool_name!r} (idempotency key {reuse}) was called in an earlier "
                    f"attempt, but the store could not keep its result ({intent.error}); it is "
                    "not called again blindly. Make the tool return values the store can keep, "
                    "and pass guard= to decide: Done(result) with a result you have or can fetch "
                    "by the idempotency key, False to pay for the call again"))
            raise UnconfirmedActionError(tool_name, reuse or "?")
        return intent

    def _decided(self, tool_name: str, intent: ToolCall, decision: object,
                 cause: Exception | None) -> tuple[bool, Any, str | None]:
        reuse = intent.idempotency_key
        done = self._verdict(decision, cause, tool_name, reuse or "?")
        if done is None:
            logger.warning("run %s step %s: %s had an intent but no completion; the guard says it "
                           "did not happen: calling again with key %s", self.run_id, self.step_id,
                           tool_name, reuse)
            return False, None, reuse
        logger.info("run %s step %s: %s had an intent but no completion; the guard says it took "
                    "effect: not calling again", self.run_id, self.step_id, tool_name)
        return True, done.result, reuse

    @staticmethod
    def _call_guard(guard: Callable[[ToolCall], object], intent: ToolCall, *,
                    asynchronous: bool) -> tuple[object, Exception | None]:
        """(answer, None) or (None, what it raised). A coroutine in `run` is closed unawaited:
        it cannot be awaited there, and left alone it warns 'never awaited' at exit."""
        try:
            decision = guard(intent)
        except Exception as exc:
            return None, exc
        if not asynchronous and inspect.iscoroutine(decision):
            decision.close()
            return None, TypeError("it is a coroutine function, which only arun can await")
        return decision, None

    def _verdict(self, decision: object, cause: Exception | None, tool_name: str,
                 key: str) -> Done | None:
        """The guard's verdict, or UnconfirmedActionError when it gives none.

        A guard that raises, or answers with anything but Done(result), True, False or None,
        leaves the outcome as unknown as no guard at all, so it stops the run the same way.
        Failing the step instead (as its TypeError did) skipped the dependants and left the
        run to be mended by `resume_run(retry_failed=True)`; retrying only asks the same guard
        again.
        """
        if cause is not None:
            got = f"raised {_clip(error_text(cause), 300)}"
        elif isinstance(decision, Done):
            return decision
        elif decision is True:
            return Done(None)
        elif decision is None or decision is False:
            return None
        else:
            got = f"returned {type(decision).__name__} {_short_repr(decision)}"
        raise UnconfirmedActionError(tool_name, key, (
            f"tool {tool_name!r} of step {self.step_id!r} (idempotency key {key}) may have taken "
            f"effect, and its guard {got}. A guard must return Done(result) or True if the action "
            "took effect, False or None if it did not (and raise only if it cannot tell); the tool "
            "is not called again blindly: mend the guard, or what it checks, and resume")) from cause

    def _call_args(self, arguments: Mapping[str, Any], idem: str, key_arg: str | None) -> dict[str, Any]:
        kwargs = dict(arguments)
        if key_arg is not None:
            kwargs[key_arg] = idem
        return kwargs

    def run(self, tool_name: str, arguments: Mapping[str, Any],
            fn: Callable[..., Any] | None = None, *,
            irreversible: bool = False, guard: Callable[[ToolCall], object] | None = None,
            checkpoint: bool = False, idempotency_key_arg: str | None = None,
            actual_tool_fn: Callable[..., Any] | None = None) -> Any:
        """Call `fn(**arguments)` unless this step already did; the result is durable on return.

        actual_tool_fn: the seed article's name for `fn`; its users pass it by keyword.
        irreversible: write a durable intent first; on replay an open intent goes to `guard`
            (returns Done(result)/True if the action took effect, False/None to call again);
            without a guard, or when it raises or answers anything else, an open intent
            raises UnconfirmedActionError.
        checkpoint: commit the run right after this call, whatever the checkpoint policy
            (for an expensive call after many cheap, not yet committed steps).
        idempotency_key_arg: pass the call's idempotency key to `fn` under this name.
        """
        if (fn is None) == (actual_tool_fn is None):
            raise TypeError("IdempotentToolRunner.run() takes the tool as `fn` (or the seed "
                            "article's `actual_tool_fn`): exactly one of them")
        fn = fn if fn is not None else actual_tool_fn
        assert fn is not None
        key, idem = self._prepare(tool_name, arguments)
        with self._state.in_flight(key):  # an identical call in flight: wait for its record
            paid, result = self._run_held(tool_name, arguments, fn, key, idem, irreversible, guard,
                                          idempotency_key_arg)
        if paid:  # the record is durable and indexed: waiters need not wait for a commit too
            self.agent.after_tool_call(self.run_id, self.step_id, checkpoint)
        return result

    def _run_held(self, tool_name: str, arguments: Mapping[str, Any], fn: Callable[..., Any],
                  key: str, idem: str, irreversible: bool, guard: Callable[[ToolCall], object] | None,
                  idempotency_key_arg: str | None) -> tuple[bool, Any]:
        """(whether the call was paid for here, its result), holding the call `key`."""
        hit, result, reuse = self._replay(tool_name, key, irreversible, guard)
        if not hit:
            seen = self._state.revision
            self.agent.before_tool_call(self.run_id, self.step_id)
            if self._state.revision != seen:  # records logged elsewhere came in: look again
                hit, result, reuse = self._replay(tool_name, key, irreversible, guard)
        idem = reuse or idem
        if hit:
            if reuse is not None:  # the guard confirmed it: close the intent
                self._log(self._record(tool_name, arguments, key, idem, "completed", result))
            return False, result
        if irreversible and reuse is None:
            self._log(self._record(tool_name, arguments, key, idem, "intent"))
        started = time.perf_counter()
        try:
            result = fn(**self._call_args(arguments, idem, idempotency_key_arg))
        except Exception as exc:
            self._log(self._record(tool_name, arguments, key, idem, "failed",
                                   error=error_text(exc), started=started))
            raise
        with self._counting:
            self.real_calls += 1
        try:
            self._log(self._record(tool_name, arguments, key, idem, "completed", result, started=started))
        except (TypeError, UnstorableValueError) as exc:
            unkept = self._unkept(tool_name, arguments, key, idem, exc, started)
            try:
                self._log(unkept)
            except UnstorableValueError:  # the arguments are what the store refuses (their size)
                self._log(self._bare(unkept))
            raise
        return True, result

    async def arun(self, tool_name: str, arguments: Mapping[str, Any], fn: Callable[..., Any], *,
                   irreversible: bool = False, guard: Callable[[ToolCall], object] | None = None,
                   checkpoint: bool = False, idempotency_key_arg: str | None = None) -> Any:
        """`run` for async code: `fn` may be a coroutine function; store writes leave the loop."""
        key, idem = self._prepare(tool_name, arguments)
        async with self._state.ain_flight(key):
            paid, result = await self._arun_held(tool_name, arguments, fn, key, idem, irreversible,
                                                 guard, idempotency_key_arg)
        if paid:
            await self.agent.aafter_tool_call(self.run_id, self.step_id, checkpoint)
        return result

    async def _arun_held(self, tool_name: str, arguments: Mapping[str, Any], fn: Callable[..., Any],
                         key: str, idem: str, irreversible: bool,
                         guard: Callable[[ToolCall], object] | None,
                         idempotency_key_arg: str | None) -> tuple[bool, Any]:
        """`_run_held` for `arun`."""
        hit, result, reuse = await self._areplay(tool_name, key, irreversible, guard)
        if not hit:
            seen = self._state.revision
            await self.agent.abefore_tool_call(self.run_id, self.step_id)
            if self._state.revision != seen:
                hit, result, reuse = await self._areplay(tool_name, key, irreversible, guard)
        idem = reuse or idem
        if hit:
            if reuse is not None:
                await self._alog(self._record(tool_name, arguments, key, idem, "completed", result))
            return False, result
        if irreversible and reuse is None:
            await self._alog(self._record(tool_name, arguments, key, idem, "intent"))
        started = time.perf_counter()
        try:
            result = fn(**self._call_args(arguments, idem, idempotency_key_arg))
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            await self._alog(self._record(tool_name, arguments, key, idem, "failed",
                                          error=error_text(exc), started=started))
            raise
        with self._counting:
            self.real_calls += 1
        try:
            await self._alog(self._record(tool_name, arguments, key, idem, "completed", result,
                                          started=started))
        except (TypeError, UnstorableValueError) as exc:
            unkept = self._unkept(tool_name, arguments, key, idem, exc, started)
            try:
                await self._alog(unkept)
            except UnstorableValueError:
                await self._alog(self._bare(unkept))
            raise
        return True, result

    def _unkept(self, tool_name: str, arguments: Mapping[str, Any], key: str, idem: str,
                exc: Exception, started: float) -> ToolCall:
        """The durable word that a call was paid for though its result was refused (`UNKEPT`)."""
        logger.warning("run %s step %s: %s returned a result the store cannot keep (%s); logged as "
                       "paid, so a replay asks a guard instead of calling it again", self.run_id,
                       self.step_id, tool_name, exc)
        return self._record(tool_name, arguments, key, idem, UNKEPT,
                            error=f"result not kept: {error_text(exc)}", started=started)

    @staticmethod
    def _bare(unkept: ToolCall) -> ToolCall:
        """The `UNKEPT` record without the arguments, for when they are what the store refuses.

        Arguments checked before the call can still be refused by size alone (a record over
        the store's `max_decoded_bytes`), and the record saying the call was paid carries them
        too: refused as well, nothing said the call was paid and every replay paid again. The
        index finds a call by its cache key, which the record keeps, so it needs no arguments.
        """
        note = {ARGUMENTS_NOT_KEPT: "the arguments were too large for the store to keep"}
        return unkept.model_copy(update={"arguments": note})

    def _log(self, call: ToolCall) -> None:
        self.agent.record_tool_call(self.run_id, self.step_id, call)

    async def _alog(self, call: ToolCall) -> None:
        """`_log` for `arun`, finished even if the task is cancelled meanwhile, then cancelled.

        The host's write cannot be stopped midway (the agent shields it), but a cancel used to
        end the wait at once: the record became durable without being indexed, and the holder
        let go of the call before it was, so a waiting identical call (and any later one) paid
        again. The write and its indexing now run to the end in a task of their own.
        """
        write = asyncio.ensure_future(self.agent.arecord_tool_call(self.run_id, self.step_id, call))
        cancelled = False
        while not write.done():
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                if write.cancelled():  # the write itself was cancelled (the loop shutting down)
                    raise
                cancelled = True
        write.result()
        if cancelled:
            raise asyncio.CancelledError
