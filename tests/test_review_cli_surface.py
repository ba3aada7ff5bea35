"""The CLI's common surface as operators meet it, through the real `ckptfs` executable: a reader
that closes the pipe, a terminal width of 0, an output encoding without a run id's characters,
numbers too long for Python, a config file saved with a byte-order mark, and a default config
path that is there but is no file. Each was found by driving the executable (see each test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

CLI = str(Path(sys.executable).parent / "ckptfs")
RUN = "run-é-0001"  # a run id the ASCII codec cannot hold
HUGE = "9" * 5000  # more digits than Python's int() converts (4300)


def env_of(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CKPTFS_", "AWS_")) and k not in ("COLUMNS", "LINES")}
    env.update(extra or {})
    return env


def ckptfs(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, env=env_of(env),
                          timeout=60)


def into_closed_pipe(*args: str, cwd: Path) -> tuple[int, str]:
    """Run with stdout a pipe whose reader is already gone (`| head -1` once head exited):
    every write meets EPIPE, deterministically. Exit code and stderr."""
    r, w = os.pipe()
    os.close(r)
    try:
        got = subprocess.run([CLI, *args], stdout=w, stderr=subprocess.PIPE, text=True, cwd=cwd,
                             env=env_of(), timeout=60)
    finally:
        os.close(w)
    return got.returncode, got.stderr


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("surface") / "store"
    with CheckpointStore(str(root)) as s:
        for n in range(3):
            run = AgentRun(run_id=f"{RUN}{n}", goal="göal ✓ " * 20)
            run.add_step(Step(id="s0", title="tïtle"))
            s.save_run(run)
            st = run.steps["s0"]
            st.status, st.result = StepStatus.COMPLETED, "x" * 300
            s.commit(run, [st])
    return root


@pytest.mark.parametrize("args", [["runs"], ["show", f"{RUN}0", "--json"], ["verify"], ["export", f"{RUN}0"]])
def test_a_reader_that_closed_the_pipe_ends_the_command_quietly(store: Path, args: list[str]) -> None:
    """`ckptfs show STORE RUN --json | head -c 10` printed a BrokenPipeError traceback (the JSON
    write failed, was reported as "internal" in JSON, and that write failed too), exit 1; a
    table's broken pipe was rich's exit 1, verify's "problems found" on a clean store."""
    code, err = into_closed_pipe(args[0], str(store), *args[1:], cwd=store.parent)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert err == "", err
    assert code == 141, (code, err)  # 128 + SIGPIPE, never 1 (problems) or 3 (internal)


def test_an_error_whose_json_nobody_reads_keeps_its_line_and_code(tmp_path: Path) -> None:
    code, err = into_closed_pipe("runs", str(tmp_path / "nothing-here"), "--json", cwd=tmp_path)
    assert code == 2, err
    assert err.strip().splitlines() == [f"error: nothing is stored at {tmp_path / 'nothing-here'} "
                                        "(wrong URL or prefix?)"], err


@pytest.mark.parametrize("columns", ["0", "5"])
def test_a_width_no_table_fits_in_is_taken_as_unknown(store: Path, tmp_path: Path, columns: str) -> None:
    """COLUMNS=0 made rich render at width 0: `runs` printed nothing, exit 0, and a failing
    command lost its `error:` line; COLUMNS=5 cut each run id to five characters."""
    got = ckptfs("runs", str(store), cwd=tmp_path, env={"COLUMNS": columns})
    assert got.returncode == 0, got.stderr
    for n in range(3):
        assert f"{RUN}{n}" in got.stdout, got.stdout
    bad = ckptfs("runs", str(tmp_path / "nothing-here"), cwd=tmp_path, env={"COLUMNS": columns})
    assert bad.returncode == 2
    assert "error: nothing is stored at" in bad.stderr, bad.stderr


