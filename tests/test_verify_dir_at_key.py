"""`ckptfs verify` names a directory planted where a run file will go.

No listing of keys shows an empty directory, so verify said "clean" while the next commit of
the run was refused (KeyOccupiedError) every time (a hostile review). Now it is an error
naming the key and the version it blocks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import KeyOccupiedError

CLI = str(Path(sys.executable).parent / "ckptfs")


@pytest.mark.parametrize("content", ["empty", "holding a file"])
def test_a_directory_at_the_next_journal_key_is_an_error_verify_names(tmp_path: Path, content: str) -> None:
    root = tmp_path / "store"
    with CheckpointStore(str(root)) as store:
        run = AgentRun(run_id="r", goal="g")
        run.add_step(Step(id="s0", title="t"))
        store.save_run(run)
        version = store.list_versions("r")[-1]
    key = f"runs/r/log/{version + 1:012d}.ckpt"
    (root / key).mkdir()
    if content != "empty":
        (root / key / "foo").write_text("x")
    proc = subprocess.run([CLI, "verify", str(root), "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "dir-at-key"]
    assert [(f["severity"], f["key"], f["version"]) for f in found] == [("error", key, version + 1)]
    # what verify warns of is real: the commit is refused until the directory goes
    with CheckpointStore(str(root)) as store:
        loaded = store.load_run("r")
        assert loaded is not None
        step = loaded.steps["s0"]
        step.status, step.result = StepStatus.COMPLETED, "done"
        with pytest.raises(KeyOccupiedError):
            store.commit(loaded, [step])
