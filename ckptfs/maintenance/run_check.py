"""The checks of one run's files, on the one reader: what `ckptfs verify` says of each run.

A run is clean exactly when a load of its newest version follows the chain without falling
back and every file is accounted for: on the chain some start (version 0 or a snapshot) reaches,
or reported. The chain is the reader's (`format.reader.plan_load`), the decoding is the
reader's (`decode_run_file`), the references are the reader's (`collect_refs`): so what verify
accepts is exactly what `CheckpointStore.load_run` loads, and a sparse store (a mirror, a
restore: restore points only) is as clean as the store it came from.

Beyond the loader, verify replays the journal alone against every snapshot and delta (a
compactor bug would show there first) and checks each body's schema field by field, so its
findings name the field that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ckptfs.errors import (
    BrokenChainError,
    CorruptFileError,
    InvalidIdError,
    MisplacedFileError,
    UnsupportedFormatError,
)
from ckptfs.format import codec
from ckptfs.format.changes import apply_body
from ckptfs.format.keys import RunFile, artifact_key, log_key
from ckptfs.format.models import AgentRun, ArtifactRef, Step, ToolCall, graph_problems
from ckptfs.format.reader import REFS_FIELD, LoadPath, RunIndex, collect_refs, decode_run_file, plan_load

_REF_PATH = re.compile(r"^(?:result|tool_calls\.\d+\.result)$")

Finding = tuple[str, str, str, str | None, int | None]  # severity, code, message, key, version


@dataclass
class FileResult:
    """One run file as verify read it: usable for hashes (`header`) and for replay (`record`)."""

    rf: RunFile
    size: int = 0
    header: codec.RecordHeader | None = None
    record: codec.Record | None = None
    refs: dict[str, ArtifactRef] = field(default_factory=dict)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # severity, code, msg


def check_file(data: bytes, rf: RunFile, run_id: str, max_decoded: int) -> FileResult:
    """Decode one file with the reader and check its body's schema as the load will see it."""
    res = FileResult(rf, size=len(data))
    try:
        rec = decode_run_file(data, rf, run_id, max_decoded)
    except UnsupportedFormatError as exc:
        res.problems.append(("error", "unsupported-format", exc.reason))
        return res
    except MisplacedFileError as exc:
        res.problems.append(("error", "misplaced", exc.reason))
        return res
    except BrokenChainError as exc:
        res.problems.append(("error", "chain", exc.reason))
        return res
    except CorruptFileError as exc:
        res.problems.append(("error", "corrupt", exc.reason))
        return res
    res.header = rec.header
    collect_refs(rec.body, res.refs)
    problems = body_problems(rec.body, rf.kind)
    res.problems.extend(("error", "schema", p) for p in problems)
    if not problems:
        res.record = rec
    return res


def _strip_refs(doc: Any) -> Any:
    if isinstance(doc, dict) and REFS_FIELD in doc:
        return {k: v for k, v in doc.items() if k != REFS_FIELD}
    return doc


def _ref_problems(doc: Any, where: str) -> list[str]:
    refs = doc.get(REFS_FIELD) if isinstance(doc, dict) else None
    if refs is None:
        return []
    if not isinstance(refs, dict):
        return [f"{where}: {REFS_FIELD} is not an object"]
    out = []
    for path, ref_doc in refs.items():
        try:
            ref = ArtifactRef.model_validate(ref_doc)
            if ref.uri != artifact_key(ref.sha256):
                raise ValueError(f"uri {ref.uri!r} is not the key of sha256 {ref.sha256}")
        except (ValidationError, ValueError) as exc:
            out.append(f"{where}: bad artifact reference {path!r}: {exc}")
            continue
        if not _REF_PATH.match(str(path)):
            out.append(f"{where}: artifact reference at unknown path {path!r}")
    return out


