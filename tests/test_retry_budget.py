"""One retry budget: under `--attempts N` a request that always fails is sent N times in all.

Three layers used to retry beneath each other: botocore (legacy mode, 5 attempts with backoff
for 5xx and throttling), s3fs (5 more tries around each botocore call for SlowDown) and
RetryingStorage. They multiplied: `ckptfs mirror --attempts 2` sent one snapshot PUT answered
503 SlowDown 50 times and took 77-84 s to give up on it. Counted here at a loopback proxy in front
of the moto server, driving the installed `ckptfs` executable, as a user would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _fault_proxy import Fault, FaultProxy, Request
from test_mirror import POLICY, work

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore
from ckptfs.errors import StorageUnavailableError
from ckptfs.storage.base import PreconditionFailed
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage

RUN = "paper-run"
BOUND = 30.0  # seconds: generous; the point is about 80 s before, a second or two now


class _Snapshot:
    """A proxy rule failing the first `fail` requests for the run's snapshot key (`fail=None`:
    every one), and counting every request for that key, whatever the method."""

    def __init__(self, fail: int | None, status: int = 503, code: str = "SlowDown") -> None:
        self.fail, self.status, self.code = fail, status, code
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, req: Request) -> Fault | None:
        path = req.path.split("?")[0]
        if "/snap/" not in path:
            return None
        with self._lock:
            self.seen.append((req.method, path))
            n = len(self.seen)
        if self.fail is None or n <= self.fail:
            return Fault(status=self.status, code=self.code)
        return None

    @property
    def keys(self) -> set[str]:
        return {p for _, p in self.seen}


def _source(tmp_path: Path) -> str:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 24)
    store.close()
    return src


def _mirror(s3: EmbeddedS3, src: str, url: str, rule: Callable[[Request], Fault | None],
            *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    cli = str(Path(sys.executable).parent / "ckptfs")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.storage_options["key"],
           "AWS_SECRET_ACCESS_KEY": s3.storage_options["secret"]}
    with FaultProxy(s3.endpoint, rule) as proxy:
        start = time.monotonic()
        got = subprocess.run(
            [cli, "mirror", src, url, "--once", "--json", "--no-progress", *extra,
             "--to-option", f"client_kwargs.endpoint_url={proxy.endpoint}",
             "--to-option", f"client_kwargs.region_name={s3.region}"],
            capture_output=True, text=True, env=env, timeout=300)
        return got, time.monotonic() - start


@pytest.mark.parametrize(("attempts", "status", "code"), [
    (2, 503, "SlowDown"),            # throttling: every layer used to retry it
    (3, 503, "ServiceUnavailable"),
    (1, 500, "InternalError"),       # --attempts 1: one request, no retry beneath it either
])
def test_a_key_that_always_fails_is_sent_as_many_times_as_attempts_says(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path, attempts: int, status: int, code: str) -> None:
    src = _source(tmp_path)
    rule = _Snapshot(fail=None, status=status, code=code)
    got, took = _mirror(s3, src, s3_url, rule, "--attempts", str(attempts))
    assert got.returncode == 1, got.stderr[-3000:]  # the run is incomplete: exit 1
    assert len(rule.keys) == 1, rule.seen
    key = "runs/" + rule.keys.pop().split("/runs/", 1)[1]
    doc = json.loads(got.stdout)
    missing = " ".join(doc["missing"])
    assert doc["ok"] is False and "/snap/" in missing and code in missing, doc
    assert f"after {attempts} attempt" in missing, missing
    assert key in missing, (key, missing)
    assert len(rule.seen) == attempts, rule.seen
    assert all(method == "PUT" for method, _ in rule.seen), rule.seen
    assert took < BOUND


def test_a_transient_503_is_retried_by_ckptfs_and_the_mirror_completes(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    src = _source(tmp_path)
    rule = _Snapshot(fail=2)
    got, took = _mirror(s3, src, s3_url, rule)  # the default attempts (mirror.attempts: 6)
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout)["ok"] is True
    assert [m for m, _ in rule.seen] == ["PUT", "PUT", "PUT"], rule.seen  # 2 refused, 1 landed
    # ckptfs's layer did the retrying, with its backoff, and says so in the log
    assert "retry 1/5" in got.stderr and "retry 2/5" in got.stderr, got.stderr[-3000:]
    assert took < BOUND
    mirrored = CheckpointStore(s3_url, s3.storage_options).load_run(RUN)
    assert mirrored is not None and mirrored == CheckpointStore(src).load_run(RUN)


def _put_count(s3: EmbeddedS3, s3_url: str, options: dict[str, Any], attempts: int) -> int:
    """PUTs of one object answered 503 every time, through RetryingStorage(attempts)."""
    seen: list[str] = []

    def rule(req: Request) -> Fault | None:
        if req.method == "PUT" and req.path.split("?")[0].endswith("/k"):
            seen.append(req.path)
            return Fault(status=503, code="ServiceUnavailable")
        return None

    with FaultProxy(s3.endpoint, rule) as proxy:
        opts = {**s3.storage_options, **options,
                "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": s3.region}}
        storage = RetryingStorage(open_storage(s3_url, opts), attempts=attempts, base_delay=0.01)
        with pytest.raises(StorageUnavailableError, match=f"after {attempts} attempt"):
            storage.put("k", b"x")
    return len(seen)


def test_retries_a_user_sets_for_botocore_are_kept(s3: EmbeddedS3, s3_url: str) -> None:
    assert _put_count(s3, s3_url, {}, attempts=2) == 2
    mine = {"config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 3}}}
    assert _put_count(s3, s3_url, mine, attempts=2) == 2 * 3  # theirs, beneath ckptfs's


def test_only_a_storage_retried_by_ckptfs_has_its_client_retries_off(s3: EmbeddedS3,
                                                                     s3_url: str) -> None:
    plain: Any = open_storage(s3_url, s3.storage_options)
    inner: Any = RetryingStorage(open_storage(s3_url, s3.storage_options), attempts=4).inner
    plain_fs = plain.fs
    assert inner.fs.retries == 1 and plain_fs.retries > 1
    assert inner.fs is not plain_fs
    inner.check()
    plain.check()
    assert inner.fs.s3.meta.config.retries == {"mode": "standard", "total_max_attempts": 1}
    assert plain_fs.s3.meta.config.retries == {"mode": "legacy"}  # botocore's defaults, as before



def test_a_conditional_put_that_landed_before_its_reply_was_lost_still_succeeds(
        s3: EmbeddedS3, s3_url: str) -> None:
    """With the client's retries off, a conditional PUT whose first attempt landed and lost
    its reply is still told from a rival's write when resent. aiohttp resends a PUT whose
    connection closed unanswered once by itself (RFC 9112 9.3.1: PUT is idempotent), so the
    first two are dropped: RetryingStorage's retry is then the one meeting the object."""
    drops = [0]

    def rule(req: Request) -> Fault | None:
        if req.conditional and drops[0] < 2:
            drops[0] += 1
            return Fault(drop="after")  # forwarded (created upstream), then hung up on
        return None

    with FaultProxy(s3.endpoint, rule) as proxy:
        opts = {**s3.storage_options,
                "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": s3.region}}
        storage = RetryingStorage(open_storage(s3_url, opts), attempts=3, base_delay=0.01)
        storage.put_if_absent("k", b"mine")  # the retry met 412 for our own bytes: it landed
        assert proxy.counts["drop-after"] == 2 and storage.retries == 1
        with pytest.raises(FileExistsError):  # a rival's bytes, first attempt: a plain refusal
            storage.put_if_absent("k", b"a rival's")
        etag = storage.get_with_etag("k")[1]
        drops[0] = 0
        storage.put_if_match("k", b"mine, again", etag)  # If-Match then met its own new etag
        assert proxy.counts["drop-after"] == 4 and storage.retries == 2
        with pytest.raises(PreconditionFailed):
            storage.put_if_match("k", b"stale", etag)
    assert open_storage(s3_url, s3.storage_options).get("k") == b"mine, again"
