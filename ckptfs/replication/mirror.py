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

Order, as restic writes, what is referenced before what references it: the artifacts (in
parallel), then the snapshot the point starts from (it needs only them), then the records in
chain order, one at a time, each upload verified before the next starts. So the mirror holds,
at every moment, a whole earlier point of the run: a reader loads an earlier valid version,
never a torn one, and `verify` of the mirror in the middle of a pass finds nothing to report
(records copied in parallel were hash-chained too, and loaded as a prefix, but left holes
verify took for lost records). What this costs is one round trip per record of the point's
walk, which compaction keeps short. An interrupted pass re-run skips what already arrived and
converges.

"Already there" means the same sha256: artifact keys *are* their sha256 and every backend
writes an object whole, so the right size at an artifact key is its content; a checkpoint
file at an existing key is read back and hashed (these files are small, and this only happens
on keys the destination listing shows, i.e. on re-runs). A different file at the same key is
another lineage (a run restored and continued elsewhere): reported as a conflict, never
overwritten. The mirror's newest file of a run is compared with the source's on every pass,
due or not (a MirrorJob reads it from the mirror once), so a mirror holding another store's
history is a conflict at once, not "not-due" until the run is due; so is a mirror holding a
run past the source's newest version (no copy of this source: nothing there to compare). A
mirror's point the source has since pruned cannot be compared at all: a store whose own history
of the run is pruned past the other's point is not told apart (no lineage in the files). An upload counts once
verified: the returned ETag equals the body's MD5 (S3 single-part) or sha256 (memory), else
the stored size is read back.

Restore copies a point from a mirror into a fresh URL: it stages the files (in memory; big
artifacts in a local temporary directory), verifies them by a full load of the run there
(hashes, chain, graph, artifact sha256; the records the planner decoded are not parsed a
second time), and only then publishes into the destination in the same safe order.

A LangGraph saver's files (`langgraph/`) are not runs: a whole-store pass copies each that
changed as it is (see `Mirror._langgraph`), and a whole-store restore copies them back.

