"""Seed API cost: `save_run(run)` after each step, at 200 and 5,000 steps, beside its floor.

The floor is the same commit made through the hot path, `commit(run, [changed_step])`, on the
same store and run, interleaved with the `save_run` calls so both see the same machine state
(background compaction, other engineers' jobs on a shared box). Issue 12's targets: `save_run`
p50 grows at most 1.5x from 200 to 5,000 steps, and stays within 3x of the floor.

    python benchmarks/seed_save_run.py [--sizes 200,5000] [--rounds 60] [--store DIR|memory]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus


def measure(url: str, n: int, rounds: int) -> tuple[float, float]:
    """p50 seconds of (save_run, commit of the changed step) at `n` steps, interleaved."""
    store = CheckpointStore(url)
    try:
        run = AgentRun(run_id=f"bench-{n}", goal="seed save_run cost")
        for i in range(n):
            run.add_step(Step(id=f"s{i:05d}", title=f"step {i}", description="work " * 8))
        store.save_run(run)
        ids = list(run.steps)
        save: list[float] = []
        floor: list[float] = []
        for r in range(rounds):
            a, b = run.steps[ids[2 * r]], run.steps[ids[2 * r + 1]]
            a.status, a.result, a.completed_at = StepStatus.COMPLETED, f"done {r} " * 20, time.time()
            t0 = time.perf_counter()
            store.save_run(run)
            save.append(time.perf_counter() - t0)
            b.status, b.result, b.completed_at = StepStatus.COMPLETED, f"done {r} " * 20, time.time()
            t0 = time.perf_counter()
            store.commit(run, [b])
            floor.append(time.perf_counter() - t0)
        store.flush(timeout=60)
        return statistics.median(save), statistics.median(floor)
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="200,5000")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--store", default="", help="a directory (default: a temporary one) or 'memory'")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="ckptfs-seed-bench-") as tmp:
        rows = []
        for n in sizes:
            url = (f"memory://seed-bench-{n}" if args.store == "memory"
                   else str(Path(args.store or tmp) / f"n{n}"))
            save, floor = measure(url, n, args.rounds)
            rows.append((n, save, floor))
    base = rows[0][1]
    print(f"{'steps':>7} {'save_run p50':>13} {'floor p50':>10} {'save/floor':>11} "
          f"{'growth':>7}   targets: growth <= 1.5x, save/floor <= 3x")
    for n, save, floor in rows:
        ratio, growth = save / floor, save / base
        ok = "ok" if ratio <= 3 and growth <= 1.5 else "MISSED"
        print(f"{n:>7} {save * 1e3:>10.2f} ms {floor * 1e3:>7.2f} ms {ratio:>10.1f}x "
              f"{growth:>6.2f}x   {ok}")


if __name__ == "__main__":
    main()
