"""The load path: a run's newest valid state (or one version of it), on the one reader.

The chain is `format.reader.plan_load`'s: the newest snapshot that decodes, then the largest
valid jump at each version. What this module adds is what a load means for the run model:
bodies applied into a state, artifacts resolved (and verified) where asked, the state validated
as an `AgentRun` with a runnable graph. A state that does not validate is not returned: the
reader retries one record shorter, so a damaged newest record costs one version, not the run.
Every file skipped is named in `LoadInfo.skipped` and in a warning; files existing but nothing
loading is `CheckpointCorruptError`, never an empty run.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
from pydantic import ValidationError

from ckptfs.errors import (
    CheckpointCorruptError,
    CorruptFileError,
    InvalidIdError,
    StorageUnavailableError,
    UnreadableFileError,
    VersionNotFoundError,
    first_of,
)
from ckptfs.format import codec
from ckptfs.format.changes import apply_body
from ckptfs.format.keys import RunFile, blocked_run_dirs, log_key, not_a_directory, parse_run_key, run_prefix
from ckptfs.format.models import AgentRun, ArtifactRef, Step, ToolCall, graph_problems
from ckptfs.format.reader import (
    REFS_FIELD,
    LoadPath,
    RecordCache,
    RunIndex,
    SplitBody,
    decode_run_file,
    parse_step,
    plan_load,
    read_run_header,
    skippable,
)
from ckptfs.storage.base import Storage
from ckptfs.store.artifacts import ArtifactStore
from ckptfs.store.pools import StorePool

logger = logging.getLogger(__name__)

PREFETCH_REMOTE = 8  # files a load reads ahead at once from a remote store
PREFETCH_LOCAL = 2  # ... and from local disk (decompressing and hashing: CPU, not waits)
ARTIFACTS_AHEAD = 16  # artifacts a load from a remote store fetches at once
ARTIFACTS_AHEAD_BYTES = 256 * 1024 * 1024  # ... when their sizes sum to at most this, else in turn


@dataclass(frozen=True)
class LoadInfo:
    """How a load went: which files it read and what it skipped (for reports and benches)."""

    run_id: str
    version: int
    snapshot_version: int
    records_read: int
    bytes_read: int
    snapshot_bytes: int
    skipped: list[str]
    max_version_seen: int
    # When the loaded version was written, by its writer's clock (its record's header): how
    # long ago the run's newest state is known to have been there (CheckpointStore._seed_head).
    written_at: float = 0.0
    # Seconds by phase, for benchmarks/load_scale.py: fetch and decompress (with the sha256
    # checks; summed over files, which prefetching overlaps on threads), parse (JSON),
    # apply, validate (models and graph), and "seed head" (the store's, when it seeds).
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class Loaded:
    """A load's result: the run, its tool log, the raw state the head and compactor start from.

    `step_json` and `call_json` hold the stored bytes (`bytes(raw)`) of each step and tool
    call (persisted form: `$refs` and summaries where values moved to artifacts) whose
    record was read as fragments (`SplitBody`); None or missing where it was read whole.
    They point into the decompressed records until copied out. `state` is the run-level
    document and tool log as parsed, and in `state["steps"]` only the persisted documents of
    the steps whose values are in artifacts (`$refs`): the rest are in `step_json`.
    """

    run: AgentRun
    tool_log: dict[str, list[ToolCall]]
    state: dict[str, Any]
    hash: str
    info: LoadInfo
    step_json: dict[str, msgspec.Raw] = field(default_factory=dict)
    call_json: dict[str, list[msgspec.Raw | None]] = field(default_factory=dict)


@contextlib.contextmanager
def gc_paused(promote: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector while a load (or a mirror pass) builds long-lived state.

    A load parses megabytes of JSON into dicts and builds a model per step; every object
    survives, so each collection the allocations trigger walks the whole growing heap for
    nothing. Measured on a 10,000-step run: 0.72 s -> 0.45 s. The previous state is restored.

    With `promote`, what survives the pause goes straight to the oldest generation when it
    ends (`gc.freeze()` then `gc.unfreeze()`: two list splices), instead of being walked by
    the first young collection after it and again when promoted: at 100,000 steps that
    first collection alone took 0.5 s. The objects stay collectable: the next full
    collection examines them like any long-lived data.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if promote:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


@dataclass
class _Early:
    """A load's head start: the newest snapshot read on `pool` while the run is listed."""

    cache: RecordCache
    pool: ThreadPoolExecutor
    started: Future[None]


