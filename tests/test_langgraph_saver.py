"""CkptfsSaver with real LangGraph graphs and its sync API: interrupt/resume, history, fork,
delta chains across processes, prune keeping what is still read, ids, corruption."""

from __future__ import annotations

import operator
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ckptfs.errors import CorruptFileError, InvalidIdError
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.storage.registry import open_storage


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    approved: bool


def build(saver: CkptfsSaver) -> Any:
    def draft(state: State) -> dict[str, Any]:
        return {"log": ["draft " + "x" * 600]}

    def review(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "approve?"})
        return {"log": [f"review:{answer}"], "approved": answer == "yes"}

    def publish(state: State) -> dict[str, Any]:
        return {"log": ["published" if state["approved"] else "dropped"]}

    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("review", review)
    g.add_node("publish", publish)
    g.add_edge(START, "draft")
    g.add_edge("draft", "review")
    g.add_edge("review", "publish")
    g.add_edge("publish", END)
    return g.compile(checkpointer=saver)


def test_interrupt_resume_history_and_fork(any_store_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = any_store_url
    cfg: Any = {"configurable": {"thread_id": "chat/1: émoji|ns"}}
    graph = build(CkptfsSaver(url, opts))
    out = graph.invoke({"log": [], "approved": False}, cfg)
    assert "__interrupt__" in out
    # a new saver (no cache) sees the pending interrupt and resumes from storage alone
    graph = build(CkptfsSaver(url, opts))
    state = graph.get_state(cfg)
    assert state.next == ("review",) and state.tasks[0].interrupts[0].value == {"question": "approve?"}
    done = graph.invoke(Command(resume="yes"), cfg)
    assert done["log"][-2:] == ["review:yes", "published"] and done["approved"] is True

    history = list(graph.get_state_history(cfg))
    steps = [h.metadata["step"] for h in history]
    assert steps == sorted(steps, reverse=True)
    before_review = next(h for h in history if h.next == ("review",))
    # time travel: replaying the old checkpoint reuses the writes stored there (as LangGraph's own
    # savers do), while a fork made with update_state takes the other answer
    replay = graph.invoke(Command(resume="no"), before_review.config)
    assert replay["log"][-2:] == ["review:yes", "published"]
    # as_node named: which node an update is applied as by default changed after langgraph 1.0
    fork = graph.update_state(before_review.config, {"log": ["forked"]}, as_node="draft")
    assert graph.get_state(fork).next == ("review",)
    forked = graph.invoke(Command(resume="no"), fork)
    assert forked["log"][-3:] == ["forked", "review:no", "dropped"]
    assert graph.get_state(cfg).values["log"][-1] == "dropped"  # the fork is now the newest
    assert any(h.values.get("log", [])[-1:] == ["published"] for h in graph.get_state_history(cfg))


def _put_chain(saver: CkptfsSaver, thread: str, n: int, ns: str = "", run_id: str = "r1") -> list[Any]:
    cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    out, msgs = [], []
    for i in range(n):
        msgs.append(f"message {i} " + "".join(uuid.uuid4().hex for _ in range(20)))  # ~640 B
        cp: Any = {"v": 4, "id": str(uuid6(clock_seq=i)), "ts": "2026-01-01T00:00:00+00:00",
                   "channel_values": {"messages": list(msgs), "const": "fixed", "step": i},
                   "channel_versions": {"messages": i + 1, "const": 1, "step": i + 1},
                   "versions_seen": {}, "updated_channels": None}
        new = {"messages": i + 1, "step": i + 1} | ({"const": 1} if i == 0 else {})
        cfg = saver.put(cfg, cp, {"source": "loop", "step": i, "run_id": run_id}, new)
        out.append((cfg, list(msgs)))
    return out


@pytest.mark.parametrize("log", [True, False], ids=["log", "file-per-put"])
def test_deltas_small_and_rebuilt_by_a_fresh_process(tmp_path: Path, log: bool) -> None:
    url = str(tmp_path / "s")
    saver = CkptfsSaver(url, full_every=4, log=log)
    chain = _put_chain(saver, "t", 10)
    storage = CkptfsSaver(url, log=log).storage
    sizes = [storage.size(k) for k in storage.list("langgraph/threads/t/_/ckpt/")]
    assert len(sizes) == 10
    # whole copies at versions 1, 5, 9 (full_every=4); the deltas in between stay small
    assert max(sizes[5:8]) * 2 < sizes[8]
    fresh = CkptfsSaver(url)
    for cfg, msgs in chain:
        tup = fresh.get_tuple(cfg)
        assert tup is not None and tup.checkpoint["channel_values"]["messages"] == msgs
        assert tup.checkpoint["channel_values"]["const"] == "fixed"


def test_sync_list_filters_before_limit_and_writes(memory_url: str) -> None:
    saver = CkptfsSaver(memory_url)
    chain = _put_chain(saver, "t", 5)
    _put_chain(saver, "t", 2, ns="child:1|x")
    saver.put_writes(chain[-1][0], [("a", 1), ("b", {"k": 2})], "task-1", "p")
    saver.put_writes(chain[-1][0], [("a", 1), ("b", {"k": 2})], "task-1", "p")  # idempotent
    ids = [c["configurable"]["checkpoint_id"] for c, _ in chain]
    got = [t.config["configurable"]["checkpoint_id"] for t in saver.list({"configurable": {
        "thread_id": "t", "checkpoint_ns": ""}})]
    assert got == ids[::-1]
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 7  # every namespace
    page = list(saver.list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
                           before=chain[3][0], limit=2))
    assert [t.config["configurable"]["checkpoint_id"] for t in page] == [ids[2], ids[1]]
    assert [t.metadata["step"] for t in saver.list(None, filter={"step": 1})] == [1, 1]
    latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert latest is not None and latest.pending_writes == [("task-1", "a", 1), ("task-1", "b", {"k": 2})]
    assert latest.parent_config is not None
    assert latest.parent_config["configurable"]["checkpoint_id"] == ids[3]


