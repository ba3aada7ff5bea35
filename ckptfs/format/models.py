"""The agent-run model: plain pydantic v2 types that every other layer speaks.

Names, fields and methods follow the seed article so its users' code keeps working;
what is new is validation (ids that are safe as storage keys, a graph that can run)
and a few optional fields the runtime fills (attempt limits, tokens, idempotency keys).
Serialisation is pydantic's JSON only: a checkpoint never executes code when loaded.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ckptfs.errors import InvalidIdError

MAX_ID_LENGTH = 200
_ID_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f/\\]")


def validate_id(value: str, what: str = "id") -> str:
    """Refuse ids that could escape or confuse a storage key, before any path is built.

    Ids become path segments (`runs/<run_id>/...`), so `/`, `\\`, `..`, control characters,
    a leading dot and unbounded length are refused with an error naming the id.
    """
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(f"{what} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
    if _ID_FORBIDDEN.search(value):
        raise InvalidIdError(f"{what} {value!r} contains '/', '\\' or a control character")
    if value.startswith(".") or ".." in value:
        raise InvalidIdError(f"{what} {value!r} must not start with '.' or contain '..'")
    if value != value.strip():
        raise InvalidIdError(f"{what} {value!r} must not start or end with white space")
    return value


def _short_uuid() -> str:
    return uuid.uuid4().hex[:12]


class StepStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


TERMINAL_STATUSES = frozenset({StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED})


class ArtifactRef(BaseModel):
    """A large value stored once under its sha256; snapshots keep this and a summary."""

    model_config = ConfigDict(frozen=True)

    uri: str  # key relative to the store root: artifacts/sha256/<aa>/<sha256>
    sha256: str
    size: int
    media_type: str = "application/octet-stream"
    summary: str = ""


class ToolCall(BaseModel):
    """Record of a single tool invocation (seed shape, plus idempotency bookkeeping).

    `phase` is "completed" for an ordinary finished call, "intent" for the durable
    record written before an irreversible action, and "failed" when the call raised.
    """

    id: str = Field(default_factory=_short_uuid)
    tool_name: str
    arguments: dict[str, Any]
    result: Any | None = None
    error: str | None = None
    timestamp: float = Field(default_factory=time.time)
    duration_ms: float | None = None
    cache_key: str | None = None
    idempotency_key: str | None = None
    phase: str = "completed"


class Step(BaseModel):
    """A unit of work within the agent run.

    Assignments are validated (`step.status = "completed"` becomes the enum), because the
    runtime and the store read these fields on every commit and a stray type would only
    surface later, at load time, as a corrupt checkpoint.
    """

    model_config = ConfigDict(validate_assignment=True)

    id: str
    title: str
    description: str = ""
    status: StepStatus = StepStatus.PENDING
    result: str | None = None
    error: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    dependencies: list[str] = Field(default_factory=list)
    started_at: float | None = None
    completed_at: float | None = None
    attempt_count: int = 0
    milestone: bool = False
    tokens: int = 0
    cost_usd: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Generation of the lease this step was last committed under (0: no lease, one process).
    # The store refuses a leased commit with a lower one: the fencing token of leases.py.
    lease_generation: int = Field(default=0, ge=0)

    @field_validator("id")
    @classmethod
    def _check_id(cls, v: str) -> str:
        return validate_id(v, "step id")

    def is_ready(self, completed_ids: set[str]) -> bool:
        return all(dep in completed_ids for dep in self.dependencies)

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is not None and self.completed_at is not None:
            return self.completed_at - self.started_at
        return None


class AgentRun(BaseModel):
    """Complete state of an agent execution run."""

    run_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    goal: str
    steps: dict[str, Step] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    status: str = "running"  # running, completed, completed_with_errors, failed, paused, superseded
    total_cost_usd: float = 0.0
    total_tokens: int = 0
    replan_count: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("run_id")
    @classmethod
    def _check_run_id(cls, v: str) -> str:
        return validate_id(v, "run id")

    def add_step(self, step: Step) -> None:
        self.steps[step.id] = step
        self.updated_at = time.time()

    def get_ready_steps(self) -> list[Step]:
        completed = {sid for sid, s in self.steps.items() if s.status == StepStatus.COMPLETED}
        return [
            s
            for s in self.steps.values()
            if s.status == StepStatus.PENDING and s.is_ready(completed)
        ]

    def is_complete(self) -> bool:
        return all(s.status in TERMINAL_STATUSES for s in self.steps.values())

    @property
    def completed_count(self) -> int:
        return sum(1 for s in self.steps.values() if s.status == StepStatus.COMPLETED)

    @property
    def failed_count(self) -> int:
        return sum(1 for s in self.steps.values() if s.status == StepStatus.FAILED)


def find_cycle(deps: Mapping[str, Sequence[str]], roots: Sequence[str] | None = None) -> str | None:
    """A step id on a dependency cycle reachable from `roots` (all ids if None), else None.

    Iterative DFS with white/grey/black colouring: O(V+E), no recursion limit, and plain
    containers only, because the commit path calls it and must not build models.
    """
    colour: dict[str, int] = {}
    for root in deps if roots is None else roots:
        if root not in deps or colour.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        colour[root] = 1
        while stack:
            node, i = stack[-1]
            edges = deps.get(node, ())
            if i < len(edges):
                stack[-1] = (node, i + 1)
                nxt = edges[i]
                c = colour.get(nxt, 0)
                if c == 1:
                    return nxt
                if c == 0 and nxt in deps:
                    colour[nxt] = 1
                    stack.append((nxt, 0))
            else:
                colour[node] = 2
                stack.pop()
    return None


def graph_problems(steps: dict[str, Step], only: set[str] | None = None) -> list[str]:
    """What makes a step graph unrunnable: unknown dependencies, cycles, a result-less COMPLETED.

    `only` limits the per-step checks to those ids (the commit path checks what changed);
    the cycle search always covers the graph reachable from them.
    """
    problems: list[str] = []
    ids = steps.keys() if only is None else only
    for sid in ids:
        step = steps.get(sid)
        if step is None:
            continue
        for dep in step.dependencies:
            if dep not in steps:
                problems.append(f"step {sid!r} depends on unknown step {dep!r}")
        if step.status == StepStatus.COMPLETED and step.result is None:
            problems.append(f"step {sid!r} is COMPLETED without a result")
    cycle = find_cycle({sid: s.dependencies for sid, s in steps.items()},
                       roots=None if only is None else list(only))
    if cycle is not None:
        problems.append(f"dependency cycle through step {cycle!r}")
    return problems
