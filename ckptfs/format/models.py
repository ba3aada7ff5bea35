"""The agent-run model: plain pydantic v2 types that every other layer speaks.

Names, fields and methods follow the seed article so its users' code keeps working;
what is new is validation (ids that are safe as storage keys, a graph that can run)
and a few optional fields the runtime fills (attempt limits, tokens, idempotency keys).
Serialisation is pydantic's JSON only: a checkpoint never executes code when loaded.
"""

from __future__ import annotations

import difflib
import re
import sys
import time
import uuid
import weakref
from collections.abc import Generator, Iterable, Mapping, Sequence
from enum import Enum
from types import UnionType
from typing import TYPE_CHECKING, Any, Self, Union, cast, get_args, get_origin

from pydantic import AliasChoices, AliasPath, BaseModel, ConfigDict, Field, field_validator

from ckptfs.errors import InvalidIdError, quote_value

MAX_ID_LENGTH = 200
# An id is one name on local disk (a run's folder, `runs/<run id>/`), and ext4, XFS, btrfs,
# ZFS, tmpfs and APFS hold at most 255 bytes in a name. 64 emoji are 64 characters but 256
# bytes of UTF-8: such an id passed, then the first local write failed with a raw "File name
# too long", and a restore or mirror from S3 (whose keys take 1024 bytes) to disk stopped
# there, every other run of the pass left uncopied. Refused here, before any key is built.
MAX_NAME_BYTES = 255
# A step id's longest name on disk: a lease is rewritten through a temp file beside it,
# `.<step id>.lease.tmp-<8 hex><counter in hex>` (keys.lease_key, storage/local.py): 20 bytes
# more than the id, and a counter given room for 16 hex digits, which it never outgrows.
STEP_ID_EXTRA_BYTES = len(".") + len(".lease") + len(".tmp-") + 8 + 16
_ID_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f/\\]")
# The ids nearly every run uses, accepted by one match (a load validates one per step): ASCII
# letters, digits and a few marks, not starting with "." (the ".." rule is checked beside).
_ID_PLAIN = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.:@+=\-]*")


