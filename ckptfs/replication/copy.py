"""Copying immutable objects between stores: skip the same content, verify each upload, never overwrite."""


from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import IO, Any

from ckptfs.errors import ConfigError, CorruptFileError, StorageUnavailableError
from ckptfs.format.keys import ARTIFACTS, RUNS, run_dirs
from ckptfs.format.models import MAX_NAME_BYTES, ArtifactRef, validate_id
from ckptfs.replication.report import Progress, RunResult
from ckptfs.storage.base import Storage
from ckptfs.storage.fs import path_within
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage

logger = logging.getLogger(__name__)

DEFAULT_WORKERS = 16
DEFAULT_ATTEMPTS = 6
LIST_OVER = 16  # more artifacts than this: one LIST of the destination beats a HEAD each
SMALL = 8 * 1024 * 1024  # artifacts up to this size move in one GET / one PUT
SPOOL = 16 * 1024 * 1024
CHUNK = 1024 * 1024

StorageLike = str | Storage



class CopyConflict(Exception):
    pass


class CopyMissing(Exception):
    pass






def verify_etag(etag: str, data: bytes) -> bool | None:
    """True/False when the backend's ETag is a content hash we can check, None otherwise."""
    e = etag.strip('"').lower()
    if len(e) == 32 and all(c in "0123456789abcdef" for c in e):
        return e == hashlib.md5(data, usedforsecurity=False).hexdigest()
    if len(e) == 64 and all(c in "0123456789abcdef" for c in e):
        return e == hashlib.sha256(data).hexdigest()
    return None


