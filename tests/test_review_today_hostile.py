"""Hostile review of today's changes (bdade56..5584dad): group commit's run-level fields, the
StorePool, `Storage.display_name`. What broke, and what held.

Broken (each test fails on the code as reviewed):

* `GroupCommitter.submit` takes each part's run-level fields "now", but copies only the top
  of `run.metadata`: a dict nested in it stays shared with the live run. What the caller
  writes in it after submitting is what the record holds, so (1) a refused last part's nested
  fields are written with the accepted part and loaded back (what bdade56 says cannot
  happen), (2) a NaN put in after a part was submitted refuses that part, whose own fields
  were fine, and (3) under aexecute_run a record holds another step's nested bookkeeping
  before that step's completion is durable (a crash then keeps the count and loses the step).
* `commit` (and a grouped part, "checked as commit checks them") acknowledges a NaN put in a
  metadata entry whose stored value is None: both serialise as null, so "no change" is
  assumed and nothing is checked; a load returns None. `_step_changes` guards the optional
  floats against exactly this, but not a dict entry.
* An ordered StorePool hangs the process at exit when a task submits to its own pool: from
  the pool's thread it waits for its own future, and inline it takes `_turns` again.
* `ckptfs runs` prints "ckptfs threads <url>" as a command to type again, unquoted: a store
  path with a space gives a command that fails.

Held (each test asserts what was checked): refused outputs in a 64-wide async run (no
acknowledged step lost, nothing refused stored, totals equal the steps' spend, a resume pays
no acknowledged call twice), SIGKILL and resume with the same checks, a GroupCommitter
whose executor fails from several threads (no future left waiting), and a StorePool's
inline work reporting exceptions as its thread does, and refusing once its owner shut it down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from test_review_prune_cli_hostile import ckptfs

from ckptfs import AgentRun, CheckpointedAgent, CheckpointStore, Step, StepResult, StepStatus
from ckptfs.errors import RunStoppedError, UnstorableValueError
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.runtime.execution import ProgressEvent
from ckptfs.store.group_commit import GroupCommitter
from tests._held_writer import OneWrite

ROOT = str(Path(__file__).resolve().parent.parent)
RUN = "m"


def _fresh(url: str) -> AgentRun:
    store = CheckpointStore(url)
    run = store.load_run(RUN)
    store.close()
    assert run is not None
    return run


def _done(step: Step, result: str) -> Step:
    step.status, step.result = StepStatus.COMPLETED, result
    return step


# ------------------------------------------------------------------ group commit: run fields


@pytest.fixture
def nested(tmp_path: Path) -> Any:
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    run = AgentRun(run_id=RUN, goal="nested run fields")
    for i in range(3):
        run.add_step(Step(id=f"s{i}", title="t"))
    run.metadata["stats"] = {"phase": "saved"}
    store.save_run(run)
    held = OneWrite(store)
    yield url, store, run, held
    held.close()
    store.close()


def test_a_refused_last_parts_nested_run_fields_are_not_written(nested: Any) -> None:
    """bdade56: "a caller that got an error never has its fields loaded back". Its nested
    metadata is loaded back: the accepted part's copy shares the dict the caller changed."""
    url, _, run, held = nested
    run.metadata["stats"]["phase"] = "accepted"
    good = held.committer.submit(RUN, run=run, steps=[_done(run.steps["s0"], "zero")])
    run.metadata["stats"]["phase"] = "refused"
    misfiled = Step(id="y", title="t")
    run.steps["x"] = misfiled  # refused: acknowledged as "x", it would load as "y"
    bad = held.committer.submit(RUN, run=run, steps=[misfiled])
    held.close()

    assert isinstance(bad.exception(), UnstorableValueError)
    assert good.result() == 2
    loaded = _fresh(url)
    assert loaded.steps["s0"].result == "zero"
    # was: {'phase': 'refused'}, the refused caller's value
    assert loaded.metadata["stats"] == {"phase": "accepted"}


