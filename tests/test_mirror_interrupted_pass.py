"""A mirror pass killed midway leaves a hole; the next pass fills it, due or not.

Records are copied in parallel, so a pass SIGKILLed while one record's PUT was in flight leaves
the records above it in the mirror and a hole below them: `verify` of the mirror says
"missing". Found by a hostile review (2026-12-07): every later pass said "not-due, 3 new
version(s)", exit 0, and a finished run never became due again, so the mirror stayed red for
the nightly `verify` for good (only --latest or a smaller --every-n repaired it).

The hole is made as the kill leaves it (the newer records copied, one below them not), then the
real `ckptfs` runs: mirror, verify the mirror, restore, verify, as an operator chains them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus

CLI = str(Path(sys.executable).parent / "ckptfs")


def ckptfs(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_a_hole_left_by_a_killed_pass_is_filled_by_the_next_one_not_due_or_not(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "mirror"
    no_compaction = CompactionPolicy(background=False, keep_last=0, min_snapshot_bytes=10**9)
    with CheckpointStore(str(src), policy=no_compaction) as store:
        run = AgentRun(run_id="papers", goal="g")
        for i in range(8):
            run.add_step(Step(id=f"p{i}", title=f"paper {i}"))
        store.save_run(run)
        for i in range(4):
            step = run.steps[f"p{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"summary {i}"
            store.commit(run, [step])
    assert ckptfs("mirror", src, dst, "--once", "--json").returncode == 0  # the mirror at v5
    with CheckpointStore(str(src), policy=no_compaction) as store:
        run = store.load_run("papers")
        assert run is not None
        for i in range(4, 7):  # v6, v7, v8: the run finished here, 3 versions past the mirror
            step = run.steps[f"p{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"summary {i}"
            store.commit(run, [step])
    src_log, dst_log = src / "runs" / "papers" / "log", dst / "runs" / "papers" / "log"
    for version in (7, 8):  # the killed pass: v7 and v8 arrived, v6's PUT was in flight
        name = f"{version:012d}.ckpt"
        (dst_log / name).write_bytes((src_log / name).read_bytes())
    assert not (dst_log / f"{6:012d}.ckpt").exists()
    assert ckptfs("verify", dst).returncode == 1  # the hole: "missing"

    passed = ckptfs("mirror", src, dst, "--once", "--every-n", "10", "--json")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    doc = json.loads(passed.stdout)
    (result,) = [r for r in doc["runs"] if r["run_id"] == "papers"]
    assert result["status"] == "mirrored" and result["version"] == 8, result  # was not-due, v5
    checked = ckptfs("verify", dst, "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stdout
    restored = tmp_path / "restored"
    assert ckptfs("restore", dst, restored).returncode == 0
    assert ckptfs("verify", restored).returncode == 0
    with CheckpointStore(str(restored)) as back:
        again = back.load_run("papers")
        assert again is not None
        assert [s.id for s in again.steps.values() if s.status == StepStatus.COMPLETED] == [
            f"p{i}" for i in range(7)]