class _ParseEagerly(Exception):
    """A fragment the load left unparsed may not be one parsing accepts: load again with
    every fragment parsed, exactly as the reader reads it (rare: hostile files only)."""


def _replaced(old: Any) -> None:
    """A step's state is being replaced: if it was a fragment left unparsed, it had to be one
    that parsing would have accepted, or the record holding it reads differently."""
    if type(old) is msgspec.Raw and not skippable(old):
        raise _ParseEagerly


def _apply_split(state: dict[str, Any], step_json: dict[str, msgspec.Raw],
                 call_json: dict[str, list[msgspec.Raw | None]], body: SplitBody) -> None:
    """`apply_body` of a body read as fragments (the same state), keeping each step's bytes.

    A body whose steps were left unparsed puts the fragments themselves in the state:
    `materialise` parses those that survive, once every body is applied, so a step a later
    record replaces (a third of a long run's snapshot, at a load's newest version) is never
    parsed. Their order in the state is the same either way (dict updates in place)."""
    if body.run is not None:
        state["run"] = body.run
    st = state["steps"]
    if body.steps is None:
        if st:  # `a & b` copies a's keys: the record's (small, but for a snapshot), not the state's
            for sid in body.step_json.keys() & st.keys():
                _replaced(st[sid])
        st.update(body.step_json)
    else:
        st.update(body.steps)
    step_json.update(body.step_json)
    for sid in body.removed:
        _replaced(st.pop(sid, None))
        step_json.pop(sid, None)
    tl = state["tool_log"]
    for sid, calls in body.tool_log.items():
        tl.setdefault(sid, []).extend(calls)
        call_json.setdefault(sid, []).extend(body.call_json[sid])


def _apply_whole(state: dict[str, Any], step_json: dict[str, msgspec.Raw],
                 call_json: dict[str, list[msgspec.Raw | None]], body: Any) -> None:
    """`apply_body`, forgetting the bytes of what it replaces (ValueError for a bad body)."""
    st = state["steps"]
    if isinstance(body, dict):  # apply_body refuses any other shape
        steps, removed = body.get("steps"), body.get("removed")
        if isinstance(steps, dict) and st:
            for sid in steps.keys() & st.keys():
                _replaced(st[sid])
        if isinstance(removed, list):
            for sid in removed:
                if isinstance(sid, str):
                    _replaced(st.get(sid))
    apply_body(state, body)
    for sid in body.get("steps", {}):
        step_json.pop(sid, None)
    for sid in body.get("removed", []):
        step_json.pop(sid, None)
    for sid, calls in body.get("tool_log", {}).items():
        call_json.setdefault(sid, []).extend([None] * len(calls))


def _parsed(raw: msgspec.Raw) -> dict[str, Any]:
    """A step fragment the load left unparsed, parsed now (`_ParseEagerly` if it does not)."""
    try:
        return parse_step(raw)
    except (msgspec.MsgspecError, RecursionError, ValueError):
        raise _ParseEagerly from None


def _parse_rest(items: Iterator[tuple[str, Any]]) -> None:
    """Parse, and drop, what is left: a state that does not validate is only reported as such
    if the eager reading, which parses every fragment first, would have got that far."""
    for _sid, v in items:
        if type(v) is msgspec.Raw:
            _parsed(v)


def _empty() -> dict[str, Any]:
    return {"run": None, "steps": {}, "tool_log": {}}


