"""LangGraph checkpointer costs, CkptfsSaver beside SqliteSaver in one run: put, get_tuple, S3 requests.

* put: a thread starts with N messages (~1 KB of word-like text each) and gains one message per
  step for 200 steps; every step puts a checkpoint whose `messages` channel changed (its
  serialized value is the whole list) plus a small counter channel, as a chat agent does. Both
  savers get the same checkpoints, interleaved step by step so machine noise hits both alike.
  CkptfsSaver on local disk with fsync on (the default); SQLite in WAL mode, synchronous=FULL.
* get_tuple: the newest checkpoint of a thread holding N messages (five checkpoints, the window
  sliding by one message each), read again and again by the savers that wrote it, interleaved.
* S3: get_tuple of the newest checkpoint (10 messages) on the embedded moto server, counted at a
  loopback proxy: requests, and round trips (requests held 0.2 s there, so each wave of
  requests sent together is one round trip); latency measured without the proxy.

    .venv/bin/python benchmarks/langgraph_put.py [--steps 200] [--sizes 10,100,1000] [--no-s3]
    .venv/bin/python benchmarks/langgraph_put.py --json out.json   # rows for benchmarks/scale.py

Targets (issue 12): put <= 0.8x SqliteSaver's at every size; get_tuple <= 1.0x at 10 messages;
get_tuple on S3 in <= 2 round trips. Kept from issue 6: bytes after 200 steps <= 0.1x SQLite's.
The "file/put" column is CkptfsSaver(log=False), an object per put as on S3, for reference.
The "floor" column is what any saver that serializes with LangGraph's serializer and is durable
at each put must spend, timed in the same interleaved loop: `serde.dumps_typed` of the checkpoint,
then an append of only the bytes that are new since the last put (known for free here; a real
saver must find them) and one fdatasync. "floor/sqlite" above the put target means the target
cannot be met on this machine by any such saver, however little else it does.
Exit status 1 when a target is not met (0 with --json: the rows say it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.s3.embedded import EmbeddedS3
from ckptfs.integrations.langgraph import CkptfsSaver
from tests._fault_proxy import Fault, FaultProxy, Request

PUT_TARGET = 0.8
GET_TARGET = 1.0
GET_TARGET_AT = 10
BYTES_TARGET = 0.1
S3_ROUND_TRIPS = 2
S3_DELAY = 0.2


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class Conversation:
    """Deterministic word-like messages: compressible like text, not like a repeated string."""

    def __init__(self, seed: int = 7) -> None:
        self.rnd = random.Random(seed)
        self.words = ["".join(self.rnd.choice("abcdefghijklmnopqrstuvwxyz")
                              for _ in range(self.rnd.randint(2, 9))) for _ in range(5000)]

    def message(self, i: int) -> BaseMessage:
        text: list[str] = []
        size = 0
        while size < 1000:
            w = self.rnd.choice(self.words)
            text.append(w)
            size += len(w) + 1
        cls = HumanMessage if i % 2 == 0 else AIMessage
        return cls(content=" ".join(text), id=str(uuid.UUID(int=self.rnd.getrandbits(128))))


class Floor:
    """The least a durable put costs: serialize as LangGraph does, append the new bytes, fdatasync.

    It stands in the interleaved loop like a saver (the same `put` signature) so that machine
    noise and the disk's state hit it as they hit the others; it keeps nothing readable.
    """

    def __init__(self, path: str) -> None:
        self.serde = JsonPlusSerializer()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.prev = 0

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        _, raw = self.serde.dumps_typed(checkpoint)
        new = raw[min(self.prev, len(raw) - 1):]  # at least one byte: a put always writes
        self.prev = len(raw)
        os.write(self.fd, new)
        os.fdatasync(self.fd)
        return config

    def close(self) -> None:
        os.close(self.fd)


def run(n_start: int, steps: int, root: str) -> dict[str, Any]:
    conv = Conversation()
    msgs = [conv.message(i) for i in range(n_start)]
    sq_dir = os.path.join(root, f"sqlite-{n_start}")
    ck_dir = os.path.join(root, f"ckptfs-{n_start}")
    os.makedirs(sq_dir)
    conn = sqlite3.connect(os.path.join(sq_dir, "checkpoints.sqlite"), check_same_thread=False)
    savers: dict[str, BaseCheckpointSaver[Any]] = {
        "sqlite": SqliteSaver(conn),
        "ckptfs": CkptfsSaver(ck_dir),  # default on local disk: append to the namespace's log + fdatasync
        # for reference, not a target: an object per put (temp + fsync + rename + fsync of the dir)
        "files": CkptfsSaver(os.path.join(root, f"files-{n_start}"), log=False),
    }
    floor = Floor(os.path.join(root, f"floor-{n_start}.bin"))
    savers["floor"] = floor  # type: ignore[assignment]
    start: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    configs: dict[str, Any] = dict.fromkeys(savers, start)
    times: dict[str, list[float]] = {k: [] for k in savers}
    for step in range(steps + 1):  # step 0 writes the starting state, not timed
        if step:
            msgs.append(conv.message(n_start + step))
        checkpoint, metadata, new_versions = checkpoint_of(step, msgs)
        order = list(savers) if step % 2 else list(reversed(savers))
        for name in order:
            t0 = time.perf_counter()
            configs[name] = savers[name].put(configs[name], checkpoint, metadata, new_versions)
            if step:
                times[name].append(time.perf_counter() - t0)
    # read back the newest state from ckptfs in a fresh saver: the numbers must be of a working store
    with CkptfsSaver(ck_dir) as reader:
        fresh = reader.get_tuple({"configurable": {"thread_id": "bench"}})
    assert fresh is not None and fresh.checkpoint["channel_values"]["messages"] == msgs
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[conn.execute("PRAGMA synchronous").fetchone()[0]]
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    floor.close()
    for saver in savers.values():
        if isinstance(saver, CkptfsSaver):
            saver.close()  # gives the threads back before the directory goes
    return {
        "n": n_start,
        "put_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "bytes": {"sqlite": dir_bytes(sq_dir), "ckptfs": dir_bytes(ck_dir)},
        "sqlite_mode": f"journal_mode={mode}, synchronous={sync}",
    }


def checkpoint_of(step: int, msgs: list[BaseMessage]) -> tuple[Any, Any, Any]:
    """(checkpoint, metadata, new_versions) of one step whose `messages` and `turns` changed."""
    version = step + 1
    checkpoint: Any = {
        "v": 4, "id": str(uuid6(clock_seq=step)), "ts": datetime.now(UTC).isoformat(),
        "channel_values": {"messages": list(msgs), "turns": step},
        "channel_versions": {"messages": version, "turns": version, "__start__": 1},
        "versions_seen": {"agent": {"messages": version - 1}, "__input__": {}},
        "updated_channels": ["messages", "turns"],
    }
    metadata: Any = {"source": "loop", "step": step, "parents": {}}
    return checkpoint, metadata, {"messages": version, "turns": version}


def fill_window(savers: dict[str, BaseCheckpointSaver[Any]], n: int, thread: str, steps: int = 5) -> None:
    """`steps` checkpoints of a thread holding `n` messages, the window sliding by one each step."""
    conv = Conversation(seed=11)
    msgs = [conv.message(i) for i in range(n)]
    start: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    configs: dict[str, Any] = dict.fromkeys(savers, start)
    for step in range(steps):
        if step:
            msgs = [*msgs[1:], conv.message(n + step)]
        ck, md, nv = checkpoint_of(step, msgs)
        for name, saver in savers.items():
            configs[name] = saver.put(configs[name], ck, md, nv)


def run_get(n: int, rounds: int, root: str) -> dict[str, Any]:
    """get_tuple of the newest checkpoint, both savers reading what they wrote, interleaved."""
    conn = sqlite3.connect(os.path.join(root, f"get-{n}.sqlite"), check_same_thread=False)
    savers: dict[str, BaseCheckpointSaver[Any]] = {
        "sqlite": SqliteSaver(conn), "ckptfs": CkptfsSaver(os.path.join(root, f"get-ckptfs-{n}"))}
    fill_window(savers, n, "read")
    latest: Any = {"configurable": {"thread_id": "read"}}
    want = savers["sqlite"].get_tuple(latest)
    got = savers["ckptfs"].get_tuple(latest)
    assert want is not None and got is not None
    assert got.checkpoint["channel_values"] == want.checkpoint["channel_values"]
    times: dict[str, list[float]] = {k: [] for k in savers}
    for i in range(rounds):
        for name in (list(savers) if i % 2 else list(reversed(savers))):
            t0 = time.perf_counter()
            savers[name].get_tuple(latest)
            times[name].append(time.perf_counter() - t0)
    conn.close()
    savers["ckptfs"].close()  # type: ignore[attr-defined]
    return {"n": n, "get_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}}


class Recorder:
    """Proxy rule: arrival time of each request but the lease keeper's, each held `delay` s."""

    def __init__(self) -> None:
        self.seen: list[float] = []
        self.lock = threading.Lock()
        self.delay = 0.0

    def __call__(self, req: Request) -> Fault | None:
        if "/leases/" not in unquote(req.path):
            with self.lock:
                self.seen.append(time.monotonic())
        return Fault(delay=self.delay) if self.delay else None

    def count(self, fn: Any) -> tuple[int, int]:
        """(requests, round trips) of one call."""
        with self.lock:
            self.seen.clear()
        self.delay = S3_DELAY
        try:
            fn()
        finally:
            self.delay = 0.0
        times = sorted(self.seen)
        trips = sum(1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] > S3_DELAY / 2)
        return len(times), trips


