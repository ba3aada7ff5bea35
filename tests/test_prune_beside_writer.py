"""`ckptfs prune` beside a live writer must not collect an artifact the run still references.

A writer with keep_last=1 and superseded_grace=0 replaces its snapshot every few commits. Prune
listed the run, then read its files; a snapshot the writer superseded in between was gone and
skipped, and the references only it held (journal records hold only changes) went uncounted:
prune deleted artifacts every stored version needs ("referenced artifact is missing"; a hostile
review, 4 of 4 tries). Run as a module (`python -m tests.test_prune_beside_writer URL RUN
ACKS COMMITS`), this file is that writer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.errors import CheckpointCorruptError
from ckptfs.format.keys import RunFile, parse_artifact_key, parse_run_key
from ckptfs.maintenance.prune import prune
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from tests._forwarding import Forwarding

RUN = "k"
THRESHOLD = 1024  # results above it are content-addressed artifacts
STEPS = 500  # steps each writer completes in turn: its state stops growing there
WRITERS = 2  # runs written at once: each one a chance for the race, per prune pass
CKPTFS = str(Path(sys.executable).with_name("ckptfs"))
ROOT = Path(__file__).resolve().parents[1]  # the writer runs as `python -m tests.<this module>`
MAX_PASSES = 40
COMMITS = 4000  # per writer: before the fix a run stopped loading after 500 to 1,500 in most tries
DAYS = 3 * 86400.0  # a `now` this far ahead makes every artifact older than the 24 h grace


def writer_policy() -> CompactionPolicy:
    return CompactionPolicy(keep_last=1, min_snapshot_bytes=0, snapshot_ratio=0.2,
                            superseded_grace=0, fence_seconds=600)


def result_of(sid: str, n: int) -> str:
    """Commit `n`'s result for step `sid`; every fifth is large enough to be an artifact."""
    return f"val-{sid}-{n}-" + ("y" * 3000 if n % 5 == 0 else "short")


def write(url: str, run_id: str, acks: str, commits: int) -> None:
    """Commit one step at a time, over STEPS steps in turn, `commits` times; a line goes to
    `acks` only after its commit returned. A large result replaced in a step is garbage once
    retention retires the records naming it: prune has real work beside the references it
    must keep. Compaction runs in the background, as the reviewer's writer had it (inline, the
    race never showed in 100 passes), and a bounded writer keeps a compactor that falls behind
    on a busy machine from leaving tens of thousands of records for every load to read."""
    store = CheckpointStore(url, policy=writer_policy(), keep_last=1, artifact_threshold=THRESHOLD)
    run = AgentRun(run_id=run_id, goal="prune beside a writer")
    store.save_run(run)
    with open(acks, "a") as out:
        for n in range(commits):
            sid = f"s{n % STEPS:04d}"
            if sid not in run.steps:
                run.add_step(Step(id=sid, title="t"))
            step = run.steps[sid]
            step.status, step.result = StepStatus.COMPLETED, result_of(sid, n)
            version = store.commit(run, [step])
            out.write(f"{sid} {n} {version}\n")
            out.flush()
    store.close()


def acknowledged(acks: Path) -> list[tuple[str, int, int]]:
    """The complete lines of the writer's log (a SIGKILL may cut the last one)."""
    text = acks.read_text()
    lines = text.split("\n")[:-1]  # whatever follows the last newline is a cut line
    return [(sid, int(n), int(v)) for sid, n, v in (line.split() for line in lines)]


def missing_artifacts(url: str) -> list[dict[str, Any]]:
    out = subprocess.run([CKPTFS, "verify", url, "--json"], capture_output=True, text=True)
    return [f for f in json.loads(out.stdout)["findings"] if f["code"] == "artifact-missing"]


