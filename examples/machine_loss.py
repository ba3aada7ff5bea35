"""After the paper agent: the machine running it vanishes, and the run goes on elsewhere.

    python examples/machine_loss.py [--every-n 50] [--workdir DIR]

1. The paper agent (examples/papers_agent.py) works on local disk while a MirrorJob copies
   a restore point to the embedded S3 server every `every_n` papers (the agent's progress
   hook calls the job's step trigger; it never waits for an upload).
2. At paper 347 the agent stops (the article's 429) and the machine is lost: its whole
   checkpoint directory is deleted.
3. On a fresh directory ("another machine") `restore` stages the mirror's newest point,
   verifies it and publishes it; the agent resumes there and finishes the run.
4. The story is printed: what was mirrored, what was lost, where the run resumed.

Exit code 0 only if every claim holds. `main()` is importable; it takes a few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from papers_agent import (  # noqa: E402
    GOAL,
    PAPERS,
    RATE_LIMIT_AT,
    SimulatedExtractor,
    build_agent,
    finish_run,
    make_steps,
    step_id,
)

from backends.s3.embedded import EmbeddedS3  # noqa: E402
from ckptfs import CheckpointStore  # noqa: E402
from ckptfs.errors import RunStoppedError  # noqa: E402
from ckptfs.replication.job import MirrorJob  # noqa: E402
from ckptfs.replication.report import MirrorReport  # noqa: E402
from ckptfs.replication.restore import restore  # noqa: E402
from ckptfs.runtime.execution import ProgressEvent  # noqa: E402


def _papers(run: Any) -> set[int]:
    """Paper numbers a run has completed (its steps are paper-NNN, plus bookkeeping steps)."""
    if run is None:
        return set()
    return {int(s.id.split("-")[1]) for s in run.steps.values()
            if s.id.startswith("paper-") and s.status.value == "completed"}


def _calls(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def story(workdir: Path, every_n: int = 50) -> bool:
    """Play machine loss and recovery against an embedded S3 mirror; True if it all holds."""
    workdir.mkdir(parents=True, exist_ok=True)
    machine = workdir / "machine-a"
    elsewhere = workdir / "machine-b"
    for d in (machine, elsewhere):
        shutil.rmtree(d, ignore_errors=True)
    run_id = f"papers-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    with EmbeddedS3(bucket="ckptfs-demo") as s3:
        mirror_url = s3.url(f"mirror-{run_id}")
        passes: list[MirrorReport] = []
        store_url = str(machine / "store")
        with CheckpointStore(store_url) as store:
            job = MirrorJob(store_url, mirror_url, every_n=every_n, dst_options=s3.storage_options,
                            keep_last=2, on_report=passes.append).start()
            trigger = job.step_trigger(every_n)

            def on_progress(ev: ProgressEvent) -> None:
                if ev.kind == "step_completed":
                    trigger(ev.run_id, ev.completed)  # returns at once; a pass runs beside

            agent, executor = build_agent(store, SimulatedExtractor(machine / "calls.txt", RATE_LIMIT_AT),
                                          on_progress)
            run = agent.start_run(GOAL, make_steps(), run_id=run_id)
            with contextlib.suppress(RunStoppedError):  # paper 347: the article's 429; machine A
                agent.execute_run(run, executor)        # is lost right after
            done_on_a = _papers(run)
            # a pass already running finishes; nothing new starts, and no last pass (which a
            # clean exit makes): machine A is lost right here
            job.shutdown(wait=True, final=False)
        calls_a = _calls(machine / "calls.txt")
        shutil.rmtree(machine)  # the machine vanishes with its disk

        mirrored = CheckpointStore(mirror_url, s3.storage_options).load_run(run_id)
        mirrored_done = _papers(mirrored)
        rep = restore(mirror_url, str(elsewhere / "store"), run_id=run_id,
                      src_options=s3.storage_options)
        with CheckpointStore(str(elsewhere / "store")) as store_b:
            restored = store_b.load_run(run_id)
            restored_done = _papers(restored)
            # tool results that reached the mirror are replayed from the log, not called again
            logged = {p for p in range(1, PAPERS + 1)
                      if store_b.get_tool_call_history(run_id, step_id(p))}
        final = finish_run(str(elsewhere / "store"), None, run_id, elsewhere)
        calls_b = _calls(elsewhere / "calls.txt")
    elapsed = time.monotonic() - t0
    copied = sum(p.copied for p in passes)
    nbytes = sum(p.bytes for p in passes)
    points = [r.version for p in passes for r in p.runs if r.status == "mirrored"]
    lost = sorted(done_on_a - restored_done)
    resume_at = min(set(range(1, PAPERS + 1)) - restored_done)
    redone = sorted(set(calls_a) - logged)
    checks = {
        "machine A stopped at the rate limit": max(done_on_a) == RATE_LIMIT_AT - 1,
        "the mirror held a restore point": mirrored is not None and bool(points),
        "restore verified and published it": rep.ok and restored_done == mirrored_done,
        f"lost fewer than {every_n} papers": len(lost) < every_n and restored_done <= done_on_a,
        "machine B resumed right after the mirrored point":
            bool(calls_b) and calls_b[0] == min(set(range(1, PAPERS + 1)) - logged),
        f"all {PAPERS} papers completed": _papers(final) == set(range(1, PAPERS + 1))
        and final.status == "completed",
        "only papers whose extraction missed the mirror were extracted twice":
            sorted(set(calls_a) & set(calls_b)) == redone and len(redone) <= len(lost),
    }
    print(f"Run {run_id} on machine A, mirrored to {mirror_url} (embedded S3) every {every_n} papers.")
    print(f"  Mirror: {len(passes)} passes, restore points at versions {points}, {copied} objects, "
          f"{nbytes:,} bytes; each pass ran beside the agent, never in its way.")
    print(f"  Machine A: {len(done_on_a)} papers done, then stopped at paper {RATE_LIMIT_AT}; "
          f"its disk is gone.")
    print(f"  Restore on machine B: {rep.runs[0].status if rep.runs else 'nothing'}, "
          f"version {rep.runs[0].version if rep.runs else '?'} ({len(restored_done)} papers done); "
          f"lost {len(lost)} papers ({lost[0] if lost else '-'}-{lost[-1] if lost else '-'}), "
          "those done after the last mirrored point.")
    print(f"  Machine B: resumed at paper {resume_at} ({len(logged - restored_done)} extraction(s) "
          f"replayed from the mirrored tool log), {len(redone)} papers extracted again, finished all "
          f"{len(_papers(final))} papers, status {final.status}. Took {elapsed:.1f}s.")
    for claim, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {claim}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--every-n", type=int, default=50, help="papers between restore points")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    if args.workdir:
        return 0 if story(Path(args.workdir), args.every_n) else 1
    with tempfile.TemporaryDirectory(prefix="ckptfs-machine-loss-") as tmp:
        return 0 if story(Path(tmp), args.every_n) else 1


if __name__ == "__main__":
    sys.exit(main())