def test_a_part_is_not_refused_for_a_value_put_in_after_it_was_submitted(nested: Any) -> None:
    """Alone, the first part would have committed: its fields held no NaN when it was
    submitted. Grouped, it was refused for the NaN the caller put in afterwards."""
    url, _, run, held = nested
    run.metadata["stats"]["phase"] = "accepted"
    good = held.committer.submit(RUN, run=run, steps=[_done(run.steps["s0"], "zero")])
    run.metadata["stats"]["phase"] = float("nan")
    bad = held.committer.submit(RUN, run=run, steps=[_done(run.steps["s1"], "one")])
    held.close()

    assert isinstance(bad.exception(), UnstorableValueError)
    assert good.exception() is None, good.exception()  # was: NonFiniteValueError metadata.stats.phase
    loaded = _fresh(url)
    assert loaded.metadata["stats"] == {"phase": "accepted"}
    assert loaded.steps["s0"].result == "zero" and loaded.steps["s1"].status == StepStatus.PENDING


def test_an_async_runs_record_holds_nested_run_fields_as_of_its_commit(tmp_path: Path) -> None:
    """An executor counts finished work in `run.metadata["usage"]` (a dict in the metadata).
    Step a's completion is queued with one call counted; step b counts its own before a's
    record is written. That record must hold the count of a's commit: it held b's too, with
    b not completed, so a crash there kept b's count and the resume counted it again."""
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("usage", [Step(id="a", title="a"), Step(id="b", title="b")],
                          run_id=RUN, metadata={"usage": {"calls": 0}})
    b_counted = threading.Event()
    a_written = threading.Event()
    seen: dict[str, Any] = {}
    real = store.commit_many

    def hooked(parts: Any) -> None:
        a_done = any(s.id == "a" and s.status == StepStatus.COMPLETED for p in parts for s in p.steps)
        if a_done:
            assert b_counted.wait(30)  # b has counted its call by the time a's record is written
        real(parts)
        if a_done and not a_written.is_set():
            got = _fresh(url)
            seen.update(usage=got.metadata["usage"], b=got.steps["b"].status)
            a_written.set()

    store.commit_many = hooked  # type: ignore[method-assign]

    async def executor(step: Step, prior: list[Any]) -> str:
        if step.id == "b":
            while run.steps["a"].status != StepStatus.COMPLETED:
                await asyncio.sleep(0.002)  # a's completion is queued by now
            run.metadata["usage"]["calls"] += 1
            b_counted.set()
            while not a_written.is_set():
                await asyncio.sleep(0.002)
            return "b done"
        run.metadata["usage"]["calls"] += 1
        return "a done"

    asyncio.run(agent.aexecute_run(run, executor, concurrency=2))
    store.close()
    assert seen["b"] != StepStatus.COMPLETED  # a's record is the only one written then
    # was: {'calls': 2}, b's count durable without b
    assert seen["usage"] == {"calls": 1}
    final = _fresh(url)
    assert final.metadata["usage"] == {"calls": 2} and final.status == "completed"


@pytest.mark.parametrize("where", ["run", "step"])
@pytest.mark.parametrize("how", ["commit", "grouped"])
def test_nan_where_none_is_stored_is_refused(tmp_path: Path, where: str, how: str) -> None:
    """A NaN replacing a stored None serialises as the same null: `commit` took it for "no
    change" and acknowledged a value no load returns (a load gives None). A NaN replacing any
    other value is refused; so must this one be."""
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    run = AgentRun(run_id=RUN, goal="nan for none")
    run.add_step(Step(id="s0", title="t"))
    run.metadata["score"] = None
    run.steps["s0"].metadata["score"] = None
    v1 = store.save_run(run)
    target = run.metadata if where == "run" else run.steps["s0"].metadata
    target["score"] = float("nan")
    outcome: Any
    if how == "commit":
        try:
            outcome = store.commit(run, [run.steps["s0"]])
        except UnstorableValueError as exc:
            outcome = exc
    else:
        held = OneWrite(store)
        fut = held.committer.submit(RUN, run=run, steps=[run.steps["s0"]])
        held.close()
        outcome = fut.exception() or fut.result()
    store.close()
    loaded = _fresh(url)
    assert (loaded.metadata if where == "run" else loaded.steps["s0"].metadata)["score"] is None
    # was: v1 returned, "acknowledged", while the caller's run holds NaN and the load None
    assert isinstance(outcome, UnstorableValueError), f"acknowledged as v{outcome} (saved as v{v1})"
    assert "nan" in str(outcome).lower()


# ------------------------------------------------------------------ group commit: what held


