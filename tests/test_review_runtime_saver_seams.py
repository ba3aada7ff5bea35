"""Review of the runtime's added steps and the LangGraph saver's bounded memory, at their seams.

Runtime: a step an executor adds (`run.add_step`) was scheduled, and so committed, only once
nothing else was left to run. A crash after its adder's completion was durable lost it for
good (the resume found the adder done and finished the run without it); a step added with a
graph no commit can hold (a dependency on itself, on no step, a cycle) made the store refuse
the batch, InvalidGraphError out of execute_run with the run left "running" and, under
every-n, the acknowledged steps lost; and each end-of-queue look scanned the whole run, so a
run whose every step adds the next cost O(n^2).

Saver: a put noted what it wrote (the refs a next put points unchanged channels at, the values
deltas start from) after leaving the removal gate. A removal by another saver landing in
between, then a start-over (past `_MAX_THREADS`), which forgets the epoch that note would be
checked against, left it trusted: the graph run's next checkpoint pointed at removed objects,
acknowledged and unreadable. A read racing such a removal raised CorruptFileError, as if the
store were damaged (start-overs make it likelier: values are read from the store again). And
two memories outgrew their bounds: the values cache counted only values' bytes (small
channels cost ~200 bytes of keeping each), and the per-namespace memory grew by one entry per
subgraph call on a single thread.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base.id import uuid6

from ckptfs import (
    CheckpointedAgent,
    CheckpointPolicy,
    CheckpointStore,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
)
from ckptfs.errors import CorruptFileError, InvalidGraphError
from ckptfs.integrations.langgraph import CkptfsSaver, erasures
from ckptfs.integrations.langgraph import saver as saver_module
from ckptfs.integrations.langgraph.keys import lg_checkpoint_key

ROOT = str(Path(__file__).resolve().parents[1])

# ---------------------------------------------------------------------------- runtime

_CHILD = r'''
import asyncio, json, os, signal, sys
from ckptfs import CheckpointedAgent, CheckpointPolicy, CheckpointStore, Step, StepResult
url, phase, policy, mode, paid_path = sys.argv[1:6]
store = CheckpointStore(url)
agent = CheckpointedAgent(store, policy=CheckpointPolicy.every_n_steps(3) if policy == "every_n"
                          else CheckpointPolicy.every_step())
paid = open(paid_path, "a")

def pay(**args):
    paid.write(json.dumps(args) + "\n"); paid.flush(); os.fsync(paid.fileno())
    return {"done": args["s"]}

def after(step):
    if step.id == "a" and "x1" not in run.steps:  # plans more work, after the step it waits for
        run.add_step(Step(id="x1", title="x1", dependencies=["b"]))
        run.add_step(Step(id="x2", title="x2", dependencies=["x1"]))
    if step.id == "b" and phase == "first":  # its call is durable (run returned): die here
        os.kill(os.getpid(), signal.SIGKILL)
    return StepResult(step.id + " ok", tokens=1)

def execute(step, prior):
    agent.tools().run("pay", {"s": step.id}, pay)
    return after(step)

async def aexecute(step, prior):
    await agent.tools().arun("pay", {"s": step.id}, pay)
    return after(step)

if phase == "first":
    run = agent.start_run("g", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"])],
                          run_id="r")
else:
    run = agent.resume_run("r")
if mode == "sync":
    agent.execute_run(run, execute)
else:
    asyncio.run(agent.aexecute_run(run, aexecute, concurrency=8))
done = CheckpointStore(url).load_run("r")
print(json.dumps({"status": done.status, "steps": {s.id: s.status.value for s in done.steps.values()}}))
'''


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("policy", ["every_step", "every_n"])
def test_steps_added_by_a_finished_step_survive_a_sigkill_and_run_once(
        tmp_path: Path, policy: str, mode: str) -> None:
    """Step a adds x1 and x2; the process is SIGKILLed in b, after b's paid call. The store
    held a's completion (its own commit, or b's RUNNING mark under every-n) but not the steps
    a added: the resume finished the run "completed" without them. Now they are committed
    with a, and a new process runs them once; no call is paid twice."""
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    url, paid = str(tmp_path / "store"), tmp_path / "paid.jsonl"
    env = {**os.environ, "PYTHONPATH": ROOT}
    args = [sys.executable, str(child), url]
    first = subprocess.run([*args, "first", policy, mode, str(paid)], env=env, capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    again = subprocess.run([*args, "resume", policy, mode, str(paid)], env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    out = json.loads(again.stdout.strip().splitlines()[-1])
    assert out == {"status": "completed",
                   "steps": {"a": "completed", "b": "completed", "x1": "completed", "x2": "completed"}}
    calls = [json.loads(line)["s"] for line in paid.read_text().splitlines()]
    assert sorted(calls) == ["a", "b", "x1", "x2"], calls  # each paid once, the added ones too


def _bad_add(kind: str) -> list[Step]:
    if kind == "itself":
        return [Step(id="y", title="y", dependencies=["y"])]
    if kind == "unknown":
        return [Step(id="y", title="y", dependencies=["nope"])]
    if kind == "cycle":
        return [Step(id="y", title="y", dependencies=["z"]), Step(id="z", title="z", dependencies=["y"])]
    return [Step(id="y", title="y", status=StepStatus.COMPLETED)]  # done, with no result


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["itself", "unknown", "cycle", "done-without-result"])
def test_an_added_step_no_commit_can_hold_stops_the_run_with_the_batch_kept(
        memory_url: str, kind: str, mode: str) -> None:
    """Under every-n, a and b are acknowledged but not committed when c adds a step the
    store's graph check refuses. Before: InvalidGraphError out of execute_run, the run
    "running" in the store and a, b, c lost (the crash flush was refused the same way). Now
    the run stops naming the added step, which is taken back out, and the batch commits."""
    agent = CheckpointedAgent(CheckpointStore(memory_url), policy=CheckpointPolicy.every_n_steps(10))
    run = agent.start_run("g", [Step(id=s, title=s, dependencies=[p] if p else [])
                                for s, p in (("a", None), ("b", "a"), ("c", "b"), ("d", "c"))],
                          run_id="r")

    def body(step: Step) -> StepResult:
        if step.id == "c":
            for s in _bad_add(kind):
                run.add_step(s)
        return StepResult(step.id + " ok", tokens=2)

    async def abody(step: Step, prior: Any) -> StepResult:
        await asyncio.sleep(0)
        return body(step)

    with pytest.raises(RunStoppedError) as info:
        if mode == "sync":
            agent.execute_run(run, lambda step, prior: body(step))
        else:
            asyncio.run(agent.aexecute_run(run, abody, concurrency=8))
    assert info.value.step_id == "y" and isinstance(info.value.cause, InvalidGraphError)
    assert "y" not in run.steps and "z" not in run.steps
    stored = CheckpointStore(memory_url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["stopped"]["step_id"] == "y"
    assert {s.id: s.status for s in stored.steps.values()} == {
        "a": StepStatus.COMPLETED, "b": StepStatus.COMPLETED, "c": StepStatus.COMPLETED,
        "d": StepStatus.PENDING}
    assert stored.total_tokens == 6
    again = CheckpointedAgent(CheckpointStore(memory_url))
    resumed = again.resume_run("r")
    assert resumed is not None
    again.execute_run(resumed, lambda step, prior: StepResult(step.id + " ok", tokens=2))
    done = CheckpointStore(memory_url).load_run("r")
    assert done is not None and done.status == "completed" and done.total_tokens == 8


class _Visits(dict[str, Step]):
    """run.steps that counts the entries Python-level iteration visits (no timing)."""

    visits = 0

    def __iter__(self) -> Iterator[str]:
        for k in dict.__iter__(self):
            _Visits.visits += 1
            yield k

    def __reversed__(self) -> Iterator[str]:
        for k in dict.__reversed__(self):
            _Visits.visits += 1
            yield k

    def keys(self) -> Any:
        return list(iter(self))

    def values(self) -> Any:
        return [self[k] for k in self]

    def items(self) -> Any:
        return [(k, self[k]) for k in self]


def _chain_visits(n: int, mode: str) -> int:
    agent = CheckpointedAgent(CheckpointStore(f"memory://chain-{uuid.uuid4().hex[:8]}"),
                              policy=CheckpointPolicy.every_n_steps(10**6))
    run = agent.start_run("g", [Step(id="s0", title="s0")], run_id="r")
    run.__dict__["steps"] = _Visits(run.steps)
    _Visits.visits = 0

    def body(step: Step) -> str:
        i = int(step.id[1:])
        if i + 1 < n:
            run.add_step(Step(id=f"s{i + 1}", title="t", dependencies=[step.id]))
        return "ok"

    async def abody(step: Step, prior: Any) -> str:
        return body(step)

    if mode == "sync":
        agent.execute_run(run, lambda step, prior: body(step))
    else:
        asyncio.run(agent.aexecute_run(run, abody, concurrency=8))
    assert run.status == "completed" and len(run.steps) == n
    return _Visits.visits


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_chain_of_steps_each_adding_the_next_costs_linear_work(mode: str) -> None:
    """Each end-of-queue look scanned every step of the run: n steps added one by one cost
    n^2/2 visits (x97 from 100 to 1,000 steps). Now a look visits only what was added."""
    small, large = _chain_visits(100, mode), _chain_visits(1000, mode)
    print(f"{mode}: run.steps entries visited: {small} at n=100, {large} at n=1000, "
          f"ratio {large / small:.1f}")
    assert large / small < 20  # linear: ~10; quadratic: ~100


# ------------------------------------------------------------------------------ saver

def _checkpoint(step: int) -> tuple[Any, Any, Any]:
    ck: Any = {
        "v": 4, "id": str(uuid6()), "ts": "2026-12-07T00:00:00+00:00",
        "channel_values": {"system": "you are terse " * 20, "turns": "t" * 200 * (step + 1)},
        "channel_versions": {"system": 1, "turns": step + 1},
        "versions_seen": {}, "updated_channels": ["turns"],
    }
    md: Any = {"source": "loop", "step": step, "parents": {}, "run_id": str(uuid.uuid4())}
    return ck, md, ({"system": 1, "turns": 1} if step == 0 else {"turns": step + 1})


def _put(saver: CkptfsSaver, thread: str, step: int, parent: Any = None) -> Any:
    cfg: Any = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(cfg, *_checkpoint(step))


@pytest.fixture(params=["memory", "disk"])
def lg_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"memory://lg-{uuid.uuid4().hex[:8]}" if request.param == "memory" else str(tmp_path / "s")


def test_a_removal_between_a_put_and_its_note_then_a_start_over_is_not_trusted(
        lg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put of `victim` leaves the gate; before it notes what it wrote, another saver of the
    process deletes the thread and this saver starts over (forgetting the epoch the note
    would be checked against). The graph run's next put, from that checkpoint, pointed
    `system` at the deleted holder: acknowledged, then CorruptFileError on every read."""
    monkeypatch.setattr(saver_module, "_MAX_THREADS", 5)
    real_leave = erasures.leave_write
    with CkptfsSaver(lg_url) as a, CkptfsSaver(lg_url) as b:
        first = _put(a, "victim", 0)

        def leave(store: str, thread_id: str) -> None:
            real_leave(store, thread_id)
            if thread_id == "victim" and not leave.done:  # type: ignore[attr-defined]
                leave.done = True  # type: ignore[attr-defined]
                b.delete_thread("victim")  # the removal lands before the put notes anything
                for i in range(6):  # and the saver starts over
                    _put(a, f"other{i}", 0)

        leave.done = False  # type: ignore[attr-defined]
        monkeypatch.setattr(erasures, "leave_write", leave)
        second = _put(a, "victim", 1, first)
        monkeypatch.setattr(erasures, "leave_write", real_leave)
        third = _put(a, "victim", 2, second)  # the same graph run's next checkpoint
    with CkptfsSaver(lg_url) as reader:
        got = reader.get_tuple(third)
        assert got is not None
        assert got.checkpoint["channel_values"] == {"system": "you are terse " * 20, "turns": "t" * 600}


