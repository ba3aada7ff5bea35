"""CkptfsSaver.get_tuple on S3 over real HTTP: how many requests, in how many round trips.

Counted at a loopback proxy in front of the moto server, so what is counted is what crossed
the wire. Each request is held `DELAY` seconds there: requests sent together arrive within
milliseconds of each other, one round trip later the next ones arrive `DELAY` after, so the
arrival times fall into waves, one per round trip. A request counts in a later wave only if
it arrived after an earlier one's answer could have left (see `Recorder.round_trips`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from backends.s3.embedded import EmbeddedS3
from ckptfs.integrations.langgraph import CkptfsSaver
from tests._fault_proxy import Fault, FaultProxy, Request

DELAY = 0.8


class Recorder:
    """Arrival time and kind of every request but the lease keeper's."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []
        self.got: list[str] = []  # last key segment of each GET
        self.lock = threading.Lock()
        self.delay = 0.0

    def __call__(self, req: Request) -> Fault | None:
        path = unquote(req.path)
        if "/leases/" not in path:
            kind = "LIST" if "list-type=2" in path else req.method
            with self.lock:
                self.seen.append((time.monotonic(), kind))
                if kind == "GET":
                    self.got.append(path.split("?", 1)[0].rsplit("/", 1)[1])
        return Fault(delay=self.delay) if self.delay else None

    def measure(self) -> None:
        with self.lock:
            self.seen.clear()
            self.got.clear()
        self.delay = DELAY

    def kinds(self) -> list[str]:
        return sorted(kind for _, kind in self.seen)

    def round_trips(self) -> int:
        """The longest chain of requests each of which could have waited on the one before.

        A request can depend on another only if it arrived after that one's answer could have
        left the proxy (its arrival + `DELAY`). Counting gaps between consecutive arrivals
        instead split one wave in two when a loaded machine sent its last request late.
        """
        times = sorted(t for t, _ in self.seen)
        depth: list[int] = []
        for i, t in enumerate(times):
            depth.append(1 + max((depth[j] for j in range(i) if times[j] + DELAY <= t), default=0))
        return max(depth, default=0)


@pytest.fixture
def proxied(s3: EmbeddedS3) -> Iterator[tuple[str, dict[str, Any], Recorder]]:
    rec = Recorder()
    with FaultProxy(s3.endpoint, rec) as proxy:
        opts = dict(s3.storage_options)
        opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=proxy.endpoint)
        yield s3.url("lg-requests"), opts, rec


CFG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
LATEST: Any = {"configurable": {"thread_id": "t"}}


def _fill(saver: CkptfsSaver, steps: int, writes: bool = False) -> Any:
    cfg = CFG
    for i in range(steps):
        ck = empty_checkpoint()
        ck["channel_values"] = {"messages": [f"message {j} " + "x" * 300 for j in range(i + 1)], "n": i}
        ck["channel_versions"] = {"messages": i + 1, "n": i + 1}
        cfg = saver.put(cfg, ck, {"step": i}, {"messages": i + 1, "n": i + 1})
    if writes:
        saver.put_writes(cfg, [("messages", "pending"), ("n", 99)], "task-1")
    return cfg