class KeyLocks:
    """One lock per artifact key, for the runs a pass copies at once: content addressing makes
    runs share artifacts, and two runs sending the same one each uploaded it (as many times as
    runs held it); the second now waits and finds it verified."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._lock:
            lock = self._keys.setdefault(key, threading.Lock())
        with lock:
            yield


class Copier:
    """Copies immutable objects into a destination: skip same content, verify, never overwrite."""

    def __init__(self, dst: Storage, progress: Progress, known: set[str],
                 absent: frozenset[str] = frozenset(), keys: KeyLocks | None = None,
                 stop: threading.Event | None = None) -> None:
        self.dst = dst
        self.stop = stop  # set: the pass was interrupted; nothing more is begun
        self.progress = progress
        self.known = known  # artifact keys verified present at dst (kept across passes)
        self.absent = absent  # artifact keys this pass's listing of dst did not show
        self.keys = keys if keys is not None else KeyLocks()
        self._lock = threading.Lock()

    def same(self, key: str, data: bytes) -> bool:
        """Whether the destination holds exactly `data` at `key` (False when it holds nothing)."""
        try:
            return hashlib.sha256(self.dst.get(key)).digest() == hashlib.sha256(data).digest()
        except FileNotFoundError:
            return False

    def _stored_size(self, key: str) -> int:
        try:
            return self.dst.size(key)
        except FileNotFoundError as exc:
            # the destination's side, named: a directory at the key met the exclusive create,
            # and this was reported as "referenced artifact is missing at the source"
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "nothing there"
            raise CopyMissing(f"{key}: upload did not verify: the destination holds no object "
                              f"there ({why})") from None

    def _check_upload(self, key: str, data: bytes, etag: str) -> None:
        ok = verify_etag(etag, data)
        if ok is None:
            ok = self._stored_size(key) == len(data)
        if not ok:
            raise CopyMissing(f"{key}: upload did not verify (stored object differs from what was sent)")

    def _stopping(self, key: str) -> None:
        if self.stop is not None and self.stop.is_set():
            raise CopyMissing(f"{key}: not copied: the pass was interrupted")

    def blob(self, key: str, data: bytes, present: bool) -> bool:
        """Copy one checkpoint file; True if uploaded, False if it was already there."""
        self._stopping(key)
        if present:
            if self.same(key, data):
                self.progress.done(key, len(data), True)
                return False
            if self.dst.exists(key):
                raise CopyConflict(f"{key}: the destination holds a different file under this name")
        try:
            etag = self.dst.put_if_absent(key, data)
        except FileExistsError:
            if self.same(key, data):  # a retried PUT that had landed, or a racing pass
                self.progress.done(key, len(data), True)
                return False
            raise CopyConflict(f"{key}: the destination holds a different file under this name") from None
        self._check_upload(key, data, etag)
        self.progress.done(key, len(data), False)
        return True

    def artifact(self, src: Storage, ref: ArtifactRef) -> bool:
        """Copy one artifact, its sha256 checked before it is written; True if uploaded."""
        self._stopping(ref.uri)
        with self.keys.hold(ref.uri):
            return self._artifact(src, ref)

    def _artifact(self, src: Storage, ref: ArtifactRef) -> bool:
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
            if ref.size <= SMALL:
                self._artifact_small(src, ref, replace=have >= 0)
            else:
                self._artifact_large(src, ref, replace=have >= 0)
        except FileNotFoundError:
            raise CopyMissing(f"{key}: referenced artifact is missing at the source") from None
        with self._lock:
            self.known.add(key)
        self.progress.done(key, ref.size, False)
        return True

    def _unwritable(self, key: str, exc: FileNotFoundError) -> CopyMissing:
        """A write to the destination that met FileNotFoundError (its root a dangling symlink,
        a folder removed under it), named as the destination's. It escaped as the source's:
        `ckptfs mirror SRC DST` with DST a dangling link listed every artifact as "referenced
        artifact is missing at the source", sending the operator to a healthy store."""
        why = exc.strerror if exc.strerror else str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        return CopyMissing(f"{key}: cannot write to the destination {self.dst.display_name}: "
                           f"{why}{where}")

    def _artifact_small(self, src: Storage, ref: ArtifactRef, replace: bool) -> None:
        data = src.get(ref.uri)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise CopyMissing(f"{ref.uri}: source artifact does not match its sha256")
        try:
            if replace or not data:
                etag = self.dst.put(ref.uri, data)  # a damaged object sits at the content key
            else:
                try:
                    etag = self.dst.put_if_absent(ref.uri, data)
                except FileExistsError:
                    etag = ""
        except FileNotFoundError as exc:
            raise self._unwritable(ref.uri, exc) from None
        self._check_upload(ref.uri, data, etag)

    def _artifact_large(self, src: Storage, ref: ArtifactRef, replace: bool) -> None:
        with tempfile.SpooledTemporaryFile(max_size=SPOOL) as spool:

            def read(f: IO[bytes]) -> tuple[int, str]:  # from the start on each try (read_through)
                h = hashlib.sha256()
                n = 0
                spool.seek(0)
                spool.truncate()
                while chunk := f.read(CHUNK):
                    h.update(chunk)
                    n += len(chunk)
                    spool.write(chunk)
                return n, h.hexdigest()

            n, digest = src.read_through(ref.uri, read)
            if n != ref.size or digest != ref.sha256:
                raise CopyMissing(f"{ref.uri}: source artifact does not match its sha256")
            spool.seek(0)
            try:
                with contextlib.suppress(FileExistsError):
                    self.dst.put_stream(ref.uri, spool, exclusive=not replace)
            except FileNotFoundError as exc:
                raise self._unwritable(ref.uri, exc) from None
        if self._stored_size(ref.uri) != ref.size:
            raise CopyMissing(f"{ref.uri}: upload did not verify (size differs)")


def note_present(dst: Storage, refs: Mapping[str, ArtifactRef], known: set[str]) -> frozenset[str]:
    """Add the needed artifacts a listing of the destination shows to `known`; return the rest.

    A listed artifact key is its content (content-addressed, written whole), so for many
    artifacts one paginated LIST replaces a HEAD per artifact, both for those it shows
    (present) and for those it does not (absent: they are created exclusively, no HEAD).
    """
    todo = [k for k in refs if k not in known]
    if len(todo) > LIST_OVER:
        listed = set(dst.list(ARTIFACTS))
        known.update(k for k in todo if k in listed)
        return frozenset(k for k in todo if k not in listed)
    return frozenset()


def _key_within(where: str, root: str) -> bool:
    """Whether the object-store location `where` is `root` or below it, at a '/' boundary
    (s3://b/p2 is not below s3://b/p; everything is below a bucket's root)."""
    return not root or where == root or where.startswith(root + "/")


def _within(a: Storage, b: Storage) -> bool:
    """Whether every object of store `a` is an object of store `b` (a at or below b); stores of
    two kinds of place (a directory and a bucket) never are."""
    ra, rb = a.local_root(), b.local_root()
    if ra is not None and rb is not None:
        return path_within(ra, rb)
    la, lb = a.location(), b.location()
    return la is not None and lb is not None and la[0] == lb[0] and _key_within(la[1], lb[1])


