"""Two processes racing to commit the same version: exactly one wins, on local and S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step

ROOT = str(Path(__file__).resolve().parent.parent)
RACER = """
import json, os, sys, time
from ckptfs import CheckpointStore, ConflictError, StepStatus
url, opts, go, name = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
store = CheckpointStore(url, storage_options=opts)
run = store.load_run("race")
step = run.steps["s0"]
step.status, step.result = StepStatus.COMPLETED, "by " + name
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
try:
    v = store.commit(run, [step])
    print("won", v, flush=True)
except ConflictError as exc:
    print("conflict", exc, flush=True)
"""


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_two_processes_one_winner(backend: str, tmp_path: Path, request: Any) -> None:
    if backend == "local":
        url, opts = str(tmp_path / "store"), {}
    else:
        url, opts = request.getfixturevalue("s3_url"), request.getfixturevalue("s3_opts")
    env = {**os.environ, "PYTHONPATH": ROOT}
    for rnd in range(4):
        store = CheckpointStore(url, storage_options=opts)
        run = AgentRun(run_id="race", goal="g")
        run.add_step(Step(id="s0", title="t"))
        if rnd == 0:
            store.save_run(run)
        else:
            loaded = store.load_run("race")
            assert loaded is not None
            loaded.steps["s0"].attempt_count = rnd  # move the run forward one version
            loaded.steps["s0"].status, loaded.steps["s0"].result = "pending", None
            store.commit(loaded, [loaded.steps["s0"]])
        go = tmp_path / f"go{rnd}"
        procs = [subprocess.Popen([sys.executable, "-c", RACER, url, json.dumps(opts), str(go),
                                   name], stdout=subprocess.PIPE, text=True, env=env)
                 for name in ("A", "B")]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=60)[0].strip() for p in procs]
        winners = [o for o in outs if o.startswith("won")]
        losers = [o for o in outs if o.startswith("conflict")]
        assert len(winners) == 1 and len(losers) == 1, outs
        assert "run 'race': version" in losers[0]
        final = CheckpointStore(url, storage_options=opts).load_run("race")
        assert final is not None
        winner_name = "A" if outs[0].startswith("won") else "B"
        assert final.steps["s0"].result == "by " + winner_name
        time.sleep(0.01)