@pytest.mark.parametrize("args", [["runs"], ["show", f"{RUN}1"]])
def test_an_ascii_only_output_spells_out_what_it_cannot_hold(
        store: Path, tmp_path: Path, args: list[str]) -> None:
    """PYTHONIOENCODING=ascii: a run id with an 'é' stopped the table with "unexpected
    UnicodeEncodeError", exit 3."""
    got = ckptfs(args[0], str(store), *args[1:], cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert got.returncode == 0, got.stderr
    assert "UnicodeEncodeError" not in got.stderr
    assert "run-\\xe9-0001" in got.stdout, got.stdout


def test_an_ascii_only_error_line_spells_out_the_run_id(store: Path, tmp_path: Path) -> None:
    missing = ckptfs("show", str(store), "run-ü", cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert missing.returncode == 2 and "run-\\xfc' not found" in missing.stderr, missing.stderr


@pytest.mark.parametrize(("how", "code", "named"), [
    ("toml", "config", "holds a number of more than 4300 digits"),
    ("env", "config", "$CKPTFS_STORAGE_OPTIONS: holds a number of more than 4300 digits"),
    ("option", "usage", "--storage-option a: a number of more than 4300 digits"),
])
def test_a_number_too_long_for_python_is_a_usage_error_not_a_bug(
        tmp_path: Path, how: str, code: str, named: str) -> None:
    """A 5,000-digit integer in the config file, in $CKPTFS_STORAGE_OPTIONS or in `-o` was
    "unexpected ValueError: Exceeds the limit (4300 digits)", exit 3 (internal)."""
    (tmp_path / "c.toml").write_text(f'[store]\nurl = "memory://c"\nkeep_last = {HUGE}\n')
    args, env = ["config", "show", "--json"], {}
    if how == "toml":
        args += ["--config", "c.toml"]
    elif how == "env":
        env = {"CKPTFS_STORAGE_OPTIONS": f'{{"a": {HUGE}}}'}
    else:
        args += ["-o", f"a={HUGE}"]
    got = ckptfs(*args, cwd=tmp_path, env=env)
    assert got.returncode == 2, got.stderr
    doc = json.loads(got.stdout)
    assert doc["error"]["code"] == code and doc["exit_code"] == 2, doc
    assert named in doc["error"]["message"] and HUGE not in got.stderr, got.stderr[:300]


def test_a_config_file_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    """Notepad saves UTF-8 with a BOM: tomllib said "Invalid statement (at line 1, column 1)"."""
    (tmp_path / "c.toml").write_bytes(b'\xef\xbb\xbf[store]\r\nurl = "memory://bom"\r\nkeep_last = 4\r\n')
    got = ckptfs("config", "show", "--config", "c.toml", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["store"] == {"url": "memory://bom", "keep_last": 4,
                                               "artifact_threshold": 65536, "options": {}}


@pytest.mark.parametrize("kind", ["dangling", "directory", "loop", "fifo"])
def test_a_default_config_that_is_there_but_no_file_is_refused(
        store: Path, tmp_path: Path, kind: str) -> None:
    """config/ckptfs.toml a dangling link (to /etc, not yet deployed), a directory, a link loop
    or a FIFO was skipped in silence: every command ran on the defaults, here the store at
    ./agent_checkpoints, which `runs` listed (exit 0) and `prune` would have pruned."""
    (tmp_path / "config").mkdir()
    default = tmp_path / "config" / "ckptfs.toml"
    if kind == "dangling":
        default.symlink_to(tmp_path / "etc-not-deployed.toml")
    elif kind == "directory":
        default.mkdir()
    elif kind == "loop":
        default.symlink_to(default)
    else:
        os.mkfifo(default)
    os.symlink(store, tmp_path / "agent_checkpoints")  # what the defaults name
    got = ckptfs("runs", "--json", cwd=tmp_path)
    assert got.returncode == 2, got.stdout[:300]
    doc = json.loads(got.stdout)
    assert doc["error"]["code"] == "config", doc
    assert doc["error"]["message"].startswith("config file 'config/ckptfs.toml' (the default) "), doc
    assert RUN not in got.stdout


def test_no_default_config_file_still_means_the_defaults(tmp_path: Path) -> None:
    got = ckptfs("config", "show", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["store"]["url"] == "agent_checkpoints"


@pytest.mark.parametrize(("args", "names"), [
    (["prune", "--artifact-grace", "", "--dry-run"], "--artifact-grace"),
    (["verify", "--subset", "5/3"], "--subset"),
    (["verify", "--subset", "0/3", "--json"], "--subset"),
])
def test_a_bad_maintenance_option_is_a_usage_error_naming_it(store: Path, tmp_path: Path, args: list[str],
                                                             names: str) -> None:
    """`--artifact-grace ""` (a `"$GRACE"` left unset) silently meant 24 hours; `--subset 5/3`
    was error code "config", as if a settings file were wrong. Both: usage, exit 2, named."""
    got = ckptfs(args[0], str(store), *args[1:], cwd=tmp_path)
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert names in got.stderr and "Traceback" not in got.stderr
    if "--json" in args:
        assert json.loads(got.stdout)["error"]["code"] == "usage"
