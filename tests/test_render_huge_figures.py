"""Huge stored figures read as 1.23e+45 in the CLI's text views, not as screens of digits.

A commit takes any finite float and any int of up to 4,300 digits as a step's tokens or cost,
and their sums are bigger still. `show` printed each in full: one token count was 5,700
characters of a summary line, a cost 400; --json keeps every value exact.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.cli._render import count, money, seconds

CLI = str(Path(sys.executable).parent / "ckptfs")
HUGE = 9 * 10**4299  # 4,300 digits: the most a commit takes


def _store(tmp_path: Path) -> Path:
    root = tmp_path / "st"
    run = AgentRun(run_id="agg", goal="g", total_cost_usd=1.7e308, total_tokens=HUGE)
    for i in range(2):
        run.add_step(Step(id=f"s{i}", title="t", status=StepStatus.COMPLETED, result="r",
                          cost_usd=1.7e308, tokens=HUGE))
    with CheckpointStore(str(root)) as store:
        store.save_run(run)
        store.log_tool_call("agg", "s0", ToolCall(tool_name="x", arguments={},
                                                  result={"cost_usd": 1.0, "tokens": 3},
                                                  duration_ms=1.5e308))
        store.log_tool_call("agg", "s0", ToolCall(tool_name="y", arguments={}, result={},
                                                  duration_ms=1.5e308))
    return root


def test_show_prints_huge_figures_short(tmp_path: Path) -> None:
    root = _store(tmp_path)
    for extra in ([], ["--calls"]):
        proc = subprocess.run([CLI, "show", str(root), "agg", *extra], capture_output=True, text=True,
                              timeout=120, env={"COLUMNS": "200", "PATH": ""})
        assert proc.returncode == 0, proc.stderr
        assert "9.00e+4299 tokens" in proc.stdout, proc.stdout[:500]
        assert "$1.70e+308" in proc.stdout
        assert "3.00e+305s in tools" in proc.stdout  # two calls of 1.5e308 ms, a sum past floats
        longest = max(len(line) for line in proc.stdout.splitlines())
        assert longest <= 200, longest
    proc = subprocess.run([CLI, "show", str(root), "agg", "--calls"], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "200", "PATH": ""})
    assert "1.50e+308ms" in proc.stdout


def test_figures_keep_their_digits_up_to_a_quadrillion_and_round_honestly_past() -> None:
    assert count(999_999_999_999_999) == "999,999,999,999,999"
    assert count(10**15) == "1.00e+15"
    assert count(123_456_789_012_345_678) == "1.23e+17"
    assert count(-(10**20)) == "-1.00e+20"
    assert count(HUGE) == "9.00e+4299"
    assert count(2 * HUGE) == "1.80e+4300"  # past the digits str() converts
    assert count(10**4400 - 1) == "9.99e+4399"  # floors, as a count must not be overstated
    assert money(12345.6) == "$12,345.60" and money(0.5) == "$0.5000"
    assert money(1.7e308) == "$1.70e+308"
    assert money(17 * 10**308) == "$1.70e+309"  # a total past floats, given as its integer
    assert seconds(12345.0) == "12.3s"
    assert seconds(10**400) == "1.00e+397s"