def check_run(url: str, run_id: str, acks: Path) -> None:
    """Every step the writer acknowledged loads with its last acknowledged result (or one it
    committed after), large ones read back from their artifacts; every version from the
    newest snapshot on loads (its artifacts are verify's to check, once each: a resolved load
    of every version read them all again, a minute per run)."""
    acked = acknowledged(acks)
    store = CheckpointStore(url)
    run = store.load_run(run_id)
    assert run is not None and store.last_load is not None
    assert store.last_load.version >= acked[-1][2]
    last = {sid: n for sid, n, _version in acked}
    for sid, n in last.items():
        result = run.steps[sid].result if sid in run.steps else None
        assert isinstance(result, str), sid
        stored = int(result.split("-")[2])
        assert stored >= n and result == result_of(sid, stored), (sid, n, result[:40])
    snaps = [rf.version for k in open_storage(url).list(f"runs/{run_id}/snap/")
             if (rf := parse_run_key(k))]
    for version in store.list_versions(run_id):
        if version >= max(snaps, default=0):
            assert store.load_run(run_id, version, resolve_artifacts=False) is not None, version


def test_prune_passes_beside_live_writers_keep_every_referenced_artifact(tmp_path: Path) -> None:
    """Real processes: two writers (two runs, as two agents) committing in a loop, `ckptfs prune
    --keep-last 1` run again and again beside them until they are done, a load of each run
    after each pass. Before the fix a run stopped loading within the first few passes
    ("referenced artifact is missing"); prune must lose nothing, and still collect what no
    record references."""
    url = str(tmp_path / "store")
    runs = [f"k{i}" for i in range(WRITERS)]
    acks = {rid: tmp_path / f"acks-{rid}" for rid in runs}
    writers = []
    for rid in runs:
        acks[rid].touch()
        with open(tmp_path / f"writer-{rid}.err", "wb") as err:
            writers.append(subprocess.Popen(
                [sys.executable, "-m", "tests.test_prune_beside_writer", url, rid, str(acks[rid]),
                 str(COMMITS)],
                stderr=err, cwd=ROOT))
    failures: list[str] = []
    collected = 0
    try:
        while min(len(acknowledged(a)) for a in acks.values()) < 100:  # old artifacts, snapshots
            assert all(w.poll() is None for w in writers), "a writer died"
            time.sleep(0.05)
        passes = 0
        while passes < MAX_PASSES and any(w.poll() is None for w in writers) and not failures:
            passes += 1
            p = subprocess.run([CKPTFS, "prune", url, "--keep-last", "1", "--superseded-grace", "0",
                                "--artifact-grace", "1s", "--json"], capture_output=True, text=True)
            gc = json.loads(p.stdout)["artifacts"] if p.stdout.startswith("{") else {}
            # a pass may refuse to collect (a run kept changing under it): exit 1, and said
            assert p.returncode == 0 or "kept vanishing" in str(gc.get("gc")), p.stdout + p.stderr
            collected += len(gc.get("deleted", []))
            for rid in runs:
                try:
                    CheckpointStore(url).load_run(rid)
                except CheckpointCorruptError as exc:
                    failures.append(f"run {rid} after prune pass {passes}: {exc}")
                except FileNotFoundError:
                    pass  # the load raced the writer's own retention (grace 0): proves nothing
        assert passes >= 3 or failures, f"only {passes} prune pass(es) beside the writers"
        for w in writers:
            assert failures or w.wait() == 0, "a writer failed"
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert failures == []
    for rid in runs:
        check_run(url, rid, acks[rid])
    assert missing_artifacts(url) == []
    assert collected > 0  # replaced results' artifacts went: collection ran beside the writers


# ------------------------------------------------------------------ deterministic, in process


class SnapshotsVanish(Forwarding):
    """Storage under prune in which a listed snapshot is gone by the time prune reads it.

    Prune lists `runs/` whole twice before collecting artifacts: to plan retention, then to
    read references. From the second listing on, the first read of each snapshot first lets
    `writer` commit until its retention retired that snapshot (a live writer winning the
    race), `times` times in all; with no writer, every read of a snapshot says it is gone.
    """

    def __init__(self, inner: Storage, writer: Callable[[str], None] | None, times: int = 0) -> None:
        super().__init__(inner)
        self.writer, self.times = writer, times
        self.run_listings = 0
        self.vanished: list[str] = []

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        if prefix == "runs/":
            self.run_listings += 1
        return self.inner.list(prefix, start_after)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        rf = parse_run_key(key)
        if self.run_listings >= 2 and rf is not None and rf.kind == "snap":
            if self.writer is None:
                self.vanished.append(key)
                raise FileNotFoundError(key)
            if self.times > 0 and key not in self.vanished:
                self.times -= 1
                self.vanished.append(key)
                self.writer(key)
        return self.inner.get_with_etag(key)


