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
import importlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptfs.errors import ConfigError, RunNotFoundError, quote_value
from ckptfs.format import codec
from ckptfs.format.keys import (
    NAMESPACE_PLUGINS,
    RUNS,
    RunFile,
    artifact_key,
    blocked_run_dirs,
    classify,
    not_a_directory,
    parse_run_key,
    run_prefix,
)
from ckptfs.format.models import ArtifactRef, validate_id
from ckptfs.format.units import FOREIGN_DIGITS, foreign_digits
from ckptfs.maintenance.run_check import FileResult, RunAnalysis, check_file
from ckptfs.storage.base import Storage
from ckptfs.storage.redact import scrub_secrets
from ckptfs.storage.registry import list_keys, open_target
from ckptfs.store.pools import StorePool

logger = logging.getLogger(__name__)

# A temp file younger than this is taken for a write in flight (see _report_temp_files).
TEMP_GRACE = 600.0
# Passes over a run whose files vanish while verify reads them (_Checker.check_run).
VANISHED_RECHECKS = 5

LEVELS = ("structure", "data")
SEVERITIES = ("error", "warning", "info")
_CHUNK = 1024 * 1024
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
    """'K/N' -> (K, N), 1 <= K <= N; anything else is a ConfigError naming the text, cut short
    (`quote_value`: a 5,000-character value made a 5,000-character message). Digits past
    Python's int conversion limit are such a ConfigError too, not the bare ValueError of int().
    Digits are ASCII 0-9 only, as in a duration (`format.units`): `\\d` and int() took 3/10 written
    in full-width digits (U+FF13, U+FF11 U+FF10) as 3/10, a paste accident nobody types on purpose."""
    m = re.fullmatch(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*", text, re.ASCII)
    try:
        k, n = (int(m[1]), int(m[2])) if m else (0, 0)
    except ValueError:  # more digits than int() converts: no slice of anything
        k, n = 0, 0
    if not 1 <= k <= n:
        raise ConfigError(f"subset {quote_value(text)} is not K/N with 1 <= K <= N (e.g. 3/10)"
                          + (FOREIGN_DIGITS if foreign_digits(text) else ""))
    return k, n


def in_subset(hex_digest: str, k: int, n: int) -> bool:
    """Deterministic slice membership: a sha256 is already uniform, so its prefix decides."""
    return int(hex_digest[:16], 16) % n == k - 1


open_readonly_target = open_target  # the name prune and the CLI knew it by


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
        # independent reads whose results are gathered in order: at interpreter exit they run
        # in turn on the caller's thread, the same report (refused, verify could not read a file)
        self.pool = StorePool(max_workers=max(1, workers), thread_name_prefix="ckptfs-verify")
        self.refs: dict[str, tuple[ArtifactRef, str]] = {}  # sha -> (ref, first referencing key)
        self.done = 0
        self.total = 0

    def tick(self, n: int = 1, what: str = "") -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total, what)

    # ---------------------------------------------------------------- one run

    def read_run_file(self, run_id: str, rf: RunFile) -> FileResult:
        try:
            data = self.storage.get(rf.key)
        except FileNotFoundError:
            res = FileResult(rf)
            res.problems.append(("warning", "vanished",
                                 "listed, then gone before it was read (concurrent retention?)"))
            return res
        except Exception as exc:  # keep going: one unreadable file is one finding
            res = FileResult(rf)
            msg = scrub_secrets(f"cannot read: {type(exc).__name__}: {exc}", self.storage.options)
            res.problems.append(("error", "unreadable", msg))
            return res
        return check_file(data, rf, run_id, self.max_decoded)

    def check_run(self, run_id: str, rfs: list[RunFile]) -> None:
        """Check one run's files. A file listed and then gone before it was read is a live
        writer's retention at work, not damage: the run is listed and checked again (up to
        VANISHED_RECHECKS times), and only what is found on the last pass is reported.

        Reported at once, a verify beside a writer with keep_last=1 exited 1 in 3 of 10
        passes on a healthy store (1,122 "vanished" warnings in one; a hostile review), and
        the chain checks over the files that were left could name a gap retention made."""
        def read(rf: RunFile) -> FileResult:
            return self.read_run_file(run_id, rf)

        for attempt in range(VANISHED_RECHECKS):
            results = list(self.pool.map(read, rfs))
            self.tick(len(rfs), run_id)
            findings = RunAnalysis(run_id, results).run()
            vanished = any(code == "vanished" for r in results for _sev, code, _msg in r.problems)
            # A hole in the chain may be only the listing's: on S3 it takes a request per page
            # and per folder (delta/ before log/), so a mirror pass (or compaction) that wrote a
            # delta and then the records on it between two of them showed the records without
            # the delta. A listing that has changed since is looked at again.
            holes = any(f[1] == "missing" for f in findings)
            if attempt == VANISHED_RECHECKS - 1 or not (vanished or holes):
                break
            relisted = sorted(rf for key in self.storage.list(run_prefix(run_id))
                              if (rf := parse_run_key(key)) is not None)
            if not vanished and relisted == rfs:
                break  # the same files: the hole is really there
            logger.info("run %s: files %s while verify read them (a writer or a mirror pass at "
                        "work?); checking the run again", run_id,
                        "vanished" if vanished else "arrived")
            rfs = relisted
        rep = self.report
        rep.files += len(rfs)
        for r in results:
            rep.bytes_read += r.size
            for sev, code, msg in r.problems:
                rep.add(sev, code, msg, r.rf.key, run_id, r.rf.version)
            for sha, ref in r.refs.items():
                self.refs.setdefault(sha, (ref, r.rf.key))
        for sev, code, msg, key, version in findings:
            rep.add(sev, code, msg, key, run_id, version)

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