@pytest.mark.parametrize("how", ["newest", "by id", "list"])
def test_a_read_racing_a_delete_by_another_saver_finds_no_thread_not_damage(
        lg_url: str, how: str) -> None:
    """The reader has the newest checkpoint's bytes when another saver deletes the thread
    (newest first): the holders it reads next are gone. That raised CorruptFileError, as if
    the store were damaged; the thread is gone, so the answer is that it is."""
    with CkptfsSaver(lg_url) as a, CkptfsSaver(lg_url) as b, CkptfsSaver(lg_url) as reader:
        cfg = None
        for i in range(3):
            cfg = _put(a, "t", i, cfg)
        real = reader._read_holder
        calls: list[str] = []

        def read_holder(*args: Any) -> Any:
            if not calls:
                b.delete_thread("t")
            calls.append(args[2])
            return real(*args)

        reader._read_holder = read_holder  # type: ignore[method-assign]
        if how == "list":
            assert list(reader.list({"configurable": {"thread_id": "t"}})) == []
        else:
            assert reader.get_tuple(cfg if how == "by id" else {"configurable": {"thread_id": "t"}}) is None
        assert calls  # the race was met
        # real damage still says so: a holder gone while its checkpoint is there
        t2 = _put(a, "t2", 1, _put(a, "t2", 0))
        a.storage.delete(lg_checkpoint_key("t2", "", t2_parent(a, t2)))
        with CkptfsSaver(lg_url) as fresh, pytest.raises(CorruptFileError) as damaged:
            fresh.get_tuple(t2)
        assert "which is gone" in str(damaged.value)


