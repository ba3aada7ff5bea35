"""Identical tool calls racing within one process and one step are paid for once.

A reviewer measured 28 duplicate real calls with 4 threads: an executor fanning out with a
ThreadPoolExecutor, or several threads sharing a runner, all missed the log at the same time
and all paid. The semantics these tests pin: identical calls (same tool, same arguments) of one
step are served once whichever runner or thread makes them; a caller that arrives while the call
is in flight waits for its durable record and is served from it; an error is not cached, so the
waiter then makes its own call (as it would one after the other); distinct calls are not
serialised. Races are forced with barriers and events, never with timing assertions.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, ToolCall
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.policy import RetryPolicy
from ckptfs.runtime.tools import IdempotentToolRunner, UnconfirmedActionError, cache_key
from ckptfs.runtime.worker import Worker

THREADS = 4
ROUNDS = 8
WAIT = 30.0  # generous: a barrier that times out means the calls were serialised


@pytest.fixture
def store() -> Iterator[CheckpointStore]:
    st = CheckpointStore(f"memory://threads-{uuid.uuid4().hex[:10]}")
    yield st
    st.flush()
    for key in st.storage.list(""):
        st.storage.delete(key)
    st.close()


def saved_run(store: CheckpointStore, steps: tuple[str, ...] = ("s1",)) -> AgentRun:
    run = AgentRun(goal="threads")
    for sid in steps:
        run.add_step(Step(id=sid, title=sid))
    store.save_run(run)
    return run


class Paid:
    """A tool that counts its real invocations and holds each one open a little, so that the
    other racers reach the runner while the first is still in flight."""

    def __init__(self, hold: float = 0.05) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.calls: Counter[int] = Counter()

    def __call__(self, n: int) -> dict[str, int]:
        with self.lock:
            self.calls[n] += 1
        threading.Event().wait(self.hold)
        return {"n": n, "v": n * 10}


def race(n_threads: int, body: Callable[[int, threading.Barrier], list[Any]]) -> list[list[Any]]:
    """Run `body(thread index, barrier)` in n threads at once; re-raise the first error."""
    barrier = threading.Barrier(n_threads, timeout=WAIT)
    with ThreadPoolExecutor(n_threads) as pool:
        futures = [pool.submit(body, i, barrier) for i in range(n_threads)]
        return [f.result(timeout=WAIT * ROUNDS) for f in futures]


def completed_records(store: CheckpointStore, run_id: str, step_id: str) -> Counter[str]:
    return Counter(c.cache_key or "" for c in store.get_tool_call_history(run_id, step_id)
                   if c.phase == "completed")


def test_threads_sharing_one_runner_pay_for_an_identical_call_once(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    tool = Paid()

    def body(_: int, barrier: threading.Barrier) -> list[Any]:
        got = []
        for n in range(ROUNDS):
            barrier.wait()
            got.append(runner.run("lookup", {"n": n}, tool))
        return got

    results = race(THREADS, body)
    duplicates = sum(tool.calls.values()) - ROUNDS
    assert duplicates == 0, f"{duplicates} duplicate real calls with {THREADS} threads: {tool.calls}"
    assert all(r == [{"n": n, "v": n * 10} for n in range(ROUNDS)] for r in results)
    assert runner.real_calls == ROUNDS and runner.cache_hits == ROUNDS * (THREADS - 1)
    assert set(completed_records(store, run.run_id, "s1").values()) == {1}  # one record per call


def test_a_runner_per_thread_of_the_same_step_pays_once(store: CheckpointStore) -> None:
    """Runners of a step share one index of the log, including the first use that loads it
    (two threads loading it at once each built their own, and each paid)."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    tool = Paid()

    def body(_: int, barrier: threading.Barrier) -> list[Any]:
        got = []
        for n in range(ROUNDS):
            barrier.wait()
            got.append(IdempotentToolRunner(agent, run.run_id, "s1").run("lookup", {"n": n}, tool))
        return got

    results = race(THREADS, body)
    assert sum(tool.calls.values()) == ROUNDS, tool.calls
    assert all(r == results[0] for r in results)
    assert set(completed_records(store, run.run_id, "s1").values()) == {1}


def test_an_executor_fanning_out_to_a_thread_pool_pays_once(store: CheckpointStore) -> None:
    run = saved_run(store, ("a", "b"))
    agent = CheckpointedAgent(store)
    tool = Paid()

    def executor(step: Step, prior: list[ToolCall]) -> str:
        tools = agent.tools()  # built here: the pool's threads do not see the current step
        barrier = threading.Barrier(THREADS, timeout=WAIT)

        def one(_: int) -> Any:
            barrier.wait()
            return tools.run("lookup", {"n": 1}, tool)

        with ThreadPoolExecutor(THREADS) as pool:
            outs = list(pool.map(one, range(THREADS)))
        assert all(o == outs[0] for o in outs)
        return str(outs[0])

    done = agent.execute_run(run, executor)
    assert done.status == "completed"
    # the same call in two steps is two calls; within each step, one
    assert tool.calls[1] == 2, tool.calls


