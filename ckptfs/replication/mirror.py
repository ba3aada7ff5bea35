"""Mirror and restore: copy runs' restore points between stores so the mirror alone can resume.

A *restore point* of a run is a version V together with everything a load of V reads: the
newest snapshot at or below V (or none, when the chain from version 0 is still whole), the
deltas and journal records the loader's walk takes from there to V, and every artifact those
records reference. The mirror copies exactly that set, byte for byte, under the same keys, so
`CheckpointStore(mirror_url).load_run(...)` works on the mirror as it does on the primary.

When a point is taken. The background compactor writes snapshots when it decides, not every N
steps, so "every N-th snapshot" means: a run gets a new restore point once it has advanced at
least `every_n` versions past the mirror's newest point (`latest=True`: whenever it advanced
at all). A pass takes one point per run, the newest version the source can load.

Order, as restic writes: artifacts, then the records, then the snapshot last, each phase
finished (and every upload verified) before the next starts. Records are hash-chained, so
any subset of them loads as a contiguous prefix: a reader of the mirror, at any moment, sees
an earlier valid version, never a torn one; the snapshot, which would move the loader's
starting point, appears only once all it needs is there. An interrupted pass re-run skips
what already arrived and converges.

"Already there" means the same sha256: artifact keys *are* their sha256 and every backend
writes an object whole, so the right size at an artifact key is its content; a checkpoint
file at an existing key is read back and hashed (these files are small, and this only happens
on keys the destination listing shows, i.e. on re-runs). A different file at the same key is
another lineage (a run restored and continued elsewhere): reported as a conflict, never
overwritten. An upload counts once verified: the returned ETag equals the body's MD5 (S3
single-part) or sha256 (memory), else the stored size is read back.

Restore copies a point from a mirror into a fresh URL: it stages the files (in memory; big
artifacts in a local temporary directory), verifies them by a full load of the run there
(hashes, chain, graph, artifact sha256; the records the planner decoded are not parsed a
second time), and only then publishes into the destination in the same safe order.

A LangGraph saver's files (`langgraph/`) are not runs: a whole-store pass copies each that
changed as it is (see `_Mirror._langgraph`), and a whole-store restore copies them back.

Requests are what a pass costs: one LIST of the destination's artifacts tells which are
present (skipped) and which are absent (created exclusively, with no HEAD first). `MirrorJob`
runs passes on APScheduler 3 (interval or cron, one at a time, missed ticks coalesced) and
offers the agent a non-blocking step trigger.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import IO, Any, Protocol

from ckptfs.errors import (
    CheckpointCorruptError,
    ConfigError,
    CorruptFileError,
    StorageUnavailableError,
    VersionNotFoundError,
)
from ckptfs.format import codec
from ckptfs.format.keys import ARTIFACTS, RUNS, RunFile, parse_artifact_key, parse_run_key, run_prefix
from ckptfs.format.models import ArtifactRef, validate_id
from ckptfs.format.reader import RunIndex
from ckptfs.integrations.langgraph.keys import LG_ROOT, lg_group_of
from ckptfs.maintenance.verify import list_keys
from ckptfs.storage.base import TEMP_MARKER, Capabilities, Keys, Storage, check_key
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logstore import LOG_NAME, LogStorage
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage
from ckptfs.store.artifacts import TOUCH_AFTER
from ckptfs.store.checkpoint_store import CheckpointStore, CompactionPolicy, gc_paused

logger = logging.getLogger(__name__)

DEFAULT_WORKERS = 16
_LIST_OVER = 16  # more artifacts than this: one LIST of the destination beats a HEAD each
DEFAULT_ATTEMPTS = 6
_SMALL = 8 * 1024 * 1024  # artifacts up to this size move in one GET / one PUT
_SPOOL = 16 * 1024 * 1024
_CHUNK = 1024 * 1024
_KIND = {"log": "journal", "delta": "delta", "snap": "snapshot"}

StorageLike = str | Storage
LANGGRAPH_ENTRY = "langgraph/"  # the report's row for a LangGraph saver's files


class Progress(Protocol):
    """What the CLI's progress bars need; library code never renders anything itself."""

    def planned(self, objects: int, nbytes: int) -> None: ...

    def done(self, key: str, nbytes: int, skipped: bool) -> None: ...


class _NoProgress:
    def planned(self, objects: int, nbytes: int) -> None:
        return None

    def done(self, key: str, nbytes: int, skipped: bool) -> None:
        return None


# ----------------------------------------------------------------------------- reports


@dataclass
class RunResult:
    """What one pass did to one run.

    status: mirrored / restored (a new point is complete), up-to-date, not-due (advanced
    fewer than every_n versions), empty (no files), incomplete (something could not be
    copied: see `missing`), conflict (the destination holds different bytes at a key).
    """

    run_id: str
    status: str
    version: int | None = None  # the destination's point after this pass
    snapshot: int | None = None  # the snapshot that point starts from (None: from version 0)
    previous: int = 0  # the destination's point before the pass
    source_version: int = 0  # newest version the source holds
    copied: int = 0
    skipped: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)
    deleted: int = 0  # removed by the destination's retention
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status not in ("incomplete", "conflict", "failed")


@dataclass
class TransferReport:
    src: str
    dst: str
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0
    retries: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.ok for r in self.runs)

    @property
    def copied(self) -> int:
        return sum(r.copied for r in self.runs)

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.runs)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.runs)

    @property
    def missing(self) -> list[str]:
        return [k for r in self.runs for k in r.missing]

    def to_dict(self) -> dict[str, Any]:
        return {"operation": self.operation, "ok": self.ok, "src": self.src, "dst": self.dst,
                "seconds": round(self.seconds, 3), "copied": self.copied, "skipped": self.skipped,
                "bytes": self.bytes, "retries": self.retries, "missing": self.missing,
                "errors": self.errors,
                "runs": [asdict(r) for r in self.runs]}

    operation = "transfer"


@dataclass
class MirrorReport(TransferReport):
    """One mirror pass: per run what was copied, skipped, missing; `ok` False means exit 1."""

    operation = "mirror"


@dataclass
class RestoreReport(TransferReport):
    """One restore: per run the version now loadable at the destination."""

    operation = "restore"


class _Conflict(Exception):
    pass


class _Missing(Exception):
    pass


# ----------------------------------------------------------------------------- planning


