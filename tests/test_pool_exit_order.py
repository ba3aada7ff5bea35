"""An ordered StorePool keeps its order at interpreter exit: a follow-up runs after its task.

Once concurrent.futures' exit hook has run, an ordered pool runs what is refused in the
caller, and what one of its tasks submits then runs after that task, as the pool's queue would
have run it. "After" included the task's future: the follow-up ran inside the task's run,
before its future was set, so whatever waits on that future (the agent awaiting a write) could
see the follow-up's effect first, and the follow-up saw its task as not done (waiting on it
never ended). Each child below drives the real exit path: the main thread returns while a
non-daemon thread, or the pool's own thread, is still working.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

# `at_exit()` is true once concurrent.futures' exit hook has run (every pool refuses then).
_PRELUDE = """
import json, threading, time
from concurrent.futures import ThreadPoolExecutor, wait
from ckptfs.store.pools import StorePool

pool = StorePool(1, ordered=True)
probe = ThreadPoolExecutor(1)
events = []

def at_exit():
    try:
        probe.submit(lambda: None).result()
    except RuntimeError:
        return True
    return False

def until_exit():
    while not at_exit():
        time.sleep(0.005)
"""


def _child_events(tmp_path: Path, body: str) -> Any:
    """Run the prelude and `body` with the real interpreter; the JSON its last line prints."""
    script = tmp_path / "child.py"
    script.write_text(_PRELUDE + textwrap.dedent(body), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    return json.loads(lines[-1])


def test_a_follow_up_of_a_task_on_the_pools_thread_runs_after_its_future_is_set(
        tmp_path: Path) -> None:
    """The pool's thread is running `first` when the main thread returns; `first` submits a
    follow-up, which submits one of its own; another thread submits `late` meanwhile. Each
    future is set before what its task submitted runs, and `late` runs after all of them."""
    got = _child_events(tmp_path, """
        late_ready = threading.Event()
        futs = {}

        def follow2():
            events.append(["follow2", futs["first"].done(), futs["follow"].done()])

        def follow():
            events.append(["follow", futs["first"].done()])
            futs["follow2"] = pool.submit(follow2)

        def first():
            until_exit()
            late_ready.wait()
            time.sleep(0.05)  # lets `late` reach its wait for this task
            events.append(["first"])
            futs["follow"] = pool.submit(follow)
            futs["follow"].add_done_callback(lambda f: events.append(["follow set"]))

        def late():
            events.append(["late", futs["first"].done(), futs["follow"].done(),
                           futs["follow2"].done()])

        def latecomer():
            until_exit()
            late_ready.set()
            fut = pool.submit(late)
            fut.result()
            wait([futs["first"], futs["follow"], futs["follow2"]])
            print(json.dumps(events), flush=True)

        futs["first"] = pool.submit(first)
        futs["first"].add_done_callback(lambda f: events.append(["first set"]))
        threading.Thread(target=latecomer, daemon=False).start()
        time.sleep(0.05)
    """)
    # was: [["first"], ["follow", false], ["follow2", false, false], ["follow set"],
    #       ["first set"], ["late", true, true, true]]
    assert got == [["first"], ["first set"], ["follow", True], ["follow set"],
                   ["follow2", True, True], ["late", True, True, True]]


def test_a_follow_up_of_a_task_run_in_the_caller_at_exit_runs_after_its_future_is_set(
        tmp_path: Path) -> None:
    """Once the exit hook has run, a non-daemon thread's task runs in that thread; what it
    submits, and what that submits, each runs after the future of the task that submitted it
    is set, and exactly once."""
    got = _child_events(tmp_path, """
        pool.submit(lambda: None).result()  # the pool's thread exists, and exits at exit
        futs = {}

        def follow2():
            events.append(["follow2", futs["follow"].done()])

        def follow():
            events.append(["follow"])
            futs["follow2"] = pool.submit(follow2)
            futs["follow2"].add_done_callback(lambda f: events.append(["follow2 set"]))

        def first():
            events.append(["first"])
            futs["follow"] = pool.submit(follow)
            futs["follow"].add_done_callback(lambda f: events.append(["follow set"]))

        def later():
            until_exit()
            pool.submit(first).result()
            wait([futs["follow"], futs["follow2"]])
            print(json.dumps(events), flush=True)

        threading.Thread(target=later, daemon=False).start()
    """)
    # was: [["first"], ["follow"], ["follow2", false], ["follow2 set"], ["follow set"]]
    assert got == [["first"], ["follow"], ["follow set"], ["follow2", True], ["follow2 set"]]
