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
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

_MAX_EPOCHS = 100_000  # threads whose last removal's epoch is remembered; past it, all start anew


@dataclass
class _Gate:
    writers: int = 0
    erasing: bool = False
    waiting: int = 0  # removals waiting: new writes wait behind them


_cond = threading.Condition()
_gates: dict[tuple[str, str], _Gate] = {}
_epochs: dict[tuple[str, str], int] = {}
_seq = 0  # every epoch is new: drawn from one counter
_floor = 0  # the epoch of a thread not in `_epochs` (raised when they are forgotten)


def _gate(key: tuple[str, str]) -> _Gate:
    gate = _gates.get(key)
    if gate is None:
        gate = _gates[key] = _Gate()
    return gate


def _done(key: tuple[str, str], gate: _Gate) -> None:
    if not (gate.writers or gate.erasing or gate.waiting):
        _gates.pop(key, None)
    _cond.notify_all()


@contextlib.contextmanager
def writing(store: str, thread_id: str) -> Iterator[int]:
    """Hold the thread against removals for one write; yields the epoch it is written in."""
    key = (store, thread_id)
    with _cond:
        gate = _gate(key)
        while gate.erasing or gate.waiting:
            _cond.wait()
        gate.writers += 1
        epoch = _epochs.get(key, _floor)
    try:
        yield epoch
    finally:
        with _cond:
            gate.writers -= 1
            _done(key, gate)


@contextlib.contextmanager
def erasing(store: str, thread_id: str) -> Iterator[None]:
    """Remove objects of the thread alone in this process; a new epoch begins when done."""
    global _seq, _floor
    key = (store, thread_id)
    with _cond:
        gate = _gate(key)
        gate.waiting += 1
        try:
            while gate.erasing or gate.writers:
                _cond.wait()
        except BaseException:  # interrupted while waiting: let the writes behind it go on
            gate.waiting -= 1
            _done(key, gate)
            raise
        gate.waiting -= 1
        gate.erasing = True
    try:
        yield
    finally:
        with _cond:
            _seq += 1
            if len(_epochs) >= _MAX_EPOCHS and key not in _epochs:
                _epochs.clear()
                _floor = _seq  # every thread's epoch moves on: a saver forgets once too often, never too few
            _epochs[key] = _seq
            gate.erasing = False
            _done(key, gate)


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's writes in flight (and the lock may have been held
    at the fork); the epochs stay: the child inherited the savers' memory they guard."""
    global _cond
    _cond = threading.Condition()
    _gates.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
