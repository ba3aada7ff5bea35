"""Issue 11 item 9: verbose output is as clean as plain output. No access key id, secret or
session token may reach stdout, stderr or a stored byte, at any verbosity (plain, -v, -vv,
-vvv), whichever way the credentials came in.

`ckptfs -vv` used to set the root logger to DEBUG: botocore then logged every request's headers,
the session token (X-Amz-Security-Token) and the key id (Authorization: Credential=...). Now -v
and -vv raise only ckptfs's loggers; -vvv opens third-party loggers too, through a filter that
scrubs known values and credential shapes. Every command runs against the moto server, with
distinctive credentials given
  * as storage options (`-o key=...`, and `--from-option` / `--to-option` for mirror/restore),
  * as AWS_* environment variables,
  * through a config file: secrets written in it (refused, and the refusal must not echo them),
    and a `profile` it names, whose keys botocore reads from a shared-credentials file.
Then every object in the bucket and every file written locally is scanned, .ckpt decompressed.
"""

from __future__ import annotations

import contextlib
import json
import os
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
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall, mirror, open_storage

CLI = str(Path(sys.executable).parent / "ckptfs")
KEY_ID = "AKIAZZCLISECRETKEYID9"
SECRET = "cli-SECRET-9zq/Xy+sekrit-value"
TOKEN = "cli-SESSION-9zq-token-IQoJb3JpZ2luX2VjEJ"
SECRETS = {"key id": KEY_ID, "secret": SECRET, "session token": TOKEN}
RUN = "r1"
MISSING = "no-such-bucket-cli-secrets"


def _leaks(data: bytes) -> list[str]:
    found = []
    for name, value in SECRETS.items():
        for form in {value, urllib.parse.quote(value, safe="")}:
            if form.encode() in data:
                found.append(name)
    return found


@dataclass(frozen=True)
class World:
    s3: EmbeddedS3
    tmp: Path
    store: str
    mirror: str

    @property
    def endpoint(self) -> str:
        return self.s3.endpoint


