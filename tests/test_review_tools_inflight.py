"""Review of the in-flight hold of identical tool calls (`ToolLogState.in_flight`/`ain_flight`).

Every scenario that could hang runs under a bounded wait (a thread joined with a timeout, or
`asyncio.wait_for`), so a deadlock is a failure here, never a hung suite. Races are forced with
events, never with timing assertions.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.policy import RetryPolicy
from ckptfs.runtime.tools import IdempotentToolRunner

WAIT = 20.0  # a bound on a wait that must end; a deadlock hits it


def wipe(st: CheckpointStore) -> None:
    st.flush()
    for key in st.storage.list(""):
        st.storage.delete(key)
    st.close()


@pytest.fixture
def store() -> Iterator[CheckpointStore]:
    st = CheckpointStore(f"memory://review-inflight-{uuid.uuid4().hex[:10]}")
    yield st
    wipe(st)


def saved_run(store: CheckpointStore) -> AgentRun:
    run = AgentRun(goal="review in flight")
    run.add_step(Step(id="s1", title="s1"))
    store.save_run(run)
    return run


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # reported to the test, not lost in the thread
            out["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def join_all(*threads: threading.Thread) -> bool:
    """Whether all ended within one WAIT in all (a deadlocked thread is left, a daemon)."""
    deadline = time.monotonic() + WAIT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


# ------------------------------------------------------------------ lock order


def test_nested_calls_in_opposite_orders_from_two_threads_do_not_deadlock(store: CheckpointStore) -> None:
    """Thread 1 holds call a and its tool calls b; thread 2 holds b and its tool calls a. Each
    waited for the other's hold forever (before the hold, both just paid). Now the second to
    arrive sees the cycle and goes on without waiting, as the same thread re-entering does."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    a_in, b_in = threading.Event(), threading.Event()
    paid: Counter[str] = Counter()
    lock = threading.Lock()

    def leaf(name: str) -> Callable[..., str]:
        def fn(q: int) -> str:
            with lock:
                paid[name] += 1
            return f"{name}{q}"
        return fn

    def outer_a(q: int) -> str:
        a_in.set()
        assert b_in.wait(WAIT)
        return "a>" + runner.run("b", {"q": q}, leaf("b"))

    def outer_b(q: int) -> str:
        b_in.set()
        assert a_in.wait(WAIT)
        return "b>" + runner.run("a", {"q": q}, leaf("a"))

    t1, o1 = in_thread(lambda: runner.run("a", {"q": 1}, outer_a))
    t2, o2 = in_thread(lambda: runner.run("b", {"q": 1}, outer_b))
    assert join_all(t1, t2), "a->b and b->a waited for each other forever"
    assert "error" not in o1 and "error" not in o2, (o1, o2)
    assert {o1["result"], o2["result"]} <= {"a>b1", "a>b>a1", "b>a1", "b>a>b1"}


