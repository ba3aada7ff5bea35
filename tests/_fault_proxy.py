"""A loopback HTTP proxy in front of the moto server that injects the faults of a bad network.

Tests point an S3 client at `FaultProxy.endpoint` instead of the server. For each request a
rule picks a `Fault` (or None: forward it as it is):

* `delay`: hold the request this long before acting on it (a slow link, a stalled server);
* `status`/`code`: answer with S3's own error document instead of forwarding (503 SlowDown,
  500 InternalError): the request never reached the store;
* `drop="before"`: close the connection without forwarding: the request never took effect;
* `drop="after"`: forward the request, let it take effect upstream, then close the connection
  without a reply. The client sees a dropped connection for a write that *landed*: the fault
  that makes a retried conditional PUT meet its own object.
* `cut=N`: forward the request; a GET whose reply body is longer than N bytes gets its headers
  (the full Content-Length) and half its body, then the connection closes: a body cut short
  mid-stream, which fails in the client's reads, after its request returned.
* `reply_headers=f`: forward the request and send its reply with the headers `f` makes of the
  upstream's (a list of (name, value), names as the upstream spelt them, without the hop-by-hop
  ones and Server; the framing stays the proxy's): a store whose headers lie or differ, e.g. a
  Last-Modified from a clock a year ahead. The upstream's Date is in the list, and the reply
  carries the Date `f` leaves there, or none if it takes it out: a store clock moved must move
  the server's now (S3's Date, which `Storage.modified_and_now` reads) with the objects' times.
  It applies to replies that are forwarded (with `cut` too), not to an injected `status`. A
  reply `f` changed counts as "rewritten". Without `f`, the proxy's own Date is sent.

Everything binds 127.0.0.1; every request is bounded (upstream timeout, bounded delays), and
the proxy counts what it did, per kind, so a test can show its faults really happened. A client
that resets its connection mid-request (a process the test SIGKILLs) is the test's doing, not a
fault of the proxy: no traceback for it.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import logging
import random
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

_ERROR = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
          "<Message>{code} injected by the test proxy</Message><RequestId>t</RequestId></Error>")
_HOP_BY_HOP = ("transfer-encoding", "connection", "content-length", "keep-alive")
MAX_DELAY = 10.0  # no injected delay may hold a request longer than this

Headers = list[tuple[str, str]]


def dates_moved(headers: Headers, by: Mapping[str, float]) -> Headers:
    """`headers` with each date header `by` names (in lower case) moved by its seconds: a
    `reply_headers` function's way to show a store whose clock is off ours (Last-Modified for
    the objects' times, Date for the server's now)."""

    def moved(value: str, seconds: float) -> str:
        at = email.utils.parsedate_to_datetime(value).timestamp() + seconds
        return email.utils.formatdate(at, usegmt=True)

    return [(k, moved(v, by[k.lower()]) if k.lower() in by else v) for k, v in headers]


@dataclass(frozen=True)
class Request:
    """What a rule sees of a request: method, path with query, headers, arrival number (from 1)."""

    method: str
    path: str
    headers: dict[str, str]
    n: int

    @property
    def conditional(self) -> bool:
        """A conditional write (If-None-Match / If-Match): its retry is the ambiguous case."""
        names = {k.lower() for k in self.headers}
        return self.method == "PUT" and bool(names & {"if-none-match", "if-match"})


@dataclass(frozen=True)
class Fault:
    """What the proxy does to one request (see the module docstring)."""

    delay: float = 0.0
    status: int | None = None
    code: str = "ServiceUnavailable"
    drop: Literal["before", "after"] | None = None
    cut: int | None = None
    reply_headers: Callable[[Headers], Headers] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.delay <= MAX_DELAY:
            raise ValueError(f"delay must be in [0, {MAX_DELAY}] s, got {self.delay}")


Rule = Callable[[Request], Fault | tuple[int, str] | None]


def random_faults(seed: int, *, drop_after: float = 0.0, error: float = 0.0,
                  delay: float = 0.0, delay_range: tuple[float, float] = (0.2, 1.5),
                  drop_after_if: Callable[[Request], bool] | None = None,
                  delay_if: Callable[[Request], bool] | None = None) -> Rule:
    """A seeded rule: each request independently delayed (probability `delay`, uniform in
    `delay_range`), answered 503 SlowDown (`error`), or forwarded then dropped (`drop_after`,
    only for requests `drop_after_if` accepts: by default every PUT)."""
    rng = random.Random(seed)
    lock = threading.Lock()
    may_drop = drop_after_if or (lambda r: r.method == "PUT")
    may_delay = delay_if or (lambda r: True)

    def rule(req: Request) -> Fault | None:
        with lock:
            d = rng.uniform(*delay_range) if may_delay(req) and rng.random() < delay else 0.0
            roll = rng.random()
        if roll < error:
            return Fault(delay=d, status=503, code="SlowDown")
        if may_drop(req) and roll < error + drop_after:
            return Fault(delay=d, drop="after")
        return Fault(delay=d) if d else None

    return rule


class _QuietServer(ThreadingHTTPServer):
    """Silent about clients gone mid-request (see the module docstring)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FaultProxy:
    """A threaded loopback proxy applying `rule` to every request; use it as a context manager.

    `counts` says what happened: forwarded, delayed, error, drop-before, drop-after (the last
    also per method and path in `landed_then_dropped`), cut, rewritten, client-gone (a request
    whose body never came whole, not forwarded).
    """

    def __init__(self, upstream: str, rule: Rule, *, upstream_timeout: float = 30.0) -> None:
        parts = urlsplit(upstream)
        if parts.hostname != "127.0.0.1":
            raise ValueError(f"the fault proxy forwards to 127.0.0.1 only, not {upstream!r}")
        host, port = parts.hostname, parts.port or 80
        self.rule = rule
        self.counts: Counter[str] = Counter()
        self.landed_then_dropped: list[tuple[str, str]] = []
        self.cut_paths: list[str] = []  # paths whose reply body was cut short (`Fault.cut`)
        self._lock = threading.Lock()
        self._n = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def _body(self) -> bytes | None:
                """The whole request body, or None when the client went before sending it all.

                A body cut short is never forwarded: a real server (moto's own, S3) answers
                an incomplete body with an error and stores nothing, while forwarding the
                part that came, re-framed, made moto store a torn object under the client's
                checksum (a SIGKILLed writer's PUT), which no real store can hold.
                """
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    out = b""
                    while True:
                        line = self.rfile.readline()
                        if not line.strip():
                            return None
                        size = int(line.split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        chunk = self.rfile.read(size)
                        if len(chunk) < size:
                            return None
                        out += chunk
                        self.rfile.readline()
                want = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(want)
                return body if len(body) == want else None

            def _hang_up(self) -> None:
                """Close without a reply: the client reads EOF where its response should be."""
                self.close_connection = True
                with contextlib.suppress(OSError):  # the client may have gone already
                    self.connection.shutdown(socket.SHUT_RDWR)

            def _handle(self) -> None:
                body = self._body()
                if body is None:
                    proxy._count("client-gone")
                    self._hang_up()
                    return
                with proxy._lock:
                    proxy._n += 1
                    n = proxy._n
                req = Request(self.command, self.path, dict(self.headers.items()), n)
                fault = proxy.rule(req)
                if isinstance(fault, tuple):
                    fault = Fault(status=fault[0], code=fault[1])
                fault = fault or Fault()
                if fault.delay:
                    proxy._count("delayed")
                    threading.Event().wait(fault.delay)
                if fault.drop == "before":
                    proxy._count("drop-before")
                    self._hang_up()
                    return
                if fault.status is not None:
                    proxy._count("error")
                    doc = b"" if self.command == "HEAD" else _ERROR.format(code=fault.code).encode()
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(host, port, timeout=upstream_timeout)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                if fault.drop == "after":
                    proxy._count("drop-after")
                    with proxy._lock:
                        proxy.landed_then_dropped.append((self.command, self.path))
                    self._hang_up()
                    return
                chop = (fault.cut is not None and self.command == "GET" and resp.status in (200, 206)
                        and len(data) > fault.cut)
                proxy._count("cut" if chop else "forwarded")
                # a rewrite sees the upstream's Date, and only the Date it leaves is sent
                mine = ("server",) if fault.reply_headers is not None else ("server", "date")
                reply = [(k, v) for k, v in resp.getheaders()
                         if k.lower() not in (*_HOP_BY_HOP, *mine)]
                if fault.reply_headers is None:
                    self.send_response(resp.status)  # with the proxy's own Server and Date
                else:
                    rewritten = fault.reply_headers(list(reply))
                    if rewritten != reply:
                        proxy._count("rewritten")
                    reply = [(k, v) for k, v in rewritten if k.lower() not in _HOP_BY_HOP]
                    self.send_response_only(resp.status)
                    self.send_header("Server", self.version_string())
                for k, v in reply:
                    self.send_header(k, v)
                # a HEAD's reply has no body but tells the size of the object's
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if chop:
                    with proxy._lock:
                        proxy.cut_paths.append(self.path.split("?")[0])
                    with contextlib.suppress(OSError):
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                    self._hang_up()
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="fault-proxy")

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        logger.info("fault proxy %s: %s", self.endpoint, dict(self.counts))
