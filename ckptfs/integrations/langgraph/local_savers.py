"""Which savers this process has on each local store: the other half of the lease-backed read.

While a saver holds a thread's lease, trusted, no other process can write the thread. No other
saver of this process can either, if it is the only one on its store and has been since it last
looked. Then it may read the thread without the stats that look for others' appends
(`CkptfsSaver._sole_tenure`). Another saver, whatever its options (`log=False`, no leases),
writes through objects the first cannot see. That holds even for one made and closed in between,
hence two counts per store: savers live now, and savers made so far.

A store is known by its real path, links resolved: the root may not exist yet when a saver is
made, so its device and inode cannot be the key. Two bind mounts of one store in one process
defeat the count, a documented limit.
"""

from __future__ import annotations

import collections
import threading

from ckptfs.storage.base import Storage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logstore import LogStorage

Root = str

_live: collections.Counter[Root] = collections.Counter()
_made: collections.Counter[Root] = collections.Counter()
_lock = threading.Lock()


def local_root(storage: Storage) -> Root | None:
    """The real path of a local store's root; None for other backends (no lease-backed reads),
    and for a local one behind another wrapper (a RetryingStorage), whose writes this module
    cannot vouch for."""
    inner = storage.inner if isinstance(storage, LogStorage) else storage
    return inner.local_root() if isinstance(inner, LocalStorage) else None


def register(root: Root | None) -> None:
    if root is None:
        return
    with _lock:
        _live[root] += 1
        _made[root] += 1


def unregister(root: Root | None) -> None:
    """Once per `register`: at close, or when the saver is collected (`weakref.finalize`)."""
    if root is None:
        return
    with _lock:
        _live[root] -= 1
        if _live[root] <= 0:
            del _live[root]


def alone(root: Root) -> int | None:
    """Savers made on the store so far when exactly one is live there, else None. Reads of one
    int each, without the lock: a saver made before the call is seen."""
    if _live.get(root) != 1:
        return None
    return _made[root]
