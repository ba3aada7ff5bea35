"""A mirror pass killed midway leaves a hole; the next pass fills it, due or not.

Records were copied in parallel (until 2026-12-07; now in chain order, tests/test_mirror.py),
so a pass SIGKILLed while one record's PUT was in flight left the records above it in the
mirror and a hole below them: `verify` of the mirror says "missing". A mirror written then may
still hold one. Found by a hostile review (2026-12-07): every later pass said "not-due, 3 new
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


def _commit_steps(root: Path, policy: CompactionPolicy, ids: range, tag: str) -> None:
    with CheckpointStore(str(root), policy=policy) as store:
        run = store.load_run("papers")
        assert run is not None
        for i in ids:
            step = run.steps[f"p{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"{tag} summary {i}"
            store.commit(run, [step])


def test_a_mirror_holding_another_machines_leftovers_is_a_conflict_on_every_pass(tmp_path: Path) -> None:
    """Machine A's mirror pass was killed mid-copy and A was lost: the mirror holds A's v7 and
    v8 above a hole at v6. B restored v5, went on to v10 and mirrors back. Before: B's first
    pass said conflict but had copied v6, v9 and v10 in among A's files, and the next pass said
    "up-to-date 10", exit 0, while a restore gave back v6. Now nothing is copied beside another
    lineage's records, and every pass says conflict (exit 1) until an operator sorts it out."""
    no_compaction = CompactionPolicy(background=False, keep_last=0, min_snapshot_bytes=10**9)
    a, b, dst = tmp_path / "a", tmp_path / "b", tmp_path / "mirror"
    with CheckpointStore(str(a), policy=no_compaction) as store:
        run = AgentRun(run_id="papers", goal="g")
        for i in range(10):
            run.add_step(Step(id=f"p{i}", title=f"paper {i}"))
        store.save_run(run)
    _commit_steps(a, no_compaction, range(4), "A")  # v5
    assert ckptfs("mirror", a, dst, "--once").returncode == 0
    assert ckptfs("restore", dst, b).returncode == 0  # machine B, from the mirror at v5
    _commit_steps(a, no_compaction, range(4, 7), "A")  # A goes on to v8 ...
    a_log, dst_log = a / "runs" / "papers" / "log", dst / "runs" / "papers" / "log"
    for version in (7, 8):  # ... and its killed pass left v7 and v8, not v6; then A was lost
        name = f"{version:012d}.ckpt"
        (dst_log / name).write_bytes((a_log / name).read_bytes())
    _commit_steps(b, no_compaction, range(4, 9), "B")  # B goes on to v10
    before = sorted(p.name for p in dst_log.iterdir())
    for _ in range(2):
        passed = ckptfs("mirror", b, dst, "--once", "--latest", "--json")
        (result,) = [r for r in json.loads(passed.stdout)["runs"] if r["run_id"] == "papers"]
        assert passed.returncode == 1 and result["status"] == "conflict", result  # 2nd was up-to-date
        assert sorted(p.name for p in dst_log.iterdir()) == before  # nothing of B's mixed in
    restored = tmp_path / "c"
    assert ckptfs("restore", dst, restored).returncode == 0
    with CheckpointStore(str(restored)) as back:
        again = back.load_run("papers")
        assert again is not None and back.last_load is not None and back.last_load.version == 5


def test_a_mirror_stopped_in_its_artifacts_phase_holds_nothing_to_restore(tmp_path: Path) -> None:
    """A first pass killed while copying artifacts leaves artifacts only: `restore` of it said
    "holds no runs", exit 1, where `verify` and `runs` said 0, and a recovery script that
    re-runs a restore on exit 1 did so forever. Nothing to restore is bad input, exit 2."""
    src, dst = tmp_path / "src", tmp_path / "mirror"
    with CheckpointStore(str(src), artifact_threshold=1024) as store:
        run = AgentRun(run_id="papers", goal="g")
        run.add_step(Step(id="p0", title="paper 0"))
        store.save_run(run)
        step = run.steps["p0"]
        step.status, step.result = StepStatus.COMPLETED, "x" * 5000  # over the threshold: an artifact
        store.commit(run, [step])
    assert ckptfs("mirror", src, dst, "--once").returncode == 0
    for path in sorted((dst / "runs").rglob("*"), reverse=True):  # as if the records never came
        path.unlink() if path.is_file() else path.rmdir()
    (dst / "runs").rmdir()
    assert any(p.is_file() for p in (dst / "artifacts").rglob("*"))  # what the pass did copy
    done = ckptfs("restore", dst, tmp_path / "restored", "--json")
    assert done.returncode == 2, (done.stdout, done.stderr)  # was 1
    doc = json.loads(done.stdout)
    assert doc["error"]["code"] == "empty" and "holds no runs to restore" in doc["error"]["message"]
    assert not (tmp_path / "restored").exists()