def test_prune_keep_last_keeps_what_survivors_read(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    saver = CkptfsSaver(url, full_every=8)
    chain = _put_chain(saver, "t", 12)
    saver.put_writes(chain[-1][0], [("__interrupt__", {"q": "?"})], "task-9")
    saver.prune(["t"], keep_last=2)
    fresh = CkptfsSaver(url)  # nothing cached: every surviving value comes from storage
    left = list(fresh.list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}))
    assert [t.config for t in left] == [c for c, _ in chain[-2:]][::-1]
    assert left[0].checkpoint["channel_values"]["messages"] == chain[-1][1]
    assert left[0].checkpoint["channel_values"]["const"] == "fixed"  # held from checkpoint 0
    assert left[0].pending_writes == [("task-9", "__interrupt__", {"q": "?"})]
    held = fresh.storage.list("langgraph/threads/t/_/held/")
    assert held, "versions still read by the survivors must be held"
    with pytest.raises(ValueError, match="keep_last"):
        saver.prune(["t"], keep_last=0)
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["t"], strategy="everything")


def test_delete_for_runs_keeps_other_runs_readable(memory_url: str) -> None:
    saver = CkptfsSaver(memory_url)
    first = _put_chain(saver, "t", 3, run_id="run-a")
    cfg = first[-1][0]
    cp: Any = {"v": 4, "id": str(uuid6(clock_seq=99)), "ts": "2026-01-01T00:00:00+00:00",
               "channel_values": {"messages": first[-1][1], "const": "fixed", "step": 3},
               "channel_versions": {"messages": 3, "const": 1, "step": 4}, "versions_seen": {}}
    last = saver.put(cfg, cp, {"source": "loop", "step": 3, "run_id": "run-b"}, {"step": 4})
    saver.delete_for_runs(["run-a"])
    left = list(CkptfsSaver(memory_url).list({"configurable": {"thread_id": "t"}}))
    assert [t.config for t in left] == [last]
    assert left[0].checkpoint["channel_values"]["messages"] == first[-1][1]


def test_copy_and_delete_thread(any_store_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = any_store_url
    saver = CkptfsSaver(url, opts)
    chain = _put_chain(saver, "src", 4)
    saver.copy_thread("src", "dst")
    dst = saver.get_tuple({"configurable": {"thread_id": "dst"}})
    assert dst is not None and dst.checkpoint["channel_values"]["messages"] == chain[-1][1]
    saver.delete_thread("src")
    assert saver.get_tuple({"configurable": {"thread_id": "src"}}) is None
    assert CkptfsSaver(url, opts).get_tuple({"configurable": {"thread_id": "dst"}}) is not None
    saver.delete_for_runs(["r1"])  # the copy carried its run markers
    assert saver.get_tuple({"configurable": {"thread_id": "dst"}}) is None


def test_ids_are_encoded_and_bad_ones_refused(memory_url: str) -> None:
    saver = CkptfsSaver(memory_url)
    for thread in ("../../etc", "a/b", ".", "ns:with|pipes", "ü"):
        _put_chain(saver, thread, 1)
        assert saver.get_tuple({"configurable": {"thread_id": thread}}) is not None
    keys = open_storage(memory_url).list("langgraph/")
    assert all(".." not in k and "/./" not in k for k in keys)
    assert "a/b" in {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert saver.get_tuple({"configurable": {"thread_id": "x" * 500}}) is None  # any length: a hash
    with pytest.raises(InvalidIdError):
        saver.get_tuple({"configurable": {"thread_id": ""}})
    with pytest.raises(InvalidIdError):
        saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "c" * 500}})


