"""Shared fixtures: one moto S3 server over real HTTP per test session, reset between tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from tests import _cli_fork

# `ckptfs` commands run by subprocess.run start by fork from a warm parent (tests/_cli_fork.py;
# CKPTFS_TEST_FORK=0 turns it off): the interpreter's start and the imports were ~40% of the
# suite's CPU.
_cli_fork.install()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[EmbeddedS3]:
    with EmbeddedS3(bucket="ckptfs-test") as server:
        yield server


@pytest.fixture
def s3(s3_server: EmbeddedS3) -> EmbeddedS3:
    s3_server.reset()
    return s3_server


@pytest.fixture
def s3_url(s3: EmbeddedS3) -> str:
    return s3.url(f"t-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def s3_opts(s3: EmbeddedS3) -> dict[str, Any]:
    return s3.storage_options


@pytest.fixture
def memory_url() -> str:
    return f"memory://t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["local", "memory", "s3"])
def any_store_url(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any]]:
    """(url, storage_options) for each backend: the same test runs on all three."""
    if request.param == "local":
        return str(tmp_path / "store"), {}
    if request.param == "memory":
        return f"memory://t-{uuid.uuid4().hex[:10]}", {}
    s3: EmbeddedS3 = request.getfixturevalue("s3")
    return s3.url(f"t-{uuid.uuid4().hex[:8]}"), s3.storage_options


@pytest.fixture(params=["local", "s3"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any]]:
    """(url, storage_options) of each backend several processes can share (leases need it)."""
    if request.param == "local":
        return str(tmp_path / "store"), {}
    s3: EmbeddedS3 = request.getfixturevalue("s3")
    return s3.url(f"t-{uuid.uuid4().hex[:8]}"), s3.storage_options
