"""Several workers on one run: throughput against one CheckpointedAgent, and the cost of leases.

    python benchmarks/workers.py [--steps 48] [--latency 0.5] [--workers 1,2,4] [--backends local,s3]

A run of `--steps` independent steps (papers to read), each one "LLM call" of `--latency`
seconds on average (a sleep of 0.5x to 1.5x that, fixed per step, the same for every contender:
the workers' own cost is what is measured), run to the end:

* by one `CheckpointedAgent.execute_run` in one process (the baseline: one commit per step);
* by N `Worker` processes sharing the run through the same URL, for each N in `--workers`.

Printed per backend: wall time, steps per second, speed-up against the single agent (target for
4 workers: >= 2.5x, where 4x is the ceiling), and the coordination cost per step with
`--latency 0` (lease create + claim commit + result commit + release + reload of the run),
against the single agent's cost per step (one commit). The S3 backend is the embedded moto
server over HTTP in this process; the workers are separate processes, as on separate machines.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptfs import AgentRun, CheckpointStore, Step, ToolCall
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.worker import Worker

TARGET_4 = 2.5


def step_latency(step: Step, mean: float) -> float:
    """0.5x to 1.5x the mean, fixed per step: LLM calls vary, and equal latencies would make
    every worker commit at the same instant (a lockstep no real run has)."""
    return mean * (0.5 + (zlib.crc32(step.id.encode()) % 1000) / 1000)


def new_run(url: str, opts: dict[str, Any], n: int) -> str:
    run = AgentRun(run_id=f"papers-{uuid.uuid4().hex[:6]}", goal="read papers")
    for i in range(n):
        run.add_step(Step(id=f"p{i:04d}", title=f"paper {i}"))
    with CheckpointStore(url, opts) as st:
        st.save_run(run)
    return run.run_id


def work(url: str, opts: dict[str, Any], run_id: str, latency: float, wid: str,
         start_at: float) -> int:
    store = CheckpointStore(url, opts)
    worker = Worker(store, worker_id=wid, lease_ttl=10, poll_interval=0.02)

    def executor(step: Step, prior: list[ToolCall]) -> str:
        if latency:
            time.sleep(step_latency(step, latency))
        return f"summary of {step.title}"

    time.sleep(max(0.0, start_at - time.time()))  # all workers start together
    report = worker.work(run_id, executor, idle_timeout=30)
    store.close()
    return len(report.completed)


def single(url: str, opts: dict[str, Any], n: int, latency: float) -> float:
    run_id = new_run(url, opts, n)
    store = CheckpointStore(url, opts)
    agent = CheckpointedAgent(store)
    run = store.load_run(run_id)
    assert run is not None

    def executor(step: Step, prior: list[ToolCall]) -> str:
        if latency:
            time.sleep(step_latency(step, latency))
        return f"summary of {step.title}"

    t0 = time.perf_counter()
    agent.execute_run(run, executor)
    dt = time.perf_counter() - t0
    store.close()
    return dt


def many(url: str, opts: dict[str, Any], n: int, latency: float, workers: int) -> float:
    run_id = new_run(url, opts, n)
    ctx = mp.get_context("spawn")
    start_at = time.time() + 2.0  # time for the interpreters to start and import
    with ctx.Pool(workers) as pool:
        jobs = [pool.apply_async(work, (url, opts, run_id, latency, f"w{i}", start_at))
                for i in range(workers)]
        done = [j.get(timeout=600) for j in jobs]
    dt = time.time() - start_at
    run = CheckpointStore(url, opts).load_run(run_id)
    assert run is not None and run.status == "completed" and sum(done) == n, (done, run and run.status)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--latency", type=float, default=0.5)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--backends", default="local,s3")
    args = ap.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="ckptfs-bench-workers-"))
    server = None
    try:
        for backend in args.backends.split(","):
            if backend == "s3":
                from backends.s3.embedded import EmbeddedS3

                server = EmbeddedS3(bucket="bench-workers").start()
                url, opts = server.url("w"), server.storage_options
            else:
                url, opts = str(tmp / "store"), {}
            base = single(url, opts, args.steps, args.latency)
            rows.append({"backend": backend, "who": "1 agent", "seconds": base, "speedup": 1.0})
            for w in counts:
                dt = many(url, opts, args.steps, args.latency, w)
                rows.append({"backend": backend, "who": f"{w} workers", "seconds": dt,
                             "speedup": base / dt})
            # coordination cost per step: no latency, one worker against one agent
            n0 = max(24, args.steps // 2)
            agent_ms = single(url, opts, n0, 0.0) / n0 * 1000
            worker_ms = many(url, opts, n0, 0.0, 1) / n0 * 1000
            rows.append({"backend": backend, "who": "cost/step, latency 0", "agent_ms": agent_ms,
                         "worker_ms": worker_ms})
            if server is not None:
                server.stop()
                server = None
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.steps} steps of {args.latency * 1000:.0f} ms each")
    print(f"{'backend':8} {'who':24} {'seconds':>8} {'steps/s':>8} {'speed-up':>9}")
    for r in rows:
        if "agent_ms" in r:
            print(f"{r['backend']:8} {r['who']:24} agent {r['agent_ms']:.1f} ms/step, worker "
                  f"{r['worker_ms']:.1f} ms/step ({r['worker_ms'] / r['agent_ms']:.1f}x)")
            continue
        print(f"{r['backend']:8} {r['who']:24} {r['seconds']:8.2f} {args.steps / r['seconds']:8.1f} "
              f"{r['speedup']:8.2f}x")
    fours = [r for r in rows if r.get("who") == "4 workers"]
    ok = all(r["speedup"] >= TARGET_4 for r in fours)
    print(json.dumps({"target_4_workers": TARGET_4, "met": ok,
                      "speedups_4": [round(r["speedup"], 2) for r in fours]}))


if __name__ == "__main__":
    main()
