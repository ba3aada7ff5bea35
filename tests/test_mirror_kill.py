"""SIGKILL the mirror process at random points, 30+ times: the mirror never shows a torn state,
and `verify` of it after each kill finds nothing.

Each mirror pass is a real process (forked from a server that has ckptfs and s3fs imported,
so thirty of them fit in seconds) that writes to the moto server over HTTP; it is killed
after a random number of objects. After every kill the destination must load as a version
the source really had (or not at all yet), and a restore from it must give that version or
a clear error. At the end an uninterrupted pass converges on the source's newest version.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from _forkserver import context
from test_mirror import POLICY, state, work

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore
from ckptfs.maintenance.verify import verify
from ckptfs.replication.mirror import mirror
from ckptfs.replication.restore import restore

RUNS = ("run-a", "run-b")


class _Counter:
    def __init__(self, shared: Any) -> None:
        self.shared = shared

    def planned(self, objects: int, nbytes: int) -> None:
        return None

    def done(self, key: str, nbytes: int, skipped: bool) -> None:
        self.shared.value += 1


def _child(src: str, dst: str, opts: dict[str, Any], shared: Any) -> None:
    report = mirror(src, dst, every_n=1, dst_options=opts, keep_last=2, workers=4,
                    progress=_Counter(shared))
    raise SystemExit(0 if report.ok else 1)


def _check_destination(store: CheckpointStore, source: CheckpointStore,
                       complete: set[str]) -> dict[str, int]:
    """Every run in the mirror loads as a version the source had, and `verify` of the mirror
    finds nothing; returns run -> version.

    The snapshot a point starts from goes before its records, and they go in chain order, so
    a run's first file in the mirror already loads. (Records went in parallel and the snapshot
    last before 2026-12-07: a kill left records without their snapshot, a load failed with
    CheckpointCorruptError, and verify reported the holes between records as lost.)
    """
    report = verify(store.storage)
    assert report.ok, [f"{f.code}: {f.message}" for f in report.problems]
    seen = {}
    for run_id in RUNS:
        run = store.load_run(run_id)
        if run is None:
            continue
        complete.add(run_id)
        assert store.last_load is not None
        v = store.last_load.version
        assert run == source.load_run(run_id, version=v), f"{run_id} v{v} differs from the source"
        seen[run_id] = v
    return seen


def test_sigkill_mirror_thirty_times_never_torn_then_converges(
        tmp_path: Path, s3: EmbeddedS3, s3_url: str) -> None:
    opts = s3.storage_options
    src = str(tmp_path / "src")
    source = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    for run_id in RUNS:
        work(source, run_id, 140, stop_after=6)
    ctx = context()  # ckptfs.replication.mirror, s3fs and this module imported in the server
    rng = random.Random(20261130)
    kills = restores = 0
    complete: set[str] = set()
    t0 = time.monotonic()
    mirrored = CheckpointStore(s3_url, opts, policy=POLICY)  # one client for all the checks
    i = -1
    while kills < 32 and i < 60:  # until 32 kills landed mid-pass (some passes finish first)
        i += 1
        for run_id in RUNS:
            work(source, run_id, 140, stop_after=2)  # 4 new versions per run, some artifacts
        shared = ctx.Value("i", 0, lock=False)
        p = ctx.Process(target=_child, args=(src, s3_url, opts, shared))
        p.start()
        if i % 2:  # kill after a random number of finished objects ...
            target = rng.randint(0, 7)
            deadline = time.monotonic() + 20
            while p.is_alive() and shared.value < target and time.monotonic() < deadline:
                time.sleep(0.001)
        else:  # ... or at a random moment (start-up, listing, planning, uploading)
            p.join(timeout=rng.uniform(0.05, 0.45))
        if p.is_alive():
            p.kill()
            kills += 1
        p.join()
        _check_destination(mirrored, source, complete)
        if i % 6 == 5:
            dst = str(tmp_path / f"restore-{i}")
            rep = restore(s3_url, dst, src_options=opts)
            restores += 1
            for r in rep.runs:
                if r.ok:
                    got = CheckpointStore(dst).load_run(r.run_id)
                    assert got == source.load_run(r.run_id, version=r.version)
                else:
                    assert r.error and r.run_id not in complete  # a clear error, never torn
    assert kills >= 30, f"only {kills} kills landed mid-pass"
    final = mirror(src, s3_url, every_n=1, dst_options=opts, keep_last=2)
    assert final.ok, final.missing
    for run_id in RUNS:
        assert mirrored.load_run(run_id) == source.load_run(run_id)
    dst = str(tmp_path / "final")
    assert restore(s3_url, dst, src_options=opts).ok
    for run_id in RUNS:
        assert state(CheckpointStore(dst), run_id) == state(source, run_id)
    assert restores >= 5
    assert time.monotonic() - t0 < 120
