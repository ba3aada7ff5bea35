"""Second reading of refresh / lazy claims (review2): each test fails on the code it was written
against and names the behaviour it expects."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall
from ckptfs.maintenance.verify import verify
from ckptfs.runtime.worker import Worker
from ckptfs.store.leases import LeaseManager


def _run(n: int = 3) -> AgentRun:
    run = AgentRun(run_id="r", goal="g")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title=f"t{i}"))
    return run


def test_refresh_is_not_stale_when_retention_kept_only_the_newest_snapshot(tmp_path: Path) -> None:
    """keep_last=1 and a snapshot at the newest version: retention removes every journal record,
    so LISTing log/ after the head finds nothing. That is not 'nothing new'."""
    u = str(tmp_path / "s")
    # a snapshot at every commit, whatever the sizes (a snapshot's header holds the summary
    # too); no superseded grace, so the case is the one this test is about: no record left
    a = CheckpointStore(u, policy=CompactionPolicy(min_snapshot_bytes=1, snapshot_ratio=0.001, keep_last=1,
                                                   superseded_grace=0.0, background=False))
    a.save_run(_run())
    b = CheckpointStore(u)
    assert b.refresh("r") is not None  # b's head: v1
    run_a = a.load_run("r")
    assert run_a is not None
    run_a.steps["s0"].status, run_a.steps["s0"].result = StepStatus.COMPLETED, "by a"
    a.commit(run_a, [run_a.steps["s0"]])  # v2 and its snapshot; retention drops log/1 and log/2
    assert a.storage.list("runs/r/log/") == []
    got = b.refresh("r")
    assert got is not None and got.steps["s0"].status == StepStatus.COMPLETED
    a.close()
    b.close()


def test_snapshot_of_a_loaded_run_keeps_offloaded_tool_results_as_references(tmp_path: Path) -> None:
    """A step's embedded tool call result over the threshold is stored as a $ref. A store that
    loads the run seeds its compactor from the load; the load resolved the reference in place in
    that shared state, so the next snapshot held the inlined value and verify flagged it."""
    u = str(tmp_path / "s")
    policy = CompactionPolicy(min_snapshot_bytes=1, keep_last=0, background=False)
    run = _run(2)
    run.steps["s0"].tool_calls.append(ToolCall(id="c", tool_name="x", arguments={}, result="Z" * 400))
    with CheckpointStore(u, policy=policy, artifact_threshold=300) as w:
        w.save_run(run)
    w2 = CheckpointStore(u, policy=policy, artifact_threshold=300)
    loaded = w2.load_run("r")
    assert loaded is not None and loaded.steps["s0"].tool_calls[0].result == "Z" * 400
    for i in range(3):
        loaded.steps["s1"].metadata["i"] = i
        w2.commit(loaded, [loaded.steps["s1"]])
    w2.close()
    assert w2.storage.list("runs/r/snap/")  # a snapshot was written by the loading store
    rep = verify(u, level="data")
    assert rep.ok, [(f.code, f.key, f.message) for f in rep.problems]


def test_parallel_tool_calls_in_one_worker_step_do_not_refuse_their_own_claim(tmp_path: Path) -> None:
    """Two threads of one executor log their first calls together: both went out as claims and
    the second was refused (LeaseLostError) by the first: its paid result unlogged, step lost."""
    u = str(tmp_path / "s")
    CheckpointStore(u).save_run(_run(1))
    store = CheckpointStore(u)
    worker = Worker(store, worker_id="A", lease_ttl=10)
    barrier = threading.Barrier(2)

    def executor(step: Step, prior: list[ToolCall]) -> str:
        tools = worker.tools()

        def call(name: str) -> Any:
            def pay(**_: Any) -> str:
                barrier.wait(5)  # both calls are paid at the same moment
                return name
            return tools.run(name, {}, pay)

        with ThreadPoolExecutor(2) as pool:
            return ",".join(pool.map(call, ["a", "b"]))

    report = worker.work("r", executor, max_steps=1)
    assert report.completed == ["s0"], report
    logged = sorted(c.tool_name for c in CheckpointStore(u).get_tool_call_history("r", "s0"))
    assert logged == ["a", "b"]
    store.close()


def test_a_taken_over_holder_cannot_commit_while_its_successor_runs(tmp_path: Path) -> None:
    """B takes the step over (generation 2) from a silent A and runs it. A's write, whose lease
    check passed just before it stalled, must be refused from the moment B runs the step: the
    claim that raises the fence cannot wait for B's first tool call when an older holder exists."""
    u = str(tmp_path / "s")
    CheckpointStore(u).save_run(_run(1))
    sa, sb = CheckpointStore(u), CheckpointStore(u)
    lease_a = LeaseManager(sa.storage, "A", ttl=10).acquire("r", "s0")
    assert lease_a is not None and lease_a.generation == 1
    shift = [0.0]
    wb = Worker(sb, worker_id="B", lease_ttl=10, poll_interval=0.02,
                clock=lambda: time.monotonic() + shift[0])
    b_running, go_on = threading.Event(), threading.Event()

    def executor(step: Step, prior: list[ToolCall]) -> str:
        b_running.set()
        go_on.wait(10)
        return "by B"

    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("rep", wb.work("r", executor, max_steps=1)))
    t.start()
    try:
        time.sleep(0.3)  # B has seen A's lease
        shift[0] = 100.0  # a full ttl passes on B's clock
        assert b_running.wait(10)
        stale = sa.load_run("r")
        assert stale is not None
        step = stale.steps["s0"]
        step.status, step.result, step.attempt_count = StepStatus.COMPLETED, "stale A", 1
        refused = False
        try:
            sa.commit_step("r", step, lease_a, claim=True)
        except Exception:  # LeaseLostError expected
            refused = True
    finally:
        go_on.set()
        t.join(20)
    final = CheckpointStore(u).load_run("r")
    assert final is not None
    assert refused and final.steps["s0"].result == "by B", (refused, final.steps["s0"].result)
    sa.close()
    sb.close()
