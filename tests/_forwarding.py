"""A Storage that forwards every call to another: tests subclass it to inject one fault or to
record calls, overriding only the method they are about."""

from __future__ import annotations

from typing import IO

from ckptfs.storage.base import Storage


class Forwarding(Storage):
    def __init__(self, inner: Storage) -> None:
        super().__init__(inner.url, inner.options)
        self.inner = inner
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.display_url = inner.display_url

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self.inner.put_if_match(key, data, etag)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self.inner.get_with_etag(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self.inner.list(prefix, start_after)

    def list_dirs(self, prefix: str) -> list[str]:
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def modified(self, key: str) -> float:
        return self.inner.modified(key)

    def touch(self, key: str) -> None:
        self.inner.touch(key)

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        self.inner.put_stream(key, src, exclusive)

    def open_read(self, key: str) -> IO[bytes]:
        return self.inner.open_read(key)

    def check(self) -> None:
        self.inner.check()
