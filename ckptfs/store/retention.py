"""Retention: keep the newest N valid snapshots of a run and what they need; delete the rest.

Deletion mirrors the write order in reverse (restic's rule): snapshots first, then deltas,
then journal records, so a crash midway leaves every kept snapshot loadable. Nothing is
deleted unless N snapshots validate, so the newest valid one always stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptfs.errors import ConfigError, CorruptFileError
from ckptfs.format import codec
from ckptfs.store.loader import RunLoader


@dataclass(frozen=True)
class RetentionResult:
    run_id: str
    kept_snapshots: list[int]
    deleted: list[str]
    dry_run: bool


def apply_retention(loader: RunLoader, run_id: str, keep: int, dry_run: bool = False,
                    check: str = "full") -> RetentionResult:
    """Keep the newest `keep` valid snapshots of `run_id` and what they need.

    check="full" decodes each kept snapshot with the reader; "digest" (the background
    compactor, which wrote them) only re-hashes the file against its trailer, which costs no
    JSON parsing and does not hold the GIL, keeping the commit path's latency tail short.
    """
    if keep < 1:
        raise ConfigError("retention must keep at least one snapshot (keep_last >= 1)")
    files = loader.run_files(run_id)
    snaps = sorted((f for f in files if f.kind == "snap"), reverse=True)
    valid: list[int] = []
    for rf in snaps:
        try:
            data = loader.get_run_file(rf.key)
            if check == "digest":
                codec.verify_digest(data, rf.key)
            else:
                loader.decode(rf, data, run_id)
        except (CorruptFileError, FileNotFoundError):
            continue
        valid.append(rf.version)
        if len(valid) == keep:
            break
    if len(valid) < keep:
        return RetentionResult(run_id, valid, [], dry_run)
    oldest = valid[-1]
    doomed = ([f for f in snaps if f.version < oldest]
              + [f for f in files if f.kind == "delta" and f.base < oldest]
              + [f for f in files if f.kind == "log" and f.version <= oldest])
    if not dry_run:
        for f in doomed:
            loader.storage.delete(f.key)
    return RetentionResult(run_id, valid, [f.key for f in doomed], dry_run)
