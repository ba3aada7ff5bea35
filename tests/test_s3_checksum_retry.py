"""A GET whose body fails the checksum the server sent with it (bytes damaged or cut in
transit) is a transient fault: the storage maps it to StorageUnavailableError and a retrying
storage sends the GET again. It was raised raw, not retried, and `ckptfs prune` exited 3
("unexpected FlexibleChecksumError ... calculated checksum AAAAAA==", an empty body over moto,
about once in 17 runs of a chain test)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import FlexibleChecksumError

from ckptfs import open_storage
from ckptfs.errors import StorageUnavailableError
from ckptfs.storage.retry import RetryingStorage, is_transient


def _damage_first_gets(storage: Any, times: int) -> list[str]:
    """The next `times` get_object calls, over real HTTP to moto, fail as a damaged body does."""
    fs = storage.fs
    real = fs._call_s3
    seen: list[str] = []

    async def call(method: str, *args: Any, **kw: Any) -> Any:
        if method == "get_object" and len(seen) < times:
            seen.append(kw["Key"])
            await real(method, *args, **kw)  # the request goes out; its body is then refused
            raise FlexibleChecksumError(error_msg="Expected checksum x did not match calculated "
                                                  "checksum: AAAAAA==")
        return await real(method, *args, **kw)

    fs._call_s3 = call
    return seen


def test_a_damaged_body_is_retried_and_the_bytes_come_back(s3_url: str, s3_opts: dict[str, Any]) -> None:
    inner = open_storage(s3_url, s3_opts)
    inner.put("k", b"payload")
    storage = RetryingStorage(inner, attempts=4, base_delay=0.0)
    seen = _damage_first_gets(storage.inner, 2)  # the single-attempt client it sends through
    assert storage.get("k") == b"payload"
    assert len(seen) == 2  # two damaged answers, then a good one


def test_without_retries_it_is_storage_unavailable_not_an_unexpected_error(
        s3_url: str, s3_opts: dict[str, Any]) -> None:
    inner = open_storage(s3_url, s3_opts)
    inner.put("k", b"payload")
    _damage_first_gets(inner, 1)
    with pytest.raises(StorageUnavailableError) as info:
        inner.get("k")
    assert is_transient(info.value)