def read_headers(storage: Storage, run_id: str, files: Iterable[RunFile], workers: int = 8
                 ) -> dict[RunFile, tuple[codec.RecordHeader, int] | None]:
    """Each file's header and size, None for one that does not read (`read_run_header`: every
    byte and the body's hash checked, the body never parsed): what `versions` tells of each
    version and which versions a restore can target. GETs overlap on remote stores."""
    def one(rf: RunFile) -> tuple[codec.RecordHeader, int] | None:
        try:
            data = storage.get(rf.key)
            return read_run_header(data, rf, run_id), len(data)
        except (CorruptFileError, FileNotFoundError) as exc:
            logger.info("run %s: %s unreadable: %s", run_id, rf.key, exc)
            return None

    todo = list(files)
    if storage.capabilities.remote and len(todo) > 1:
        # each GET fills only its own entry: in turn (at interpreter exit) it is the same
        with StorePool(max_workers=workers, thread_name_prefix="ckptfs-headers") as pool:
            return dict(zip(todo, pool.map(one, todo), strict=True))
    return {rf: one(rf) for rf in todo}


def unread_folders(keys: Iterable[str]) -> list[str]:
    """A skip reason for each of a run's folders a listing shows as no directory (a symlink,
    never followed, or a file): the versions there are read by no load, which otherwise falls
    back past them to an older one (v15 from `snap/` while a linked `log/` held v16 and v17)
    and says nothing."""
    return [f"{not_a_directory([key])}: the versions stored there are not read"
            for key in blocked_run_dirs(keys)]


def _warn_skipped(got: Loaded | None) -> Loaded | None:
    """The one warning of a load that skipped files, naming the version it returns: logged by
    `load` for the load it keeps, not by each attempt (the quick one from the newest snapshot
    is dropped when that snapshot is damaged, and said "loaded version 12" before v17 came)."""
    if got is not None and got.info.skipped:
        logger.warning("run %s: loaded version %d after skipping: %s", got.info.run_id, got.info.version,
                       first_of(got.info.skipped, 3))
    return got


