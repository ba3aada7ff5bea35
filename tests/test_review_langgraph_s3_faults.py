"""CkptfsSaver on S3 (moto over real HTTP, through the fault proxy): what put acknowledges is
read back by a new process, also when another saver of the writer's process removes objects of
the thread (delete_thread, as an admin endpoint would) while the thread is being run.

All savers of one process on one store share a thread's lease, so the lease does not keep a
second saver's delete_thread away from a thread the first one is writing. The first saver then
built its next checkpoint on what it remembered of the deleted objects: an unchanged channel
referred to a deleted checkpoint. put acknowledged it, the writer read it back from its cache,
and every other process got CorruptFileError for the thread ("refers to channel versions in this
object, which is gone"), for good. A long thread id (a hashed key segment) written again after
such a delete had no name object: `list(None)` skipped the thread with a warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import unquote

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph

from backends.s3.embedded import EmbeddedS3
from ckptfs.integrations.langgraph import CkptfsSaver
from tests._fault_proxy import Fault, FaultProxy, Request

ROOT = Path(__file__).resolve().parent.parent

_READER = r"""
import json, sys
from ckptfs.integrations.langgraph import CkptfsSaver
url, opts, thread_id = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
saver = CkptfsSaver(url, opts, exclusive=False)
cfg = {"configurable": {"thread_id": thread_id}}
try:
    tup = saver.get_tuple(cfg)
    out = {"values": tup.checkpoint["channel_values"] if tup else None,
           "listed": len(list(saver.list(cfg))),
           "threads": sorted({t.config["configurable"]["thread_id"] for t in saver.list(None)})}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def _read_in_new_process(url: str, opts: dict[str, Any], thread_id: str) -> dict[str, Any]:
    """What another machine reads of the thread: a process of its own, nothing cached."""
    done = subprocess.run([sys.executable, "-c", _READER, url, json.dumps(opts), thread_id],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


class State(TypedDict):
    count: int
    doc: str


def _graph(saver: CkptfsSaver, admin: CkptfsSaver, thread_id: str) -> Any:
    """count -> wipe (another saver of this process deletes the thread) -> count."""

    def count(state: State) -> dict[str, Any]:
        return {"count": state["count"] + 1}

    def wipe(state: State) -> dict[str, Any]:
        admin.delete_thread(thread_id)
        return {"count": state["count"] + 1}

    builder = StateGraph(State)
    builder.add_node("first", count)
    builder.add_node("wipe", wipe)
    builder.add_node("last", count)
    builder.add_edge(START, "first")
    builder.add_edge("first", "wipe")
    builder.add_edge("wipe", "last")
    return builder.compile(checkpointer=saver)


def test_a_thread_deleted_by_another_saver_mid_run_reads_back_in_a_new_process(s3: EmbeddedS3) -> None:
    url, opts = s3.url("review-wipe"), s3.storage_options
    saver, admin = CkptfsSaver(url, opts), CkptfsSaver(url, opts)
    try:
        graph = _graph(saver, admin, "t")
        cfg: Any = {"configurable": {"thread_id": "t"}}
        out = graph.invoke({"count": 0, "doc": "unchanged " * 20}, cfg, durability="sync")
        assert out["count"] == 3
        mine = saver.get_tuple(cfg)
        assert mine is not None and mine.checkpoint["channel_values"]["count"] == 3
    finally:
        saver.close()
        admin.close()
    # before the fix: {"error": "CorruptFileError: ... which is gone"} here, and for good
    other = _read_in_new_process(url, opts, "t")
    assert other.get("error") is None, other
    assert other["values"] == {"count": 3, "doc": "unchanged " * 20}
    assert other["listed"] == 2  # the checkpoints written after the delete, parents gone


def test_a_long_thread_written_again_after_another_saver_deleted_it_is_listed(s3: EmbeddedS3) -> None:
    url, opts = s3.url("review-long"), s3.storage_options
    long_id = "agent-session-" + "L" * 300  # its key segment is a hash; its id a name object
    cfg: Any = {"configurable": {"thread_id": long_id}}
    saver, admin = CkptfsSaver(url, opts), CkptfsSaver(url, opts)
    builder = StateGraph(State)
    builder.add_node("count", lambda s: {"count": s["count"] + 1})
    builder.add_edge(START, "count")
    graph = builder.compile(checkpointer=saver)
    try:
        graph.invoke({"count": 0, "doc": ""}, cfg, durability="sync")
        admin.delete_thread(long_id)  # the user asked to forget the session
        assert saver.get_tuple(cfg) is None
        graph.invoke({"count": 10, "doc": "new"}, cfg, durability="sync")  # and started it again
    finally:
        saver.close()
        admin.close()
    fresh = CkptfsSaver(url, opts, exclusive=False)
    got = fresh.get_tuple(cfg)
    assert got is not None and got.checkpoint["channel_values"]["count"] == 11
    # before the fix: [] (skipped: "its id is not in langgraph/names/...")
    assert {t.config["configurable"]["thread_id"] for t in fresh.list(None)} == {long_id}


def _checkpoint(i: int, values: dict[str, Any]) -> Any:
    ck = empty_checkpoint()
    ck["channel_values"] = dict(values)
    ck["channel_versions"] = {"doc": 1, "log": i}
    return ck


def test_a_delete_racing_a_put_in_flight_leaves_no_checkpoint_on_deleted_objects(s3: EmbeddedS3) -> None:
    """The proxy holds the third checkpoint's PUT while another saver of the process deletes
    the thread. Before the fix the delete listed and removed the first two meanwhile, then the
    held PUT landed: an acknowledged checkpoint whose unchanged channel `doc` lives in the
    deleted first one, unreadable to any other process."""
    url = s3.url("review-race")
    target: list[str] = []
    arrived = threading.Event()

    def rule(req: Request) -> Fault | None:
        path = unquote(req.path).split("?", 1)[0]
        if req.method == "PUT" and target and path.endswith(f"/ckpt/{target[0]}"):
            arrived.set()
            return Fault(delay=1.5)
        return None

    with FaultProxy(s3.endpoint, rule) as proxy:
        popts = dict(s3.storage_options)
        popts["client_kwargs"] = dict(popts["client_kwargs"], endpoint_url=proxy.endpoint)
        writer, admin = CkptfsSaver(url, popts), CkptfsSaver(url, s3.storage_options)
        try:
            cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            doc = "a document every checkpoint keeps " * 10
            cfg = writer.put(cfg, _checkpoint(1, {"doc": doc, "log": ["one"]}), {"step": 1},
                             {"doc": 1, "log": 1})
            cfg = writer.put(cfg, _checkpoint(2, {"doc": doc, "log": ["one", "two"]}), {"step": 2},
                             {"log": 2})
            third = _checkpoint(3, {"doc": doc, "log": ["one", "two", "three"]})
            target.append(third["id"])
            outcome: list[Any] = []

            def put_third() -> None:
                try:
                    outcome.append(writer.put(cfg, third, {"step": 3}, {"log": 3}))
                except Exception as exc:  # the assertion below names it
                    outcome.append(exc)

            putter = threading.Thread(target=put_third)
            putter.start()
            assert arrived.wait(20), "the third checkpoint's PUT never reached the proxy"
            admin.delete_thread("t")
            putter.join(30)
            assert not putter.is_alive()
            assert isinstance(outcome[0], dict), outcome  # acknowledged
        finally:
            writer.close()
            admin.close()
        assert proxy.counts["delayed"] >= 1
    fresh = CkptfsSaver(url, s3.storage_options, exclusive=False)
    listing = [k for k in fresh.storage.list("langgraph/threads/") if "/ckpt/" in k]
    # before the fix: the third checkpoint alone, and reading it raised CorruptFileError
    assert listing == []
    assert fresh.get_tuple({"configurable": {"thread_id": "t"}}) is None
    assert list(fresh.list({"configurable": {"thread_id": "t"}})) == []
