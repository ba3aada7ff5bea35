"""Thread pools that keep working once the interpreter is shutting down.

When the main thread returns, threading runs concurrent.futures' exit hook before it joins the
non-daemon threads; from then on every `ThreadPoolExecutor.submit` raises. A program whose
non-daemon thread outlives the main one (a worker loop, a graph run handed to a thread) would
then fail to load, verify, mirror or commit on a store that is fine. These pools run such work
in the calling thread instead; any other refusal (the pool itself shut down) is raised as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

# What ThreadPoolExecutor.submit raises once concurrent.futures' exit hook has run (threading
# runs it when the main thread returns, before it joins the non-daemon threads): the first
# until the pool's own thread has seen the hook, the second after (the thread marks its pool
# shut down on its way out), as if the owner had shut it down.
_REFUSED_AT_EXIT = ("cannot schedule new futures after interpreter shutdown",
                    "cannot schedule new futures after shutdown")


class StorePool(ThreadPoolExecutor):
    """A pool whose work, submitted once the interpreter is shutting down, runs in the caller.

    Unordered (the default) suits pools that only overlap round trips and decompression: the
    same work done in turn gives the same result. `ordered=True` is for a one-thread pool whose
    tasks must run one at a time in the order submitted (the agent's store writes: a step's
    completion never lands before those it depended on): work run in the caller first waits
    for everything submitted before it, and such runs take turns.
    """

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "", *,
                 ordered: bool = False) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._ordered = ordered
        self._last: Future[Any] | None = None  # ordered: the newest task the pool accepted
        self._turns = threading.Lock()  # ordered: one task run in a caller at a time
        self._closed = False  # shut down by its owner: a refusal then is one

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        try:
            fut = super().submit(fn, *args, **kwargs)
        except RuntimeError as exc:
            if self._closed or str(exc) not in _REFUSED_AT_EXIT:
                raise
        else:
            if self._ordered:
                self._last = fut
            return fut
        if not self._ordered:
            return _run_here(fn, *args, **kwargs)
        with self._turns:
            if self._last is not None:
                wait([self._last])  # the pool's thread finishes its queue before it exits
            return _run_here(fn, *args, **kwargs)


def _run_here(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
    done: Future[_T] = Future()
    try:
        done.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # on the future, as a worker thread would put it
        done.set_exception(exc)
    return done
