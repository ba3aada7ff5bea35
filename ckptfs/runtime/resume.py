"""The three ways to pick an interrupted run back up, as pure functions over the run model.

exact:   the state is trusted; steps caught RUNNING by the crash go back to the queue.
fuzzy:   completed steps are re-checked by a user validator; those that fail, and every
         step downstream of them, go back to PENDING (the world changed under the run).
context: the run is summarised into a brief (what was done, key results as given facts,
         what remains) that seeds a fresh run, for when the old state should not be replayed.

Nothing here touches storage: `CheckpointedAgent.resume_run` loads, calls these, commits.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptfs.format.models import AgentRun, Step, StepStatus

STRATEGIES = ("exact", "fuzzy", "context")
# Step.metadata key: tool-log entries before this index belong to an invalidated execution
# of the step and must not be served from the idempotency cache.
TOOL_LOG_START = "ckptfs.tool_log_start"
SKIP_REASON = "ckptfs.skip_reason"


def dependants_index(steps: dict[str, Step]) -> dict[str, list[str]]:
    """step id -> ids of the steps that depend on it directly, in run order."""
    out: dict[str, list[str]] = {sid: [] for sid in steps}
    for sid, step in steps.items():
        for dep in step.dependencies:
            if dep in out:
                out[dep].append(sid)
    return out


def downstream(steps: dict[str, Step], roots: Iterable[str],
               index: dict[str, list[str]] | None = None) -> list[str]:
    """Every step reachable from `roots` along dependant edges (roots excluded), BFS order."""
    index = index if index is not None else dependants_index(steps)
    seen = set(roots)
    out: list[str] = []
    queue = deque(seen)
    while queue:
        for nxt in index.get(queue.popleft(), []):
            if nxt not in seen:
                seen.add(nxt)
                out.append(nxt)
                queue.append(nxt)
    return out


def _reset(step: Step, reason: str, tool_log_len: Callable[[str], int] | None) -> None:
    step.status = StepStatus.PENDING
    step.result = None
    step.error = reason
    step.started_at = step.completed_at = None
    step.metadata.pop(SKIP_REASON, None)
    if tool_log_len is not None:
        step.metadata[TOOL_LOG_START] = tool_log_len(step.id)


def requeue_interrupted(run: AgentRun) -> list[Step]:
    """Steps a crash left RUNNING go back to PENDING; their attempt count is kept."""
    out = []
    for step in run.steps.values():
        if step.status == StepStatus.RUNNING:
            step.status = StepStatus.PENDING
            step.started_at = None
            out.append(step)
    return out


def reset_failed(run: AgentRun) -> list[Step]:
    """FAILED and SKIPPED steps go back to PENDING, to be tried again (`retry_failed=True`).

    Their tool logs are not fenced off, unlike `invalidate`'s: a failed step tried again is the
    same execution going on, as a retry within execute_run is. What it paid for replays from
    the log, and an intent it left open goes to the guard. Fenced off, an email the failed
    attempt had sent was sent again, and an open intent was paid again without asking."""
    out = []
    for step in run.steps.values():
        if step.status in (StepStatus.FAILED, StepStatus.SKIPPED):
            _reset(step, f"reset from {step.status.value} on resume", None)
            out.append(step)
    return out


def _verdict(validator: Callable[[Step], bool], step: Step) -> bool:
    """The validator's answer, which must be a bool: one that forgot its `return` said None,
    taken for a rejection, and every completed step was re-run with its paid calls fenced off."""
    answer = validator(step)
    if not isinstance(answer, bool):
        raise TypeError(f"resume_run: the fuzzy validator answered step {step.id!r} with a "
                        f"{type(answer).__name__}, not True (keep) or False (re-run); nothing was changed")
    return answer


def invalidate(run: AgentRun, validator: Callable[[Step], bool],
               tool_log_len: Callable[[str], int] | None = None) -> list[Step]:
    """Fuzzy resume: completed steps the validator rejects, and all steps downstream, to PENDING.

    Their logged tool results are fenced off (TOOL_LOG_START) so that the re-run calls the
    tools again instead of replaying what the validator just said is stale.
    """
    bad = [sid for sid, s in run.steps.items()
           if s.status == StepStatus.COMPLETED and not _verdict(validator, s)]
    if not bad:
        return []
    changed: list[Step] = []
    for sid in bad:
        _reset(run.steps[sid], "invalidated by the validator on resume", tool_log_len)
        changed.append(run.steps[sid])
    for sid in downstream(run.steps, bad):
        step = run.steps[sid]
        if step.status == StepStatus.PENDING:
            continue
        _reset(step, "a dependency was invalidated on resume", tool_log_len)
        changed.append(step)
    return changed


@dataclass
class BriefItem:
    id: str
    title: str
    description: str = ""
    result: str | None = None
    error: str | None = None


@dataclass
class ResumeBrief:
    """What an interrupted run did and what is left: the seed of a context restart."""

    run_id: str
    goal: str
    done: list[BriefItem] = field(default_factory=list)
    failed: list[BriefItem] = field(default_factory=list)
    remaining: list[BriefItem] = field(default_factory=list)
    total_tokens: int = 0
    total_cost_usd: float = 0.0
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ResumeBrief:
        def items(k: str) -> list[BriefItem]:
            return [BriefItem(**i) for i in doc.get(k, [])]

        return cls(run_id=str(doc["run_id"]), goal=str(doc["goal"]), done=items("done"),
                   failed=items("failed"), remaining=items("remaining"),
                   total_tokens=int(doc.get("total_tokens", 0)),
                   total_cost_usd=float(doc.get("total_cost_usd", 0.0)),
                   created_at=float(doc.get("created_at", time.time())))

    def to_prompt(self, max_result_chars: int = 400) -> str:
        """The brief as text for an LLM prompt: results are given facts, not work to redo."""

        def clip(text: str | None) -> str:
            text = (text or "").strip().replace("\n", " ")
            return text if len(text) <= max_result_chars else text[: max_result_chars - 1] + "…"

        lines = [f"Original goal: {self.goal}", "",
                 f"This task was interrupted (previous run {self.run_id}). "
                 f"{len(self.done)} steps are done, {len(self.remaining)} remain.", ""]
        if self.done:
            lines.append("Already done. Treat these results as given facts; do not redo them:")
            lines += [f"- [{i.id}] {i.title}: {clip(i.result)}" for i in self.done]
            lines.append("")
        if self.failed:
            lines.append("Attempted and failed (reconsider the approach):")
            lines += [f"- [{i.id}] {i.title}: {clip(i.error)}" for i in self.failed]
            lines.append("")
        if self.remaining:
            lines.append("Still to do:")
            lines += [f"- [{i.id}] {i.title}" + (f": {clip(i.description)}" if i.description else "")
                      for i in self.remaining]
        return "\n".join(lines).rstrip() + "\n"


def build_brief(run: AgentRun) -> ResumeBrief:
    brief = ResumeBrief(run.run_id, run.goal, total_tokens=run.total_tokens,
                        total_cost_usd=run.total_cost_usd)
    for step in run.steps.values():
        item = BriefItem(step.id, step.title, step.description, step.result, step.error)
        if step.status == StepStatus.COMPLETED:
            brief.done.append(item)
        elif step.status == StepStatus.FAILED:
            brief.failed.append(item)
            brief.remaining.append(BriefItem(step.id, step.title, step.description))
        else:
            brief.remaining.append(BriefItem(step.id, step.title, step.description))
    return brief


# uuid5 namespace of context restarts' run ids (a fixed uuid4, never to change: it names them)
CONTEXT_NAMESPACE = uuid.UUID("6f1e0c7a-3d5b-4c1e-9a2f-8b7d4e6c5a31")


def context_run_id(run_id: str) -> str:
    """The id a context restart of `run_id` gets unless told another: the same each time, so a
    restart killed between its two writes and called again finds the run it began (it made a
    second one, and both were listed as resumable, the remaining work done twice)."""
    return str(uuid.uuid5(CONTEXT_NAMESPACE, run_id))


def context_run(old: AgentRun, brief: ResumeBrief, new_run_id: str | None = None) -> AgentRun:
    """A fresh run carrying the brief: its goal is the prompt text, its steps what remains.

    Dependencies on completed steps are dropped (their results are facts in the goal now);
    dependencies among the remaining steps are kept. The old run is marked superseded.
    """
    new = AgentRun(run_id=new_run_id or context_run_id(old.run_id), goal=brief.to_prompt())
    remaining = {i.id for i in brief.remaining}
    for sid in (i.id for i in brief.remaining):
        s = old.steps[sid]
        new.add_step(Step(id=s.id, title=s.title, description=s.description,
                          dependencies=[d for d in s.dependencies if d in remaining],
                          milestone=s.milestone,
                          metadata={k: v for k, v in s.metadata.items() if not k.startswith("ckptfs.")}))
    new.metadata.update({"resumed_from": old.run_id, "resume_strategy": "context",
                         "resume_brief": brief.to_dict(), "original_goal": old.goal})
    old.status = "superseded"
    old.metadata["superseded_by"] = new.run_id
    old.updated_at = time.time()
    return new
