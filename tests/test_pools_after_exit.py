"""Thread pools outside the store, used by a non-daemon thread after the main thread returned.

Once the main thread has returned, interpreter shutdown has begun: concurrent.futures refuses
new work ("cannot schedule new futures after interpreter shutdown"). The store's own pools
run such work in the calling thread (`ckptfs.store.pools.StorePool`); so do the pools that
only overlap round trips the same way: a Worker's lease releases, verify's reads, the version
listing's reads, a mirror pass's copies, the LangGraph saver's reads. Each operation below
failed with that RuntimeError from such a thread, on a store that was fine.

The agent's one-thread write pool is an ordered StorePool: work refused at exit waits for what
was queued before it. Its group committer used to submit while holding its own lock, which the
submitted write takes: run inline, that deadlocked.

On S3 the child opens its storage, and makes a request, before the main thread returns (as a
program hands its non-daemon thread what it opened). A client's first request made after
shutdown has begun fails below these pools, in the storage layer: aiobotocore builds its HTTP
connector on asyncio's default executor (`asyncio.to_thread`), which refuses it the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.store.leases import LeaseManager

# The child's common part: `after_main(work)` runs `work()` on a non-daemon thread once the
# main thread has returned (threading's exit hooks, concurrent.futures' among them, have run
# by then) and prints "OK <json of its result>" or "FAILED <error>".
_PRELUDE = """
import json, sys, threading, time
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
url, options = sys.argv[1], json.loads(sys.argv[2])

def saved_run(store, steps=3):
    run = AgentRun(run_id="r", goal="g")
    for i in range(steps):
        run.add_step(Step(id=f"s{i}", title=f"s{i}"))
    store.save_run(run)
    return run

def after_main(work):
    def later():
        while threading.main_thread().is_alive():
            time.sleep(0.01)
        try:
            out = work()
        except Exception as exc:
            print("FAILED", type(exc).__name__, exc)
        else:
            print("OK", json.dumps(out))
        sys.stdout.flush()
    threading.Thread(target=later, daemon=False).start()
"""


def _after_main(tmp_path: Path, body: str, url: str, options: dict[str, Any] | None = None) -> Any:
    """Run the child (the prelude, then `body`) with the real interpreter; `work()`'s result."""
    script = tmp_path / "after_main.py"
    script.write_text(_PRELUDE + textwrap.dedent(body), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), url, json.dumps(options or {})],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = proc.stdout.strip()
    assert out.startswith("OK "), (out, proc.stderr[-2000:])
    return json.loads(out[3:])


def _committed(store: CheckpointStore, run: AgentRun, step_id: str) -> None:
    step = run.steps[step_id]
    step.status, step.result = StepStatus.COMPLETED, f"done {step_id}"
    store.commit(run, [step])


