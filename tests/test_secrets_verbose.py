"""Issue 11, secrets under -v/-vv: no credential may reach the CLI's output or a stored file.

`ckptfs -vv` sets the root logger to DEBUG, so botocore logs every request's headers: the
session token (X-Amz-Security-Token) and the access key id (in Authorization) were printed.
The README promises "secrets in storage_options never reach a file, log line or message".
Every command runs here against the moto server over HTTP, plain, -v and -vv, with the
credentials given each way the CLI takes them: `-o` / `--mirror-option` flags, the standard
AWS_* variables, and the JSON of $CKPTFS_STORAGE_OPTIONS / $CKPTFS_MIRROR_STORAGE_OPTIONS
(ckptfs/cli/_options.py). Then every byte written to the bucket and to local mirrors and
restores is scanned, .ckpt files decompressed.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zstandard

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, mirror, open_storage

KEY_ID = "AKIAHOSTILE7Q2XKEYID"
SECRET = "hostile-SECRET-7q2x/Zz+value"
TOKEN = "hostile-SESSION-7q2x-token-FwoGZXIvYXdzEJr"
SECRETS = {"access key id": KEY_ID, "secret": SECRET, "session token": TOKEN}
RUN = "r1"
MISSING_BUCKET = "no-such-bucket-hostile"
TIMEOUT = 60.0


def _cli_path() -> str:
    """The real console script of this venv (the CLI's module path is being moved)."""
    script = Path(sys.executable).parent / "ckptfs"
    found = str(script) if script.exists() else shutil.which("ckptfs")
    assert found, "the ckptfs console script is not installed"
    return found


def _needles() -> dict[str, bytes]:
    """Each secret as bytes, also URL-quoted where that differs (as in a query or a header)."""
    out: dict[str, bytes] = {}
    for name, value in SECRETS.items():
        out[name] = value.encode()
        quoted = urllib.parse.quote(value, safe="")
        if quoted != value:
            out[f"{name} (url-quoted)"] = quoted.encode()
    return out


def _leaks(data: bytes) -> list[str]:
    return [name for name, needle in _needles().items() if needle in data]


def _flags(flag: str, opts: dict[str, Any], prefix: str = "") -> list[str]:
    """storage_options as repeated `FLAG dotted.key=value` arguments."""
    out: list[str] = []
    for key, value in opts.items():
        if isinstance(value, dict):
            out += _flags(flag, value, f"{prefix}{key}.")
        else:
            out += [flag, f"{prefix}{key}={value}"]
    return out


@dataclass(frozen=True)
class World:
    """What the commands run against: an S3 store and mirror, a local store, the endpoint."""

    s3: EmbeddedS3
    tmp: Path
    store: str
    mirror: str
    local: str

    @property
    def endpoint(self) -> dict[str, Any]:
        return {"client_kwargs": dict(self.s3.storage_options["client_kwargs"])}

    @property
    def creds(self) -> dict[str, Any]:
        return {"key": KEY_ID, "secret": SECRET, "token": TOKEN, **self.endpoint}


def _populate(url: str, opts: dict[str, Any]) -> None:
    """A run with a step result large enough to become an artifact, written with the secrets."""
    store = CheckpointStore(url, opts)
    try:
        run = AgentRun(run_id=RUN, goal="secrets stay secret")
        for i in range(8):
            run.add_step(Step(id=f"s{i}", title=f"step {i}"))
        store.save_run(run)
        for i in range(6):
            step = run.steps[f"s{i}"]
            step.status = StepStatus.COMPLETED
            step.result = f"result {i} " + ("y" * 70_000 if i == 0 else "")
            store.commit(run, [step])
    finally:
        store.close()


@pytest.fixture
def world(s3: EmbeddedS3, tmp_path: Path) -> World:
    w = World(s3=s3, tmp=tmp_path, store=s3.url("store"), mirror=s3.url("mirror"),
              local=str(tmp_path / "local"))
    _populate(w.store, w.creds)
    _populate(w.local, {})
    mirror(w.store, w.mirror, src_options=w.creds, dst_options=w.creds, latest=True)
    return w


@dataclass(frozen=True)
class Command:
    """One CLI call: its arguments, and which of its two sides (store, mirror) are on S3."""

    name: str
    args: list[str]
    store_s3: bool = False
    mirror_s3: bool = False
    config_env: bool = False
    error: bool = False


def _commands(w: World, fresh: itertools.count[int]) -> list[Command]:
    """Every subcommand, and the error paths: a missing bucket, an unknown run, an empty URL."""
    def local() -> str:
        return str(w.tmp / f"out-{next(fresh)}")

    def s3_prefix() -> str:
        return w.s3.url(f"m-{next(fresh)}")

    missing = f"s3://{MISSING_BUCKET}/p"
    return [
        Command("runs", ["runs", w.store], store_s3=True),
        Command("show", ["show", w.store, RUN], store_s3=True),
        Command("verify", ["verify", w.store], store_s3=True),
        Command("prune --dry-run", ["prune", w.store, "--keep-last", "1", "--dry-run"], store_s3=True),
        Command("mirror s3->local", ["mirror", w.store, local(), "--latest", "--no-progress"],
                store_s3=True),
        Command("mirror local->s3", ["mirror", w.local, s3_prefix(), "--latest", "--no-progress"],
                mirror_s3=True),
        Command("restore s3->local", ["restore", w.mirror, local(), "--no-progress"], mirror_s3=True),
        Command("config show --check", ["config", "show", "--check"], store_s3=True, mirror_s3=True,
                config_env=True),
        Command("runs (missing bucket)", ["runs", missing], store_s3=True, error=True),
        Command("show (unknown run)", ["show", w.store, "no-such-run"], store_s3=True, error=True),
        Command("verify (nothing stored)", ["verify", w.s3.url("empty")], store_s3=True, error=True),
        Command("mirror (missing bucket)", ["mirror", w.store, f"s3://{MISSING_BUCKET}/m", "--latest",
                                            "--no-progress"], store_s3=True, mirror_s3=True, error=True),
        Command("restore (missing bucket)", ["restore", f"s3://{MISSING_BUCKET}/m", local(),
                                             "--no-progress"], mirror_s3=True, error=True),
    ]


def _invocation(channel: str, cmd: Command, w: World) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment of `cmd` with the credentials given through `channel`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    env["COLUMNS"] = "4000"
    args = list(cmd.args)
    if cmd.config_env:
        env["CKPTFS_URL"], env["CKPTFS_MIRROR_URL"] = w.store, w.mirror
    if channel == "aws-env":
        env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN)
    if channel == "json-env" or cmd.config_env:  # config show --check reaches what the env says
        opts = w.creds if channel == "json-env" else w.endpoint
        if cmd.store_s3:
            env["CKPTFS_STORAGE_OPTIONS"] = json.dumps(opts)
        if cmd.mirror_s3:
            env["CKPTFS_MIRROR_STORAGE_OPTIONS"] = json.dumps(opts)
    if channel != "json-env":
        opts = w.creds if channel == "options" else w.endpoint
        if cmd.store_s3:
            args += _flags("-o", opts if not cmd.config_env else {k: opts[k] for k in opts
                                                                   if k in ("key", "secret", "token")})
        if cmd.mirror_s3 and not cmd.config_env:
            args += _flags("--mirror-option", opts)
    return args, env


