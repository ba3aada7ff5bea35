"""What a commit may write: values a load gives back equal, large ones planned for artifacts/.

The writer's half of "whatever a commit acknowledges, a load returns": every changed value is
checked (`codec.model_problem`) and serialised strictly before a byte is written, and a value
over the artifact threshold is only *planned* as an artifact; the commit writes the planned
artifacts once every check has passed, right before the record that points at them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from ckptfs.errors import NonFiniteValueError, RecordTooLargeError, UnstorableValueError
from ckptfs.format import codec
from ckptfs.format.changes import Changes
from ckptfs.format.keys import artifact_key
from ckptfs.format.models import AgentRun, ArtifactRef, Step, ToolCall
from ckptfs.format.reader import REFS_FIELD
from ckptfs.store.artifacts import ArtifactStore

_STORED_AS = (Step, AgentRun, ToolCall)  # what a load builds: subclasses come back as these


def _refuse_subclass_fields(model: BaseModel, run_id: str, step_id: str | None, prefix: str,
                            exclude: set[str] | None) -> None:
    """UnstorableValueError for a field a subclass of Step, AgentRun or ToolCall adds: a load
    builds the class itself, which ignores the key, so the value would be acknowledged and
    never come back (a resumed run would then commit the step without it). A subclass that
    adds only methods or properties stores as its base."""
    base = next((b for b in _STORED_AS if isinstance(model, b)), None)
    if base is None:
        return
    extra = sorted(type(model).model_fields.keys() - base.model_fields.keys() - (exclude or set()))
    if extra:
        raise UnstorableValueError(run_id, step_id, f"{prefix}{extra[0]}", (
            f"a field of {type(model).__name__}, a subclass of {base.__name__}: a load returns "
            f"{base.__name__}, which has no such field, so it would not come back; keep such "
            "values in .metadata"))


@dataclass(frozen=True)
class PendingArtifact:
    """A large value a commit moves to artifacts/: its bytes and the reference the record keeps."""

    raw: bytes
    ref: ArtifactRef



class ValuePlanner:
    """Checks and serialises what a commit changes; moves large values to artifacts/."""

    def __init__(self, artifacts: ArtifactStore, artifact_threshold: int) -> None:
        self.artifacts = artifacts
        self.artifact_threshold = artifact_threshold

    @staticmethod
    def check_storable(run_id: str, step_id: str | None, model: BaseModel, prefix: str = "",
                        exclude: frozenset[str] = frozenset()) -> None:
        """Refuse a value a load would not give back (codec.model_problem says which and why).

        Called on what a commit is about to write, before anything is: NaN in a float field
        becomes null (the record then fails validation and every later load skips it, taking
        every later commit along), a giant int makes the record unreadable, a set or tuple
        comes back as a list. O(the changed values), so the hot path stays O(change).
        """
        got = codec.model_problem(model, prefix, exclude)
        if got is not None:
            cls = NonFiniteValueError if got.nonfinite else UnstorableValueError
            raise cls(run_id, step_id, got.path, got.reason)

    @staticmethod
    def require_step(run_id: str, step: object, key: str | None = None) -> Step:
        """`step` itself when it is a Step filed under its own id. AgentRun does not validate
        assignment, so `run.steps["b"] = {...}` keeps a plain dict, which the commit path would
        meet as an AttributeError naming neither the step nor the mistake. `key`: where it sits
        in `run.steps`, the name the caller used (None or a ToolCall has no id to go by).

        A Step under a key that is not its id (`run.steps["x"] = Step(id="y")`) is refused
        too: a commit writes a step under its id, so it would acknowledge "x" and a load would
        return "y" instead."""
        if isinstance(step, Step):
            if key is None or step.id == key:
                return step
            raise UnstorableValueError(
                run_id, key, "steps",
                f"step {key!r} is a Step whose id is {step.id!r}: a commit writes a step under "
                f"its id, so a load would return {step.id!r}, not {key!r}; put a Step in "
                "run.steps under its own id (run.add_step(step))")
        sid = step.get("id") if isinstance(step, dict) else None
        sid = sid if isinstance(sid, str) else None
        name = key if key is not None else sid
        where = f"step {name!r}" if name is not None else "a step"
        if key is not None and sid is not None and sid != key:
            where += f" (a dict whose id is {sid!r})"
        raise UnstorableValueError(
            run_id, name, "steps",
            f"{where} is a {type(step).__name__}, not a Step (an AgentRun does not validate what "
            "is put in its steps): build it with Step(...) or Step.model_validate(...)")

    @classmethod
    def require_steps(cls, run: AgentRun) -> None:
        """`require_step` for every step of `run`, by its key."""
        for key, step in run.steps.items():
            if not isinstance(step, Step) or step.id != key:
                cls.require_step(run.run_id, step, key)

    @classmethod
    def require_given(cls, run: AgentRun, given: object) -> Step:
        """A step `commit(run, steps)` was given, by key or as a Step, checked as `require_step`
        does with the key it has in `run.steps`. O(1) for a key, or for the run's own Step under
        its id (what the runtime commits). Any other Step costs a search of the run for its
        key: an id that is a key of the run says nothing of where the Step itself sits (two
        steps swapped between keys, `run.steps["b"] = Step(id="a")`, `run.steps["b"].id = "a"`),
        and a commit writes it under its id, so a load would return it in another key's place.
        A Step the run does not hold at all is a caller's copy, written under its id."""
        if isinstance(given, str):
            return cls.require_step(run.run_id, run.steps[given], given)
        if not isinstance(given, Step) or run.steps.get(given.id) is given:
            return cls.require_step(run.run_id, given)
        # A copy of the items: a group commit plans on the writer thread while the caller's
        # thread may add steps to the same dict.
        key = next((k for k, s in list(run.steps.items()) if s is given), None)
        return cls.require_step(run.run_id, given, key)

    @classmethod
    def require_all_given(cls, run: AgentRun, given: Iterable[object]) -> list[Step]:
        """`require_given` for each of `given`. A Step given twice is looked for under every
        key of the run: `commit(run, list(run.steps.values()))` of a run holding one Step under
        two keys passes it twice, both times as the run's under its id, and would acknowledge
        the other key, which no load returns. O(given) otherwise."""
        steps = [cls.require_given(run, g) for g in given]
        if len(steps) < 2:
            return steps
        objects = {id(s) for s in steps}
        if len(objects) != len(steps):
            for key, s in list(run.steps.items()):
                if id(s) in objects:
                    cls.require_step(run.run_id, s, key)
        return steps

    @classmethod
    def require_filed(cls, run: AgentRun, steps: Iterable[Step], stored: Collection[str]) -> None:
        """`require_steps(run)`, at the cost of `steps` unless something is misfiled: `steps`
        are those of `run` that may differ from what is stored (`Head.changed_steps`), `stored`
        the ids the store holds. Each must be the run's step under its id, and the run must
        have as many keys as the store will have ids; otherwise a key of the run holds a step
        under another id (or the same Step twice), and the whole run is looked at, which
        names it."""
        new: set[str] = set()
        for s in steps:
            if run.steps.get(s.id) is not s:
                cls.require_steps(run)
                return
            if s.id not in stored:
                new.add(s.id)
        if len(run.steps) != len(stored) + len(new):
            cls.require_steps(run)

    @classmethod
    def check_unchanged(cls, run_id: str, step_id: str | None, model: BaseModel, model_json: bytes,
                        exclude: frozenset[str] = frozenset()) -> None:
        """`check_storable` for a model whose JSON equals what is stored: NaN and infinities
        serialise as null, the bytes of None, so "no change" must not acknowledge a value the
        caller holds and no load gives back (a NaN put where None is stored, in a float field
        or a metadata entry). Only JSON holding a null can hide one: an unchanged model
        without one costs a byte scan."""
        if b"null" in model_json:
            cls.check_storable(run_id, step_id, model, exclude=exclude)

    @staticmethod
    def model_json_of(model: BaseModel, run_id: str, step_id: str | None, prefix: str = "",
                    exclude: set[str] | None = None) -> bytes:
        """A model's JSON, strictly: a value pydantic cannot serialise, or one that does not
        fit its field's type (a str in an int field of a model that does not validate
        assignments, which a load would refuse), is UnstorableValueError, not a traceback."""
        if type(model) not in _STORED_AS:
            _refuse_subclass_fields(model, run_id, step_id, prefix, exclude)
        try:
            return model.model_dump_json(exclude=exclude, warnings="error").encode()
        except PydanticSerializationError as exc:
            what = type(model).__name__
            raise UnstorableValueError(run_id, step_id, f"{prefix}{what}",
                                       f"cannot be stored as JSON: {exc}") from None

    def offload_step(self, step: Step, model_json: bytes, pending: list[PendingArtifact]) -> bytes:
        """Persisted JSON of a step: large result values become artifact references.

        The artifacts are only planned here (`pending`); `_commit` writes them once every
        check has passed, right before the record that points at them, so a refused commit
        writes nothing at all.
        """
        if len(model_json) <= self.artifact_threshold:
            return model_json
        doc = json.loads(model_json)
        refs: dict[str, Any] = {}
        if isinstance(step.result, str) and len(step.result) > self.artifact_threshold:
            ref = self.plan_artifact(step.result.encode(), "text/plain; charset=utf-8",
                                      step.result[:200], pending)
            refs["result"] = ref.model_dump()
            doc["result"] = ref.summary
        for i, call in enumerate(doc.get("tool_calls", [])):
            frag = self.offload_value(call.get("result"), pending)
            if frag is not None:
                refs[f"tool_calls.{i}.result"] = frag.model_dump()
                call["result"] = frag.summary
        if not refs:
            return model_json
        doc[REFS_FIELD] = refs
        return codec.dumps(doc)

    def offload_value(self, value: Any, pending: list[PendingArtifact]) -> ArtifactRef | None:
        if value is None:
            return None
        raw = codec.dumps(value)
        if len(raw) <= self.artifact_threshold:
            return None
        summary = value[:200] if isinstance(value, str) else raw[:200].decode(errors="replace")
        return self.plan_artifact(raw, "application/json", summary, pending)

    @staticmethod
    def plan_artifact(raw: bytes, media_type: str, summary: str,
                       pending: list[PendingArtifact]) -> ArtifactRef:
        """The reference `artifacts.put` will return for `raw`, without writing it yet."""
        sha = codec.sha256_hex(raw)
        ref = ArtifactRef(uri=artifact_key(sha), sha256=sha, size=len(raw), media_type=media_type,
                          summary=summary)
        pending.append(PendingArtifact(raw, ref))
        return ref

    def store_artifacts(self, pending: Iterable[PendingArtifact]) -> None:
        """Write planned artifacts (data before the record that points at them: restic's order)."""
        for p in pending:
            got = self.artifacts.put(p.raw, p.ref.media_type, p.ref.summary)
            if got != p.ref:  # the record would point at other bytes than were stored
                raise RuntimeError(f"artifact store returned {got.uri}, planned {p.ref.uri}")

    def tool_call_json(self, call: ToolCall, pending: list[PendingArtifact], run_id: str,
                        step_id: str) -> bytes:
        """A tool call's persisted JSON, checked first (a paid result is logged only if a load
        can give it back), its large result planned as an artifact."""
        where = f"tool call {call.tool_name!r} "
        self.check_storable(run_id, step_id, call, where)
        model_json = self.model_json_of(call, run_id, step_id, where)
        if len(model_json) <= self.artifact_threshold:
            return model_json
        ref = self.offload_value(call.result, pending)
        if ref is None:
            return model_json
        doc = json.loads(model_json)
        doc["result"] = ref.summary
        doc[REFS_FIELD] = {"result": ref.model_dump()}
        return codec.dumps(doc)

    @staticmethod
    def too_large(run_id: str, changes: Changes, exc: RecordTooLargeError) -> RecordTooLargeError:
        """The size refusal, naming the biggest value of the record (the one to move out)."""
        frags: list[tuple[int, str | None, str, codec.Fragment]] = []
        if changes.run is not None:
            frags.append((len(changes.run), None, "", changes.run))
        frags += [(len(f), sid, "", f) for sid, f in changes.steps.items() if f is not None]
        frags += [(len(f), sid, "tool_log.", f) for sid, calls in changes.tool_log.items()
                  for f in calls]
        if not frags:
            return exc
        size, step_id, prefix, frag = max(frags, key=lambda t: t[0])
        field_name, field_size = "record", size
        with contextlib.suppress(ValueError):
            doc = json.loads(bytes(frag))
            if isinstance(doc, dict) and doc:
                sizes = {k: len(codec.dumps(v)) for k, v in doc.items()}
                field_name = max(sizes, key=lambda k: sizes[k])
                field_size = sizes[field_name]
                inner = doc[field_name]
                if isinstance(inner, dict) and inner:
                    sub = {k: len(codec.dumps(v)) for k, v in inner.items()}
                    big = max(sub, key=lambda k: sub[k])
                    if sub[big] * 2 > field_size:
                        field_name, field_size = f"{field_name}.{big}", sub[big]
        return RecordTooLargeError(
            run_id, step_id, f"{prefix}{field_name}",
            f"{field_size} bytes inline make the record too large: {exc.reason} (only step "
            "results and tool results over the artifact threshold move to artifacts/; put a "
            "large value there with put_artifact() and keep the reference)")

