"""Retention by listing (`ckptfs prune`, `CheckpointStore.apply_retention`) on S3 keeps journal
records as fences for `fence_seconds` by the store's clock, whatever this machine's says.

A commit is one conditional PUT of the next journal key, and a stale writer's PUT fails only
while that key is taken: a record removed before its fence time is up lets such a writer
overwrite history. Retention compared the store's times of the records with this machine's
clock alone, so a machine running an hour ahead took every record for an hour old and removed
the young ones too. The store's "now" is now the one the store tells (S3's Date header, in the
reply that dates the run's newest journal record), else bounded by that record's time (the store
wrote it, so its clock has passed that time): a record goes once the store says it was written
`fence_seconds` before that. Over real HTTP against the embedded moto server; the machine's
clock is patched in the library, and the installed executable meets a store whose clock runs
behind it (a proxy moving every Last-Modified and Date), the same skew seen from the store.
The helpers are shared with tests/test_store_clock.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _fault_proxy import Fault, FaultProxy, Headers, Request, dates_moved
from test_cli_commands import cli

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.format.keys import parse_run_key
from ckptfs.maintenance.prune import prune
from ckptfs.storage.registry import open_storage

HOUR = 3600.0
FENCE = 3.0  # S3 times are whole seconds: a margin of two over their rounding
RUN = "one"
_LOG_KEY = re.compile(r"/runs/one/log/(\d{12})\.ckpt$")


def _writer_policy(fence: float) -> CompactionPolicy:
    # a snapshot every few records; the writer retires nothing itself (keep_last=0), so every
    # journal record is there for the retention under test to judge
    return CompactionPolicy(fanout=2, max_plan=2, min_snapshot_bytes=1, keep_last=0,
                            fence_seconds=fence, superseded_grace=0.0, background=False)


def write_steps(url: str, opts: dict[str, Any], steps: int, fence: float) -> None:
    """Load (or start) run "one" and complete `steps` more steps, one commit each."""
    store = CheckpointStore(url, opts, policy=_writer_policy(fence))
    run = store.load_run(RUN)
    if run is None:
        run = AgentRun(run_id=RUN, goal="keep the fences")
        store.save_run(run)
    for _ in range(steps):
        sid = f"s{len(run.steps)}"
        run.add_step(Step(id=sid, title=sid))
        step = run.steps[sid]
        step.status, step.result = StepStatus.COMPLETED, f"result of {sid}"
        store.commit(run, [step])
    store.close()


def run_versions(url: str, opts: dict[str, Any], kind: str) -> list[int]:
    listed = (parse_run_key(k) for k in open_storage(url, opts).list(f"runs/{RUN}/"))
    return sorted(rf.version for rf in listed if rf is not None and rf.kind == kind)


def _wait_past_fence(s3: EmbeddedS3, url: str, opts: dict[str, Any]) -> None:
    """Until the store's clock is more than FENCE + 1 s past the newest journal record's time
    (read from a probe object the server dates, under another prefix)."""
    newest = open_storage(url, opts).modified(
        f"runs/{RUN}/log/{run_versions(url, opts, 'log')[-1]:012d}.ckpt")
    probe = open_storage(s3.url("clock-probe"), opts)
    while True:
        probe.put("now", b"x")
        if probe.modified("now") - newest > FENCE + 1:
            return
        time.sleep(0.25)


def loads_whole(url: str, opts: dict[str, Any], steps: int) -> None:
    run = CheckpointStore(url, opts, policy=_writer_policy(FENCE)).load_run(RUN)
    assert run is not None and run.completed_count == steps


def machine_an_hour_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's clock, as retention reads it, an hour ahead of the store's."""
    ahead = types.SimpleNamespace(time=lambda: time.time() + HOUR, monotonic=time.monotonic)
    monkeypatch.setattr("ckptfs.store.retention.time", ahead)


# ------------------------------------------------------------------------------ library