def _scan_outputs(channel: str, w: World, levels: list[str]) -> tuple[list[str], int]:
    """Run every command at every verbosity; what leaked where, and how many calls ran."""
    fresh = itertools.count()
    jobs = [(level, cmd) for level in levels for cmd in _commands(w, fresh)
            if level or channel == "options" or cmd.error or cmd.config_env]

    def one(job: tuple[str, Command]) -> list[str]:
        level, cmd = job
        args, env = _invocation(channel, cmd, w)
        argv = [_cli_path(), *([level] if level else []), *args]
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, env=env, cwd=w.tmp)
        except subprocess.TimeoutExpired:
            return [f"`ckptfs {level} {cmd.name}` did not finish in {TIMEOUT:.0f} s"]
        where = f"`ckptfs {level + ' ' if level else ''}{cmd.name}`"
        if (proc.returncode == 0) == cmd.error:  # a call that fails early sends no request at all
            return [f"unexpected exit {proc.returncode} of {where}: {proc.stderr[-200:]!r}"]
        return ([f"{s} in stdout of {where}" for s in _leaks(proc.stdout)]
                + [f"{s} in stderr of {where}" for s in _leaks(proc.stderr)])

    with ThreadPoolExecutor(max_workers=4) as pool:
        found = [leak for leaks in pool.map(one, jobs) for leak in leaks]
    return found, len(jobs)


def _stored_bytes(w: World) -> dict[str, bytes]:
    """Every object in the bucket and every file under tmp_path, .ckpt frames decompressed."""
    out: dict[str, bytes] = {}
    storage = open_storage(w.s3.url(""), w.s3.storage_options)
    try:
        for key in storage.list(""):
            out[f"s3:{key}"] = storage.get(key)
    finally:
        storage.close()
    for path in w.tmp.rglob("*"):
        if path.is_file():
            out[str(path.relative_to(w.tmp))] = path.read_bytes()
    for name, data in list(out.items()):
        if name.endswith(".ckpt"):
            with contextlib.suppress(zstandard.ZstdError):  # raw bytes are scanned anyway
                out[f"{name} (decompressed)"] = zstandard.ZstdDecompressor().decompress(data)
    return out


def _summary(leaks: list[str], total: int) -> str:
    kinds = collections.Counter(leak.split(" in ")[0] for leak in leaks)
    return (f"{len(leaks)} leak(s) over {total} calls ({dict(kinds)}); e.g. " + "; ".join(leaks[:4]))


# Plain and -vv with flags; with the environment, -vv everywhere and plain where a value could
# be echoed (config show, error messages). -vv logs everything -v does and more, so -v adds no
# line to scan here (test_cli_secrets.py runs -v on a command of each kind).
CHANNELS = {"options": ["", "-vv"], "aws-env": ["", "-vv"], "json-env": ["", "-vv"]}


@pytest.mark.parametrize("channel", list(CHANNELS))
def test_no_secret_in_cli_output_or_stored_files(channel: str, world: World) -> None:
    """Every command, plain and verbose, credentials through `channel`: not one of the key id,
    the secret or the session token may appear in stdout, stderr or any stored byte."""
    leaks, total = _scan_outputs(channel, world, CHANNELS[channel])
    stored = [f"{s} in stored file {name}" for name, data in _stored_bytes(world).items()
              for s in _leaks(data)]
    assert not leaks + stored, _summary(leaks + stored, total)