def _tokens(run: AgentRun) -> tuple[int, float]:
    return sum(s.tokens for s in run.steps.values()), sum(s.cost_usd for s in run.steps.values())


def test_refused_outputs_in_a_64_wide_async_run_then_a_resume(tmp_path: Path) -> None:
    """150 steps, 64 at a time, each paying for one call; two return what the store refuses
    (a NaN cost, a lone surrogate). Every acknowledged completion loads, nothing refused does,
    the run's totals are the stored steps' spend, and the resume pays no call twice."""
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    acked: set[str] = set()

    def progress(ev: ProgressEvent) -> None:
        if ev.kind == "step_completed" and ev.step_id is not None:
            acked.add(ev.step_id)

    agent = CheckpointedAgent(store, on_progress=progress)
    ids = [f"s{i:03d}" for i in range(150)]
    run = agent.start_run("refusals", [
        Step(id=sid, title="t", dependencies=[ids[i - 70]] if i >= 70 and i % 2 else [])
        for i, sid in enumerate(ids)], run_id=RUN)
    paid: Counter[str] = Counter()
    refuse = {"s050": "nan", "s111": "surrogate"}

    def pay(x: str) -> str:
        paid[x] += 1
        return f"paid {x}"

    async def executor(step: Step, prior: list[Any]) -> StepResult:
        got = await agent.tools().arun("pay", {"x": step.id}, pay)
        await asyncio.sleep(random.random() * 0.005)
        how = refuse.get(step.id)
        if how == "nan":
            return StepResult(got, tokens=10, cost_usd=float("nan"))
        if how == "surrogate":
            return StepResult(got + "\udc80", tokens=10, cost_usd=0.25)
        return StepResult(got, tokens=10, cost_usd=0.25)

    with pytest.raises(RunStoppedError):
        asyncio.run(agent.aexecute_run(run, executor, concurrency=64))
    store.close()
    loaded = _fresh(url)
    assert loaded.status == "failed"
    done = {sid for sid, s in loaded.steps.items() if s.status == StepStatus.COMPLETED}
    assert acked and acked <= done
    for sid in refuse:
        assert loaded.steps[sid].status != StepStatus.COMPLETED and loaded.steps[sid].result is None
    assert _tokens(loaded) == (loaded.total_tokens, loaded.total_cost_usd)

    refuse.clear()
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    again = agent.resume_run(RUN)
    assert again is not None
    asyncio.run(agent.aexecute_run(again, executor, concurrency=64))
    store.close()
    final = _fresh(url)
    assert final.status == "completed"
    assert (final.total_tokens, final.total_cost_usd) == (1500, 37.5) == _tokens(final)
    assert paid == Counter(ids)  # each call paid once: the refused steps' were replayed


STEPS_KILLED = 300


def _child_sigkill(url: str, side: str) -> None:
    """The SIGKILL test's child: runs (or resumes) the run, writing every acknowledgement down."""
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def progress(ev: ProgressEvent) -> None:
        if ev.kind == "step_completed":
            note(f"done {ev.step_id}")

    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, on_progress=progress)
    run = agent.resume_run(RUN) or agent.start_run("killed", [
        Step(id=f"s{i:03d}", title="t", dependencies=[f"s{i - 64:03d}"] if i >= 64 and i % 2 else [])
        for i in range(STEPS_KILLED)], run_id=RUN)

    def pay(x: str) -> str:
        note(f"paid {x}")
        return f"paid {x}"

    async def executor(step: Step, prior: list[Any]) -> StepResult:
        got = await agent.tools().arun("pay", {"x": step.id}, pay)
        note(f"ack {step.id}")
        await asyncio.sleep(random.random() * 0.02)
        return StepResult(got, tokens=10, cost_usd=0.25)

    asyncio.run(agent.aexecute_run(run, executor, concurrency=64))
    note("finished")