def validate_id(value: str, what: str = "id", extra_bytes: int = 0) -> str:
    """Refuse ids that could escape or confuse a storage key, before any path is built.

    Ids become path segments (`runs/<run_id>/...`), so `/`, `\\`, `..`, control characters,
    a leading dot and unbounded length are refused with an error naming the id; so is an id
    whose UTF-8, with the `extra_bytes` the longest name made of it adds (a step id's:
    STEP_ID_EXTRA_BYTES), would not fit one name on local disk, whatever the store's backend:
    any store may be restored or mirrored to disk.
    """
    if (type(value) is str and len(value) <= MAX_ID_LENGTH and _ID_PLAIN.fullmatch(value)
            and ".." not in value and len(value) + extra_bytes <= MAX_NAME_BYTES):  # ASCII: a byte each
        return value
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(f"{what} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
    limit = MAX_NAME_BYTES - extra_bytes
    # at most 4 bytes a character: an id short enough is not encoded (a load checks every step's)
    if len(value) * 4 > limit and (size := len(value.encode("utf-8", "surrogatepass"))) > limit:
        why = (f"a name on local disk holds at most {MAX_NAME_BYTES} bytes" if not extra_bytes else
               f"the longest name on local disk made of it adds {extra_bytes} bytes, and a name "
               f"holds at most {MAX_NAME_BYTES}")
        raise InvalidIdError(f"{what} {quote_value(value)} is {size} bytes long in UTF-8; the limit "
                             f"is {limit} bytes ({why})")
    if _ID_FORBIDDEN.search(value):
        raise InvalidIdError(f"{what} {value!r} contains '/', '\\' or a control character")
    if value.startswith(".") or ".." in value:
        raise InvalidIdError(f"{what} {value!r} must not start with '.' or contain '..'")
    if value != value.strip():
        raise InvalidIdError(f"{what} {value!r} must not start or end with white space")
    return value


if TYPE_CHECKING:
    from pydantic._internal._model_construction import ModelMetaclass as _ModelMeta
else:
    _ModelMeta = type(BaseModel)  # pydantic's metaclass, which it does not export


class _KnownFields(_ModelMeta):
    """Models users build by hand: a keyword that is no field (`Step(depends_on=[...])`) is a
    TypeError naming it, as for any Python call, instead of a step silently without its
    dependencies; so is such a key in a dict given for a nested model (`AgentRun(steps={"b":
    {"id": "b", ..., "depends_on": [...]}})`, `Step(tool_calls=[{"tool": ...}])`), which
    pydantic validates as a load would. Checked where a call builds the model, in the
    metaclass: `model_validate` (every load) never passes here, so files a newer version
    wrote, with fields this one does not know, still load, and the check costs a load nothing
    (a custom `__init__` would be run by `model_validate` too).

    A keyword is known if pydantic takes it: a field's name, or its alias (`Field(alias=...)`,
    `validation_alias`, an `alias_generator`) as the model's config admits them. A subclass
    that decides for itself is left to pydantic: one with its own `__init__` (its signature
    says what it takes) or with `extra="allow"` / `"forbid"`."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _check_keys(cast("type[BaseModel]", cls), kwargs, f"{cls.__name__}()")
        return super().__call__(*args, **kwargs)


# Per model class: the keywords its constructor takes (None: pydantic decides), and the fields
# whose values may be dicts for a model of this metaclass (how deep: a model, a list or a dict
# of them). Computed once per class; weak, so classes made at run time can go.
_KEYS: weakref.WeakKeyDictionary[type, tuple[frozenset[str] | None, dict[str, tuple[str, type]]]] = (
    weakref.WeakKeyDictionary())


def _aliases(info: Any) -> list[str]:
    alias = info.validation_alias if info.validation_alias is not None else info.alias
    if alias is None:
        return []
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    out = []
    for choice in choices:
        if isinstance(choice, AliasPath):
            choice = choice.path[0]
        if isinstance(choice, str):
            out.append(choice)
    return out


def _nested_model(annotation: Any) -> tuple[str, type] | None:
    """("one" | "list" | "dict", model) when a field holds models of this metaclass."""
    if isinstance(annotation, type) and isinstance(annotation, _KnownFields):
        return "one", annotation
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (list, Sequence) and len(args) == 1 and isinstance(args[0], _KnownFields):
        return "list", args[0]
    if origin in (dict, Mapping) and len(args) == 2 and isinstance(args[1], _KnownFields):
        return "dict", args[1]
    if origin in (Union, UnionType):
        found = [n for a in args if a is not type(None) and (n := _nested_model(a)) is not None]
        return found[0] if len(found) == 1 else None
    return None


def _keys_of(cls: type[BaseModel]) -> tuple[frozenset[str] | None, dict[str, tuple[str, type]]]:
    got = _KEYS.get(cls)
    if got is not None:
        return got
    cfg = cls.model_config
    nested = {name: n for name, info in cls.model_fields.items()
              if (n := _nested_model(info.annotation)) is not None}
    accepted: frozenset[str] | None = None
    if cls.__init__ is BaseModel.__init__ and cfg.get("extra") in (None, "ignore"):
        by_name = bool(cfg.get("validate_by_name") or cfg.get("populate_by_name"))
        by_alias = cfg.get("validate_by_alias", True) is not False
        keys: set[str] = set()
        for name, info in cls.model_fields.items():
            aliases = _aliases(info)
            if not aliases or by_name:
                keys.add(name)
            if by_alias:
                keys.update(aliases)
        accepted = frozenset(keys)
    _KEYS[cls] = accepted, nested
    return accepted, nested


def _check_keys(cls: type[BaseModel], given: Mapping[str, Any], where: str,
                by_field: bool = False) -> None:
    """by_field: `given` is named by fields, not by keywords (an assignment), so only the dicts
    in its values are checked."""
    accepted, nested = _keys_of(cls)
    if accepted is None:
        return
    if not by_field and not given.keys() <= accepted:
        unknown = sorted(given.keys() - accepted, key=str)
        hint = difflib.get_close_matches(str(unknown[0]), sorted(accepted), n=1)
        also = f" (did you mean {hint[0]!r}?)" if hint else ""
        what = (f"{where} got unexpected keyword argument(s)" if where.endswith("()")
                else f"{where} ({cls.__name__}) has unexpected key(s)")
        raise TypeError(f"{what} {', '.join(map(repr, unknown))}{also}; "
                        f"its fields are {', '.join(cls.model_fields)}")
    for name, (shape, model) in nested.items():
        value = given.get(name)
        if value is None:
            continue
        if shape == "one":
            items: Iterable[tuple[object, Any]] = [(None, value)]
        elif shape == "list" and isinstance(value, (list, tuple)):
            items = enumerate(value)
        elif shape == "dict" and isinstance(value, Mapping):
            items = value.items()
        else:
            continue
        for key, item in items:
            if isinstance(item, Mapping) and all(isinstance(k, str) for k in item):
                _check_keys(cast("type[BaseModel]", model), item,
                            f"{where.removesuffix('()')}.{name}" + ("" if key is None else f"[{key!r}]"))


def _check_assignment(model: object, name: str, value: Any) -> None:
    """With `validate_assignment`, pydantic validates an assigned value as a load validates it:
    an unknown key in a dict given for a nested model (`step.tool_calls = [{"tool": ...}]`) was
    dropped, and the commit acknowledged a value the load never returned. Such dicts are refused
    as `_KnownFields` refuses them in a call. The models' `__setattr__` calls this (a metaclass
    never sees an assignment) on every assignment, the runtime's too: cheap tests first."""
    cls = cast("type[BaseModel]", type(model))
    if (cls.model_config.get("validate_assignment") and isinstance(value, (list, tuple, dict, Mapping))
            and name in _keys_of(cls)[1]):
        _check_keys(cls, {name: value}, cls.__name__, by_field=True)


