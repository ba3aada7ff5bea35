"""Cost of one LangGraph `put` and bytes stored: CkptfsSaver (local disk, fsync on) beside SqliteSaver.

A thread starts with N messages (~1 KB of word-like text each) and gains one message per step
for 200 steps; every step puts a checkpoint whose `messages` channel changed (its serialized
value is the whole list) plus a small counter channel, as a chat agent does. Both savers get
the same checkpoints, interleaved step by step so machine noise hits both alike.

    .venv/bin/python benchmarks/langgraph_put.py [--steps 200] [--sizes 10,100,1000]

Targets (issue 6): bytes after 200 steps <= 0.1x SqliteSaver's; median put <= SqliteSaver's.
The "file/put" column is CkptfsSaver(log=False), an object per put as on S3, for reference.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

from ckptfs.integrations.langgraph import CkptfsSaver


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
    start: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    configs: dict[str, Any] = dict.fromkeys(savers, start)
    times: dict[str, list[float]] = {k: [] for k in savers}
    for step in range(steps + 1):  # step 0 writes the starting state, not timed
        if step:
            msgs.append(conv.message(n_start + step))
        version = step + 1
        checkpoint: Any = {
            "v": 4, "id": str(uuid6(clock_seq=step)), "ts": datetime.now(UTC).isoformat(),
            "channel_values": {"messages": list(msgs), "turns": step},
            "channel_versions": {"messages": version, "turns": version, "__start__": 1},
            "versions_seen": {"agent": {"messages": version - 1}, "__input__": {}},
            "updated_channels": ["messages", "turns"],
        }
        metadata: Any = {"source": "loop", "step": step, "parents": {}}
        new_versions = {"messages": version, "turns": version}
        order = list(savers) if step % 2 else list(reversed(savers))
        for name in order:
            t0 = time.perf_counter()
            configs[name] = savers[name].put(configs[name], checkpoint, metadata, new_versions)
            if step:
                times[name].append(time.perf_counter() - t0)
    # read back the newest state from ckptfs in a fresh saver: the numbers must be of a working store
    fresh = CkptfsSaver(ck_dir).get_tuple({"configurable": {"thread_id": "bench"}})
    assert fresh is not None and fresh.checkpoint["channel_values"]["messages"] == msgs
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[conn.execute("PRAGMA synchronous").fetchone()[0]]
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    return {
        "n": n_start,
        "put_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "bytes": {"sqlite": dir_bytes(sq_dir), "ckptfs": dir_bytes(ck_dir)},
        "sqlite_mode": f"journal_mode={mode}, synchronous={sync}",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sizes", default="10,100,1000")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="ckptfs-lg-bench-") as root:
        rows = [run(n, args.steps, root) for n in sizes]
    print(f"LangGraph put, one ~1 KB message added per step, {args.steps} steps, interleaved "
          f"(ckptfs: local disk, fdatasync per put; SQLite: {rows[0]['sqlite_mode']})")
    head = (f"{'start msgs':>10} | {'put ms sqlite':>13} {'put ms ckptfs':>13} {'ratio':>6} "
            f"{'file/put ms':>11} | {'MB sqlite':>10} {'MB ckptfs':>10} {'ratio':>7}")
    print(head)
    print("-" * len(head))
    ok = True
    for r in rows:
        pt, b = r["put_ms"], r["bytes"]
        pr, br = pt["ckptfs"] / pt["sqlite"], b["ckptfs"] / b["sqlite"]
        ok = ok and pr <= 1.0 and br <= 0.1
        print(f"{r['n']:>10} | {pt['sqlite']:>13.3f} {pt['ckptfs']:>13.3f} {pr:>6.2f} {pt['files']:>11.3f} | "
              f"{b['sqlite'] / 1e6:>10.2f} {b['ckptfs'] / 1e6:>10.3f} {br:>7.4f}")
    print(f"targets (put ratio <= 1.00, bytes ratio <= 0.10): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