def _populate(url: str, opts: dict[str, Any]) -> None:
    store = CheckpointStore(url, opts, artifact_threshold=2048)
    try:
        run = AgentRun(run_id=RUN, goal="secrets stay secret")
        for i in range(4):
            run.add_step(Step(id=f"s{i}", title=f"step {i}"))
        store.save_run(run)
        for i in range(3):
            step = run.steps[f"s{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"result {i} " + ("y" * 5000 if i == 0 else "")
            store.commit(run, [step])
            store.log_tool_call(RUN, step.id, ToolCall(tool_name="t", arguments={"i": i}, result={"n": i}))
    finally:
        store.close()


@pytest.fixture
def world(s3: EmbeddedS3, tmp_path: Path) -> World:
    w = World(s3, tmp_path, s3.url("store"), s3.url("mirror"))
    creds = {"key": KEY_ID, "secret": SECRET, "token": TOKEN,
             "client_kwargs": {"endpoint_url": s3.endpoint, "region_name": s3.region}}
    _populate(w.store, creds)
    mirror(w.store, w.mirror, src_options=creds, dst_options=creds, latest=True)
    return w


def _commands(w: World, n: list[int]) -> list[tuple[str, list[str], str, bool]]:
    """(name, argv, which sides are on S3: "store", "mirror", "both", error expected)."""
    def local() -> str:
        n[0] += 1
        return str(w.tmp / f"out-{n[0]}")

    return [
        ("runs", ["runs", w.store], "store", False),
        ("show", ["show", w.store, RUN, "--calls"], "store", False),
        ("versions", ["versions", w.store, RUN], "store", False),
        ("export", ["export", w.store, RUN], "store", False),
        ("verify", ["verify", w.store, "--data"], "store", False),
        ("prune --dry-run", ["prune", w.store, "--keep-last", "1", "--dry-run"], "store", False),
        ("mirror", ["mirror", w.store, local(), "--latest", "--once", "--no-progress"], "from", False),
        ("restore", ["restore", w.mirror, local(), "--no-progress"], "from", False),
        ("config show --check", ["config", "show", "--check"], "config", False),
        ("runs (missing bucket)", ["runs", f"s3://{MISSING}/p"], "store", True),
        ("show (unknown run)", ["show", w.store, "nope"], "store", True),
        ("mirror (missing bucket)", ["mirror", str(w.tmp / "local-src"), f"s3://{MISSING}/m", "--latest",
                                     "--once", "--no-progress"], "to", True),
    ]


def _flags(flag: str, opts: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in opts.items():
        out += _flags(flag, v, f"{prefix}{k}.") if isinstance(v, dict) else [flag, f"{prefix}{k}={v}"]
    return out


def _invocation(channel: str, side: str, argv: list[str], w: World) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(COLUMNS="300", AWS_DEFAULT_REGION=w.s3.region)
    endpoint = {"client_kwargs": {"endpoint_url": w.endpoint}}
    creds = {"key": KEY_ID, "secret": SECRET, "token": TOKEN}
    args = list(argv)
    opts: dict[str, Any] = endpoint
    if channel == "options":
        opts = {**creds, **endpoint}
    elif channel == "aws-env":
        env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN)
    else:  # config-secret / profile: the config file says it
        cfg = w.tmp / f"{channel}.toml"
        args += ["--config", str(cfg)]
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(w.tmp / "credentials")
        return args, env
    flag = {"store": "-o", "from": "--from-option", "to": "--to-option", "config": "-o"}[side]
    if side == "config":  # config show: the mirror side's options from its JSON variable
        env["CKPTFS_URL"], env["CKPTFS_MIRROR_URL"] = w.store, w.mirror
        env["CKPTFS_MIRROR_STORAGE_OPTIONS"] = json.dumps(opts)
    return args + _flags(flag, opts), env


def _write_config_files(w: World) -> None:
    ep = w.endpoint
    (w.tmp / "config-secret.toml").write_text(
        f'[store]\nurl = "{w.store}"\n[store.options]\nkey = "{KEY_ID}"\nsecret = "{SECRET}"\n'
        f'token = "{TOKEN}"\n[store.options.client_kwargs]\nendpoint_url = "{ep}"\n')
    (w.tmp / "profile.toml").write_text(
        f'[store]\nurl = "{w.store}"\n[store.options]\nprofile = "hostile"\n'
        f'[store.options.client_kwargs]\nendpoint_url = "{ep}"\n'
        f'[mirror]\nurl = "{w.mirror}"\n[mirror.options]\nprofile = "hostile"\n'
        f'[mirror.options.client_kwargs]\nendpoint_url = "{ep}"\n')
    (w.tmp / "credentials").write_text(
        f"[hostile]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
        f"aws_session_token = {TOKEN}\n")
    _populate(str(w.tmp / "local-src"), {})


# (channel, level) -> the commands run so; -vvv is the widest net (every logger at DEBUG, through
# the filter), so it runs everything; -v (ckptfs's loggers only) a command of each kind; -vv with
# every command and channel is test_secrets_verbose.py's.
EVERY = None
SOME = {"runs", "mirror", "restore", "runs (missing bucket)"}
MATRIX: dict[tuple[str, str], set[str] | None] = {
    ("options", ""): EVERY, ("options", "-v"): SOME, ("options", "-vvv"): EVERY,
    ("aws-env", ""): {"runs (missing bucket)", "mirror (missing bucket)"}, ("aws-env", "-vvv"): EVERY,
    ("profile", "-vvv"): {"runs", "show", "verify", "mirror", "restore", "config show --check"},
    ("config-secret", ""): {"runs"}, ("config-secret", "-vvv"): {"runs"},
}


def test_no_secret_in_any_output_or_stored_file(world: World) -> None:
    _write_config_files(world)
    n = [0]
    jobs = []
    for (channel, level), names in MATRIX.items():
        for name, argv, side, error in _commands(world, n):
            if names is None or name in names:
                jobs.append((channel, level, name, argv, side, error))

    def one(job: tuple[str, str, str, list[str], str, bool]) -> list[str]:
        channel, level, name, argv, side, error = job
        args, env = _invocation(channel, side, argv, world)
        cmd = [CLI, *([level] if level else []), *args]
        proc = subprocess.run(cmd, capture_output=True, timeout=60, env=env, cwd=world.tmp)
        where = f"`ckptfs {level} {name}` ({channel})"
        problems = []
        refused = channel == "config-secret"
        if (proc.returncode != 0) != (error or refused):
            problems.append(f"{where}: exit {proc.returncode}: {proc.stderr.decode()[-300:]}")
        if refused and b"credentials do not belong in a config file" not in proc.stderr:
            problems.append(f"{where}: the config file's secret was not refused")
        if level == "-vvv" and not error and not refused and b"DEBUG botocore" not in proc.stderr:
            problems.append(f"{where}: -vvv shows no botocore debug lines (is the test blind?)")
        problems += [f"{s} in stdout of {where}" for s in _leaks(proc.stdout)]
        problems += [f"{s} in stderr of {where}" for s in _leaks(proc.stderr)]
        return problems

    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for ps in pool.map(one, jobs) for p in ps]
    assert len(jobs) > 45
    stored = _stored(world)
    problems += [f"{s} in stored file {k}" for k, data in stored.items() for s in _leaks(data)
                 if k not in ("credentials", "config-secret.toml")]
    assert not problems, f"{len(problems)} problem(s) over {len(jobs)} calls: " + "; ".join(problems[:6])


def _stored(w: World) -> dict[str, bytes]:
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
            with contextlib.suppress(zstandard.ZstdError):
                out[f"{name} (decompressed)"] = zstandard.ZstdDecompressor().decompress(data)
    assert any(k.startswith("s3:store/runs/") for k in out) and any("out-" in k for k in out)
    return out