Requests are what a pass costs: one LIST of the destination's artifacts tells which are
present (skipped) and which are absent (created exclusively, with no HEAD first). `MirrorJob`
runs passes on APScheduler 3 (interval or cron, one at a time, missed ticks coalesced) and
offers the agent a non-blocking step trigger.
"""


from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ckptfs.errors import (
    ConfigError,
    CorruptFileError,
    MisplacedFileError,
    StorageUnavailableError,
)
from ckptfs.format import codec
from ckptfs.format.keys import RunFile, case_twins_hint, folded_id, namespace_plugin
from ckptfs.format.reader import decode_run_file
from ckptfs.replication.copy import (
    DEFAULT_ATTEMPTS,
    DEFAULT_WORKERS,
    Copier,
    CopyMissing,
    KeyLocks,
    StorageLike,
    as_storage,
    copy_in_order,
    gather,
    note_present,
    refuse_overlap,
    retries_of,
    run_ids,
    verify_etag,
)
from ckptfs.replication.plan import RunReader, chain_end, name_path, plan, run_files
from ckptfs.replication.report import LANGGRAPH_ENTRY, MirrorReport, NoProgress, Progress, RunResult
from ckptfs.storage.base import TEMP_MARKER, Storage
from ckptfs.storage.registry import list_keys
from ckptfs.storage.retry import RetryingStorage
from ckptfs.store.artifacts import TOUCH_AFTER
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.compactor import DEFAULT_SUPERSEDED_GRACE, CompactionPolicy, seconds_value
from ckptfs.store.loader import gc_paused, unread_folders
from ckptfs.store.pools import StorePool

logger = logging.getLogger(__name__)



class Mirror:
    """One source, one destination, a pool of workers; reused by MirrorJob across passes."""

    def __init__(self, src: StorageLike, dst: StorageLike, *, src_options: Mapping[str, Any] | None,
                 dst_options: Mapping[str, Any] | None, workers: int, attempts: int,
                 base_delay: float, superseded_grace: float = DEFAULT_SUPERSEDED_GRACE) -> None:
        if workers < 1:
            raise ConfigError("workers must be >= 1")
        # what mirror-side retention (keep_last) gives a superseded snapshot: a restore or a
        # reader of the mirror that listed a run just before a pass still finds its files
        self.superseded_grace = seconds_value("mirror", "superseded_grace", superseded_grace)
        self.src = as_storage(src, src_options, attempts, base_delay)
        self.dst = as_storage(dst, dst_options, attempts, base_delay)
        # the storages opened here from URLs, closed with the mirror (a caller's are its own)
        self._opened = [st for st, given in ((self.src, src), (self.dst, dst))
                        if not isinstance(given, Storage)]
        # the retry layers made here (a caller's RetryingStorage is its own): `few_attempts`
        self._own_retries = [st for st, given in ((self.src, src), (self.dst, dst))
                             if st is not given and isinstance(st, RetryingStorage)]
        self.stop = threading.Event()  # set when a pass is interrupted: runs under way stop
        # Copies within a phase are independent and each phase is gathered before the next
        # starts, so at interpreter exit they run in turn on the caller's thread: the same pass
        # (refused, a MirrorJob in a non-daemon thread copied nothing once the main one returned).
        self.pool = StorePool(max_workers=workers, thread_name_prefix="ckptfs-mirror")
        self.workers = workers
        self.keys = KeyLocks()  # artifact key -> its lock, for the runs of one pass
        self.known: set[str] = set()  # artifact keys verified at dst; trusted for TOUCH_AFTER
        self.known_since = time.monotonic()
        self.lg_sent: dict[str, bytes] = {}  # LangGraph file -> sha256 the mirror holds (across passes)
        # checkpoint file at dst -> the sha256 it was found to hold: a run's newest point is
        # checked against the source on every pass, and a MirrorJob's passes read it once
        self.proven: dict[str, bytes] = {}
        # this pass's runs whose ids differ only in case from another's: on a case-insensitive
        # destination their folders are one, so the mirror's point must prove it is theirs
        self.twins: frozenset[str] = frozenset()

    @contextlib.contextmanager
    def few_attempts(self, attempts: int) -> Iterator[None]:
        """At most `attempts` tries per request meanwhile (MirrorJob's last pass at shutdown:
        an end that stopped answering must not hold a program's exit for minutes)."""
        saved = [(st, st.attempts) for st in self._own_retries]
        for st, n in saved:
            st.attempts = min(n, attempts)
        try:
            yield
        finally:
            for st, n in saved:
                st.attempts = n

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for st in self._opened:
            st.close()

    def check(self) -> None:
        """Both ends reachable and DST writable as far as that is known without writing, and
        DST apart from SRC: a usage-level failure (exit 2), before anything is copied."""
        refuse_overlap(self.src, self.dst)
        self.src.check()
        self.dst.check()
        self.dst.check_writable()

    def pass_(self, run_id: str | Iterable[str] | None, every_n: int, latest: bool,
              keep_last: int | None, progress: Progress,
              listings: Mapping[str, Iterable[str]] | None = None) -> MirrorReport:
        """One pass; `listings`: run id -> that run's keys at the source, for runs the caller
        has just listed (`mirror`'s docstring)."""
        t0 = time.monotonic()
        if t0 - self.known_since > TOUCH_AFTER:
            # a `ckptfs prune` of the mirror may have collected artifacts since: look again
            self.known.clear()
            self.proven.clear()
            self.known_since = t0
        before = retries_of(self.src, self.dst)
        report = MirrorReport(self.src.display_url, self.dst.display_url)
        ids = run_ids(self.src, run_id, skipped=report.runs)
        # twins among all the source's runs, not only those asked for: `--run Papers` after
        # `--run papers` met papers's files in the shared folder and said "not-due", exit 0
        every = ids if run_id is None else sorted(set(ids) | set(run_ids(self.src, None)))
        folds = Counter(folded_id(rid) for rid in every)
        self.twins = frozenset(rid for rid in ids if folds[folded_id(rid)] > 1)
        for rid, got in zip(ids, self._runs(ids, every_n, latest, keep_last, progress, listings),
                            strict=True):
            if got.status == "conflict" and got.error is not None:
                got.error += case_twins_hint(rid, every)
            report.runs.append(got)
        if run_id is None:
            lg = self._langgraph(progress)
            if lg is not None:
                report.runs.append(lg)
        report.seconds = time.monotonic() - t0
        report.retries = retries_of(self.src, self.dst) - before
        return report

    def _runs(self, ids: list[str], every_n: int, latest: bool, keep_last: int | None,
              progress: Progress, listings: Mapping[str, Iterable[str]] | None) -> list[RunResult]:
        """Each run's pass, several runs at once: a run's records go one at a time (in chain
        order), so a store of many runs would otherwise pay a round trip per record in turn
        (20 runs behind 20 ms of latency: 5.4 s in turn, against 3.6 s when records went in
        parallel). Their copies share the one pool. Stopped (Ctrl-C), runs not begun are
        dropped, and those under way stop before their next file (each had to finish its
        pass: 30 runs behind 2 s uploads took 18 s to exit, against 2 s). Case twins
        (`papers`, `Papers`) go in turn, in one task: on a case-insensitive destination their
        folder is one, and each must meet what the other copied there."""
        def group(rids: list[str]) -> dict[str, RunResult]:
            return {rid: self._run(rid, every_n, latest, keep_last, progress, (listings or {}).get(rid))
                    for rid in rids}

        self.keys = KeyLocks()
        self.stop.clear()
        groups: dict[str, list[str]] = {}
        for rid in ids:
            groups.setdefault(folded_id(rid), []).append(rid)
        if len(groups) < 2:
            done = group(ids)
        else:
            runs = StorePool(max_workers=min(self.workers, len(groups)),
                             thread_name_prefix="ckptfs-mirror-run")
            try:
                done = {}
                for fut in [runs.submit(group, rids) for rids in groups.values()]:
                    done.update(fut.result())
            except BaseException:  # Ctrl-C: runs under way stop at their next file
                self.stop.set()
                raise
            finally:
                runs.shutdown(wait=False, cancel_futures=True)
        return [done[rid] for rid in ids]

    def _run(self, run_id: str, every_n: int, latest: bool, keep_last: int | None,
             progress: Progress, keys: Iterable[str] | None = None) -> RunResult:
        for attempt in range(3):
            try:
                return self._run_once(run_id, every_n, latest, keep_last, progress, keys)
            except FileNotFoundError as exc:
                # The source's retention removed a file under us: plan again from a fresh list.
                keys = None
                if attempt == 2:
                    return RunResult(run_id, "incomplete", error=f"source kept changing: {exc}",
                                     missing=[str(exc)])
                logger.info("run %s: a source file vanished (%s); planning again", run_id, exc)
            except StorageUnavailableError as exc:
                return RunResult(run_id, "incomplete", error=str(exc), missing=[str(exc)])
        raise AssertionError("unreachable")

    def _run_once(self, run_id: str, every_n: int, latest: bool, keep_last: int | None,
                  progress: Progress, keys: Iterable[str] | None = None) -> RunResult:
        """The run's newest restore point, copied when due. A folder of the run that is no
        directory at the source (a symlink, never followed, or a file) makes it incomplete
        whatever was copied: the versions there are on no mirror, and a pass that said
        "mirrored 15" while the source held 17 left a replica short of them in silence. What
        the source can load is still copied (a consistent, older point); the mirror's own
        retention waits until the run is whole."""
        src_files, src_keys = run_files(self.src, run_id, keys)
        unread = unread_folders(src_keys)
        res = self._point(run_id, src_files, src_keys, every_n, latest,
                          None if unread else keep_last, progress)
        if unread:
            res.not_whole([f"{why}, so they are not mirrored" for why in unread])
        return res

    def _point(self, run_id: str, src_files: list[RunFile], src_keys: set[str], every_n: int,
               latest: bool, keep_last: int | None, progress: Progress) -> RunResult:
        if not src_files:
            return RunResult(run_id, "empty")
        head = max(f.version for f in src_files)
        dst_files, dst_keys = run_files(self.dst, run_id)
        dst_chain = name_path(dst_files)
        previous = chain_end(dst_chain)
        res = RunResult(run_id, "mirrored", previous=previous, source_version=head)
        last = dst_chain[-1].key if dst_chain else ""
        if dst_chain and previous > head and not (run_id in self.twins and not self._names_run(last, run_id)):
            # Versions past the source's newest are no copy of it: the run restored from the
            # mirror and continued elsewhere, mirrored here, while this store went on too. The
            # pass said "not-due, -10 new version(s)", exit 0, on every pass (its newest file
            # is no key the source holds, so it was never compared); with --latest it copied
            # this store's point among the other's and --keep-last deleted it again.
            try:
                decode_run_file(self.dst.get(last), dst_chain[-1], run_id)
            except MisplacedFileError:
                pass  # whole, another run's: a conflict
            except (CorruptFileError, FileNotFoundError) as exc:  # garbage there: damage
                res.status, res.version = "incomplete", previous
                res.error = (f"{last}: the mirror's file does not decode ({exc}); never overwritten, "
                             "see `ckptfs verify`")
                res.missing = [res.error]
                return res
            res.status, res.version = "conflict", previous
            res.error = (f"{last}: the mirror holds run {run_id!r} up to v{previous}, past the "
                         f"source's newest v{head} (another store's history of the run, or "
                         f"versions lost at the source); never overwritten")
            res.missing = [res.error]
            return res
        if dst_chain and (previous >= head or run_id in self.twins or last in src_keys):
            # The point is checked even when it is behind, not-due or not: the source moved
            # 3 versions past a mirror holding another store's v5 of the run, and the pass said
            # "not-due", exit 0, until the run was due, while a restore would bring back the
            # other store's run. A twin's point too: on a case-insensitive disk the folder shows
            # the other run's files, read as this run's point, "not-due" on every pass.
            # a twin's point the source does not hold under that name (the twin is ahead: its
            # v5 in the folder of `papers` at v3) proves it is its own by its header
            try:
                other = (not self._same_bytes(last, run_id, dst_chain[-1]) if last in src_keys
                         else run_id in self.twins and not self._names_run(last, run_id))
            except CorruptFileError as exc:
                # a link, a FIFO or damaged bytes at either end: this run cannot be compared,
                # and the refusal escaped the pass (one "corrupt" line, no other run mirrored)
                res.status, res.version, res.error = "incomplete", previous, str(exc)
                res.missing = [res.error]
                return res
            if other:
                # The mirror's newest point is another lineage of this run (a store restored
                # from the mirror and continued, then mirrored here): it was reported not-due,
                # exit 0, while a restore from the mirror would bring back the other store's run.
                res.status, res.version = "conflict", previous
                res.error = (f"{last}: the mirror holds a different file under this name (another "
                             f"store's history of run {run_id!r}?); never overwritten")
                res.missing = [res.error]
                return res
            if last in src_keys and previous >= head:
                res.status, res.version = "up-to-date", previous
                res.snapshot = dst_chain[0].version if dst_chain[0].kind == "snap" else None
                return res
        if (dst_chain and not latest and head - previous < every_n
                and not any(f.version > previous for f in dst_files)):
            # Files past the chain's end are a pass that was killed midway with a hole below
            # ones that arrived (records went in parallel before 2026-12-07; a mirror written
            # then may still hold one): that pass is finished now, due or not. It said
            # "not-due", exit 0, on every pass after, and a finished run never became due
            # again, so the mirror stayed red for `verify`.
            res.status, res.version = "not-due", previous
            return res
        reader = RunReader(self.src, run_id, self.pool)
        chain = plan(reader, src_files)
        if chain is None:
            res.status = "incomplete"
            res.error = "the source holds files for this run but no loadable chain"
            res.missing = reader.problems or [res.error]
            return res
        res.source_version = chain.version
        res.snapshot = chain.snapshot.version if chain.snapshot else None
        absent = note_present(self.dst, chain.refs, self.known)
        copier = Copier(self.dst, progress, self.known, absent, self.keys, self.stop)
        files = chain.files
        nbytes = sum(r.size for r in chain.refs.values()) + sum(len(reader.raw[f.key]) for f in files)
        progress.planned(len(chain.refs) + len(files), nbytes)
        # 1. artifacts
        refs = list(chain.refs.values())
        gather([self.pool.submit(copier.artifact, self.src, r) for r in refs], res,
                [r.size for r in refs])
        if not res.ok:
            res.version = previous
            return res
        # 2. the start and records the mirror already holds are compared first, and a different
        # file among them stops the pass before anything is copied: copied beside it, this
        # run's records went in among another lineage's (a machine lost mid-pass, its run
        # restored and continued elsewhere, mirrored back), and a later pass called the mixture
        # "up-to-date" while a restore from it gave back an older version.
        order = ([chain.snapshot] if chain.snapshot is not None else []) + chain.records
        held = [f for f in order if f.key in dst_keys]
        gather([self.pool.submit(copier.blob, f.key, reader.raw[f.key], True) for f in held], res,
               [len(reader.raw[f.key]) for f in held])
        if not res.ok:
            res.version = previous
            return res
        # 3. the snapshot, then the records in chain order, one at a time: at every moment the
        # mirror holds a whole earlier point (the snapshot needs only the artifacts; each record
        # only what is below it), so a `verify` of the mirror in the middle of a pass finds
        # nothing, where records copied in parallel left holes it reported as lost records
        copy_in_order(copier, [(f.key, reader.raw[f.key], False) for f in order
                               if f.key not in dst_keys], res)
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
        transient = namespace_plugin(LANGGRAPH_ENTRY).is_transient
        present = {k for k in list_keys(self.dst, LANGGRAPH_ENTRY) if not transient(k)}
        done: set[str] = set()
        for _round in range(3):
            keys = [k for k in list_keys(self.src, LANGGRAPH_ENTRY)
                    if TEMP_MARKER not in k.rsplit("/", 1)[-1] and not transient(k)]
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
                except CorruptFileError as exc:
                    # a link out of the store, a FIFO: never read; that file is missing from
                    # the pass (so nothing is deleted from the mirror), the others are copied
                    res.missing.append(key)
                    res.error = str(exc)
                    continue
                self._send_langgraph(key, data, key in present, res, progress)
            if not vanished:
                break
        else:
            res.missing.append(f"{LANGGRAPH_ENTRY} kept changing during the pass")
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
            if verify_etag(etag, data) is False:
                raise CopyMissing(f"{key}: upload did not verify")
            self.lg_sent[key] = digest
        except (StorageUnavailableError, CopyMissing) as exc:
            res.missing.append(key)
            res.error = str(exc)
            return
        res.copied += 1
        res.bytes += len(data)
        progress.done(key, len(data), False)

    def _names_run(self, key: str, run_id: str) -> bool:
        """Whether the destination's file at `key` is run `run_id`'s (its header says so)."""
        try:
            return codec.decode(self.dst.get(key), key).header.run_id == run_id
        except (FileNotFoundError, CorruptFileError):
            return False

    def _same_bytes(self, key: str, run_id: str, rf: RunFile) -> bool:
        """Whether src and dst hold one file at `key`; a dst file found equal once is not
        fetched again (keys are written once, exclusively) until the `known` timer runs out.
        CorruptFileError: either end's file is unreadable (a link, a FIFO), or the two differ
        and one of them does not decode as that file (damage, not another store's history)."""
        try:
            data = self.src.get(key)
            mine = hashlib.sha256(data).digest()
            if self.proven.get(key) == mine:
                return True
            held = self.dst.get(key)
        except FileNotFoundError:
            return False
        if hashlib.sha256(held).digest() == mine:
            self.proven[key] = mine
            return True
        for side, got in (("source", data), ("mirror", held)):
            try:
                decode_run_file(got, rf, run_id)
            except MisplacedFileError:
                return False  # whole, but another run's (a case twin's folder): a conflict
            except CorruptFileError as exc:
                raise CorruptFileError(key, f"the {side}'s file does not decode ({exc.reason}); "
                                            "nothing is overwritten, see `ckptfs verify`") from None
        return False

    def _retention(self, run_id: str, keep_last: int) -> int:
        store = CheckpointStore(storage=self.dst, policy=CompactionPolicy(
            background=False, keep_last=0, superseded_grace=self.superseded_grace))
        result = store.apply_retention(run_id, keep_last)
        return len(result.deleted)


def mirror(src_url: StorageLike, dst_url: StorageLike, every_n: int = 1,
           run_id: str | Iterable[str] | None = None, src_options: Mapping[str, Any] | None = None,
           dst_options: Mapping[str, Any] | None = None,
           latest: bool = False, keep_last: int | None = None, *, workers: int = DEFAULT_WORKERS,
           attempts: int = DEFAULT_ATTEMPTS, base_delay: float = 0.2,
           progress: Progress | None = None,
           listings: Mapping[str, Iterable[str]] | None = None,
           superseded_grace: float = DEFAULT_SUPERSEDED_GRACE) -> MirrorReport:
    """Copy each run's newest restore point from `src_url` to `dst_url` when it is due.

    A run is due once it advanced `every_n` versions past the mirror's newest point, or at
    all with `latest=True`. Artifacts (in parallel, `workers`), then the snapshot, then the
    records in chain order (the module's docstring says why), several runs at once, each
    upload retried on throttling/5xx (`attempts`) and verified. `keep_last` applies retention
    on the destination (newest N snapshots and what they need; a snapshot superseded less than
    `superseded_grace` seconds ago there stays, as a writer's does). Raises
    StorageUnavailableError if either end cannot be reached at the start; failures later
    leave the run `incomplete` in the report (nothing torn is visible), and a rerun resumes.

    `listings`: run id -> the keys listed under that run at the source, when the caller has
    just listed it (`ckptfs mirror --run R` checks R exists first; on S3 each listing is a
    round trip). A run planned again because a file vanished is listed afresh.
    """
    if every_n < 1:
        raise ConfigError(f"every_n must be >= 1, got {every_n}")
    if keep_last is not None and keep_last < 1:
        raise ConfigError(f"keep_last must be >= 1, got {keep_last}")
    m = Mirror(src_url, dst_url, src_options=src_options, dst_options=dst_options,
                workers=workers, attempts=attempts, base_delay=base_delay,
                superseded_grace=superseded_grace)
    try:
        m.check()
        with gc_paused():  # decoded bodies stay alive for the pass: collections would only churn
            return m.pass_(run_id, every_n, latest, keep_last, progress or NoProgress(), listings)
    finally:
        m.close()


