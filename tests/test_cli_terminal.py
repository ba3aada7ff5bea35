"""Issue 13, tables in a real 80-column terminal: ids never wrap, long text is cut, not folded.

Each command runs in a pseudo-terminal whose window is set to 24x80 (TIOCSWINSZ), so rich sees
what an operator's terminal tells it, colours and all. The output is read back, escape sequences
removed, and checked: no line wider than 80 cells, every run and step id whole on one line, long
goals and results cut with an ellipsis (one line per row, not eleven).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall

CLI = str(Path(sys.executable).parent / "ckptfs")
ROWS, COLS = 24, 80
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[=>()][0-9A-Za-z]?")
LONG_GOAL = ("Read every one of the five hundred papers on durable checkpoints for agents, extract "
             "the findings, cross-check the citations and write a summary a reviewer can trust") * 2
RUN_IDS = ["3f2c9a1e-7d44-4b1b-9a0e-5c6d7e8f9a0b", "papers-2026-11-30-night-batch-0042", "short"]


def in_terminal(*args: str) -> tuple[int, list[str]]:
    """Run `ckptfs ARGS` on a 24x80 pty; its exit code and output lines, escapes removed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES") and not k.startswith("CKPTFS_")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([CLI, *args], stdin=slave, stdout=slave, stderr=slave, env=env,
                            cwd=tempfile.gettempdir(), close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError as exc:  # EIO: the child closed its side
            if exc.errno != errno.EIO:
                raise
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=60)
    text = ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r", "")
    return code, text.split("\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("term") / "store"
    s = CheckpointStore(str(root), policy=CompactionPolicy(fanout=3, max_plan=4, min_snapshot_bytes=500,
                                                           keep_last=0, background=False))
    for n, rid in enumerate(RUN_IDS):
        run = AgentRun(run_id=rid, goal=LONG_GOAL)
        for i in range(6):
            run.add_step(Step(id=f"extract-findings-and-citations-{i:03d}", title=f"paper {i} " + "t" * 90))
        s.save_run(run)
        for i in range(3 + n):
            st = run.steps[f"extract-findings-and-citations-{i:03d}"]
            st.status, st.result, st.attempt_count = StepStatus.COMPLETED, f"result {i}: " + LONG_GOAL, 1
            st.tokens, st.cost_usd = 1200 + i, 0.0125
            s.commit(run, [st])
            s.log_tool_call(rid, st.id, ToolCall(tool_name="summarise-with-the-large-model",
                                                 arguments={"i": i}, result={"text": LONG_GOAL, "tokens": 9},
                                                 duration_ms=1234.5))
    s.close()
    return root


def _check(lines: list[str], ids: list[str]) -> None:
    wide = [ln for ln in lines if len(ln) > COLS]
    assert not wide, f"{len(wide)} line(s) wider than {COLS}: {wide[:2]}"
    for i in ids:
        assert any(i in ln for ln in lines), f"id {i!r} is not whole on any line:\n" + "\n".join(lines)


def test_runs_table_fits_80_columns(store: Path) -> None:
    code, lines = in_terminal("runs", str(store))
    assert code == 0
    _check(lines, RUN_IDS)
    rows = [ln for ln in lines if any(ln.startswith(r) for r in RUN_IDS)]
    assert len(rows) == len(RUN_IDS), "a row took more than one line"
    assert all("…" in r for r in rows), "the goal is cut with an ellipsis"
    assert sum("Read every" in ln for ln in lines) == len(RUN_IDS)  # one goal line per run


def test_show_versions_and_calls_fit_80_columns(store: Path) -> None:
    rid = RUN_IDS[0]
    step_ids = [f"extract-findings-and-citations-{i:03d}" for i in range(6)]
    code, lines = in_terminal("show", str(store), rid, "--calls")
    assert code == 0
    _check(lines, [rid, *step_ids])
    assert sum(ln.startswith("extract-findings-and-citations-") for ln in lines) == 6 + 3  # steps + calls
    code, lines = in_terminal("show", str(store), rid, "--step", step_ids[0])
    assert code == 0
    assert all(len(ln) <= COLS for ln in lines if "summarise-with-the-large-model" in ln)
    code, lines = in_terminal("versions", str(store), rid)
    assert code == 0
    _check(lines, [rid])


def test_verify_prune_and_diff_fit_80_columns(store: Path, tmp_path: Path) -> None:
    code, lines = in_terminal("prune", str(store), "--keep-last", "1", "--dry-run")
    assert code == 0
    table = [ln for ln in lines if any(ln.startswith(r) for r in RUN_IDS)]
    assert len(table) == len(RUN_IDS) and all(len(ln) <= COLS for ln in table)
    assert not any("/log/" in ln for ln in lines), "prune lists files only with -v"
    code, lines = in_terminal("diff", str(store), RUN_IDS[1], "1", "4")
    assert code == 0
    _check([ln for ln in lines if "extract-" in ln], [])
    # a damaged store: findings name long keys, still one row each
    code, lines = in_terminal("verify", str(store))
    assert code == 0 and any("clean" in ln for ln in lines)
