"""Builders and mutations shared by the integrity, verify, prune and CLI maintenance tests.

One realistic store: several runs written through CheckpointStore with a compaction policy
small enough to leave snapshots, deltas, journal records and artifacts, one run written by
two processes in turn (a reopened store), so verify is tested against what the writer
really leaves, not against files made by hand.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall
from ckptfs.format.keys import parse_artifact_key, parse_run_key

POLICY = CompactionPolicy(fanout=3, max_plan=6, min_snapshot_bytes=3000, keep_last=2, background=False)
THRESHOLD = 1024


def _fill(store: CheckpointStore, run: AgentRun, first: int, count: int, rng: random.Random) -> None:
    prev = f"s{first - 1}" if first else None
    for i in range(first, first + count):
        st = Step(id=f"s{i}", title=f"step {i}", dependencies=[prev] if prev else [])
        run.add_step(st)
        store.save_run(run)
        st.status = StepStatus.COMPLETED
        st.attempt_count = 1
        st.started_at, st.completed_at = 1000.0 + i, 1001.5 + i
        big = i % 4 == 0
        st.result = (f"result {i} " + rng.randbytes(900).hex()) if big else f"r{i}"
        store.commit(run, [st])
        result = {"rows": [rng.random() for _ in range(120)]} if i % 5 == 0 else "ok"
        store.log_tool_call(run.run_id, st.id, ToolCall(tool_name="fetch", arguments={"i": i}, result=result))
        prev = st.id


def build_store(url: str, storage_options: dict[str, object] | None = None, seed: int = 7) -> None:
    """Three runs; run 'beta' is written by two store instances in turn (a restart)."""
    rng = random.Random(seed)
    store = CheckpointStore(url, storage_options, policy=POLICY, artifact_threshold=THRESHOLD)
    runs = {rid: AgentRun(run_id=rid, goal=f"goal of {rid}") for rid in ("alpha", "beta", "gamma")}
    _fill(store, runs["alpha"], 0, 14, rng)
    _fill(store, runs["beta"], 0, 6, rng)
    _fill(store, runs["gamma"], 0, 4, rng)
    store.mark_run_complete("gamma", "completed")
    store.close()
    store = CheckpointStore(url, storage_options, policy=POLICY, artifact_threshold=THRESHOLD)
    beta = store.load_run("beta")
    assert beta is not None
    _fill(store, beta, 6, 7, rng)
    store.close()


def all_files(root: Path) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            out.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
    return sorted(out)


@dataclass
class Mutation:
    kind: str
    expected: set[str]  # verify must name at least one of these keys
    undo: dict[str, bytes | None]  # key -> original bytes (None: did not exist)

    def revert(self, root: Path) -> None:
        for key, data in self.undo.items():
            p = root / key
            if data is None:
                if p.exists():
                    p.unlink()
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)


KINDS = ("flip", "truncate", "delete", "swap", "copy-run", "temp", "delete-artifact")


def detectable_deletions(keys: list[str]) -> list[str]:
    """Journal records whose loss loses something: above the oldest snapshot, not the uncovered
    newest, and with no delta or snapshot ending at their version.

    Deleting the newest journal record when nothing else ends at it leaves a store identical
    to one that never committed that version; deleting a record that a delta or snapshot
    ending at the same version covers leaves every version loadable, exactly as a mirror's
    restore points are (clean by definition: every version still loads, see the README);
    deleting a delta or a snapshot that another snapshot covers leaves a store a writer could
    have produced. None of these is damage verify can prove, so they are not mutations here.
    """
    by_run: dict[str, list[tuple[int, str, str]]] = {}
    for k in keys:
        rf = parse_run_key(k)
        if rf is not None:
            by_run.setdefault(k.split("/")[1], []).append((rf.version, rf.kind, k))
    out = []
    for files in by_run.values():
        snaps = [v for v, kind, _ in files if kind == "snap"]
        floor = min(snaps) if snaps else 0
        for v, kind, k in files:
            if kind != "log" or v <= floor:
                continue
            if any(v2 == v and kind2 != "log" for v2, kind2, _ in files):
                continue  # a delta or snapshot ending at v holds the same state
            if any(v2 >= v and k2 != k for v2, _, k2 in files):
                out.append(k)
    return out


def _loadable(root: Path, run_id: str) -> dict[int, str]:
    """Every stored version of a run that loads exactly, with its state: the ground truth of
    what a deletion lost (a fresh store each time, so nothing cached hides a loss)."""
    store = CheckpointStore(str(root), policy=POLICY)
    out = {}
    for v in store.list_versions(run_id):
        try:
            run = store.load_run(run_id, version=v)
        except Exception:
            continue
        if run is not None and store.last_load is not None and not store.last_load.skipped:
            out[v] = run.model_dump_json()
    store.close()
    return out


def _fingerprint(root: Path) -> str:
    """A digest of every directory, file name and byte under `root`: equal only for the same store."""
    h = hashlib.blake2b()
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        h.update(b"D" + os.path.relpath(dirpath, root).encode() + b"\0")
        for n in sorted(names):
            h.update(b"F" + n.encode() + b"\0" + hashlib.blake2b(Path(dirpath, n).read_bytes()).digest())
    return h.hexdigest()


_LOADS: dict[tuple[str, str, str], dict[int, str]] = {}


def _loadable_now(root: Path, run_id: str) -> dict[int, str]:
    """`_loadable` of the store as it is now, remembered by its exact content (`_fingerprint`):
    each deletion tried is undone, and so is each mutation, so the same bytes come back again
    and again (the untouched store before every deletion, the same deletion tried by a later
    mutation), and the same bytes load the same. A store in any other state is loaded afresh.
    States are kept as digests of the loaded JSON, compared as the JSON itself would be."""
    key = (str(root), run_id, _fingerprint(root))
    if key not in _LOADS:
        if len(_LOADS) >= 1024:
            del _LOADS[next(iter(_LOADS))]
        _LOADS[key] = {v: hashlib.sha256(state.encode()).hexdigest()
                       for v, state in _loadable(root, run_id).items()}
    return dict(_LOADS[key])


def mutate(root: Path, rng: random.Random, kind: str, referenced: list[str]) -> Mutation:
    """Apply one mutation of `kind` to the store at `root`; return how to check and undo it."""
    keys = all_files(root)
    run_keys = [k for k in keys if parse_run_key(k) is not None]
    art_keys = [k for k in keys if parse_artifact_key(k) is not None]
    if kind in ("flip", "truncate"):
        key = rng.choice(run_keys + art_keys)
        data = (root / key).read_bytes()
        if kind == "flip":
            i = rng.randrange(len(data))
            new = data[:i] + bytes([data[i] ^ rng.randrange(1, 256)]) + data[i + 1 :]
        else:
            new = data[: rng.randrange(len(data))]
        (root / key).write_bytes(new)
        return Mutation(kind, {key}, {key: data})
    if kind == "delete":
        cands = detectable_deletions(keys)
        rng.shuffle(cands)
        for key in cands:
            data = (root / key).read_bytes()
            before = _loadable_now(root, key.split("/")[1])
            (root / key).unlink()
            if _loadable_now(root, key.split("/")[1]) != {v: s for v, s in before.items()
                                                          if f"/{v:012d}." not in key or "/log/" not in key}:
                return Mutation(kind, {key}, {key: data})
            (root / key).write_bytes(data)  # every other version still loads: not damage
        raise AssertionError("no deletion that loses a loadable version")
    if kind == "delete-artifact":
        key = rng.choice(referenced)
        data = (root / key).read_bytes()
        (root / key).unlink()
        return Mutation(kind, {key}, {key: data})
    if kind == "swap":
        run = rng.choice(sorted({k.split("/")[1] for k in run_keys}))
        logs = [k for k in run_keys if k.startswith(f"runs/{run}/log/")]
        a, b = rng.sample(logs, 2)
        da, db = (root / a).read_bytes(), (root / b).read_bytes()
        (root / a).write_bytes(db)
        (root / b).write_bytes(da)
        return Mutation(kind, {a, b}, {a: da, b: db})
    if kind == "copy-run":
        src = rng.choice(run_keys)
        rf = parse_run_key(src)
        assert rf is not None
        src_run = src.split("/")[1]
        others = sorted({k.split("/")[1] for k in run_keys} - {src_run})
        dst_run = rng.choice(others)
        same_kind = [k for k in run_keys if k.startswith(f"runs/{dst_run}/{rf.kind}/")]
        dst = src.replace(f"runs/{src_run}/", f"runs/{dst_run}/", 1)
        if dst not in same_kind and same_kind and rng.random() < 0.7:
            dst = rng.choice(same_kind)  # overwrite one of its files
        old = (root / dst).read_bytes() if (root / dst).exists() else None
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        (root / dst).write_bytes((root / src).read_bytes())
        return Mutation(kind, {dst}, {dst: old})
    if kind == "temp":
        base = rng.choice(run_keys + art_keys)
        d, name = base.rsplit("/", 1)
        key = f"{d}/.{name}.tmp-{rng.randbytes(6).hex()}"
        (root / key).write_bytes(rng.randbytes(rng.randrange(0, 200)))
        stale = time.time() - 3600  # a crash's leftover, found by the next verify: past TEMP_GRACE
        os.utime(root / key, (stale, stale))
        return Mutation(kind, {key}, {key: None})
    raise ValueError(kind)
