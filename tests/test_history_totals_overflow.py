"""Run totals whose sums leave what JSON carries, though each summand was stored.

A commit accepts a cost of 1.7e308 and tokens of 4,300 digits; two steps of each made
`show --json` and `export` print `"step_cost_usd": Infinity` (no JSON) and a 4,301-digit
int that json.loads refuses. Every document here is read back with json.loads at its
default limits, refusing NaN/Infinity, through the real `ckptfs` executable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_cli_commands import cli

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall

HUGE_COST = 1.7e308  # finite, storable; twice it is past the largest float
HUGE_TOKENS = 9 * 10**4299  # 4,300 digits: the most a commit stores; twice it has 4,301


def strict(text: str) -> Any:
    """json.loads as a reader with default limits, also refusing what is no JSON (Infinity)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _store(root: Path, costs: list[float], tokens: list[int],
           calls: list[ToolCall] | None = None) -> None:
    store = CheckpointStore(str(root))
    run = AgentRun(run_id="agg", goal="overflowing totals")
    for i, (cost, tok) in enumerate(zip(costs, tokens, strict=True)):
        run.add_step(Step(id=f"s{i}", title="t", status=StepStatus.COMPLETED, result="r",
                          cost_usd=cost, tokens=tok))
    store.save_run(run)
    for call in calls or []:
        store.log_tool_call("agg", "s0", call)
    store.close()


def _documents(root: Path, tmp_path: Path) -> list[Any]:
    """show --json, export to stdout and export --output, each parsed strictly."""
    docs = []
    for args in (["show", str(root), "agg", "--json"], ["export", str(root), "agg"]):
        code, out, err = cli(*args)
        assert code == 0, err
        docs.append(strict(out))
    target = tmp_path / "export.json"
    code, _, err = cli("export", str(root), "agg", "--output", str(target))
    assert code == 0, err
    docs.append(strict(target.read_text()))
    return docs


def test_overflowing_step_totals_are_json_exact_and_named(tmp_path: Path) -> None:
    root = tmp_path / "st"
    _store(root, [HUGE_COST, HUGE_COST], [HUGE_TOKENS, HUGE_TOKENS])
    exact_cost = 2 * int(HUGE_COST)  # 1.7e308 is an integer, so the exact sum is one too
    for doc in _documents(root, tmp_path):
        t = doc["totals"]
        assert t["step_cost_usd"] == exact_cost and isinstance(t["step_cost_usd"], int)
        assert t["step_tokens"] == "18" + "0" * 4299  # 2 * 9e4299, every digit, as a string
        assert set(t["overflow"]) == {"step_cost_usd", "step_tokens"}
        assert any("step_cost_usd" in n for n in doc["notes"])
        assert any("step_tokens" in n for n in doc["notes"])
        assert t["cost_usd"] == 0.0 and t["tokens"] == 0  # the run's own counters, as stored
    code, out, err = cli("show", str(root), "agg")
    assert code == 0 and "2 steps (2 completed)" in out, err
    assert "note: total step_cost_usd" in err and "note: total step_tokens" in err


def test_overflowing_tool_time_is_json_and_the_text_view_still_prints(tmp_path: Path) -> None:
    root = tmp_path / "st"
    slow = [ToolCall(tool_name="x", arguments={}, duration_ms=HUGE_COST, result={"ok": 1})
            for _ in range(2)]
    _store(root, [0.5], [10], slow)
    for doc in _documents(root, tmp_path):
        t = doc["totals"]
        assert t["tool_ms"] == 2 * int(HUGE_COST) and list(t["overflow"]) == ["tool_ms"]
        assert t["step_cost_usd"] == 0.5 and t["step_tokens"] == 10
    code, out, err = cli("show", str(root), "agg")
    assert code == 0, err
    assert "2 tool call(s)" in out and "infs in tools" not in out
    assert "note: total tool_ms" in err


def test_only_an_intermediate_overflow_gives_the_float_it_is(tmp_path: Path) -> None:
    """1.7e308 + 1.7e308 - 1.7e308 is inf summed left to right, but 1.7e308 exactly."""
    root = tmp_path / "st"
    _store(root, [HUGE_COST, HUGE_COST, -HUGE_COST], [1, 2, 3])
    for doc in _documents(root, tmp_path):
        t = doc["totals"]
        assert t["step_cost_usd"] == HUGE_COST and isinstance(t["step_cost_usd"], float)
        assert t["overflow"] == {} and t["step_tokens"] == 6
        assert not any("total" in n for n in doc["notes"])


def test_ordinary_totals_stay_plain_numbers_with_an_empty_overflow(tmp_path: Path) -> None:
    root = tmp_path / "st"
    _store(root, [0.25, 0.5], [100, 200])
    for doc in _documents(root, tmp_path):
        t = doc["totals"]
        assert (t["step_cost_usd"], t["step_tokens"], t["overflow"]) == (0.75, 300, {})
        assert doc["notes"] == []


def test_a_call_cost_no_float_holds_is_none_not_a_crash(tmp_path: Path) -> None:
    """A tool result's cost of 10**400 (an int a commit stores): float() of it ended show with
    "unexpected OverflowError" (exit 3), in the table and in --json alike."""
    root = tmp_path / "st"
    call = ToolCall(tool_name="x", arguments={}, duration_ms=5.0,
                    result={"cost_usd": 10**400, "usage": {"cost": 0.5, "total_tokens": HUGE_TOKENS}})
    _store(root, [0.0], [0], [call])
    code, out, err = cli("show", str(root), "agg", "--json")
    assert code == 0, err
    got = strict(out)["steps"][0]["calls"][0]
    # the first cost found is the tool's own figure: not replaced by another key's
    assert got["cost_usd"] is None and got["tokens"] == HUGE_TOKENS
    assert got["result"]["cost_usd"] == 10**400  # still there whole
    for args in (["show", str(root), "agg", "--calls"], ["show", str(root), "agg", "--step", "s0"]):
        code, out, err = cli(*args)
        assert code == 0, (args, err)
        assert "tool calls" in out and "Traceback" not in err
