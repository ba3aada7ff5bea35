"""A GroupCommitter whose one writer thread is held: what is submitted meanwhile shares a write."""

from __future__ import annotations

import concurrent.futures
import threading

from ckptfs import CheckpointStore
from ckptfs.store.group_commit import GroupCommitter


class OneWrite:
    """A GroupCommitter whose writer is held until `write()`: what is submitted before it
    shares one grouped write (checked by `write`)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.gate = threading.Event()
        self.pool.submit(self.gate.wait)
        self.committer = GroupCommitter(store, self.pool)

    def write(self) -> None:
        self.close()
        assert (self.committer.writes, self.committer.parts) == (1, 2)  # one group of two

    def close(self) -> None:
        self.gate.set()
        self.pool.shutdown(wait=True)
