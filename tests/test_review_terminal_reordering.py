"""Hostile review of the LangGraph headers' odd values through the CLI: a thread id, namespace,
goal or step title holding a bidi override (U+202E), an isolate (U+2066..U+2069), a mark (U+200F)
or a line / paragraph separator (U+2028, U+2029) reached the terminal as it was: `printable`
spelled out C0 and C1 controls only, and the title line of `show --thread` went out unescaped
(an ESC in a thread id too). U+202E turns the rest of a row around, so a thread id or an LLM's
goal could spoof the columns beside it. They are spelled out (`\\u202e`) now; --json keeps them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from test_cli_commands import cli

from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.cli._render import printable
from ckptfs.integrations.langgraph import CkptfsSaver

REORDERING = re.compile("[\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\x1b]")
THREAD = "th\u202eread\u2028x"
NS = "n\u2029s\u200f"
GOAL = "pay \u202eevil\u202c ok\u2028line2 \u2066iso\u2069"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bidi") / "store"
    store = CheckpointStore(str(root))
    run = AgentRun(run_id="r1", goal=GOAL)
    run.add_step(Step(id="a", title="t\u202eitle\u2029x"))
    store.save_run(run)
    store.close()
    saver = CkptfsSaver(str(root))
    cfg: Any = {"configurable": {"thread_id": THREAD, "checkpoint_ns": NS}}
    c = empty_checkpoint()
    c["channel_values"] = {"a": "v"}
    c["channel_versions"] = {"a": 1}
    saver.put(cfg, c, {"source": "input", "step": 0}, {"a": 1})
    return root


def test_printable_spells_out_what_reorders_a_terminal_line() -> None:
    assert printable("a\u202eb\u2028c\u2066d\x1be\u00e9") == "a\\u202eb\\u2028c\\u2066d\\x1be\u00e9"


@pytest.mark.parametrize("args", [["runs"], ["show", "@", "r1"], ["threads"],
                                  ["show", "@", "--thread", THREAD],
                                  ["show", "@", "--thread", "a\x1b]0;pwned\x07"]])
def test_no_command_sends_reordering_characters_to_the_terminal(root: Path, args: list[str]) -> None:
    args = [str(root) if a == "@" else a for a in args]
    if args[0] != "show":
        args.append(str(root))
    code, out, err = cli(*args)
    assert code in (0, 2), err
    assert not REORDERING.findall(out + err), (out + err)
    assert "\\u202e" in out + err or "\\x1b" in out + err, out + err


def test_json_keeps_them_whole(root: Path) -> None:
    code, out, err = cli("threads", str(root), "--json")
    assert code == 0, err
    assert [t["thread_id"] for t in json.loads(out)["threads"]] == [THREAD]
