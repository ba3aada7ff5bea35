"""CheckpointStore.refresh and rebasing commits: a store shared with other writers reads only
what they committed since it last looked, and still compacts; any doubt means a full load."""

from __future__ import annotations

import collections
import functools
from pathlib import Path
from typing import Any

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall
from ckptfs.format.keys import log_key
from ckptfs.storage.base import Storage
from ckptfs.store.leases import LeaseManager


def _counting(storage: Storage) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for name in ("get", "get_with_etag", "list"):
        real = getattr(storage, name)

        def wrap(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            counts[_name] += 1
            return _real(*a, **k)

        setattr(storage, name, wrap)
    return counts


def _run(n: int = 6) -> AgentRun:
    run = AgentRun(run_id="r", goal="shared")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title=f"step {i}"))
    return run


def test_refresh_reads_only_what_others_committed(shared_url: tuple[str, dict[str, Any]]) -> None:
    u, opts = shared_url
    a, b = CheckpointStore(u, opts, artifact_threshold=1024), CheckpointStore(u, opts)
    a.save_run(_run())
    assert b.load_run("r") is not None
    run_a = a.load_run("r")
    assert run_a is not None
    s0 = run_a.steps["s0"]
    s0.status, s0.result = StepStatus.COMPLETED, "x" * 5000  # over a's threshold: an artifact
    a.commit(run_a, [s0])
    a.log_tool_call("r", "s1", ToolCall(id="c1", tool_name="llm", arguments={"q": 1}, result="y" * 3000))
    run_a.metadata["note"] = "run-level change"
    assert a.commit(run_a, []) == 4
    counts = _counting(b.storage)
    got = b.refresh("r")
    assert got is not None and got.model_dump() == a.load_run("r").model_dump()  # type: ignore[union-attr]
    assert got.steps["s0"].result == "x" * 5000 and got.metadata["note"] == "run-level change"
    assert b.get_tool_call_history("r", "s1", fresh=False)[0].result == "y" * 3000  # as refreshed
    assert counts["list"] == 1  # the new records' names
    assert counts["get_with_etag"] == 5  # the three new records and the two artifacts they name
    other = CheckpointStore(u, opts)
    load_counts = _counting(other.storage)
    assert other.load_run("r") is not None
    assert load_counts["get_with_etag"] > counts["get_with_etag"]
    # b's head is current: its next commit needs no retry and lands on top of a's
    step = got.steps["s2"]
    step.status, step.result = StepStatus.COMPLETED, "b"
    b.commit(got, [step])
    final = CheckpointStore(u, opts).load_run("r")
    assert final is not None and final.steps["s0"].result == "x" * 5000 and final.steps["s2"].result == "b"
    a.close()
    b.close()


def test_refresh_falls_back_to_a_load_when_a_record_is_damaged(tmp_path: Path) -> None:
    u = str(tmp_path / "s")
    a, b = CheckpointStore(u), CheckpointStore(u)
    a.save_run(_run())
    assert b.load_run("r") is not None
    run_a = a.load_run("r")
    assert run_a is not None
    for i in range(3):
        st = run_a.steps[f"s{i}"]
        st.status, st.result = StepStatus.COMPLETED, f"r{i}"
        a.commit(run_a, [st])
    a.flush()
    key = log_key("r", 3)  # the middle one of the three
    data = bytearray(a.storage.get(key))
    data[len(data) // 2] ^= 0x20
    a.storage.put(key, bytes(data))
    got = b.refresh("r")
    fresh = CheckpointStore(u).load_run("r")
    assert got is not None and fresh is not None and got.model_dump() == fresh.model_dump()


def test_writers_that_rebase_keep_the_run_compacted(tmp_path: Path) -> None:
    """Two workers interleave 120 commits; each rebases on the other's records and keeps
    feeding its compactor, so a fresh load still reads a snapshot and a short chain."""
    u = str(tmp_path / "s")
    policy = CompactionPolicy(fanout=4, max_plan=8, keep_last=2)
    CheckpointStore(u).save_run(_run(120))
    stores = [CheckpointStore(u, policy=policy), CheckpointStore(u, policy=policy)]
    leases = [LeaseManager(st.storage, f"w{i}") for i, st in enumerate(stores)]
    for i in range(120):
        st, lm = stores[i % 2], leases[i % 2]
        run = st.refresh("r")
        assert run is not None
        step = run.steps[f"s{i}"]
        lease = lm.acquire("r", step.id)
        assert lease is not None
        step.status, step.result = StepStatus.COMPLETED, f"by w{i % 2}"
        st.commit_step("r", step, lease, claim=True)
    for st in stores:
        st.flush()
    fresh = CheckpointStore(u)
    run = fresh.load_run("r")
    assert run is not None and run.completed_count == 120
    assert fresh.last_load is not None and fresh.last_load.records_read <= 12
    # retention ran too: each writer prunes below the older of the 2 snapshots it knows (its
    # own, and the other's it met at the same version and checked), without listing
    versions = fresh.list_versions("r")
    assert versions[0] > 30 and len(versions) < 90, versions
    for st in stores:
        st.close()


def test_refresh_of_a_head_older_than_retention_kept_reloads(tmp_path: Path) -> None:
    u = str(tmp_path / "s")
    a = CheckpointStore(u, policy=CompactionPolicy(fanout=2, max_plan=3, keep_last=1))
    a.save_run(_run(40))
    b = CheckpointStore(u)
    assert b.load_run("r") is not None  # b's head: version 1
    run_a = a.load_run("r")
    assert run_a is not None
    for i in range(40):
        st = run_a.steps[f"s{i}"]
        st.status, st.result = StepStatus.COMPLETED, f"r{i}"
        a.commit(run_a, [st])
    a.flush()
    assert not a.storage.exists(log_key("r", 2))  # what b would need next is gone
    got = b.refresh("r")
    assert got is not None and got.completed_count == 40
    assert got.model_dump() == CheckpointStore(u).load_run("r").model_dump()  # type: ignore[union-attr]


def test_a_writer_that_has_seen_others_catches_up_before_committing(tmp_path: Path) -> None:
    u = str(tmp_path / "s")
    CheckpointStore(u).save_run(_run(8))
    a, b = CheckpointStore(u), CheckpointStore(u)
    la, lb = LeaseManager(a.storage, "a"), LeaseManager(b.storage, "b")
    failed: list[str] = []
    real = b.storage.put_if_absent

    def put_if_absent(key: str, data: bytes) -> str:
        try:
            return real(key, data)
        except FileExistsError:
            failed.append(key)
            raise

    b.storage.put_if_absent = put_if_absent  # type: ignore[method-assign]
    # commits come through put_if_absent_beside on disk: its general form calls the patch
    b.storage.put_if_absent_beside = functools.partial(  # type: ignore[method-assign]
        Storage.put_if_absent_beside, b.storage)
    views = {st: st.load_run("r") for st in (a, b)}
    for i in range(8):  # alternate, each from the view it loaded at the start
        st, lm = (a, la) if i % 2 == 0 else (b, lb)
        step = views[st].steps[f"s{i}"]  # type: ignore[union-attr]
        step.status, step.result = StepStatus.COMPLETED, f"r{i}"
        lease = lm.acquire("r", step.id)
        assert lease is not None
        st.commit_step("r", step, lease, claim=True)
    # b lost the race once, learnt that the run is shared, and from then on caught up first
    assert len([k for k in failed if "/log/" in k]) == 1
    got = CheckpointStore(u).load_run("r")
    assert got is not None and got.completed_count == 8
