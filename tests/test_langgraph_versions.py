"""Channel versions of any monotonic type: a thread InMemorySaver (string versions) or another
saver (floats) started continues on CkptfsSaver in its own type, and a fresh thread keeps ints."""

from __future__ import annotations

import operator
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph.versions import kind_of, next_version, remember_kind


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    approved: bool


def build(saver: BaseCheckpointSaver[Any]) -> Any:
    def draft(state: State) -> dict[str, Any]:
        return {"log": ["draft"]}

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


def copy_checkpoints(src: BaseCheckpointSaver[Any], dst: CkptfsSaver, thread: str) -> int:
    """Every checkpoint of a thread, oldest first, with its pending writes, as LangGraph's own
    migration tests save them (new_versions = every channel's version)."""
    tuples = sorted(src.list({"configurable": {"thread_id": thread}}),
                    key=lambda t: t.config["configurable"]["checkpoint_id"])
    for tup in tuples:
        grouped: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in tup.pending_writes or []:
            grouped[task_id].append((channel, value))
        for task_id, writes in grouped.items():
            dst.put_writes(tup.config, writes, task_id)
        parent = tup.parent_config or {"configurable": {
            "thread_id": thread, "checkpoint_ns": tup.config["configurable"]["checkpoint_ns"]}}
        dst.put(parent, tup.checkpoint, tup.metadata, tup.checkpoint["channel_versions"])
    return len(tuples)


def _counter(version: Any) -> int:
    return int(str(version).split(".")[0])


def test_a_thread_inmemorysaver_started_continues_with_string_versions(tmp_path: Path) -> None:
    cfg: Any = {"configurable": {"thread_id": "t1"}}
    mem = InMemorySaver()
    out = build(mem).invoke({"log": [], "approved": False}, cfg)
    assert "__interrupt__" in out
    before = mem.get_tuple(cfg)
    assert before is not None and kind_of(before.checkpoint["channel_versions"].values()) == "str"
    assert copy_checkpoints(mem, CkptfsSaver(str(tmp_path / "s")), "t1") >= 3

    saver = CkptfsSaver(str(tmp_path / "s"))
    graph = build(saver)
    state = graph.get_state(cfg)
    assert state.next == ("review",) and state.tasks[0].interrupts[0].value == {"question": "approve?"}
    done = graph.invoke(Command(resume="yes"), cfg)
    assert done["log"] == ["draft", "review:yes", "published"] and done["approved"] is True

    after = saver.get_tuple(cfg)
    assert after is not None
    versions = after.checkpoint["channel_versions"]
    assert all(isinstance(v, str) and len(v.split(".")[0]) == 32 for v in versions.values())
    old = before.checkpoint["channel_versions"]
    assert max(versions.values()) > max(old.values())
    assert _counter(versions["log"]) > _counter(old["log"])
    # a second run on the same thread keeps going in strings
    again = graph.invoke({"log": ["more"], "approved": False}, cfg)
    assert "__interrupt__" in again
    latest = saver.get_tuple(cfg)
    assert latest is not None
    assert kind_of(latest.checkpoint["channel_versions"].values()) == "str"
    # the whole history reads back, newest first
    steps = [h.metadata["step"] for h in graph.get_state_history(cfg)]
    assert steps == sorted(steps, reverse=True) and len(steps) >= 8


async def test_async_continuation_of_a_string_thread(tmp_path: Path) -> None:
    cfg: Any = {"configurable": {"thread_id": "a1"}}
    mem = InMemorySaver()
    await build(mem).ainvoke({"log": [], "approved": False}, cfg)
    copy_checkpoints(mem, CkptfsSaver(str(tmp_path / "s")), "a1")
    graph = build(CkptfsSaver(str(tmp_path / "s")))
    done = await graph.ainvoke(Command(resume="no"), cfg)
    assert done["log"] == ["draft", "review:no", "dropped"]
    tup = await graph.checkpointer.aget_tuple(cfg)
    assert tup is not None and kind_of(tup.checkpoint["channel_versions"].values()) == "str"
    # the async read taught this task the thread's type, though it ran in a worker thread
    assert isinstance(graph.checkpointer.get_next_version(None, None), str)


class _FloatSaver(InMemorySaver):
    """A saver that writes float versions (the base class allows int, float and str)."""

    def get_next_version(self, current: Any, channel: None) -> Any:
        return 1.0 if current is None else float(current) + 1.0


def test_a_float_thread_continues_with_floats(tmp_path: Path) -> None:
    cfg: Any = {"configurable": {"thread_id": "f"}}
    src = _FloatSaver()
    build(src).invoke({"log": [], "approved": False}, cfg)
    copy_checkpoints(src, CkptfsSaver(str(tmp_path / "s")), "f")
    saver = CkptfsSaver(str(tmp_path / "s"))
    done = build(saver).invoke(Command(resume="yes"), cfg)
    assert done["log"][-1] == "published"
    tup = saver.get_tuple(cfg)
    assert tup is not None
    assert all(type(v) is float for v in tup.checkpoint["channel_versions"].values())


def test_a_fresh_thread_keeps_int_versions(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path / "s"))
    cfg: Any = {"configurable": {"thread_id": "new"}}
    build(saver).invoke({"log": [], "approved": False}, cfg)
    tup = saver.get_tuple(cfg)
    assert tup is not None
    assert all(type(v) is int for v in tup.checkpoint["channel_versions"].values())


def test_a_first_version_follows_the_thread_just_read(tmp_path: Path) -> None:
    """LangGraph asks `get_next_version(None)` for a channel new to a thread (a forced delta
    snapshot): in a string thread it must be a string, or `max()` over versions fails."""
    cfg: Any = {"configurable": {"thread_id": "t"}}
    mem = InMemorySaver()
    build(mem).invoke({"log": [], "approved": False}, cfg)
    saver = CkptfsSaver(str(tmp_path / "s"))
    copy_checkpoints(mem, saver, "t")
    assert saver.get_tuple(cfg) is not None
    first = saver.get_next_version(None, None)
    assert isinstance(first, str) and _counter(first) == 1
    assert saver.get_tuple({"configurable": {"thread_id": "none-such"}}) is None
    assert saver.get_next_version(None, None) == 1


def test_next_version_of_each_type() -> None:
    remember_kind(None)
    assert next_version(None) == 1 and next_version(7) == 8
    assert next_version(2.5) == 3.5 and type(next_version(2.0)) is float
    s = next_version("00000000000000000000000000000002.0.243798")
    assert isinstance(s, str) and s > "00000000000000000000000000000002.0.243798"
    assert _counter(s) == 3 and len(s.split(".")[0]) == 32
    assert next_version(s) > s
    remember_kind("float")
    assert next_version(None) == 1.0 and type(next_version(None)) is float
    remember_kind("str")
    assert _counter(next_version(None)) == 1
    remember_kind(None)
    for bad in ("v7", "", True):
        with pytest.raises(ValueError):
            next_version(bad)
    with pytest.raises(ValueError, match="would not sort after"):
        next_version("9")  # an unpadded counter: "000...10" sorts before "9"