class _CheckedAssignment:
    """Step's `__setattr__` checks for itself; ToolCall and AgentRun validate no assignment, but
    a subclass of theirs may (`validate_assignment=True`), and then `run.steps = {...}` would
    drop keys too."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        _check_assignment(self, name, value)
        super().__setattr__(name, value)


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


class ToolCall(_CheckedAssignment, BaseModel, metaclass=_KnownFields):
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


class Step(BaseModel, metaclass=_KnownFields):
    """A unit of work within the agent run.

    Assignments are validated (`step.status = "completed"` becomes the enum), because the
    runtime and the store read these fields on every commit and a stray type would only
    surface later, at load time, as a corrupt checkpoint.
    """

    model_config = ConfigDict(validate_assignment=True)
    # Where this step reports that it may have changed (see `track_changes`). A slot, not a
    # pydantic private attribute: those take part in `==` and in copies, and a copy must
    # start untracked (it is a different object from the one the store compared).
    __slots__ = ("_ckpt_watch",)

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
        return validate_id(v, "step id", STEP_ID_EXTRA_BYTES)

    def __setattr__(self, name: str, value: Any) -> None:
        _check_assignment(self, name, value)
        super().__setattr__(name, value)
        _touch(self)

    def __iter__(self) -> Generator[tuple[str, Any], None, None]:
        # `dict(step)` and `for k, v in step` hand out the containers without a field read.
        _touch(self)
        yield from super().__iter__()

    def __copy__(self) -> Self:
        # A shallow copy (`model_copy()`, `copy.copy`) shares this step's containers: the
        # copy's reads report the copy, so a change made through it (`view.metadata["x"] = 1`)
        # was never seen, and save_run acknowledged a version without it. This step is
        # reported instead, and it stays marked while the copy holds its containers
        # (`holds_shared_values`), as for any reference kept past a commit.
        _touch(self)
        return super().__copy__()

    def is_ready(self, completed_ids: set[str]) -> bool:
        # Read past the exposing descriptor: checking readiness changes nothing, and
        # `get_ready_steps` would otherwise mark every pending step for re-comparison.
        return all(dep in completed_ids for dep in self.__dict__["dependencies"])

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is not None and self.completed_at is not None:
            return self.completed_at - self.started_at
        return None


# ------------------------------------------------------------------ change tracking
#
# `save_run(run)` must cost the size of the change, so the store has to learn which steps
# changed without serialising every step. A step tells a *sink* (a dict the store's head owns,
# id(step) -> step) whenever it may have changed:
#   * a field assignment (`Step.__setattr__`);
#   * a read of a field holding a mutable container (`tool_calls`, `dependencies`,
#     `metadata`): whoever reads it can change it in place (`step.metadata["x"] = 1`,
#     `step.tool_calls.append(...)`, `step.tool_calls[0].result = ...`), so the read itself
#     counts as a possible change;
#   * a reference kept past a commit (`md = step.metadata`, changed after the save): the store
#     asks `holds_shared_values` when it commits a step, and a step with a mutable value that
#     something else references stays marked until nothing does.
# Not seen: writes through `step.__dict__` and `object.__setattr__`-style tricks; those
# bypass pydantic too.

_CONTAINER_FIELDS = ("tool_calls", "dependencies", "metadata")


def _touch(step: Step) -> None:
    try:
        sink: dict[int, Step] | None = object.__getattribute__(step, "_ckpt_watch")
    except AttributeError:  # never tracked (new, copied, unpickled): the store diffs it anyway
        return
    if sink is not None:
        sink[id(step)] = step


def track_changes(step: Step, sink: dict[int, Step] | None) -> None:
    """Report this step's possible changes to `sink` from now on (None: to nobody)."""
    object.__setattr__(step, "_ckpt_watch", sink)


