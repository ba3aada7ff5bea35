"""The embedded S3 server used by `make demo` and the tests: moto on 127.0.0.1.

Starts a real HTTP S3 endpoint (moto's WSGI app on werkzeug's threaded server), waits until it
answers, creates the bucket, and stops cleanly. Nothing leaves the machine: it binds loopback
only. Writes are made atomic here (`AtomicWrites`), as S3's are: moto checks a conditional PUT's
If-None-Match / If-Match and then stores, unlocked, so two racing exclusive creates could both
succeed (6 threads racing one key under load: 2 winners in 1 of 150 races).

    python -m backends.s3.embedded --bucket ckptfs-demo     # runs until Ctrl-C
    with EmbeddedS3(bucket="my-bucket") as s3: CheckpointStore(s3.url("prefix"), s3.storage_options)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import signal
import socket
import threading
import time
import urllib.request
from typing import Any

# moto accepts any credentials; fixed fake ones keep boto from searching the machine for real ones.
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "FAKEACCESSKEYID0001",
    "AWS_SECRET_ACCESS_KEY": "fake-secret-not-real-0001",
}


_WRITES = frozenset({"PUT", "POST", "DELETE"})


class AtomicWrites:
    """WSGI middleware: one object-changing request at a time, its body read before the lock.

    S3 decides a conditional write atomically against every other write to the key; moto's
    check-then-store does not, under a threaded server. ckptfs's exclusivity (commits, leases,
    fences) rests on that atomicity, so the embedded server provides it. Reads stay parallel,
    and a slow upload does not hold the lock (its body is read first).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in _WRITES:
            return self.app(environ, start_response)
        from werkzeug.wsgi import get_input_stream  # honours Content-Length and chunked bodies

        body = get_input_stream(environ).read()
        environ.pop("wsgi.input_terminated", None)  # now a plain body of CONTENT_LENGTH bytes
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        with self.lock:
            return list(self.app(environ, start_response))  # the whole reply, under the lock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedS3:
    def __init__(self, port: int | None = None, bucket: str | None = "ckptfs-demo",
                 region: str = "us-east-1") -> None:
        self.port = port or free_port()
        self.bucket = bucket
        self.region = region
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "key": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": self.region},
        }

    def url(self, prefix: str = "", bucket: str | None = None) -> str:
        b = bucket or self.bucket
        return f"s3://{b}/{prefix}".rstrip("/")

    def start(self, timeout: float = 20.0) -> EmbeddedS3:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        for k, v in FAKE_CREDENTIALS.items():
            os.environ.setdefault(k, v)
        os.environ.setdefault("AWS_DEFAULT_REGION", self.region)
        # werkzeug prints one line per request unless told otherwise: a demo or a benchmark
        # doing thousands of requests would drown its own output
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app = AtomicWrites(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", self.port, app, threaded=True,
                                   request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="embedded-s3",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"embedded S3 did not answer on {self.endpoint}") from None
                time.sleep(0.05)
        if self.bucket:
            self.create_bucket(self.bucket)
        return self

    def _client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def create_bucket(self, bucket: str) -> None:
        client = self._client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API), then recreate the default bucket."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass
        if self.bucket:
            self.create_bucket(self.bucket)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join()
            self._server = self._thread = None

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="Run the embedded S3 server (moto) on 127.0.0.1.")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--bucket", default="ckptfs-demo")
    args = ap.parse_args()
    s3 = EmbeddedS3(port=args.port, bucket=args.bucket).start()
    print(f"embedded S3 on {s3.endpoint}, bucket s3://{args.bucket}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        s3.stop()


if __name__ == "__main__":
    main()