def test_a_worker_runs_a_run_to_the_end_and_releases_its_leases(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    out = _after_main(tmp_path, """
        from ckptfs.runtime.worker import Worker
        store = CheckpointStore(url, options)
        saved_run(store)

        def work():
            report = Worker(store, worker_id="w", poll_interval=0.05).work(
                "r", lambda step, prior: "done " + step.id)
            return {"completed": sorted(report.completed), "status": report.run_status}

        after_main(work)
    """, url)
    # was: FAILED RuntimeError cannot schedule new futures after interpreter shutdown
    assert out == {"completed": ["s0", "s1", "s2"], "status": "completed"}
    loaded = CheckpointStore(url).load_run("r")
    assert loaded is not None and loaded.status == "completed"
    assert {sid: s.result for sid, s in loaded.steps.items()} == {f"s{i}": f"done s{i}" for i in range(3)}
    # the releases landed: another holder takes each step at once, not after the lease's ttl
    other = LeaseManager(CheckpointStore(url).storage, "other")
    assert all(other.acquire("r", f"s{i}") is not None for i in range(3))


def test_verify_reads_a_store(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    out = _after_main(tmp_path, """
        from ckptfs import verify
        store = CheckpointStore(url, options)
        run = saved_run(store)
        for sid in ("s0", "s1"):
            run.steps[sid].status, run.steps[sid].result = StepStatus.COMPLETED, "x"
            store.commit(run, [run.steps[sid]])
        store.close()

        def work():
            rep = verify(url, level="data")
            return {"ok": rep.ok, "files": rep.files, "runs": rep.runs,
                    "problems": [[f.code, f.key] for f in rep.problems]}

        after_main(work)
    """, url)
    # was: FAILED RuntimeError cannot schedule new futures after interpreter shutdown
    assert out["ok"] and not out["problems"], out
    assert out["runs"] == 1 and out["files"] == len(CheckpointStore(url).list_versions("r")), out


def test_the_versions_of_a_run_on_s3_are_listed(tmp_path: Path, s3_url: str,
                                                s3_opts: dict[str, Any]) -> None:
    store = CheckpointStore(s3_url, s3_opts)
    run = AgentRun(run_id="r", goal="g")
    for i in range(3):
        run.add_step(Step(id=f"s{i}", title=f"s{i}"))
    store.save_run(run)
    for sid in ("s0", "s1", "s2"):
        _committed(store, run, sid)
    store.close()
    out = _after_main(tmp_path, """
        from ckptfs.maintenance.history import list_versions
        from ckptfs.storage.registry import open_storage
        storage = open_storage(url, options)  # connected before exit: see the module's note
        storage.list("runs/")

        def work():
            assert storage.capabilities.remote  # the listing's reads go to its pool
            return [[v.version, v.readable, v.completed, v.total] for v in list_versions(storage, "r")]

        after_main(work)
    """, s3_url, s3_opts)
    # was: FAILED RuntimeError cannot schedule new futures after interpreter shutdown
    versions = CheckpointStore(s3_url, s3_opts).list_versions("r")
    assert len(versions) == 4
    assert out == [[v, True, done, 3] for v, done in zip(versions, range(4), strict=True)]


def test_a_mirror_pass_copies_a_run(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    store = CheckpointStore(src)
    run = AgentRun(run_id="r", goal="g")
    for i in range(2):
        run.add_step(Step(id=f"s{i}", title=f"s{i}"))
    store.save_run(run)
    _committed(store, run, "s0")
    store.close()
    out = _after_main(tmp_path, f"""
        from ckptfs import mirror

        def work():
            rep = mirror(url, {dst!r})
            return {{"ok": rep.ok, "copied": rep.copied, "missing": rep.missing,
                    "runs": [[r.run_id, r.status, r.version] for r in rep.runs]}}

        after_main(work)
    """, src)
    # was: FAILED RuntimeError cannot schedule new futures after interpreter shutdown
    assert out["ok"] and out["copied"] > 0 and not out["missing"], out
    mirrored = CheckpointStore(dst).load_run("r")
    assert mirrored is not None
    assert mirrored.steps["s0"].status == StepStatus.COMPLETED and mirrored.steps["s0"].result == "done s0"
    assert mirrored.steps["s1"].status == StepStatus.PENDING


def test_a_langgraph_saver_on_s3_reads_its_checkpoints(tmp_path: Path, s3_url: str,
                                                       s3_opts: dict[str, Any]) -> None:
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with CkptfsSaver(s3_url, s3_opts) as saver:
        for i in range(3):
            ck = empty_checkpoint()
            ck["channel_values"] = {"n": i}
            ck["channel_versions"] = {"n": i + 1}
            cfg = saver.put(cfg, ck, {"step": i}, {"n": i + 1})
        saver.put_writes(cfg, [("n", 99)], "task-1")
    newest = cfg["configurable"]["checkpoint_id"]
    out = _after_main(tmp_path, """
        from ckptfs.integrations.langgraph import CkptfsSaver
        saver = CkptfsSaver(url, options)  # connected before exit: see the module's note
        saver.storage.list("langgraph/")

        def work():
            with saver:
                assert saver.storage.capabilities.remote  # its reads go to its pool
                tup = saver.get_tuple({"configurable": {"thread_id": "t"}})
                listed = list(saver.list({"configurable": {"thread_id": "t"}}))
            return {"id": tup.config["configurable"]["checkpoint_id"],
                    "n": tup.checkpoint["channel_values"]["n"],
                    "writes": [[w[0], w[1], w[2]] for w in tup.pending_writes],
                    "listed": [c.checkpoint["channel_values"]["n"] for c in listed]}

        after_main(work)
    """, s3_url, s3_opts)
    # was: FAILED RuntimeError cannot schedule new futures after interpreter shutdown
    assert out == {"id": newest, "n": 2, "writes": [["task-1", "n", 99]], "listed": [2, 1, 0]}


def test_an_async_run_in_a_thread_that_outlives_the_main_one(tmp_path: Path) -> None:
    """The agent's one-thread write pool, group committed: every write runs in the caller
    once the main thread returned, in order (before: refused at the first commit; run inline
    under the committer's own lock it deadlocked)."""
    url = str(tmp_path / "s")
    out = _after_main(tmp_path, """
        import asyncio
        from ckptfs import CheckpointedAgent
        store = CheckpointStore(url, options)
        agent = CheckpointedAgent(store)
        run = agent.start_run("g", [Step(id=f"s{i}", title=f"s{i}") for i in range(6)], run_id="r")

        async def paid(step):
            await asyncio.sleep(0.001)
            return "paid " + step

        async def executor(step, prior):
            return await agent.tools().arun("pay", {"step": step.id}, paid)

        def work():
            done = asyncio.run(agent.aexecute_run(run, executor, concurrency=3))
            return {"status": done.status, "done": sorted(s.result for s in done.steps.values())}

        after_main(work)
    """, url)
    assert out == {"status": "completed", "done": [f"paid s{i}" for i in range(6)]}, out
    loaded = CheckpointStore(url).load_run("r")
    assert loaded is not None and loaded.status == "completed"
    store = CheckpointStore(url)
    assert all([c.result for c in store.get_tool_call_history("r", f"s{i}")] == [f"paid s{i}"]
               for i in range(6))


def test_an_ordered_pool_runs_work_refused_at_exit_after_what_it_had_queued(tmp_path: Path) -> None:
    """Work submitted while the exit hook drains the pool's queue runs after that queue, not
    beside it: a write decided later never lands before one decided earlier."""
    script = tmp_path / "ordered.py"
    script.write_text(textwrap.dedent("""
        import sys, threading, time
        from ckptfs.store.pools import StorePool
        pool = StorePool(1, ordered=True)
        order = []

        def task(i, pause=0.0):
            time.sleep(pause)
            order.append(i)

        def submitter():
            pool.submit(task, 0, 0.5)  # still running when the main thread returns
            for i in range(1, 40):
                pool.submit(task, i)
                time.sleep(0.01)
            time.sleep(0.6)
            print("ORDER", order == sorted(order), order[:6], flush=True)

        threading.Thread(target=submitter, daemon=False).start()
        time.sleep(0.05)
    """), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "ORDER True" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
