"""A write on state read before another process wrote the thread is refused, never stored.

A hostile review (breaker-s3 s7b/s7c/s7d): process B read a thread, then waited for its lease
(busy_timeout) or simply came to write after process A had written and let go; B's write went
on top of the checkpoint it had read, and the thread's newest checkpoint no longer had A's
acknowledged checkpoints in its history. The lease refused only a process that had itself
written the thread before; one that had only read it (or found it empty) was let through.

A is a real process running a LangGraph graph, driven line by line; B is this process, its
read held by events so the interleaving is the same on every run (no sleeps). On local disk
and on S3 over HTTP (moto).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from operator import add
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from test_langgraph_ownership import Child

from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph.ownership import ThreadBusyError

TTL = 4.0  # renewals every second: a live holder is never taken over while the test runs
ROOT = Path(__file__).resolve().parent.parent
CFG: Any = {"configurable": {"thread_id": "t1"}}


class State(TypedDict, total=False):
    count: int
    log: Annotated[list[str], add]
    tick: str


def counter(saver: CkptfsSaver, tag: str) -> Any:
    """One node: count + 1, and "<count>:<tag>" appended to the log (whose history it is)."""
    def step(state: State) -> dict[str, Any]:
        n = state.get("count", 0) + 1
        return {"count": n, "log": [f"{n}:{tag}"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g.compile(checkpointer=saver)


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[4])
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph.ownership import ThreadBusyError
from test_langgraph_stale_read_fork import CFG, counter
saver = CkptfsSaver(sys.argv[1], json.loads(sys.argv[2]), lease_ttl=float(sys.argv[3]), lease_idle=600)
graph = counter(saver, "A")
print("holder", saver.leases.holder, flush=True)
for line in sys.stdin:
    try:
        if line.split()[0] == "invoke":
            out = graph.invoke({"tick": "a"}, CFG, durability="sync")
            print("ok", out["count"], flush=True)  # acknowledged
            continue
        saver.release()
        print("ok", flush=True)
    except ThreadBusyError as exc:
        print("busy", json.dumps(str(exc)), flush=True)
"""


class GraphChild(Child):
    """Process A: `invoke` runs the graph once on thread t1 (answers "ok <count>"), `release`
    gives the thread back. It keeps the thread's lease between invokes (lease_idle 600 s)."""

    def __init__(self, url: str, opts: dict[str, Any]) -> None:
        argv = [sys.executable, "-c", _CHILD, url, json.dumps(opts), str(TTL), str(ROOT / "tests")]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self._line()
        assert first.startswith("holder "), first
        self.holder = first.split(" ", 1)[1]

    def invoke(self) -> int:
        reply = self.do("invoke")
        assert reply.startswith("ok "), reply
        return int(reply.split()[1])


@pytest.fixture
def child_a(shared_url: tuple[str, dict[str, Any]]) -> Any:
    a = GraphChild(*shared_url)
    yield a
    a.close()


class ReadGate:
    """Wraps a saver's get_tuple: once `armed`, the next root read is reported (`read`, with
    what it found) and the graph run waits there until `go` is set: the interleaving, fixed."""

    def __init__(self, saver: CkptfsSaver, hold: bool) -> None:
        self.read, self.go, self.hold, self.armed = threading.Event(), threading.Event(), hold, True
        self.found: Any = "unset"
        real = saver.get_tuple

        def get_tuple(config: Any) -> Any:
            got = real(config)
            if self.armed and not (config.get("configurable") or {}).get("checkpoint_ns"):
                self.armed = False
                self.found = got.checkpoint["channel_values"].get("count") if got else None
                self.read.set()
                if self.hold:
                    assert self.go.wait(120)
            return got

        saver.get_tuple = get_tuple  # type: ignore[method-assign]