class Writer:
    """A writer in this process, on its own Storage: `advance(key)` commits until snapshot `key`
    is retired. No fences (fence_seconds=0), so on S3 too a record goes with its snapshot."""

    def __init__(self, url: str, opts: dict[str, Any]) -> None:
        policy = CompactionPolicy(keep_last=1, min_snapshot_bytes=0, snapshot_ratio=1.0,
                                  superseded_grace=0, fence_seconds=0, background=False)
        self.store = CheckpointStore(url, opts, policy=policy, keep_last=1, artifact_threshold=THRESHOLD)
        self.storage = open_storage(url, opts)
        self.run = AgentRun(run_id=RUN, goal="g")
        self.store.save_run(self.run)
        self.n = 0

    def step(self, sid: str, result: str) -> int:
        if sid not in self.run.steps:
            self.run.add_step(Step(id=sid, title="t"))
        step = self.run.steps[sid]
        step.status, step.result = StepStatus.COMPLETED, result
        return self.store.commit(self.run, [step])

    def files(self, kind: str) -> list[RunFile]:
        return sorted(rf for k in self.storage.list(f"runs/{RUN}/")
                      if (rf := parse_run_key(k)) is not None and rf.kind == kind)

    def advance(self, key: str) -> None:
        for _ in range(200):
            self.n += 1
            self.step(f"s{self.n:04d}", "small")
            if key not in {rf.key for rf in self.files("snap")}:
                return
        raise AssertionError(f"the writer never retired {key}")


def artifact_keys(storage: Storage) -> set[str]:
    return {k for k in storage.list("artifacts/") if parse_artifact_key(k)}


def build(url: str, opts: dict[str, Any]) -> tuple[Writer, str, str]:
    """A run in which only the snapshot references artifact `held` (the journal record that
    named it is retired), and artifact `garbage` that nothing references any more."""
    w = Writer(url, opts)
    w.step("garbage", "G" * 3000)
    (garbage,) = artifact_keys(w.storage)
    w.step("garbage", "no artifact now")
    held_version = w.step("held", "H" * 3000)
    (held,) = artifact_keys(w.storage) - {garbage}
    while min(rf.version for rf in w.files("snap") + w.files("log")) <= held_version:
        w.advance(w.files("snap")[-1].key)
    return w, held, garbage


def test_a_snapshot_replaced_between_listing_and_read_keeps_its_artifacts(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """The writer retires the snapshot prune listed, and then its successor, each just before
    prune reads it: prune lists the run again and reads the newest one, so the artifact only
    the snapshots hold stays, and the one nothing references goes."""
    url, opts = shared_url
    w, held, garbage = build(url, opts)
    storage = SnapshotsVanish(open_storage(url, opts), w.advance, times=2)
    report = prune(storage, 1, superseded_grace=0, now=time.time() + DAYS)
    assert len(storage.vanished) == 2, storage.vanished
    assert held not in report.artifacts_deleted
    assert held in artifact_keys(w.storage)
    assert report.ok and report.artifact_gc == "done", report.problems
    assert report.artifacts_deleted == [garbage]
    run = CheckpointStore(url, opts).load_run(RUN)
    assert run is not None and run.steps["held"].result == "H" * 3000
    w.store.close()


def test_a_run_whose_snapshots_keep_vanishing_is_no_reason_to_delete(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """Every snapshot prune lists is gone when it reads it: the references of the run are never
    known, so nothing is collected, and the report says why."""
    url, opts = shared_url
    w, held, garbage = build(url, opts)
    storage = SnapshotsVanish(open_storage(url, opts), None)
    report = prune(storage, 1, superseded_grace=0, now=time.time() + DAYS)
    assert storage.vanished
    assert report.artifacts_deleted == []
    assert {held, garbage} <= artifact_keys(w.storage)
    assert report.artifact_gc.startswith("skipped: ") and "kept vanishing" in report.artifact_gc
    assert report.artifact_gc in report.problems
    w.store.close()


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
