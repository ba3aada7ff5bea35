"""An S3 endpoint that accepts connections and never answers (a hung server, a firewall
swallowing its replies) is reported unreachable after two unanswered requests, not 25.

Every request to it costs a whole read timeout (s3fs's: 15 s), and the client's layers of
retries multiplied: botocore's 5 attempts inside each of s3fs's 5 tries. `ckptfs runs`, `verify`
and `mirror` said nothing for ~418 s (25 timeouts and the backoff between them), then "Read
timeout on endpoint URL", exit 2. Driven here
through the installed `ckptfs`, with `-o config_kwargs.read_timeout=0.5` so a request gives up
quickly; what is asserted is how many requests the endpoint saw, not how long it took.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.errors import StorageUnavailableError
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage

CLI = str(Path(sys.executable).parent / "ckptfs")
SECRET = "blackholeSECRETkey/0123456789abcdefABCDEF"
READ_TIMEOUT = "0.5"
TRIES = 2  # storage/s3.py SILENT_TRIES, spelled out: the old code sent 25 requests here


class Blackhole:
    """A loopback TCP server that reads every request and answers none of them, except the
    next `answer` ones, which get a bare 404 (an answer all the same). With `vanish_after`, it
    stops listening once it has received that many requests: connections are then refused."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.requests: list[str] = []  # request lines, as received
        self.answer = 0
        self.vanish_after: int | None = None
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:  # bodies (none here: GETs, HEADs, LISTs) are not parsed
                head, buf = buf.split(b"\r\n\r\n", 1)
                with self._lock:
                    self.requests.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
                    reply = self.answer > 0
                    self.answer -= reply
                    if self.vanish_after is not None and len(self.requests) >= self.vanish_after:
                        self.sock.close()
                if reply:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)
        with self._lock:
            for conn in self._open:
                conn.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    bh = Blackhole()
    try:
        yield bh
    finally:
        bh.close()


def _options(bh: Blackhole, read_timeout: float) -> dict[str, Any]:
    return {"key": "AKIDBLACKHOLE", "secret": SECRET,
            "client_kwargs": {"endpoint_url": bh.endpoint, "region_name": "us-east-1"},
            "config_kwargs": {"read_timeout": read_timeout}}


def _ckptfs(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "AKIDBLACKHOLE", "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("CKPTFS_CONFIG", None)
    env.pop("CKPTFS_URL", None)
    # generous: the old code waited out 25 read timeouts and their backoff (40-60 s here)
    return subprocess.run([CLI, "-v", *argv], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=240)


@pytest.mark.parametrize("command", [
    ["runs", "s3://bkt/x", "{o}", "--json"],
    ["verify", "s3://bkt/x", "{o}", "--json"],
    ["mirror", "s3://bkt/x", "{dst}", "--once", "--latest", "--no-progress", "--attempts", "3",
     "{o}", "--json"],
    ["mirror", "{src}", "s3://bkt/x", "--once", "--no-progress", "--attempts", "3", "--to-option",
     "client_kwargs.endpoint_url={endpoint}", "--to-option",
     f"config_kwargs.read_timeout={READ_TIMEOUT}", "--json"],
], ids=["runs", "verify", "mirror-from", "mirror-to"])
def test_a_silent_endpoint_is_unreachable_after_two_requests(
        blackhole: Blackhole, tmp_path: Path, command: list[str]) -> None:
    src = tmp_path / "src"
    with CheckpointStore(str(src)) as store:  # a local source with a run for mirror-to to copy
        run = AgentRun(run_id="r1", goal="g")
        run.add_step(Step(id="a", title="a"))
        store.save_run(run)
    argv: list[str] = []
    for a in command:
        if a == "{o}":
            argv += ["-o", f"client_kwargs.endpoint_url={blackhole.endpoint}",
                     "-o", f"config_kwargs.read_timeout={READ_TIMEOUT}"]
        else:
            argv.append(a.format(dst=tmp_path / "dst", src=src, endpoint=blackhole.endpoint))
    got = _ckptfs(argv, tmp_path)
    out = got.stdout + got.stderr
    assert got.returncode == 2, (got.returncode, got.stderr[-3000:], blackhole.requests)
    assert len(blackhole.requests) == TRIES, (blackhole.requests, got.stderr[-2000:])
    assert blackhole.connections == TRIES, blackhole.connections
    said = (f"s3://bkt/x: no reply from {blackhole.endpoint} to {TRIES} requests in a row, "
            f"{READ_TIMEOUT} s each (read timeout), and never one before")
    assert f"error: {said}" in got.stderr, got.stderr[-3000:]
    doc = json.loads(got.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "unreachable", doc
    assert said in doc["error"]["message"], doc
    # -v says what it is waiting for while it waits, once, before the second request
    waiting = f"no reply from {blackhole.endpoint} within {READ_TIMEOUT} s (read timeout)"
    assert got.stderr.count(waiting) == 1, got.stderr[-3000:]
    assert SECRET not in out and SECRET.split("/")[0] not in out
    assert "Traceback" not in got.stderr and "unexpected" not in got.stderr, got.stderr[-3000:]


def test_the_retries_of_ckptfs_stop_at_a_silent_endpoint_and_keep_their_count_at_one_that_answered(
        blackhole: Blackhole, caplog: pytest.LogCaptureFixture) -> None:
    """One retry layer (RetryingStorage over a client that does not retry): a never-answered
    endpoint gets the two requests, not `attempts`; once it has answered, silence is a slow
    network and gets every attempt, as before."""
    silent = RetryingStorage(open_storage("s3://bkt/x", _options(blackhole, 0.5)), attempts=6,
                             base_delay=0.01)
    said = f"s3://bkt/x: no reply from {blackhole.endpoint} to {TRIES} requests"
    with caplog.at_level("INFO", logger="ckptfs"), pytest.raises(StorageUnavailableError, match=said):
        silent.list("")
    assert len(blackhole.requests) == TRIES, blackhole.requests
    assert silent.retries == TRIES - 1
    assert any("no reply from" in r.getMessage() and r.levelname == "INFO" for r in caplog.records)
    silent.close()

    blackhole.requests.clear()
    blackhole.answer = 1
    # other options, so not the client the first store shares through fsspec's instance cache
    answered = RetryingStorage(open_storage("s3://bkt/x", _options(blackhole, 0.6)), attempts=4,
                               base_delay=0.01)
    with pytest.raises(FileNotFoundError):
        answered.size("a")  # the 404: the endpoint is there
    with pytest.raises(StorageUnavailableError, match="still failing after 4 attempts"):
        answered.size("b")
    assert [line.split()[0] for line in blackhole.requests] == ["HEAD"] * 5, blackhole.requests
    answered.close()


def test_a_silent_endpoint_that_then_refuses_connections_is_not_one_that_answered(
        blackhole: Blackhole) -> None:
    """Silence is no answer: an endpoint that let a request time out and then refuses
    connections never answered, so the refusals get the quick CONNECT_ATTEMPTS, not every
    attempt with backoff as an endpoint that answered once (a restarting server) gets."""
    blackhole.vanish_after = 1
    storage = RetryingStorage(open_storage("s3://bkt/x", _options(blackhole, 0.5)), attempts=6,
                              base_delay=0.01)
    with pytest.raises(StorageUnavailableError, match=r"the endpoint cannot be reached \(2 attempts\)"):
        storage.list("")
    assert len(blackhole.requests) == 1 and storage.retries == 2, (blackhole.requests, storage.retries)
    storage.close()
