"""Fences on S3 go by the store's own now: the Date of the reply that dates the run's newest
journal record (`Storage.modified_and_now`, one HEAD), this machine's clock playing no part.

Retention took the store's now to be the lower of this machine's clock and the newest record's
time: safe against a machine running ahead, but a run idle since its last commit kept the records
of the `fence_seconds` before it for as long as it stayed idle, for good once it was finished (up
to ten minutes of journal objects below its oldest kept snapshot). Over real HTTP against the
embedded moto server; a proxy in front of it moves the store's clock (Last-Modified and Date), or
takes the Date out, and the installed `ckptfs` runs in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_cli_commands import cli
from test_retention_clock_ahead import (
    HOUR,
    RUN,
    loads_whole,
    machine_an_hour_ahead,
    run_versions,
    store_clock,
    through,
    write_steps,
)

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore, CompactionPolicy
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage
from ckptfs.storage.s3 import http_date

FENCE = 600.0  # the default, what `ckptfs prune` keeps
ROOT = str(Path(__file__).resolve().parents[1])
LOAD = "import json, sys\nfrom ckptfs import CheckpointStore\n" \
       "run = CheckpointStore(sys.argv[1], json.loads(sys.argv[2])).load_run(sys.argv[3])\n" \
       "print(-1 if run is None else run.completed_count)\n"


def _via(opts: dict[str, Any], endpoint: str) -> dict[str, Any]:
    return {**opts, "client_kwargs": {**opts["client_kwargs"], "endpoint_url": endpoint}}


def _retention(url: str, opts: dict[str, Any]) -> list[int]:
    """Retention of run "one" as `ckptfs prune --keep-last 1 --superseded-grace 0` does it;
    the snapshots it kept."""
    store = CheckpointStore(url, opts, policy=CompactionPolicy(
        keep_last=1, fence_seconds=FENCE, superseded_grace=0.0, background=False))
    try:
        return store.apply_retention(RUN, 1).kept_snapshots
    finally:
        store.close()


def test_http_date_reads_what_s3_sends_and_nothing_else() -> None:
    assert http_date("Mon, 07 Dec 2026 06:22:59 GMT") == 1796624579.0
    assert http_date("Mon, 07 Dec 2026 06:22:59 -0000") == 1796624579.0  # no zone: UTC
    assert http_date("Mon, 07 Dec 2026 07:22:59 +0100") == 1796624579.0
    for bad in (None, "", "yesterday", "Mon, 32 Dec 2026 06:22:59 GMT", 1796624579):
        assert http_date(bad) is None, bad


def test_s3_tells_an_objects_time_with_its_own_now(s3: EmbeddedS3, s3_url: str) -> None:
    """One HEAD gives LastModified and the server's Date; through a proxy whose store runs an
    hour ahead both come an hour later, so the now is the header's, not this machine's clock.
    RetryingStorage passes it on."""
    opts = s3.storage_options
    storage = open_storage(s3_url, opts)
    storage.put("k", b"x")
    written, now = storage.modified_and_now("k")
    assert written == storage.modified("k")
    assert now is not None and now >= written
    assert abs(now - time.time()) < 60  # moto shares this machine's clock
    retrying = RetryingStorage(storage).modified_and_now("k")
    assert retrying[0] == written and retrying[1] is not None and retrying[1] >= written
    with through(s3, store_clock(HOUR, 0)) as (proxy, _ep):
        ahead = open_storage(s3_url, _via(opts, proxy.endpoint))
        moved, moved_now = ahead.modified_and_now("k")
        assert proxy.counts["rewritten"] == 1
    assert moved == written + HOUR
    assert moved_now is not None and abs(moved_now - HOUR - time.time()) < 60


def test_cli_prune_retires_the_fences_of_an_idle_finished_run(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    """A finished run, then nothing written for 11 minutes by the store's clock (its Date
    moved on, the objects' times as they were): `ckptfs prune` removes every journal record
    below the kept snapshot. Before: it kept those of the last `fence_seconds` before the last
    commit, here all of them, and would have forever. The run still loads whole in a new
    process and verifies clean."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 12, fence=FENCE)
    logs, snaps = run_versions(s3_url, opts, "log"), run_versions(s3_url, opts, "snap")
    below = [v for v in logs if v <= snaps[-1]]
    assert len(snaps) > 1 and below, (logs, snaps)
    with through(s3, store_clock(0.0, 0, idle=FENCE + 60)) as (proxy, ep):
        code, out, err = cli("prune", s3_url, "--keep-last", "1", "--superseded-grace", "0",
                             "--run", RUN, "--json", "-o", ep, timeout=120)
        assert code == 0, err
        assert proxy.counts["rewritten"] > 0
    assert [r["kept_snapshots"] for r in json.loads(out)["runs"]] == [snaps[-1:]]
    assert run_versions(s3_url, opts, "snap") == snaps[-1:]
    assert run_versions(s3_url, opts, "log") == [v for v in logs if v > snaps[-1]]
    env = {**os.environ, "PYTHONPATH": ROOT}
    loaded = subprocess.run([sys.executable, "-c", LOAD, s3_url, json.dumps(opts), RUN],
                            env=env, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "12", loaded.stderr
    code, out, err = cli("verify", s3_url, "--json", "-o", f"client_kwargs.endpoint_url={s3.endpoint}",
                         timeout=120)
    assert code == 0 and json.loads(out)["ok"], (out, err)


def test_a_machine_an_hour_ahead_keeps_fences_the_store_calls_young(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine an hour ahead; the store idle 5 minutes since the run's last commit, its
    first records written 400 s before the rest. By the store's Date the first are 700 s old
    and go, the others 300 s and stay, though an hour old by ours. Before: the store's now was
    the newest record's time, the first records 400 s old, and every one stayed."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 8, fence=FENCE)
    logs, snaps = run_versions(s3_url, opts, "log"), run_versions(s3_url, opts, "snap")
    old = [v for v in logs if v <= 3]
    young = [v for v in logs if 3 < v <= snaps[-1]]
    assert old and young, (logs, snaps)
    machine_an_hour_ahead(monkeypatch)
    with through(s3, store_clock(0.0, old[-1], old_by=400.0, idle=300.0)) as (proxy, _ep):
        assert _retention(s3_url, _via(opts, proxy.endpoint)) == snaps[-1:]
        assert proxy.counts["rewritten"] > 0
    left = run_versions(s3_url, opts, "log")
    assert not set(old) & set(left), left
    assert set(young) <= set(left), (young, left)
    loads_whole(s3_url, opts, 8)


def test_a_store_that_sends_no_date_bounds_its_now_by_the_newest_record(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replies without a Date: S3 says no now (None), and retention takes the lower of this
    machine's clock and the newest record's time. With this machine an hour ahead, records the
    store wrote an hour before the newest go, the young ones stay (this machine's clock would
    have removed them)."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 8, fence=FENCE)
    logs, snaps = run_versions(s3_url, opts, "log"), run_versions(s3_url, opts, "snap")
    old = [v for v in logs if v <= 3]
    young = [v for v in logs if 3 < v <= snaps[-1]]
    assert old and young, (logs, snaps)
    machine_an_hour_ahead(monkeypatch)
    with through(s3, store_clock(0.0, old[-1], idle=None)) as (proxy, _ep):
        via = _via(opts, proxy.endpoint)
        newest = f"runs/{RUN}/log/{logs[-1]:012d}.ckpt"
        assert open_storage(s3_url, via).modified_and_now(newest) == (
            open_storage(s3_url, opts).modified(newest), None)
        assert _retention(s3_url, via) == snaps[-1:]
        assert proxy.counts["rewritten"] > 0
    left = run_versions(s3_url, opts, "log")
    assert not set(old) & set(left), left
    assert set(young) <= set(left), (young, left)
    loads_whole(s3_url, opts, 8)
