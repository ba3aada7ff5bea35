"""Restore: stage a restore point from a mirror, verify it by a full load, then publish it in
the safe order (artifacts, records, the snapshot last) into a fresh URL."""


from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

from ckptfs.errors import (
    CheckpointCorruptError,
    ConfigError,
    CorruptFileError,
    StorageUnavailableError,
    VersionNotFoundError,
)
from ckptfs.format.keys import RunFile, case_twins_hint, namespace_plugin, parse_run_key, run_prefix
from ckptfs.format.models import ArtifactRef
from ckptfs.format.reader import loadable_versions
from ckptfs.replication.copy import (
    DEFAULT_ATTEMPTS,
    DEFAULT_WORKERS,
    SMALL,
    Copier,
    CopyMissing,
    StorageLike,
    as_storage,
    gather,
    note_present,
    retries_of,
    run_ids,
)
from ckptfs.replication.mirror import Mirror
from ckptfs.replication.plan import RunReader, chain_end, name_path, plan, run_files
from ckptfs.replication.report import LANGGRAPH_ENTRY, NoProgress, Progress, RestoreReport, RunResult
from ckptfs.storage.base import TEMP_MARKER, Capabilities, Keys, Storage, check_key
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logstore import LOG_NAME, LogStorage
from ckptfs.storage.registry import list_keys, open_storage
from ckptfs.storage.retry import RetryingStorage
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.compactor import CompactionPolicy
from ckptfs.store.loader import gc_paused, read_headers, unread_folders

logger = logging.getLogger(__name__)



def restore(src_url: StorageLike, dst_url: StorageLike, run_id: str | None = None,
            version: int | None = None, src_options: Mapping[str, Any] | None = None,
            dst_options: Mapping[str, Any] | None = None, *, workers: int = DEFAULT_WORKERS,
            attempts: int = DEFAULT_ATTEMPTS, base_delay: float = 0.2,
            progress: Progress | None = None, staging_dir: str | None = None,
            listings: Mapping[str, Iterable[str]] | None = None) -> RestoreReport:
    """Copy runs (or one run, at its newest point or at `version`) from a mirror into `dst_url`.

    Each run is staged in a local temporary directory, verified there by a full load
    (hash chain, graph, artifact sha256; a newest point that fails falls back to the newest
    that loads, with a note), then published in the safe order. Afterwards
    `CheckpointStore(dst_url).load_run(run_id)` returns that state and an agent can resume.
    The destination must not hold other files of the run (restore into a fresh URL); a
    restore that was interrupted may simply be run again.

    `listings`: run id -> the keys listed under that run in the mirror, when the caller has
    just listed it (`ckptfs restore --run R` checks R and `--version` first; on S3 each
    listing is a round trip). A run planned again because a file vanished is listed afresh.
    """
    if version is not None and run_id is None:
        raise ConfigError("--version needs --run: versions are per run")
    m = Mirror(src_url, dst_url, src_options=src_options, dst_options=dst_options,
                workers=workers, attempts=attempts, base_delay=base_delay)
    prog: Progress = progress or NoProgress()
    t0 = time.monotonic()
    try:
        m.check()
        report = RestoreReport(m.src.display_url, m.dst.display_url)
        ids = run_ids(m.src, run_id, skipped=report.runs)
        lg_keys = list_keys(m.src, LANGGRAPH_ENTRY) if run_id is None else []
        if not ids and not lg_keys:
            report.errors.append(f"{m.src.display_name} holds no runs to restore")
        if lg_keys:
            report.runs.append(restore_langgraph(m, lg_keys, prog))
        for rid in ids:
            try:
                got = _restore_run_listed(m, rid, version, prog, staging_dir, (listings or {}).get(rid))
            except StorageUnavailableError as exc:
                got = RunResult(rid, "incomplete", error=str(exc), missing=[str(exc)])
            if got.status == "conflict" and got.error is not None:
                got.error += case_twins_hint(rid, ids)
            report.runs.append(got)
        report.seconds = time.monotonic() - t0
        report.retries = retries_of(m.src, m.dst)
        return report
    finally:
        m.close()


def _restore_run_listed(m: Mirror, run_id: str, version: int | None, prog: Progress,
                        staging_dir: str | None, keys: Iterable[str] | None = None) -> RunResult:
    """restore_run, planned again from a fresh listing when a file of the mirror vanished
    between its listing and its read (the mirror job's retention, a prune of the mirror): that
    happens before anything is published. It escaped as FileNotFoundError, `ckptfs restore`
    exit 3 ("unexpected FileNotFoundError"); a mirror pass plans again the same way."""
    for attempt in range(3):
        try:
            with gc_paused():
                return restore_run(m, run_id, version, prog, staging_dir, keys)
        except FileNotFoundError as exc:
            keys = None  # plan again from a fresh listing
            if attempt == 2:
                return RunResult(run_id, "incomplete", error=f"the mirror kept changing: {exc}",
                                 missing=[f"{exc}: vanished from the mirror while it was read"])
            logger.info("run %s: a mirror file vanished (%s); planning again", run_id, exc)
    raise AssertionError("unreachable")