def t2_parent(saver: CkptfsSaver, cfg: Any) -> str:
    got = saver.get_tuple(cfg)
    assert got is not None and got.parent_config is not None
    return str(got.parent_config["configurable"]["checkpoint_id"])


def _traced() -> int:
    """Bytes allocated by the LangGraph integration's code since tracing began and still held
    (the saver's memories), not by storage: the objects codec.py packs are the store's, and
    keys.py's are its key caches (functools.lru_cache, 4,096 or 8,192 entries)."""
    gc.collect()
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*/integrations/langgraph/*"),
         tracemalloc.Filter(False, "*/integrations/langgraph/codec.py"),
         tracemalloc.Filter(False, "*/integrations/langgraph/keys.py")])
    return sum(stat.size for stat in snap.statistics("filename"))


@pytest.mark.parametrize("shape", ["one thread, small channels", "a namespace per put"])
def test_the_saver_memory_stays_bounded_over_20000_puts(
        shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 puts; what the integration's code allocated over the last 8,000 and still holds
    (tracemalloc). One thread with small channels grew the values cache ~460 bytes a put past
    its 256 KB budget (each entry counted as its ~5 bytes of value); a subgraph's new
    namespace per call grew `_last` by an entry a put, on one thread."""
    monkeypatch.setattr(saver_module, "_MAX_THREADS", 500)
    saver = CkptfsSaver(f"memory://bound-{uuid.uuid4().hex[:8]}", cache_bytes=256 << 10, exclusive=False)
    cfg: Any = None
    try:
        for i in range(20_000):
            if i == 12_000:
                tracemalloc.start()
            if shape == "a namespace per put":
                cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": f"child:{uuid.uuid4()}"}}
            elif cfg is None:
                cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            ck: Any = {"v": 4, "id": str(uuid6()), "ts": "2026-12-07T00:00:00+00:00",
                       "channel_values": {"flag": i % 2 == 0, "turns": i},
                       "channel_versions": {"flag": i + 1, "turns": i + 1},
                       "versions_seen": {}, "updated_channels": ["flag", "turns"]}
            md: Any = {"source": "loop", "step": i, "parents": {}}
            cfg = saver.put(cfg, ck, md, {"flag": i + 1, "turns": i + 1})
        held = _traced()
    finally:
        tracemalloc.stop()
        saver.close()
    print(f"{shape}: {held // 1024} KB allocated over the last 8,000 puts and still held")
    # bounded: the values cache's 256 KB (~1,250 entries) and 500 namespaces; before: ~4, ~8 MB
    assert held < 3 << 19, held
    assert len(saver._last) <= 500 and len(saver._values._items) <= (256 << 10) // 200
