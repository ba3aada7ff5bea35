"""examples/papers_agent.py: two real processes, a 429 at paper 347, a resume that finishes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from examples.papers_agent import PAPERS, finish_run, run_demo

ROOT = Path(__file__).resolve().parent.parent


def test_run_demo_tells_a_true_story(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(str(tmp_path / "store"), None, tmp_path / "work") is True
    out = capsys.readouterr().out
    assert "resumed at paper 347 (346 papers untouched)" in out
    assert f"Real extraction calls: {PAPERS} for {PAPERS} papers (0 repeated)" in out
    assert "FAILED" not in out


def test_finish_run_completes_a_run_stopped_by_the_first_process(tmp_path: Path) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    first = subprocess.run([sys.executable, str(ROOT / "examples" / "papers_agent.py"), "--worker", "start",
                            "--store", str(store), "--workdir", str(work), "--run-id", "p1",
                            "--rate-limit-at", "10"], capture_output=True, text=True, timeout=120)
    assert first.returncode == 3, first.stderr
    run = finish_run(str(store), None, "p1", work)
    assert run.status == "completed" and run.completed_count == PAPERS
    calls = (work / "calls.txt").read_text().split()
    assert len(calls) == PAPERS and len(set(calls)) == PAPERS