class RunLoader:
    """Reads runs of one storage through the reader; resolves and verifies their artifacts."""

    def __init__(self, storage: Storage, artifacts: ArtifactStore, max_decoded: int) -> None:
        self.storage = storage
        self.artifacts = artifacts
        self.max_decoded = max_decoded

    def run_files(self, run_id: str) -> list[RunFile]:
        return [rf for key in self.storage.list(run_prefix(run_id)) if (rf := parse_run_key(key))]

    def listing(self, run_id: str) -> tuple[list[RunFile], list[str]]:
        """A run's files, and a reason for each of its folders that is no directory
        (`unread_folders`): what a caller that decides from the files (retention) must not
        decide without."""
        keys = self.storage.list(run_prefix(run_id))
        return [rf for key in keys if (rf := parse_run_key(key))], unread_folders(keys)

    def get_run_file(self, key: str) -> bytes:
        """A run file's bytes; one the backend refuses to let us read is UnreadableFileError.

        Local disk raises that itself (a link, a FIFO, permission denied); other backends raise
        PermissionError (S3 AccessDenied on one object). Either way it is a file that cannot
        be read, which a load skips with a warning exactly as a corrupt one: one unreadable
        snapshot must not turn a fallback into a traceback. FileNotFoundError stays what it is
        (a file pruned meanwhile: the load is retried).
        """
        try:
            return self.storage.get(key)
        except PermissionError as exc:
            raise UnreadableFileError(key, f"cannot be read: {exc}") from None

    def decode(self, rf: RunFile, data: bytes, run_id: str) -> codec.Record:
        return decode_run_file(data, rf, run_id, self.max_decoded)

    def header(self, rf: RunFile, data: bytes, run_id: str) -> codec.RecordHeader:
        return read_run_header(data, rf, run_id, self.max_decoded)

    def load(self, run_id: str, target: int | None, resolve: bool) -> Loaded | None:
        """The run at its newest valid version, or exactly at `target`; None if it has no files.

        Raises CheckpointCorruptError when files exist but none yields a valid state,
        VersionNotFoundError when `target` is not stored, UnsupportedFormatError for a newer
        format (a newer ckptfs wrote it: falling back past it would lose its commits), and
        FileNotFoundError when a file vanished meanwhile (the caller loads again).
        """
        early = self._read_newest_snapshot(run_id) if target is None else None
        try:
            keys = self.storage.list(run_prefix(run_id))
            unread = unread_folders(keys)
            if target is None:
                files, newest = self._recent_files(run_id, keys)
                if newest:
                    try:
                        got = self._load_files(run_id, None, resolve, files, early, unread)
                    except CheckpointCorruptError:
                        got = None
                    if got is not None and got.info.snapshot_version == newest:
                        return _warn_skipped(got)  # what a load of every file gives: it starts there too
                    # the newest snapshot did not load: an older one needs the records between
                    logger.info("run %s: loading again with the records below its newest "
                                "snapshot", run_id)
                    early = self._done(early)  # that load used it: the next starts afresh
            files = [rf for key in keys if (rf := parse_run_key(key))]
            if not files:
                return None
            return _warn_skipped(self._load_files(run_id, target, resolve, files, early, unread))
        finally:
            self._done(early)

    @staticmethod
    def _done(early: _Early | None) -> None:
        if early is not None:
            early.pool.shutdown(wait=True, cancel_futures=True)

    def _read_newest_snapshot(self, run_id: str) -> _Early:
        """Start reading the newest snapshot while the run is listed: a long run's listing
        (tens of thousands of journal records; on S3, a page per thousand) and the snapshot's
        fetch and decompression (0.2 s at 100,000 steps) need not wait for each other. Its
        own listing is of `snap/` alone; what it prefetches is read only if the plan says."""
        workers = PREFETCH_REMOTE if self.storage.capabilities.remote else PREFETCH_LOCAL
        pool = StorePool(workers, thread_name_prefix="ckptfs-load")
        cache = self._cache(run_id, lazy=True)

        def start() -> None:
            try:
                keys = self.storage.list(f"{run_prefix(run_id)}snap/")
            except FileNotFoundError:
                return
            snaps = [rf for k in keys if (rf := parse_run_key(k)) is not None and rf.kind == "snap"]
            if snaps:
                cache.prefetch([max(snaps)], pool)

        return _Early(cache, pool, pool.submit(start))

    def _cache(self, run_id: str, lazy: bool) -> RecordCache:
        # Bodies read as fragments: each step's stored bytes seed the head and the compactor,
        # so a load never serialises a step again (see CheckpointStore._seed_head).
        return RecordCache(run_id, self.get_run_file, self.max_decoded, strict_format=True,
                           split=True, lazy_steps=lazy, skip_level=logging.INFO)

    @staticmethod
    def _recent_files(run_id: str, keys: list[str]) -> tuple[list[RunFile], int]:
        """The files a load of the newest version reads while the newest snapshot loads:
        journal records below it are left unparsed (a long run keeps tens of thousands there,
        back to its oldest kept snapshot, for fallbacks and restore points; on S3 fences too).
        Returns that snapshot's version (0: nothing was left out, use every file). A load that
        does not start at that snapshot is made again with every file."""
        prefix = run_prefix(run_id)
        snaps = [rf.version for k in keys if k.startswith(prefix + "snap/")
                 and (rf := parse_run_key(k)) is not None]
        if not snaps:
            return [], 0
        newest = max(snaps)
        floor, logs = log_key(run_id, newest), prefix + "log/"
        out: list[RunFile] = []
        below = False
        for key in keys:
            if key < floor and key.startswith(logs):  # fixed-width names: string order is version order
                below = True
                continue
            if (rf := parse_run_key(key)) is not None:
                out.append(rf)
        return (out, newest) if below else ([], 0)

    def _load_files(self, run_id: str, target: int | None, resolve: bool,
                    files: list[RunFile], early: _Early | None = None,
                    unread: list[str] | None = None) -> Loaded | None:
        try:
            return self._load_chain(run_id, target, resolve, files, lazy=True, early=early,
                                    unread=unread)
        except _ParseEagerly:
            logger.info("run %s: a step fragment needs the lenient reader; parsing every "
                        "fragment", run_id)
            return self._load_chain(run_id, target, resolve, files, lazy=False, unread=unread)

    def _load_chain(self, run_id: str, target: int | None, resolve: bool,
                    files: list[RunFile], lazy: bool, early: _Early | None = None,
                    unread: list[str] | None = None) -> Loaded | None:
        """`unread`: the run's folders no load reads (`unread_folders`), named first among the
        load's skip reasons, or its error: a version asked for may be stored there, so it is
        not called absent."""
        unread = unread or []
        if not files:
            return None
        max_seen = max(f.version for f in files)
        index = RunIndex.build(files, max_seen if target is None else target)
        pool: ThreadPoolExecutor | None = None
        if early is not None and lazy:
            with contextlib.suppress(Exception):  # a failed early listing only loses the head start
                early.started.result()
            cache, pool = early.cache, early.pool
        else:
            cache = self._cache(run_id, lazy)
        problems = cache.problems  # the reader's skips, then states that did not validate
        accepted: list[tuple[tuple[AgentRun, dict[str, list[ToolCall]]], dict[str, Any],
                             dict[str, msgspec.Raw], dict[str, list[msgspec.Raw | None]]]] = []
        phases = cache.timings

        def accept(path: LoadPath) -> bool:
            t0 = time.perf_counter()
            state = _empty()
            step_json: dict[str, msgspec.Raw] = {}
            call_json: dict[str, list[msgspec.Raw | None]] = {}
            for body in path.bodies():
                try:
                    if isinstance(body, SplitBody):
                        _apply_split(state, step_json, call_json, body)
                    else:
                        _apply_whole(state, step_json, call_json, body)
                except ValueError as exc:
                    problems.append(f"a record body up to v{path.version} is invalid: {exc}")
                    logger.warning("run %s: record body invalid: %s", run_id, exc)
                    return False
            t1 = time.perf_counter()
            got = self.materialise(run_id, state, problems, resolve)
            phases["apply"] = phases.get("apply", 0.0) + t1 - t0
            phases["validate"] = phases.get("validate", 0.0) + time.perf_counter() - t1
            if got is None:
                return False
            accepted.append((got, state, step_json, call_json))
            return True

        # The files the names say a load reads are read, decompressed and hashed ahead on
        # threads (round trips overlap on a remote store; zstd and sha256 run beside the
        # parsing everywhere); plan_load still decides what is read and used.
        own_pool = None
        names = index.name_path()
        if names and len(names) > 1:
            if pool is None:
                workers = PREFETCH_REMOTE if self.storage.capabilities.remote else PREFETCH_LOCAL
                pool = own_pool = StorePool(min(workers, len(names)),
                                            thread_name_prefix="ckptfs-load")
            cache.prefetch(names, pool)
        try:
            path = plan_load(index, cache.read, run_id=run_id, exact=target is not None,
                             accept=accept)
        finally:
            if own_pool is not None:
                own_pool.shutdown(wait=True, cancel_futures=True)
        if path is None:
            if target is not None and not problems and not unread:
                raise VersionNotFoundError(run_id, target)
            raise CheckpointCorruptError(run_id, [*unread, *(problems
                                                             or ["no snapshot or journal record to start"])])
        (run, tool_log), state, step_raw, call_raw = accepted[-1]
        snap_bytes = path.start_record.stored_size if path.start_record is not None else 0
        newest = path.records[-1][1] if path.records else path.start_record
        info = LoadInfo(run_id, path.version, path.start.version if path.start else 0,
                        len(path.records) + (path.start is not None),
                        snap_bytes + sum(rec.stored_size for _rf, rec in path.records), snap_bytes,
                        [*unread, *problems], max_seen, newest.header.time if newest else 0.0,
                        phases)
        return Loaded(run, tool_log, state, path.hash, info, step_raw, call_raw)

    def materialise(self, run_id: str, state: dict[str, Any], problems: list[str],
                    resolve: bool) -> tuple[AgentRun, dict[str, list[ToolCall]]] | None:
        """The run model of a state, or None (with the reason in `problems`) if it is not one."""
        if state["run"] is None:
            problems.append("no run-level record in the loaded chain")
            return None
        try:
            # Step by step, each parsed (a fragment the load left unparsed) and validated in
            # turn, so a long run's parsed documents never all exist at once beside its models:
            # half a gigabyte less allocated at 100,000 steps, which on a fresh VM's memory is
            # time. What stays of the documents (`state["steps"]`) is the persisted form of the
            # steps whose values are in artifacts (`$refs`), which the head and replica keep.
            # A step validates the same with or without `$refs` (models ignore unknown keys),
            # so only one whose values come back from artifacts is copied and resolved.
            kept: dict[str, dict[str, Any]] = {}
            models: dict[str, Step] = {}
            validate = Step.model_validate
            # From a remote store a step's artifacts are fetched together with every other
            # step's, not one round trip after another (300 artifacts took 1.4 s on a loopback
            # S3 server, and ~30 ms each on a real one): such steps are validated after the loop.
            ahead = resolve and self.storage.capabilities.remote
            later: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
            items = iter(state["steps"].items())
            for sid, sd in items:
                if type(sd) is msgspec.Raw:
                    sd = _parsed(sd)
                if REFS_FIELD in sd:
                    kept[sid] = sd
                    sd = dict(sd)
                    refs = sd.pop(REFS_FIELD)
                    if refs and resolve:
                        sd = copy.deepcopy(sd)
                        if ahead:
                            later.append((sid, sd, refs))
                            continue
                        self.resolve_refs(sd, refs)
                try:
                    models[sid] = validate(sd)
                except Exception:
                    _parse_rest(items)
                    raise
            if later:
                fetched = self.fetch_artifacts(r for _, _, refs in later for r in refs.values())
                for sid, sd, refs in later:
                    self.resolve_refs(sd, refs, fetched)
                    models[sid] = validate(sd)
                del fetched  # its bytes are values now: not held while the tool log's are fetched
                models = {sid: models[sid] for sid in state["steps"]}  # the run's step order
            run = AgentRun.model_validate({**state["run"], "steps": models})
            state["steps"] = kept
            tool_log: dict[str, list[ToolCall]] = {}
            validate_call = ToolCall.model_validate
            calls_later: list[tuple[list[Any], int, dict[str, Any], dict[str, Any]]] = []
            for sid, calls in state["tool_log"].items():
                out: list[Any] = []
                for c in calls:
                    if REFS_FIELD in c:
                        c = dict(c)
                        refs = c.pop(REFS_FIELD)
                        if refs and resolve:
                            if ahead:
                                calls_later.append((out, len(out), c, refs))
                                out.append(None)  # its place, filled below
                                continue
                            self.resolve_refs(c, refs)
                    out.append(validate_call(c))
                tool_log[sid] = out
            if calls_later:
                fetched = self.fetch_artifacts(r for *_, refs in calls_later for r in refs.values())
                for out, at, c, refs in calls_later:
                    self.resolve_refs(c, refs, fetched)
                    out[at] = validate_call(c)
        except (ValidationError, InvalidIdError, CorruptFileError, ValueError, TypeError,
                AttributeError, KeyError, IndexError) as exc:  # hostile shapes, not just bad values
            problem = f"state at this version does not validate: {type(exc).__name__}: {exc}"
            # One damaged artifact fails every version that holds it: named once, not once per
            # version tried (42 lines); the load's one warning (`_warn_skipped`) or its error
            # carries it, so each attempt's is only -v's.
            if problem not in problems:
                problems.append(problem)
                logger.info("run %s: state does not validate: %s", run_id, exc)
            return None
        bad = graph_problems(run.steps)
        if bad:
            problem = "invalid step graph: " + "; ".join(bad[:3])
            if problem not in problems:
                problems.append(problem)
                logger.info("run %s: invalid step graph: %s", run_id, bad[:3])
            return None
        return run, tool_log

    @staticmethod
    def stored_is_model_json(run: AgentRun, step_json: Mapping[str, codec.Fragment], state: dict[str, Any],
                             sample: int = 16) -> bool:
        """Whether the stored bytes of the first and last `sample` steps (those without
        `$refs`) are byte-identical to their model JSON, as the commit path writes them.

        A load that trusts them spares serialising every step again (0.4 s at 100,000
        steps); a store written by another serialiser (an older field set, other float
        formatting) fails here and is seeded from the models as before.
        """
        ids = list(run.steps)
        for sid in ids[:sample] + ids[-sample:]:
            raw = step_json.get(sid)
            if raw is None or sid in state["steps"]:  # its values are in artifacts
                continue
            if raw != run.steps[sid].model_dump_json().encode():
                return False
        return True

    def fetch_artifacts(self, ref_docs: Iterable[Any]) -> dict[tuple[str, str], bytes]:
        """The artifacts `ref_docs` name, fetched ARTIFACTS_AHEAD at a time, each checked as
        `ArtifactStore.read` checks it: (uri, sha256) -> bytes. What cannot be fetched (missing,
        altered, a malformed reference) is left out, for `resolve_refs` to read again and name
        as it always has; so is everything when together they pass ARTIFACTS_AHEAD_BYTES, a
        bound on what is held at once beyond what a sequential load holds."""
        refs: dict[tuple[str, str], ArtifactRef] = {}
        for doc in ref_docs:
            try:
                ref = ArtifactRef.model_validate(doc)
            except ValidationError:
                continue
            if ref.size < 0:  # no file has that size; summed, it hid the others from the bound
                continue
            refs.setdefault((ref.uri, ref.sha256), ref)
        if len(refs) < 2 or sum(r.size for r in refs.values()) > ARTIFACTS_AHEAD_BYTES:
            return {}

        def fetch(ref: ArtifactRef) -> tuple[tuple[str, str], bytes | None]:
            try:
                return (ref.uri, ref.sha256), self.artifacts.read(ref)
            except (OSError, CorruptFileError, StorageUnavailableError):
                return (ref.uri, ref.sha256), None

        with StorePool(min(ARTIFACTS_AHEAD, len(refs)), thread_name_prefix="ckptfs-art") as pool:
            return {key: data for key, data in pool.map(fetch, refs.values()) if data is not None}

    def resolve_refs(self, doc: dict[str, Any], refs: dict[str, Any],
                     fetched: Mapping[tuple[str, str], bytes] | None = None) -> None:
        """Put each referenced artifact's value back at its path in `doc` (sha256 checked),
        taken from `fetched` (`fetch_artifacts`) when it is there."""
        for path, ref_doc in refs.items():
            ref = ArtifactRef.model_validate(ref_doc)
            raw = fetched.get((ref.uri, ref.sha256)) if fetched is not None else None
            try:
                if raw is None or len(raw) != ref.size:
                    raw = self.artifacts.read(ref)
            except FileNotFoundError:
                raise CorruptFileError(ref.uri, "referenced artifact is missing") from None
            parts = path.split(".")
            value: Any = raw.decode() if ref.media_type.startswith("text/") else json.loads(raw)
            target: Any = doc
            for p in parts[:-1]:
                target = target[int(p)] if isinstance(target, list) else target[p]
            target[parts[-1]] = value