def test_sigkill_mid_run_then_resume_keeps_totals_and_pays_no_acknowledged_call_twice(
        tmp_path: Path) -> None:
    url, side = str(tmp_path / "store"), tmp_path / "side.txt"
    side.touch()
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, __file__, "sigkill", url, str(side)]
    for _ in range(3):
        before = side.read_text().count("done ")
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while side.read_text().count("done ") < before + 40 and child.poll() is None:
            time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, err.decode()[-2000:]
        loaded = _fresh(url)
        acked = {ln[5:] for ln in side.read_text().splitlines() if ln.startswith("done ")}
        done = {sid for sid, s in loaded.steps.items() if s.status == StepStatus.COMPLETED}
        assert acked <= done, sorted(acked - done)[:5]
        assert _tokens(loaded) == (loaded.total_tokens, loaded.total_cost_usd)
        store = CheckpointStore(url)
        logged = {sid for sid in loaded.steps if store.get_tool_call_history(RUN, sid)}
        store.close()
        tools = {ln[4:] for ln in side.read_text().splitlines() if ln.startswith("ack ")}
        assert tools <= logged, sorted(tools - logged)[:5]
    last = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr[-2000:]
    final = _fresh(url)
    assert final.status == "completed"
    assert (final.total_tokens, final.total_cost_usd) == (10 * STEPS_KILLED, 0.25 * STEPS_KILLED)
    acked_calls: set[str] = set()
    repaid = []
    for ln in side.read_text().splitlines():
        kind, _, sid = ln.partition(" ")
        if kind == "ack":
            acked_calls.add(sid)
        elif kind == "paid" and sid in acked_calls:
            repaid.append(sid)
    assert not repaid, repaid[:5]


