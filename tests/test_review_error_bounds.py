"""Hostile review: error messages that echo a caller's value whole, and S3 refusals reported as
the wrong thing.

Found:

* `parse_duration`, `parse_subset` and `MirrorJob(cron=..., interval=...)` put the whole bad
  value in their error: a 5,000-character value made a 5,000-character error (and log) line.
  APScheduler's own reason repeated the bad cron field (and part of it) in full as well; a
  subset of 5,000 digits was a bare ValueError of int(), not a ConfigError.
* On S3, an AccessDenied (HTTP 403) on a PUT or a DELETE (a policy without s3:PutObject or
  s3:DeleteObject) was StorageUnavailableError, "access refused": `ckptfs prune` called it
  `unreachable` and sent the operator after the network. It is StoreNotWritableError
  (`not-writable`), naming the key and saying access was denied, never a credential.
* A local delete refused by the OS said "cannot write <key>".

S3 runs over real HTTP against the suite's moto server, behind the fault proxy answering S3's
own AccessDenied document (or, for DeleteObjects, a 200 whose result refuses each key, as S3
answers a principal without s3:DeleteObject). The CLI is the real executable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _fault_proxy import Fault, FaultProxy, Request
from _privileges import drop_dac

from backends.s3.embedded import FAKE_CREDENTIALS, EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.cli._common import quoted
from ckptfs.errors import (
    SHOWN_CHARS,
    ConfigError,
    StorageUnavailableError,
    StoreNotWritableError,
    quote_value,
)
from ckptfs.format.units import parse_duration
from ckptfs.maintenance.verify import parse_subset
from ckptfs.replication.job import MirrorJob
from ckptfs.storage.registry import open_storage

CLI = str(Path(sys.executable).parent / "ckptfs")
LONG = 5000
MAX_LINE = 400  # far above any of these messages cut, far below one that echoes 5,000 characters
SECRETS = tuple(FAKE_CREDENTIALS.values())


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
        preexec: Any = None) -> subprocess.CompletedProcess[str]:
    """The real `ckptfs`, no CKPTFS_* settings; never a traceback."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**base, "COLUMNS": "200", **(env or {})}, preexec_fn=preexec)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def assert_cut(message: str, value: str) -> None:
    """`message` names `value` by its first SHOWN_CHARS characters and its length, no more."""
    assert len(message) < MAX_LINE, (len(message), message[:300])
    assert value[:SHOWN_CHARS] in message and value[: SHOWN_CHARS + 1] not in message, message
    assert f"({len(value)} characters)" in message, message


# ------------------------------------------------------------------ the shared quoting


def test_quote_value_is_whole_up_to_the_limit_then_cut_with_its_length() -> None:
    assert quote_value("x" * SHOWN_CHARS) == repr("x" * SHOWN_CHARS)
    assert quote_value("x" * (SHOWN_CHARS + 1)) == f"{'x' * SHOWN_CHARS!r}… ({SHOWN_CHARS + 1} characters)"
    # the CLI's helper is the same function: a value reads alike in CLI and library messages
    assert quoted("9" * LONG) == quote_value("9" * LONG)


# ------------------------------------------------------------------ library parsers


