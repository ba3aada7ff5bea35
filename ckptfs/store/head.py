"""What a writer knows of a run's newest committed version: all its commit path reads.

A commit diffs steps against `steps_cmp` (each step's model JSON as last committed), checks the
graph against `deps`, counts progress from `status` and appends to `tool_log`, so it costs the
size of its change. The head is the writer's alone; another writer's records reach it only
through catching up (store/sharing.py) or a reload.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptfs.format.models import AgentRun, ToolCall


@dataclass
class Head:
    """What this process knows of a run's newest committed version, for the commit path."""

    run_id: str
    version: int = 0
    hash: str = ""
    next_version: int = 1
    run_json: bytes | None = None
    run_info: dict[str, Any] = field(default_factory=dict)
    steps_cmp: dict[str, bytes] = field(default_factory=dict)  # model JSON, to diff against
    deps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    tool_log: dict[str, list[ToolCall]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})
    branching: bool = False  # loaded after a fallback: the next commit starts a new branch
    shared: bool = False  # others have committed to this run: catch up before committing

    def counts_after(self, new_status: Mapping[str, str], removed: Iterable[str]) -> dict[str, int]:
        """Step counts once the change lands, computed from the change alone (O(change))."""
        out = dict(self.counts)

        def bump(status: str | None, d: int) -> None:
            if status is None:
                return
            out["total"] += d
            if status in ("completed", "failed"):
                out[status] += d

        for sid, st in new_status.items():
            bump(self.status.get(sid), -1)
            bump(st, +1)
        for sid in removed:
            bump(self.status.get(sid), -1)
        return out


    def run(self) -> AgentRun:
        """The run as this head knows it (every step validated again)."""
        assert self.run_json is not None
        steps = {sid: json.loads(mj) for sid, mj in self.steps_cmp.items()}
        return AgentRun.model_validate({**json.loads(self.run_json), "steps": steps})


def logged(head: Head, step_id: str, call: ToolCall) -> bool:
    """Whether this very record (same id, phase and time) is in the step's log already: a write
    rebased after a conflict that was its own earlier attempt must not log the call twice."""
    ident = (call.id, call.phase, call.timestamp)
    return any((c.id, c.phase, c.timestamp) == ident for c in reversed(head.tool_log.get(step_id, [])))
