"""Mirror and restore of a 10,000-step run over the moto server, beside a plain s3fs copy.

    python benchmarks/mirror_restore.py [--steps 10000] [--repeat 3]

The same files, the same server, the same run: the mirror's first pass against a plain
parallel `s3fs.put` of exactly the objects the mirror holds afterwards; the mirror's second
pass (nothing new) against its first; restore into a fresh directory against a plain
parallel `s3fs.get` of those objects. Each figure is the best of `--repeat` runs, each on a
fresh prefix; a new S3 client is built inside every timed section for both sides.
Targets: first pass <= 1.5x plain up; second pass <= 10% of the first; restore <= 1.5x
plain down.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.s3.embedded import EmbeddedS3  # noqa: E402
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus  # noqa: E402
from ckptfs.replication.mirror import mirror  # noqa: E402
from ckptfs.replication.restore import restore  # noqa: E402

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


def s3fs_client(s3: EmbeddedS3):  # type: ignore[no-untyped-def]
    import s3fs

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

        rows = [
            ("plain s3fs put (same objects)", up, "", ""),
            ("mirror, first pass", first, f"{first / up:.2f}x plain up", "<= 1.50x"),
            ("mirror, second pass (nothing new)", second, f"{second / first:.1%} of first", "<= 10%"),
            ("plain s3fs get (same objects, no fsync)", down, "", ""),
            ("restore (verify, publish + fsync)", rest, f"{rest / down:.2f}x plain down", "<= 1.50x"),
        ]
        print(f"run: {args.steps:,} steps, head version {head:,}, built in {built:.1f}s; mirrored "
              f"point: {len(keys)} objects, {nbytes:,} bytes (best of {args.repeat})")
        print(f"{'operation':<40} {'seconds':>8}  {'ratio':<20} {'target':<8}")
        for name, secs, ratio, target in rows:
            print(f"{name:<40} {secs:>8.3f}  {ratio:<20} {target:<8}")
        print("restore publishes durably (fsync of every file and its directory); the plain get "
              "does not fsync, so the down ratio includes that cost")
        ok = first <= 1.5 * up and second <= 0.10 * first and rest <= 1.5 * down
        print("targets met" if ok else "TARGETS MISSED")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
