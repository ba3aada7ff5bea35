"""A step's tool log, indexed by call: what a tool runner consults before it pays for a call.

The index is the host's (the agent's or a worker's), shared by every runner of the step, and
filled from the durable log (`CheckpointStore.get_tool_call_history`) the first time a step
asks. Keys are the tool name plus the canonical JSON of the arguments: the same in every
process and Python version, so a replay elsewhere finds the call.

The index also knows which calls are in flight in this process (`in_flight`): identical calls
racing from several threads, or asyncio tasks, of one step all missed the log at once and all
paid. The first now makes the call; the others wait for its durable record and are served from
it, as they would have been one after the other.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import StorageUnavailableError
from ckptfs.format import codec
from ckptfs.format.models import Step, ToolCall
from ckptfs.store.checkpoint_store import CheckpointStore

# The phase of a call that returned but whose result the store refused (NaN, a set, an int of
# 5,000 digits): it was paid for, and there is nothing to serve. Indexed as an open intent, so a
# replay asks the runner's guard; without this record a resume would pay for the call again,
# and meet the same refusal, on every attempt.
UNKEPT = "unkept"

logger = logging.getLogger(__name__)

# Phases whose record says a call was paid for: written until durable (`write_paid_record`).
PAID_PHASES = frozenset({"completed", UNKEPT})
# While the store is unavailable a paid record is written again: 0.25 s doubling up to 8 s,
# 20 tries: 1 to 2 minutes of waits, jittered to 50-100% (each try is the storage's own retries too).
PAID_WRITE_ROUNDS, PAID_WRITE_BACKOFF, PAID_WRITE_MAX_BACKOFF = 20, 0.25, 8.0


def write_paid_record(write: Callable[[], object], what: str,
                      landed: Callable[[], bool] | None = None,
                      rng: random.Random | None = None) -> None:
    """`write()` the record of a paid call, again while the store is unavailable (a burst of
    503s, a dropped connection, past the storage's own retries), for one to two minutes.

    The call was paid for. Given up on at once, the StorageUnavailableError went up through the
    executor as the attempt's failure, and the retry paid the call again with the process alive
    (a review: a 503 burst on one PUT; the agent and a Worker alike). A write that failed may
    have landed with its reply lost: `landed()`, asked before each new try, says so (a Worker
    catches up and looks for the record; the agent's store rebases and skips a call already
    logged, so it needs none). Errors other than unavailability go up at once.
    """
    rng = rng or random.Random()
    for rounds in range(PAID_WRITE_ROUNDS):
        try:
            write()
            return
        except StorageUnavailableError as exc:
            if rounds == PAID_WRITE_ROUNDS - 1:
                raise
            delay = min(PAID_WRITE_BACKOFF * 2 ** rounds, PAID_WRITE_MAX_BACKOFF)
            logger.warning("%s: the record of a paid call was not written (%s); trying again in "
                           "%.2fs", what, exc, delay)
        time.sleep(delay * (0.5 + rng.random() / 2))
        if landed is None:
            continue
        try:
            if landed():
                logger.info("%s: the record of the paid call had landed", what)
                return
        except StorageUnavailableError:
            continue



def canonical_json(arguments: Mapping[str, Any]) -> str:
    """Arguments as JSON with sorted keys and no spaces: equal arguments give equal text.

    Refused (TypeError naming the argument) unless they are values the store keeps and a load
    gives back equal: `json.dumps` alone takes a tuple, an int or bool key and a lone
    surrogate, which the tool log's record then refuses. That refusal came only after the
    call, when the paid result (and the record saying it was paid, which carries the same
    arguments) could not be logged, so every replay paid again. Arguments no stored call
    ever had change no stored cache key.
    """
    got = codec.json_problem(arguments, "arguments")
    if got is not None:
        raise TypeError(f"tool arguments must be JSON values a load gives back equal: {got.path}: "
                        f"{got.reason}")
    try:
        text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool arguments must be JSON values (str keys, finite numbers): {exc}") from None
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise TypeError(f"tool arguments must be JSON values: {_surrogate_path(arguments, 'arguments')}: "
                            "a lone surrogate, which has no UTF-8 (decode the text with "
                            "errors='replace', or keep the bytes as an artifact)") from None
    return text


def _surrogate_path(value: Any, path: str) -> str:
    """Where the first string that UTF-8 cannot encode is (a key or a value), for the message."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode()
                except UnicodeEncodeError:
                    return p
        elif isinstance(v, Mapping):
            for k, x in reversed(list(v.items())):
                if isinstance(k, str) and not k.isascii():
                    try:
                        k.encode()
                    except UnicodeEncodeError:
                        return f"{p} (a key)"
                stack.append((x, f"{p}.{k}"))
        elif isinstance(v, list):
            stack.extend((x, f"{p}[{i}]") for i, x in reversed(list(enumerate(v))))
    return path


def cache_key(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """sha256 of the tool name and the canonical arguments; stable across processes."""
    return hashlib.sha256(f"{tool_name}\x00{canonical_json(arguments)}".encode()).hexdigest()


def idempotency_key(run_id: str, step_id: str, index: int, key: str) -> str:
    """The key an API may deduplicate on: the same call at the same place in a replay gives the same key."""
    raw = f"{run_id}\x00{step_id}\x00{index}\x00{key}".encode()
    return "ckpt-" + hashlib.sha256(raw).hexdigest()[:32]


@dataclass(eq=False)  # found by identity: in a context's holds and in the waits between them
class _Flight:
    """A call being made: who makes it, and what its waiters wait on."""

    thread: int
    task: object | None
    done: Future[None] = field(default_factory=Future)


# The calls the current context holds, and those its starter held: a task the holder creates
# (`create_task`, `gather`, 3.11's `wait_for`) and `asyncio.to_thread` copy the context. Such a
# helper making the holder's own call must not wait for the holder, which is waiting for it.
# (A thread started by hand or a ThreadPoolExecutor copies no context: there it still waits.)
_HELD: contextvars.ContextVar[tuple[_Flight, ...]] = contextvars.ContextVar(
    "ckptfs_tool_calls_held", default=())

# Who waits for whom, across every step's index: a held call -> the calls its holder (or a
# helper of it) waits for. Thread 1 holding a and calling b while thread 2 holds b and calls a
# waited for each other forever; the second to arrive now sees the cycle and goes on without
# waiting, as before the hold (both pay the inner call). Taken after a state's mutex, never before.
_WAITS_LOCK = threading.Lock()
_WAITS: dict[_Flight, list[_Flight]] = {}


def _closes_cycle(flight: _Flight, held: tuple[_Flight, ...]) -> bool:
    """Whether `flight`'s holder waits, through any chain of holders, for a call in `held`."""
    seen: set[int] = set()
    stack = [flight]
    while stack:
        f = stack.pop()
        if f in held:
            return True
        if id(f) not in seen:
            seen.add(id(f))
            stack.extend(_WAITS.get(f, ()))
    return False


@dataclass
class _Wait:
    """A caller waiting for `flight`, recorded as a wait of each call it holds (`_WAITS`)."""

    flight: _Flight
    held: tuple[_Flight, ...]

    def leave(self) -> None:
        with _WAITS_LOCK:
            for h in self.held:
                waits = _WAITS.get(h)
                if waits is not None and self.flight in waits:
                    waits.remove(self.flight)
                    if not waits:
                        del _WAITS[h]


@dataclass
class ToolLogState:
    """One step's tool log, indexed: completed results by cache key, intents still open.

    `revision` counts the changes, so a runner can tell whether records logged elsewhere
    arrived while it checked its lease (and look the call up again before paying for it).
    Adding a record already indexed changes nothing.
    """

    completed: dict[str, ToolCall] = field(default_factory=dict)
    open_intents: dict[str, ToolCall] = field(default_factory=dict)
    revision: int = 0
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _flights: dict[str, _Flight] = field(default_factory=dict, repr=False, compare=False)

    def add(self, call: ToolCall) -> None:
        key = call.cache_key
        if key is None:
            try:
                key = cache_key(call.tool_name, call.arguments)
            except TypeError:
                return  # a hand-logged call with odd arguments: audit only
        with self._mutex:  # records arrive from every thread that logs a call of the step
            if call.phase in ("intent", UNKEPT):
                if self.open_intents.get(key) != call:
                    self.revision += 1
                self.open_intents[key] = call
            elif call.phase == "completed" and call.error is None:
                if self.completed.get(key) != call:
                    self.revision += 1
                self.completed[key] = call
                self.open_intents.pop(key, None)

    @contextmanager
    def in_flight(self, key: str) -> Iterator[None]:
        """Hold the call `key` of this step while looking it up, paying for it and logging it.

        A thread arriving meanwhile waits here until the holder lets go, then looks the log up
        itself: served if the call completed, its own call if it failed (errors are not
        cached), the guard or UnconfirmedActionError if its result was refused, exactly as one
        after the other. Only identical calls wait for each other. A caller that waiting would
        never let through does not wait: on the holder's own thread (the tool calling itself
        through a runner, or a blocking call on an event loop whose task holds the call), in a
        task or `to_thread` the holder started (its context carries the hold), or one whose
        holder waits, through any chain, for a call this caller holds (a->b against b->a).
        """
        while True:
            got = self._claim(key, None)
            if not isinstance(got, _Wait):
                break
            try:
                got.flight.done.result()
            finally:
                got.leave()
        token = None if got is None else _HELD.set((*_HELD.get(), got))
        try:
            yield
        finally:
            if got is not None:
                self._release(key, got, token)

    @asynccontextmanager
    async def ain_flight(self, key: str) -> AsyncIterator[None]:
        """`in_flight` for a task: it awaits the holder (a thread or another task) without
        blocking its loop. A waiter cancelled meanwhile just leaves; the holder is undisturbed."""
        task = asyncio.current_task()
        while True:
            got = self._claim(key, task)
            if not isinstance(got, _Wait):
                break
            try:
                # shielded: cancelling this waiter must not cancel the future the others wait on
                await asyncio.shield(asyncio.wrap_future(got.flight.done))
            finally:
                got.leave()
        token = None if got is None else _HELD.set((*_HELD.get(), got))
        try:
            yield
        finally:
            if got is not None:
                self._release(key, got, token)

    def _claim(self, key: str, task: object | None) -> _Flight | _Wait | None:
        """A flight: the caller holds the call now. None: it goes on without holding it (see
        `in_flight` for who). A wait: done once the holder lets go; wait, then claim again."""
        me = threading.get_ident()
        with self._mutex:
            flight = self._flights.get(key)
            if flight is None:
                flight = self._flights[key] = _Flight(me, task)
                return flight
            if flight.thread == me and (task is None or flight.task is None or flight.task is task):
                return None
            held = _HELD.get()
            with _WAITS_LOCK:
                if _closes_cycle(flight, held):
                    return None
                for h in held:
                    _WAITS.setdefault(h, []).append(flight)
            return _Wait(flight, held)

    def _release(self, key: str, flight: _Flight,
                 token: contextvars.Token[tuple[_Flight, ...]] | None) -> None:
        with self._mutex:
            if self._flights.get(key) is flight:
                del self._flights[key]
        with _WAITS_LOCK:
            _WAITS.pop(flight, None)  # a helper of the holder may still be recorded waiting
        if token is not None:
            with suppress(ValueError, RuntimeError):  # let go in another context (closed by GC)
                _HELD.reset(token)
        flight.done.set_result(None)


class ToolLogs:
    """The indexes of the steps a host runs, loaded from the store on first use.

    `start_of(run_id, step_id)` says where the current attempt begins in the step's log: a
    fuzzy resume that resets a step fences off the calls before it, which must not be served.
    """

    def __init__(self, store: CheckpointStore, start_of: Callable[[str, str], int]) -> None:
        self.store = store
        self.start_of = start_of
        self.states: dict[tuple[str, str], ToolLogState] = {}
        self._lock = threading.Lock()
        # Forgotten indexes with calls still in flight: the next index of the step shares their
        # holds (see `forget`).
        self._flying: dict[tuple[str, str], ToolLogState] = {}

    def state(self, run_id: str, step_id: str) -> ToolLogState:
        """The step's one index. Threads loading it at once each read the log (no lock held
        over the read), but all keep the first one stored: two indexes of one step made
        each thread's in-flight calls invisible to the other, and both paid."""
        key = (run_id, step_id)
        state = self.states.get(key)
        if state is None:
            with self._lock:
                old = self._flying.pop(key, None)
            # the holds of a forgotten index, with the mutex that guards them
            state = ToolLogState() if old is None else ToolLogState(_mutex=old._mutex, _flights=old._flights)
            calls = self.store.get_tool_call_history(run_id, step_id, fresh=False)
            for call in calls[self.start_of(run_id, step_id):]:
                state.add(call)
            with self._lock:
                state = self.states.setdefault(key, state)
        return state

    def forget(self, run_id: str, step_id: str) -> None:
        """Drop a step's index: it is read again from the store (others may have logged calls).

        Calls in flight outlive it: an attempt that failed (`asyncio.gather` raising on a
        sibling's error) or returned with a thread or task still paying for a call is forgotten
        at once, and the retry's identical call met a new index without the hold and paid
        beside it. The next index of the step takes over the holds; the holder's record goes
        to whichever index is loaded when it is durable, or is read from the store.
        """
        key = (run_id, step_id)
        with self._lock:
            state = self.states.pop(key, None)
            if state is not None:
                with state._mutex:
                    if state._flights:
                        self._flying[key] = state

    def add(self, run_id: str, step_id: str, call: ToolCall) -> None:
        """Index a call already durable, if the step's index is loaded."""
        state = self.states.get((run_id, step_id))
        if state is not None:
            state.add(call)

    def prior_calls(self, run_id: str, step: Step, start: int) -> list[ToolCall]:
        calls = self.store.get_tool_call_history(run_id, step.id, fresh=False)
        return calls[start:] if start else calls
