"""`verify` beside a writer of new files (a mirror pass): a listing is not a snapshot of the
store. On S3 it is a request per page of 1,000 keys, in key order, so `artifacts/` is listed
before `runs/`, and a run's `delta/` before its `log/`. A mirror pass that wrote an artifact and
the record using it, or a delta and the records built on it, between two of those requests
showed verify a record without what it needs: "artifact-missing" or "journal record ...
missing", exit 1, on a healthy mirror (found by a hostile review, 2026-12-07: 3 verifies in 6
during a pass over a 2,500-object mirror). Here the listing that missed a file is made exactly:
a storage whose first listing leaves out files that are there. What is really missing is still
reported, after one more look."""

from __future__ import annotations

from pathlib import Path

from test_mirror import POLICY, RUN, work

from ckptfs import CheckpointStore
from ckptfs.format.keys import parse_artifact_key, parse_run_key
from ckptfs.maintenance.verify import verify
from ckptfs.replication.mirror import mirror
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from tests._forwarding import Forwarding


class LateListing(Forwarding):
    """Its first listings leave out `hidden` (files written just after the listing's page)."""

    def __init__(self, inner: Storage, hidden: set[str], times: int = 1) -> None:
        super().__init__(inner)
        self.hidden, self.times, self.lists = hidden, times, 0

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        keys = self.inner.list(prefix, start_after)
        if prefix.startswith(("runs", "")) and any(k in self.hidden for k in keys):
            self.lists += 1
            if self.lists <= self.times:
                return [k for k in keys if k not in self.hidden]
        return keys


def _store(tmp_path: Path) -> tuple[str, list[str]]:
    """A mirror of a run (its point only: a snapshot, deltas without the records they cover,
    records), as a pass leaves it."""
    src, url = str(tmp_path / "src"), str(tmp_path / "store")
    with CheckpointStore(src, policy=POLICY, artifact_threshold=1024) as store:
        work(store, RUN, 40, stop_after=12)
    assert mirror(src, url, latest=True).ok
    keys = open_storage(url).list("")
    return url, keys


def _problems(report: object) -> list[tuple[str, str | None]]:
    return [(f.code, f.key) for f in report.problems]  # type: ignore[attr-defined]


def test_a_delta_the_listing_missed_is_found_by_a_second_look(tmp_path: Path) -> None:
    url, keys = _store(tmp_path)
    deltas = {k for k in keys if (rf := parse_run_key(k)) is not None and rf.kind == "delta"}
    assert deltas
    newest = max(deltas, key=lambda k: parse_run_key(k).version)  # type: ignore[union-attr]
    late = LateListing(open_storage(url), {newest})
    report = verify(late)
    assert report.ok, _problems(report)  # was: journal record v.. missing
    assert late.lists >= 2  # the run was listed again


def test_an_artifact_the_listing_missed_is_found_by_a_head(tmp_path: Path) -> None:
    url, keys = _store(tmp_path)
    arts = {k for k in keys if parse_artifact_key(k)}
    assert arts
    late = LateListing(open_storage(url), set(sorted(arts)[:2]), times=10)
    report = verify(late, level="data")
    assert report.ok, _problems(report)  # was: artifact-missing
    assert report.artifacts == len(arts) and report.artifacts_hashed == len(arts)


def test_what_is_really_missing_is_still_reported(tmp_path: Path) -> None:
    url, keys = _store(tmp_path)
    deltas = sorted(k for k in keys if (rf := parse_run_key(k)) is not None and rf.kind == "delta")
    arts = sorted(k for k in keys if parse_artifact_key(k))
    root = tmp_path / "store"
    (root / deltas[-1]).unlink()
    (root / arts[0]).unlink()
    storage = LateListing(open_storage(url), set())
    report = verify(storage)
    codes = {code for code, _key in _problems(report)}
    assert not report.ok and "artifact-missing" in codes and "missing" in codes, _problems(report)
