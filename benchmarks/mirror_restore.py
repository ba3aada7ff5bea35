"""Mirror and restore of a 10,000-step run over the moto server, beside a plain s3fs copy.

    python benchmarks/mirror_restore.py [--steps 10000] [--repeat 3] [--runs 20] [--latency 0.02]

The same files, the same server, the same run: the mirror's first pass against a plain
parallel `s3fs.put` of exactly the objects the mirror holds afterwards; the mirror's second
pass (nothing new) against its first; restore into a fresh directory against a plain
parallel `s3fs.get` of those objects. Each figure is the best of `--repeat` runs, each on a
fresh prefix; a new S3 client is built inside every timed section for both sides.
Targets: first pass <= 1.5x plain up; second pass <= 10% of the first; restore <= 1.5x
plain down.

Many runs: `--runs` small runs (12 steps each, with tool calls and artifacts), mirrored in one
pass through a loopback proxy that holds every request `--latency` seconds, as a distant
bucket does, against a plain parallel `s3fs.put` of the same objects through the same proxy.
A mirror copies each run's records one at a time, in chain order (so the mirror holds a whole
point at every moment), and several runs at once; run by run, 20 runs took 5.4 s where they
now take 2.3 s (2026-12-07). Target: <= 1.5x plain up, as for one run.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import s3fs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.s3.embedded import EmbeddedS3  # noqa: E402
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall  # noqa: E402
from ckptfs.replication.mirror import mirror  # noqa: E402
from ckptfs.replication.restore import restore  # noqa: E402
from tests._fault_proxy import Fault, FaultProxy  # noqa: E402

RUN = "bench-run"


def build_run(url: str, steps: int) -> int:
    """A run of `steps` completed steps, one commit each; every 100th result is an artifact."""
    with CheckpointStore(url, storage_options={"fsync": False}) as store:
        run = AgentRun(run_id=RUN, goal=f"{steps} steps")
        store.commit(run)
        for i in range(steps):
            s = Step(id=f"s{i:05d}", title=f"step {i}", dependencies=[f"s{i - 1:05d}"] if i else [])
            run.add_step(s)
            s.status = StepStatus.COMPLETED
            s.result = (f"result of step {i}: " + "lorem ipsum " * (7000 if i % 100 == 0 else 4))
            store.commit(run, [s])
        store.flush()
        return store.list_versions(RUN)[-1]


def build_small_runs(url: str, runs: int, steps: int = 12) -> None:
    """`runs` runs of `steps` steps, a tool call logged per step; every 3rd call's result and
    every 4th step's output large enough to be an artifact (shared across runs: same bytes)."""
    with CheckpointStore(url, storage_options={"fsync": False}, artifact_threshold=1024) as store:
        for r in range(runs):
            run_id = f"run-{r:03d}"
            run = AgentRun(run_id=run_id, goal=f"read {steps} papers")
            for i in range(steps):
                run.add_step(Step(id=f"p{i:03d}", title=f"paper {i}",
                                  dependencies=[f"p{i - 1:03d}"] if i else []))
            store.commit(run)
            for i in range(steps):
                s = run.steps[f"p{i:03d}"]
                store.log_tool_call(run_id, s.id, ToolCall(
                    id=f"t{i}", tool_name="fetch", arguments={"i": i},
                    result="x" * 3000 if i % 3 == 0 else "ok", timestamp=0.0))
                s.status = StepStatus.COMPLETED
                s.result = f"findings of paper {i} in {run_id}; " * (150 if i % 4 == 0 else 2)
                store.commit(run, [s])
        store.flush()


def many_runs(tmp: Path, runs: int, latency: float, repeat: int) -> tuple[int, float, float]:
    """(objects, plain put seconds, mirror first pass seconds), best of `repeat` each."""
    src = str(tmp / "many")
    build_small_runs(src, runs)
    with EmbeddedS3(bucket="ckptfs-bench-many") as s3, \
            FaultProxy(s3.endpoint, lambda _req: Fault(delay=latency)) as proxy:
        opts = {**s3.storage_options,
                "client_kwargs": {**s3.storage_options["client_kwargs"], "endpoint_url": proxy.endpoint}}
        probe = s3.url(f"probe-{uuid.uuid4().hex[:6]}")
        rep = mirror(src, probe, latest=True, dst_options=opts)
        assert rep.ok and len(rep.runs) == runs, rep.missing
        fs = s3fs.S3FileSystem(use_listings_cache=False, **opts)
        prefix = probe.removeprefix("s3://")
        keys = sorted(k[len(prefix) + 1:] for k in fs.find(prefix))

        def plain_up() -> None:
            c = s3fs.S3FileSystem(use_listings_cache=False, **opts)
            p = f"ckptfs-bench-many/plain-{uuid.uuid4().hex[:6]}"
            c.put([f"{src}/{k}" for k in keys], [f"{p}/{k}" for k in keys])

        def mirror_first() -> None:
            r = mirror(src, s3.url(f"m-{uuid.uuid4().hex[:6]}"), latest=True, dst_options=opts)
            assert r.ok and r.copied == len(keys), (r.copied, len(keys))

        return len(keys), best(plain_up, repeat), best(mirror_first, repeat)