def refuse_overlap(src: Storage, dst: Storage) -> None:
    """Refuse (ConfigError) a destination that shares objects with the source: the same store,
    one inside the source, or one holding it. A copy into its own source wrote among the
    source's files (a restore's `runs/runs/<run>` later read as a run named 'runs', every
    file of it a stray key to `verify`), and the next pass copied the copy again."""
    inside, holds = _within(dst, src), _within(src, dst)
    if not inside and not holds:
        return
    s, d = src.display_name, dst.display_name
    if inside and holds:
        why = f"{d} is the source store {s} itself"
    elif inside:
        why = f"{d} lies inside the source store {s}: the copy would be written among its files"
    else:
        why = f"the source store {s} lies inside {d}: the copy would be written around it"
    raise ConfigError(f"{why}; give a destination that neither lies in the source nor holds it")


def as_storage(target: StorageLike, options: Mapping[str, Any] | None, attempts: int,
                base_delay: float) -> Storage:
    """`target` retried `attempts` times in all; wrapped even for one attempt, so that the
    backend's client does not retry beneath it either (Storage.single_attempt)."""
    st = target if isinstance(target, Storage) else open_storage(target, options)
    if not isinstance(st, RetryingStorage):
        st = RetryingStorage(st, attempts=attempts, base_delay=base_delay)
    return st


def retries_of(*stores: Storage) -> int:
    return sum(s.retries for s in stores if isinstance(s, RetryingStorage))


def run_ids(storage: Storage, run_id: str | Iterable[str] | None,
            skipped: list[RunResult] | None = None) -> list[str]:
    """The runs a pass covers; with a whole store, directories that are not runs go to `skipped`."""
    if run_id is None:
        ids, odd = run_dirs(storage.list_dirs(RUNS))
        if skipped is not None:
            skipped.extend(_not_copied(key, why) for key, why in odd)
        return ids
    ids = [run_id] if isinstance(run_id, str) else list(run_id)
    return [validate_id(r, "run id") for r in ids]


def _not_copied(key: str, why: str) -> RunResult:
    """A directory under runs/ no run id names: skipped, unless its name is only too long. Such
    a run was written before ids were held to MAX_NAME_BYTES (S3 keys take 1,024), holds real
    data, and cannot be copied: "incomplete" (exit 1), or a scheduled mirror would report a
    clean pass every time while never copying it."""
    name = key[len(RUNS) + 1 : -1]
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return RunResult(key, "incomplete", error=why, missing=[why], notes=[why])
    return RunResult(key, "skipped", notes=[why])


def _settle(res: RunResult, conflicts: list[str], outcome: Callable[[], bool], size: int) -> None:
    """Count one copy's outcome into res; a conflict or an unreadable/unwritable file is noted."""
    try:
        if outcome():
            res.copied += 1
            res.bytes += size
        else:
            res.skipped += 1
    except CopyConflict as exc:
        conflicts.append(str(exc))
    except (CopyMissing, StorageUnavailableError, OSError, CorruptFileError) as exc:  # unreadable
        res.missing.append(str(exc))


def _conclude(res: RunResult, conflicts: list[str]) -> None:
    if conflicts:
        res.missing.extend(conflicts)
        res.status = "conflict"
        res.error = conflicts[0]
    elif res.missing:
        res.status = "incomplete"
        res.error = res.missing[0]


def gather(futs: list[Future[bool]], res: RunResult, sizes: list[int]) -> None:
    """Wait for a phase; count what it did; collect what failed into res.missing."""
    conflicts: list[str] = []
    for fut, size in zip(futs, sizes, strict=True):
        _settle(res, conflicts, fut.result, size)
    _conclude(res, conflicts)


def copy_in_order(copier: Copier, files: Iterable[tuple[str, bytes, bool]], res: RunResult) -> None:
    """Copy checkpoint files (key, bytes, present at the destination) one at a time, in the
    order given, stopping at the first that fails: a chain copied in load order is, at every
    moment, a whole earlier point of the run, with no hole a `verify` of the destination could
    take for a lost record (copied in parallel, one was reported `missing` until the pass
    ended, and for good when it was killed)."""
    for key, data, present in files:
        conflicts: list[str] = []
        _settle(res, conflicts, functools.partial(copier.blob, key, data, present), len(data))
        _conclude(res, conflicts)
        if not res.ok:
            return
