"""memory://: fsspec's in-process store, exclusive within one process."""

from __future__ import annotations

import io
import shutil
import threading
from collections.abc import Mapping
from typing import IO, Any, ClassVar

from ckptfs.storage.base import COPY_CHUNK, Capabilities
from ckptfs.storage.generic import FsspecStorage


class MemoryStorage(FsspecStorage):
    """fsspec's in-process memory store: shared by everything in this process, gone at exit.

    Operations hold one process-wide lock, so exclusive create and compare-and-swap are
    exact among threads. Nothing is durable or visible to other processes.
    """

    capabilities = Capabilities(
        atomic_put=True, exclusive_create=True, conditional_put=True, durable=False, shared=False
    )
    _global_lock: ClassVar[threading.RLock] = threading.RLock()

    def __init__(self, url: str, fs: Any, root: str, options: Mapping[str, Any] | None = None):
        super().__init__(url, fs, root, options)
        self._lock = self._global_lock  # type: ignore[assignment]

    def put(self, key: str, data: bytes) -> str:
        with self._lock:
            return super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        # fsspec's memory exists()/info() scan every key; the store dict answers in O(1).
        with self._lock:
            if self._path(key) in self.fs.store:
                raise FileExistsError(key)
            return super().put(key, data)

    def size(self, key: str) -> int:
        f = self.fs.store.get(self._path(key))
        if f is None:
            raise FileNotFoundError(key)
        return int(f.size)

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        # The memory store holds whole values anyway; assembling first keeps the put atomic.
        buf = io.BytesIO()
        shutil.copyfileobj(src, buf, COPY_CHUNK)
        with self._lock:
            if exclusive and self.exists(key):
                raise FileExistsError(key)
            self.put(key, buf.getvalue())

    def check(self) -> None:
        return None


# ------------------------------------------------------------------------------------- S3
