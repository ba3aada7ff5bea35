"""`ckptfs prune`: snapshot retention for every run, then garbage collection of artifacts.

Retention itself is `CheckpointStore.apply_retention` (keep the newest N valid snapshots
and what they need, never the newest valid one); this module only orchestrates it and
adds what retention cannot know about alone: which artifacts no remaining record
references. Those are deleted only when older than a grace period, because a writer
stores an artifact before the record that points at it (restic's order), so a young
unreferenced artifact may be one whose record is still being written. A writer that
re-references old bytes (deduplication) touches them first (`artifacts.TOUCH_AFTER`), and
each candidate's age is read again right before its delete, so such bytes count as young.

Artifact collection is refused outright when any remaining run file cannot be decoded:
its references are unknowable, and deleting what it might point at could make a
repairable store worse. So it is when a run's files keep vanishing between its listing and
their reads (a live writer's retention outrunning prune): an artifact goes only once every
file of one listing of each run was read (`_run_refs`). The same holds for a run folder
(`log/`, `delta/`, `snap/`) that is no directory (a symlink, never followed, or a file): its
run's retention removes nothing, as what it holds is unknown, and nothing is collected.

A delete that fails (a run folder this user may not write, an object a bucket policy protects)
stops that run's retention only: prune is a nightly job, and one run it cannot touch must not
keep every other run growing. The run is reported with the reason and what went before the
failure; deletion order (snapshots, then deltas, then journal records) leaves the newest valid
snapshot and everything a load from it reads, so the run loads as before.

A snapshot superseded less than `superseded_grace` ago stays, with what a load from it reads
(store/retention.py): prune runs beside live writers and readers, and a reader that listed the
run a moment before must still find its files. 0 removes them at once, for a store nobody
reads; the report says how many stayed for the grace, so a prune that left more than
--keep-last is explained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ckptfs.errors import (
    ConfigError,
    CorruptFileError,
    RunNotFoundError,
    StorageUnavailableError,
    StoreNotWritableError,
)
from ckptfs.format.keys import (
    ARTIFACTS,
    RUNS,
    RunFile,
    artifact_key,
    blocked_run_dirs,
    classify,
    not_a_directory,
    parse_artifact_key,
    run_dirs,
    run_prefix,
)
from ckptfs.format.models import ArtifactRef, validate_id
from ckptfs.format.reader import collect_refs, decode_run_file
from ckptfs.format.units import parse_duration as parse_duration
from ckptfs.format.units import require_whole, seconds_value
from ckptfs.maintenance.verify import VANISHED_RECHECKS
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import list_keys, open_target
from ckptfs.store.checkpoint_store import CheckpointStore
from ckptfs.store.compactor import DEFAULT_SUPERSEDED_GRACE, CompactionPolicy
from ckptfs.store.retention import RetentionResult

logger = logging.getLogger(__name__)

DEFAULT_ARTIFACT_GRACE = 24 * 3600.0


@dataclass
class PruneFailure:
    """A delete that failed: the run (None: artifact collection), why, and how far it got.

    `code` is the CLI's error code for the cause (not-writable, unreachable, io-error), so a
    store nothing could be deleted from at all is reported as the one error it is."""

    run_id: str | None
    code: str
    reason: str
    deleted: list[str] = field(default_factory=list)
    not_deleted: list[str] = field(default_factory=list)


def _failure_code(exc: OSError) -> str:
    if isinstance(exc, StoreNotWritableError):
        return "not-writable"
    return "unreachable" if isinstance(exc, StorageUnavailableError) else "io-error"


@dataclass
class PruneReport:
    """What prune removed (or, with dry_run, would remove), and why anything was left."""

    url: str
    keep_last: int
    dry_run: bool
    artifact_grace: float
    superseded_grace: float = DEFAULT_SUPERSEDED_GRACE
    runs: list[RetentionResult] = field(default_factory=list)
    artifacts_deleted: list[str] = field(default_factory=list)
    artifacts_young: list[str] = field(default_factory=list)
    artifacts_referenced: int = 0
    artifact_gc: str = "not run"
    problems: list[str] = field(default_factory=list)
    failed: list[PruneFailure] = field(default_factory=list)

    @property
    def deleted(self) -> list[str]:
        return [k for r in self.runs for k in r.deleted] + self.artifacts_deleted

    @property
    def graced(self) -> int:
        """Superseded snapshots kept only for the grace, over every run."""
        return sum(len(r.graced) for r in self.runs)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "keep_last": self.keep_last, "dry_run": self.dry_run,
            "artifact_grace_seconds": self.artifact_grace,
            "superseded_grace_seconds": self.superseded_grace, "ok": self.ok,
            "runs": [asdict(r) for r in self.runs],
            "artifacts": {"deleted": self.artifacts_deleted, "young_unreferenced": self.artifacts_young,
                          "referenced": self.artifacts_referenced, "gc": self.artifact_gc},
            "failed": [{"run": f.run_id, "code": f.code, "reason": f.reason, "deleted": f.deleted,
                        "not_deleted": f.not_deleted} for f in self.failed],
            "problems": self.problems,
        }


def prune(
    url: str | Storage,
    keep_last: int,
    run_id: str | None = None,
    *,
    dry_run: bool = False,
    artifact_grace: float = DEFAULT_ARTIFACT_GRACE,
    superseded_grace: float = DEFAULT_SUPERSEDED_GRACE,
    storage_options: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> PruneReport:
    """Apply retention (keep the newest `keep_last` valid snapshots per run), then collect artifacts.

    With `run_id`, only that run's retention runs and artifacts are left alone (collection
    needs every run's references). An empty policy (keep_last < 1) is a ConfigError. A snapshot
    superseded less than `superseded_grace` seconds ago stays (module docstring).
    """
    keep_last = require_whole("prune", "keep_last", keep_last)  # True is no count of 1
    if keep_last < 1:
        raise ConfigError("refusing an empty retention policy: keep_last must be >= 1")
    # Finite, as `--artifact-grace` is: inf would mean "never collect", but the report's JSON
    # would then hold `Infinity`, which is no JSON; a run_id prune already collects nothing.
    artifact_grace = seconds_value("prune", "artifact_grace", artifact_grace)
    superseded_grace = seconds_value("prune", "superseded_grace", superseded_grace)
    if run_id is not None:
        validate_id(run_id, "run id")
    storage = open_target(url, storage_options)
    report = PruneReport(storage.display_url, keep_last, dry_run, artifact_grace, superseded_grace)
    # One listing, read the way every command reads it: a bad URL is an error, not "nothing to
    # do"; an entry that is not ours (runs/.snapshot, an over-long name) is reported and skipped.
    keys = list_keys(storage, f"{RUNS}/" if run_id is None else f"{RUNS}/{run_id}/")
    listing = classify(keys)
    if run_id is None:
        _ids, odd = run_dirs(storage.list_dirs(RUNS))
        report.problems += [f"skipped {key}: {why}" for key, why in odd]
    store = CheckpointStore(storage=storage, policy=CompactionPolicy(
        keep_last=keep_last, background=False, superseded_grace=superseded_grace))
    run_ids = sorted(listing.runs)
    # A run none of whose files is listed, only folders that are no directory: not pruned
    # (it has nothing to prune that can be seen), and said, since what they hold is unknown.
    unseen = [k for k in blocked_run_dirs(keys) if k.split("/")[1] not in listing.runs]
    if run_id is not None and not run_ids:
        note = f"; {not_a_directory(unseen)}, so no version of it can be read" if unseen else ""
        raise RunNotFoundError(f"run {run_id!r} not found in {storage.display_name}{note}")
    report.problems += [f"{not_a_directory([k])}: no version of run {k.split('/')[1]!r} can be read; "
                        "it is not pruned" for k in unseen]
    for rid in run_ids:
        # planned first, deleted here: a failed delete then still says what went and what not
        result = store.apply_retention(rid, keep_last, dry_run=True)
        if not dry_run and result.deleted:
            result = _delete_run_files(storage, report, result)
        if result.unread:
            report.problems += [f"{why}; run {rid!r} is not pruned: nothing of it is removed"
                                for why in result.unread]
        elif len(result.kept_snapshots) < keep_last:
            logger.info("run %s: %d valid snapshot(s), fewer than %d: nothing removed", rid,
                        len(result.kept_snapshots), keep_last)
        report.runs.append(result)
    if run_id is None:
        _collect_artifacts(storage, report, now if now is not None else time.time())
    else:
        report.artifact_gc = "skipped: --run given (collection needs every run's references)"
    return report


def _delete_run_files(storage: Storage, report: PruneReport, plan: RetentionResult) -> RetentionResult:
    """Delete what retention planned for one run, in its order; on a failure, record it and
    return what was really deleted (a listing tells), so the rest of prune goes on."""
    try:
        storage.delete_many(plan.deleted)
    except OSError as exc:  # StoreNotWritableError and StorageUnavailableError are OSErrors
        left = set(list_keys(storage, run_prefix(plan.run_id)))  # a dead store raises here
        gone = [k for k in plan.deleted if k not in left]
        failure = PruneFailure(plan.run_id, _failure_code(exc), str(exc), gone,
                               [k for k in plan.deleted if k in left])
        report.failed.append(failure)
        done = (f"{len(gone)} of its {len(plan.deleted)} file(s) to remove went first, "
                f"{len(failure.not_deleted)} stay" if gone else "nothing of it was removed")
        report.problems.append(
            f"run {plan.run_id!r} not pruned: {failure.reason}; {done} (older snapshots go first, "
            "so it loads as before; a later prune removes the rest once it can)")
        logger.debug("run %s: delete failed", plan.run_id, exc_info=True)
        return replace(plan, deleted=gone, dry_run=False)
    return replace(plan, dry_run=False)


def _referenced(storage: Storage, doomed: set[str], seen: set[str]
                ) -> tuple[set[str], list[str], list[str]]:
    """Every artifact sha referenced by a run file that stays, the files that could not be read,
    and the runs whose files kept vanishing while they were read (`_run_refs`)."""
    refs: dict[str, ArtifactRef] = {}
    keys = list_keys(storage, f"{RUNS}/")
    # a folder that is no directory holds (or leads to) files no listing shows: their
    # references are as unknown as those of a file that cannot be decoded
    unreadable = [not_a_directory([k]) for k in blocked_run_dirs(keys)]
    changing: list[str] = []
    listing = classify(keys)
    for rid, files in listing.runs.items():
        bad, settled = _run_refs(storage, rid, files, doomed, seen, refs)
        unreadable += bad
        if not settled:
            changing.append(rid)
    return set(refs), unreadable, changing


def _run_refs(storage: Storage, run_id: str, files: list[RunFile], doomed: set[str], seen: set[str],
              refs: dict[str, ArtifactRef]) -> tuple[list[str], bool]:
    """Add the references of one run's files to `refs`: what could not be read, and whether
    one listing of the run was read whole.

    A file listed and then gone before its read is a live writer's retention: the snapshot it
    just superseded, with the journal records under the new one. A snapshot holds every
    reference of its state while journal records hold only changes, so skipping the gone file
    lost the references only it held, and prune deleted artifacts the run still loads (beside a
    writer with keep_last=1: every version unloadable, in 4 of 4 tries). So the run is listed
    again and its new files read (the superseding snapshot among them: a writer stores it before
    it deletes the old one) until one listing is read with nothing gone. A listing shows every
    key written before it began (local disk; S3 since its 2020 strong consistency), so that pass
    read the newest start of the run and every record after it. A run still changing after
    VANISHED_RECHECKS listings is reason not to collect at all, never a file skipped.
    """
    unreadable: list[str] = []
    for _attempt in range(VANISHED_RECHECKS):
        vanished = 0
        for rf in files:
            if rf.key in doomed or rf.key in seen:
                continue
            try:
                rec = decode_run_file(storage.get(rf.key), rf, run_id)
            except FileNotFoundError:
                vanished += 1  # not seen: should a listing show it again, it is read again
                continue
            except (CorruptFileError, OSError) as exc:
                seen.add(rf.key)
                unreadable.append(f"{rf.key}: {getattr(exc, 'reason', exc)}")
                continue
            seen.add(rf.key)
            collect_refs(rec.body, refs)
        if not vanished:
            return unreadable, True
        logger.info("run %s: %d file(s) vanished while prune read them (a writer's retention?); "
                    "listing the run again", run_id, vanished)
        keys = list_keys(storage, run_prefix(run_id))
        blocked = blocked_run_dirs(keys)
        if blocked:
            return [*unreadable, not_a_directory(blocked)], True
        files = classify(keys).runs.get(run_id, [])
    return unreadable, False


def _skip_changing(report: PruneReport, changing: list[str]) -> None:
    """Collection refused: runs whose files vanished on every listing have unknown references."""
    report.artifact_gc = (f"skipped: the files of {len(changing)} run(s) kept vanishing while prune "
                          f"read them ({VANISHED_RECHECKS} listings each; a writer's retention?), so "
                          f"their references are unknown; a later prune collects (first: "
                          f"{changing[0]!r})")
    report.problems.append(report.artifact_gc)


def _collect_artifacts(storage: Storage, report: PruneReport, now: float) -> None:
    skew = now - time.time()  # `now` may be a caller's clock; the re-check below keeps to it
    doomed = {k for r in report.runs for k in r.deleted}
    seen: set[str] = set()
    refs, unreadable, changing = _referenced(storage, doomed, seen)
    if unreadable:
        report.artifact_gc = (f"skipped: {len(unreadable)} run file(s) or folder(s) cannot be read, so their "
                              f"references are unknown; run `ckptfs verify` (first: {unreadable[0]})")
        report.problems.append(report.artifact_gc)
        return
    if changing:
        _skip_changing(report, changing)
        return
    candidates: list[str] = []
    young: list[str] = []
    referenced = 0
    for key in list_keys(storage, f"{ARTIFACTS}/"):
        sha = parse_artifact_key(key)
        if sha is None:
            continue
        if sha in refs:
            referenced += 1
            continue
        try:
            age = now - storage.modified(key)
        except FileNotFoundError:
            continue
        except NotImplementedError:
            report.artifact_gc = "skipped: this backend cannot tell artifact ages"
            report.problems.append(report.artifact_gc)
            return
        (candidates if age > report.artifact_grace else young).append(key)
    report.artifacts_referenced = referenced
    report.artifacts_young = young
    # A writer may have committed since the first scan: read only the new run files again,
    # so the window in which a just-written reference can be missed stays short.
    late, unreadable, changing = _referenced(storage, doomed, seen)
    if unreadable:
        report.artifact_gc = f"skipped: a new run file cannot be read ({unreadable[0]})"
        report.problems.append(report.artifact_gc)
        return
    if changing:
        _skip_changing(report, changing)
        return
    for key in candidates:
        sha = parse_artifact_key(key)
        if sha is None or sha in late:
            continue
        try:  # a writer re-referencing these bytes since the listing has touched them
            if time.time() + skew - storage.modified(key) <= report.artifact_grace:
                young.append(key)
                continue
        except FileNotFoundError:
            continue
        if not report.dry_run:
            try:
                storage.delete(artifact_key(sha))
            except OSError as exc:  # the rest would fail alike: stop, say why, keep what was done
                report.failed.append(PruneFailure(None, _failure_code(exc), str(exc),
                                                  list(report.artifacts_deleted),
                                                  candidates[candidates.index(key):]))
                report.artifact_gc = f"stopped: {exc}"
                report.problems.append(f"artifact collection stopped after {len(report.artifacts_deleted)} "
                                       f"deleted: {exc}")
                return
        report.artifacts_deleted.append(key)
    report.artifact_gc = "done"
