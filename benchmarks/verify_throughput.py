"""Throughput of `verify --data` beside the floor of plain tools over the same files.

Builds a ~200 MB store on local disk (incompressible artifacts, mostly, plus runs with
snapshots, deltas and journal records), then times, in one run on one machine:
  floor:  `zstd -t` over every .ckpt file + `sha256sum` over every file
  verify: ckptfs.maintenance.verify.verify(level="data") (decode, chain, replay, hash artifacts)
and prints MB/s for each and the ratio (target: verify >= 0.5x the floor).

    .venv/bin/python benchmarks/verify_throughput.py [--mb 200] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall
from ckptfs.maintenance.verify import verify


def build(root: Path, mb: int) -> None:
    policy = CompactionPolicy(fanout=4, max_plan=8, min_snapshot_bytes=64 * 1024, keep_last=3,
                              background=False)
    store = CheckpointStore(str(root), policy=policy, artifact_threshold=16 * 1024)
    art_bytes = int(mb * 0.9) * 1024 * 1024
    size = 2 * 1024 * 1024
    for _ in range(art_bytes // size):
        store.put_artifact(os.urandom(size))
    for r in range(8):
        run = AgentRun(run_id=f"run-{r}", goal="benchmark")
        prev = None
        for i in range(60):
            st = Step(id=f"s{i}", title=f"step {i}", dependencies=[prev] if prev else [])
            run.add_step(st)
            st.status = StepStatus.COMPLETED
            st.result = os.urandom(12 * 1024).hex() if i % 3 == 0 else f"done {i} " + "x" * 800
            store.commit(run, [st])
            store.log_tool_call(run.run_id, st.id, ToolCall(tool_name="t", arguments={"i": i},
                                                           result=os.urandom(300).hex()))
            prev = st.id
    store.close()


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="ckptfs-verify-bench-"))
    root = tmp / "store"
    if root.exists():
        shutil.rmtree(root)
    t_build = timed(lambda: build(root, args.mb))
    all_files = files(root)
    ckpt = [str(p) for p in all_files if p.suffix == ".ckpt"]
    total = sum(p.stat().st_size for p in all_files)
    art = sum(p.stat().st_size for p in all_files if "artifacts" in p.parts)

    def floor() -> None:
        for i in range(0, len(ckpt), 500):
            subprocess.run(["zstd", "-q", "-t", *ckpt[i : i + 500]], check=True)
        names = [str(p) for p in all_files]
        for i in range(0, len(names), 500):
            subprocess.run(["sha256sum", *names[i : i + 500]], check=True, stdout=subprocess.DEVNULL)

    floor()  # warm the page cache for both contenders alike
    t_floor = min(timed(floor) for _ in range(2))
    reports = []
    t_verify = min(timed(lambda: reports.append(verify(str(root), level="data"))) for _ in range(2))
    report = reports[-1]
    assert report.ok, [f.to_dict() for f in report.problems[:5]]
    mbs = total / 1e6
    print(f"store: {mbs:.1f} MB in {len(all_files)} files ({len(ckpt)} run files, "
          f"{art / 1e6:.1f} MB artifacts); built in {t_build:.1f}s; {os.cpu_count()} CPU(s)")
    print(f"{'what':<44}{'seconds':>10}{'MB/s':>10}{'ratio':>8}")
    floor_name = "floor: zstd -t (.ckpt) + sha256sum (all)"
    print(f"{floor_name:<44}{t_floor:>10.2f}{mbs / t_floor:>10.1f}{1.0:>8.2f}")
    print(f"{'ckptfs verify --data':<44}{t_verify:>10.2f}{mbs / t_verify:>10.1f}{t_floor / t_verify:>8.2f}")
    print(f"target: verify >= 0.5x floor -> {'met' if t_floor / t_verify >= 0.5 else 'NOT met'}")
    if not args.dir:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