@dataclass
class _Chain:
    run_id: str
    version: int
    hash: str
    snapshot: RunFile | None
    records: list[RunFile]
    refs: dict[str, ArtifactRef] = field(default_factory=dict)

    @property
    def files(self) -> list[RunFile]:
        """Copy order: records in chain order, the snapshot last."""
        return [*self.records, *([self.snapshot] if self.snapshot else [])]


def _run_files(storage: Storage, run_id: str) -> tuple[list[RunFile], set[str]]:
    keys = storage.list(run_prefix(run_id))
    return [rf for k in keys if (rf := parse_run_key(k)) is not None], set(keys)


def _name_chain(files: Sequence[RunFile], ceiling: int | None = None) -> list[RunFile] | None:
    """The files a load would read, judged from their names alone (no reads): cheap, advisory.

    Returns [snapshot?, records...] or None when no chain starts. Used to prefetch in
    parallel and to see what the destination already holds; `_plan` decides by headers.
    """
    if not files:
        return None
    limit = max(f.version for f in files) if ceiling is None else ceiling
    snaps = [f for f in files if f.kind == "snap" and f.version <= limit]
    deltas: dict[int, list[RunFile]] = {}
    logs: dict[int, RunFile] = {}
    for f in files:
        if f.kind == "delta" and f.version <= limit:
            deltas.setdefault(f.base, []).append(f)
        elif f.kind == "log":
            logs[f.version] = f
    out: list[RunFile] = []
    if snaps:
        start = max(snaps)
        out.append(start)
        cursor = start.version
    elif 0 in deltas or 1 in logs:
        cursor = 0
    else:
        return None
    while cursor < limit:
        ds = [d for d in deltas.get(cursor, []) if d.version <= limit]
        nxt = max(ds) if ds else logs.get(cursor + 1)
        if nxt is None:
            break
        out.append(nxt)
        cursor = nxt.version
    return out


def _chain_end(chain: list[RunFile] | None) -> int:
    return chain[-1].version if chain else 0


def _collect_refs(body: Any, out: dict[str, ArtifactRef]) -> None:
    """Every artifact a record points at: `$refs` entries and ArtifactRefs kept in user data.

    A snapshot of a long run is tens of thousands of small dicts, so the walk stays lean:
    exact type checks, and the three-key test only on dicts that have a "sha256" key.
    """
    stack = [body]
    pop, push = stack.pop, stack.append
    while stack:
        o = pop()
        if type(o) is dict:
            if "sha256" in o:
                uri, sha, size = o.get("uri"), o["sha256"], o.get("size")
                if (isinstance(uri, str) and isinstance(sha, str) and isinstance(size, int)
                        and parse_artifact_key(uri) == sha):
                    if uri not in out:
                        out[uri] = ArtifactRef.model_validate(
                            {k: o[k] for k in ("uri", "sha256", "size", "media_type", "summary")
                             if k in o})
                    continue
            for v in o.values():
                t = type(v)
                if t is dict or t is list:
                    push(v)
        elif type(o) is list:
            for v in o:
                t = type(v)
                if t is dict or t is list:
                    push(v)


class _Reader:
    """Reads and decodes one run's files from a storage, once each, in parallel when it can."""

    def __init__(self, storage: Storage, run_id: str, pool: ThreadPoolExecutor,
                 max_size: int = codec.DEFAULT_MAX_DECODED_BYTES) -> None:
        self.storage = storage
        self.run_id = run_id
        self.pool = pool
        self.max_size = max_size
        self.raw: dict[str, bytes] = {}
        self.records: dict[str, codec.Record | None] = {}
        self.problems: list[str] = []

    def _fetch(self, rf: RunFile) -> None:
        if rf.key in self.records:
            return
        data = self.storage.get(rf.key)  # FileNotFoundError: vanished (retention): caller replans
        try:
            rec = codec.decode(data, rf.key, self.max_size)
            h = rec.header
            if h.kind != _KIND[rf.kind] or h.run_id != self.run_id or h.version != rf.version or (
                    rf.kind != "log" and h.base != rf.base):
                raise CorruptFileError(rf.key, "header does not match the file name")
        except CorruptFileError as exc:
            logger.warning("run %s: skipping %s", self.run_id, exc)
            self.problems.append(str(exc))
            self.records[rf.key] = None
            return
        self.raw[rf.key] = data
        self.records[rf.key] = rec

    def prefetch(self, files: Iterable[RunFile]) -> None:
        todo = [f for f in files if f.key not in self.records]
        for fut in [self.pool.submit(self._fetch, f) for f in todo]:
            fut.result()

    def read(self, rf: RunFile) -> codec.Record | None:
        self._fetch(rf)
        return self.records[rf.key]


def _plan(reader: _Reader, files: list[RunFile], ceiling: int | None = None) -> _Chain | None:
    """The chain a load of the run (at `ceiling`, or newest) follows, decided by headers.

    Mirrors CheckpointStore's walk: newest snapshot that decodes, then at each version the
    largest delta whose base hash matches, else the next journal record that continues the
    hash chain. With a ceiling, only a chain that reaches it exactly counts.
    """
    if not files:
        return None
    index = RunIndex.build(files, ceiling)
    hint = _name_chain(files, index.limit)
    if hint:
        reader.prefetch(hint)
    for start in index.starts():
        cursor, chash = 0, ""
        if start is not None:
            rec = reader.read(start)
            if rec is None:
                continue
            cursor, chash = start.version, rec.header.hash
        chain: list[RunFile] = []
        for rf, rec in index.follow(cursor, chash, reader.read, run_id=reader.run_id):
            chain.append(rf)
            cursor, chash = rec.header.version, rec.header.hash
        if start is None and not chain:
            continue
        if ceiling is not None and cursor != ceiling:
            continue
        out = _Chain(reader.run_id, cursor, chash, start, chain)
        for rf in out.files:
            rec = reader.records[rf.key]
            assert rec is not None
            _collect_refs(rec.body, out.refs)
        return out
    return None


# ----------------------------------------------------------------------------- copying


def _verify_etag(etag: str, data: bytes) -> bool | None:
    """True/False when the backend's ETag is a content hash we can check, None otherwise."""
    e = etag.strip('"').lower()
    if len(e) == 32 and all(c in "0123456789abcdef" for c in e):
        return e == hashlib.md5(data, usedforsecurity=False).hexdigest()
    if len(e) == 64 and all(c in "0123456789abcdef" for c in e):
        return e == hashlib.sha256(data).hexdigest()
    return None