def restore_langgraph(m: Mirror, keys: list[str], prog: Progress) -> RunResult:
    """Copy a LangGraph saver's files back, never over a file the destination already holds.

    A record log is a file of local disk; a saver on S3 or in memory reads one object per key,
    so for those destinations each log's live records are written out as those objects.
    """
    res = RunResult(LANGGRAPH_ENTRY, "restored")
    dst = m.dst.inner if isinstance(m.dst, RetryingStorage) else m.dst
    items: list[tuple[str, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="ckptfs-restore-lg-") as tmp:
        logs = open_storage(tmp, {"fsync": False})
        transient = namespace_plugin(LANGGRAPH_ENTRY).is_transient
        for key in keys:
            if TEMP_MARKER in key.rsplit("/", 1)[-1] or transient(key):
                continue  # half-written, or a lease: no state to restore
            data = m.src.get(key)
            if key.endswith("/" + LOG_NAME) and not isinstance(dst, LocalStorage):
                assert isinstance(logs, LocalStorage)
                logs.put(key, data)
                view = LogStorage(logs, namespace_plugin(LANGGRAPH_ENTRY).group_of)
                group = key[: -len(LOG_NAME)]
                damage = view.damage(group)
                if damage:
                    # its intact records alone would be a wrong state: an older checkpoint
                    # served as the newest, a pending write gone, and nothing would say so
                    res.status = "incomplete"
                    res.missing.append(key)
                    where = ", ".join(str(d.offset) for d in damage)
                    res.error = res.error or (
                        f"{key}: damaged record(s) at byte {where}; not written out as objects (an "
                        "older state would read as the newest): restore to local disk to keep the "
                        "log as it is, and see `ckptfs verify`")
                else:
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
                   src_options: Mapping[str, Any] | None = None,
                   keys: Iterable[str] | None = None) -> list[int]:
    """Versions a restore of `run_id` from this mirror can target: those a load of exactly
    that version reaches through files that read (`reader.loadable_versions`, from every
    file's header; what `ckptfs versions` marks).

    `keys`: the run's listing, when the caller has it already (on S3 each listing is a round
    trip). A run folder that is no directory (a symlink, never followed, or a file) hides
    whatever versions it holds: the points are those of the regular files, and, unless the
    caller passed the listing (and so can name the folder itself), a warning says what was
    not read.
    """
    st = as_storage(src_url, src_options, 1, 0.0)
    try:
        if keys is None:
            keys = st.list(run_prefix(run_id))
            for why in unread_folders(keys):
                logger.warning("run %s: %s, so no restore point among them is listed", run_id, why)
        return _loadable(st, run_id, [rf for k in keys if (rf := parse_run_key(k)) is not None])
    finally:
        if not isinstance(src_url, Storage):  # opened here: closed here, as Mirror does
            st.close()


def _loadable(storage: Storage, run_id: str, files: list[RunFile]) -> list[int]:
    headers = read_headers(storage, run_id, files)
    return sorted(loadable_versions({rf: got[0] if got else None for rf, got in headers.items()}))


def restore_run(m: Mirror, run_id: str, version: int | None, prog: Progress,
                 staging_dir: str | None, keys: Iterable[str] | None = None) -> RunResult:
    """One run's point, staged, verified and published. A folder of the run that is no
    directory in the mirror (a symlink, never followed, or a file) hides versions no read
    reaches: the newest point of the regular files (v15 from `snap/` while a linked `log/` held
    v16 and v17) was restored, "restored 15", exit 0, and verify called the store clean, a run
    a version short for an agent to resume and pay again. As a mirror pass does, the run is
    `incomplete` (exit 1) and the folder named; unlike a mirror, a restored store is nobody's
    earlier state, so nothing of it is published. A `--version` asked for is another matter:
    that point is whole when it loads from the regular files, and is restored, with a note."""
    files, listed = run_files(m.src, run_id, keys)
    unread = unread_folders(listed)
    if unread and version is None:
        hint = " (`--version` restores one of the points `ckptfs versions` lists)" if name_path(files) else ""
        reasons = [f"{why}, so the run is not restored{hint}" for why in unread]
        return RunResult(run_id, "incomplete", source_version=max((f.version for f in files), default=0),
                         error="; ".join(reasons), missing=reasons)
    res = _restore_point(m, run_id, files, version, prog, staging_dir)
    if unread and res.ok:
        res.notes += unread
    elif unread:
        res.not_whole([f"{why}, so version {version} may be among them" for why in unread])
    return res


