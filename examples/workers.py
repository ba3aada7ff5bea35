"""The papers, read by three machines at once through one bucket; one machine dies mid-paper.

    python examples/workers.py [--papers 60] [--latency 0.05] [--workers 3]

1. A run of `--papers` extraction steps is saved to the embedded S3 server.
2. `--workers` worker processes (three "machines") start on it: each takes a ready paper under
   a lease, calls the (simulated, paid) extraction tool through the idempotent runner and
   commits the paper under the lease's generation.
3. When a third of the papers are done, one machine is SIGKILLed in the middle of a paper.
4. The others finish the run: after the lease's ttl one of them takes the dead machine's
   paper over. Every paper is done once; the only call paid twice, if any, is the one the dead
   machine had in flight (its result was never recorded).

Exit code 0 only if every claim holds. `main()` is importable; it takes about 15 seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.s3.embedded import EmbeddedS3  # noqa: E402
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall, Worker  # noqa: E402

RUN_ID = "papers-shared"
LEASE_TTL = 2.0  # short, so the demo's takeover comes quickly; the default is 30 s


def work(name: str, url: str, options: dict[str, Any], calls: Path, latency: float,
         start_at: float) -> int:
    """One machine: work on the run until nothing is left; print what it did as JSON."""
    time.sleep(max(0.0, start_at - time.time()))  # the machines start together
    store = CheckpointStore(url, options)
    worker = Worker(store, worker_id=name, lease_ttl=LEASE_TTL, poll_interval=0.1)

    def extract(paper: int) -> dict[str, Any]:
        with calls.open("a") as f:  # the bill: one line per real call, written as it starts
            f.write(f"{paper} {name}\n")
        time.sleep(latency)
        return {"paper": paper, "findings": f"finding of paper {paper}"}

    def executor(step: Step, prior: list[ToolCall]) -> str:
        paper = int(step.id.split("-")[1])
        out = worker.tools().run("extract_findings", {"paper": paper}, lambda **_: extract(paper))
        return f"{out['findings']} (read by {name})"

    report = worker.work(RUN_ID, executor, idle_timeout=120)
    print(json.dumps({"worker": name, "completed": len(report.completed), "lost": report.lost}))
    store.close()
    return 0


def _bill(calls: Path) -> list[tuple[int, str]]:
    if not calls.exists():
        return []
    return [(int(p), w) for p, w in (line.split() for line in calls.read_text().splitlines())]


def main(papers: int = 60, latency: float = 0.05, workers: int = 3) -> int:
    # the bill of real calls lives beside the run only while the demo does (the run itself is
    # in the embedded S3 server, gone at exit too): nothing is left in the temp directory
    with tempfile.TemporaryDirectory(prefix="ckptfs-workers-", ignore_cleanup_errors=True) as tmp:
        return _demo(Path(tmp) / "calls.txt", papers, latency, workers)


def _demo(calls: Path, papers: int, latency: float, workers: int) -> int:
    with EmbeddedS3(bucket="ckptfs-demo") as s3:
        url, options = s3.url("shared"), s3.storage_options
        run = AgentRun(run_id=RUN_ID, goal=f"Extract key findings from {papers} papers, many hands")
        for n in range(1, papers + 1):
            run.add_step(Step(id=f"paper-{n:03d}", title=f"Extract findings from paper {n}"))
        with CheckpointStore(url, options) as st:
            st.save_run(run)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        names = [f"machine-{chr(ord('a') + i)}" for i in range(workers)]
        start_at = time.time() + 3.0  # time for the interpreters to start
        procs = {n: subprocess.Popen([sys.executable, __file__, "--worker", n, "--url", url,
                                      "--options", json.dumps(options), "--calls", str(calls),
                                      "--latency", str(latency), "--start-at", str(start_at)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for n in names}
        victim = names[-1]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a third done, and the victim mid-paper
            bill = _bill(calls)
            if len(bill) >= papers // 3 and bill[-1][1] == victim:
                break
            if len(bill) >= papers:
                print("the run ended before the victim could be caught mid-paper; try more papers",
                      file=sys.stderr)
                break
            time.sleep(0.002)
        procs[victim].send_signal(signal.SIGKILL)
        killed_at = time.time()
        in_flight = [p for p, w in _bill(calls) if w == victim][-1]
        outs: dict[str, Any] = {}
        for n, p in procs.items():
            out, err = p.communicate(timeout=300)
            if n != victim:
                if p.returncode != 0:
                    print(f"{n} failed:\n{err}", file=sys.stderr)
                    return 1
                outs[n] = json.loads(out.strip().splitlines()[-1])
        final = CheckpointStore(url, options).load_run(RUN_ID)
    bill = _bill(calls)
    paid = collections.Counter(p for p, _ in bill)
    twice = sorted(p for p, c in paid.items() if c > 1)
    taken = final.steps[f"paper-{in_flight:03d}"] if final is not None else None
    print(f"{papers} papers, {workers} machines sharing s3://ckptfs-demo/shared (embedded S3), "
          f"lease ttl {LEASE_TTL:.0f} s")
    for n in names:
        if n == victim:
            done = len([p for p, w in bill if w == n]) - 1
            print(f"  {n}: SIGKILLed after ~{done} papers, in the middle of paper {in_flight}")
        else:
            print(f"  {n}: completed {outs[n]['completed']} papers")
    if taken is not None:
        print(f"  paper {in_flight}: taken over (lease generation {taken.lease_generation}, attempt "
              f"{taken.attempt_count}); {taken.result}")
    print(f"  real extraction calls: {len(bill)} for {papers} papers; paid twice: {twice or 'none'}; "
          f"run {final.status if final else '?'} {time.time() - killed_at:.1f} s after the kill")
    claims = [
        ("the run completed", final is not None and final.status == "completed"),
        ("every paper is completed", final is not None and all(
            s.status == StepStatus.COMPLETED for s in final.steps.values())),
        ("the survivors did the rest", sum(o["completed"] for o in outs.values()) >= papers - len(
            [p for p, w in bill if w == victim])),
        ("the dead machine's paper was taken over", taken is not None and taken.lease_generation >= 2),
        ("no call paid twice but the one in flight at the kill", set(twice) <= {in_flight}),
    ]
    for claim, ok in claims:
        print(f"  [{'ok' if ok else 'FAILED'}] {claim}")
    return 0 if all(ok for _, ok in claims) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=60)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per extraction call")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--calls", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        sys.exit(work(a.worker, a.url, json.loads(a.options), Path(a.calls), a.latency, a.start_at))
    if a.workers < 2 or a.papers < 6:
        ap.error("--workers must be >= 2 and --papers >= 6 (one machine dies)")
    sys.exit(main(a.papers, a.latency, a.workers))
