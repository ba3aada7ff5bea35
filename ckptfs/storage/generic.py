"""Any other fsspec filesystem: a documented fallback whose weaker guarantees are logged once."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from typing import IO, Any, ClassVar

from ckptfs.storage.base import COPY_CHUNK, Capabilities, Keys, PreconditionFailed, Storage, check_key

logger = logging.getLogger(__name__)


class FsspecStorage(Storage):
    """Any fsspec filesystem, through its plain API: the documented weakest fallback.

    `put_if_absent` is exists-then-write and `put_if_match` is read-compare-write: both can
    race between processes, and writes are atomic only if the filesystem makes them so.
    The weaker guarantee is logged once per protocol.
    """

    capabilities = Capabilities(
        atomic_put=False, exclusive_create=False, conditional_put=False, durable=False, shared=True,
        remote=True,
    )
    _warned: ClassVar[set[str]] = set()

    def __init__(self, url: str, fs: Any, root: str, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        self.fs = fs
        self.root = root.rstrip("/")
        self._lock = threading.Lock()
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if type(self) is FsspecStorage and proto not in self._warned:
            self._warned.add(proto)
            logger.warning(
                "ckptfs: %s:// has no exclusive create or compare-and-swap here; concurrent "
                "writers to one run can race. Use local disk or S3 for those guarantees.", proto)

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def local_root(self) -> str | None:
        """fsspec's local file system, given in code, is a directory on this machine too: an
        export must not write into it (a file:// or local:// URL opens LocalStorage instead)."""
        from fsspec.implementations.local import LocalFileSystem

        return os.path.realpath(self.root) if isinstance(self.fs, LocalFileSystem) else None

    def location(self) -> tuple[str, str]:
        kind = type(self.fs)
        return f"{kind.__module__}.{kind.__qualname__}", self.root.strip("/")

    def _etag_of(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def put(self, key: str, data: bytes) -> str:
        self.fs.pipe_file(self._path(key), data)
        return self._etag_of(data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        with self._lock:
            if self.fs.exists(self._path(key)):
                raise FileExistsError(key)
            return self.put(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        with self._lock:
            current = self.get_with_etag(key)[1]
            if current != etag:
                raise PreconditionFailed(f"{key}: etag is {current}, expected {etag}")
            return self.put(key, data)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        try:
            data = bytes(self.fs.cat_file(self._path(key)))
        except (IsADirectoryError, NotADirectoryError):
            raise FileNotFoundError(key) from None
        return data, self._etag_of(data)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        base = f"{self.root}/{prefix}".rstrip("/")
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        n = len(self.root) + 1
        out = sorted(p.lstrip("/")[n - 1 :] if not p.startswith("/") else p[n:] for p in found)
        out = [k for k in out if k.startswith(prefix)]
        return [k for k in out if start_after is None or k > start_after]

    def list_dirs(self, prefix: str) -> Keys:
        base = f"{self.root}/{prefix}".rstrip("/")
        try:
            entries = self.fs.ls(base, detail=True)
        except FileNotFoundError:
            return []
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries
                      if e.get("type") == "directory")

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    def size(self, key: str) -> int:
        info = self.fs.info(self._path(key))
        if info.get("type") == "directory":
            raise FileNotFoundError(key)
        return int(info["size"])

    def modified(self, key: str) -> float:
        info = self.fs.info(self._path(key))
        for name in ("mtime", "LastModified", "last_modified", "created"):
            value = info.get(name)
            if isinstance(value, int | float):
                return float(value)
            if hasattr(value, "timestamp"):
                return float(value.timestamp())
        raise NotImplementedError(f"{self.fs.protocol}: no modification time in file info")

    def touch(self, key: str) -> None:
        path = self._path(key)
        self.fs.pipe_file(path, self.fs.cat_file(path))  # no portable utime in fsspec: rewrite

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        if exclusive and self.exists(key):
            raise FileExistsError(key)
        with self.fs.open(self._path(key), "wb") as f:
            shutil.copyfileobj(src, f, COPY_CHUNK)

    def open_read(self, key: str) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self._path(key), "rb")
        return f


