"""Every script in benchmarks/ runs to its table on a tiny workload. The figures are not
judged here (machines are noisy: targets live in the scripts' own runs), only that each
script still runs against today's code and prints its rows: `make bench` is run by hand, and a
script broken by a change in the library was found only when somebody next measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "agent_overhead.py": ["--steps", "200", "--rounds", "1"],
    "cli_startup.py": ["--runs", "2"],
    "commit_latency.py": ["--sizes", "50", "--s3-sizes", "20"],
    "group_commit.py": ["--steps", "100", "--rounds", "1"],
    "langgraph_put.py": ["--steps", "10", "--sizes", "10", "--get-rounds", "10", "--no-s3"],
    "load_scale.py": ["--steps", "300", "--batch", "50", "--rounds", "1", "--root", "{tmp}"],
    "mirror_restore.py": ["--steps", "200", "--repeat", "1", "--runs", "4"],
    "s3_load_artifacts.py": ["--artifacts", "20", "--latency-ms", "5", "--reps", "1"],
    "scale.py": ["--steps", "100", "--smoke"],
    "seed_save_run.py": ["--sizes", "20,50", "--rounds", "5"],
    "verify_throughput.py": ["--mb", "5", "--dir", "{tmp}"],
    "workers.py": ["--steps", "6", "--latency", "0.05", "--workers", "1,2", "--backends", "local"],
}


def test_every_benchmark_script_is_listed_here() -> None:
    assert sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")) == sorted(TINY)


@pytest.mark.parametrize("script", sorted(TINY))
def test_benchmark_runs_to_its_table(script: str, tmp_path: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path / "work")) for a in TINY[script]]
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    # 1: a target not met on so small a run is a figure, not a failure of the script
    assert got.returncode in (0, 1), got.stdout[-2000:] + got.stderr[-4000:]
    assert "Traceback" not in got.stderr, got.stderr[-4000:]
    # load_scale.py is a profile of one load's phases, with no target of its own
    said = "files read" if script == "load_scale.py" else "target"
    assert said in got.stdout.lower(), got.stdout[-2000:]