def test_prune_keeps_fences_the_store_wrote_moments_ago(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`prune` (fence_seconds 600) right after the writes: every journal record is seconds old
    by the store's clock, an hour by ours. Before: each one up to the kept snapshot was
    removed. Now they all stay, and prune still removes the superseded snapshots."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 8, fence=600.0)
    logs, snaps = run_versions(s3_url, opts, "log"), run_versions(s3_url, opts, "snap")
    assert len(snaps) > 1 and [v for v in logs if v <= snaps[-1]], (logs, snaps)
    machine_an_hour_ahead(monkeypatch)
    report = prune(s3_url, 1, storage_options=opts, superseded_grace=0.0)
    assert report.ok, report.problems
    assert run_versions(s3_url, opts, "snap") == snaps[-1:]  # prune did run
    assert run_versions(s3_url, opts, "log") == logs
    loads_whole(s3_url, opts, 8)


def test_apply_retention_removes_only_what_the_store_says_is_past_the_fence(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records written FENCE + 1 s before the newest by the store's clock go; those written
    since stay as fences, though this machine's clock, an hour ahead, calls them an hour old.
    Before: every record up to the kept snapshot was removed."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 4, fence=FENCE)
    old = run_versions(s3_url, opts, "log")
    _wait_past_fence(s3, s3_url, opts)
    write_steps(s3_url, opts, 4, fence=FENCE)
    newest_snap = run_versions(s3_url, opts, "snap")[-1]
    young = [v for v in run_versions(s3_url, opts, "log") if old[-1] < v <= newest_snap]
    assert young, "no young record below the kept snapshot: nothing to keep as a fence"
    machine_an_hour_ahead(monkeypatch)
    store = CheckpointStore(s3_url, opts, policy=CompactionPolicy(
        keep_last=1, fence_seconds=FENCE, superseded_grace=0.0, background=False))
    result = store.apply_retention(RUN, 1)
    store.close()
    logs = run_versions(s3_url, opts, "log")
    assert result.kept_snapshots == [newest_snap]
    assert not set(old) & set(logs), logs  # past the fence by the store's clock: gone
    assert set(young) <= set(logs), (young, logs)  # an hour old by ours, seconds by the store's
    loads_whole(s3_url, opts, 8)


def test_a_fencing_store_that_cannot_tell_times_keeps_its_fences(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 as a store without modified times: whether a record's fence time is up is unknown,
    so it stays. Before: NotImplementedError out of apply_retention, nothing pruned."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 8, fence=600.0)
    logs, snaps = run_versions(s3_url, opts, "log"), run_versions(s3_url, opts, "snap")
    store = CheckpointStore(s3_url, opts, policy=CompactionPolicy(
        keep_last=1, superseded_grace=0.0, background=False))

    def no_times(_self: object, key: str) -> float:
        raise NotImplementedError("this store cannot tell modification times")

    monkeypatch.setattr(type(store.storage), "modified", no_times)
    monkeypatch.setattr(type(store.storage), "modified_and_now", no_times)
    result = store.apply_retention(RUN, 1)
    store.close()
    assert result.kept_snapshots == snaps[-1:]
    assert run_versions(s3_url, opts, "snap") == snaps[-1:]  # the snapshots below went
    assert run_versions(s3_url, opts, "log") == logs


# ---------------------------------------------------------------------------------- CLI


def store_clock(offset: float, old_upto: int, *, old_by: float = HOUR,
                idle: float | None = 0.0) -> Callable[[Request], Fault]:
    """A store whose clock is `offset` seconds off this machine's and whose journal records up
    to `old_upto` were written `old_by` seconds before the rest (each Last-Modified moved so),
    its now (each Date) `idle` seconds past that clock: as if nothing was written for so long.
    `idle=None`: replies without a Date."""

    def rule(req: Request) -> Fault:
        m = _LOG_KEY.search(req.path.split("?", 1)[0])
        shift = offset - (old_by if m is not None and int(m[1]) <= old_upto else 0.0)

        def move(headers: Headers) -> Headers:
            moved = dates_moved(headers, {"last-modified": shift, "date": offset + (idle or 0.0)})
            return moved if idle is not None else [(k, v) for k, v in moved if k.lower() != "date"]

        return Fault(reply_headers=move)

    return rule


@contextlib.contextmanager
def through(s3: EmbeddedS3, rule: Callable[[Request], Fault]) -> Iterator[tuple[FaultProxy, str]]:
    """A proxy applying `rule` in front of moto, and the storage option that reaches it."""
    with FaultProxy(s3.endpoint, rule) as proxy:
        yield proxy, f"client_kwargs.endpoint_url={proxy.endpoint}"


@pytest.mark.parametrize("offset", [0.0, -HOUR], ids=["store-clock-as-ours", "store-clock-an-hour-behind"])
def test_cli_prune_removes_old_fences_and_keeps_young_ones(
        s3: EmbeddedS3, s3_url: str, offset: float) -> None:
    """The installed `ckptfs prune` (fence_seconds 600) over a run whose first records the
    store wrote an hour before the others: those go, the others stay as fences, with the
    store's clock as ours and with it an hour behind (this machine an hour ahead). Behind,
    every record up to the kept snapshot was removed: all an hour old by this clock."""
    opts = s3.storage_options
    write_steps(s3_url, opts, 8, fence=600.0)
    logs, snaps = run_versions(s3_url, opts, "log"), run_versions(s3_url, opts, "snap")
    old = [v for v in logs if v <= 3]
    young = [v for v in logs if 3 < v <= snaps[-1]]
    assert old and young, (logs, snaps)
    with through(s3, store_clock(offset, old[-1])) as (proxy, ep):
        code, out, err = cli("prune", s3_url, "--keep-last", "1", "--superseded-grace", "0",
                             "--run", RUN, "--json", "-o", ep, timeout=120)
        assert code == 0, err
        assert proxy.counts["rewritten"] > 0  # the times were read through the clock
    doc = json.loads(out)
    assert [r["kept_snapshots"] for r in doc["runs"]] == [snaps[-1:]]
    left = run_versions(s3_url, opts, "log")
    assert not set(old) & set(left), left  # written an hour before the newest: gone
    assert set(young) <= set(left), (young, left)  # minutes at most by the store's clock: fences
    assert run_versions(s3_url, opts, "snap") == snaps[-1:]
    loads_whole(s3_url, opts, 8)
