"""The integrity checker behind `ckptfs verify`: reads a store, never writes, reports everything.

Like restic's checker it is not the writer: it reads through `Storage`, turns every problem
into a typed `Finding` (severity, run, version, key, message) and keeps going, so one run
over a damaged bucket says where all the damage is. It decodes with the store's own code
paths (`codec.decode`, `changes.apply_body`, `models.graph_problems`, `layout.parse_run_key`)
so that what verify accepts is what `CheckpointStore.load_run` can load.

Per run it checks every file (zstd frame and content checksum, format and version, body
sha256, schema, file name against header), the hash chain between journal records, deltas
and snapshots, that journal versions are contiguous above the oldest snapshot (retention
only removes what lies below it), that journal records replay onto each snapshot and each
delta, that the newest reachable state is a valid step graph, and that every referenced
artifact exists (and, at level "data", matches its sha256). Leftovers are reported too:
temp files, stray keys, records beyond or off the valid chain, unreferenced artifacts.
A LangGraph saver's keys under `langgraph/` are checked by `integrations/lgcheck.py`.

`subset="K/N"` hashes only the K-th of N deterministic slices of the artifacts (by their
sha256 name), restic's `--read-data-subset`, so a large bucket is covered over N nights;
run files are always checked in full unless `subset_runs` slices runs by the hash of
their id as well.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from ckptfs.errors import (
    ConfigError,
    CorruptFileError,
    InvalidIdError,
    StorageUnavailableError,
    UnsupportedFormatError,
)
from ckptfs.format import codec
from ckptfs.format.changes import apply_body
from ckptfs.format.keys import RUNS, RunFile, artifact_key, log_key, parse_artifact_key, parse_run_key
from ckptfs.format.models import AgentRun, ArtifactRef, Step, ToolCall, graph_problems, validate_id
from ckptfs.integrations.langgraph.check import check_langgraph
from ckptfs.integrations.langgraph.keys import LG_ROOT
from ckptfs.storage.base import TEMP_MARKER, Storage
from ckptfs.storage.redact import scrub_secrets
from ckptfs.storage.registry import open_storage
from ckptfs.store.checkpoint_store import REFS_FIELD

logger = logging.getLogger(__name__)

LEVELS = ("structure", "data")
SEVERITIES = ("error", "warning", "info")
_KIND = {"log": "journal", "delta": "delta", "snap": "snapshot"}
_CHUNK = 1024 * 1024
_REF_PATH = re.compile(r"^(?:result|tool_calls\.\d+\.result)$")
_IGNORED_RUN_DIRS = frozenset({"lease"})  # multi-worker leases: not checkpoint files
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Finding:
    """One problem, precise enough to act on: which file, which run and version, what is wrong.

    severity: "error" (damage: something cannot be loaded or trusted), "warning" (a leftover
    or an unreachable record: nothing is lost now, but the store is not as the writer left
    it), "info" (worth knowing, nothing to fix; e.g. an artifact prune will collect).
    """

    severity: str
    code: str
    message: str
    key: str | None = None
    run: str | None = None
    version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """All findings of one verify, plus what was covered, so a clean report means something."""

    url: str
    level: str
    run_id: str | None = None
    subset: str | None = None
    findings: list[Finding] = field(default_factory=list)
    runs: int = 0
    files: int = 0
    artifacts: int = 0
    artifacts_hashed: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    empty: bool = False

    def add(self, severity: str, code: str, message: str, key: str | None = None,
            run: str | None = None, version: int | None = None) -> None:
        self.findings.append(Finding(severity, code, message, key, run, version))

    def count(self, severity: str) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def problems(self) -> list[Finding]:
        """Errors and warnings: what makes `ckptfs verify` exit 1."""
        return [f for f in self.findings if f.severity != "info"]

    @property
    def ok(self) -> bool:
        return not self.problems

    def named_keys(self) -> set[str]:
        return {f.key for f in self.findings if f.key is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "run": self.run_id, "level": self.level, "subset": self.subset,
            "ok": self.ok, "empty": self.empty,
            "counts": {s: self.count(s) for s in SEVERITIES},
            "checked": {"runs": self.runs, "files": self.files, "artifacts": self.artifacts,
                        "artifacts_hashed": self.artifacts_hashed, "bytes": self.bytes_read},
            "seconds": round(self.seconds, 3),
            "findings": [f.to_dict() for f in self.findings],
        }


def parse_subset(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N), 1 <= K <= N; anything else is a ConfigError naming the text."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ConfigError(f"subset {text!r} is not K/N with 1 <= K <= N (e.g. 3/10)")
    return int(m[1]), int(m[2])


def in_subset(hex_digest: str, k: int, n: int) -> bool:
    """Deterministic slice membership: a sha256 is already uniform, so its prefix decides."""
    return int(hex_digest[:16], 16) % n == k - 1


def open_readonly_target(target: str | Storage, storage_options: Mapping[str, Any] | None) -> Storage:
    """A Storage for `target`; a URL is opened, a Storage is used as it is."""
    if isinstance(target, Storage):
        return target
    return open_storage(target, storage_options)


def list_keys(storage: Storage, prefix: str) -> list[str]:
    """List once, turning any failure to reach the store into StorageUnavailableError."""
    try:
        return storage.list(prefix)
    except (StorageUnavailableError, ConfigError):
        raise
    except Exception as exc:  # botocore/s3fs raise many types for a bad endpoint
        msg = scrub_secrets(f"{storage.display_url}: cannot list the store: {type(exc).__name__}: {exc}",
                    storage.options)
        raise StorageUnavailableError(msg) from None


# ------------------------------------------------------------------------------- per file


@dataclass
class _FileResult:
    rf: RunFile
    size: int = 0
    header: codec.RecordHeader | None = None  # decodable and named right: usable for hashes
    record: codec.Record | None = None  # also schema-valid: usable for replay
    refs: dict[str, ArtifactRef] = field(default_factory=dict)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # severity, code, msg


def _strip_refs(doc: Any) -> Any:
    if isinstance(doc, dict) and REFS_FIELD in doc:
        return {k: v for k, v in doc.items() if k != REFS_FIELD}
    return doc


def _collect_refs(doc: Any, where: str, out: dict[str, ArtifactRef], problems: list[str]) -> None:
    refs = doc.get(REFS_FIELD) if isinstance(doc, dict) else None
    if refs is None:
        return
    if not isinstance(refs, dict):
        problems.append(f"{where}: {REFS_FIELD} is not an object")
        return
    for path, ref_doc in refs.items():
        try:
            ref = ArtifactRef.model_validate(ref_doc)
            if ref.uri != artifact_key(ref.sha256):
                raise ValueError(f"uri {ref.uri!r} is not the key of sha256 {ref.sha256}")
        except (ValidationError, ValueError) as exc:
            problems.append(f"{where}: bad artifact reference {path!r}: {exc}")
            continue
        if not _REF_PATH.match(str(path)):
            problems.append(f"{where}: artifact reference at unknown path {path!r}")
        out[ref.sha256] = ref


def body_refs(body: Any) -> tuple[dict[str, ArtifactRef], list[str]]:
    """Artifacts a decoded body references (by sha256), and any malformed reference found."""
    refs: dict[str, ArtifactRef] = {}
    problems: list[str] = []
    if not isinstance(body, dict):
        return refs, ["record body is not an object"]
    steps = body.get("steps")
    for sid, doc in (steps.items() if isinstance(steps, dict) else []):
        _collect_refs(doc, f"step {sid!r}", refs, problems)
    tool_log = body.get("tool_log")
    for sid, calls in (tool_log.items() if isinstance(tool_log, dict) else []):
        for i, call in enumerate(calls if isinstance(calls, list) else []):
            _collect_refs(call, f"tool call {sid!r}[{i}]", refs, problems)
    return refs, problems


def _body_problems(body: Any, kind: str, refs: dict[str, ArtifactRef]) -> list[str]:
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
            problems.append(f"run fields do not validate: {_first_error(exc)}")
    steps: dict[str, Step] = {}
    for sid, doc in body.get("steps", {}).items():
        _collect_refs(doc, f"step {sid!r}", refs, problems)
        try:
            step = Step.model_validate(_strip_refs(doc))
        except (ValidationError, InvalidIdError) as exc:
            problems.append(f"step {sid!r} does not validate: {_first_error(exc)}")
            continue
        if step.id != sid:
            problems.append(f"step stored under {sid!r} has id {step.id!r}")
        steps[sid] = step
    for sid, calls in body.get("tool_log", {}).items():
        for i, call in enumerate(calls):
            _collect_refs(call, f"tool call {sid!r}[{i}]", refs, problems)
            try:
                ToolCall.model_validate(_strip_refs(call))
            except ValidationError as exc:
                problems.append(f"tool call {sid!r}[{i}] does not validate: {_first_error(exc)}")
    if kind == "snap" and not problems:
        problems += [f"invalid step graph: {p}" for p in graph_problems(steps)]
    return problems


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        return f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
    return str(exc)


# ----------------------------------------------------------------------------- checker


class _Checker:
    def __init__(self, storage: Storage, report: Report, *, level: str,
                 subset: tuple[int, int] | None, subset_runs: bool, workers: int,
                 max_decoded_bytes: int, progress: Progress | None) -> None:
        self.storage = storage
        self.report = report
        self.level = level
        self.subset = subset
        self.subset_runs = subset_runs
        self.max_decoded = max_decoded_bytes
        self.progress = progress
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ckptfs-verify")
        self.refs: dict[str, tuple[ArtifactRef, str]] = {}  # sha -> (ref, first referencing key)
        self.done = 0
        self.total = 0

    def tick(self, n: int = 1, what: str = "") -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total, what)

    # ---------------------------------------------------------------- reading one file

    def read_run_file(self, run_id: str, rf: RunFile) -> _FileResult:
        res = _FileResult(rf)
        try:
            data = self.storage.get(rf.key)
        except FileNotFoundError:
            res.problems.append(("warning", "vanished",
                                 "listed, then gone before it was read (concurrent retention?)"))
            return res
        except Exception as exc:  # keep going: one unreadable file is one finding
            msg = scrub_secrets(f"cannot read: {type(exc).__name__}: {exc}", self.storage.options)
            res.problems.append(("error", "unreadable", msg))
            return res
        res.size = len(data)
        try:
            rec = codec.decode(data, rf.key, self.max_decoded)
        except UnsupportedFormatError as exc:
            res.problems.append(("error", "unsupported-format", exc.reason))
            return res
        except CorruptFileError as exc:
            res.problems.append(("error", "corrupt", exc.reason))
            return res
        h = rec.header
        if h.kind != _KIND[rf.kind] or h.run_id != run_id or h.version != rf.version or (
                rf.kind != "log" and h.base != rf.base):
            res.problems.append(("error", "misplaced",
                                 f"header says {h.kind} of run {h.run_id!r} v{h.version} (base {h.base}); "
                                 f"the file name says {_KIND[rf.kind]} of run {run_id!r} v{rf.version}"))
            return res
        if rf.kind == "snap" and h.base_hash != h.hash:
            res.problems.append(("error", "chain", "snapshot base_hash differs from its own hash"))
        res.header = h
        problems = _body_problems(rec.body, rf.kind, res.refs)
        for p in problems:
            res.problems.append(("error", "schema", p))
        if not problems:
            res.record = rec
        return res

    # ---------------------------------------------------------------------- one run

    def check_run(self, run_id: str, rfs: list[RunFile]) -> None:
        rep = self.report
        results = list(self.pool.map(lambda rf: self.read_run_file(run_id, rf), rfs))
        self.tick(len(rfs), run_id)
        rep.files += len(rfs)
        for r in results:
            rep.bytes_read += r.size
            for sev, code, msg in r.problems:
                rep.add(sev, code, msg, r.rf.key, run_id, r.rf.version)
            for sha, ref in r.refs.items():
                self.refs.setdefault(sha, (ref, r.rf.key))
        _RunAnalysis(run_id, results, rep).run()

    # ---------------------------------------------------------------------- artifacts

    def hash_artifact(self, sha: str, expected_size: int | None) -> tuple[str, int, str | None]:
        key = artifact_key(sha)
        h = hashlib.sha256()
        n = 0
        try:
            with self.storage.open_read(key) as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
        except FileNotFoundError:
            return key, n, "vanished"
        except Exception as exc:
            return key, n, scrub_secrets(f"cannot read: {type(exc).__name__}: {exc}", self.storage.options)
        if h.hexdigest() != sha:
            return key, n, f"content sha256 is {h.hexdigest()}, not the {sha} it is named by"
        if expected_size is not None and n != expected_size:
            return key, n, f"is {n} bytes, referenced as {expected_size}"
        return key, n, None


class _RunAnalysis:
    """The cross-file checks of one run: hash chain, contiguity, replay, reachability."""

    def __init__(self, run_id: str, results: list[_FileResult], report: Report) -> None:
        self.run_id = run_id
        self.rep = report
        self.results = results
        self.logs = {r.rf.version: r for r in results if r.rf.kind == "log"}
        self.snaps = {r.rf.version: r for r in results if r.rf.kind == "snap"}
        self.deltas = [r for r in results if r.rf.kind == "delta"]
        self.flagged = {r.rf.key for r in results if any(p[0] == "error" for p in r.problems)}

    def err(self, code: str, msg: str, key: str | None, version: int | None,
            severity: str = "error") -> None:
        if severity == "error" and key is not None:
            self.flagged.add(key)
        self.rep.add(severity, code, msg, key, self.run_id, version)

    def run(self) -> None:
        if not self.results:
            return
        hashes = self.known_hashes()
        self.check_hashes(hashes)
        self.check_contiguous()
        self.check_replay()
        self.check_reachable()

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

    def check_hashes(self, hashes: dict[int, str]) -> None:
        for v, r in sorted(self.logs.items()):
            h = r.header
            if h is None:
                continue
            if h.base in hashes and h.base_hash != hashes[h.base]:
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

    def check_contiguous(self) -> None:
        """Journal versions form one unbroken range above the oldest snapshot.

        Retention deletes journal records at or below the oldest kept snapshot and nothing
        else, and a version number is consumed only by a created file (even a corrupt one
        stays), so a hole above the oldest snapshot is a file that was lost.
        """
        floor = min(self.snaps) if self.snaps else 0
        top = max(r.rf.version for r in self.results)
        missing = [v for v in range(floor + 1, top + 1) if v not in self.logs]
        for a, b in _ranges(missing):
            where = f"v{a}" if a == b else f"v{a}..v{b}"
            why = (f"above the oldest snapshot v{floor}, where retention never deletes" if self.snaps
                   else "and the run has no snapshot to start from")
            self.err("missing", f"journal record {where} missing ({why})", log_key(self.run_id, a), a)

    def check_replay(self) -> None:
        """Replay journal records from each start and compare with every snapshot and delta.

        A start is version 0 or a valid snapshot; when the journal chain breaks, the walk
        resumes at the next valid snapshot above the break.
        """
        good_logs: dict[int, list[_FileResult]] = {}
        for r in self.logs.values():
            if r.record is not None:
                good_logs.setdefault(r.record.header.base, []).append(r)
        for lst in good_logs.values():
            lst.sort(key=lambda x: x.rf.version)
        good_snaps = {v: r for v, r in self.snaps.items() if r.record is not None}
        deltas_by_base: dict[int, list[_FileResult]] = {}
        for r in self.deltas:
            if r.record is not None:
                deltas_by_base.setdefault(r.rf.base, []).append(r)
        top = max(r.rf.version for r in self.results)
        pending: dict[int, list[tuple[_FileResult, dict[str, Any]]]] = {}
        starts = sorted(good_snaps)
        cursor: int | None = 0 if good_logs.get(0) else (starts[0] if starts else None)
        state: dict[str, Any] = {}
        chash = ""
        if cursor is not None:
            state, chash = self.start_state(cursor, good_snaps)
        while cursor is not None and cursor < top:
            for d in deltas_by_base.get(cursor, []):
                if d.record is not None and d.record.header.base_hash == chash:
                    ds = _copy_state(state)
                    apply_body(ds, d.record.body)
                    pending.setdefault(d.rf.version, []).append((d, ds))
            nxt = next((r for r in good_logs.get(cursor, [])
                        if r.record is not None and r.record.header.base_hash == chash), None)
            if nxt is None or nxt.record is None:
                later = [s for s in starts if s > cursor]
                cursor = later[0] if later else None
                if cursor is not None:
                    state, chash = self.start_state(cursor, good_snaps)
                continue
            apply_body(state, nxt.record.body)
            cursor, chash = nxt.rf.version, nxt.record.header.hash
            snap = good_snaps.get(cursor)
            if (snap is not None and snap.record is not None and snap.record.header.hash == chash
                    and _normal(_from_body(snap.record.body)) != _normal(state)):
                self.err("replay", f"snapshot content differs from the journal replayed to v{cursor}",
                         snap.rf.key, cursor)
            for d, ds in pending.pop(cursor, []):
                if d.record is not None and d.record.header.hash == chash and _normal(ds) != _normal(state):
                    self.err("replay", f"delta content differs from journal records "
                                       f"v{d.rf.base + 1}..v{cursor}", d.rf.key, cursor)

    def start_state(self, version: int, snaps: dict[int, _FileResult]) -> tuple[dict[str, Any], str]:
        if version == 0:
            return {"run": None, "steps": {}, "tool_log": {}}, ""
        rec = snaps[version].record
        assert rec is not None
        return _from_body(rec.body), rec.header.hash

    def check_reachable(self) -> None:
        """Which records a load can reach; the rest are beyond or off the valid chain."""
        sources: dict[int, set[str]] = {0: {""}}
        for v, r in self.snaps.items():
            if r.record is not None:
                sources.setdefault(v, set()).add(r.record.header.hash)
        edges: list[_FileResult] = [r for r in (*self.logs.values(), *self.deltas) if r.record is not None]
        edges.sort(key=lambda r: r.rf.version)
        reached: dict[int, set[str]] = {v: set(h) for v, h in sources.items()}
        via: dict[int, _FileResult] = {}
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
                    via.setdefault(r.rf.version, r)
                    changed = True
        newest = max((v for v, hs in reached.items() if hs and (v in via or v in self.snaps)), default=0)
        floor = min(self.snaps) if self.snaps else 0
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
            if r.rf.version > newest:
                self.err("beyond-valid", f"v{r.rf.version} is beyond the newest valid version v{newest}: "
                                         f"it builds on v{base}, which {why}", r.rf.key, r.rf.version,
                         severity="warning")
            else:
                self.err("unreachable", f"v{r.rf.version} is off the valid chain: it builds on v{base}, "
                                        f"which {why}", r.rf.key, r.rf.version, severity="warning")
        if newest == 0:
            if not self.flagged:
                self.err("no-state", "no valid state can be loaded for this run", None, None)
            return
        self.check_state(newest)

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

    def check_state(self, version: int) -> None:
        """The state a load would return at the newest version must validate as a run."""
        state = self.state_at(version)
        if state is None:
            return
        key = self.logs[version].rf.key if version in self.logs else self.snaps[version].rf.key
        if state["run"] is None:
            self.err("state", f"no run-level record in the chain up to v{version}", key, version)
            return
        try:
            steps = {sid: _strip_refs(sd) for sid, sd in state["steps"].items()}
            run = AgentRun.model_validate({**state["run"], "steps": steps})
        except (ValidationError, InvalidIdError) as exc:
            self.err("state", f"state at v{version} does not validate: {_first_error(exc)}", key, version)
            return
        bad = graph_problems(run.steps)
        if bad:
            self.err("graph", f"invalid step graph at v{version}: " + "; ".join(bad[:3]), key, version)

    def state_at(self, version: int) -> dict[str, Any] | None:
        """Rebuild the state at `version` along valid records, newest snapshot first (as load does)."""
        by_base: dict[int, list[codec.Record]] = {}
        for r in (*self.logs.values(), *self.deltas):
            if r.record is not None:
                by_base.setdefault(r.record.header.base, []).append(r.record)
        starts = sorted((v for v, r in self.snaps.items() if r.record is not None and v <= version),
                        reverse=True)
        for start in [*starts, 0]:
            if start == 0:
                state: dict[str, Any] = {"run": None, "steps": {}, "tool_log": {}}
                chash = ""
            else:
                rec = self.snaps[start].record
                assert rec is not None
                state, chash = _from_body(rec.body), rec.header.hash
            cursor = start
            while cursor < version:
                cands = [c for c in by_base.get(cursor, []) if c.header.base_hash == chash
                         and c.header.version <= version]
                if not cands:
                    break
                nxt = max(cands, key=lambda c: c.header.version)
                apply_body(state, nxt.body)
                cursor, chash = nxt.header.version, nxt.header.hash
            if cursor == version:
                return state
        return None


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def _from_body(body: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"run": None, "steps": {}, "tool_log": {}}
    apply_body(state, body)
    return state


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return {"run": state["run"], "steps": dict(state["steps"]),
            "tool_log": {k: list(v) for k, v in state["tool_log"].items()}}


def _normal(state: dict[str, Any]) -> dict[str, Any]:
    return {"run": state["run"], "steps": state["steps"],
            "tool_log": {k: v for k, v in state["tool_log"].items() if v}}


# ------------------------------------------------------------------------------ entry point


def verify(
    url: str | Storage,
    run_id: str | None = None,
    level: str = "structure",
    subset: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    subset_runs: bool = False,
    workers: int = 8,
    max_decoded_bytes: int = codec.DEFAULT_MAX_DECODED_BYTES,
    progress: Progress | None = None,
) -> Report:
    """Check a store (or one run) and return every finding; only ever reads.

    Raises StorageUnavailableError when the store cannot be listed, and ConfigError for a
    bad level or subset or a `run_id` with no files. Everything found in the data itself is
    a Finding in the Report, never an exception.
    """
    if level not in LEVELS:
        raise ConfigError(f"level must be one of {LEVELS}, not {level!r}")
    sub = parse_subset(subset) if subset else None
    if run_id is not None:
        validate_id(run_id, "run id")
    storage = open_readonly_target(url, storage_options)
    report = Report(url=storage.display_url, level=level, run_id=run_id, subset=subset)
    t0 = time.perf_counter()
    checker = _Checker(storage, report, level=level, subset=sub, subset_runs=subset_runs,
                       workers=workers, max_decoded_bytes=max_decoded_bytes, progress=progress)
    try:
        _verify(checker, storage, report, run_id)
    finally:
        checker.pool.shutdown(wait=True)
    report.seconds = time.perf_counter() - t0
    return report


def _verify(checker: _Checker, storage: Storage, report: Report, run_id: str | None) -> None:
    keys = list_keys(storage, f"{RUNS}/{run_id}/" if run_id is not None else "")
    if not keys:
        if run_id is not None:
            raise ConfigError(f"run {run_id!r} not found in {storage.display_url}")
        report.empty = True
        report.add("info", "empty", "nothing is stored under this URL")
        return
    runs: dict[str, list[RunFile]] = {}
    artifacts: list[str] = []
    langgraph: list[str] = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        if TEMP_MARKER in name:
            report.add("warning", "temp-file", "temp file left by an interrupted write", key)
            continue
        parts = key.split("/")
        if parts[0] == RUNS and len(parts) >= 3:
            if parts[2] in _IGNORED_RUN_DIRS:
                continue
            rf = parse_run_key(key)
            if rf is not None:
                runs.setdefault(parts[1], []).append(rf)
                continue
            report.add("warning", "stray", "not a ckptfs run file (unexpected name)", key, parts[1])
            continue
        sha = parse_artifact_key(key)
        if sha is not None:
            artifacts.append(sha)
            continue
        if parts[0] == LG_ROOT:
            langgraph.append(key)
            continue
        report.add("warning", "stray", "not a ckptfs file (unexpected key)", key)
    sub = checker.subset
    run_ids = sorted(runs)
    partial_runs = bool(sub and checker.subset_runs)
    if partial_runs and sub is not None:
        run_ids = [r for r in run_ids if in_subset(hashlib.sha256(r.encode()).hexdigest(), *sub)]
    whole_store = run_id is None and not partial_runs
    checker.total = sum(len(runs[r]) for r in run_ids)
    for rid in run_ids:
        try:
            validate_id(rid, "run id")
        except InvalidIdError as exc:
            report.add("warning", "stray", f"run directory with an invalid id: {exc}", f"{RUNS}/{rid}/", rid)
            continue
        report.runs += 1
        checker.check_run(rid, sorted(runs[rid]))
    _check_artifacts(checker, storage, report, artifacts, whole_store)
    for severity, code, message, key in check_langgraph(storage, langgraph, checker.level,
                                                         checker.max_decoded):
        report.add(severity, code, message, key or None)


def _check_artifacts(checker: _Checker, storage: Storage, report: Report, listed: list[str],
                     whole_store: bool) -> None:
    present = set(listed)
    refs = checker.refs
    if not whole_store:  # one run: existence by HEAD, only its references
        def exists(sha: str) -> bool:
            try:
                return storage.exists(artifact_key(sha))
            except Exception:
                return False

        shas = sorted(refs)
        present = {s for s, ok in zip(shas, checker.pool.map(exists, shas), strict=True) if ok}
    for sha, (_ref, by) in sorted(refs.items()):
        if sha not in present:
            report.add("error", "artifact-missing", f"referenced artifact is missing (referenced by {by})",
                       artifact_key(sha))
    report.artifacts = len(present)
    if whole_store:
        for sha in sorted(present - set(refs)):
            report.add("info", "unreferenced-artifact",
                       "no stored record references it; `ckptfs prune` collects it after the grace period",
                       artifact_key(sha))
    if checker.level != "data":
        return
    todo = sorted(present if whole_store else present & set(refs))
    if checker.subset is not None:
        todo = [s for s in todo if in_subset(s, *checker.subset)]
    checker.total += len(todo)

    def one(sha: str) -> tuple[str, int, str | None]:
        ref = refs.get(sha)
        return checker.hash_artifact(sha, ref[0].size if ref else None)

    for key, n, problem in checker.pool.map(one, todo):
        report.bytes_read += n
        report.artifacts_hashed += 1
        checker.tick(1, key)
        if problem == "vanished":
            report.add("warning", "vanished", "listed, then gone before it was read (concurrent prune?)", key)
        elif problem is not None:
            report.add("error", "artifact-corrupt", problem, key)


def summarise(findings: Iterable[Finding]) -> dict[str, int]:
    """Counts by severity, for a one-line summary."""
    out = dict.fromkeys(SEVERITIES, 0)
    for f in findings:
        out[f.severity] = out.get(f.severity, 0) + 1
    return out