def s3fs_client(s3: EmbeddedS3):  # type: ignore[no-untyped-def]
    # s3fs's defaults (its instance cache on), as ckptfs's S3Storage uses them: both sides
    # reuse a client within the process, so the ratio compares copying, not client set-up.
    return s3fs.S3FileSystem(use_listings_cache=False, **s3.storage_options)


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20, help="small runs for the many-runs pass")
    ap.add_argument("--latency", type=float, default=0.02, help="seconds each request is held there")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="ckptfs-bench-mirror-"))
    try:
        src = str(tmp / "src")
        t0 = time.perf_counter()
        head = build_run(src, args.steps)
        built = time.perf_counter() - t0
        with EmbeddedS3(bucket="ckptfs-bench") as s3:
            opts = s3.storage_options
            # what the mirror holds after a pass: the object set both sides move
            probe = s3.url(f"probe-{uuid.uuid4().hex[:6]}")
            rep = mirror(src, probe, latest=True, dst_options=opts)
            assert rep.ok, rep.missing
            fs = s3fs_client(s3)
            prefix = probe.removeprefix("s3://")
            keys = sorted(k[len(prefix) + 1:] for k in fs.find(prefix))
            nbytes = sum(fs.info(f"{prefix}/{k}")["size"] for k in keys)

            prefixes: list[str] = []

            def plain_up() -> None:
                p = f"ckptfs-bench/plain-{uuid.uuid4().hex[:6]}"
                prefixes.append(p)
                c = s3fs_client(s3)
                c.put([f"{src}/{k}" for k in keys], [f"{p}/{k}" for k in keys])

            mirrors: list[str] = []

            def mirror_first() -> None:
                url = s3.url(f"m-{uuid.uuid4().hex[:6]}")
                mirrors.append(url)
                r = mirror(src, url, latest=True, dst_options=opts)
                assert r.ok and r.copied == len(keys), (r.copied, len(keys))

            def mirror_again() -> None:
                r = mirror(src, mirrors[-1], latest=True, dst_options=opts)
                assert r.ok and r.copied == 0 and r.runs[0].status == "up-to-date"

            def plain_down() -> None:
                d = tmp / f"down-{uuid.uuid4().hex[:6]}"
                c = s3fs_client(s3)
                c.get([f"{prefixes[-1]}/{k}" for k in keys], [str(d / k) for k in keys])

            def restore_down() -> None:
                d = tmp / f"restore-{uuid.uuid4().hex[:6]}"
                r = restore(mirrors[-1], str(d), src_options=opts)
                assert r.ok and r.runs[0].version == head

            up = best(plain_up, args.repeat)
            first = best(mirror_first, args.repeat)
            second = best(mirror_again, args.repeat)
            down = best(plain_down, args.repeat)
            rest = best(restore_down, args.repeat)
            got = CheckpointStore(mirrors[-1], opts).load_run(RUN)
            assert got is not None and got.completed_count == args.steps
        many_objects, many_up, many_first = many_runs(tmp, args.runs, args.latency, args.repeat)

        rows = [
            ("plain s3fs put (same objects)", up, "", ""),
            ("mirror, first pass", first, f"{first / up:.2f}x plain up", "<= 1.50x"),
            ("mirror, second pass (nothing new)", second, f"{second / first:.1%} of first", "<= 10%"),
            ("plain s3fs get (same objects, no fsync)", down, "", ""),
            ("restore (verify, publish + fsync)", rest, f"{rest / down:.2f}x plain down", "<= 1.50x"),
            (f"plain s3fs put, {args.runs} runs' objects", many_up, "", ""),
            (f"mirror of {args.runs} runs, first pass", many_first, f"{many_first / many_up:.2f}x plain up",
             "<= 1.50x"),
        ]
        print(f"run: {args.steps:,} steps, head version {head:,}, built in {built:.1f}s; mirrored "
              f"point: {len(keys)} objects, {nbytes:,} bytes (best of {args.repeat})")
        print(f"{'operation':<40} {'seconds':>8}  {'ratio':<20} {'target':<8}")
        for name, secs, ratio, target in rows:
            print(f"{name:<40} {secs:>8.3f}  {ratio:<20} {target:<8}")
        print(f"{args.runs} runs: {many_objects} objects, every request held {args.latency * 1e3:.0f} ms "
              "at a loopback proxy (both sides)")
        print("restore publishes durably (fsync of every file and its directory); the plain get "
              "does not fsync, so the down ratio includes that cost")
        ok = (first <= 1.5 * up and second <= 0.10 * first and rest <= 1.5 * down
              and many_first <= 1.5 * many_up)
        print("targets met" if ok else "TARGETS MISSED")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