class _Copier:
    """Copies immutable objects into a destination: skip same content, verify, never overwrite."""

    def __init__(self, dst: Storage, progress: Progress, known: set[str],
                 absent: frozenset[str] = frozenset()) -> None:
        self.dst = dst
        self.progress = progress
        self.known = known  # artifact keys verified present at dst (kept across passes)
        self.absent = absent  # artifact keys this pass's listing of dst did not show
        self._lock = threading.Lock()

    def _same(self, key: str, data: bytes) -> bool:
        try:
            return hashlib.sha256(self.dst.get(key)).digest() == hashlib.sha256(data).digest()
        except FileNotFoundError:
            return False

    def _check_upload(self, key: str, data: bytes, etag: str) -> None:
        ok = _verify_etag(etag, data)
        if ok is None:
            ok = self.dst.size(key) == len(data)
        if not ok:
            raise _Missing(f"{key}: upload did not verify (stored object differs from what was sent)")

    def blob(self, key: str, data: bytes, present: bool) -> bool:
        """Copy one checkpoint file; True if uploaded, False if it was already there."""
        if present:
            if self._same(key, data):
                self.progress.done(key, len(data), True)
                return False
            if self.dst.exists(key):
                raise _Conflict(f"{key}: the destination holds a different file under this name")
        try:
            etag = self.dst.put_if_absent(key, data)
        except FileExistsError:
            if self._same(key, data):  # a retried PUT that had landed, or a racing pass
                self.progress.done(key, len(data), True)
                return False
            raise _Conflict(f"{key}: the destination holds a different file under this name") from None
        self._check_upload(key, data, etag)
        self.progress.done(key, len(data), False)
        return True

    def artifact(self, src: Storage, ref: ArtifactRef) -> bool:
        """Copy one artifact, its sha256 checked before it is written; True if uploaded."""
        key = ref.uri
        if key in self.known:
            self.progress.done(key, ref.size, True)
            return False
        if key in self.absent:
            # The listing just said no: skip the HEAD (on a loopback server it costs what the
            # PUT does). The exclusive create below still refuses anything that landed since.
            have = -1
        else:
            try:
                have = self.dst.size(key)
            except FileNotFoundError:
                have = -1
        if have == ref.size:
            with self._lock:
                self.known.add(key)
            self.progress.done(key, ref.size, True)
            return False
        try:
            if ref.size <= _SMALL:
                self._artifact_small(src, ref, replace=have >= 0)
            else:
                self._artifact_large(src, ref, replace=have >= 0)
        except FileNotFoundError:
            raise _Missing(f"{key}: referenced artifact is missing at the source") from None
        with self._lock:
            self.known.add(key)
        self.progress.done(key, ref.size, False)
        return True

    def _artifact_small(self, src: Storage, ref: ArtifactRef, replace: bool) -> None:
        data = src.get(ref.uri)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise _Missing(f"{ref.uri}: source artifact does not match its sha256")
        if replace or not data:
            etag = self.dst.put(ref.uri, data)  # a damaged object sits at the content key
        else:
            try:
                etag = self.dst.put_if_absent(ref.uri, data)
            except FileExistsError:
                etag = ""
        self._check_upload(ref.uri, data, etag)

    def _artifact_large(self, src: Storage, ref: ArtifactRef, replace: bool) -> None:
        h = hashlib.sha256()
        n = 0
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as spool:
            with src.open_read(ref.uri) as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
                    spool.write(chunk)
            if n != ref.size or h.hexdigest() != ref.sha256:
                raise _Missing(f"{ref.uri}: source artifact does not match its sha256")
            spool.seek(0)
            with contextlib.suppress(FileExistsError):
                self.dst.put_stream(ref.uri, spool, exclusive=not replace)
        if self.dst.size(ref.uri) != ref.size:
            raise _Missing(f"{ref.uri}: upload did not verify (size differs)")


def _note_present(dst: Storage, refs: Mapping[str, ArtifactRef], known: set[str]) -> frozenset[str]:
    """Add the needed artifacts a listing of the destination shows to `known`; return the rest.

    A listed artifact key is its content (content-addressed, written whole), so for many
    artifacts one paginated LIST replaces a HEAD per artifact, both for those it shows
    (present) and for those it does not (absent: they are created exclusively, no HEAD).
    """
    todo = [k for k in refs if k not in known]
    if len(todo) > _LIST_OVER:
        listed = set(dst.list(ARTIFACTS))
        known.update(k for k in todo if k in listed)
        return frozenset(k for k in todo if k not in listed)
    return frozenset()


def _as_storage(target: StorageLike, options: Mapping[str, Any] | None, attempts: int,
                base_delay: float) -> Storage:
    st = target if isinstance(target, Storage) else open_storage(target, options)
    if attempts > 1 and not isinstance(st, RetryingStorage):
        st = RetryingStorage(st, attempts=attempts, base_delay=base_delay)
    return st


def _retries(*stores: Storage) -> int:
    return sum(s.retries for s in stores if isinstance(s, RetryingStorage))


def _run_ids(storage: Storage, run_id: str | Iterable[str] | None) -> list[str]:
    if run_id is None:
        return storage.list_dirs(RUNS)
    ids = [run_id] if isinstance(run_id, str) else list(run_id)
    return [validate_id(r, "run id") for r in ids]


def _gather(futs: list[Future[bool]], res: RunResult, sizes: list[int]) -> None:
    """Wait for a phase; count what it did; collect what failed into res.missing."""
    conflicts: list[str] = []
    for fut, size in zip(futs, sizes, strict=True):
        try:
            if fut.result():
                res.copied += 1
                res.bytes += size
            else:
                res.skipped += 1
        except _Conflict as exc:
            conflicts.append(str(exc))
        except (_Missing, StorageUnavailableError, OSError) as exc:
            res.missing.append(str(exc))
    if conflicts:
        res.missing.extend(conflicts)
        res.status = "conflict"
        res.error = conflicts[0]
    elif res.missing:
        res.status = "incomplete"
        res.error = res.missing[0]


# ----------------------------------------------------------------------------- mirror


