"""`ckptfs versions` on a run retention has pruned: the oldest kept snapshot's journal record is
gone, and the version must still say its status and progress (from the snapshot's own header)."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_commands import cli

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus


def _write_run(root: Path, steps: int, keep_last: int) -> None:
    """Run `papers`: saved, then saved again as each of its steps completes (v1..v{steps + 1}),
    with snapshots every few versions and retention keeping `keep_last` (0: none)."""
    policy = CompactionPolicy(fanout=4, max_plan=6, min_snapshot_bytes=1500, keep_last=keep_last,
                              background=False)
    store = CheckpointStore(str(root), policy=policy)
    run = AgentRun(run_id="papers", goal=f"summarise {steps} papers")
    for i in range(steps):
        run.add_step(Step(id=f"p{i}", title=f"paper {i}"))
    store.save_run(run)
    for i in range(steps):
        step = run.steps[f"p{i}"]
        step.status, step.result = StepStatus.COMPLETED, "x" * 300 + str(i)
        store.save_run(run)
    store.close()


def test_a_version_left_only_as_a_snapshot_keeps_its_status(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write_run(root, 40, keep_last=1)
    snaps = sorted(int(p.stem) for p in (root / "runs" / "papers" / "snap").iterdir())
    logs = {int(p.stem) for p in (root / "runs" / "papers" / "log").iterdir()}
    only_snap = [v for v in snaps if v not in logs]
    assert only_snap, f"retention kept every journal record (snapshots {snaps}); nothing to test"
    code, out, err = cli("versions", str(root), "papers", "--json")
    assert code == 0, err
    rows = {v["version"]: v for v in json.loads(out)["versions"]}
    for v in only_snap:
        assert rows[v]["status"] == "running", rows[v]
        assert rows[v]["completed"] == v - 1 and rows[v]["total"] == 40, rows[v]
    code, out, _ = cli("versions", str(root), "papers")
    line = next(x for x in out.splitlines() if x.split()[:2] == [str(only_snap[0]), "snap"])
    assert "running" in line and f"{only_snap[0] - 1}/40" in line, line


def test_a_store_that_keeps_no_fences_lists_none(tmp_path: Path) -> None:
    """Local disk deletes pruned journal records at once: records below the oldest snapshot of
    a run retention never pruned are history, not fences (v1 and v2 were shown '(fence)')."""
    root = tmp_path / "store"
    _write_run(root, 12, keep_last=0)
    snaps = sorted(int(p.stem) for p in (root / "runs" / "papers" / "snap").iterdir())
    assert snaps and snaps[0] > 1, snaps  # journal records below the oldest snapshot exist
    code, out, err = cli("versions", str(root), "papers", "--json")
    assert code == 0 and json.loads(out)["fences"] == [], out + err
    code, out, _ = cli("versions", str(root), "papers")
    assert code == 0 and "fence" not in out, out
