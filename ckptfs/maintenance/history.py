"""A run's history for people: its versions, its state at one version with the tool log, and
what changed between two versions. Read-only; what `ckptfs versions`, `show`, `diff` and
`export` print.

Which state a version has is the store's decision (`CheckpointStore.load_run`: hash chain,
fallback past damaged files, validation). This module adds what an operator asks next, read
with the one chain walk every command shares (`format.reader.plan_load`):

* which files make each version (journal record, delta, snapshot), when it was written, by
  which writer, how far the run was (the header's summary, so no state is rebuilt per version);
* the tool calls logged up to a version: the log lives beside the steps in each record body,
  so it is rebuilt along the very chain that ends at the loaded version;
* tokens and cost: per step (`Step.tokens`, `Step.cost_usd`), per run (`AgentRun.total_*`), and
  per tool call where the tool's result reports them (`tokens`/`total_tokens`, `cost_usd`/`cost`,
  also under `usage`), which is the shape the README's tools return.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from ckptfs.format.codec import MAX_INT_DIGITS, json_problem
from ckptfs.format.keys import RunFile, parse_run_key, run_prefix
from ckptfs.format.models import AgentRun, ToolCall, validate_id
from ckptfs.format.reader import loadable_versions
from ckptfs.storage.base import Storage
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.compactor import CompactionPolicy
from ckptfs.store.loader import read_headers

logger = logging.getLogger(__name__)

_KIND_ORDER = {"log": 0, "delta": 1, "snap": 2}


def read_only_store(storage: Storage) -> CheckpointStore:
    """A store over `storage` that never writes: no background compaction, no retention."""
    return CheckpointStore(storage=storage, policy=CompactionPolicy(background=False, keep_last=0))


def run_files(storage: Storage, run_id: str, keys: list[str] | None = None) -> list[RunFile]:
    """The run's well-formed record files (temp files and strays are verify's business), from
    `keys` when the caller has listed the run already."""
    validate_id(run_id, "run id")
    if keys is None:
        keys = storage.list(run_prefix(run_id))
    return [rf for rf in (parse_run_key(k) for k in keys) if rf is not None]


# ------------------------------------------------------------------------------ versions


@dataclass
class VersionInfo:
    """One stored version of a run, as its files describe it."""

    version: int
    kinds: list[str]  # files that end at this version: "log", "delta", "snap"
    time: float | None = None  # the writer's clock when the record was written
    writer: str | None = None
    status: str | None = None
    completed: int | None = None
    failed: int | None = None
    total: int | None = None
    bytes: int = 0
    readable: bool = True  # False: every file of this version failed to decode (verify says why)
    restore_point: bool | None = None  # a restore (a load of exactly this version) reaches it

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "kinds": self.kinds, "time": self.time, "writer": self.writer,
                "status": self.status, "completed": self.completed, "failed": self.failed,
                "total": self.total, "bytes": self.bytes, "readable": self.readable,
                "restore_point": self.restore_point}


def list_versions(storage: Storage, run_id: str, *, workers: int = 8,
                  keys: list[str] | None = None) -> list[VersionInfo]:
    """Every version a run's files end at, oldest first, with time and progress from headers,
    and whether a restore can target it (`reader.loadable_versions`).

    Every file's header is read (`read_headers`: in parallel on remote backends, the body
    hashed, never parsed), so the cost is one GET per file, not a state rebuild per version.
    A version's time and progress are those of its first file that reads, the journal record
    first (the smallest).
    """
    files = run_files(storage, run_id, keys)
    headers = read_headers(storage, run_id, files, workers)
    by_version: dict[int, list[RunFile]] = {}
    for rf in files:
        by_version.setdefault(rf.version, []).append(rf)
    points = loadable_versions({rf: got[0] if got else None for rf, got in headers.items()})
    infos: list[VersionInfo] = []
    for version in sorted(by_version):
        fs = sorted(by_version[version], key=lambda f: _KIND_ORDER[f.kind])
        info = VersionInfo(version, sorted({f.kind for f in fs}, key=_KIND_ORDER.__getitem__),
                           restore_point=version in points)
        got = next((g for f in fs if (g := headers[f]) is not None), None)
        if got is None:
            info.readable = False
        else:
            h, info.bytes = got
            s = h.summary or {}
            info.time, info.writer = h.time, h.writer
            # the summary is free-form in the header: only the shapes this store writes count
            status = s.get("status")
            info.status = status if isinstance(status, str) else None
            info.completed, info.failed, info.total = (_count(s.get(k))
                                                       for k in ("completed", "failed", "total"))
        infos.append(info)
    return infos


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ---------------------------------------------------------------------------- run state


@dataclass
class RunState:
    """A run at one version, with the tool calls logged up to that version."""

    run: AgentRun
    version: int
    tool_log: dict[str, list[ToolCall]]
    skipped: list[str] = field(default_factory=list)  # files the load skipped (damaged)
    notes: list[str] = field(default_factory=list)

    def calls(self, step_id: str) -> list[ToolCall]:
        """A step's tool calls: the log's, else the ones kept on the step itself."""
        return self.tool_log.get(step_id) or list(self.run.steps[step_id].tool_calls)

    def to_dict(self) -> dict[str, Any]:
        """The state as plain JSON data: the run (steps included) and its tool log."""
        doc = self.run.model_dump(mode="json")
        return {"run_id": self.run.run_id, "version": self.version, "run": doc,
                "tool_log": {sid: [c.model_dump(mode="json") for c in calls]
                             for sid, calls in self.tool_log.items()},
                "totals": totals(self), "skipped": self.skipped, "notes": self.notes}


def load_state(storage: Storage, run_id: str, version: int | None = None, *,
               artifacts: bool = False) -> RunState | None:
    """The run at `version` (default: newest valid) with its tool log; None if never saved.

    `artifacts=True` puts large values back (read from `artifacts/`, sha256 checked); otherwise
    they stay as the summaries the records hold. Raises what `load_run` raises
    (VersionNotFoundError, CheckpointCorruptError).
    """
    store = read_only_store(storage)
    try:
        got = store.load_with_tool_log(run_id, version, resolve_artifacts=artifacts)
        if got is None:
            return None
        run, log = got
        info = store.last_load
        loaded = info.version if info is not None else (version or 0)
        return RunState(run, loaded, log, list(info.skipped) if info is not None else [])
    finally:
        store.close()


# ------------------------------------------------------------------------ tokens and cost


def call_usage(call: ToolCall) -> tuple[int | None, float | None]:
    """(tokens, cost in USD) a tool call's result reports, if it reports them.

    The first number found under each name counts. Tokens given as an int stay exact. A cost
    no finite float holds (10**400, an int a commit stores) is None, not a guess or Infinity:
    float() of it stopped `show` with "unexpected OverflowError", and the call's result, which
    every view shows whole, still has it."""
    result = call.result
    if not isinstance(result, Mapping):
        return None, None
    places = [result]
    usage = result.get("usage")
    if isinstance(usage, Mapping):
        places.append(usage)
    tokens = _reported(places, ("tokens", "total_tokens"))
    if isinstance(tokens, float):  # an int stays exact: float() would round it, or overflow
        tokens = None if _finite(tokens) is None else int(tokens)
    return tokens, _finite(_reported(places, ("cost_usd", "cost")))


def _reported(places: list[Mapping[Any, Any]], keys: tuple[str, ...]) -> int | float | None:
    for place in places:
        for key in keys:
            v = place.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return v
    return None


def _finite(v: int | float | None) -> float | None:
    try:
        f = None if v is None else float(v)
    except OverflowError:
        return None
    return f if f is not None and math.isfinite(f) else None


def totals(state: RunState) -> dict[str, Any]:
    """Run totals: steps by status, tokens and cost (the run's own counters, and the steps'
    sum), tool calls by phase, and their duration.

    Every value is one `json.loads` reads back with its default limits, and exact. Each stored
    value is (a commit refuses any other), but a sum need not be: two steps of 1.7e308 USD made
    `step_cost_usd` Infinity, which is no JSON, and two of 4,300-digit tokens a 4,301-digit int,
    which json.loads refuses; `show --json` and `export` wrote both. So a sum past those limits
    is given another way, `overflow` names each such total with how it is given (empty when
    there is none: a reader checks that one key, not each value's type), and the state's notes
    say it too, which every view prints (show's text on stderr, under its huge numbers):

    * a float sum past the largest float (`step_cost_usd`, `tool_ms`) is the integer nearest
      its exact value: a JSON number json.loads takes back whole, off by at most one half in
      over 1e308, and still a number for the text view's arithmetic (`tool_ms / 1000`);
    * an int sum past MAX_INT_DIGITS digits (`step_tokens`) is its decimal digits as a string:
      no number a reader with default limits accepts holds it, and a string drops no digit.

    A sum only an intermediate total overflowed ([1e308, 1e308, -1e308]) is the float it is.
    """
    run = state.run
    by_status: dict[str, int] = {}
    for s in run.steps.values():
        by_status[s.status.value] = by_status.get(s.status.value, 0) + 1
    calls = [c for sid in run.steps for c in state.calls(sid)]
    phases: dict[str, int] = {}
    for c in calls:
        phases[c.phase] = phases.get(c.phase, 0) + 1
    overflow: dict[str, str] = {}
    doc = {
        "steps": len(run.steps), "by_status": by_status,
        "tokens": run.total_tokens, "cost_usd": run.total_cost_usd,
        "step_tokens": _int_total((s.tokens for s in run.steps.values()), "step_tokens", overflow),
        "step_cost_usd": _float_total([s.cost_usd for s in run.steps.values()], "step_cost_usd", overflow),
        "tool_calls": len(calls), "tool_calls_by_phase": phases,
        "tool_ms": _float_total([c.duration_ms or 0.0 for c in calls], "tool_ms", overflow),
        "overflow": overflow,
    }
    for name, how in overflow.items():
        note = f"total {name} {how}"
        if note not in state.notes:  # once, however many views of the state ask for its totals
            state.notes.append(note)
    return doc


def _int_total(values: Iterable[int], name: str, overflow: dict[str, str]) -> int | str:
    total = sum(values)
    if json_problem(total, name) is None:
        return total
    overflow[name] = (f"has over {MAX_INT_DIGITS:,} digits, more than json.loads reads in a number: "
                      "given as a string of its digits")
    return str(Decimal(total))  # exact, and not subject to the int-to-str digit limit str() has


def _float_total(values: list[float], name: str, overflow: dict[str, str]) -> float | int:
    total = sum(values)
    if math.isfinite(total) or not all(math.isfinite(v) for v in values):
        # a non-finite summand is in the stored state itself (only a hand-made record holds
        # one: commits refuse them), and is shown there as it is; its sum is not made up here
        return total
    exact = sum(map(Fraction, values), Fraction(0))
    try:
        return float(exact)
    except OverflowError:
        overflow[name] = ("is past the largest float (Infinity, which is no JSON): given as the "
                          "integer nearest the exact sum")
        return round(exact)


# ---------------------------------------------------------------------------------- diff


@dataclass
class RunDiff:
    """What changed from one version of a run to another."""

    run_id: str
    old: int
    new: int
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)  # step -> fields that differ
    status_changes: list[tuple[str, str, str]] = field(default_factory=list)  # step, old, new
    run_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    calls_added: dict[str, list[ToolCall]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.run_changes or self.calls_added)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "old": self.old, "new": self.new, "added": self.added,
                "removed": self.removed, "changed": self.changed,
                "status_changes": [{"step": s, "old": a, "new": b} for s, a, b in self.status_changes],
                "run_changes": {k: {"old": a, "new": b} for k, (a, b) in self.run_changes.items()},
                "tool_calls_added": {sid: [c.model_dump(mode="json") for c in calls]
                                     for sid, calls in self.calls_added.items()}}


_RUN_FIELDS = ("goal", "status", "total_tokens", "total_cost_usd", "replan_count")


def diff_states(old: RunState, new: RunState) -> RunDiff:
    """Steps added, removed and changed (which fields), status changes, run-level changes, and
    tool calls logged in `new` that `old` did not have (by call id)."""
    d = RunDiff(new.run.run_id, old.version, new.version)
    a, b = old.run.steps, new.run.steps
    d.added = [sid for sid in b if sid not in a]
    d.removed = [sid for sid in a if sid not in b]
    for sid in b:
        if sid not in a:
            continue
        da, db = a[sid].model_dump(mode="json"), b[sid].model_dump(mode="json")
        fields = [k for k in db if da.get(k) != db.get(k)]
        if fields:
            d.changed[sid] = fields
        if a[sid].status != b[sid].status:
            d.status_changes.append((sid, a[sid].status.value, b[sid].status.value))
    for sid in d.added:
        d.status_changes.append((sid, "-", b[sid].status.value))
    for name in _RUN_FIELDS:
        va, vb = getattr(old.run, name), getattr(new.run, name)
        if va != vb:
            d.run_changes[name] = (va, vb)
    for sid in b:
        seen = {c.id for c in old.calls(sid)} if sid in a else set()
        fresh = [c for c in new.calls(sid) if c.id not in seen]
        if fresh:
            d.calls_added[sid] = fresh
    return d