def _restore_point(m: Mirror, run_id: str, files: list[RunFile], version: int | None, prog: Progress,
                   staging_dir: str | None) -> RunResult:
    res = RunResult(run_id, "restored")
    if not files:
        res.status, res.error = "failed", f"run {run_id!r} is not in the mirror"
        return res
    res.source_version = max(f.version for f in files)
    reader = RunReader(m.src, run_id, m.pool)
    chain = plan(reader, files, version)
    if chain is None:
        res.status = "failed"
        if version is not None:
            pts = ", ".join(map(str, _loadable(m.src, run_id, files))) or "none"
            res.error = f"version {version} of run {run_id!r} is not restorable from the mirror " \
                        f"(restorable versions: {pts})"
        else:
            res.error = f"the mirror holds files of run {run_id!r} but no loadable chain"
        res.missing = reader.problems
        return res
    named = chain_end(name_path(files))
    if version is None and chain.version < named:
        # the plan skipped the newest point's damaged or unreadable files: "restored" one
        # version short, the note column empty, exit 0, the agent resuming to pay again
        why = "; ".join(reader.problems[:3]) or "it does not load"
        res.notes.append(f"the mirror's newest point v{named} does not load ({why}); "
                         f"restored v{chain.version}")
    dst_files, dst_keys = run_files(m.dst, run_id)
    with Stage(staging_dir) as stage:
        # Stage: the chain's files and every artifact it references, each verified by sha256.
        for f in chain.files:
            stage.put(f.key, reader.raw[f.key])
        missing: list[str] = []

        def fetch(ref: ArtifactRef) -> None:
            try:
                stage_artifact(m.src, stage, ref)
            except (CopyMissing, FileNotFoundError) as exc:
                missing.append(str(exc) if isinstance(exc, CopyMissing)
                               else f"{ref.uri}: missing in the mirror")

        for fut in [m.pool.submit(fetch, r) for r in chain.refs.values()]:
            fut.result()
        # Verify: a full load of the staged files, as the agent's resume will do.
        loaded = verify_stage(stage, run_id, chain.version, version is not None)
        if loaded is None:
            res.status = "failed"
            res.error = (f"run {run_id!r}: the mirror's files do not load"
                         + (f" at version {version}" if version is not None else ""))
            res.missing = missing or reader.problems
            return res
        if loaded != chain.version:
            res.notes.append(f"the mirror's newest point v{chain.version} is incomplete "
                             f"({'; '.join(missing[:3]) or 'does not validate'}); restored v{loaded}")
            chain2 = plan(reader, chain.files, loaded)
            if chain2 is None:
                res.status, res.error = "failed", f"run {run_id!r}: could not re-plan v{loaded}"
                return res
            chain = chain2
        res.version, res.snapshot = chain.version, chain.snapshot.version if chain.snapshot else None
        strays = sorted({f.key for f in dst_files} - {f.key for f in chain.files})
        if strays:
            res.status = "conflict"
            res.error = (f"{m.dst.display_name} already holds {len(strays)} other file(s) of run "
                         f"{run_id!r} (e.g. {strays[0]}); restore into a fresh URL")
            return res
        # Publish: artifacts, records, and last the file every load of the point starts from
        # (the snapshot, or without one the record built on version 0), each skipped if already
        # there, verified. Unlike a mirror, a restored store is nobody's earlier state: until
        # that start is there, nothing loads, so a restore cut short (retries ran out) leaves a
        # store that verify reports and an agent refuses to resume, never one a version short
        # that verify calls clean and a resume continues from, paying again for its calls.
        known: set[str] = set()
        absent = note_present(m.dst, chain.refs, known)
        copier = Copier(m.dst, prog, known, absent)
        # Files the destination already holds under the point's names must be these very bytes
        # (a restore run again after an interruption), checked before anything is written: a
        # clash found while copying left the records copied so far in the folder. On a
        # case-insensitive disk that folder is another run's ('Papers' for 'papers'), whose
        # next commit then collided with them.
        present = [f for f in chain.files if f.key in dst_keys]
        same = [m.pool.submit(copier.same, f.key, reader.raw[f.key]) for f in present]
        clash = [f.key for f, fut in zip(present, same, strict=True) if not fut.result()]
        if clash:
            res.status = "conflict"
            res.error = (f"{m.dst.display_name} already holds {len(clash)} different file(s) under the "
                         f"names of run {run_id!r} (e.g. {clash[0]}); restore into a fresh URL")
            return res
        held = {f.key for f in present}  # these very bytes are there: nothing to copy, read once
        refs = list(chain.refs.values())
        prog.planned(len(refs) + len(chain.files),
                     sum(r.size for r in refs) + sum(len(reader.raw[f.key]) for f in chain.files))
        for f in present:
            prog.done(f.key, len(reader.raw[f.key]), True)
        res.skipped += len(present)
        gather([m.pool.submit(copier.artifact, stage, r) for r in refs], res, [r.size for r in refs])
        start = chain.snapshot if chain.snapshot is not None else (
            chain.records[0] if chain.records else None)
        recs = [f for f in chain.records if f is not start and f.key not in held]
        if res.ok:
            gather([m.pool.submit(copier.blob, f.key, reader.raw[f.key], False)
                     for f in recs], res, [len(reader.raw[f.key]) for f in recs])
        if res.ok and start is not None and start.key not in held:
            gather([m.pool.submit(copier.blob, start.key, reader.raw[start.key], False)],
                   res, [len(reader.raw[start.key])])
        if res.ok and res.copied == 0:
            res.status = "up-to-date"
        if res.status == "incomplete":
            res.status = "failed" if res.copied == 0 and res.skipped == 0 else "incomplete"
    return res


