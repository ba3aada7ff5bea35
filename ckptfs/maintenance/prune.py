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
repairable store worse.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptfs.errors import ConfigError, CorruptFileError
from ckptfs.format import codec
from ckptfs.format.keys import ARTIFACTS, RUNS, artifact_key, parse_artifact_key, parse_run_key
from ckptfs.format.models import validate_id
from ckptfs.maintenance.verify import body_refs, list_keys, open_readonly_target
from ckptfs.storage.base import TEMP_MARKER, Storage
from ckptfs.store.checkpoint_store import CheckpointStore, CompactionPolicy, RetentionResult

logger = logging.getLogger(__name__)

DEFAULT_ARTIFACT_GRACE = 24 * 3600.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """'90s', '15m', '24h', '7d', '2w' or plain seconds -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"duration {text!r} is not a number with an optional unit s/m/h/d/w (e.g. 24h)")
    return float(m[1]) * _UNITS[m[2]]


@dataclass
class PruneReport:
    """What prune removed (or, with dry_run, would remove), and why anything was left."""

    url: str
    keep_last: int
    dry_run: bool
    artifact_grace: float
    runs: list[RetentionResult] = field(default_factory=list)
    artifacts_deleted: list[str] = field(default_factory=list)
    artifacts_young: list[str] = field(default_factory=list)
    artifacts_referenced: int = 0
    artifact_gc: str = "not run"
    problems: list[str] = field(default_factory=list)

    @property
    def deleted(self) -> list[str]:
        return [k for r in self.runs for k in r.deleted] + self.artifacts_deleted

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "keep_last": self.keep_last, "dry_run": self.dry_run,
            "artifact_grace_seconds": self.artifact_grace, "ok": self.ok,
            "runs": [asdict(r) for r in self.runs],
            "artifacts": {"deleted": self.artifacts_deleted, "young_unreferenced": self.artifacts_young,
                          "referenced": self.artifacts_referenced, "gc": self.artifact_gc},
            "problems": self.problems,
        }


def prune(
    url: str | Storage,
    keep_last: int,
    run_id: str | None = None,
    *,
    dry_run: bool = False,
    artifact_grace: float = DEFAULT_ARTIFACT_GRACE,
    storage_options: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> PruneReport:
    """Apply retention (keep the newest `keep_last` valid snapshots per run), then collect artifacts.

    With `run_id`, only that run's retention runs and artifacts are left alone (collection
    needs every run's references). An empty policy (keep_last < 1) is a ConfigError.
    """
    if not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError("refusing an empty retention policy: keep_last must be >= 1")
    if artifact_grace < 0:
        raise ConfigError("artifact grace period must not be negative")
    if run_id is not None:
        validate_id(run_id, "run id")
    storage = open_readonly_target(url, storage_options)
    report = PruneReport(storage.display_url, keep_last, dry_run, artifact_grace)
    list_keys(storage, f"{RUNS}/")  # reach the store now: a bad URL is an error, not "nothing to do"
    store = CheckpointStore(storage=storage, policy=CompactionPolicy(keep_last=keep_last, background=False))
    run_ids = store.list_runs() if run_id is None else [run_id]
    if run_id is not None and not list_keys(storage, f"{RUNS}/{run_id}/"):
        raise ConfigError(f"run {run_id!r} not found in {storage.display_url}")
    for rid in run_ids:
        try:
            validate_id(rid, "run id")
        except ConfigError as exc:
            report.problems.append(f"skipped run directory: {exc}")
            continue
        result = store.apply_retention(rid, keep_last, dry_run=dry_run)
        if len(result.kept_snapshots) < keep_last:
            logger.info("run %s: %d valid snapshot(s), fewer than %d: nothing removed", rid,
                        len(result.kept_snapshots), keep_last)
        report.runs.append(result)
    if run_id is None:
        _collect_artifacts(storage, report, now if now is not None else time.time())
    else:
        report.artifact_gc = "skipped: --run given (collection needs every run's references)"
    return report


def _referenced(storage: Storage, doomed: set[str], seen: set[str]) -> tuple[set[str], list[str]]:
    """Every artifact sha referenced by a run file that stays, and the files that could not be read."""
    refs: set[str] = set()
    unreadable: list[str] = []
    for key in list_keys(storage, f"{RUNS}/"):
        if key in doomed or key in seen or TEMP_MARKER in key or parse_run_key(key) is None:
            continue
        seen.add(key)
        try:
            rec = codec.decode(storage.get(key), key)
        except FileNotFoundError:
            continue
        except CorruptFileError as exc:
            unreadable.append(f"{key}: {exc.reason}")
            continue
        found, bad = body_refs(rec.body)
        if bad:
            unreadable.append(f"{key}: {bad[0]}")
        refs.update(found)
    return refs, unreadable


def _collect_artifacts(storage: Storage, report: PruneReport, now: float) -> None:
    skew = now - time.time()  # `now` may be a caller's clock; the re-check below keeps to it
    doomed = {k for r in report.runs for k in r.deleted}
    seen: set[str] = set()
    refs, unreadable = _referenced(storage, doomed, seen)
    if unreadable:
        report.artifact_gc = (f"skipped: {len(unreadable)} run file(s) cannot be read, so their "
                              f"references are unknown; run `ckptfs verify` (first: {unreadable[0]})")
        report.problems.append(report.artifact_gc)
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
    late, unreadable = _referenced(storage, doomed, seen)
    if unreadable:
        report.artifact_gc = f"skipped: a new run file cannot be read ({unreadable[0]})"
        report.problems.append(report.artifact_gc)
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
            storage.delete(artifact_key(sha))
        report.artifacts_deleted.append(key)
    report.artifact_gc = "done"
