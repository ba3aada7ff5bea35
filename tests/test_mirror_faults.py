"""Faults on the wire: throttling and 5xx from a loopback proxy in front of moto, a server restart.

The proxy answers some requests itself with S3's own error documents (503 SlowDown, 500
InternalError) and forwards the rest to the moto server. botocore's retries are turned off
(`max_attempts: 1`) so that what converges is ckptfs's retry layer, not the SDK's.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_mirror import POLICY, state, work

from backends.s3.embedded import EmbeddedS3, free_port
from ckptfs import CheckpointStore
from ckptfs.cli import main as cli_main
from ckptfs.replication.mirror import mirror
from ckptfs.replication.restore import restore
from ckptfs.storage.registry import open_storage

RUN = "paper-run"
Rule = Callable[[str, str, int], tuple[int, str] | None]
_ERROR = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
          "<Message>{code} injected by the test proxy</Message><RequestId>t</RequestId></Error>")


class FaultProxy:
    """A loopback HTTP proxy that fails requests a rule picks and forwards the others."""

    def __init__(self, upstream: str, rule: Rule) -> None:
        host, port = upstream.replace("http://", "").split(":")
        self.rule = rule
        self.count = 0
        self.injected = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def _handle(self) -> None:
                body = self._body()
                with proxy._lock:
                    proxy.count += 1
                    n = proxy.count
                fault = proxy.rule(self.command, self.path, n)
                if fault is not None:
                    with proxy._lock:
                        proxy.injected += 1
                    status, code = fault
                    doc = b"" if self.command == "HEAD" else _ERROR.format(code=code).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("transfer-encoding", "connection", "content-length")}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server",
                                         "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _opts(s3: EmbeddedS3, endpoint: str) -> dict[str, Any]:
    return {**s3.storage_options,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": s3.region},
            "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"},
                              "connect_timeout": 2, "read_timeout": 10}}


@pytest.fixture
def source(tmp_path: Path) -> tuple[str, CheckpointStore]:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 24)
    return src, store


def test_throttling_and_5xx_are_retried_until_the_mirror_converges(
        s3: EmbeddedS3, s3_url: str, source: tuple[str, CheckpointStore], tmp_path: Path) -> None:
    src, store = source

    def rule(method: str, path: str, n: int) -> tuple[int, str] | None:
        if method == "PUT" and n % 3 == 0:
            return 500, "InternalError"
        if n % 5 == 0:
            return 503, "SlowDown"
        if method in ("GET", "HEAD") and n % 4 == 0:
            return 500, "InternalError"
        return None

    with FaultProxy(s3.endpoint, rule) as proxy:
        report = mirror(src, s3_url, dst_options=_opts(s3, proxy.endpoint), attempts=10,
                        base_delay=0.01)
    assert proxy.injected > 5
    assert report.ok, report.missing
    assert report.retries > 0
    assert CheckpointStore(s3_url, s3.storage_options).load_run(RUN) == store.load_run(RUN)
    dst = str(tmp_path / "restored")
    with FaultProxy(s3.endpoint, rule) as proxy:
        rep = restore(s3_url, dst, src_options=_opts(s3, proxy.endpoint), attempts=10, base_delay=0.01)
    assert rep.ok and state(CheckpointStore(dst), RUN) == state(store, RUN)


def test_when_retries_run_out_the_mirror_exits_1_naming_what_is_missing(
        s3: EmbeddedS3, s3_url: str, source: tuple[str, CheckpointStore],
        capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = source

    def rule(method: str, path: str, n: int) -> tuple[int, str] | None:
        return (500, "InternalError") if method == "PUT" and "/snap/" in path else None

    with FaultProxy(s3.endpoint, rule) as proxy:
        opts = _opts(s3, proxy.endpoint)
        report = mirror(src, s3_url, dst_options=opts, attempts=3, base_delay=0.01)
        assert not report.ok and report.runs[0].status == "incomplete"
        assert any("/snap/" in m for m in report.missing)
        import json

        code = cli_main(["mirror", src, s3_url, "--once", "--json", "--attempts", "3",
                         "--mirror-option", f"client_kwargs.endpoint_url={proxy.endpoint}",
                         "--mirror-option", "config_kwargs.retries.max_attempts=1", "--no-progress"])
    assert code == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and any("/snap/" in m for m in doc["missing"])
    # no snapshot is visible without what it needs: the mirror holds none at all
    assert not open_storage(s3_url, s3.storage_options).list(f"runs/{RUN}/snap")


def test_moto_server_stopped_and_restarted_mid_mirror(
        tmp_path: Path, s3: EmbeddedS3, source: tuple[str, CheckpointStore]) -> None:
    src, store = source
    port = free_port()
    server = EmbeddedS3(port=port, bucket="ckptfs-restart").start()
    url = server.url("m")
    events: list[str] = []

    class Outage:
        n = 0

        def planned(self, objects: int, nbytes: int) -> None:
            return None

        def done(self, key: str, nbytes: int, skipped: bool) -> None:
            Outage.n += 1
            if Outage.n == 3:
                server.stop()
                events.append("stopped")
                threading.Timer(1.0, restart).start()

    def restart() -> None:
        server.start()
        events.append("restarted")

    try:
        opts = {**_opts(server, server.endpoint)}
        report = mirror(src, url, dst_options=opts, attempts=12, base_delay=0.1, workers=4,
                        progress=Outage())
        assert events == ["stopped", "restarted"]
        assert report.ok, report.missing
        assert report.retries > 0
        assert CheckpointStore(url, server.storage_options).load_run(RUN) == store.load_run(RUN)
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _quiet_werkzeug() -> Iterator[None]:
    import logging

    log = logging.getLogger("werkzeug")
    level = log.level
    log.setLevel(logging.WARNING)
    yield
    log.setLevel(level)


def test_a_restore_cut_short_is_never_a_clean_store_a_version_short(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    """A restore into S3 whose newest record's PUT fails every retry exits 1 naming it; the
    store it leaves must not load, nor verify clean, as the version before: a resume there
    would pay again for what that record logged. It used to verify clean at v(N-1)."""
    import os
    import subprocess
    import sys

    from ckptfs.store.compactor import CompactionPolicy

    mirror_dir = str(tmp_path / "mirror")  # a mirror without a snapshot: records from version 0
    store = CheckpointStore(mirror_dir, policy=CompactionPolicy(background=False, keep_last=0),
                            artifact_threshold=1024)
    work(store, RUN, 6)
    newest = max(store.list_versions(RUN))
    assert not open_storage(mirror_dir).list(f"runs/{RUN}/snap")
    store.close()
    last = f"/log/{newest:012d}.ckpt"

    def rule(method: str, path: str, n: int) -> tuple[int, str] | None:
        return (503, "SlowDown") if method == "PUT" and last in path else None

    cli = str(Path(sys.executable).parent / "ckptfs")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.storage_options["key"],
           "AWS_SECRET_ACCESS_KEY": s3.storage_options["secret"]}
    with FaultProxy(s3.endpoint, rule) as proxy:
        got = subprocess.run(
            [cli, "restore", mirror_dir, s3_url, "--run", RUN, "--attempts", "2", "--no-progress",
             "--to-option", f"client_kwargs.endpoint_url={proxy.endpoint}",
             "--to-option", f"client_kwargs.region_name={s3.region}",
             "--to-option", "config_kwargs.retries.max_attempts=1"],
            capture_output=True, text=True, env=env, timeout=120)
    assert proxy.injected >= 2
    assert got.returncode == 1, got.stderr
    assert last.lstrip("/") in got.stderr
    verified = subprocess.run(
        [cli, "verify", s3_url, "--json", "-o", f"client_kwargs.endpoint_url={s3.endpoint}",
         "-o", f"client_kwargs.region_name={s3.region}"],
        capture_output=True, text=True, env=env, timeout=60)
    assert verified.returncode == 1, verified.stdout
    runs = subprocess.run(
        [cli, "runs", s3_url, "--json", "-o", f"client_kwargs.endpoint_url={s3.endpoint}",
         "-o", f"client_kwargs.region_name={s3.region}"],
        capture_output=True, text=True, env=env, timeout=60)
    assert f'"version": {newest - 1}' not in runs.stdout, runs.stdout
    # run again with the network healthy, the restore converges to the mirror's newest version
    again = subprocess.run(
        [cli, "restore", mirror_dir, s3_url, "--run", RUN, "--no-progress",
         "--to-option", f"client_kwargs.endpoint_url={s3.endpoint}",
         "--to-option", f"client_kwargs.region_name={s3.region}"],
        capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    restored = CheckpointStore(s3_url, s3.storage_options)
    assert state(restored, RUN) == state(CheckpointStore(mirror_dir), RUN)
    assert restored.last_load is not None and restored.last_load.version == newest
