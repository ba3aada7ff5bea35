"""`ckptfs show` reports what a load (and so a resume) returns, also when an artifact is damaged:
a load verifies every artifact's sha256 and falls back past a state that needs a damaged one,
and `show` used to read the newest state without resolving them, so it said "completed" while
the resume would start from an earlier version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

CKPTFS = str(Path(sys.executable).parent / "ckptfs")


def test_show_and_runs_agree_with_a_load_after_an_artifact_is_damaged(tmp_path: Path) -> None:
    url = tmp_path / "store"
    store = CheckpointStore(str(url), artifact_threshold=1024)
    run = AgentRun(run_id="r", goal="g")
    for i in range(3):
        run.add_step(Step(id=f"s{i}", title="t"))
    store.save_run(run)
    for i in range(3):
        step = run.steps[f"s{i}"]
        step.status, step.result = StepStatus.COMPLETED, ("big " * 2000 if i == 1 else f"r{i}")
        store.commit(run, [step])
    store.close()
    art = next(p for p in (url / "artifacts").rglob("*") if p.is_file())
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0x01
    art.write_bytes(bytes(data))

    loader = CheckpointStore(str(url))
    loaded = loader.load_run("r")
    assert loaded is not None and loader.last_load is not None
    assert loader.last_load.version < 4  # fell back past the state that needs the artifact
    shown = subprocess.run([CKPTFS, "show", str(url), "r", "--json"], capture_output=True, text=True,
                           timeout=60)
    doc = json.loads(shown.stdout)
    assert doc["version"] == loader.last_load.version, doc
    done = sum(1 for s in doc["steps"] if s["status"] == "completed")
    assert done == loaded.completed_count
    listed = subprocess.run([CKPTFS, "runs", str(url), "--json"], capture_output=True, text=True,
                            timeout=60)
    row = next(r for r in json.loads(listed.stdout)["runs"] if r["run_id"] == "r")
    assert row["version"] == loader.last_load.version and row["completed_steps"] == done