def stage_artifact(src: Storage, stage: Storage, ref: ArtifactRef) -> None:
    """Fetch one artifact into the stage, its size and sha256 checked. One over the single-GET
    size streams to disk, read again from its start when the connection is closed mid-body
    (`Storage.read_through`): that escaped the restore as exit 3, "unexpected ClientPayloadError",
    on the first dropped connection, where a small artifact's GET is retried."""
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

    if ref.size <= SMALL:
        data = src.get(ref.uri)
        h.update(data)
        n = len(data)
        if n == ref.size and h.hexdigest() == ref.sha256:
            stage.put(ref.uri, data)
    else:
        def stream(f: IO[bytes]) -> None:  # from the start on each try (read_through)
            nonlocal h, n
            h, n = hashlib.sha256(), 0
            stage.delete(ref.uri)  # a try cut short left its part
            stage.put_stream(ref.uri, _Hashing(f))  # type: ignore[arg-type]

        src.read_through(ref.uri, stream)
    if n != ref.size or h.hexdigest() != ref.sha256:
        stage.delete(ref.uri)
        raise CopyMissing(f"{ref.uri}: mirror copy does not match its sha256")


STAGE_PREFIX = "ckptfs-stage-"
NEW_STAGE_PREFIX = "ckptfs-new-stage-"  # not yet locked: never swept


def sweep_stale_stages(parent: str, keep: str) -> None:
    """Remove staging directories under `parent` whose restore is gone: ours by name, a real
    directory (never a link), and nobody holds its flock. Best effort: a stage another user's
    restore left, or one that cannot be removed, stays."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(STAGE_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if path == keep:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != os.getuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: a restore under way
        else:
            logger.info("removing %s, the staging copy of a restore that died", path)
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


class Stage(Storage):
    """Where a restore holds what it fetched until the run verifies: memory, big files on disk.

    Small objects stay in memory; artifacts above the single-GET size stream to a temporary directory
    (under `staging_dir`), created only if one is needed and removed on exit.
    """

    capabilities = Capabilities(atomic_put=True, exclusive_create=True, conditional_put=False,
                                durable=False, shared=False)

    def __init__(self, staging_dir: str | None) -> None:
        super().__init__("stage://restore", {})
        self._staging_dir = staging_dir
        self._mem: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._dir: str | None = None
        self._held: int | None = None
        self._disk: LocalStorage | None = None

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self._mem.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        if self._held is not None:
            os.close(self._held)

    def _spill(self) -> LocalStorage:
        with self._lock:
            if self._disk is None:
                # held with flock while it is in use: the kernel lets go of it when the process
                # dies, SIGKILL included, so the next restore knows a dead one's copy (a whole
                # run's big artifacts, left in /tmp by every kill) and removes it. It is made
                # under another prefix and renamed once locked: between a mkdtemp and its flock
                # another restore's sweep took it for a dead one's and removed it
                made = tempfile.mkdtemp(prefix=NEW_STAGE_PREFIX, dir=self._staging_dir)
                self._held = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
                fcntl.flock(self._held, fcntl.LOCK_EX)
                parent, name = os.path.split(made)
                self._dir = os.path.join(parent, STAGE_PREFIX + name[len(NEW_STAGE_PREFIX):])
                try:
                    os.rename(made, self._dir)
                except OSError:
                    self._dir = made  # used where it is; only never swept
                sweep_stale_stages(parent, keep=self._dir)
                self._disk = LocalStorage(self._dir, self._dir, {"fsync": False})
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


def verify_stage(stage: Stage, run_id: str, target: int, exact: bool) -> int | None:
    """The version a full load of the staged run reaches (target, or an earlier fallback)."""
    store = CheckpointStore(storage=stage, policy=CompactionPolicy(background=False, keep_last=0))
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


