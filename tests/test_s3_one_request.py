"""A commit to S3 is one request: the conditional PUT of the next journal key (issue 12).

Counted over real HTTP, through a recording proxy in front of the moto server. The fence that
lets the PUT stand alone is retention's: on S3 a pruned journal record stays at its key for
`fence_seconds`, so a stale writer's PUT is refused by the record itself. A writer idle for
more than half of that checks its base beside the PUT (two requests). The stale writers
themselves are in tests/test_review_regressions.py (fenced, and past the fence time).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _fault_proxy import FaultProxy, Request

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, ConflictError, Step, StepStatus

# no delta or snapshot in these few commits: what is counted is the commit path alone
QUIET = CompactionPolicy(fanout=64, max_plan=100, min_snapshot_bytes=10**9, keep_last=0,
                         background=False)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []

    def __call__(self, req: Request) -> None:
        self.seen.append((req.method, req.path, req.conditional))

    def take(self) -> list[tuple[str, str, bool]]:
        out, self.seen = self.seen, []
        return out


def _through(s3: EmbeddedS3, endpoint: str) -> dict[str, Any]:
    return {**s3.storage_options,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": s3.region}}


def _run(n: int) -> AgentRun:
    return AgentRun(run_id="one", goal="g",
                    steps={f"s{i}": Step(id=f"s{i}", title=f"t{i}") for i in range(n)})


def _finish(run: AgentRun, i: int) -> Step:
    step = run.steps[f"s{i}"]
    step.status, step.result = StepStatus.COMPLETED, f"result {i}"
    return step


def test_each_commit_is_one_conditional_put(s3: EmbeddedS3, s3_url: str) -> None:
    rec = Recorder()
    with FaultProxy(s3.endpoint, rec) as proxy:
        store = CheckpointStore(s3_url, _through(s3, proxy.endpoint), policy=QUIET)
        run = _run(20)
        store.save_run(run)
        rec.take()
        for i in range(20):
            store.commit(run, [_finish(run, i)])
            sent = rec.take()
            assert len(sent) == 1, sent
            method, path, conditional = sent[0]
            assert method == "PUT" and conditional and "/log/" in path, sent
        store.close()
    loaded = CheckpointStore(s3_url, s3.storage_options).load_run("one")
    assert loaded is not None and loaded.completed_count == 20


def test_a_head_idle_past_half_the_fence_time_checks_its_base(s3: EmbeddedS3, s3_url: str) -> None:
    rec = Recorder()
    policy = dataclasses.replace(QUIET, fence_seconds=0.6)
    with FaultProxy(s3.endpoint, rec) as proxy:
        store = CheckpointStore(s3_url, _through(s3, proxy.endpoint), policy=policy)
        run = _run(3)
        store.save_run(run)
        store.commit(run, [_finish(run, 0)])
        rec.take()
        store.commit(run, [_finish(run, 1)])  # confirmed a moment ago: the PUT alone
        assert [m for m, _p, _c in rec.take()] == ["PUT"]
        time.sleep(0.4)  # past half the fence time: the base is checked, after the PUT
        store.commit(run, [_finish(run, 2)])
        sent = rec.take()
        # a GET of the base's record, whose hash must be this head's (a forgotten run's id
        # taken again holds a v1 of its own), sent once the PUT is done (a forget beside a
        # slow PUT, tests/test_forget_s3_writer.py)
        assert [m for m, _p, _c in sent] == ["PUT", "GET"], sent
        assert sent[1][1].split("?")[0].endswith("log/000000000003.ckpt"), sent
        store.close()



CLI = str(Path(sys.executable).parent / "ckptfs")


def test_fenced_store_verifies_mirrors_restores_and_resumes(s3: EmbeddedS3, s3_url: str,
                                                            tmp_path: Path) -> None:
    """The fences are journal records below the oldest kept snapshot: the real `ckptfs`
    verifies such a store clean, mirrors it (a mirror that verifies clean too), and a restore
    of the mirror resumes where the run stopped. `prune` leaves young fences alone."""
    # no superseded grace, here and for prune: what stays below the kept snapshot is fences only
    policy = CompactionPolicy(fanout=2, max_plan=3, min_snapshot_bytes=1, keep_last=1,
                              superseded_grace=0.0, background=False)
    store = CheckpointStore(s3_url, s3.storage_options, policy=policy)
    run = _run(30)
    store.save_run(run)
    for i in range(20):
        store.commit(run, [_finish(run, i)])
    store.close()
    assert store.storage.exists("runs/one/log/000000000002.ckpt")  # a fence, still there
    assert not store.storage.exists("runs/one/snap/000000000004.ckpt")  # retention ran
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION=s3.region)
    ep = f"client_kwargs.endpoint_url={s3.endpoint}"

    def ckptfs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120,
                              cwd=tmp_path)

    got = ckptfs("versions", s3_url, "one", "-o", ep, "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    versions = json.loads(got.stdout)
    # a fence is a restore point while the chain up to it is whole (all are young here); the
    # points are exactly the versions a load reaches (name-based, v1..v24 were said not to be)
    assert 2 in versions["fences"] and max(versions["restore_points"]) == 21, versions  # 20 commits
    reader = CheckpointStore(s3_url, s3.storage_options)
    for v in range(1, 22):
        reader.load_run("one", version=v)
        assert reader.last_load is not None and reader.last_load.version == v
    assert versions["restore_points"] == list(range(1, 22)), versions
    got = ckptfs("verify", s3_url, "-o", ep, "--json")
    assert got.returncode == 0, got.stdout + got.stderr
    assert json.loads(got.stdout)["ok"]
    mirror = str(tmp_path / "mirror")
    got = ckptfs("mirror", s3_url, mirror, "--from-option", ep, "--once")
    assert got.returncode == 0, got.stdout + got.stderr
    got = ckptfs("verify", mirror, "--json")
    assert got.returncode == 0 and json.loads(got.stdout)["ok"], got.stdout + got.stderr
    got = ckptfs("prune", s3_url, "-o", ep, "--keep-last", "1", "--superseded-grace", "0")
    assert got.returncode == 0, got.stdout + got.stderr
    assert store.storage.exists("runs/one/log/000000000002.ckpt")  # young: kept as a fence
    restored = str(tmp_path / "restored")
    got = ckptfs("restore", mirror, restored)
    assert got.returncode == 0, got.stdout + got.stderr
    again = CheckpointStore(restored)
    resumed = again.load_run("one")
    assert resumed is not None and resumed.completed_count == 20
    for i in range(20, 30):
        again.commit(resumed, [_finish(resumed, i)])
    again.close()
    final = CheckpointStore(restored).load_run("one")
    assert final is not None and final.completed_count == 30


def test_prune_removes_fences_once_their_time_is_up(s3: EmbeddedS3, s3_url: str) -> None:
    """A fence goes once the store's own clock shows it old: its time against the store's now,
    the Date of the reply that dates the run's newest journal record (retention.fence_floor),
    never this machine's clock alone, which may run ahead of the store's. An idle run's fences
    go too: they stayed until it wrote again, when that record's time was the store's now."""
    policy = CompactionPolicy(fanout=2, max_plan=3, min_snapshot_bytes=1, keep_last=1,
                              fence_seconds=6, superseded_grace=0, background=False)
    store = CheckpointStore(s3_url, s3.storage_options, policy=policy)
    run = _run(11)
    store.save_run(run)
    for i in range(10):
        store.commit(run, [_finish(run, i)])
    fence = "runs/one/log/000000000002.ckpt"
    assert store.storage.exists(fence)
    young = store.apply_retention("one", 1)
    assert fence not in young.deleted and store.storage.exists(fence)
    time.sleep(7.1)  # past the fence (6 s: young above even on a loaded machine; S3 times are whole seconds)
    idle = store.apply_retention("one", 1)  # nothing written since: the store's Date moved on
    assert fence in idle.deleted and not store.storage.exists(fence)
    store.commit(run, [_finish(run, 10)])
    fresh = CheckpointStore(s3_url, s3.storage_options).load_run("one")
    assert fresh is not None and fresh.completed_count == 11


def test_a_writer_whose_machine_slept_checks_its_base(s3: EmbeddedS3, s3_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The monotonic clock stops while a machine is suspended: a writer that committed just
    before a suspend must not take its head for freshly confirmed when it wakes. Writer B moves
    the run on and prunes past the fences meanwhile; A's commit is refused, nothing of it stays."""
    policy = CompactionPolicy(min_snapshot_bytes=1, keep_last=1, fence_seconds=0.5,
                              superseded_grace=0.0, background=False)
    a = CheckpointStore(s3_url, s3.storage_options, policy=policy)
    run_a = AgentRun(run_id="one", goal="g", steps={"a": Step(id="a", title="a"),
                                                    "b": Step(id="b", title="b")})
    a.save_run(run_a)
    asleep_at = time.monotonic()
    b = CheckpointStore(s3_url, s3.storage_options, policy=policy)
    run_b = b.load_run("one")
    assert run_b is not None
    for i in range(8):
        run_b.steps["b"].result, run_b.steps["b"].status = f"B{i}", StepStatus.COMPLETED
        b.commit(run_b, ["b"])
        time.sleep(0.15)
    assert not b.storage.exists("runs/one/log/000000000002.ckpt")  # pruned past its fence
    run_a.steps["a"].result, run_a.steps["a"].status = "A's work", StepStatus.COMPLETED
    with monkeypatch.context() as m:  # A's monotonic clock did not run while it slept
        m.setattr("ckptfs.store.checkpoint_store.time.monotonic", lambda: asleep_at + 0.01)
        with pytest.raises(ConflictError, match="removed by retention"):
            a.commit(run_a, ["a"])
    assert not b.storage.exists("runs/one/log/000000000002.ckpt")  # withdrawn
    fresh = CheckpointStore(s3_url, s3.storage_options).load_run("one")
    assert fresh is not None and fresh.steps["a"].result is None
    assert fresh.steps["b"].result == "B7"


def test_fences_expire_while_snapshots_come_faster_than_the_fence(s3: EmbeddedS3,
                                                                  s3_url: str) -> None:
    """Snapshots every commit, each pruned by the next: the journal records they covered still
    go once fence_seconds have passed since those snapshots were written."""
    policy = CompactionPolicy(min_snapshot_bytes=1, keep_last=1, fence_seconds=0.3,
                              superseded_grace=0.0, background=False)
    store = CheckpointStore(s3_url, s3.storage_options, policy=policy)
    run = _run(1)
    store.save_run(run)
    step = run.steps["s0"]
    for i in range(30):
        step.result = f"r{i}"
        store.commit(run, [step])
        time.sleep(0.05)
    logs = [k for k in store.storage.list("runs/one/log/")]
    assert len(store.storage.list("runs/one/snap/")) == 1
    assert len(logs) < 15, logs  # 31 versions: those older than the fence time are gone
    assert "runs/one/log/000000000001.ckpt" not in logs
    fresh = CheckpointStore(s3_url, s3.storage_options).load_run("one")
    assert fresh is not None and fresh.steps["s0"].result == "r29"