def body_problems(body: Any, kind: str) -> list[str]:
    """Schema of one body, checked as the load path will see it (pydantic models, no I/O)."""
    state: dict[str, Any] = {"run": None, "steps": {}, "tool_log": {}}
    try:
        apply_body(state, body)
    except ValueError as exc:
        return [str(exc)]
    problems: list[str] = []
    extra = set(body) - {"run", "steps", "removed", "tool_log"}
    if extra:
        problems.append(f"unknown body fields {sorted(extra)}")
    if state["run"] is not None:
        try:
            AgentRun.model_validate({**state["run"], "steps": {}})
        except (ValidationError, InvalidIdError) as exc:
            problems.append(f"run fields do not validate: {first_error(exc)}")
    steps: dict[str, Step] = {}
    for sid, doc in body.get("steps", {}).items():
        problems += _ref_problems(doc, f"step {sid!r}")
        try:
            step = Step.model_validate(_strip_refs(doc))
        except (ValidationError, InvalidIdError) as exc:
            problems.append(f"step {sid!r} does not validate: {first_error(exc)}")
            continue
        if step.id != sid:
            problems.append(f"step stored under {sid!r} has id {step.id!r}")
        steps[sid] = step
    for sid, calls in body.get("tool_log", {}).items():
        for i, call in enumerate(calls):
            problems += _ref_problems(call, f"tool call {sid!r}[{i}]")
            try:
                ToolCall.model_validate(_strip_refs(call))
            except ValidationError as exc:
                problems.append(f"tool call {sid!r}[{i}] does not validate: {first_error(exc)}")
    if kind == "snap" and not problems:
        problems += [f"invalid step graph: {p}" for p in graph_problems(steps)]
    return problems


def first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        return f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
    return str(exc)


def _empty() -> dict[str, Any]:
    return {"run": None, "steps": {}, "tool_log": {}}


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return {"run": state["run"], "steps": dict(state["steps"]),
            "tool_log": {k: list(v) for k, v in state["tool_log"].items()}}


def _normal(state: dict[str, Any]) -> dict[str, Any]:
    return {"run": state["run"], "steps": state["steps"],
            "tool_log": {k: v for k, v in state["tool_log"].items() if v}}


def state_of(path: LoadPath) -> dict[str, Any]:
    """The state a load along `path` rebuilds, before models are applied."""
    state = _empty()
    for body in path.bodies():
        apply_body(state, body)
    return state


