"""The suite's forked `ckptfs` commands (tests/_cli_fork.py) are what the real executable does.

Every other CLI test trusts that a command forked from the warm zygote gives the exit code,
stdout and stderr a fresh `ckptfs` process gives. Here the same commands run both ways, one
after the other, and every byte is compared: success and failure, text and --json, local disk
and S3 over HTTP, -vvv (third-party loggers, the secret scrubber), credentials from the
environment, stdin, stderr into stdout, a timeout that must kill the command, and a store
written by a command that another then reads. What a fork cannot reproduce must not be forked.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from tests import _cli_fork

CLI = _cli_fork.SCRIPT
SECRET = "parity-SECRET-4kq/Zz+value"


Done = subprocess.CompletedProcess[Any]


def both(*args: str | Path, **kw: Any) -> tuple[Done, Done]:
    """The command run by the real exec, then forked; asserts the fork path was taken."""
    argv = [CLI, *map(str, args)]
    assert _cli_fork.forkable(argv, kw), argv
    real = _cli_fork.REAL_RUN(argv, **kw)
    forked = _cli_fork.run(argv, **kw)
    return real, forked


def same(*args: str | Path, **kw: Any) -> subprocess.CompletedProcess[Any]:
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    kw.setdefault("timeout", 120)
    real, forked = both(*args, **kw)
    assert (forked.returncode, timeless(forked.stdout), timeless(forked.stderr)) == (
        real.returncode, timeless(real.stdout), timeless(real.stderr))
    return forked


def timeless(out: bytes | str | None) -> bytes | None:
    """Output with how long the command took, and objects' addresses (-vvv's third-party log
    lines name some), masked: what two runs of the real executable differ in too."""
    if out is None:
        return None
    raw = out.encode() if isinstance(out, str) else out
    raw = re.sub(rb'"seconds": [-0-9.e+]+', b'"seconds": #', raw)
    raw = re.sub(rb" at 0x[0-9a-f]+", b" at 0x#", raw)
    return re.sub(rb"\b[0-9]+(\.[0-9]+)? ?(s|ms)\b", b"# s", raw)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parity") / "store"
    with CheckpointStore(str(root)) as st:
        run = AgentRun(run_id="papers", goal="read papers")
        for i in range(3):
            run.add_step(Step(id=f"p{i}", title=f"paper {i}"))
        st.save_run(run)
        for i in range(2):
            step = run.steps[f"p{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"summary {i}"
            step.tool_calls.append(ToolCall(tool_name="fetch", arguments={"i": i}, result="ok",
                                            idempotency_key=f"k{i}"))
            st.commit(run, [step])
    return root


@pytest.mark.parametrize("args", [
    ["--version"], ["--help"], ["runs", "{store}"], ["runs", "{store}", "--json"],
    ["show", "{store}", "papers"], ["show", "{store}", "papers", "--json"],
    ["versions", "{store}", "papers", "--json"], ["verify", "{store}", "--json"],
    ["verify", "{store}", "-vvv"], ["runs", "{store}/nothing-here"], ["no-such-command"],
    ["show", "{store}", "no-such-run", "--json"], ["runs", "file://host/x"],
], ids=lambda a: " ".join(a).replace("{store}", "S"))
def test_local_commands_match_byte_for_byte(store: Path, args: list[str]) -> None:
    same(*(a.replace("{store}", str(store)) for a in args), cwd=store.parent)


def test_text_mode_stdin_and_stderr_into_stdout_match(store: Path) -> None:
    out = same("runs", store, text=True, input="ignored\n", stdout=subprocess.PIPE,
               stderr=subprocess.STDOUT)
    assert "papers" in out.stdout and out.stderr is None
    same("runs", store, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def test_a_store_written_by_one_forked_command_is_read_by_the_next(store: Path, tmp_path: Path) -> None:
    """export writes a file, the next command reads what it wrote: forked commands leave the
    disk as real ones do (exit hooks ran, files closed)."""
    for how, run in (("real", _cli_fork.REAL_RUN), ("forked", _cli_fork.run)):
        dest = tmp_path / f"{how}.json"
        done = run([CLI, "export", str(store), "papers", "--output", str(dest)], capture_output=True,
                   timeout=120)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "real.json").read_bytes() == (tmp_path / "forked.json").read_bytes()
    # the caller's umask, as a child inherits it (the zygote started under another one)
    old = os.umask(0o077)
    try:
        for how, run in (("real", _cli_fork.REAL_RUN), ("forked", _cli_fork.run)):
            done = run([CLI, "export", str(store), "papers", "--output", str(tmp_path / f"{how}-77.json")],
                       capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr
    finally:
        os.umask(old)
    modes = {how: (tmp_path / f"{how}-77.json").stat().st_mode for how in ("real", "forked")}
    assert modes["real"] == modes["forked"] and not modes["real"] & 0o077, modes


@pytest.fixture
def s3_env(s3: EmbeddedS3) -> Iterator[tuple[str, dict[str, str]]]:
    opts = s3.storage_options
    env = dict(os.environ, AWS_ACCESS_KEY_ID=opts["key"], AWS_SECRET_ACCESS_KEY=opts["secret"],
               AWS_SESSION_TOKEN=SECRET, AWS_DEFAULT_REGION="us-east-1")
    endpoint = opts["client_kwargs"]["endpoint_url"]
    with CheckpointStore(s3.url("parity"), opts) as st:
        run = AgentRun(run_id="remote", goal="g")
        run.add_step(Step(id="a", title="a"))
        st.save_run(run)
    yield endpoint, env


@pytest.mark.parametrize("verbosity", [[], ["-vvv"]])
def test_s3_commands_match_and_scrub_alike(s3: EmbeddedS3, s3_env: tuple[str, dict[str, str]],
                                           verbosity: list[str]) -> None:
    endpoint, env = s3_env
    url = s3.url("parity")
    for args in (["runs", url, "--json"], ["verify", url], ["show", url, "remote"],
                 ["runs", s3.url("parity-empty")]):
        argv = [*verbosity, *args, "-o", f"client_kwargs.endpoint_url={endpoint}"]
        if not verbosity:
            out = same(*argv, env=env)
            assert SECRET.encode() not in out.stdout + out.stderr
            continue
        # -vvv logs each request's date, signature and request id: the same lines from the
        # same loggers in the same order, and the same stdout
        real, forked = both(*argv, env=env, capture_output=True, timeout=120)
        assert (forked.returncode, timeless(forked.stdout)) == (real.returncode, timeless(real.stdout))
        assert loggers(forked.stderr) == loggers(real.stderr) and len(loggers(real.stderr)) > 50
        assert SECRET.encode() not in real.stdout + real.stderr + forked.stdout + forked.stderr


def loggers(err: bytes) -> list[bytes]:
    """The level and logger of each log line, in order."""
    return [m.group(0) for m in re.finditer(rb"^(DEBUG|INFO|WARNING|ERROR) [\w.]+:", err, re.M)]


def test_a_timeout_kills_the_forked_command(tmp_path: Path, s3_env: tuple[str, dict[str, str]]) -> None:
    """A command that never finishes (an endpoint that accepts and never answers): TimeoutExpired
    as subprocess raises it, and the command's process is gone."""
    _, env = s3_env
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        argv = [CLI, "runs", "s3://parity-bucket/p", "-o",
                f"client_kwargs.endpoint_url=http://127.0.0.1:{hole.getsockname()[1]}"]
        _cli_fork.run([CLI, "--version"], capture_output=True)  # the zygote up: not timed below
        before = _children_of_zygote()
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired) as info:
            _cli_fork.run(argv, capture_output=True, env=env, timeout=2)
        assert 2 <= time.monotonic() - started < 30
        assert info.value.timeout == 2 and info.value.cmd == argv
        deadline = time.monotonic() + 10
        while _children_of_zygote() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _children_of_zygote() - before