class _Mirror:
    """One source, one destination, a pool of workers; reused by MirrorJob across passes."""

    def __init__(self, src: StorageLike, dst: StorageLike, *, src_options: Mapping[str, Any] | None,
                 dst_options: Mapping[str, Any] | None, workers: int, attempts: int,
                 base_delay: float) -> None:
        if workers < 1:
            raise ConfigError("workers must be >= 1")
        self.src = _as_storage(src, src_options, attempts, base_delay)
        self.dst = _as_storage(dst, dst_options, attempts, base_delay)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptfs-mirror")
        self.known: set[str] = set()  # artifact keys verified at dst; trusted for TOUCH_AFTER
        self.known_since = time.monotonic()
        self.lg_sent: dict[str, bytes] = {}  # LangGraph file -> sha256 the mirror holds (across passes)

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def check(self) -> None:
        """Both ends reachable: a usage-level failure (exit 2), before anything is copied."""
        self.src.check()
        self.dst.check()

    def pass_(self, run_id: str | Iterable[str] | None, every_n: int, latest: bool,
              keep_last: int | None, progress: Progress) -> MirrorReport:
        t0 = time.monotonic()
        if t0 - self.known_since > TOUCH_AFTER:
            # a `ckptfs prune` of the mirror may have collected artifacts since: look again
            self.known.clear()
            self.known_since = t0
        before = _retries(self.src, self.dst)
        report = MirrorReport(self.src.display_url, self.dst.display_url)
        for rid in _run_ids(self.src, run_id):
            report.runs.append(self._run(rid, every_n, latest, keep_last, progress))
        if run_id is None:
            lg = self._langgraph(progress)
            if lg is not None:
                report.runs.append(lg)
        report.seconds = time.monotonic() - t0
        report.retries = _retries(self.src, self.dst) - before
        return report

    def _run(self, run_id: str, every_n: int, latest: bool, keep_last: int | None,
             progress: Progress) -> RunResult:
        for attempt in range(3):
            try:
                return self._run_once(run_id, every_n, latest, keep_last, progress)
            except FileNotFoundError as exc:
                # The source's retention removed a file under us: plan again from a fresh list.
                if attempt == 2:
                    return RunResult(run_id, "incomplete", error=f"source kept changing: {exc}",
                                     missing=[str(exc)])
                logger.info("run %s: a source file vanished (%s); planning again", run_id, exc)
            except StorageUnavailableError as exc:
                return RunResult(run_id, "incomplete", error=str(exc), missing=[str(exc)])
        raise AssertionError("unreachable")

    def _run_once(self, run_id: str, every_n: int, latest: bool, keep_last: int | None,
                  progress: Progress) -> RunResult:
        src_files, src_keys = _run_files(self.src, run_id)
        if not src_files:
            return RunResult(run_id, "empty")
        head = max(f.version for f in src_files)
        dst_files, dst_keys = _run_files(self.dst, run_id)
        dst_chain = _name_chain(dst_files)
        previous = _chain_end(dst_chain)
        res = RunResult(run_id, "mirrored", previous=previous, source_version=head)
        if dst_chain and previous >= head:
            last = dst_chain[-1].key
            if last in src_keys and self._same_bytes(last):
                res.status, res.version = "up-to-date", previous
                res.snapshot = dst_chain[0].version if dst_chain[0].kind == "snap" else None
                return res
        if dst_chain and not latest and head - previous < every_n:
            res.status, res.version = "not-due", previous
            return res
        reader = _Reader(self.src, run_id, self.pool)
        chain = _plan(reader, src_files)
        if chain is None:
            res.status = "incomplete"
            res.error = "the source holds files for this run but no loadable chain"
            res.missing = reader.problems or [res.error]
            return res
        res.source_version = chain.version
        res.snapshot = chain.snapshot.version if chain.snapshot else None
        absent = _note_present(self.dst, chain.refs, self.known)
        copier = _Copier(self.dst, progress, self.known, absent)
        files = chain.files
        nbytes = sum(r.size for r in chain.refs.values()) + sum(len(reader.raw[f.key]) for f in files)
        progress.planned(len(chain.refs) + len(files), nbytes)
        # 1. artifacts
        refs = list(chain.refs.values())
        _gather([self.pool.submit(copier.artifact, self.src, r) for r in refs], res,
                [r.size for r in refs])
        if not res.ok:
            res.version = previous
            return res
        # 2. records, in parallel: any subset of a hash chain loads as an earlier version
        recs = chain.records
        _gather([self.pool.submit(copier.blob, f.key, reader.raw[f.key], f.key in dst_keys)
                 for f in recs], res, [len(reader.raw[f.key]) for f in recs])
        # 3. the snapshot, last: it moves the loader's starting point, so all it needs is there
        if res.ok and chain.snapshot is not None:
            s = chain.snapshot
            _gather([self.pool.submit(copier.blob, s.key, reader.raw[s.key], s.key in dst_keys)],
                    res, [len(reader.raw[s.key])])
        if not res.ok:
            res.version = previous
            return res
        res.version = chain.version
        if chain.version < head:
            res.notes.append(f"source holds versions up to {head} but loads only to {chain.version}")
        if keep_last and chain.snapshot is not None and chain.snapshot.key not in dst_keys:
            res.deleted = self._retention(run_id, keep_last)
        return res

    def _langgraph(self, progress: Progress) -> RunResult | None:
        """A LangGraph saver's files, brought up to date as they are now (None: there are none).

        Not restore points: on local disk a thread namespace is one append-only record log,
        whose bytes at any moment are whole records plus perhaps a torn tail a reader ignores,
        so a copy taken while the saver writes is a consistent earlier state. A file is sent
        when its size differs from the mirror's copy, or its bytes do when the sizes match. A
        file that vanished while the pass ran (a prune moves versions to `held/` before it
        deletes a checkpoint) makes the pass list again, so what replaced it is sent too. Once
        everything arrived, files the source no longer has leave the mirror: a deleted thread
        must not come back with a restore.
        """
        res = RunResult(LANGGRAPH_ENTRY, "up-to-date")
        present = set(list_keys(self.dst, f"{LG_ROOT}/"))
        done: set[str] = set()
        for _round in range(3):
            keys = [k for k in list_keys(self.src, f"{LG_ROOT}/")
                    if TEMP_MARKER not in k.rsplit("/", 1)[-1]]
            vanished = False
            for key in keys:
                if key in done:
                    continue
                done.add(key)
                try:
                    data = self.src.get(key)
                except FileNotFoundError:
                    vanished = True
                    continue
                self._send_langgraph(key, data, key in present, res, progress)
            if not vanished:
                break
        else:
            res.missing.append(f"{LG_ROOT}/ kept changing during the pass")
        if not done and not present:
            return None
        if not res.missing:
            gone = sorted(present - set(keys))
            self.dst.delete_many(gone)
            res.deleted = len(gone)
        if res.missing:
            res.status = "incomplete"
        elif res.copied or res.deleted:
            res.status = "mirrored"
        return res

    def _send_langgraph(self, key: str, data: bytes, present: bool, res: RunResult,
                        progress: Progress) -> None:
        digest = hashlib.sha256(data).digest()
        try:
            if present and self.dst.size(key) == len(data) and (
                    self.lg_sent.get(key) == digest
                    or hashlib.sha256(self.dst.get(key)).digest() == digest):
                self.lg_sent[key] = digest
                res.skipped += 1
                progress.done(key, len(data), True)
                return
            etag = self.dst.put(key, data)
            if _verify_etag(etag, data) is False:
                raise _Missing(f"{key}: upload did not verify")
            self.lg_sent[key] = digest
        except (StorageUnavailableError, _Missing) as exc:
            res.missing.append(key)
            res.error = str(exc)
            return
        res.copied += 1
        res.bytes += len(data)
        progress.done(key, len(data), False)

    def _same_bytes(self, key: str) -> bool:
        try:
            a = self.src.get(key)
            b = self.dst.get(key)
        except FileNotFoundError:
            return False
        return hashlib.sha256(a).digest() == hashlib.sha256(b).digest()

    def _retention(self, run_id: str, keep_last: int) -> int:
        store = CheckpointStore(storage=self.dst, policy=CompactionPolicy(background=False, keep_last=0))
        result = store.apply_retention(run_id, keep_last)
        return len(result.deleted)