class RunAnalysis:
    """The cross-file checks of one run: the load, the hash chain, replay, leftovers."""

    def __init__(self, run_id: str, results: list[FileResult]) -> None:
        self.run_id = run_id
        self.results = results
        self.by_key = {r.rf.key: r for r in results}
        self.logs = {r.rf.version: r for r in results if r.rf.kind == "log"}
        self.snaps = {r.rf.version: r for r in results if r.rf.kind == "snap"}
        self.deltas = [r for r in results if r.rf.kind == "delta"]
        self.flagged = {r.rf.key for r in results if any(p[0] == "error" for p in r.problems)}
        self.index = RunIndex.build([r.rf for r in results])
        self.findings: list[Finding] = []

    def read(self, rf: RunFile) -> codec.Record | None:
        r = self.by_key.get(rf.key)
        return r.record if r is not None else None

    def err(self, code: str, msg: str, key: str | None, version: int | None,
            severity: str = "error") -> None:
        if severity == "error" and key is not None:
            self.flagged.add(key)
        self.findings.append((severity, code, msg, key, version))

    def run(self) -> list[Finding]:
        if self.results:
            self.check_hashes()
            self.check_replay()
            self.check_leftovers()
            self.check_load()
        return self.findings

    # ------------------------------------------------------------------ the load itself

    def check_load(self) -> None:
        """The newest version loads, along the reader's chain, and its state validates."""
        path = plan_load(self.index, self.read, run_id=self.run_id)
        if path is None:
            if not self.flagged:
                self.err("no-state", "no valid state can be loaded for this run", None, None)
            return
        newest = max((r.rf.version for r in self.results if r.record is not None), default=0)
        if path.version < newest:
            self.report_break(path.version)
        last = path.records[-1][0] if path.records else path.start
        assert last is not None  # plan_load returns a path with a start or records
        key = last.key
        state = state_of(path)
        v = path.version
        if state["run"] is None:
            self.err("state", f"no run-level record in the chain up to v{v}", key, v)
            return
        try:
            steps = {sid: _strip_refs(sd) for sid, sd in state["steps"].items()}
            run = AgentRun.model_validate({**state["run"], "steps": steps})
        except (ValidationError, InvalidIdError) as exc:
            self.err("state", f"state at v{v} does not validate: {first_error(exc)}", key, v)
            return
        bad = graph_problems(run.steps)
        if bad:
            self.err("graph", f"invalid step graph at v{v}: " + "; ".join(bad[:3]), key, v)

    def report_break(self, end: int) -> None:
        """A load stops at `end` below newer valid records: name the gap right above it. A file
        that is there but does not continue the chain is reported by its own finding."""
        logs_above = [v for v in self.logs if v > end]
        nxt = (min(logs_above) if logs_above
               else min(r.rf.version for r in self.results if r.rf.version > end))
        if nxt == end + 1:
            return
        where = f"v{end + 1}" if nxt == end + 2 else f"v{end + 1}..v{nxt - 1}"
        top = max(r.rf.version for r in self.results)
        self.err("missing", f"journal record {where} missing: a load stops at v{end}, below the "
                            f"stored v{top}", log_key(self.run_id, end + 1), end + 1)

    # ------------------------------------------------------------------ hashes

    def known_hashes(self) -> dict[int, str]:
        """The hash each version is known by: its journal record first, else snapshot, else delta."""
        out: dict[int, str] = {0: ""}
        for r in self.deltas:
            if r.header is not None:
                out[r.rf.version] = r.header.hash
        for v, r in self.snaps.items():
            if r.header is not None:
                out[v] = r.header.hash
        for v, r in self.logs.items():
            if r.header is not None:
                out[v] = r.header.hash
        return out

    def check_hashes(self) -> None:
        hashes = self.known_hashes()
        for v, r in sorted(self.logs.items()):
            h = r.header
            if h is not None and h.base in hashes and h.base_hash != hashes[h.base]:
                self.err("chain", f"base_hash does not match the hash of version {h.base} "
                                  f"(hash chain broken)", r.rf.key, v)
        for v, r in sorted(self.snaps.items()):
            j = self.logs.get(v)
            if r.header is not None and j is not None and j.header is not None and \
                    r.header.hash != j.header.hash:
                self.err("chain", f"snapshot hash disagrees with the journal record at v{v}",
                         r.rf.key, v)
        for r in self.deltas:
            h = r.header
            if h is None:
                continue
            end = self.logs.get(h.version)
            if end is not None and end.header is not None and h.hash != end.header.hash:
                self.err("chain", f"delta hash disagrees with the journal record at v{h.version}",
                         r.rf.key, h.version)
            if h.base in hashes and h.base_hash != hashes[h.base]:
                self.err("chain", f"delta base_hash disagrees with the hash of v{h.base}",
                         r.rf.key, h.version)

    # ------------------------------------------------------------------ replay

    def check_replay(self) -> None:
        """Replay the journal alone from each start; every snapshot and delta it passes must
        hold exactly the state the journal records add up to."""
        covered: set[tuple[int, str]] = set()
        starts = sorted((s for s in self.index.starts()), key=lambda s: -1 if s is None else s.version)
        for start in starts:
            if start is None:
                state, cursor, chash = _empty(), 0, ""
            else:
                rec = self.read(start)
                if rec is None:
                    continue
                state = _empty()
                apply_body(state, rec.body)
                cursor, chash = start.version, rec.header.hash
            if (cursor, chash) in covered:
                continue
            pending: dict[int, list[tuple[FileResult, dict[str, Any]]]] = {}
            self._deltas_from(cursor, chash, state, pending)
            for rf, rec in self.index.follow(cursor, chash, self.read, run_id=self.run_id, deltas=False):
                apply_body(state, rec.body)
                cursor, chash = rf.version, rec.header.hash
                covered.add((cursor, chash))
                snap = self.snaps.get(cursor)
                if (snap is not None and snap.record is not None and snap.record.header.hash == chash
                        and snap.rf is not start):
                    snap_state = _empty()
                    apply_body(snap_state, snap.record.body)
                    if _normal(snap_state) != _normal(state):
                        self.err("replay", f"snapshot content differs from the journal replayed "
                                           f"to v{cursor}", snap.rf.key, cursor)
                for d, ds in pending.pop(cursor, []):
                    same_end = d.record is not None and d.record.header.hash == chash
                    if same_end and _normal(ds) != _normal(state):
                        self.err("replay", f"delta content differs from journal records "
                                           f"v{d.rf.base + 1}..v{cursor}", d.rf.key, cursor)
                self._deltas_from(cursor, chash, state, pending)

    def _deltas_from(self, cursor: int, chash: str, state: dict[str, Any],
                     pending: dict[int, list[tuple[FileResult, dict[str, Any]]]]) -> None:
        for d in self.deltas:
            if d.rf.base == cursor and d.record is not None and d.record.header.base_hash == chash:
                ds = _copy_state(state)
                apply_body(ds, d.record.body)
                pending.setdefault(d.rf.version, []).append((d, ds))

    # ------------------------------------------------------------------ leftovers

    def check_leftovers(self) -> None:
        """Every valid record builds on a state some start reaches; the rest are reported."""
        reached: dict[int, set[str]] = {0: {""}}
        for v, r in self.snaps.items():
            if r.record is not None:
                reached.setdefault(v, set()).add(r.record.header.hash)
        edges = sorted((r for r in (*self.logs.values(), *self.deltas) if r.record is not None),
                       key=lambda r: r.rf.version)
        via: set[int] = set()
        changed = True
        while changed:  # versions only grow along edges: a few passes settle it
            changed = False
            for r in edges:
                rec = r.record
                assert rec is not None
                if rec.header.hash in reached.get(r.rf.version, set()):
                    continue
                if rec.header.base_hash in reached.get(rec.header.base, set()):
                    reached.setdefault(r.rf.version, set()).add(rec.header.hash)
                    via.add(r.rf.version)
                    changed = True
        newest = max((v for v, hs in reached.items() if hs and (v in via or v in self.snaps)), default=0)
        floor = min(self.snaps) if self.snaps else 0
        missing: set[int] = set()
        for r in edges:
            rec = r.record
            assert rec is not None
            base = rec.header.base
            if rec.header.hash in reached.get(r.rf.version, set()):
                continue
            root = self.chain_root(base)
            if r.rf.version <= floor and root not in self.logs:
                continue  # below the oldest snapshot, built on what retention already removed
            why = self.describe(base) if root == base else f"builds on v{root}, which {self.describe(root)}"
            if root not in self.logs and root > floor and root not in missing:
                # above the oldest snapshot retention deletes nothing: a record there was lost
                missing.add(root)
                self.err("missing", f"journal record v{root} missing: v{r.rf.version} builds on it "
                                    f"(above the oldest snapshot v{floor}, where retention never deletes)",
                         log_key(self.run_id, root), root)
            if r.rf.version > newest:
                self.err("beyond-valid", f"v{r.rf.version} is beyond the newest valid version v{newest}: "
                                         f"it builds on v{base}, which {why}", r.rf.key, r.rf.version,
                         severity="warning")
            else:
                self.err("unreachable", f"v{r.rf.version} is off the valid chain: it builds on v{base}, "
                                        f"which {why}", r.rf.key, r.rf.version, severity="warning")

    def chain_root(self, version: int) -> int:
        """Follow base links down through valid journal records to the first missing or bad one."""
        seen: set[int] = set()
        while version in self.logs and version not in seen and version > 0:
            seen.add(version)
            rec = self.logs[version].record
            if rec is None:
                return version
            version = rec.header.base
        return version

    def describe(self, version: int) -> str:
        r = self.logs.get(version)
        if r is None:
            return "is missing"
        if r.header is None or r.record is None:
            return "is unreadable or invalid"
        return "is itself unreachable or its hash differs"