def test_distinct_calls_still_run_at_the_same_time(store: CheckpointStore) -> None:
    """No lock around every call: two different calls of one step overlap (each waits inside
    the tool for the other to arrive; serialised, the barrier would break)."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    inside = threading.Barrier(2, timeout=WAIT)

    def tool(n: int) -> int:
        inside.wait()
        return n

    def body(i: int, barrier: threading.Barrier) -> list[Any]:
        barrier.wait()
        return [runner.run("meet", {"n": i}, tool)]

    assert race(2, body) == [[0], [1]]


def test_an_error_is_not_served_the_waiter_makes_its_own_call(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    entered, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    active: list[int] = [0, 0]  # now inside, most ever inside
    calls: list[str] = []

    def tool(q: str) -> str:
        with lock:
            calls.append(q)
            first = len(calls) == 1
            active[0] += 1
            active[1] = max(active)
        try:
            if first:
                entered.set()
                release.wait(WAIT)
                raise ConnectionError("flaky")
            return "ok"
        finally:
            with lock:
                active[0] -= 1

    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            IdempotentToolRunner(agent, run.run_id, "s1").run("flaky", {"q": "x"}, tool)
        except ConnectionError as exc:
            outcome["first"] = exc

    def second() -> None:
        outcome["second"] = IdempotentToolRunner(agent, run.run_id, "s1").run("flaky", {"q": "x"}, tool)

    t1 = threading.Thread(target=first, daemon=True)
    t1.start()
    assert entered.wait(WAIT)
    t2 = threading.Thread(target=second, daemon=True)
    t2.start()
    threading.Event().wait(0.2)  # let the second reach the runner while the first is in flight
    release.set()
    t1.join(WAIT)
    t2.join(WAIT)
    assert not t1.is_alive() and not t2.is_alive()
    assert isinstance(outcome["first"], ConnectionError) and outcome["second"] == "ok"
    assert calls == ["x", "x"] and active[1] == 1  # the waiter called only after the failure
    phases = [c.phase for c in store.get_tool_call_history(run.run_id, "s1")]
    assert phases == ["failed", "completed"]


def test_identical_irreversible_calls_write_one_intent_and_pay_once(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    sent: list[str] = []
    lock = threading.Lock()

    def email(to: str, key: str) -> str:
        with lock:
            sent.append(key)
        threading.Event().wait(0.05)
        return f"sent to {to}"

    def body(_: int, barrier: threading.Barrier) -> list[Any]:
        barrier.wait()
        return [IdempotentToolRunner(agent, run.run_id, "s1").run(
            "email", {"to": "a@b"}, email, irreversible=True, idempotency_key_arg="key")]

    results = race(THREADS, body)
    assert results == [["sent to a@b"]] * THREADS
    assert len(sent) == 1, sent
    phases = Counter(c.phase for c in store.get_tool_call_history(run.run_id, "s1"))
    assert phases == Counter({"intent": 1, "completed": 1})


def test_waiters_on_a_refused_result_ask_the_guard_instead_of_paying(store: CheckpointStore) -> None:
    """The first call's result is one the store cannot keep (NaN): it is logged as paid, and a
    waiter meets that record as a replay would, never paying again behind it."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    paid = Paid()

    def nan(n: int) -> float:
        paid(n)
        return float("nan")

    def body(_: int, barrier: threading.Barrier) -> list[Any]:
        barrier.wait()
        try:
            IdempotentToolRunner(agent, run.run_id, "s1").run("nan", {"n": 3}, nan)
        except Exception as exc:  # the payer: refused result; the waiters: unconfirmed
            return [type(exc).__name__]
        return ["returned"]

    outs = [o[0] for o in race(THREADS, body)]
    assert sum(paid.calls.values()) == 1, paid.calls
    assert outs.count("UnconfirmedActionError") == THREADS - 1, outs
    assert Counter(c.phase for c in store.get_tool_call_history(run.run_id, "s1"))["unkept"] == 1
    with pytest.raises(UnconfirmedActionError):
        IdempotentToolRunner(agent, run.run_id, "s1").run("nan", {"n": 3}, nan)