def run_s3(n: int, rounds: int) -> dict[str, Any]:
    """get_tuple (newest) on moto over HTTP: by the saver that wrote the thread ("warm") and by
    a new saver ("cold": a new process), requests and round trips counted, latency p50."""
    latest: Any = {"configurable": {"thread_id": "s3"}}
    out: dict[str, Any] = {"n": n}
    rec = Recorder()
    with EmbeddedS3(bucket="ckptfs-lg-bench") as s3, FaultProxy(s3.endpoint, rec) as proxy:
        url, direct = s3.url("lg"), s3.storage_options
        counted = dict(direct, client_kwargs=dict(direct["client_kwargs"], endpoint_url=proxy.endpoint))
        with CkptfsSaver(url, counted) as writer:
            fill_window({"w": writer}, n, "s3")
            out["warm"] = rec.count(lambda: writer.get_tuple(latest))
        with CkptfsSaver(url, counted) as reader:
            out["cold"] = rec.count(lambda: reader.get_tuple(latest))
            out["again"] = rec.count(lambda: reader.get_tuple(latest))
        with CkptfsSaver(url, direct) as warm:
            fill_window({"w": warm}, n, "s3")
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                warm.get_tuple(latest)
                times.append(time.perf_counter() - t0)
            out["warm_ms"] = statistics.median(times) * 1e3
        times = []
        for _ in range(max(3, rounds // 4)):
            with CkptfsSaver(url, direct) as cold:
                t0 = time.perf_counter()
                cold.get_tuple(latest)
                times.append(time.perf_counter() - t0)
        out["cold_ms"] = statistics.median(times) * 1e3
    return out


Row = tuple[str, str, str, bool]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--get-rounds", type=int, default=400)
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 measure (starts a moto server)")
    ap.add_argument("--json", default=None, help="also write the target rows here (benchmarks/scale.py)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    table: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ckptfs-lg-bench-") as root:
        puts = [run(n, args.steps, root) for n in sizes]
        gets = [run_get(n, args.get_rounds, root) for n in sizes]
    print(f"LangGraph put, one ~1 KB message added per step, {args.steps} steps, interleaved "
          f"(ckptfs: local disk, fdatasync per put; SQLite: {puts[0]['sqlite_mode']})")
    head = (f"{'start msgs':>10} | {'put ms sqlite':>13} {'put ms ckptfs':>13} {'ratio':>6} {'target':>7} "
            f"{'file/put ms':>11} {'floor ms':>8} {'floor/sqlite':>12} | {'MB sqlite':>10} {'MB ckptfs':>10} "
            f"{'ratio':>7}")
    print(head)
    print("-" * len(head))
    for r in puts:
        pt, b = r["put_ms"], r["bytes"]
        pr, br = pt["ckptfs"] / pt["sqlite"], b["ckptfs"] / b["sqlite"]
        table.append((f"LangGraph put local / SqliteSaver, {r['n']:,} msgs", f"{pr:.2f}x",
                      f"<= {PUT_TARGET}x", pr <= PUT_TARGET))
        table.append((f"LangGraph bytes after {args.steps} puts / SqliteSaver, {r['n']:,} msgs", f"{br:.4f}x",
                      f"<= {BYTES_TARGET}x", br <= BYTES_TARGET))
        print(f"{r['n']:>10} | {pt['sqlite']:>13.3f} {pt['ckptfs']:>13.3f} {pr:>6.2f} "
              f"{'<= ' + str(PUT_TARGET):>7} {pt['files']:>11.3f} {pt['floor']:>8.3f} "
              f"{pt['floor'] / pt['sqlite']:>12.2f} | "
              f"{b['sqlite'] / 1e6:>10.2f} {b['ckptfs'] / 1e6:>10.3f} {br:>7.4f}")
    print()
    print(f"LangGraph get_tuple of the newest checkpoint, {args.get_rounds} reads each, interleaved")
    head = f"{'msgs':>10} | {'get ms sqlite':>13} {'get ms ckptfs':>13} {'ratio':>6} {'target':>7}"
    print(head)
    print("-" * len(head))
    for g in gets:
        gt = g["get_ms"]
        ratio = gt["ckptfs"] / gt["sqlite"]
        target = f"<= {GET_TARGET}" if g["n"] == GET_TARGET_AT else ""
        if g["n"] == GET_TARGET_AT:
            table.append((f"LangGraph get_tuple (latest) local / SqliteSaver, {g['n']} msgs", f"{ratio:.2f}x",
                          f"<= {GET_TARGET}x", ratio <= GET_TARGET))
        print(f"{g['n']:>10} | {gt['sqlite']:>13.4f} {gt['ckptfs']:>13.4f} {ratio:>6.2f} {target:>7}")
    if not args.no_s3:
        s3 = run_s3(GET_TARGET_AT, 40)
        print()
        print(f"LangGraph get_tuple (latest) on S3 (moto over HTTP, {s3['n']} msgs): requests / round trips")
        for label, key, ms in (("by the saver that wrote it", "warm", s3["warm_ms"]),
                               ("by a new saver (a new process)", "cold", s3["cold_ms"]),
                               ("by that saver, again", "again", None)):
            reqs, trips = s3[key]
            lat = f", p50 {ms:.1f} ms" if ms is not None else ""
            print(f"  {label:<32} {reqs} requests, {trips} round trips{lat}  (target <= {S3_ROUND_TRIPS})")
            if key != "again":
                table.append((f"LangGraph get_tuple (latest) on S3, {label}", f"{trips} round trips",
                              f"<= {S3_ROUND_TRIPS}", trips <= S3_ROUND_TRIPS))
    print()
    for name, value, target, met in table:
        print(f"  {'met    ' if met else 'NOT met'}  {name}: {value} (target {target})")
    ok = all(met for *_, met in table)
    print(f"targets: {'all met' if ok else 'NOT all met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [list(r) for r in table]}, indent=1))
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