async def test_nested_calls_in_opposite_orders_from_two_tasks_do_not_deadlock(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    a_in, b_in = asyncio.Event(), asyncio.Event()

    async def leaf(q: int) -> str:
        return f"leaf{q}"

    async def outer_a(q: int) -> str:
        a_in.set()
        await b_in.wait()
        return "a>" + str(await runner.arun("b", {"q": q}, leaf))

    async def outer_b(q: int) -> str:
        b_in.set()
        await a_in.wait()
        return "b>" + str(await runner.arun("a", {"q": q}, leaf))

    both = asyncio.gather(runner.arun("a", {"q": 1}, outer_a), runner.arun("b", {"q": 1}, outer_b))
    try:
        outs = await asyncio.wait_for(both, WAIT)
    except TimeoutError:
        pytest.fail("tasks a->b and b->a waited for each other forever")
    assert outs[0] in ("a>leaf1", "a>b>leaf1") and outs[1] in ("b>leaf1", "b>a>leaf1"), outs


# ------------------------------------------------------------------ the holder's own helpers


@pytest.mark.parametrize("how", ["task", "to_thread"])
async def test_a_tool_delegating_its_own_call_to_a_task_or_thread_does_not_deadlock(
        store: CheckpointStore, how: str) -> None:
    """The sync tool calling itself through the runner proceeds (tests/test_tools_threads.py);
    an async tool doing it in a task it starts (`create_task`, `gather`, 3.11's `wait_for`) or
    in `asyncio.to_thread` waited for its own caller, which waited for it: a hang."""
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")

    async def inner(q: str) -> str:
        return "inner"

    async def outer(q: str) -> str:
        if how == "task":
            got = await asyncio.create_task(runner.arun("nest", {"q": q}, inner))
        else:
            got = await asyncio.to_thread(runner.run, "nest", {"q": q}, lambda q: "inner")
        return "outer:" + str(got)

    try:
        out = await asyncio.wait_for(runner.arun("nest", {"q": "x"}, outer), WAIT)
    except TimeoutError:
        pytest.fail(f"a call delegated to a {how} waited for its own caller")
    assert out == "outer:inner"


# ------------------------------------------------------------------ cancelled during the write


class GatedStore(CheckpointStore):
    """Holds the first grouped write (the tool call's record) until the test opens the gate."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.writing, self.gate = threading.Event(), threading.Event()
        self.armed = False

    def commit_many(self, parts: Sequence[Any]) -> None:
        if self.armed:
            self.armed = False
            self.writing.set()
            self.gate.wait(WAIT)
        super().commit_many(parts)


async def test_a_holder_cancelled_while_its_record_is_written_still_serves_the_waiters() -> None:
    """The durable write cannot be cancelled midway (the agent shields it), but the holder let
    go of the call at once, before the record was indexed: the waiter then paid again, and the
    record landing a moment later was never indexed (a later caller paid a third time). Now the
    holder keeps the call until its record is durable and indexed, then is cancelled."""
    store = GatedStore(f"memory://review-gated-{uuid.uuid4().hex[:10]}")
    try:
        run = saved_run(store)
        agent = CheckpointedAgent(store)
        paid: list[int] = []

        async def tool(n: int) -> int:
            paid.append(n)
            return n * 10

        store.armed = True
        holder = asyncio.create_task(IdempotentToolRunner(agent, run.run_id, "s1").arun("t", {"n": 1}, tool))
        assert await asyncio.to_thread(store.writing.wait, WAIT)
        waiter = asyncio.create_task(IdempotentToolRunner(agent, run.run_id, "s1").arun("t", {"n": 1}, tool))
        for _ in range(5):
            await asyncio.sleep(0)  # the waiter reaches the hold
        holder.cancel()
        for _ in range(20):
            await asyncio.sleep(0)  # before: the holder let go here, and the waiter paid
        store.gate.set()
        assert await asyncio.wait_for(waiter, WAIT) == 10
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(holder, WAIT)
        assert paid == [1], f"paid {len(paid)} times"
        later = IdempotentToolRunner(agent, run.run_id, "s1")
        assert await asyncio.wait_for(later.arun("t", {"n": 1}, tool), WAIT) == 10
        assert paid == [1] and later.cache_hits == 1
        done = [c for c in store.get_tool_call_history(run.run_id, "s1") if c.phase == "completed"]
        assert len(done) == 1
    finally:
        store.gate.set()
        wipe(store)


# ------------------------------------------------------------------ a retry while a call is in flight


async def test_a_retry_does_not_pay_again_for_a_call_its_failed_attempt_still_has_in_flight(
        store: CheckpointStore) -> None:
    """`asyncio.gather` raises on the first error and leaves its other tasks running: the
    attempt fails with a call still in flight, the agent forgets the step's index
    (`ToolLogs.forget`) and retries. The retry's identical call met a fresh index without the
    hold and paid a second time beside the first; now the hold outlives the forget."""
    run = saved_run(store)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=2, base_delay=0.0, jitter=0.0))
    started, release = asyncio.Event(), asyncio.Event()
    paid: list[str] = []
    attempts: list[int] = []

    async def slow(q: str) -> str:
        paid.append(q)
        started.set()
        await release.wait()
        return "slow:" + q

    async def executor(step: Step, prior: list[Any]) -> str:
        tools = agent.tools()
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            async def boom() -> None:
                await started.wait()
                raise ConnectionError("flaky sibling")
            await asyncio.gather(tools.arun("slow", {"q": "x"}, slow), boom())
        asyncio.get_running_loop().call_later(0.2, release.set)  # the retry reaches the hold first
        return str(await tools.arun("slow", {"q": "x"}, slow))

    try:
        done = await asyncio.wait_for(agent.aexecute_run(run, executor), WAIT)
    finally:
        release.set()
    assert attempts == [1, 2]
    assert done.steps["s1"].result == "slow:x"
    assert paid == ["x"], f"paid {len(paid)} times"