def test_flipped_byte_is_reported_not_misread(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    chain = _put_chain(CkptfsSaver(url, full_every=4, log=False), "t", 3)
    storage = open_storage(url)
    key = storage.list("langgraph/threads/t/_/ckpt/")[0]  # the whole copy the deltas build on
    data = bytearray(storage.get(key))
    data[len(data) // 2] ^= 0x40
    storage.put(key, bytes(data))
    with pytest.raises(CorruptFileError):
        CkptfsSaver(url).get_tuple(chain[-1][0])


def test_flipped_byte_in_the_log_is_reported_not_misread(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    chain = _put_chain(CkptfsSaver(url, full_every=4), "t", 3)
    log = tmp_path / "s" / "langgraph" / "threads" / "t" / "_" / ".records"
    assert sorted(p.name for p in log.parent.iterdir()) == [".records"]  # one file, not one per put
    data = bytearray(log.read_bytes())
    data[200] ^= 0x40  # inside the first record: the whole copy the deltas build on
    log.write_bytes(bytes(data))
    fresh = CkptfsSaver(url)
    with pytest.raises(CorruptFileError):
        fresh.get_tuple(chain[-1][0])
    with pytest.raises(CorruptFileError, match="damaged"):  # its own record: named, not misread
        fresh.get_tuple(chain[0][0])


def test_construction_errors(tmp_path: Path) -> None:
    from ckptfs.errors import ConfigError
    from ckptfs.store.checkpoint_store import CheckpointStore

    with pytest.raises(ConfigError):
        CkptfsSaver()
    with pytest.raises(ConfigError):
        CkptfsSaver(str(tmp_path), full_every=0)
    store = CheckpointStore(str(tmp_path / "cs"))
    try:
        saver = CkptfsSaver(store=store)
        _put_chain(saver, f"t{uuid.uuid4().hex[:4]}", 1)
        assert getattr(saver.storage, "inner", None) is store.storage  # shared, with its logs on top
    finally:
        store.close()


_PUTTER = """
import sys
from langgraph.checkpoint.base.id import uuid6
from ckptfs.integrations.langgraph import CkptfsSaver
# every kill leaves its thread lease behind for a ttl: this test is about torn appends, not ownership
saver = CkptfsSaver(sys.argv[1], full_every=8, exclusive=False)
cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
last = saver.get_tuple(cfg)
msgs = list(last.checkpoint["channel_values"]["messages"]) if last else []
if last:
    cfg = last.config
print("ready", flush=True)
for i in range(len(msgs), 1_000_000):
    msgs.append(f"message {i} " + "abcdefghij" * (i % 40))
    cp = {"v": 4, "id": str(uuid6(clock_seq=i)), "ts": "2026-01-01T00:00:00+00:00",
          "channel_values": {"messages": list(msgs)}, "channel_versions": {"messages": i + 1},
          "versions_seen": {}}
    cfg = saver.put(cfg, cp, {"source": "loop", "step": i}, {"messages": i + 1})
    print(cfg["configurable"]["checkpoint_id"], i, flush=True)
"""


def test_sigkill_mid_put_loses_no_acknowledged_checkpoint(tmp_path: Path) -> None:
    """Real kills of a process putting checkpoints into the local log: every put that returned
    reads back whole from a fresh process, and the next process resumes from the newest."""
    import random
    import signal
    import subprocess
    import sys
    import time

    url = str(tmp_path / "s")
    rnd = random.Random(11)
    acked: dict[str, int] = {}
    root = Path(__file__).resolve().parent.parent
    for _ in range(8):
        kid = subprocess.Popen([sys.executable, "-c", _PUTTER, url], cwd=root, stdout=subprocess.PIPE,
                               text=True)
        assert kid.stdout is not None and kid.stdout.readline() == "ready\n"
        time.sleep(rnd.uniform(0.05, 0.3))
        kid.send_signal(signal.SIGKILL)
        out, _ = kid.communicate(timeout=30)
        # a line the kill cut short was never acknowledged
        whole = [line.split() for line in out.splitlines(keepends=True) if line.endswith("\n")]
        acked.update((cid, int(i)) for cid, i in whole)
        fresh = CkptfsSaver(url)
        newest = fresh.get_tuple({"configurable": {"thread_id": "t"}})
        assert newest is not None
        assert len(newest.checkpoint["channel_values"]["messages"]) >= max(acked.values()) + 1
        for cid, i in rnd.sample(sorted(acked.items()), min(15, len(acked))):
            tup = fresh.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": cid}})
            assert tup is not None, f"acknowledged checkpoint {cid} (put {i}) is gone"
            msgs = tup.checkpoint["channel_values"]["messages"]
            assert len(msgs) == i + 1 and msgs[-1] == f"message {i} " + "abcdefghij" * (i % 40)
    assert len(acked) > 50