def _run_b(graph: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """B's graph run in a thread of this process: its count, or the error it raised."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["count"] = graph.invoke({"tick": "b"}, CFG, durability="sync")["count"]
        except BaseException as exc:
            outcome["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def _newest_line(url: str, opts: dict[str, Any]) -> list[str]:
    """The log of the thread's newest checkpoint, checked against its parent chain: every
    checkpoint from the newest back to the first, each one's log the parent's plus one entry."""
    reader = CkptfsSaver(url, opts, exclusive=False)
    by_id = {t.config["configurable"]["checkpoint_id"]: t for t in reader.list(CFG)}
    newest = reader.get_tuple(CFG)
    assert newest is not None
    tup, logs = newest, []
    while tup is not None:
        logs.append(tup.checkpoint["channel_values"].get("log", []))
        parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
        tup = by_id.get(parent) if parent is not None else None
    log = newest.checkpoint["channel_values"]["log"]
    assert all(len(a) >= len(b) and a[: len(b)] == b for a, b in itertools.pairwise(logs)), logs
    reader.close()
    return list(log)


def _refused(outcome: dict[str, Any], url: str, opts: dict[str, Any]) -> None:
    err = outcome.get("error")
    assert isinstance(err, ThreadBusyError), (
        f"B wrote on the state it read before A's writes: {outcome}, newest history "
        f"{_newest_line(url, opts)}")
    assert err.thread_id == "t1" and "since this process read it" in str(err), str(err)


def test_a_writer_that_waited_for_the_lease_is_refused_on_what_it_read_before(
        shared_url: tuple[str, dict[str, Any]], child_a: GraphChild) -> None:
    """s7d: B reads count 1 while A holds the thread, waits for the lease (busy_timeout) while A
    writes 2..5 and lets go; B's write of count 2 on checkpoint 1 would drop A's 2..5."""
    url, opts = shared_url
    acked = [child_a.invoke()]  # A holds the thread from here on
    saver = CkptfsSaver(url, opts, lease_ttl=TTL, busy_timeout=60)
    gate = ReadGate(saver, hold=False)
    b, outcome = _run_b(counter(saver, "B"))
    assert gate.read.wait(120) and gate.found == 1  # B read count 1; its put now waits for the lease
    acked += [child_a.invoke() for _ in range(4)]
    assert child_a.do("release") == "ok"
    b.join(120)
    assert acked == [1, 2, 3, 4, 5]
    _refused(outcome, url, opts)
    assert _newest_line(url, opts) == ["1:A", "2:A", "3:A", "4:A", "5:A"]
    # B runs again: it reads A's newest and goes on from there
    assert counter(saver, "B").invoke({"tick": "b"}, CFG, durability="sync")["count"] == 6
    saver.release()
    # a wait that sees nothing new meanwhile is no reason to refuse: A holds (count 7), B reads
    # it and waits, A lets go without writing, B writes count 8 on A's 7
    assert child_a.invoke() == 7
    gate.armed = True
    gate.read.clear()
    b, outcome = _run_b(counter(saver, "B"))
    assert gate.read.wait(120) and gate.found == 7
    assert child_a.do("release") == "ok"
    b.join(120)
    assert outcome == {"count": 8}, outcome
    assert _newest_line(url, opts) == ["1:A", "2:A", "3:A", "4:A", "5:A", "6:B", "7:A", "8:B"]
    saver.close()


def test_a_writer_that_read_the_thread_empty_is_refused_once_another_wrote_it(
        shared_url: tuple[str, dict[str, Any]], child_a: GraphChild) -> None:
    """s7b/s7c: B reads the thread while it is empty; A writes 1..3 and lets go before B's first
    write; B's count 1 would start a second root history beside A's."""
    url, opts = shared_url
    saver = CkptfsSaver(url, opts, lease_ttl=TTL)  # busy_timeout 0: the lease is free by then
    gate = ReadGate(saver, hold=True)
    b, outcome = _run_b(counter(saver, "B"))
    assert gate.read.wait(120) and gate.found is None
    acked = [child_a.invoke() for _ in range(3)]
    assert child_a.do("release") == "ok"
    gate.go.set()
    b.join(120)
    assert acked == [1, 2, 3]
    _refused(outcome, url, opts)
    assert _newest_line(url, opts) == ["1:A", "2:A", "3:A"]
    roots = [t for t in CkptfsSaver(url, opts, exclusive=False).list(CFG) if t.parent_config is None]
    assert len(roots) == 1  # one history, A's
    assert counter(saver, "B").invoke({"tick": "b"}, CFG, durability="sync")["count"] == 4
    saver.close()
