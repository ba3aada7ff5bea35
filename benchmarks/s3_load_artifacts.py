"""Loading a run whose values are artifacts, from S3 behind a link of given latency.

A resumed agent loads its run with every large value back in place, one GET per artifact.
The loader fetches them ARTIFACTS_AHEAD at a time; this prints that beside fetching them in turn
(ARTIFACTS_AHEAD = 1, the loader before), in one run, through a loopback proxy that holds every
request for the latency given, in front of the embedded moto server.

    .venv/bin/python benchmarks/s3_load_artifacts.py [--artifacts 300] [--latency-ms 20]

Target: together at least 3x faster than in turn at 20 ms (exit 1 if not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fault_proxy import Fault, FaultProxy

import ckptfs.store.loader as loader
from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus

TARGET = 3.0
POLICY = CompactionPolicy(background=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=int, default=300)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    together = loader.ARTIFACTS_AHEAD
    with EmbeddedS3(bucket="ckptfs-bench-artifacts") as s3:
        url, opts = s3.url("load"), s3.storage_options
        store = CheckpointStore(url, storage_options=opts, artifact_threshold=1024, policy=POLICY)
        run = AgentRun(run_id="papers", goal="summarise")
        for i in range(args.artifacts):
            run.add_step(Step(id=f"paper-{i}", title=f"paper {i}"))
        store.save_run(run)
        for i in range(args.artifacts):
            step = run.steps[f"paper-{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"summary {i}: " + "finding " * 400
            store.commit(run, [step])
        store.close()
        hold = args.latency_ms / 1000
        times: dict[int, list[float]] = {1: [], together: []}
        with FaultProxy(s3.endpoint, lambda _req: Fault(delay=hold)) as proxy:
            through = {**opts, "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": s3.region}}
            for _ in range(args.reps):
                for ahead in (1, together):  # interleaved: the machine's noise hits both
                    loader.ARTIFACTS_AHEAD = ahead
                    st = CheckpointStore(url, storage_options=through, policy=POLICY)
                    t0 = time.perf_counter()
                    got = st.load_run("papers")
                    times[ahead].append(time.perf_counter() - t0)
                    st.close()
                    assert got is not None and all(s.result for s in got.steps.values())
        loader.ARTIFACTS_AHEAD = together
    seq, par = statistics.median(times[1]), statistics.median(times[together])
    ratio = seq / par
    print(f"load of a run with {args.artifacts} artifacts, {args.latency_ms:g} ms a request, "
          f"median of {args.reps}")
    print(f"{'fetched':>24} | {'load s':>7}")
    print(f"{'in turn (1 at a time)':>24} | {seq:7.2f}")
    print(f"{f'together ({together} at a time)':>24} | {par:7.2f}")
    met = ratio >= TARGET
    verdict = "met    " if met else "NOT met"
    print(f"  {verdict}  together / in turn: {ratio:.1f}x faster (target >= {TARGET:g}x)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
