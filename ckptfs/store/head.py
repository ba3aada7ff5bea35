"""What a writer knows of a run's newest committed version: all its commit path reads.

A commit diffs steps against `steps_cmp` (each step's model JSON as last committed), checks the
graph against `deps`, counts progress from `status` and appends to `tool_log`, so it costs the
size of its change. The head is the writer's alone; another writer's records reach it only
through catching up (store/sharing.py) or a reload.

`save_run(run)` is told which steps to diff, too: the head remembers the run object its last
`save_run` (or load) saw in full, the step objects it held (`fast_steps`), and a sink the steps
report possible changes to (`dirty`, see format/models.py "change tracking"). While nothing
but this writer's own tracked commits moved the head (`fast_version`), a `save_run` of that
same object diffs only the reported steps and the steps appended since; anything else (a
removal, a replaced step object, another writer's record, a commit of steps it does not
hold, a reload) makes the next `save_run` compare every step, as it always did.
"""

from __future__ import annotations

import collections
import json
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ckptfs.format.codec import Fragment, unpack
from ckptfs.format.models import AgentRun, Step, ToolCall, holds_shared_values, track_changes


@dataclass
class Head:
    """What this process knows of a run's newest committed version, for the commit path."""

    run_id: str
    version: int = 0
    hash: str = ""
    next_version: int = 1
    run_json: bytes | None = None
    run_info: dict[str, Any] = field(default_factory=dict)
    # each step's model JSON to diff against: plain (loaded, or just committed) or packed
    steps_cmp: dict[str, Fragment] = field(default_factory=dict)
    deps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    tool_log: dict[str, list[ToolCall]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})
    # When this writer last knew its base was stored: its own commit's start, or, after a
    # load, when the loaded version was written (CheckpointStore._seed_head: a load proves the
    # base is there now, but a forget of an idle run may be under way beside it; forget refuses
    # only runs written within the fence time, maintenance/forget.py). Both clocks:
    # the monotonic one stops while the machine is suspended, the wall clock can be set back;
    # `unconfirmed_for` takes the longer, so neither can make an old head look fresh.
    confirmed_at: tuple[float, float] = field(default_factory=lambda: (time.monotonic(), time.time()))
    branching: bool = False  # loaded after a fallback: the next commit starts a new branch
    shared: bool = False  # others have committed to this run: catch up before committing
    # Steps others changed (or removed) since this process last handed out the run (a load
    # gives a new head; `refresh` clears it): a plain commit of one of them is refused
    # (StaleStepsError), since the caller's copy of it is older than the store's.
    others: set[str] = field(default_factory=set)
    # save_run's change tracking (module docstring): valid while fast_version == version.
    fast_run: weakref.ref[AgentRun] | None = None
    fast_version: int = -1
    fast_steps: dict[str, Step] = field(default_factory=dict)  # the run's step objects, in sync
    fast_pos: dict[str, int] = field(default_factory=dict)  # their order in the run
    dirty: dict[int, Step] = field(default_factory=dict)  # reported since: id(step) -> step
    # Packed forms of `steps_cmp` values the compactor made (compactor.Entry.head_plain);
    # filled by its thread, taken by `adopt_packed` under the run's lock (deque: thread-safe).
    packed_later: collections.deque[tuple[str, Fragment, bytes]] = field(
        default_factory=collections.deque)

    def adopt_packed(self) -> None:
        """Hold the compactor's packed bytes for steps whose plain JSON is still the one it
        packed (identity: a step committed again since keeps its newer bytes)."""
        later, cmp = self.packed_later, self.steps_cmp
        while later:
            sid, plain, packed = later.popleft()
            if cmp.get(sid) is plain:
                cmp[sid] = packed

    def unconfirmed_for(self, now: tuple[float, float] | None = None) -> float:
        """Seconds since the head was last confirmed, by whichever clock says longer."""
        mono, wall = now if now is not None else (time.monotonic(), time.time())
        return max(mono - self.confirmed_at[0], wall - self.confirmed_at[1])

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


    def changed_steps(self, run: AgentRun) -> list[Step] | None:
        """The steps of `run` that may differ from what is committed, in run order (O(change)
        plus one C-speed comparison of the step dict); None: diff every step.

        Steps appended since (`add_step`, or `run.steps[new_id] = ...`) are the dict's last
        keys, since a removal (which could reorder them) never gets here. They are reported
        into `dirty` at once, so a commit that fails leaves them to the next call.
        """
        ref = self.fast_run
        if ref is None or ref() is not run or self.fast_version != self.version:
            return None
        steps, known, pos = run.steps, self.fast_steps, self.fast_pos
        n_new = len(steps) - len(known)
        if n_new < 0:
            return self._untracked()
        picked: dict[str, Step] = {}
        for s in self.dirty.values():
            if steps.get(s.id) is not s:  # removed, replaced, or its id reassigned
                return self._untracked()
            picked[s.id] = s
        if n_new:
            for sid in reversed(list(islice(reversed(steps), n_new))):
                if sid in known:
                    return self._untracked()
                s = steps[sid]
                if not isinstance(s, Step):  # a dict put there: the full diff refuses it by name
                    return self._untracked()
                picked[sid] = known[sid] = s
                pos[sid] = len(pos)
                self.dirty[id(s)] = s
                track_changes(s, self.dirty)
        for sid, s in picked.items():
            known[sid] = s
        # Equal keys and the very same objects (identity short-cuts `==`): nothing else moved.
        # An object swapped in that equals the one committed is as good as it, field for field.
        if steps != known:
            return self._untracked()
        out = list(picked.values())
        if len(out) > 1:
            out.sort(key=lambda s: pos[s.id])
        return out

    def _untracked(self) -> list[Step] | None:
        """Give up tracking (the caller diffs every step, and `synced` starts afresh)."""
        self.fast_run = None
        return None

    def moved_on(self, version: int, steps_changed: bool) -> None:
        """A commit of ours is moving the head to `version`: one that changed no step (a tool
        log append, the run's status) keeps the tracking valid; `synced` handles the rest."""
        if not steps_changed and self.fast_version == self.version:
            self.fast_version = version

    def synced(self, run: AgentRun | None, steps: Iterable[Step], full: bool, base: int, *,
               fresh: bool = False) -> None:
        """After a commit of `steps` (every step of `run`, with `full`) from version `base`: the
        steps now match the head, so they leave `dirty`, unless one of their mutable values is
        referenced from outside (it may change without the step hearing of it). `fresh`: `run`
        was just built by a load, whose parsed documents still share its nested values but
        are dropped when the load returns; nobody else can hold them yet."""
        if full and run is not None:
            sink: dict[int, Step] = {}  # steps dropped from the run report into the old one
            for s in run.steps.values():
                track_changes(s, sink)
                if not fresh and holds_shared_values(s):
                    sink[id(s)] = s
            self.dirty, self.fast_steps = sink, dict(run.steps)
            self.fast_pos = {sid: i for i, sid in enumerate(run.steps)}
            self.fast_run, self.fast_version = weakref.ref(run), self.version
            return
        ref = self.fast_run
        if ref is None or self.fast_version not in (base, self.version):
            self.fast_run = None
            return
        known, mine = self.fast_steps, run is not None and ref() is run
        steps = list(steps)
        for s in steps:
            if known.get(s.id) is not s:
                if not (mine and run is not None and s.id not in known
                        and run.steps.get(s.id) is s and len(run.steps) == len(known) + 1
                        and next(reversed(run.steps)) == s.id):
                    self.fast_run = None  # the head now holds a step the tracking does not
                    return
                known[s.id] = s  # the one step appended and committed at once (replanning)
                self.fast_pos[s.id] = len(self.fast_pos)
                track_changes(s, self.dirty)
        for s in steps:
            if not holds_shared_values(s):
                self.dirty.pop(id(s), None)
        self.fast_version = self.version

    def run(self) -> AgentRun:
        """The run as this head knows it (every step validated again)."""
        assert self.run_json is not None
        steps = {sid: json.loads(bytes(unpack(mj))) for sid, mj in self.steps_cmp.items()}
        return AgentRun.model_validate({**json.loads(self.run_json), "steps": steps})


def logged(head: Head, step_id: str, call: ToolCall) -> bool:
    """Whether this very record (same id, phase and time) is in the step's log already: a write
    rebased after a conflict that was its own earlier attempt must not log the call twice."""
    ident = (call.id, call.phase, call.timestamp)
    return any((c.id, c.phase, c.timestamp) == ident for c in reversed(head.tool_log.get(step_id, [])))