class _FlakyExecutor(concurrent.futures.Executor):
    """Refuses one submit in three (after a pause, so others queue meanwhile), like a pool shut
    down under the committer; runs the rest on a real thread."""

    def __init__(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.rng = random.Random(3)
        self.lock = threading.Lock()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        with self.lock:
            refuse = self.rng.random() < 1 / 3
        time.sleep(0.001)
        if refuse:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return self.pool.submit(fn, *args, **kwargs)


class _Writes:
    def __init__(self) -> None:
        self.parts = 0

    def commit_many(self, parts: Any) -> None:
        time.sleep(0.0005)
        for p in parts:
            self.parts += 1
            p.done(self.parts)


def test_group_committer_with_a_failing_executor_leaves_no_part_waiting() -> None:
    """Eight threads submit while the executor refuses now and then: each submit either
    raises or returns a future that resolves (a refused drain fails every part it queued)."""
    executor = _FlakyExecutor()
    committer = GroupCommitter(_Writes(), executor)
    futures: list[concurrent.futures.Future[int]] = []
    raised = [0]
    lock = threading.Lock()

    def caller() -> None:
        for _ in range(60):
            try:
                fut = committer.submit("r", tool_calls=[])
            except RuntimeError:
                with lock:
                    raised[0] += 1
            else:
                with lock:
                    futures.append(fut)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, waiting = concurrent.futures.wait(futures, timeout=60)
    executor.pool.shutdown(wait=True)
    assert not waiting, f"{len(waiting)} of {len(futures)} futures never resolved"
    failed = [f for f in futures if f.exception() is not None]
    # Whether a refused drain found others' parts queued depends on the schedule: a refusal
    # always happens, and what failed failed for it, while most parts landed.
    assert raised[0] and len(failed) < len(futures)
    assert all("after shutdown" in str(f.exception()) for f in failed)


# ------------------------------------------------------------------ StorePool at exit


def _child(tmp_path: Path, body: str) -> str:
    """Run `body` as a script with the real interpreter; its stdout. A child that hangs (the
    interpreter never exits) is killed and reported."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body), encoding="utf-8")
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=30, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"the child never exited (a deadlock at interpreter exit); stdout: {out!r}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


_ORDER = "ORDER ['first', 'submitted', 'follow']"


def test_an_ordered_pools_task_that_submits_at_exit_does_not_hang(tmp_path: Path) -> None:
    """A task on the pool's own thread, when the main thread returns, queues a follow-up on
    its pool, as a one-thread pool's task may (it runs after the task). At exit the refused
    submit waited for the pool's newest future: the task's own. The main thread joins the
    pool's thread, so the process never exited."""
    out = _child(tmp_path, """
        import threading, time
        from concurrent.futures import ThreadPoolExecutor
        from ckptfs.store.pools import StorePool

        pool = StorePool(1, ordered=True)
        probe = ThreadPoolExecutor(1)
        order = []

        def at_exit():
            try:
                probe.submit(lambda: None).result()
            except RuntimeError:  # concurrent.futures' exit hook has run
                return True
            return False

        def first():
            while not at_exit():
                time.sleep(0.005)
            order.append("first")
            pool.submit(order.append, "follow")
            order.append("submitted")

        def watcher():
            pool.submit(first).result()
            while len(order) < 3:
                time.sleep(0.005)
            print("ORDER", order, flush=True)

        threading.Thread(target=watcher, daemon=False).start()
        time.sleep(0.05)
    """)
    assert _ORDER in out, out


def test_an_ordered_pools_inline_task_that_submits_does_not_hang(tmp_path: Path) -> None:
    """Work run on the caller's thread at exit (the pool's thread is gone) submits to the same
    pool: it waited for the turn lock it holds itself."""
    out = _child(tmp_path, """
        import threading, time
        from ckptfs.store.pools import StorePool

        pool = StorePool(1, ordered=True)
        pool.submit(lambda: None).result()  # the pool's thread exists, and exits at exit
        order = []

        def first():
            order.append("first")
            pool.submit(order.append, "follow")
            order.append("submitted")

        def later():
            while threading.main_thread().is_alive():
                time.sleep(0.005)
            pool.submit(first).result()
            while len(order) < 3:
                time.sleep(0.005)
            print("ORDER", order, flush=True)

        threading.Thread(target=later, daemon=False).start()
    """)
    assert _ORDER in out, out


def test_a_store_pool_at_exit_reports_errors_as_before_and_refuses_once_shut_down(
        tmp_path: Path) -> None:
    """Work run in the caller at exit puts its exception, a KeyboardInterrupt too, on its
    future as the pool's thread did (the caller goes on); a pool its owner shut down still
    refuses, before and after the exit hook, ordered or not."""
    out = _child(tmp_path, """
        import json, threading, time
        from ckptfs.store.pools import StorePool

        def boom(exc):
            raise exc

        def outcome(pool, exc):
            fut = pool.submit(boom, exc)
            got = fut.exception()
            return [type(got).__name__, str(got), got is exc]

        pools = {o: StorePool(1, ordered=o) for o in (False, True)}
        shut = {o: StorePool(1, ordered=o) for o in (False, True)}
        for p in shut.values():
            p.shutdown()
        before = {str(o): [outcome(p, ValueError("v")), outcome(p, KeyboardInterrupt("k"))]
                  for o, p in pools.items()}

        def refused(pool):
            try:
                pool.submit(int, "1")
            except RuntimeError as exc:
                return str(exc)
            return "accepted"

        def later():
            while threading.main_thread().is_alive():
                time.sleep(0.005)
            after = {str(o): [outcome(p, ValueError("v")), outcome(p, KeyboardInterrupt("k"))]
                     for o, p in pools.items()}
            print(json.dumps({"before": before, "after": after,
                              "shut": [refused(p) for p in shut.values()],
                              "inline": pools[True].submit(int, "7").result()}), flush=True)

        threading.Thread(target=later, daemon=False).start()
    """)
    got = json.loads(out)
    expected = [["ValueError", "v", True], ["KeyboardInterrupt", "k", True]]
    assert got["before"] == got["after"] == {"False": expected, "True": expected}
    assert got["shut"] == ["cannot schedule new futures after shutdown"] * 2
    assert got["inline"] == 7


# ------------------------------------------------------------------ display_name


def test_runs_names_the_threads_command_so_it_can_be_typed_again(tmp_path: Path) -> None:
    """`ckptfs runs` ends with "ckptfs threads <url>", a command to type again (ffc1119 keeps it
    only where the name is whole). A store path with a space gave `ckptfs threads /x/my store`:
    typed again, "unrecognized arguments: store"."""
    url = str(tmp_path / "my store")
    with CheckpointStore(url) as store:
        run = AgentRun(run_id="r", goal="g")
        run.add_step(Step(id="a", title="t"))
        store.save_run(run)
    with CkptfsSaver(url) as saver:
        saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(),
                  {"step": 0}, {})
    proc = ckptfs("runs", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "ckptfs threads" in ln)
    argv = shlex.split(line.split(": ", 1)[1])
    again = ckptfs(*argv[1:], cwd=tmp_path)
    # was: exit 2, "unrecognized arguments: store"
    assert again.returncode == 0, (line, again.stderr)
    assert "t" in again.stdout.split()


if __name__ == "__main__":
    if sys.argv[1] == "sigkill":
        _child_sigkill(sys.argv[2], sys.argv[3])
