"""Core claims that need their own set-up: refused credentials, the fsspec fallback, bounded memory."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import fsspec
import pytest

from backends.s3.embedded import free_port
from ckptfs import CheckpointStore, StorageUnavailableError
from ckptfs.storage.generic import FsspecStorage
from ckptfs.storage.registry import open_storage
from tests.storage_conformance import StorageConformance

ROOT = str(Path(__file__).resolve().parent.parent)


@pytest.fixture
def authenticating_s3() -> Any:
    """A moto server that checks credentials (after the one request that creates the bucket)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "1", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "backends.s3.embedded", "--port", str(port),
                             "--bucket", "authbucket"], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "embedded S3" in proc.stdout.readline()
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def test_refused_credentials_are_one_clear_error(authenticating_s3: str) -> None:
    opts = {"key": "AKIANOTAREALKEY00000", "secret": "wrong-secret-value-123",
            "client_kwargs": {"endpoint_url": authenticating_s3}}
    store = CheckpointStore("s3://authbucket/p", storage_options=opts)
    with pytest.raises(StorageUnavailableError) as ei:
        store.load_run("some-run")
    msg = str(ei.value)
    assert "s3://authbucket/p" in msg and "access refused" in msg, msg
    assert "wrong-secret-value-123" not in msg and "AKIANOTAREALKEY00000" not in msg


@pytest.fixture
def storage(memory_url: str) -> FsspecStorage:
    """The generic fallback, driven through an fsspec filesystem it knows nothing special about."""
    return FsspecStorage(memory_url, fsspec.filesystem("memory"), "/" + memory_url.split("://")[1])


class TestFsspecFallback(StorageConformance):
    def test_capabilities_say_what_is_missing(self, storage: FsspecStorage) -> None:
        caps = storage.capabilities
        assert not caps.exclusive_create and not caps.conditional_put and not caps.durable

    def test_weaker_guarantee_is_logged_once(self, caplog: pytest.LogCaptureFixture) -> None:
        FsspecStorage._warned.discard("memory")
        caplog.set_level(logging.WARNING)
        for _ in range(3):
            FsspecStorage("memory://x", fsspec.filesystem("memory"), "/x")
        warnings = [r for r in caplog.records if "no exclusive create" in r.getMessage()]
        assert len(warnings) == 1

    def test_a_store_runs_on_it(self, storage: FsspecStorage) -> None:
        from ckptfs import AgentRun, Step

        store = CheckpointStore(storage=storage)
        run = AgentRun(run_id="fb", goal="g")
        run.add_step(Step(id="a", title="a"))
        store.save_run(run)
        assert CheckpointStore(storage=storage).load_run("fb") == run


def test_unknown_scheme_names_the_problem() -> None:
    from ckptfs import ConfigError

    with pytest.raises(ConfigError, match="unknown storage scheme 'nosuchfs'"):
        open_storage("nosuchfs://bucket/x")


def test_large_artifact_is_streamed_not_held(tmp_path: Path) -> None:
    """A 128 MB file goes in and comes out with a few MB of Python memory at most."""
    src = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(128):
            f.write(block)
    store = CheckpointStore(str(tmp_path / "store"))
    tracemalloc.start()
    t0 = time.perf_counter()
    ref = store.put_artifact(src)
    with store.open_artifact(ref) as f:
        while f.read(1 << 20):
            pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ref.size == 128 << 20
    assert peak < 16 << 20, f"peak Python allocation {peak / 1e6:.1f} MB for a 128 MB artifact"
    assert time.perf_counter() - t0 < 120


def test_moto_launcher_answers_health_checks() -> None:
    from backends.s3.embedded import EmbeddedS3

    with EmbeddedS3(bucket="launcher-check") as s3:
        with urllib.request.urlopen(f"{s3.endpoint}/moto-api/", timeout=5) as resp:
            assert resp.status == 200
        assert open_storage(s3.url("x"), s3.storage_options).list("") == []


def test_cli_with_refused_credentials_exits_2_without_secret(authenticating_s3: str) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    for cmd in (["verify", "s3://authbucket/p"], ["runs", "s3://authbucket/p"]):
        out = subprocess.run(
            [str(Path(sys.executable).parent / "ckptfs"), *cmd,
             "-o", "key=AKIANOTAREALKEY00000", "-o", "secret=wrong-secret-value-123",
             "-o", f"client_kwargs.endpoint_url={authenticating_s3}"],
            capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 2, (cmd, out.stdout, out.stderr)
        text = out.stdout + out.stderr
        assert "s3://authbucket/p" in text
        assert "wrong-secret-value-123" not in text and "Traceback" not in text
