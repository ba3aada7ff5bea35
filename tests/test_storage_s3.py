"""The storage contract over real HTTP against the moto S3 server, plus S3-only failure modes."""

from __future__ import annotations

from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3, free_port
from ckptfs.errors import ConfigError, StorageUnavailableError
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from ckptfs.storage.s3 import S3Storage
from tests.storage_conformance import StorageConformance


@pytest.fixture
def storage(s3_url: str, s3_opts: dict[str, Any]) -> Storage:
    return open_storage(s3_url, s3_opts)


class TestS3(StorageConformance):
    def test_is_s3_backend_over_http(self, storage: Storage, s3: EmbeddedS3) -> None:
        assert isinstance(storage, S3Storage)
        assert s3.endpoint.startswith("http://127.0.0.1:")

    def test_listing_is_fresh_not_cached(self, s3_url: str, s3_opts: dict[str, Any]) -> None:
        a, b = open_storage(s3_url, s3_opts), open_storage(s3_url, s3_opts)
        a.put("p/1", b"1")
        assert b.list("p") == ["p/1"]
        a.put("p/2", b"2")
        assert b.list("p") == ["p/1", "p/2"]

    def test_zero_byte_exclusive_put_refused(self, storage: Storage) -> None:
        storage.put("z", b"content")
        with pytest.raises(ValueError, match="zero bytes"):
            storage.put_if_absent("z", b"")
        assert storage.get("z") == b"content"

    def test_missing_bucket_is_unavailable_and_names_url(self, s3: EmbeddedS3) -> None:
        opts = s3.storage_options
        st = open_storage("s3://no-such-bucket-xyz/p", opts)
        with pytest.raises(StorageUnavailableError, match="s3://no-such-bucket-xyz/p") as ei:
            st.put("k", b"1")
        assert opts["secret"] not in str(ei.value)
        with pytest.raises(StorageUnavailableError):
            st.check()

    def test_unreachable_endpoint_is_unavailable(self) -> None:
        opts = {"key": "AKIAFAKE", "secret": "supersecretvalue",
                "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
                "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
        st = open_storage("s3://some-bucket/p", opts)
        with pytest.raises(StorageUnavailableError) as ei:
            st.check()
        assert "supersecretvalue" not in str(ei.value)
        assert "s3://some-bucket/p" in str(ei.value)

    def test_invalid_bucket_name_is_config_error(self) -> None:
        with pytest.raises(ConfigError, match="not a valid S3 bucket name"):
            open_storage("s3://A_B/p")


def test_malformed_endpoint_is_config_error_without_secret() -> None:
    opts = {"key": "AKIAFAKE", "secret": "hush-hush-secret", "client_kwargs": {"endpoint_url": "not a url"}}
    with pytest.raises((ConfigError, StorageUnavailableError)) as ei:
        open_storage("s3://some-bucket/p", opts).put("k", b"1")
    assert "hush-hush-secret" not in str(ei.value) and "s3://some-bucket/p" in str(ei.value)
