"""A store written from a UTF-8 shell, read where Python's filesystem encoding is ascii
(`LC_ALL=C PYTHONUTF8=0`: a cron job or a container that pins the C locale and turns UTF-8
mode off). Keys are UTF-8 on disk whatever the locale. Before, a run "résumé" listed as
"r\\udcc3\\udca9sum\\udcc3\\udca9": `runs` called the healthy run corrupt, `verify` exited 1,
`show résumé` found nothing, and the table's "…" stopped `runs` with exit 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_cli_commands import cli

from ckptfs import CheckpointedAgent, CheckpointStore, Step

C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
RUN = "résumé"


def _store(tmp_path: Path) -> Path:
    root = tmp_path / "störe"  # a non-ASCII root too, given on the command line
    agent = CheckpointedAgent(CheckpointStore(str(root)))
    run = agent.start_run("naïve goal", [Step(id="étape-1", title="première")], run_id=RUN)
    agent.execute_run(run, lambda step, prior: "fini")
    return root


def test_the_c_locale_child_really_has_an_ascii_filesystem_encoding() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys; print(sys.getfilesystemencoding(), "
                          "sys.flags.utf8_mode)"], capture_output=True, text=True,
                         env={**os.environ, **C_LOCALE}, check=True).stdout.split()
    assert out == ["ascii", "0"], out  # else the tests below prove nothing


def test_cli_reads_a_utf8_store_under_the_c_locale(tmp_path: Path) -> None:
    root = str(_store(tmp_path))
    code, out, err = cli("runs", root, "--json", env=C_LOCALE)
    assert code == 0, err
    rows = json.loads(out)["runs"]
    assert [(r["run_id"], r["status"]) for r in rows] == [(RUN, "completed")], rows
    code, out, err = cli("runs", root, env=C_LOCALE)  # the table, on an ascii stdout
    assert code == 0, err
    assert "completed" in out and "r\\xe9sum\\xe9" in out, out
    code, out, err = cli("verify", root, env=C_LOCALE)
    assert code == 0, (out, err)
    code, out, err = cli("show", root, RUN, "--json", env=C_LOCALE)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["run_id"] == RUN and shown["goal"] == "naïve goal"
    assert [s["id"] for s in shown["steps"]] == ["étape-1"]


def test_library_under_the_c_locale_loads_and_writes_utf8_names(tmp_path: Path) -> None:
    root = _store(tmp_path)
    child = (
        "import sys\n"
        "from ckptfs import CheckpointedAgent, CheckpointStore, Step\n"
        f"store = CheckpointStore({str(root)!r})\n"
        f"run = store.load_run({RUN!r})\n"
        "assert run is not None and run.status == 'completed', run\n"
        "agent = CheckpointedAgent(store)\n"
        "new = agent.start_run('g', [Step(id='ça', title='t')], run_id='çà')\n"
        "agent.execute_run(new, lambda step, prior: 'ok')\n"
        f"assert sorted(store.list_runs()) == sorted(['çà', {RUN!r}]), ascii(store.list_runs())\n"
    )
    script = tmp_path / "child.py"  # a file: source is UTF-8 whatever the locale, -c text is not
    script.write_text(child, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, **C_LOCALE}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # the child's new run is under its UTF-8 name on disk, and this process reads it
    assert "çà".encode() in os.listdir(os.fsencode(root / "runs"))
    loaded = CheckpointStore(str(root)).load_run("çà")
    assert loaded is not None and loaded.status == "completed"