def mirror(src_url: StorageLike, dst_url: StorageLike, every_n: int = 1,
           run_id: str | Iterable[str] | None = None, src_options: Mapping[str, Any] | None = None,
           dst_options: Mapping[str, Any] | None = None,
           latest: bool = False, keep_last: int | None = None, *, workers: int = DEFAULT_WORKERS,
           attempts: int = DEFAULT_ATTEMPTS, base_delay: float = 0.2,
           progress: Progress | None = None) -> MirrorReport:
    """Copy each run's newest restore point from `src_url` to `dst_url` when it is due.

    A run is due once it advanced `every_n` versions past the mirror's newest point, or at
    all with `latest=True`. Artifacts, then records, then the snapshot; uploads in parallel
    (`workers`), each retried on throttling/5xx (`attempts`) and verified. `keep_last`
    applies retention on the destination (newest N snapshots and what they need). Raises
    StorageUnavailableError if either end cannot be reached at the start; failures later
    leave the run `incomplete` in the report (nothing torn is visible), and a rerun resumes.
    """
    if every_n < 1:
        raise ConfigError(f"every_n must be >= 1, got {every_n}")
    if keep_last is not None and keep_last < 1:
        raise ConfigError(f"keep_last must be >= 1, got {keep_last}")
    m = _Mirror(src_url, dst_url, src_options=src_options, dst_options=dst_options,
                workers=workers, attempts=attempts, base_delay=base_delay)
    try:
        m.check()
        with gc_paused():  # decoded bodies stay alive for the pass: collections would only churn
            return m.pass_(run_id, every_n, latest, keep_last, progress or _NoProgress())
    finally:
        m.close()


# ----------------------------------------------------------------------------- restore


def restore(src_url: StorageLike, dst_url: StorageLike, run_id: str | None = None,
            version: int | None = None, src_options: Mapping[str, Any] | None = None,
            dst_options: Mapping[str, Any] | None = None, *, workers: int = DEFAULT_WORKERS,
            attempts: int = DEFAULT_ATTEMPTS, base_delay: float = 0.2,
            progress: Progress | None = None, staging_dir: str | None = None) -> RestoreReport:
    """Copy runs (or one run, at its newest point or at `version`) from a mirror into `dst_url`.

    Each run is staged in a local temporary directory, verified there by a full load
    (hash chain, graph, artifact sha256; a newest point that fails falls back to the newest
    that loads, with a note), then published in the safe order. Afterwards
    `CheckpointStore(dst_url).load_run(run_id)` returns that state and an agent can resume.
    The destination must not hold other files of the run (restore into a fresh URL); a
    restore that was interrupted may simply be run again.
    """
    if version is not None and run_id is None:
        raise ConfigError("--version needs --run: versions are per run")
    m = _Mirror(src_url, dst_url, src_options=src_options, dst_options=dst_options,
                workers=workers, attempts=attempts, base_delay=base_delay)
    prog: Progress = progress or _NoProgress()
    t0 = time.monotonic()
    try:
        m.check()
        report = RestoreReport(m.src.display_url, m.dst.display_url)
        ids = _run_ids(m.src, run_id)
        lg_keys = list_keys(m.src, f"{LG_ROOT}/") if run_id is None else []
        if not ids and not lg_keys:
            report.errors.append(f"{m.src.display_url} holds no runs to restore")
        if lg_keys:
            report.runs.append(_restore_langgraph(m, lg_keys, prog))
        for rid in ids:
            try:
                with gc_paused():
                    report.runs.append(_restore_run(m, rid, version, prog, staging_dir))
            except StorageUnavailableError as exc:
                report.runs.append(RunResult(rid, "incomplete", error=str(exc), missing=[str(exc)]))
        report.seconds = time.monotonic() - t0
        report.retries = _retries(m.src, m.dst)
        return report
    finally:
        m.close()


