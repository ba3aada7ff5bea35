"""Commit latency, bytes written and load reads of CheckpointStore, beside the floor and the naive design.

Everything is measured in one run on one machine so the ratios mean something:
  floor  = write + fsync + rename + fsync(dir) of the same bytes with plain os calls;
  naive  = the seed article's design: the whole run as JSON rewritten into SQLite after every
           step, with a new connection per operation.
Each commit completes one step whose result is ~1 KB of text with one or two tool calls.

    python benchmarks/commit_latency.py [--sizes 100,1000,10000] [--no-s3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.format.changes import Changes
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage

WORDS = [
    "agent", "checkpoint", "paper", "finding", "citation", "model", "result", "method", "dataset",
    "evaluation", "baseline", "ablation", "transformer", "retrieval", "latency", "throughput",
    "graph", "entity",
]


def text(rng: random.Random, n: int) -> str:
    out: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


class CountingStorage(Storage):
    """Delegates to a real Storage and counts what crosses the boundary (`calls`: every call,
    one request each on S3 unless retried)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner.url, inner.options)
        self.inner = inner
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.bytes_written = 0
        self.puts = 0
        self.gets = 0
        self.lists = 0
        self.calls = 0

    def _w(self, data: bytes) -> None:
        self.bytes_written += len(data)
        self.puts += 1
        self.calls += 1

    def put(self, key: str, data: bytes) -> str:
        self._w(data)
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self._w(data)
        return self.inner.put_if_absent(key, data)

    def put_if_absent_beside(self, key: str, data: bytes, witness: str) -> bool:
        self._w(data)
        self.calls += 1  # the witness's stat (a HEAD, on S3)
        return self.inner.put_if_absent_beside(key, data, witness)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        self._w(data)
        return self.inner.put_if_match(key, data, etag)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        self.gets += 1
        self.calls += 1
        return self.inner.get_with_etag(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        self.lists += 1
        self.calls += 1
        return self.inner.list(prefix, start_after)

    def list_dirs(self, prefix: str) -> list[str]:
        self.lists += 1
        self.calls += 1
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.calls += 1
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.calls += 1
        self.inner.delete_many(keys)

    def size(self, key: str) -> int:
        self.calls += 1
        return self.inner.size(key)

    def modified(self, key: str) -> float:
        self.calls += 1
        return self.inner.modified(key)

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        self.calls += 1
        self.inner.put_stream(key, src, exclusive)

    def open_read(self, key: str) -> IO[bytes]:
        self.gets += 1
        self.calls += 1
        return self.inner.open_read(key)


def make_run(n: int, run_id: str) -> AgentRun:
    run = AgentRun(run_id=run_id, goal=f"benchmark run of {n} steps")
    for i in range(n):
        run.add_step(Step(id=f"s{i:05d}", title=f"paper {i}", description="extract findings"))
    return run


def finish_step(step: Step, rng: random.Random) -> None:
    step.status = StepStatus.COMPLETED
    step.result = text(rng, 1000)
    step.attempt_count = 1
    step.tool_calls = [ToolCall(tool_name="extract", arguments={"paper": step.id},
                                result=text(rng, 120), duration_ms=12.5)
                       for _ in range(rng.choice((1, 2)))]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def floor_commit_one(root: Path, dfd: int, i: int, data: bytes) -> float:
    t0 = time.perf_counter()
    tmp = root / f".tmp{i}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, root / f"{i:012d}")
    os.fsync(dfd)
    return time.perf_counter() - t0


def floor_linkat_one(dfd: int, i: int, data: bytes) -> float:
    """The same durable create through a better primitive, for context: an O_TMPFILE inode,
    written and fsynced unseen, linked in (linkat refuses a taken name), fsync(dir). It is what
    LocalStorage does for an exclusive create; it saves the rename's directory update."""
    t0 = time.perf_counter()
    fd = os.open(".", os.O_WRONLY | os.O_TMPFILE, 0o644, dir_fd=dfd)
    os.write(fd, data)
    os.fsync(fd)
    os.link(f"/proc/self/fd/{fd}", f"L{i:012d}", dst_dir_fd=dfd, follow_symlinks=True)
    os.close(fd)
    os.fsync(dfd)
    return time.perf_counter() - t0


def bench_store(url: str, opts: dict[str, Any], n: int, seed: int = 7,
                floor_root: str | None = None) -> dict[str, Any]:
    rng = random.Random(seed)
    counting = CountingStorage(open_storage(url, opts))
    store = CheckpointStore(url, storage=counting)
    run = make_run(n, f"bench-{n}")
    store.save_run(run)
    lat: list[float] = []
    floor: list[float] = []
    floor_dir = Path(floor_root) / f"floor-{n}" if floor_root else None
    if floor_dir:
        floor_dir.mkdir(parents=True, exist_ok=True)
    dfd = os.open(floor_dir, os.O_RDONLY | os.O_DIRECTORY) if floor_dir else -1
    before = counting.bytes_written
    for i, step in enumerate(run.steps.values()):
        finish_step(step, rng)
        t0 = time.perf_counter()
        store.commit(run, [step])
        lat.append(time.perf_counter() - t0)
        if floor_dir:  # the floor, interleaved: same moment, same size as the record just written
            size = max(64, counting.bytes_written - before)
            floor.append(floor_commit_one(floor_dir, dfd, i, os.urandom(size)))
        before = counting.bytes_written
    if dfd >= 0:
        os.close(dfd)
    store.flush()
    written = counting.bytes_written
    state = Changes(run=run.model_dump_json(exclude={"steps"}).encode(),
                    steps={s.id: s.model_dump_json().encode() for s in run.steps.values()})
    state_bytes = len(state.to_json())
    store.close()
    reader = CountingStorage(open_storage(url, opts))
    t0 = time.perf_counter()
    loaded = CheckpointStore(url, storage=reader).load_run(run.run_id)
    load_s = time.perf_counter() - t0
    assert loaded is not None and loaded.completed_count == n
    return {"n": n, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "written": written,
            "floor_p50": pct(floor, 0.5) if floor else None,
            "floor_p99": pct(floor, 0.99) if floor else None,
            "state": state_bytes, "load_gets": reader.gets, "load_lists": reader.lists,
            "load_s": load_s, "lat": lat}


def floor_commit(root: Path, sizes: list[int]) -> list[float]:
    """write + fsync + rename + fsync(dir): the least a durable atomic file commit costs."""
    root.mkdir(parents=True, exist_ok=True)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return [floor_commit_one(root, dfd, i, os.urandom(size)) for i, size in enumerate(sizes)]
    finally:
        os.close(dfd)


def naive_sqlite(path: Path, n: int, measure_last: int, seed: int = 7) -> list[float]:
    """The seed's CheckpointStore.save_run: whole run JSON, new connection, every step."""
    rng = random.Random(seed)
    run = make_run(n, "naive")

    def save() -> None:
        conn = sqlite3.connect(path)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, goal TEXT, "
                         "status TEXT, state_json TEXT, created_at REAL, updated_at REAL)")
            conn.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                         (run.run_id, run.goal, run.status, run.model_dump_json(),
                          run.created_at, time.time()))
            conn.commit()
        finally:
            conn.close()

    steps = list(run.steps.values())
    for step in steps[: n - measure_last]:
        finish_step(step, rng)
    save()
    lat = []
    for step in steps[n - measure_last:]:
        finish_step(step, rng)
        t0 = time.perf_counter()
        save()
        lat.append(time.perf_counter() - t0)
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--s3-sizes", default="100,1000,10000")
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    console = Console(width=180)
    console.print(f"[bold]ckptfs commit benchmark[/bold] {time.strftime('%Y-%m-%d')} · "
                  f"{platform.machine()} · {os.cpu_count()} cores · Python {platform.python_version()}")
    results: dict[str, list[dict[str, Any]]] = {"local": [], "memory": [], "s3": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        base = Path(tmp)
        for n in sizes:
            results["local"].append(bench_store(str(base / f"local-{n}"), {}, n,
                                                floor_root=str(base / "floors")))
            results["memory"].append(bench_store(f"memory://bench-{n}-{os.getpid()}", {}, n))
        if not args.no_s3:
            with EmbeddedS3(bucket="bench") as s3:
                for n in [int(x) for x in args.s3_sizes.split(",")]:
                    results["s3"].append(bench_store(s3.url(f"p{n}"), s3.storage_options, n))
        # the floor: same number of commits, same sizes as ckptfs's journal records
        biggest = results["local"][-1]
        rec_size = max(256, biggest["written"] // max(1, biggest["n"]) // 2)
        floor = floor_commit(base / "floor", [rec_size] * 2000)
        naive = naive_sqlite(base / "naive.db", 2000, measure_last=40)
        ours_2000 = bench_store(str(base / "local-2000"), {}, 2000)

    floor_p50 = statistics.median(floor)
    t = Table(title="per-commit latency (ms) and cost of a whole run")
    for col in ("backend", "steps", "p50", "p99", "floor p50", "floor p99", "p50/floor",
                "p99/floor p50", "written MB", "state MB", "written/state", "load GETs", "load LISTs",
                "load s"):
        t.add_column(col, justify="right")
    for backend, rows in results.items():
        for r in rows:
            fp50 = r["floor_p50"] or floor_p50
            fp99 = r["floor_p99"]
            t.add_row(backend, f"{r['n']:,}", f"{r['p50'] * 1e3:.3f}", f"{r['p99'] * 1e3:.3f}",
                      f"{fp50 * 1e3:.3f}" if r["floor_p50"] else "",
                      f"{fp99 * 1e3:.3f}" if fp99 else "",
                      f"{r['p50'] / fp50:.2f}x", f"{r['p99'] / fp50:.2f}x",
                      f"{r['written'] / 1e6:.2f}", f"{r['state'] / 1e6:.2f}",
                      f"{r['written'] / r['state']:.2f}x", str(r["load_gets"]), str(r["load_lists"]),
                      f"{r['load_s']:.2f}")
    t.add_row("floor (os)", "2,000", f"{floor_p50 * 1e3:.3f}", f"{pct(floor, 0.99) * 1e3:.3f}",
              "", "", "1.00x", "", "", "", "", "", "", "")
    t.add_row("naive sqlite", "2,000", f"{statistics.median(naive) * 1e3:.3f}",
              f"{pct(naive, 0.99) * 1e3:.3f}", "", "", f"{statistics.median(naive) / floor_p50:.2f}x",
              "", "", "", "", "", "", "")
    console.print(t)

    local = {r["n"]: r for r in results["local"]}
    small, large = local[min(local)], local[max(local)]
    # Each local run carries its own floor, measured interleaved commit by commit, so a ratio
    # compares two things that saw the same machine at the same moment.
    norm_small = small["p50"] / small["floor_p50"]
    norm_large = large["p50"] / large["floor_p50"]
    checks: list[tuple[str, float, float, Callable[[float, float], bool]]] = [
        (f"local p50 / interleaved floor p50 at {large['n']:,}", norm_large, 2.0, lambda v, t: v <= t),
        (f"p50 at {large['n']:,} / p50 at {small['n']:,} (local, raw)", large["p50"] / small["p50"], 1.25,
         lambda v, t: v <= t),
        ("same, each over its interleaved floor", norm_large / norm_small, 1.25, lambda v, t: v <= t),
        ("naive / ckptfs per step at 2,000 steps", statistics.median(naive) / ours_2000["p50"], 10.0,
         lambda v, t: v >= t),
        (f"bytes written / final state at {large['n']:,}", large["written"] / large["state"], 8.0,
         lambda v, t: v <= t),
        (f"objects read by a load at {large['n']:,}", float(large["load_gets"]), 50.0,
         lambda v, t: v <= t),
        (f"local p99 / interleaved floor p50 at {large['n']:,}", large["p99"] / large["floor_p50"], 5.0,
         lambda v, t: v <= t),
        (f"(context) floor p99 / floor p50 at {large['n']:,}", large["floor_p99"] / large["floor_p50"],
         5.0, lambda v, t: v <= t),
        (f"(context) local p99 / interleaved floor p99 at {large['n']:,}",
         large["p99"] / large["floor_p99"], 2.0, lambda v, t: v <= t),
    ]
    c = Table(title="targets (ratios measured side by side in this run)")
    for col in ("target", "measured", "limit", "ok"):
        c.add_column(col)
    for name, v, limit, ok in checks:
        c.add_row(name, f"{v:.2f}", f"{limit:g}", "[green]yes[/green]" if ok(v, limit) else "[red]NO[/red]")
    console.print(c)
    if args.json:
        slim = {k: [{kk: vv for kk, vv in r.items() if kk != "lat"} for r in v] for k, v in results.items()}
        Path(args.json).write_text(json.dumps({"results": slim, "floor_p50": floor_p50,
                                               "naive_p50": statistics.median(naive),
                                               "checks": [(n, v, lim) for n, v, lim, _ in checks]},
                                              indent=2))


if __name__ == "__main__":
    main()
