"""The store's thread pools, which keep working once the interpreter is shutting down.

Once the main thread has returned, every pool refuses work (see storage/exit_pools.py), and a
program whose non-daemon thread outlives the main one would fail to load, verify, mirror or
commit on a store that is fine. These pools run such work in the calling thread instead; any
other refusal (the pool itself shut down) is raised as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from functools import partial
from typing import Any, ParamSpec, TypeVar

from ckptfs.storage.exit_pools import ExitAwarePool

_P = ParamSpec("_P")
_T = TypeVar("_T")

_FollowUp = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class StorePool(ExitAwarePool):
    """A pool whose work, submitted once the interpreter is shutting down, runs in the caller.

    Unordered (the default) suits pools that only overlap round trips and decompression: the
    same work done in turn gives the same result. `ordered=True` is for a one-thread pool whose
    tasks must run one at a time in the order submitted (the agent's store writes: a step's
    completion never lands before those it depended on): work run in the caller first waits
    for everything accepted before it, and such runs take turns. What a task of the pool
    submits to it at exit runs after that task, as the pool's queue would have run it (waiting
    instead, for the task itself or its turn, never ended): after its future is set too, or a
    caller waiting on the task could see the follow-up's effect first, and a follow-up waiting
    on its task would never end. So the future handed out is set by the task itself, and the
    pool's own future for it (what later work waits its turn on) only once its follow-ups ran.
    """

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "", *,
                 ordered: bool = False) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._ordered = ordered
        self._last: Future[Any] | None = None  # ordered: the newest task the pool accepted
        self._order = threading.Lock()  # ordered: a task accepted and noted newest at once
        self._turns = threading.Lock()  # ordered: one task run in a caller at a time
        self._running = threading.local()  # ordered: `follow_ups` of this thread's running task

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        if not self._ordered:
            try:
                return super().submit(fn, *args, **kwargs)
            except RuntimeError as exc:
                if not self.refused_at_exit(exc):
                    raise
            return _run_here(fn, *args, **kwargs)
        done: Future[_T] = Future()
        with self._order:
            try:
                turn = super().submit(self._task, done, fn, args, kwargs)
            except RuntimeError as exc:
                if not self.refused_at_exit(exc):
                    raise
                last = self._last
            else:
                self._last = turn
                turn.add_done_callback(partial(_cancel_with, done))
                return done
        follow_ups: list[_FollowUp] | None = getattr(self._running, "follow_ups", None)
        if follow_ups is not None:  # a task of this pool is running here: after it, in order
            follow_ups.append((done, fn, args, kwargs))
            return done
        with self._turns:
            if last is not None:
                wait([last])  # the pool's thread finishes its queue before it exits
            self._task(done, fn, args, kwargs)
        return done

    def _task(self, done: Future[_T], fn: Callable[..., _T], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
        """One task of an ordered pool; what it submits once the pool refuses runs after it,
        its future set (a waiter on it must not see a follow-up's effect first)."""
        if not done.set_running_or_notify_cancel():  # cancelled by whoever holds it
            return
        outer = getattr(self._running, "follow_ups", None)
        follow_ups: list[_FollowUp] = []
        self._running.follow_ups = follow_ups  # the future's callbacks submit after it too
        try:
            _settle(done, fn, *args, **kwargs)
        finally:
            self._running.follow_ups = outer
        for later, f, a, k in follow_ups:  # each a task of its own, its follow-ups after it
            self._task(later, f, a, k)


def _cancel_with(done: Future[Any], turn: Future[Any]) -> None:
    """A turn the pool cancelled (shut down with cancel_futures) never runs: nor does its task."""
    if turn.cancelled():
        done.cancel()


def _settle(done: Future[Any], fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
    try:
        done.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # on the future, as a worker thread would put it
        done.set_exception(exc)


def _run_here(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
    done: Future[_T] = Future()
    _settle(done, fn, *args, **kwargs)
    return done
