"""A run's state and its changes as JSON fragments, so commits never re-serialise a whole run.

A `Changes` value is what one commit changed (a journal record's body), what several
consecutive commits changed (a delta's body), or everything (a snapshot's body): the same
shape merges into itself, which is what makes leveled compaction a dictionary update.
Fragments are the exact JSON bytes that go to storage, or those bytes packed (codec.pack: a
writer's replica of a long run holds them compressed); they are immutable, so the commit path
and the background compactor share them without copying.

Body layout: {"run": {...} | null, "steps": {id: {...}}, "removed": [id, ...],
              "tool_log": {step_id: [{...}, ...]}}
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ckptfs.format.codec import Fragment, dumps, dumps_key, is_packed, pack, unpack


@dataclass
class Changes:
    run: bytes | None = None
    steps: dict[str, Fragment | None] = field(default_factory=dict)  # None: step removed
    tool_log: dict[str, list[bytes]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return self.run is None and not self.steps and not self.tool_log

    def merge(self, later: Changes, full_state: bool = False) -> None:
        """Fold a later change into this one; with full_state, removals delete outright."""
        if later.run is not None:
            self.run = later.run
        for sid, frag in later.steps.items():
            if frag is None and full_state:
                self.steps.pop(sid, None)
            else:
                self.steps[sid] = frag
        for sid, calls in later.tool_log.items():
            self.tool_log.setdefault(sid, []).extend(calls)

    def packed(self) -> Changes:
        """The same changes with every fragment packed (codec.pack; packed ones are kept)."""
        return Changes(self.run,
                       {sid: None if f is None else (f if is_packed(f) else pack(f))
                        for sid, f in self.steps.items()},
                       {sid: [c if is_packed(c) else pack(c) for c in calls]
                        for sid, calls in self.tool_log.items()})

    def copy(self) -> Changes:
        return Changes(self.run, dict(self.steps),
                       {k: list(v) for k, v in self.tool_log.items()})

    def to_json(self) -> bytes:
        """The body bytes, assembled from fragments without parsing them."""
        return b"".join(self._fragments())

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        """The same bytes as `to_json`, in pieces of about `size`: a snapshot of a large state
        is hashed and compressed piece by piece (codec.encode_parts) instead of being joined
        into one copy of the whole state, and each piece is big enough for hashlib and zstd
        to work without the GIL."""
        buf: list[Fragment] = []
        n = 0
        for frag in self._fragments():
            buf.append(frag)
            n += len(frag)
            if n >= size:
                yield b"".join(buf)
                buf, n = [], 0
        if buf:
            yield b"".join(buf)

    def _fragments(self) -> Iterator[Fragment]:
        yield b'{"run":'
        yield self.run if self.run is not None else b"null"
        yield b',"steps":{'
        first = True
        removed: list[str] = []
        for sid, frag in self.steps.items():
            if frag is None:
                removed.append(sid)
                continue
            yield (dumps_key(sid) + b":" if first else b"," + dumps_key(sid) + b":")
            yield unpack(frag)
            first = False
        yield b'},"removed":'
        yield dumps(removed) if removed else b"[]"
        yield b',"tool_log":{'
        first = True
        for sid, calls in self.tool_log.items():
            yield (b"" if first else b",") + dumps_key(sid) + b":["
            yield b",".join(map(unpack, calls))
            yield b"]"
            first = False
        yield b"}}"


def apply_body(state: dict[str, Any], body: Any) -> None:
    """Apply a decoded body (journal, delta or snapshot) to a state of parsed dicts."""
    if not isinstance(body, dict):
        raise ValueError("record body is not an object")
    run = body.get("run")
    if run is not None:
        if not isinstance(run, dict):
            raise ValueError("record 'run' is not an object")
        state["run"] = run
    steps = body.get("steps", {})
    removed = body.get("removed", [])
    tool_log = body.get("tool_log", {})
    if not isinstance(steps, dict) or not isinstance(removed, list) or not isinstance(tool_log, dict):
        raise ValueError("record body has the wrong shape")
    if not all(isinstance(sid, str) for sid in removed):
        raise ValueError("record 'removed' must list step ids")
    st = state.setdefault("steps", {})
    for sid, step in steps.items():
        if not isinstance(step, dict):
            raise ValueError(f"step {sid!r} is not an object")
        st[sid] = step
    for sid in removed:
        st.pop(sid, None)
    tl = state.setdefault("tool_log", {})
    for sid, calls in tool_log.items():
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ValueError(f"tool log of {sid!r} is not a list of objects")
        tl.setdefault(sid, []).extend(calls)
