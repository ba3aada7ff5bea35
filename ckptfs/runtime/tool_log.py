"""A step's tool log, indexed by call: what a tool runner consults before it pays for a call.

The index is the host's (the agent's or a worker's), shared by every runner of the step, and
filled from the durable log (`CheckpointStore.get_tool_call_history`) the first time a step
asks. Keys are the tool name plus the canonical JSON of the arguments: the same in every
process and Python version, so a replay elsewhere finds the call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptfs.format import codec
from ckptfs.format.models import Step, ToolCall
from ckptfs.store.checkpoint_store import CheckpointStore

# The phase of a call that returned but whose result the store refused (NaN, a set, an int of
# 5,000 digits): it was paid for, and there is nothing to serve. Indexed as an open intent, so a
# replay asks the runner's guard; without this record a resume would pay for the call again,
# and meet the same refusal, on every attempt.
UNKEPT = "unkept"


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

    def add(self, call: ToolCall) -> None:
        key = call.cache_key
        if key is None:
            try:
                key = cache_key(call.tool_name, call.arguments)
            except TypeError:
                return  # a hand-logged call with odd arguments: audit only
        if call.phase in ("intent", UNKEPT):
            if self.open_intents.get(key) != call:
                self.revision += 1
            self.open_intents[key] = call
        elif call.phase == "completed" and call.error is None:
            if self.completed.get(key) != call:
                self.revision += 1
            self.completed[key] = call
            self.open_intents.pop(key, None)



class ToolLogs:
    """The indexes of the steps a host runs, loaded from the store on first use.

    `start_of(run_id, step_id)` says where the current attempt begins in the step's log: a
    fuzzy resume that resets a step fences off the calls before it, which must not be served.
    """

    def __init__(self, store: CheckpointStore, start_of: Callable[[str, str], int]) -> None:
        self.store = store
        self.start_of = start_of
        self.states: dict[tuple[str, str], ToolLogState] = {}

    def state(self, run_id: str, step_id: str) -> ToolLogState:
        key = (run_id, step_id)
        state = self.states.get(key)
        if state is None:
            state = ToolLogState()
            calls = self.store.get_tool_call_history(run_id, step_id)
            for call in calls[self.start_of(run_id, step_id):]:
                state.add(call)
            self.states[key] = state
        return state

    def forget(self, run_id: str, step_id: str) -> None:
        """Drop a step's index: it is read again from the store (others may have logged calls)."""
        self.states.pop((run_id, step_id), None)

    def add(self, run_id: str, step_id: str, call: ToolCall) -> None:
        """Index a call already durable, if the step's index is loaded."""
        state = self.states.get((run_id, step_id))
        if state is not None:
            state.add(call)

    def prior_calls(self, run_id: str, step: Step, start: int) -> list[ToolCall]:
        calls = self.store.get_tool_call_history(run_id, step.id)
        return calls[start:] if start else calls