def _report_temp_files(storage: Storage, report: Report, keys: Iterable[str]) -> None:
    """A temp file is a leftover (warning) once older than TEMP_GRACE; a younger one is a write
    in flight (info). Every live writer on local disk makes them: a LangGraph saver's lease
    keeper or a Worker's heartbeat rewrites its lease through one every few seconds, so a
    nightly verify beside a running agent now and then found one and exited 1 on a healthy
    store. Only local disk writes through temp files: elsewhere (S3) one is a leftover at once,
    and so is one whose age the storage cannot tell."""
    now = time.time()
    local = storage.local_root() is not None
    for key in keys:
        if not local:
            report.add("warning", "temp-file", "temp file left by an interrupted write", key)
            continue
        try:
            age = now - storage.modified(key)
        except FileNotFoundError:
            continue  # renamed into place meanwhile: the write finished
        except (NotImplementedError, OSError):
            age = TEMP_GRACE
        if age < TEMP_GRACE:
            report.add("info", "temp-file-young", f"temp file of a write in flight ({age:.0f} s old; a "
                       f"leftover after {TEMP_GRACE / 60:.0f} minutes)", key)
        else:
            report.add("warning", "temp-file", "temp file left by an interrupted write", key)


def _verify(checker: _Checker, storage: Storage, report: Report, run_id: str | None) -> None:
    keys = list_keys(storage, f"{RUNS}/{run_id}/" if run_id is not None else "")
    if not keys:
        if run_id is not None:
            raise RunNotFoundError(f"run {run_id!r} not found in {storage.display_name}")
        report.empty = True
        report.add("info", "empty", "nothing is stored under this URL")
        return
    listing = classify(keys)
    _report_temp_files(storage, report, listing.temp)
    # a run folder that is no directory hides every version stored behind it from every load,
    # mirror and prune (each says so): an error, not a stray name
    blocked = set(blocked_run_dirs(keys))
    for key, why, rid in listing.strays:
        if key in blocked:
            report.add("error", "not-a-directory",
                       f"{not_a_directory([key])}: no command reads the versions stored there", key, rid)
        else:
            report.add("warning", "stray", why, key, rid)
    runs = listing.runs
    sub = checker.subset
    run_ids = sorted(runs)
    partial_runs = bool(sub and checker.subset_runs)
    if partial_runs and sub is not None:
        run_ids = [r for r in run_ids if in_subset(hashlib.sha256(r.encode()).hexdigest(), *sub)]
    whole_store = run_id is None and not partial_runs
    checker.total = sum(len(runs[r]) for r in run_ids)
    for rid in run_ids:
        report.runs += 1
        checker.check_run(rid, sorted(runs[rid]))
        if not storage.capabilities.remote:
            _directories_at_keys(storage, report, rid)
    _check_artifacts(checker, storage, report, listing.artifacts, whole_store)
    for root, ns_keys in sorted(listing.namespaces.items()):
        plugin = importlib.import_module(NAMESPACE_PLUGINS[root])
        found = plugin.check(storage, ns_keys, checker.level, checker.max_decoded)
        for severity, code, message, key in found:
            report.add(severity, code, message, key or None)


def _directories_at_keys(storage: Storage, report: Report, run_id: str) -> None:
    """A directory where a run file would be: no listing of keys shows it (an empty one holds
    none), yet the commit or compaction that creates that file is refused (KeyOccupiedError)
    until it is moved away, so a store that looked clean could take no more commits. On a
    remote store a "directory" is only keys under a prefix, which blocks nothing."""
    for kind in ("log", "delta", "snap"):
        for name in storage.list_dirs(f"{run_prefix(run_id)}{kind}/"):
            key = f"{run_prefix(run_id)}{kind}/{name}"
            rf = parse_run_key(key)
            if rf is not None:
                report.add("error", "dir-at-key", f"a directory is where the {kind} file of version "
                           f"{rf.version} goes: writing it is refused (KeyOccupiedError) until the "
                           "directory is moved out of the store", key, run_id, rf.version)


def _check_artifacts(checker: _Checker, storage: Storage, report: Report, listed: list[str],
                     whole_store: bool) -> None:
    present = set(listed)
    refs = checker.refs

    def exists(sha: str) -> bool:
        try:
            return storage.exists(artifact_key(sha))
        except Exception:
            return False

    # one run: existence by HEAD, only its references; the whole store: by the listing, and a
    # HEAD for what it lacks, since artifacts/ was listed before runs/ (a page each on S3): an
    # artifact and the record using it that landed in between (a mirror pass, a writer) were
    # reported "missing" on a healthy store
    shas = sorted(refs) if not whole_store else sorted(set(refs) - present)
    found = {s for s, ok in zip(shas, checker.pool.map(exists, shas), strict=True) if ok}
    present = found if not whole_store else present | found
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