def test_a_tool_that_calls_itself_through_the_runner_does_not_deadlock(store: CheckpointStore) -> None:
    """The waiting is per caller: the same thread re-entering the same call (a tool that
    delegates to the runner) proceeds as it did before, instead of waiting for itself."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    out: list[Any] = []

    def outer(q: str) -> str:
        return "outer:" + runner.run("nest", {"q": q}, lambda q: "inner")

    t = threading.Thread(target=lambda: out.append(runner.run("nest", {"q": "x"}, outer)), daemon=True)
    t.start()
    t.join(WAIT)
    assert not t.is_alive(), "a re-entrant call waited for itself"
    assert out == ["outer:inner"]


def test_threads_of_a_worker_pay_once(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    run = AgentRun(run_id="w", goal="g")
    run.add_step(Step(id="a", title="a"))
    with CheckpointStore(url) as st:
        st.save_run(run)
    tool = Paid()
    with CheckpointStore(url) as store:
        worker = Worker(store, worker_id="w", lease_ttl=30, poll_interval=0.01,
                        retry=RetryPolicy(max_attempts=1))

        def executor(step: Step, prior: list[ToolCall]) -> str:
            tools = worker.tools()
            barrier = threading.Barrier(THREADS, timeout=WAIT)

            def one(n: int) -> Any:
                barrier.wait()
                return tools.run("lookup", {"n": n % 2}, tool)

            with ThreadPoolExecutor(THREADS) as pool:
                return str(list(pool.map(one, range(THREADS))))

        report = worker.work("w", executor, idle_timeout=30)
    assert report.completed == ["a"]
    assert tool.calls == Counter({0: 1, 1: 1})


# ------------------------------------------------------------------ asyncio


class APaid:
    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()

    async def __call__(self, n: int) -> dict[str, int]:
        self.calls[n] += 1
        await asyncio.sleep(0.02)
        return {"n": n}


async def test_tasks_racing_for_the_same_call_pay_once(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    shared = IdempotentToolRunner(agent, run.run_id, "s1")
    tool = APaid()

    async def one(i: int, n: int) -> Any:
        runner = shared if i % 2 else IdempotentToolRunner(agent, run.run_id, "s1")
        return await runner.arun("lookup", {"n": n}, tool)

    for n in range(ROUNDS):
        outs = await asyncio.gather(*(one(i, n) for i in range(THREADS)))
        assert outs == [{"n": n}] * THREADS
    assert tool.calls == Counter({n: 1 for n in range(ROUNDS)})
    assert set(completed_records(store, run.run_id, "s1").values()) == {1}


async def test_distinct_async_calls_overlap(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    arrived = [asyncio.Event(), asyncio.Event()]

    async def meet(n: int) -> int:
        arrived[n].set()
        await asyncio.wait_for(arrived[1 - n].wait(), WAIT)  # serialised: times out
        return n

    assert await asyncio.gather(runner.arun("meet", {"n": 0}, meet),
                                runner.arun("meet", {"n": 1}, meet)) == [0, 1]


async def test_a_cancelled_waiter_leaves_the_call_to_the_others(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    entered, release = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def slow(q: str) -> str:
        calls.append(q)
        entered.set()
        await release.wait()
        return "done"

    def call() -> asyncio.Future[Any]:
        runner = IdempotentToolRunner(agent, run.run_id, "s1")
        return asyncio.ensure_future(runner.arun("slow", {"q": "x"}, slow))

    payer = call()
    await asyncio.wait_for(entered.wait(), WAIT)
    quitter, stayer = call(), call()
    await asyncio.sleep(0.05)
    quitter.cancel()
    release.set()
    assert await asyncio.wait_for(payer, WAIT) == "done"
    assert await asyncio.wait_for(stayer, WAIT) == "done"
    with pytest.raises(asyncio.CancelledError):
        await quitter
    assert calls == ["x"]


async def test_a_thread_and_a_task_racing_for_the_same_call_pay_once(store: CheckpointStore) -> None:
    """A sync executor's thread and an async task of the same step share the in-flight call."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def blocking(q: str) -> str:
        calls.append(q)
        entered.set()
        release.wait(WAIT)
        return "paid"

    payer = asyncio.get_running_loop().run_in_executor(
        None, lambda: IdempotentToolRunner(agent, run.run_id, "s1").run("mixed", {"q": "x"}, blocking))
    assert await asyncio.to_thread(entered.wait, WAIT)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    waiter = asyncio.ensure_future(runner.arun("mixed", {"q": "x"}, blocking))
    await asyncio.sleep(0.05)
    release.set()
    assert await asyncio.wait_for(payer, WAIT) == "paid"
    assert await asyncio.wait_for(waiter, WAIT) == "paid"
    assert calls == ["x"] and runner.cache_hits == 1


def test_cache_keys_of_the_records_match_the_calls(store: CheckpointStore) -> None:
    """Sanity for the counting helpers above: a record's cache key is the call's."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    IdempotentToolRunner(agent, run.run_id, "s1").run("lookup", {"n": 1}, Paid(0))
    assert completed_records(store, run.run_id, "s1") == Counter({cache_key("lookup", {"n": 1}): 1})
