"""A run restored at a version that only a delta ends at (what a mirror's restore point holds
below its tail of journal records) resumes: the next commit builds on it. It used to be taken
for a base removed by retention, so every commit after such a restore was refused."""

from __future__ import annotations

from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, mirror, restore, verify


def test_a_commit_builds_on_a_version_only_a_delta_ends_at(tmp_path: Path) -> None:
    src, mir, dst = (str(tmp_path / n) for n in ("src", "mirror", "restored"))
    store = CheckpointStore(src, policy=CompactionPolicy(fanout=4, max_plan=64, min_snapshot_bytes=10**9,
                                                         keep_last=0, background=False))
    run = AgentRun(run_id="r", goal="g")
    for i in range(30):
        run.add_step(Step(id=f"s{i:02d}", title="t"))
    store.save_run(run)
    for i in range(16):  # v2..v17: 16 records, merged into deltas; v17 is also a delta end
        s = run.steps[f"s{i:02d}"]
        s.status, s.result = StepStatus.COMPLETED, f"r{i}"
        store.commit(run, [s])
    store.close()
    assert mirror(src, mir).ok
    # a delta ends at 16 (deltas of 4: 0-4, 4-8, ..., then 0-16): restore exactly there
    ends = {int(p.name.split("-")[1][:12]) for p in (Path(mir) / "runs" / "r" / "delta").glob("*.ckpt")}
    assert 16 in ends and not (Path(mir) / "runs" / "r" / "log" / f"{16:012d}.ckpt").exists()
    got = restore(mir, dst, run_id="r", version=16)
    assert got.ok, got.to_dict()
    assert not (Path(dst) / "runs" / "r" / "log" / f"{16:012d}.ckpt").exists()
    again = CheckpointStore(dst)
    resumed = again.load_run("r")
    assert resumed is not None and resumed.completed_count == 15
    step = resumed.steps["s15"]
    step.status, step.result = StepStatus.COMPLETED, "again"
    assert again.commit(resumed, [step]) == 17  # not "its base version 16 was removed by retention"
    again.close()
    fresh = CheckpointStore(dst).load_run("r")
    assert fresh is not None and fresh.completed_count == 16
    assert verify(dst).ok
