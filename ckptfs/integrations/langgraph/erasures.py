"""Removals of a thread's objects (delete, prune) against the other savers of this process.

A saver that writes a thread keeps some of it in memory: the refs of the checkpoint it wrote
last (the next one points unchanged channels at the objects holding their versions), the values
deltas are computed against, whether a long id's name object is stored, which run markers are.
`delete_thread`, `delete_for_runs` and `prune` remove objects that memory points at. The saver
that removes them forgets it, but another saver of this process on the same store (an admin
endpoint's, a second graph's) shares the thread's lease, so nothing stopped it from writing
on: its next checkpoint pointed at deleted objects (acknowledged, read back from its own cache,
CorruptFileError in every other process), and a long thread id written again had no name
object (`list(None)` skipped the thread). A removal racing a put in flight did the same to that
put's checkpoint.

So per store and thread, one gate in the process: writes pass it together, a removal alone
(it waits for the writes in flight and holds new ones back until it is done), and each removal
opens a new epoch. A saver entering a write in another epoch than its last write's forgets what
it knew of the thread first (`CkptfsSaver._writing`).

Every put passes the gate, so its path is two plain functions under one plain lock, with no
waiting unless a removal is under way: as context managers on a Condition it cost 2.4% of a
10-message put in `benchmarks/langgraph_put.py`'s loop (paired, in one process).
"""

from __future__ import annotations

import os
import threading

_Key = tuple[str, str]  # (store, thread id)
_MAX_EPOCHS = 100_000  # threads whose last removal's epoch is remembered; past it, all start anew

_lock = threading.Lock()
_writers: dict[_Key, int] = {}  # writes in flight
_erasing: dict[_Key, threading.Event] = {}  # a removal under way or waiting: set when it is done
_drained: dict[_Key, threading.Event] = {}  # set when the last write in flight leaves
_epochs: dict[_Key, int] = {}
_seq = 0  # every epoch is new: drawn from one counter
_floor = 0  # the epoch of a thread not in `_epochs` (raised when they are forgotten)


def sequence() -> int:
    """The newest epoch drawn so far: a write whose epoch is greater came after a removal that
    began later than this call."""
    with _lock:
        return _seq


def enter_write(store: str, thread_id: str) -> int:
    """Hold the thread against removals for one write (then `leave_write`, always); returns
    the epoch it is written in. Waits while a removal is under way or waiting."""
    key = (store, thread_id)
    while True:
        with _lock:
            erasing = _erasing.get(key)
            if erasing is None:
                _writers[key] = _writers.get(key, 0) + 1
                return _epochs.get(key, _floor)
        erasing.wait()


def leave_write(store: str, thread_id: str) -> None:
    key = (store, thread_id)
    with _lock:
        left = _writers[key] - 1
        if left:
            _writers[key] = left
            return
        del _writers[key]
        drained = _drained.pop(key, None)
    if drained is not None:
        drained.set()


def enter_erase(store: str, thread_id: str) -> threading.Event:
    """Remove objects of the thread alone in this process (then `leave_erase` with what this
    returns, always): waits for another removal, then holds new writes back and waits for the
    ones in flight."""
    key = (store, thread_id)
    while True:
        with _lock:
            other = _erasing.get(key)
            if other is None:
                mine = _erasing[key] = threading.Event()
                drained = None
                if _writers.get(key):
                    drained = _drained[key] = threading.Event()
                break
        other.wait()
    if drained is not None:
        try:
            drained.wait()
        except BaseException:  # interrupted while waiting: let the writes behind it go on
            with _lock:
                _drained.pop(key, None)
                del _erasing[key]
            mine.set()
            raise
    return mine


def leave_erase(store: str, thread_id: str, mine: threading.Event) -> None:
    """The removal is done: a new epoch begins and the writes held back go on."""
    global _seq, _floor
    key = (store, thread_id)
    with _lock:
        _seq += 1
        if len(_epochs) >= _MAX_EPOCHS and key not in _epochs:
            _epochs.clear()
            _floor = _seq  # every thread's epoch moves on: a saver forgets once too often, never too few
        _epochs[key] = _seq
        del _erasing[key]
    mine.set()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's writes or removals in flight (and the lock may
    have been held at the fork); the epochs stay: the child inherited the savers' memory they
    guard."""
    global _lock
    _lock = threading.Lock()
    _writers.clear()
    _erasing.clear()
    _drained.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
