"""Corruption by flipping and cutting real bytes: load falls back, warns, never starts over."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointCorruptError, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.format.keys import parse_run_key
from ckptfs.storage.base import Storage

POLICY = CompactionPolicy(fanout=4, max_plan=5, min_snapshot_bytes=10**9, keep_last=0, background=False)


def build(url: str, opts: dict[str, Any], n: int = 30) -> tuple[CheckpointStore, list[int]]:
    store = CheckpointStore(url, storage_options=opts, policy=POLICY)
    run = AgentRun(run_id="c", goal="g")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title="t"))
    store.save_run(run)
    done = []
    for i in range(n):
        s = run.steps[f"s{i}"]
        s.status, s.result = StepStatus.COMPLETED, f"r{i}"
        done.append(store.commit(run, [s]))
    return store, done


def newest(storage: Storage, kind: str) -> str:
    files = [f for f in (parse_run_key(k) for k in storage.list("runs/c")) if f and f.kind == kind]
    return max(files).key


def flip(storage: Storage, key: str) -> None:
    data = bytearray(storage.get(key))
    data[len(data) // 3] ^= 0x40
    storage.put(key, bytes(data))


def truncate(storage: Storage, key: str) -> None:
    storage.put(key, storage.get(key)[:-7])


@pytest.mark.parametrize("damage", [flip, truncate])
def test_newest_snapshot_damaged_falls_back(any_store_url: tuple[str, dict[str, Any]], damage: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:
    url, opts = any_store_url
    store, _ = build(url, opts)
    damage(store.storage, newest(store.storage, "snap"))
    caplog.set_level(logging.WARNING)
    run = CheckpointStore(url, storage_options=opts).load_run("c")
    assert run is not None and run.completed_count == 30  # older snapshot + records: nothing lost
    assert any("snap" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.parametrize("damage", [flip, truncate])
def test_newest_journal_record_damaged_falls_back_one_version(
        any_store_url: tuple[str, dict[str, Any]], damage: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    url, opts = any_store_url
    store, versions = build(url, opts)
    key = newest(store.storage, "log")
    damage(store.storage, key)
    caplog.set_level(logging.WARNING)
    fresh = CheckpointStore(url, storage_options=opts, policy=POLICY)
    run = fresh.load_run("c")
    assert run is not None and run.completed_count == 29  # the previous valid state
    assert any(key in r.getMessage() for r in caplog.records)
    # continuing writes a new branch: nothing overwritten, and the next load sees it
    s = run.steps["s29"]
    s.status, s.result = StepStatus.COMPLETED, "redone"
    v = fresh.commit(run, [s])
    assert v == versions[-1] + 1
    again = CheckpointStore(url, storage_options=opts).load_run("c")
    assert again is not None and again.steps["s29"].result == "redone"


def test_every_file_broken_raises(tmp_path: Any) -> None:
    store, _ = build(str(tmp_path), {})
    for k in store.storage.list("runs/c"):
        flip(store.storage, k)
    with pytest.raises(CheckpointCorruptError, match="'c'"):
        CheckpointStore(str(tmp_path)).load_run("c")


def test_file_copied_from_another_run_is_refused(tmp_path: Any) -> None:
    store, _ = build(str(tmp_path), {})
    other = CheckpointStore(str(tmp_path), policy=POLICY)
    run = AgentRun(run_id="d", goal="other")
    run.add_step(Step(id="x", title="x"))
    other.save_run(run)
    newest_log = newest(store.storage, "log")
    store.storage.put(newest_log, store.storage.get("runs/d/log/000000000001.ckpt"))
    loaded = CheckpointStore(str(tmp_path)).load_run("c")
    assert loaded is not None and loaded.completed_count == 29 and loaded.goal == "g"
