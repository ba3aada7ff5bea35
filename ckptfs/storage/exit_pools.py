"""Thread pools that tell "the interpreter is exiting" from "my owner shut me down".

When the main thread returns, threading runs concurrent.futures' exit hook before it joins the
non-daemon threads; from then on every `ThreadPoolExecutor.submit` raises. A program whose
non-daemon thread outlives the main one (a worker loop, a graph run handed to a thread, an
atexit handler) would then fail to reach a store that is fine. The pools here know which
refusal they got, so their users can run such work elsewhere and still raise the other.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

# What ThreadPoolExecutor.submit raises once the exit hook has run: the first until the pool's
# own thread has seen the hook, the second after (the thread marks its pool shut down on its
# way out), as if the owner had shut it down.
_REFUSED_AT_EXIT = ("cannot schedule new futures after interpreter shutdown",
                    "cannot schedule new futures after shutdown")

_EXIT_SAFE_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_LOOPS_LOCK = threading.Lock()


class ExitAwarePool(ThreadPoolExecutor):
    """A ThreadPoolExecutor that knows whether a refused submit was the exit or its owner."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.closed = False  # shut down by its owner: a refusal then is one

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.closed = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    def refused_at_exit(self, exc: RuntimeError) -> bool:
        """Whether `exc`, raised by submit, means the interpreter is exiting (not a shutdown)."""
        return not self.closed and str(exc) in _REFUSED_AT_EXIT


class ExitSafeExecutor(ExitAwarePool):
    """The default executor of the event loop s3fs runs on, still taking work at exit.

    aiobotocore builds each HTTP session's SSL contexts with `asyncio.to_thread`, and aiohttp
    resolves host names with `run_in_executor(None, ...)`: both in the loop's default executor,
    a plain ThreadPoolExecutor, which refuses everything once the main thread has returned. A
    store first used after that (from a non-daemon thread that outlives `main()`, an atexit
    handler, a LangGraph saver used then) failed its first request with "cannot schedule new
    futures after interpreter shutdown", and so did a store used before and again from an
    atexit handler run after s3fs's own, which closes the HTTP session the next request then
    rebuilds. Refused so, the call runs on a thread of its own: in the loop's thread it would
    stall every request in flight for as long as a DNS lookup takes.
    """

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="ckptfs-s3-io")

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError as exc:
            if not self.refused_at_exit(exc):
                raise
        done: Future[_T] = Future()

        def run() -> None:
            if not done.set_running_or_notify_cancel():  # its awaiting task was cancelled
                return
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # on the future, as a pool's worker puts it
                done.set_exception(exc)

        try:
            threading.Thread(target=run, name="ckptfs-s3-io-exit", daemon=True).start()
        except RuntimeError:  # too late for a new thread (finalizing): in the loop's own
            run()
        return done


def serve_blocking_calls_at_exit(loop: asyncio.AbstractEventLoop) -> None:
    """Give `loop` an `ExitSafeExecutor` as its default executor, once per loop.

    Done when a store is opened, before its first request: fsspec's loop is created once per
    process (again in a forked child), and what is submitted to its default executor is the
    blocking part of an S3 request's set-up.
    """
    with _LOOPS_LOCK:
        if loop in _EXIT_SAFE_LOOPS:
            return
        _EXIT_SAFE_LOOPS.add(loop)
    loop.set_default_executor(ExitSafeExecutor())