@pytest.mark.parametrize("value", ["x" * LONG, "9" * LONG, "1h" * (LONG // 2), "1" * 41 + "parsecs"])
def test_parse_duration_names_a_long_value_cut(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_duration(value, limit=3600)
    assert_cut(str(e.value), value)


@pytest.mark.parametrize("value", ["x" * LONG, "9" * LONG + "/1", "1/" + "0" * LONG, "3/" + " " * LONG])
def test_parse_subset_names_a_long_value_cut(value: str) -> None:
    """A ConfigError in every case, also for digits past int()'s conversion limit (was a bare
    ValueError quoting nothing useful)."""
    with pytest.raises(ConfigError) as e:
        parse_subset(value)
    assert_cut(str(e.value), value)


@pytest.mark.parametrize("cron", [
    "x" * LONG,                       # wrong number of fields
    "* * * * " + "9" * 300,           # APScheduler repeats the field in its reason
    "1-" + "5" * 300 + " * * * *",    # ... and the part of it that is out of range
    "*/" + "7" * LONG + " * * * *",   # past int()'s conversion limit
])
def test_mirror_job_names_a_long_cron_expression_cut(cron: str) -> None:
    with pytest.raises(ConfigError) as e:
        MirrorJob("memory://err-bounds-a", "memory://err-bounds-b", cron=cron)
    message = str(e.value)
    assert_cut(message, cron)
    assert not re.search(rf"[^\s'()…]{{{SHOWN_CHARS + 1},}}", message), message  # no long word at all


def test_mirror_job_names_a_bad_interval_cut() -> None:
    """float()'s own ValueError quoted the string whole; now a ConfigError naming it cut."""
    value = "x" * LONG
    with pytest.raises(ConfigError) as e:
        MirrorJob("memory://err-bounds-a", "memory://err-bounds-b", interval=value)  # type: ignore[arg-type]
    assert_cut(str(e.value), value)


def test_cli_cron_error_is_one_short_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    with CheckpointStore(str(src)) as store:
        store.save_run(AgentRun(run_id="r", goal="g"))
    cron = "1-" + "5" * LONG + " * * * *"
    proc = cli("mirror", str(src), str(tmp_path / "dst"), "--cron", cron, "--json", cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[:500])
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] in ("config", "usage"), doc["error"]
    assert_cut(doc["error"]["message"], cron)
    assert len(proc.stderr) < MAX_LINE, proc.stderr[:500]


def test_cli_keeps_the_library_reason_for_a_value_a_little_over_the_limit(tmp_path: Path) -> None:
    """A 45-character `--subset` was "is not a valid value": the CLI dropped the library's reason
    whenever the cut message came out longer than the value. Now the reason stays."""
    store = tmp_path / "store"
    with CheckpointStore(str(store)) as st:
        st.save_run(AgentRun(run_id="r", goal="g"))
    value = "k" * 45
    proc = cli("verify", str(store), "--subset", value, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "is not K/N" in proc.stderr and f"{value[:SHOWN_CHARS]!r}… (45 characters)" in proc.stderr, \
        proc.stderr


# ------------------------------------------------------------------ S3: AccessDenied on a change


def via(s3: EmbeddedS3, endpoint: str) -> dict[str, Any]:
    opts = s3.storage_options
    return {**opts, "client_kwargs": {**opts["client_kwargs"], "endpoint_url": endpoint}}


def deny(*methods: str) -> Any:
    """A proxy rule answering S3's 403 AccessDenied document to these methods (POST: only
    DeleteObjects, `?delete`), forwarding everything else."""
    def rule(req: Request) -> Fault | None:
        if req.method in methods and (req.method != "POST" or "delete" in req.path.split("?", 1)[-1]):
            return Fault(status=403, code="AccessDenied")
        return None
    return rule


def assert_denied(exc: BaseException, key: str, verb: str) -> None:
    assert isinstance(exc, StoreNotWritableError), (type(exc), exc)
    message = str(exc)
    assert f"cannot {verb} {key}" in message and "access denied" in message, message
    assert not any(s in message for s in SECRETS), message


def test_s3_access_denied_on_delete_and_put_is_not_writable(s3: EmbeddedS3, s3_url: str) -> None:
    direct = open_storage(s3_url, s3.storage_options)
    direct.put("runs/r/log/000000000001.ckpt", b"one")
    with FaultProxy(s3.endpoint, deny("DELETE", "PUT", "POST")) as proxy:
        store = open_storage(s3_url, via(s3, proxy.endpoint))
        with pytest.raises(OSError) as e:
            store.delete("runs/r/log/000000000001.ckpt")
        assert_denied(e.value, "runs/r/log/000000000001.ckpt", "delete")
        with pytest.raises(OSError) as e:
            store.delete_many(["runs/r/log/000000000001.ckpt"])
        assert_denied(e.value, "runs/r/log/000000000001.ckpt", "delete")
        for put in (lambda: store.put("runs/r/log/000000000002.ckpt", b"two"),
                    lambda: store.put_if_absent("runs/r/log/000000000002.ckpt", b"two")):
            with pytest.raises(OSError) as e:
                put()
            assert_denied(e.value, "runs/r/log/000000000002.ckpt", "write")
        # a read still works through the same proxy: nothing else was refused
        assert store.get("runs/r/log/000000000001.ckpt") == b"one"
        assert proxy.counts["error"] >= 4, proxy.counts
    assert direct.list("runs/") == ["runs/r/log/000000000001.ckpt"]


def test_s3_access_denied_on_a_read_stays_unavailable(s3: EmbeddedS3, s3_url: str) -> None:
    """A read refused is no read-only store: these credentials cannot use it (as before)."""
    open_storage(s3_url, s3.storage_options).put("runs/r/log/000000000001.ckpt", b"one")
    with FaultProxy(s3.endpoint, deny("GET")) as proxy:
        store = open_storage(s3_url, via(s3, proxy.endpoint))
        with pytest.raises(StorageUnavailableError) as e:
            store.get("runs/r/log/000000000001.ckpt")
        assert not isinstance(e.value, StoreNotWritableError) and "access refused" in str(e.value)


@contextlib.contextmanager
def delete_objects_refused() -> Iterator[str]:
    """An endpoint answering DeleteObjects as S3 does a principal without s3:DeleteObject:
    200, with an AccessDenied error for each key in the request."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            errors = "".join(f"<Error><Key>{k}</Key><Code>AccessDenied</Code><Message>Access Denied"
                             "</Message></Error>" for k in re.findall(r"<Key>([^<]*)</Key>", body))
            doc = ('<?xml version="1.0" encoding="UTF-8"?><DeleteResult '
                   f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{errors}</DeleteResult>').encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_s3_delete_objects_refusing_each_key_is_not_writable(s3: EmbeddedS3, s3_url: str) -> None:
    with delete_objects_refused() as endpoint:
        store = open_storage(s3_url, via(s3, endpoint))
        with pytest.raises(OSError) as e:
            store.delete_many(["runs/r/log/000000000001.ckpt", "runs/r/log/000000000002.ckpt"])
    assert_denied(e.value, "runs/r/log/000000000001.ckpt", "delete")
    assert "2 of 2 objects refused" in str(e.value)


def test_cli_prune_on_s3_denied_deletes_is_not_writable(s3: EmbeddedS3, s3_url: str,
                                                        tmp_path: Path) -> None:
    """`ckptfs prune` where every delete is AccessDenied: the run is reported failed with code
    `not-writable` (was `unreachable`), naming a key; no credential in the output; nothing gone."""
    policy = CompactionPolicy(fanout=2, max_plan=2, min_snapshot_bytes=1, keep_last=0, background=False)
    with CheckpointStore(s3_url, s3.storage_options, policy=policy) as store:
        run = AgentRun(run_id="r", goal="g")
        for i in range(6):
            run.add_step(Step(id=f"s{i}", title=f"step {i}"))
        store.save_run(run)
        for i in range(6):
            step = run.steps[f"s{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"done {i}"
            store.commit(run, [step])
    before = open_storage(s3_url, s3.storage_options).list("runs/")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(FAKE_CREDENTIALS, AWS_DEFAULT_REGION=s3.region)
    with FaultProxy(s3.endpoint, deny("DELETE", "POST")) as proxy:
        proc = cli("prune", s3_url, "-o", f"client_kwargs.endpoint_url={proxy.endpoint}",
                   "--keep-last", "1", "--superseded-grace", "0", "--json", cwd=tmp_path, env=env)
        assert proxy.counts["error"] >= 1, proxy.counts  # the deletes were really sent, and refused
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-1000:])
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] == "not-writable", doc["error"]
    assert [(f["run"], f["code"]) for f in doc["failed"]] == [("r", "not-writable")], doc["failed"]
    reason = doc["failed"][0]["reason"]
    assert "cannot delete runs/r/" in reason and "access denied" in reason, reason
    assert not any(s in proc.stdout + proc.stderr for s in SECRETS)
    assert open_storage(s3_url, s3.storage_options).list("runs/") == before


# ------------------------------------------------------------------ local: a refused delete


def test_local_refused_delete_says_cannot_delete(tmp_path: Path) -> None:
    """In a folder this user may not write (permission bits binding root too: the child drops
    its DAC capabilities), a delete names the path and the OS reason, as a delete."""
    root = tmp_path / "store"
    store = open_storage(str(root))
    store.put("runs/r/log/000000000001.ckpt", b"one")
    (root / "runs" / "r" / "log").chmod(0o555)
    code = ("import sys\nfrom ckptfs.storage.registry import open_storage\n"
            "try:\n    open_storage(sys.argv[1]).delete('runs/r/log/000000000001.ckpt')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                              timeout=60, preexec_fn=drop_dac)
    finally:
        (root / "runs" / "r" / "log").chmod(0o755)
    out = proc.stdout.strip()
    assert out.startswith("StoreNotWritableError "), (out, proc.stderr)
    assert f"{root}: cannot delete runs/r/log/000000000001.ckpt: Permission denied" in out, out
    assert (root / "runs" / "r" / "log" / "000000000001.ckpt").exists()
