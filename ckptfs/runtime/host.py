"""What a tool runner needs from whatever runs the step: a small protocol, not an agent's privates.

`CheckpointedAgent` (one process) and `Worker` (several, under leases) are both hosts. A runner
asks its host for the step's tool-log index, tells it before a real call (the agent marks the
step RUNNING durably; a worker checks its lease and catches the log up) and after one (the
agent may checkpoint), and hands it each record to make durable.
"""

from __future__ import annotations

import contextvars
from typing import Protocol

from ckptfs.format.models import ToolCall
from ckptfs.runtime.tool_log import ToolLogState

# The (run id, step id) the calling executor is running: `agent.tools()` and `worker.tools()`
# read it, so an executor needs no ids to build its runner.
CURRENT_STEP: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "ckptfs_current_step", default=None)


class ToolHost(Protocol):
    """The host side of `IdempotentToolRunner`."""

    def tool_state(self, run_id: str, step_id: str) -> ToolLogState:
        """The step's tool-log index, shared by all its runners."""
        ...

    def before_tool_call(self, run_id: str, step_id: str) -> None:
        """Called before a real (paid) call; may make the attempt durable or check a lease."""
        ...

    async def abefore_tool_call(self, run_id: str, step_id: str) -> None: ...

    def after_tool_call(self, run_id: str, step_id: str, checkpoint: bool) -> None:
        """Called once a real call's result is durable; `checkpoint` asks for a commit now."""
        ...

    async def aafter_tool_call(self, run_id: str, step_id: str, checkpoint: bool) -> None: ...

    def record_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None:
        """Make a tool call durable, then index it (seed API on the agent)."""
        ...

    async def arecord_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall) -> None: ...