def _children_of_zygote() -> set[int]:
    """Every process below the zygote (its request handlers and their commands)."""
    z = _cli_fork._zygote
    assert z is not None
    found, frontier = set(), [z[1].pid]
    while frontier:
        pid = frontier.pop()
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            found.add(kid)
            frontier.append(kid)
    return found


def test_check_raises_as_subprocess_does(store: Path) -> None:
    for run in (_cli_fork.REAL_RUN, _cli_fork.run):
        with pytest.raises(subprocess.CalledProcessError) as info:
            run([CLI, "show", str(store), "no-such-run"], capture_output=True, check=True, timeout=120)
        assert info.value.returncode == 2


@pytest.mark.parametrize("change", [
    {"LC_ALL": "C"}, {"PYTHONUTF8": "0"}, {"PYTHONIOENCODING": "latin-1"}, {"TZ": "Asia/Tokyo"},
    {"FSSPEC_S3_ANON": "true"},
])
def test_what_a_fork_cannot_reproduce_runs_the_real_way(store: Path, change: dict[str, str]) -> None:
    env = dict(os.environ, **change)
    assert not _cli_fork.forkable([CLI, "runs", str(store)], {"env": env})
    assert not _cli_fork.forkable([CLI, "runs", str(store)], {"preexec_fn": os.getpid})
    assert not _cli_fork.forkable([CLI, "runs", str(store) + "\0"], {})
    assert not _cli_fork.forkable([CLI, b"runs"], {})
    assert _cli_fork.forkable([CLI, "runs", str(store)], {"env": dict(os.environ)})


IMPORT_ALL = """
import collections.abc, importlib, json, os, sys

class Watched(collections.abc.MutableMapping):
    '''os.environ, recording every variable read while ckptfs's modules import.'''
    def __init__(self, inner):
        self.inner, self.read = inner, []
    def __getitem__(self, key):
        self.read.append(key)
        return self.inner[key]
    def __setitem__(self, key, value):
        self.inner[key] = value
    def __delitem__(self, key):
        del self.inner[key]
    def __iter__(self):
        self.read.append("<all of it>")
        return iter(self.inner)
    def __len__(self):
        return len(self.inner)
    def copy(self):
        self.read.append("<all of it>")
        return dict(self.inner)

sys.path.insert(0, sys.argv[1])
import _cli_zygote
for name in _cli_zygote.PRELOAD:  # the zygote's order: the libraries first, then ckptfs
    try:
        importlib.import_module(name)
    except Exception:
        pass
watched = Watched(os.environ)
os.environ = watched
names = _cli_zygote.ckptfs_modules()
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "read": watched.read}))
"""


def test_importing_ckptfs_reads_no_environment() -> None:
    """The zygote imports every ckptfs module once, in its own environment, for all commands:
    that is the same as each command importing them only while no module reads a variable as it
    imports, but those a command with other values of runs the real way. A read at import would
    see the zygote's value, not the command's."""
    tests = str(Path(__file__).resolve().parent)
    done = _cli_fork.REAL_RUN([sys.executable, "-c", IMPORT_ALL, tests], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert "ckptfs.cli" in doc["modules"] and "ckptfs.store.checkpoint_store" in doc["modules"]
    assert len(doc["modules"]) > 50
    # pydantic reads PYDANTIC_DISABLE_PLUGINS as each model class is built: a prefix whose
    # change sends a command the real way
    assert not [k for k in doc["read"] if not k.startswith(_cli_fork.STARTUP_PREFIXES)], \
        sorted(set(doc["read"]))