def test_latest_by_the_saver_that_wrote_it_is_one_round_trip(
        proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as saver:
        last = _fill(saver, 5)
        rec.measure()
        tup = saver.get_tuple(LATEST)
        assert tup is not None and tup.config == last and tup.checkpoint["channel_values"]["n"] == 4
        # anything newer? + the object + its writes, sent together
        assert rec.kinds() == ["GET", "LIST", "LIST"] and rec.round_trips() == 1


def test_latest_by_a_new_saver_is_two_round_trips(proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as writer:
        last = _fill(writer, 1)
    with CkptfsSaver(url, opts) as reader:
        rec.measure()
        tup = reader.get_tuple(LATEST)
        assert tup is not None and tup.config == last
        # the listing, then the object and its writes' listing together (was three in a row)
        assert rec.kinds() == ["GET", "LIST", "LIST"] and rec.round_trips() == 2
        # once seen, the newest is where the next read looks first: one round trip
        rec.measure()
        assert reader.get_tuple(LATEST) is not None
        assert rec.kinds() == ["GET", "LIST", "LIST"] and rec.round_trips() == 1


def test_pending_writes_are_fetched_together(proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as saver:
        _fill(saver, 3, writes=True)
        saver.put_writes(saver.get_tuple(LATEST).config, [("n", 7)], "task-2")  # type: ignore[union-attr]
        rec.measure()
        tup = saver.get_tuple(LATEST)
        assert tup is not None and sorted(w[0] for w in tup.pending_writes) == ["task-1", "task-1", "task-2"]
        # two write objects, read in one round trip after the listing that names them
        assert rec.kinds() == ["GET", "GET", "GET", "LIST", "LIST"] and rec.round_trips() == 2


def test_a_newer_checkpoint_by_another_saver_is_found(proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as first, CkptfsSaver(url, opts) as second:
        cfg = _fill(first, 2)
        assert first.get_tuple(LATEST) is not None  # first now looks at its own newest first
        ck = empty_checkpoint()
        ck["channel_values"] = {"messages": ["from the other saver"], "n": 42}
        ck["channel_versions"] = {"messages": 9, "n": 9}
        newer = second.put(cfg, ck, {"step": 9}, {"messages": 9, "n": 9})
        rec.measure()
        tup = first.get_tuple(LATEST)
        assert tup is not None and tup.config == newer and tup.checkpoint["channel_values"]["n"] == 42
        assert rec.round_trips() == 2  # the hint's round trip named the newer one: then read it
        # the hint moved to the newer checkpoint; one that is pruned away is not served
        second.delete_thread("t")
        assert first.get_tuple(LATEST) is None


def _ids(saver: CkptfsSaver) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(LATEST)][::-1]


def test_a_delta_chain_is_read_by_a_new_saver_in_two_round_trips(
        proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as writer:
        last = _fill(writer, 20)  # full message lists at steps 0 and 16, deltas on them after
        ids = _ids(writer)
    with CkptfsSaver(url, opts) as reader:
        rec.measure()
        tup = reader.get_tuple(LATEST)
        assert tup is not None and tup.config == last
        assert tup.checkpoint["channel_values"]["messages"] == [
            f"message {j} " + "x" * 300 for j in range(20)]
        # the listing names the read plan; the object, its bases and its writes go out together
        assert rec.round_trips() == 2
        assert rec.kinds() == ["GET"] * 4 + ["LIST", "LIST"]
        assert sorted(rec.got) == sorted(ids[16:20])  # exactly the chain: nothing it does not need


def test_a_thread_continued_by_a_new_process_keeps_its_plan(
        proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as first:
        cfg = _fill(first, 5)
    with CkptfsSaver(url, opts) as second:  # reads the thread, then writes on the chain it found
        tup = second.get_tuple(LATEST)
        assert tup is not None
        for i in range(5, 8):
            ck = empty_checkpoint()
            ck["channel_values"] = {"messages": [f"message {j} " + "x" * 300 for j in range(i + 1)], "n": i}
            ck["channel_versions"] = {"messages": i + 1, "n": i + 1}
            cfg = second.put(cfg, ck, {"step": i}, {"messages": i + 1, "n": i + 1})
        ids = _ids(second)
    with CkptfsSaver(url, opts) as third:
        rec.measure()
        tup = third.get_tuple(LATEST)
        assert tup is not None and tup.config == cfg
        assert len(tup.checkpoint["channel_values"]["messages"]) == 8
        # (a chain of 8: its objects and the writes' listing fit s3fs's 10 connections at once)
        assert rec.round_trips() == 2 and sorted(rec.got) == sorted(ids)


def test_a_layout_without_read_plans_still_reads(
        proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, rec = proxied
    with CkptfsSaver(url, opts) as writer:
        last = _fill(writer, 20)
        plans = [k for k in writer.storage.list("langgraph/threads/") if "/ckpt/~/" in k]
        assert plans  # written beside the checkpoints...
        writer.storage.delete_many(plans)  # ...and absent from what earlier versions wrote
    with CkptfsSaver(url, opts) as reader:
        rec.measure()
        tup = reader.get_tuple(LATEST)
        assert tup is not None and tup.config == last
        assert len(tup.checkpoint["channel_values"]["messages"]) == 20
        assert rec.round_trips() == 3  # the chain is walked, as before plans


def test_read_plans_of_pruned_checkpoints_go(proxied: tuple[str, dict[str, Any], Recorder]) -> None:
    url, opts, _rec = proxied
    with CkptfsSaver(url, opts) as saver:
        _fill(saver, 20)
        saver.prune(["t"], keep_last=2)
        left = saver.storage.list("langgraph/threads/")
        kept = {k.rsplit("/", 1)[1] for k in left if "/ckpt/" in k and "/ckpt/~/" not in k}
        for plan in (k for k in left if "/ckpt/~/" in k):
            assert plan.rsplit("/", 1)[1].split(".")[0] in kept
    with CkptfsSaver(url, opts) as reader:
        tup = reader.get_tuple(LATEST)
        assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == 20
