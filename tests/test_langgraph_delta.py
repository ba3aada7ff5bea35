"""DeltaChannel (langgraph-checkpoint 4.1+) on CkptfsSaver: the same states at every step as
the graph with a plain reducer channel, a history walk that reads far fewer objects than
LangGraph's default, and prune, copy_thread and import-langgraph that keep every surviving
state rebuildable."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph.importer import SqliteSource, import_threads


def _concat(state: Sequence[str], writes: Sequence[Sequence[str]]) -> list[str]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


EVERY = 8  # updates between snapshots; each invocation makes two (its input, one super-step)


class State(TypedDict):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=EVERY)]
    n: int


class PlainState(TypedDict):
    """The same state with an ordinary reducer channel: the values every step must have."""

    items: Annotated[list[str], operator.add]
    n: int


def build(saver: BaseCheckpointSaver[Any], state: Any = State) -> Any:
    """Two parallel nodes write the delta channel each step: replay must keep their order."""
    def left(state: dict[str, Any]) -> dict[str, Any]:
        return {"items": [f"left{len(state['items'])}"]}

    def right(state: dict[str, Any]) -> dict[str, Any]:
        return {"items": [f"right{len(state['items'])}"], "n": state.get("n", 0) + 1}

    g = StateGraph(state)
    g.add_node("left", left)
    g.add_node("right", right)
    g.add_edge(START, "left")
    g.add_edge(START, "right")
    g.add_edge("left", END)
    g.add_edge("right", END)
    return g.compile(checkpointer=saver)


CFG: Any = {"configurable": {"thread_id": "d"}}


def run(saver: BaseCheckpointSaver[Any], steps: int, thread: str = "d", state: Any = State) -> Any:
    graph = build(saver, state)
    for i in range(steps):
        graph.invoke({"items": [f"in{i}"]}, {"configurable": {"thread_id": thread}})
    return graph


def states(graph: Any, thread: str = "d") -> list[tuple[Any, ...]]:
    return [(s.values, s.next, s.metadata.get("step")) for s in
            graph.get_state_history({"configurable": {"thread_id": thread}})]


def test_states_match_a_plain_channel_at_every_step(tmp_path: Path) -> None:
    ours = run(CkptfsSaver(str(tmp_path / "s")), 12)
    # (InMemorySaver before langgraph-checkpoint 4.3 replays parallel writes by task id, not in
    # the order the run applied them: the plain channel is the reference on every release)
    theirs = run(InMemorySaver(), 12, state=PlainState)
    final = ours.get_state(CFG).values["items"]
    assert len(final) == 36 and final[:3] == ["in0", "left1", "right1"]
    assert states(ours) == states(theirs)
    # a fresh saver (no cache) rebuilds the same from storage alone
    assert states(build(CkptfsSaver(str(tmp_path / "s")))) == states(theirs)


class _Counting:
    """Counts the reads a saver makes of its storage."""

    def __init__(self, saver: CkptfsSaver) -> None:
        self.gets = self.lists = 0
        storage = saver.storage
        get, lst = storage.get, storage.list

        def counted_get(key: str) -> bytes:
            self.gets += 1
            return get(key)

        def counted_list(prefix: str = "", start_after: str | None = None) -> list[str]:
            self.lists += 1
            return lst(prefix, start_after)

        storage.get = counted_get  # type: ignore[method-assign]
        storage.list = counted_list  # type: ignore[method-assign]


def test_history_walk_is_one_pass_and_reads_less_than_the_default(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path / "s"))
    run(saver, 19)  # the newest snapshot is several checkpoints back
    head = saver.get_tuple(CFG)
    assert head is not None
    fresh = CkptfsSaver(str(tmp_path / "s"))  # nothing cached
    count = _Counting(fresh)
    ours = fresh.get_delta_channel_history(config=head.config, channels=["items"])
    ours_gets, ours_lists = count.gets, count.lists
    other = CkptfsSaver(str(tmp_path / "s"))
    count = _Counting(other)
    default = BaseCheckpointSaver.get_delta_channel_history(other, config=head.config, channels=["items"])
    assert ours == default
    assert len(ours["items"]["writes"]) >= 6 and "seed" in ours["items"]
    assert ours_lists <= 2 and count.lists >= 3 * ours_lists, (ours_lists, count.lists)
    assert ours_gets < count.gets, (ours_gets, count.gets)
    # a channel nobody wrote: no seed, no writes; no channels: nothing
    assert fresh.get_delta_channel_history(config=head.config, channels=["nope"]) == {"nope": {"writes": []}}
    assert fresh.get_delta_channel_history(config=head.config, channels=[]) == {}


async def test_async_history_matches(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path / "s"))
    run(saver, 5)
    head = saver.get_tuple(CFG)
    assert head is not None
    got = await saver.aget_delta_channel_history(config=head.config, channels=["items"])
    assert got == saver.get_delta_channel_history(config=head.config, channels=["items"])


def test_prune_keeps_the_stretch_back_to_a_snapshot_and_drops_the_rest(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path / "s"))
    graph = run(saver, 15)
    before = {s.config["configurable"]["checkpoint_id"]: s.values for s in graph.get_state_history(CFG)}
    latest = graph.get_state(CFG).values
    saver.prune(["d"], keep_last=1)
    fresh = build(CkptfsSaver(str(tmp_path / "s")))
    assert fresh.get_state(CFG).values == latest
    left = {s.config["configurable"]["checkpoint_id"]: s.values for s in fresh.get_state_history(CFG)}
    # the ancestors back to the nearest snapshot stay, older ones go: the oldest left stores it
    assert 1 < len(left) <= EVERY + 2 and len(before) == 45, (len(left), len(before))
    oldest = min(left)
    tup = CkptfsSaver(str(tmp_path / "s")).get_tuple(
        {"configurable": {"thread_id": "d", "checkpoint_id": oldest}})
    assert tup is not None and "items" in tup.checkpoint["channel_values"]
    assert all(before[cid] == values for cid, values in left.items())  # each survivor unchanged
    # and the thread goes on
    fresh.invoke({"items": ["after"]}, CFG)
    assert fresh.get_state(CFG).values["items"][: len(latest["items"]) + 1] == [*latest["items"], "after"]


def test_copy_thread_carries_the_chain(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path / "s"))
    graph = run(saver, 7)
    saver.copy_thread("d", "copy")
    fresh = build(CkptfsSaver(str(tmp_path / "s")))
    assert states(fresh, "copy") == states(graph, "d")
    fresh.invoke({"items": ["on-copy"]}, {"configurable": {"thread_id": "copy"}})
    assert fresh.get_state(CFG).values == graph.get_state(CFG).values  # the source is untouched
    assert "on-copy" in fresh.get_state({"configurable": {"thread_id": "copy"}}).values["items"]


def test_a_delta_thread_imported_from_sqlite_resumes(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    with SqliteSaver.from_conn_string(str(path)) as sql:
        run(sql, 8)
        expected = states(build(sql))
        source = SqliteSource(str(path))
        dest = CkptfsSaver(str(tmp_path / "s"))
        assert import_threads(source, dest).ok
        source.close()
        assert states(build(dest)) == expected
        # one more step on each gives the same state
        build(sql).invoke({"items": ["next"]}, CFG)
        build(dest).invoke({"items": ["next"]}, CFG)
        assert build(dest).get_state(CFG).values == build(sql).get_state(CFG).values
