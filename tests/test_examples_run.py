"""The examples `make demo` and `make langgraph-demo` run, as users run them: CI runs only
`make test`, so without these a broken example would be found by the next person to try it.
Each runs as its own process (`python examples/X.py`) and must exit 0 with its claims said."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> str:
    got = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    return got.stdout


def test_machine_loss_example_restores_from_s3_and_finishes(tmp_path: Path) -> None:
    out = _run("machine_loss.py", "--workdir", str(tmp_path))
    assert "[ok] all 500 papers completed" in out, out
    assert "[ok] restore verified and published it" in out, out
    assert "[FAILED]" not in out, out


def test_langgraph_example_resumes_after_a_crash_inside_a_node() -> None:
    out = _run("langgraph_agent.py")
    assert "exit status 137" in out  # the first child really died mid-node
    assert "resume worked: no node ran twice, none was lost" in out, out
