"""CheckpointStore behaviour on local disk, memory and S3 (moto over HTTP)."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from ckptfs import (
    AgentRun,
    CheckpointCorruptError,
    CheckpointStore,
    CompactionPolicy,
    ConflictError,
    InvalidIdError,
    Step,
    StepStatus,
    ToolCall,
    VersionNotFoundError,
)
from ckptfs.format.keys import parse_run_key

Backend = tuple[str, dict[str, Any]]
SMALL = CompactionPolicy(fanout=4, max_plan=8, min_snapshot_bytes=2048, keep_last=3, background=False)


def make_run(n: int = 20, run_id: str = "run-1") -> AgentRun:
    run = AgentRun(run_id=run_id, goal="process papers")
    for i in range(n):
        run.add_step(Step(id=f"s{i:03d}", title=f"step {i}",
                          dependencies=[f"s{i - 1:03d}"] if i else []))
    return run


def complete(store: CheckpointStore, run: AgentRun, i: int, text: str = "") -> None:
    s = run.steps[f"s{i:03d}"]
    s.status, s.result = StepStatus.COMPLETED, text or f"result {i} " * 20
    store.commit(run, [s])


def test_save_load_roundtrip_every_backend(any_store_url: Backend) -> None:
    url, opts = any_store_url
    store = CheckpointStore(url, storage_options=opts, policy=SMALL)
    run = make_run()
    v1 = store.save_run(run)
    for i in range(20):
        complete(store, run, i)
    store.log_tool_call(run.run_id, "s003", ToolCall(tool_name="search", arguments={"q": "x"},
                                                       result={"hits": 3}))
    store.flush()
    fresh = CheckpointStore(url, storage_options=opts, policy=SMALL)
    loaded = fresh.load_run(run.run_id)
    assert loaded is not None
    assert loaded.model_dump() == run.model_dump()
    assert v1 == 1 and fresh.list_versions(run.run_id)[-1] == 22
    hist = fresh.get_tool_call_history(run.run_id, "s003")
    assert [(c.tool_name, c.result) for c in hist] == [("search", {"hits": 3})]
    assert fresh.load_run("never-saved") is None


def test_commit_writes_only_the_change(tmp_path: Any) -> None:
    store = CheckpointStore(str(tmp_path), policy=SMALL)
    run = make_run(500)
    store.save_run(run)
    from ckptfs.format.codec import decode

    def body_size(v: int) -> int:
        key = f"runs/run-1/log/{v:012d}.ckpt"
        return len(str(decode(store.storage.get(key), key).body))

    complete(store, run, 0)
    assert body_size(2) < body_size(1) / 100  # one step, not 500
    assert store.commit(run, [run.steps["s000"]]) == 2  # nothing changed: no new version


def test_compaction_writes_deltas_and_snapshots_and_loads_agree(tmp_path: Any) -> None:
    policy = CompactionPolicy(fanout=4, max_plan=6, min_snapshot_bytes=10**9, keep_last=0,
                              background=False)
    store = CheckpointStore(str(tmp_path), policy=policy)
    run = make_run(120)
    store.save_run(run)
    for i in range(120):
        complete(store, run, i)
    kinds = [parse_run_key(k) for k in store.storage.list("runs/run-1")]
    assert {f.kind for f in kinds if f} == {"log", "delta", "snap"}
    fresh = CheckpointStore(str(tmp_path), policy=policy)
    assert fresh.load_run("run-1") == run
    info = fresh.last_load
    assert info is not None and info.records_read <= 1 + policy.max_plan


def test_load_each_historical_version(tmp_path: Any) -> None:
    store = CheckpointStore(str(tmp_path), policy=SMALL)
    run = make_run(10)
    store.save_run(run)
    expected = {}
    for i in range(10):
        complete(store, run, i)
        expected[i + 2] = run.completed_count
    for v in store.list_versions("run-1"):
        loaded = store.load_run("run-1", version=v)
        assert loaded is not None and loaded.completed_count == expected.get(v, 0)
    with pytest.raises(VersionNotFoundError):
        store.load_run("run-1", version=999)


def test_second_writer_gets_conflict_and_nothing_is_overwritten(any_store_url: Backend) -> None:
    url, opts = any_store_url
    a = CheckpointStore(url, storage_options=opts, policy=SMALL)
    b = CheckpointStore(url, storage_options=opts, policy=SMALL)
    run = make_run(5)
    a.save_run(run)
    run_b = b.load_run("run-1")
    assert run_b is not None
    complete(a, run, 0, "from a")
    s = run_b.steps["s000"]
    s.status, s.result = StepStatus.COMPLETED, "from b"
    with pytest.raises(ConflictError, match=r"run 'run-1': version 2"):
        b.commit(run_b, [s])
    loaded = CheckpointStore(url, storage_options=opts).load_run("run-1")
    assert loaded is not None and loaded.steps["s000"].result == "from a"
    again = b.load_run("run-1")  # after reloading, b continues from the newest version
    assert again is not None
    complete(b, again, 1)
    assert b.list_versions("run-1")[-1] == 3


def test_retention_keeps_last_n_snapshots_and_what_they_need(tmp_path: Any) -> None:
    policy = CompactionPolicy(fanout=4, max_plan=4, min_snapshot_bytes=10**9, keep_last=2,
                              superseded_grace=0.0, background=False)
    store = CheckpointStore(str(tmp_path), policy=policy)
    run = make_run(60)
    store.save_run(run)
    for i in range(60):
        complete(store, run, i)
    files = [parse_run_key(k) for k in store.storage.list("runs/run-1")]
    snaps = sorted(f.version for f in files if f and f.kind == "snap")
    assert len(snaps) == 2
    assert min(f.version for f in files if f and f.kind == "log") > snaps[0]
    assert CheckpointStore(str(tmp_path)).load_run("run-1") == run
    # the oldest kept snapshot still loads on its own (fallback target)
    assert CheckpointStore(str(tmp_path)).load_run("run-1", version=snaps[0]) is not None


def test_retention_refuses_empty_policy_and_keeps_valid_snapshot(tmp_path: Any) -> None:
    policy = CompactionPolicy(fanout=4, max_plan=4, min_snapshot_bytes=10**9, keep_last=0,
                              background=False)
    store = CheckpointStore(str(tmp_path), policy=policy)
    run = make_run(40)
    store.save_run(run)
    for i in range(40):
        complete(store, run, i)
    with pytest.raises(ValueError, match="at least one"):
        store.apply_retention("run-1", keep_last=0)
    snaps = [k for k in store.storage.list("runs/run-1/snap")]
    for k in snaps[1:]:  # break every snapshot but the oldest
        data = bytearray(store.storage.get(k))
        data[len(data) // 2] ^= 0xFF
        store.storage.put(k, bytes(data))
    result = store.apply_retention("run-1", keep_last=1)
    assert result.kept_snapshots == [int(snaps[0].rsplit("/", 1)[1][:12])]
    assert snaps[0] not in result.deleted
    dry = store.apply_retention("run-1", keep_last=1, dry_run=True)
    assert dry.deleted == [] and store.storage.exists(snaps[0])


def test_large_values_become_artifacts_and_come_back(any_store_url: Backend) -> None:
    url, opts = any_store_url
    store = CheckpointStore(url, storage_options=opts, artifact_threshold=1024, policy=SMALL)
    run = make_run(2)
    store.save_run(run)
    big = "lorem ipsum " * 2000
    s = run.steps["s000"]
    s.status, s.result = StepStatus.COMPLETED, big
    s.tool_calls.append(ToolCall(tool_name="fetch", arguments={}, result={"text": big}))
    store.commit(run, [s])
    store.log_tool_call("run-1", "s000", ToolCall(tool_name="t", arguments={}, result=big))
    arts = store.storage.list("artifacts")
    assert len(arts) == 3  # step result (text), tool result {"text": ...}, logged result (JSON)
    s.attempt_count += 1
    store.commit(run, [s])  # re-committing the step stores nothing new
    assert store.storage.list("artifacts") == arts
    logs = store.storage.list("runs/run-1/log")
    assert all(store.storage.size(k) < 3000 for k in logs[1:])  # summaries, not the payload
    loaded = CheckpointStore(url, storage_options=opts).load_run("run-1")
    assert loaded is not None and loaded.steps["s000"].result == big
    assert loaded.steps["s000"].tool_calls[0].result == {"text": big}
    hist = CheckpointStore(url, storage_options=opts).get_tool_call_history("run-1", "s000")
    assert hist[0].result == big


def test_put_artifact_streams_files_and_verifies(tmp_path: Any) -> None:
    store = CheckpointStore(str(tmp_path / "st"))
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for i in range(64):
            f.write(bytes([i]) * (256 * 1024))  # 16 MB
    ref = store.put_artifact(src, summary="16 MB blob")
    assert ref.size == 16 * 1024 * 1024
    again = store.put_artifact(io.BytesIO(src.read_bytes()))
    assert again.sha256 == ref.sha256 and len(store.storage.list("artifacts")) == 1
    with store.open_artifact(ref) as f:
        n = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
    assert n == ref.size
    path = tmp_path / "st" / ref.uri
    data = bytearray(path.read_bytes())
    data[12345] ^= 1
    path.write_bytes(bytes(data))
    from ckptfs import CorruptFileError

    with pytest.raises(CorruptFileError, match="sha256"), store.open_artifact(ref) as f:
        while f.read(1 << 20):
            pass


def test_invalid_graphs_are_refused_at_commit(memory_url: str) -> None:
    store = CheckpointStore(memory_url)
    run = make_run(3)
    run.add_step(Step(id="x", title="x", dependencies=["ghost"]))
    with pytest.raises(ValueError, match="unknown step 'ghost'"):
        store.save_run(run)
    run = make_run(3, run_id="run-2")
    run.steps["s000"].dependencies = ["s002"]
    with pytest.raises(ValueError, match="cycle"):
        store.save_run(run)
    run = make_run(3, run_id="run-3")
    store.save_run(run)
    s = run.steps["s001"]
    s.status = StepStatus.COMPLETED  # no result
    with pytest.raises(ValueError, match="COMPLETED without a result"):
        store.commit(run, [s])
    assert store.list_versions("run-3") == [1]


def test_hostile_ids_refused_before_any_path_is_built(tmp_path: Any) -> None:
    store = CheckpointStore(str(tmp_path / "st"))
    for bad in ["../escape", "a/b", "..", ".hidden", "x\x00y", "tab\there", "a" * 201, "", " x"]:
        with pytest.raises((InvalidIdError, ValueError)):
            AgentRun(run_id=bad, goal="g")
        with pytest.raises(InvalidIdError):
            store.load_run(bad)
    with pytest.raises(ValueError, match="step id"):
        Step(id="../x", title="t")
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "st").exists() or not any((tmp_path / "st").iterdir())


def test_status_and_resumable_listing(memory_url: str) -> None:
    store = CheckpointStore(memory_url)
    a, b = make_run(3, "a"), make_run(3, "b")
    store.save_run(a)
    store.save_run(b)
    complete(store, a, 0)
    store.mark_run_complete("b", "completed")
    res = store.find_resumable_runs()
    assert [r["run_id"] for r in res] == ["a"]
    assert res[0]["completed_steps"] == 1 and res[0]["total_steps"] == 3
    store.mark_run_complete("a", "paused")
    assert [r["status"] for r in store.find_resumable_runs()] == ["paused"]
    loaded = CheckpointStore(memory_url).load_run("b")
    assert loaded is not None and loaded.status == "completed"


def test_nothing_ever_silently_starts_from_scratch(tmp_path: Any, caplog: Any) -> None:
    store = CheckpointStore(str(tmp_path), policy=SMALL)
    run = make_run(5)
    store.save_run(run)
    complete(store, run, 0)
    for k in store.storage.list("runs/run-1"):
        store.storage.put(k, b"garbage")
    caplog.set_level(logging.WARNING)
    with pytest.raises(CheckpointCorruptError, match="run-1"):
        CheckpointStore(str(tmp_path)).load_run("run-1")
    with pytest.raises(CheckpointCorruptError):  # and no new write on top of the wreck either
        CheckpointStore(str(tmp_path)).save_run(make_run(5))


def test_idle_compactor_threads_exit_and_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from ckptfs.store.compactor import Compactor

    # long while the threads start and are looked at (at 0.2 s the first store's could idle out
    # before the tenth was written, on a loaded machine), then short: the class attribute is
    # read at each wake-up (every WAKE_SECONDS)
    monkeypatch.setattr(Compactor, "IDLE_EXIT_SECONDS", 60.0)
    stores = [CheckpointStore(f"memory://idle-{i}-{id(monkeypatch)}") for i in range(10)]
    for st in stores:
        st.save_run(make_run(3))
    threads = [st._compactor._thread for st in stores]  # only this test's threads are watched
    assert all(t is not None for t in threads)
    monkeypatch.setattr(Compactor, "IDLE_EXIT_SECONDS", 0.2)
    deadline = time.monotonic() + 10
    while any(t is not None and t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t is not None and t.is_alive() for t in threads)  # idle stores hold no thread
    assert all(st._compactor._thread is None for st in stores)
    # the restarted thread must not idle out again before it is looked at (0.2 s is short on a
    # loaded machine); the class attribute is read at each check
    monkeypatch.setattr(Compactor, "IDLE_EXIT_SECONDS", 60.0)
    run = make_run(3, run_id="again")
    stores[0].save_run(run)
    assert stores[0]._compactor._thread is not None  # restarted on demand
    assert stores[0].flush(timeout=5) and stores[0].load_run("again") == run
    for st in stores:
        st.close()
    assert stores[0]._compactor._thread is None  # closed: no thread left behind for 60 s


def test_retention_runs_for_writers_too_short_lived_to_write_keep_last_snapshots(tmp_path: Any) -> None:
    """An agent restarted every few minutes writes a snapshot or two per process: the ones
    earlier processes left count towards keep_last (once they check), so retention still runs.
    Before, a run's files grew without bound (16,157 journal records after 40 restarts)."""
    policy = CompactionPolicy(fanout=4, max_plan=4, min_snapshot_bytes=10**9, keep_last=3,
                              superseded_grace=0.0, background=False)

    def snaps() -> list[int]:
        files = [parse_run_key(k) for k in CheckpointStore(str(tmp_path)).storage.list("runs/run-1")]
        return sorted(f.version for f in files if f and f.kind == "snap")

    run = make_run(400)
    with CheckpointStore(str(tmp_path), policy=policy) as first:
        first.save_run(run)
    i = 0
    for _process in range(8):  # each a new store: one snapshot of its own, then it is gone
        store = CheckpointStore(str(tmp_path), policy=policy)
        run = store.load_run("run-1")
        assert run is not None
        before = len(snaps())
        while len(snaps()) <= before and i < 400:
            complete(store, run, i)
            i += 1
        store.close()
    kept = snaps()
    assert 0 < len(kept) <= 3 + 1, kept  # keep_last, and at most the one the next pass retires
    files = [parse_run_key(k) for k in CheckpointStore(str(tmp_path)).storage.list("runs/run-1")]
    assert min(f.version for f in files if f and f.kind == "log") > kept[0]
    loaded = CheckpointStore(str(tmp_path)).load_run("run-1")
    assert loaded is not None and loaded.completed_count == i
    assert CheckpointStore(str(tmp_path)).load_run("run-1", version=kept[0]) is not None