class _Exposing:
    """A container field: reading it hands out something changeable in place, so it is reported.

    A data descriptor on the class wins over the instance `__dict__` where pydantic keeps the
    value; pydantic itself (validation, assignment, serialisation, `==`, copies) works on
    `__dict__` directly and never comes through here.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Step | None, owner: type | None = None) -> Any:
        if obj is None:
            # Not on the class: a subclass of Step would take this object for the field's
            # default (pydantic reads inherited defaults with getattr) and every instance
            # would hold it; absent, the subclass inherits Step's own field definition.
            raise AttributeError(self.name)
        _touch(obj)
        return obj.__dict__[self.name]

    def __set__(self, obj: Step, value: Any) -> None:  # only reached by object.__setattr__
        obj.__dict__[self.name] = value
        _touch(obj)


for _name in _CONTAINER_FIELDS:
    setattr(Step, _name, _Exposing(_name))


def _shared(values: Iterable[Any], base: int) -> bool:
    """Whether any mutable value in `values` (recursively) has a reference besides its parent."""
    for v in values:
        if isinstance(v, (dict, list, set, BaseModel)):
            if sys.getrefcount(v) > base:
                return True
            if isinstance(v, dict):
                if _shared(v.values(), base):
                    return True
            elif isinstance(v, BaseModel):
                if _shared(v.__dict__.values(), base):
                    return True
            elif isinstance(v, list) and _shared(v, base):
                return True
        elif isinstance(v, tuple) and _shared(v, base):  # immutable, but may hold a list
            return True
    return False


# References a value held only by its parent shows inside `_shared` (the parent's slot, the
# loop variable, getrefcount's argument): measured, not assumed, so it holds on any CPython.
_BASE_REFS = next(b for b in range(1, 16) if not _shared([[]], b))


def holds_shared_values(step: Step) -> bool:
    """Whether something outside the step references one of its mutable values.

    Such a value can change after the commit without the step hearing of it (`calls =
    step.tool_calls`, then `calls.append(...)` after a save), so the store keeps the step
    marked for comparison until the outside reference is gone. CPython reference counts are
    exact; the walk costs the size of the step, and runs only for steps being committed.
    """
    return _shared(step.__dict__.values(), _BASE_REFS)


class AgentRun(_CheckedAssignment, BaseModel, metaclass=_KnownFields):
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
    completed = StepStatus.COMPLETED
    for sid in ids:
        step = steps.get(sid)
        if step is None:
            continue
        fields = step.__dict__  # a check, not a change (see Step.is_ready)
        for dep in fields["dependencies"]:
            if dep not in steps:
                problems.append(f"step {sid!r} depends on unknown step {dep!r}")
        if fields["status"] == completed and fields["result"] is None:
            problems.append(f"step {sid!r} is COMPLETED without a result")
    # Only steps with dependencies can be on a cycle: a load of a long run whose steps mostly
    # have none searches those few, not a graph of every step (0.35 s at 100,000 steps).
    edges = {sid: deps for sid, s in steps.items() if (deps := s.__dict__["dependencies"])}
    cycle = find_cycle(edges, roots=None if only is None else [r for r in only if r in edges])
    if cycle is not None:
        problems.append(f"dependency cycle through step {cycle!r}")
    return problems