def _restore_langgraph(m: _Mirror, keys: list[str], prog: Progress) -> RunResult:
    """Copy a LangGraph saver's files back, never over a file the destination already holds.

    A record log is a file of local disk; a saver on S3 or in memory reads one object per key,
    so for those destinations each log's live records are written out as those objects.
    """
    res = RunResult(LANGGRAPH_ENTRY, "restored")
    dst = m.dst.inner if isinstance(m.dst, RetryingStorage) else m.dst
    items: list[tuple[str, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="ckptfs-restore-lg-") as tmp:
        logs = open_storage(tmp, {"fsync": False})
        for key in keys:
            if TEMP_MARKER in key.rsplit("/", 1)[-1]:
                continue
            data = m.src.get(key)
            if key.endswith("/" + LOG_NAME) and not isinstance(dst, LocalStorage):
                assert isinstance(logs, LocalStorage)
                logs.put(key, data)
                view = LogStorage(logs, lg_group_of)
                group = key[: -len(LOG_NAME)]
                items.extend((k, view.get(k)) for k in view.list(group))
                view.close()
            else:
                items.append((key, data))
    for key, data in items:
        try:
            m.dst.put_if_absent(key, data)
        except FileExistsError:
            if m.dst.get(key) == data:
                res.skipped += 1
                prog.done(key, len(data), True)
                continue
            res.status = "conflict"
            res.missing.append(key)
            res.error = f"{key}: the destination already holds a different file under this name"
            continue
        res.copied += 1
        res.bytes += len(data)
        prog.done(key, len(data), False)
    return res


def restore_points(src_url: StorageLike, run_id: str,
                   src_options: Mapping[str, Any] | None = None) -> list[int]:
    """Versions a restore of `run_id` from this mirror can target (by file names; advisory)."""
    st = _as_storage(src_url, src_options, 1, 0.0)
    files, _ = _run_files(st, run_id)
    chain = _name_chain(files)
    if not chain:
        return []
    return [f.version for f in chain]


def _restore_run(m: _Mirror, run_id: str, version: int | None, prog: Progress,
                 staging_dir: str | None) -> RunResult:
    files, _ = _run_files(m.src, run_id)
    res = RunResult(run_id, "restored")
    if not files:
        res.status, res.error = "failed", f"run {run_id!r} is not in the mirror"
        return res
    res.source_version = max(f.version for f in files)
    reader = _Reader(m.src, run_id, m.pool)
    chain = _plan(reader, files, version)
    if chain is None:
        res.status = "failed"
        if version is not None:
            pts = ", ".join(map(str, [f.version for f in (_name_chain(files) or [])])) or "none"
            res.error = f"version {version} of run {run_id!r} is not restorable from the mirror " \
                        f"(restorable versions: {pts})"
        else:
            res.error = f"the mirror holds files of run {run_id!r} but no loadable chain"
        res.missing = reader.problems
        return res
    dst_files, dst_keys = _run_files(m.dst, run_id)
    with _Stage(staging_dir) as stage:
        # Stage: the chain's files and every artifact it references, each verified by sha256.
        for f in chain.files:
            stage.put(f.key, reader.raw[f.key])
        missing: list[str] = []

        def fetch(ref: ArtifactRef) -> None:
            try:
                _stage_artifact(m.src, stage, ref)
            except (_Missing, FileNotFoundError) as exc:
                missing.append(str(exc) if isinstance(exc, _Missing) else f"{ref.uri}: missing in the mirror")

        for fut in [m.pool.submit(fetch, r) for r in chain.refs.values()]:
            fut.result()
        # Verify: a full load of the staged files, as the agent's resume will do.
        loaded = _verify_stage(stage, reader, run_id, chain.version, version is not None)
        if loaded is None:
            res.status = "failed"
            res.error = (f"run {run_id!r}: the mirror's files do not load"
                         + (f" at version {version}" if version is not None else ""))
            res.missing = missing or reader.problems
            return res
        if loaded != chain.version:
            res.notes.append(f"the mirror's newest point v{chain.version} is incomplete "
                             f"({'; '.join(missing[:3]) or 'does not validate'}); restored v{loaded}")
            chain2 = _plan(reader, chain.files, loaded)
            if chain2 is None:
                res.status, res.error = "failed", f"run {run_id!r}: could not re-plan v{loaded}"
                return res
            chain = chain2
        res.version, res.snapshot = chain.version, chain.snapshot.version if chain.snapshot else None
        strays = sorted({f.key for f in dst_files} - {f.key for f in chain.files})
        if strays:
            res.status = "conflict"
            res.error = (f"{m.dst.display_url} already holds {len(strays)} other file(s) of run "
                         f"{run_id!r} (e.g. {strays[0]}); restore into a fresh URL")
            return res
        # Publish: artifacts, records, snapshot last, each skipped if already there, verified.
        known: set[str] = set()
        absent = _note_present(m.dst, chain.refs, known)
        copier = _Copier(m.dst, prog, known, absent)
        refs = list(chain.refs.values())
        prog.planned(len(refs) + len(chain.files),
                     sum(r.size for r in refs) + sum(len(reader.raw[f.key]) for f in chain.files))
        _gather([m.pool.submit(copier.artifact, stage, r) for r in refs], res, [r.size for r in refs])
        if res.ok:
            _gather([m.pool.submit(copier.blob, f.key, reader.raw[f.key], f.key in dst_keys)
                     for f in chain.records], res, [len(reader.raw[f.key]) for f in chain.records])
        if res.ok and chain.snapshot is not None:
            s = chain.snapshot
            _gather([m.pool.submit(copier.blob, s.key, reader.raw[s.key], s.key in dst_keys)], res,
                    [len(reader.raw[s.key])])
        if res.ok and res.copied == 0:
            res.status = "up-to-date"
        if res.status == "incomplete":
            res.status = "failed" if res.copied == 0 and res.skipped == 0 else "incomplete"
    return res


def _stage_artifact(src: Storage, stage: Storage, ref: ArtifactRef) -> None:
    h = hashlib.sha256()
    n = 0

    class _Hashing:
        def __init__(self, f: IO[bytes]) -> None:
            self.f = f

        def read(self, size: int = -1) -> bytes:
            nonlocal n
            b = self.f.read(size)
            h.update(b)
            n += len(b)
            return b

    if ref.size <= _SMALL:
        data = src.get(ref.uri)
        h.update(data)
        n = len(data)
        if n == ref.size and h.hexdigest() == ref.sha256:
            stage.put(ref.uri, data)
    else:
        with src.open_read(ref.uri) as f:
            stage.put_stream(ref.uri, _Hashing(f))  # type: ignore[arg-type]
    if n != ref.size or h.hexdigest() != ref.sha256:
        stage.delete(ref.uri)
        raise _Missing(f"{ref.uri}: mirror copy does not match its sha256")


class _Stage(Storage):
    """Where a restore holds what it fetched until the run verifies: memory, big files on disk.

    Small objects stay in memory and `get` returns the very bytes object that was put, which
    lets the verifying load reuse the records the planner already decoded from those bytes
    (`_StagedStore`). Artifacts above the single-GET size stream to a temporary directory
    (under `staging_dir`), created only if one is needed and removed on exit.
    """

    capabilities = Capabilities(atomic_put=True, exclusive_create=True, conditional_put=False,
                                durable=False, shared=False)

    def __init__(self, staging_dir: str | None) -> None:
        super().__init__("stage://restore", {})
        self._staging_dir = staging_dir
        self._mem: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._disk: LocalStorage | None = None

    def __enter__(self) -> _Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self._mem.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _spill(self) -> LocalStorage:
        with self._lock:
            if self._disk is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="ckptfs-restore-", dir=self._staging_dir)
                self._disk = LocalStorage(self._tmp.name, self._tmp.name, {"fsync": False})
            return self._disk

    def _on_disk(self, key: str) -> bool:
        return self._disk is not None and self._disk.exists(key)

    def put(self, key: str, data: bytes) -> str:
        with self._lock:
            self._mem[check_key(key)] = data
        return ""

    def put_if_absent(self, key: str, data: bytes) -> str:
        with self._lock:
            if key in self._mem or self._on_disk(key):
                raise FileExistsError(key)
            self._mem[check_key(key)] = data
        return ""

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        raise NotImplementedError("the restore stage holds immutable objects only")

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        data = self._mem.get(key)
        if data is not None:
            return data, ""
        if self._disk is None:
            raise FileNotFoundError(key)
        return self._disk.get_with_etag(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        p = prefix.rstrip("/") + "/" if prefix else ""
        with self._lock:
            keys = {k for k in self._mem if k.startswith(p)}
        if self._disk is not None:
            keys.update(self._disk.list(prefix))
        return sorted(k for k in keys if start_after is None or k > start_after)

    def list_dirs(self, prefix: str) -> Keys:
        p = prefix.rstrip("/") + "/" if prefix else ""
        return sorted({k[len(p):].split("/", 1)[0] for k in self.list(prefix) if "/" in k[len(p):]})

    def delete(self, key: str) -> None:
        with self._lock:
            self._mem.pop(key, None)
        if self._disk is not None:
            self._disk.delete(key)

    def size(self, key: str) -> int:
        data = self._mem.get(key)
        if data is not None:
            return len(data)
        if self._disk is None:
            raise FileNotFoundError(key)
        return self._disk.size(key)

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        if exclusive and key in self._mem:
            raise FileExistsError(key)
        self._spill().put_stream(key, src, exclusive)

    def open_read(self, key: str) -> IO[bytes]:
        data = self._mem.get(key)
        if data is not None:
            return io.BytesIO(data)
        if self._disk is None:
            raise FileNotFoundError(key)
        return self._disk.open_read(key)


class _StagedStore(CheckpointStore):
    """The verifying load over a stage: the full load path, minus a second parse of the same bytes.

    `_Reader` decoded each staged record with `codec.decode` (zstd checksum, canonical layout,
    body sha256, journal hash) and checked its header against its name, exactly as
    `CheckpointStore._decode` does. When the stage hands the store that very bytes object,
    the decoded record is reused; anything else is decoded afresh. The walk, hash chain,
    schema, graph and artifact checks all run as in any load.
    """

    def __init__(self, stage: _Stage, reader: _Reader) -> None:
        super().__init__(storage=stage, policy=CompactionPolicy(background=False, keep_last=0))
        self._reader = reader

    def _decode(self, key: str, data: bytes, run_id: str, rf: RunFile) -> codec.Record:
        rec = self._reader.records.get(key)
        if rec is not None and run_id == self._reader.run_id and self._reader.raw.get(key) is data:
            return rec
        return super()._decode(key, data, run_id, rf)


def _verify_stage(stage: _Stage, reader: _Reader, run_id: str, target: int, exact: bool) -> int | None:
    """The version a full load of the staged run reaches (target, or an earlier fallback)."""
    store = _StagedStore(stage, reader)
    try:
        if store.load_run(run_id, version=target) is not None:
            return target
    except (CheckpointCorruptError, VersionNotFoundError, CorruptFileError) as exc:
        logger.warning("run %s: staged v%d does not load: %s", run_id, target, exc)
    if exact:
        return None
    try:
        run = store.load_run(run_id, resolve_artifacts=True)
    except (CheckpointCorruptError, CorruptFileError) as exc:
        logger.warning("run %s: no staged version loads: %s", run_id, exc)
        return None
    if run is None or store.last_load is None:
        return None
    return store.last_load.version


# ----------------------------------------------------------------------------- the job


def _to_seconds(interval: float | timedelta | None) -> float | None:
    if interval is None:
        return None
    s = interval.total_seconds() if isinstance(interval, timedelta) else float(interval)
    if s <= 0:
        raise ConfigError(f"mirror interval must be positive, got {s}s")
    return s


class MirrorJob:
    """Mirror passes on a schedule (APScheduler 3) and on demand, never two at once.

    interval (seconds or timedelta) or cron (a crontab expression) sets the schedule; both
    None means passes run only when triggered. The scheduler job has max_instances=1,
    coalesce=True and `misfire_grace_time`, and every pass also holds one lock, so a tick
    or trigger that arrives while a pass runs is folded into one more pass afterwards.

    The agent calls `notify(run_id, version)` (or the callable from `step_trigger(n)`) after
    each commit: it returns at once, and when the run crossed a multiple of N it schedules a
    pass that mirrors that run's newest version. It never blocks the agent's commits.
    """

    JOB_ID = "ckptfs-mirror"

    def __init__(self, src_url: StorageLike, dst_url: StorageLike, *, every_n: int = 10,
                 interval: float | timedelta | None = None, cron: str | None = None,
                 keep_last: int | None = None, latest: bool = False,
                 src_options: Mapping[str, Any] | None = None,
                 dst_options: Mapping[str, Any] | None = None, misfire_grace_time: int = 60,
                 workers: int = DEFAULT_WORKERS, attempts: int = DEFAULT_ATTEMPTS,
                 base_delay: float = 0.2, on_report: Callable[[MirrorReport], None] | None = None,
                 timezone: str = "UTC") -> None:
        if every_n < 1:
            raise ConfigError(f"every_n must be >= 1, got {every_n}")
        if interval is not None and cron is not None:
            raise ConfigError("give a mirror interval or a cron expression, not both")
        self.every_n = every_n
        self.interval = _to_seconds(interval)
        self.cron = cron
        self.keep_last = keep_last
        self.latest = latest
        self.on_report = on_report
        self.misfire_grace_time = misfire_grace_time
        self._trigger: Any = None
        if cron is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                self._trigger = CronTrigger.from_crontab(cron, timezone=timezone)
            except ValueError as exc:
                raise ConfigError(f"bad cron expression {cron!r}: {exc}") from None
        elif self.interval is not None:
            from apscheduler.triggers.interval import IntervalTrigger

            self._trigger = IntervalTrigger(seconds=self.interval, timezone=timezone)
        self._timezone = timezone
        self._m = _Mirror(src_url, dst_url, src_options=src_options, dst_options=dst_options,
                          workers=workers, attempts=attempts, base_delay=base_delay)
        self._pass_lock = threading.Lock()
        self._state = threading.Lock()
        self._tick_pending = False
        self._runs_pending: set[str] = set()
        self._seen: dict[str, int] = {}
        self._scheduler: Any = None
        self._wake = threading.Event()
        self._closing = False
        self._worker: threading.Thread | None = None
        self.passes = 0
        self.overlaps = 0  # ticks/triggers that found a pass running and were folded into it
        self.last_report: MirrorReport | None = None
        self.errors = 0

    # -- lifecycle
    def start(self) -> MirrorJob:
        from apscheduler.schedulers.background import BackgroundScheduler

        self._m.check()
        self._scheduler = BackgroundScheduler(
            timezone=self._timezone,
            job_defaults={"max_instances": 1, "coalesce": True,
                          "misfire_grace_time": self.misfire_grace_time})
        if self._trigger is not None:
            self._scheduler.add_job(self.tick, self._trigger, id=self.JOB_ID, name="ckptfs mirror")
        self._scheduler.start()
        self._closing = False
        self._worker = threading.Thread(target=self._worker_loop, name="ckptfs-mirror-job",
                                        daemon=True)
        self._worker.start()
        with self._state:
            pending = bool(self._runs_pending)
        if pending:
            self._schedule_now()
        return self

    def shutdown(self, wait: bool = True) -> None:
        """Stop scheduling; with `wait`, let a running pass finish (it is never torn anyway)."""
        self._closing = True
        self._wake.set()
        if self._worker is not None:
            if wait:
                self._worker.join()
            self._worker = None
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=wait)
            self._scheduler = None
        self._m.close()

    def __enter__(self) -> MirrorJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def src_display(self) -> str:
        return self._m.src.display_url

    @property
    def dst_display(self) -> str:
        return self._m.dst.display_url

    @property
    def scheduler(self) -> Any:
        """The APScheduler BackgroundScheduler (None before start), for pause/resume/inspection."""
        return self._scheduler

    # -- triggers
    def tick(self) -> MirrorReport | None:
        """One scheduled pass over every run (the every_n rule); folded if one is running."""
        with self._state:
            self._tick_pending = True
        return self._drain()

    def notify(self, run_id: str, version: int) -> bool:
        """Tell the job a run committed `version`; True if that crossed a multiple of every_n."""
        with self._state:
            last = self._seen.get(run_id, 0)
            self._seen[run_id] = max(last, version)
            crossed = version // self.every_n > last // self.every_n
            if crossed:
                self._runs_pending.add(run_id)
        if crossed:
            self._schedule_now()
        return crossed

    def step_trigger(self, every_n: int | None = None) -> Callable[[str, int], bool]:
        """A callable for the agent's checkpoint path: (run_id, version) -> scheduled?"""
        n = every_n or self.every_n
        if n < 1:
            raise ConfigError(f"every_n must be >= 1, got {n}")
        seen: dict[str, int] = {}
        lock = threading.Lock()

        def trigger(run_id: str, version: int) -> bool:
            with lock:
                last = seen.get(run_id, 0)
                seen[run_id] = max(last, version)
                if version // n <= last // n:
                    return False
            with self._state:
                self._runs_pending.add(run_id)
            self._schedule_now()
            return True

        return trigger

    def _schedule_now(self) -> None:
        """Wake the job's own worker; never touches the scheduler's locks (no deadlock at exit)."""
        self._wake.set()

    def _worker_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                self._drain()
            except Exception:  # _one_pass logs; keep the worker alive
                logger.exception("mirror worker")

    def run_now(self) -> MirrorReport | None:
        """A pass right here, in the caller's thread (None if one is running: it is folded)."""
        return self.tick()

    # -- the pass
    def _drain(self) -> MirrorReport | None:
        """One pass over what is pending; work that arrives meanwhile gets a pass of its own.

        Callers record their work before trying the lock, and the holder looks for new work
        only after releasing it, so a trigger is never lost between the two; one pass per
        call keeps every thread (the caller's, the scheduler's) from being held in a loop.
        """
        if not self._pass_lock.acquire(blocking=False):
            with self._state:
                self.overlaps += 1
            return None
        report: MirrorReport | None = None
        try:
            with self._state:
                tick, runs = self._tick_pending, sorted(self._runs_pending)
                self._tick_pending = False
                self._runs_pending.clear()
            if tick or runs:
                report = self._one_pass(tick, runs)
        finally:
            self._pass_lock.release()
        with self._state:
            more = self._tick_pending or bool(self._runs_pending)
        if more and not self._closing:
            self._schedule_now()
        return report

    def _one_pass(self, tick: bool, runs: list[str]) -> MirrorReport | None:
        try:
            report: MirrorReport | None = None
            if runs:
                report = self._m.pass_(runs, self.every_n, True, self.keep_last, _NoProgress())
            if tick:
                full = self._m.pass_(None, self.every_n, self.latest, self.keep_last, _NoProgress())
                if report is not None:
                    done = {r.run_id for r in report.runs}
                    full.runs = report.runs + [r for r in full.runs if r.run_id not in done]
                    full.seconds += report.seconds
                    full.retries += report.retries
                report = full
        except Exception:
            self.errors += 1
            logger.exception("mirror pass failed; the next tick tries again")
            return None
        self.passes += 1
        self.last_report = report
        if report is not None:
            if not report.ok:
                logger.warning("mirror pass incomplete: %s", "; ".join(report.missing[:3]))
            if self.on_report is not None:
                self.on_report(report)
        return report

