"""`forget` beside an S3 writer: refused while the run is fresh; a resumed writer checks its base.

Measured 2026-12-07 over moto: a run at v3 forgotten from another store while its writer kept
committing; the writer's next commits were acknowledged as v4 and v5 (an S3 writer that
confirmed its base within `fence_seconds / 2` commits with one conditional PUT and no look at
its base), and a new load raised CheckpointCorruptError. Now:

* `forget` on a fencing store refuses a run written within `fence_seconds` (exit 1, `in-use`),
  unless `--force`; local disk, where every commit checks its base, still forgets at once;
* a load dates the writer's head by the loaded record's time, so a writer resuming an idle run
  checks its base on its first commit and stops (ConflictError) when a forget took the run;
* a commit that lands between the forget's listing and its deletes is reported (exit 1).

The hostile re-read of that found three more ways through, each a test below: a slow PUT whose
base check was sent beside it, a record dated ahead by its writer's fast clock, and a store
whose replies carry no Date.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.errors import BaseRemovedError, ConflictError, RunNotFoundError, StorageUnavailableError
from ckptfs.maintenance.forget import forget
from ckptfs.storage.base import Storage
from ckptfs.store import checkpoint_store
from ckptfs.store.compactor import CompactionPolicy
from tests._fault_proxy import Fault, FaultProxy, Request

CLI = str(Path(sys.executable).parent / "ckptfs")


def _run(n: int = 3) -> AgentRun:
    run = AgentRun(run_id="r", goal="g")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title=f"s{i}"))
    return run


def _commit_versions(store: CheckpointStore, run: AgentRun, upto: int) -> None:
    """Commit step results until the run's newest version is `upto`."""
    version, i = store.save_run(run), 0
    while version < upto:
        step = run.steps[f"s{i % len(run.steps)}"]
        step.status, step.result = StepStatus.COMPLETED, f"v{version + 1}"
        version = store.commit(run, [step])
        i += 1
    assert version == upto


def _newest(store: CheckpointStore) -> int:
    assert store.load_run("r") is not None and store.last_load is not None
    return store.last_load.version


def _cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_the_cli_refuses_a_fresh_s3_run_and_forgets_it_with_force(s3_url: str,
                                                                  s3_opts: dict[str, Any]) -> None:
    env = {"CKPTFS_STORAGE_OPTIONS": json.dumps(s3_opts)}
    with CheckpointStore(s3_url, s3_opts) as store:
        _commit_versions(store, _run(), 3)
    for extra in ([], ["--dry-run"]):
        proc = _cli("forget", s3_url, "r", "--json", *extra, env=env)
        doc = json.loads(proc.stdout)
        assert proc.returncode == 1, proc.stderr
        assert doc["error"]["code"] == "in-use", doc
        message = doc["error"]["message"]
        assert "runs/r/log/000000000003.ckpt" in message and "--force" in message, message
        assert re.search(r"is \d+s old \(a forget without --force is possible \d+s from", message), message
        assert "stop the agent first" in message, message
    with CheckpointStore(s3_url, s3_opts) as fresh:  # nothing went
        assert _newest(fresh) == 3
    proc = _cli("forget", s3_url, "r", "--force", env=env)
    assert proc.returncode == 0, proc.stderr
    with CheckpointStore(s3_url, s3_opts) as fresh:
        assert fresh.load_run("r") is None


def test_local_disk_still_forgets_a_fresh_run_at_once(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    with CheckpointStore(root) as store:
        store.save_run(_run())
    proc = _cli("forget", root, "r", env={})
    assert proc.returncode == 0, proc.stderr
    with CheckpointStore(root) as fresh:
        assert fresh.load_run("r") is None


def test_a_live_s3_writer_keeps_its_run_and_every_commit_loads(s3_url: str,
                                                              s3_opts: dict[str, Any]) -> None:
    """The measured case: a run at v3 with its writer committing on. The forget is refused,
    so v4 and v5 are acknowledged on a run that loads them (they were CheckpointCorruptError)."""
    with CheckpointStore(s3_url, s3_opts) as writer, CheckpointStore(s3_url, s3_opts) as other:
        run = _run()
        _commit_versions(writer, run, 3)
        report = forget(other.storage, "r")
        assert report.refused and not report.deleted
        assert report.recent_write is not None and report.recent_write[0].endswith("log/000000000003.ckpt")
        _commit_versions(writer, run, 5)
    with CheckpointStore(s3_url, s3_opts) as fresh:
        assert _newest(fresh) == 5
        loaded = fresh.load_run("r")
        assert loaded is not None
        assert {k: s.result for k, s in loaded.steps.items()} == {k: s.result for k, s in run.steps.items()}
        assert "v5" in {s.result for s in loaded.steps.values()}


def test_a_writer_resuming_an_idle_run_meets_the_forget_and_stops(s3_url: str,
                                                                 s3_opts: dict[str, Any]) -> None:
    """An idle run (older than the forget's fence time) is forgotten while an agent resumes it.
    The resumed writer loaded it a moment before, but its newest record is older than half
    the fence time, so its first commit checks its base: ConflictError, not an acknowledged
    v4 on a run no load can read (the head used to be dated by the load)."""
    policy = CompactionPolicy(fence_seconds=2.0)  # half: 1 s
    with CheckpointStore(s3_url, s3_opts) as first:
        _commit_versions(first, _run(), 3)
    time.sleep(1.3)  # the run goes idle: its newest record is past both fence times below
    with CheckpointStore(s3_url, s3_opts, policy=policy) as resumed, \
            CheckpointStore(s3_url, s3_opts) as other:
        assert _newest(resumed) == 3
        run = resumed.load_run("r")
        assert run is not None
        report = forget(other.storage, "r", fence_seconds=1.0)
        assert not report.refused and report.ok and report.deleted
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "late"
        with pytest.raises(ConflictError):
            resumed.commit(run, [run.steps["s2"]])
    with CheckpointStore(s3_url, s3_opts) as fresh:
        assert fresh.load_run("r") is None  # was: v4 acknowledged, then CheckpointCorruptError
        assert fresh.storage.list("runs/r/") == []


class _CommitOnFirstDelete:
    """A storage whose first delete lets a writer commit first: a commit landing between the
    forget's listing and its deletes, as a live writer's does."""

    def __init__(self, inner: Storage, commit: Any) -> None:
        self._inner, self._commit, self.fired = inner, commit, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def delete(self, key: str) -> None:
        if not self.fired:
            self.fired = True
            self._commit()
        self._inner.delete(key)


def test_a_commit_landing_during_a_forced_forget_is_reported(s3_url: str, s3_opts: dict[str, Any]) -> None:
    with CheckpointStore(s3_url, s3_opts) as writer, CheckpointStore(s3_url, s3_opts) as other:
        run = _run()
        _commit_versions(writer, run, 3)
        storage = _CommitOnFirstDelete(other.storage, lambda: _commit_versions(writer, run, 4))
        report = forget(storage, "r", force=True)  # type: ignore[arg-type]
        assert storage.fired and not report.ok
        assert [e.split(":")[0] for e in report.errors] == ["runs/r/log/000000000004.ckpt"], report.errors
        assert "written during the forget" in report.errors[0] and "stop it" in report.errors[0]


# ---------------------------------------------------------------- found by the hostile re-read


def _commit_beside(store: CheckpointStore, run: AgentRun, step_id: str) -> Future[int]:
    """`store.commit(run, [step])` on a thread of its own, for a forget to run beside it."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(store.commit, run, [run.steps[step_id]])
    finally:
        pool.shutdown(wait=False)


def _proxied(opts: dict[str, Any], endpoint: str) -> dict[str, Any]:
    return {**opts, "client_kwargs": {**opts["client_kwargs"], "endpoint_url": endpoint}}


def _deny_once_after_put(put: int, get: int) -> tuple[Callable[[Request], Fault | None], threading.Event]:
    """A proxy rule that answers 403 to the first GET of journal record `get` sent after the
    PUT of record `put`, and the event it sets then: one read of the check or withdrawal that
    follows a writer's PUT, refused."""
    put_seen, denied = threading.Event(), threading.Event()

    def rule(req: Request) -> Fault | None:
        path = req.path.split("?")[0]
        if req.method == "PUT" and path.endswith(f"log/{put:012d}.ckpt"):
            put_seen.set()
        elif put_seen.is_set() and not denied.is_set() and req.method == "GET" \
                and path.endswith(f"log/{get:012d}.ckpt"):
            denied.set()
            return Fault(status=403, code="AccessDenied")
        return None

    return rule, denied


def test_a_slow_put_that_lands_after_the_forget_is_withdrawn(s3: EmbeddedS3) -> None:
    """The resumed writer's base check was sent beside its PUT: it answered "there" before the
    forget deleted v3, the PUT (held 2 s at a proxy) landed after the forget's last listing, and
    v4 was acknowledged on a run no load could read (4 of 4 tries). The check now follows the
    PUT on S3."""
    url, opts = s3.url("slow-put"), s3.storage_options
    with CheckpointStore(url, opts) as first:
        _commit_versions(first, _run(), 3)
    time.sleep(1.3)  # idle past both fence times below

    def rule(req: Request) -> Fault | None:
        return Fault(delay=2.0) if req.method == "PUT" and "log/000000000004" in req.path else None

    policy = CompactionPolicy(fence_seconds=2.0)
    with FaultProxy(s3.endpoint, rule) as proxy, \
            CheckpointStore(url, _proxied(opts, proxy.endpoint), policy=policy) as resumed, \
            CheckpointStore(url, opts) as other:
        run = resumed.load_run("r")
        assert run is not None
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "late"
        outcome = _commit_beside(resumed, run, "s2")
        time.sleep(0.5)  # the PUT is held at the proxy
        report = forget(other.storage, "r", fence_seconds=1.0)
        with pytest.raises(BaseRemovedError):  # was: acknowledged as v4
            outcome.result(timeout=60)
        assert report.ok and report.deleted and proxy.counts["delayed"] == 1
    with CheckpointStore(url, opts) as fresh:
        assert fresh.load_run("r") is None  # was CheckpointCorruptError


class _ClockAhead:
    """The `time` module as a machine whose clock runs `ahead` seconds fast sees it."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def time(self) -> float:
        return time.time() + self.ahead


def test_a_record_dated_ahead_by_a_fast_clock_does_not_spare_the_base_check(
        s3_url: str, s3_opts: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's last writer's clock ran 5 s fast (scaled down: minutes, against the default
    fence). A resumed writer took the record's time, in its future, as "written now", skipped
    its base check after the forget, and v4 was acknowledged on a run no load could read."""
    with monkeypatch.context() as m:
        m.setattr(checkpoint_store, "time", _ClockAhead(5.0))
        with CheckpointStore(s3_url, s3_opts) as first:
            _commit_versions(first, _run(), 3)
    time.sleep(1.3)
    with CheckpointStore(s3_url, s3_opts, policy=CompactionPolicy(fence_seconds=2.0)) as resumed, \
            CheckpointStore(s3_url, s3_opts) as other:
        run = resumed.load_run("r")
        assert run is not None
        report = forget(other.storage, "r", fence_seconds=1.0)
        assert report.ok and report.deleted
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "late"
        with pytest.raises(BaseRemovedError, match="forget"):
            resumed.commit(run, [run.steps["s2"]])
    with CheckpointStore(s3_url, s3_opts) as fresh:
        assert fresh.load_run("r") is None


def test_a_store_that_does_not_say_its_time_is_refused_and_the_window_is_an_option(
        s3: EmbeddedS3, tmp_path: Path) -> None:
    """Replies without a Date: the forget had only this machine's clock, and one ahead by the
    fence time took a run written a second before for old. Such a run's age is now unknown, so
    the forget is refused. `--fence-seconds` is the window (for writers given a longer one)."""
    url, opts = s3.url("no-date"), s3.storage_options
    with CheckpointStore(url, opts) as store:
        _commit_versions(store, _run(), 2)

    def no_date(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(k, v) for k, v in headers if k.lower() != "date"]

    def rule(req: Request) -> Fault | None:
        return Fault(reply_headers=no_date) if req.method == "HEAD" else None

    with FaultProxy(s3.endpoint, rule) as proxy:
        env = {"CKPTFS_STORAGE_OPTIONS": json.dumps(_proxied(opts, proxy.endpoint))}
        proc = _cli("forget", url, "r", "--json", env=env)
        doc = json.loads(proc.stdout)
        assert proc.returncode == 1 and doc["error"]["code"] == "in-use", proc.stderr
        assert "unknown age" in doc["error"]["message"] and doc["recent_write"]["written_s_ago"] is None
    env = {"CKPTFS_STORAGE_OPTIONS": json.dumps(opts)}
    time.sleep(1.1)
    proc = _cli("forget", url, "r", "--fence-seconds", "1h", "--json", env=env)
    assert proc.returncode == 1 and json.loads(proc.stdout)["error"]["code"] == "in-use"
    assert "3600s covers" in json.loads(proc.stdout)["error"]["message"]
    for bad in ("", "-5", "nan", "soon"):
        proc = _cli("forget", url, "r", "--fence-seconds", bad, env=env)
        assert proc.returncode == 2 and "--fence-seconds" in proc.stderr, (bad, proc.stderr)
    proc = _cli("forget", url, "r", "--fence-seconds", "1s", env=env)  # 1 s old by the store: allowed
    assert proc.returncode == 0, proc.stderr
    with CheckpointStore(url, opts) as fresh:
        assert fresh.load_run("r") is None


def test_a_writer_of_a_forgotten_run_does_not_build_on_a_new_run_of_the_same_id(
        s3_url: str, s3_opts: dict[str, Any]) -> None:
    """Agent A saves v1 and sits in a long tool call; the idle run is forgotten and job B starts
    a run of the same id (its own v1). A's commit found *a* v1 and was acknowledged as v2 on a
    chain no load follows (a fresh load gave B's v1, A's paid result gone), and B's next commit
    met ConflictError. A's check now compares the base record's hash with its own."""
    policy = CompactionPolicy(fence_seconds=2.0)
    with CheckpointStore(s3_url, s3_opts, policy=policy) as a, CheckpointStore(s3_url, s3_opts) as b, \
            CheckpointStore(s3_url, s3_opts) as other:
        run_a = _run()
        run_a.goal = "A's job"
        assert a.save_run(run_a) == 1
        time.sleep(1.3)  # A idle past half its fence time; the run past the forget's
        assert forget(other.storage, "r", fence_seconds=1.0).deleted
        run_b = _run()
        run_b.goal = "B's job"
        assert b.save_run(run_b) == 1
        run_a.steps["s0"].status, run_a.steps["s0"].result = StepStatus.COMPLETED, "A's paid result"
        with pytest.raises(BaseRemovedError):
            a.commit(run_a, [run_a.steps["s0"]])  # was: acknowledged as v2
        run_b.steps["s1"].status, run_b.steps["s1"].result = StepStatus.COMPLETED, "B's result"
        assert b.commit(run_b, [run_b.steps["s1"]]) == 2  # was: ConflictError
    with CheckpointStore(s3_url, s3_opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and fresh.last_load is not None
        assert fresh.last_load.version == 2 and loaded.steps["s1"].result == "B's result"
        assert fresh.last_load.skipped == []


# ------------------------------------------------------------ found by the second hostile re-read


def test_a_snapshot_only_base_of_a_new_run_of_the_same_id_is_not_taken_for_ours(
        s3_url: str, s3_opts: dict[str, Any]) -> None:
    """As above, but every base is a snapshot alone (retention took the records once past the
    fence): the check found *a* snapshot at v3, the new run's, and A's v4 was acknowledged."""
    # a snapshot at every version (snapshot_ratio ~0): which version the size rule would pick
    # turns on a few bytes of compressed timestamps
    policy = CompactionPolicy(background=False, min_snapshot_bytes=0, snapshot_ratio=1e-9, keep_last=1,
                              fence_seconds=1.0, superseded_grace=0.0)

    def snapshot_only(goal: str) -> None:
        with CheckpointStore(s3_url, s3_opts, policy=policy) as w:
            run = _run()
            run.goal = goal
            _commit_versions(w, run, 3)
        time.sleep(1.2)  # past the fence: retention may take the records below the snapshot
        with CheckpointStore(s3_url, s3_opts, policy=policy) as p:
            p.apply_retention("r", keep_last=1)
            assert sorted(p.storage.list("runs/r/")) == ["runs/r/snap/000000000003.ckpt"]

    snapshot_only("A's job")
    with CheckpointStore(s3_url, s3_opts, policy=policy) as a:
        run_a = a.load_run("r")
        assert run_a is not None and run_a.goal == "A's job"
        time.sleep(1.2)
        assert forget(a.storage, "r", fence_seconds=1.0).deleted
        snapshot_only("B's job")
        run_a.steps["s2"].status, run_a.steps["s2"].result = StepStatus.COMPLETED, "A's paid result"
        with pytest.raises(BaseRemovedError):
            a.commit(run_a, [run_a.steps["s2"]])  # was: acknowledged as v4, then lost
    with CheckpointStore(s3_url, s3_opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and fresh.last_load is not None
        assert fresh.last_load.version == 3


def test_a_damaged_base_record_beside_a_good_snapshot_does_not_block_commits(
        s3_url: str, s3_opts: dict[str, Any]) -> None:
    """One flipped byte in log v3, snap v3 intact: the load reads the snapshot, and the
    idle writer's check took the damaged record for a missing base, on every reload."""
    policy = CompactionPolicy(background=False, min_snapshot_bytes=0, snapshot_ratio=1e-9, fence_seconds=2.0)
    with CheckpointStore(s3_url, s3_opts, policy=policy) as w:
        _commit_versions(w, _run(), 3)
        assert w.storage.exists("runs/r/snap/000000000003.ckpt")
        key = "runs/r/log/000000000003.ckpt"
        raw = bytearray(w.storage.get(key))
        raw[len(raw) // 2] ^= 0xFF
        w.storage.put(key, bytes(raw))
    with CheckpointStore(s3_url, s3_opts, policy=policy) as r:
        run = r.load_run("r")
        assert run is not None
        time.sleep(1.2)
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "next"
        assert r.commit(run, [run.steps["s2"]]) == 4  # was BaseRemovedError, forever


def test_a_base_check_that_fails_leaves_no_writer_blaming_itself(s3: EmbeddedS3) -> None:
    """The check's GET fails after the PUT landed (here: 403 on that object). The error is
    raised, but the head is dropped, so the next call reloads and finds its own v4, where it
    met "version 4 was already committed by another writer" (a step redone: a tool paid twice)."""
    url, opts = s3.url("check-fails"), s3.storage_options
    with CheckpointStore(url, opts) as first:
        _commit_versions(first, _run(), 3)
    time.sleep(1.2)

    rule, denied = _deny_once_after_put(4, 3)  # the one GET of the check, after the PUT of v4

    with FaultProxy(s3.endpoint, rule) as proxy, CheckpointStore(
            url, _proxied(opts, proxy.endpoint), policy=CompactionPolicy(fence_seconds=2.0)) as w:
        run = w.load_run("r")
        assert run is not None
        run.steps["s2"].status, run.steps["s2"].result = StepStatus.COMPLETED, "paid once"
        with pytest.raises(StorageUnavailableError, match="access refused"):
            w.commit(run, [run.steps["s2"]])
        assert denied.is_set()
        assert w.commit(run, [run.steps["s2"]]) == 4  # reloaded: its own v4 (was ConflictError)
    with CheckpointStore(url, opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.steps["s2"].result == "paid once"


def test_a_withdrawal_never_deletes_a_record_another_writer_put_at_the_key(s3: EmbeddedS3) -> None:
    """Old writer A (idle) puts v4; its check's GET is held 4 s. Meanwhile the run is forgotten
    with --force (A's v4 with it) and a new run of the same id reaches v4, acknowledged. A's
    check then reads the new v3, refuses, and its unconditional delete took the new run's v4."""
    url, opts = s3.url("withdraw"), s3.storage_options
    with CheckpointStore(url, opts) as first:
        _commit_versions(first, _run(), 3)
    put4 = threading.Event()

    def rule(req: Request) -> Fault | None:
        path = req.path.split("?")[0]
        if req.method == "PUT" and path.endswith("log/000000000004.ckpt"):
            put4.set()
        elif put4.is_set() and req.method == "GET" and path.endswith("log/000000000003.ckpt"):
            return Fault(delay=4.0)
        return None

    with FaultProxy(s3.endpoint, rule) as proxy, CheckpointStore(
            url, _proxied(opts, proxy.endpoint), policy=CompactionPolicy(fence_seconds=2.0)) as a:
        run_a = a.load_run("r")
        assert run_a is not None
        time.sleep(1.2)
        run_a.steps["s2"].status, run_a.steps["s2"].result = StepStatus.COMPLETED, "A"
        outcome = _commit_beside(a, run_a, "s2")
        assert put4.wait(30)
        time.sleep(0.3)
        with CheckpointStore(url, opts) as operator:
            assert forget(operator.storage, "r", force=True).deleted
        with CheckpointStore(url, opts) as b:
            run_b = _run()
            run_b.goal = "B's job"
            _commit_versions(b, run_b, 4)
        with pytest.raises(BaseRemovedError):
            outcome.result(timeout=60)
    with CheckpointStore(url, opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and fresh.last_load is not None
        assert fresh.last_load.version == 4  # was 3: B's acknowledged v4 deleted


# ------------------------------------------------------------- found by the third hostile re-read


def _forgotten_and_started_again(url: str, opts: dict[str, Any] | None, a: CheckpointStore,
                                 a_upto: int = 2, force: bool = True) -> AgentRun:
    """A commits up to `a_upto` and goes idle; the run is forgotten (past the fence, or with
    --force) and job B starts it again under the id, up to v3. With A at v2, B is past A's next
    version, so A's next PUT collides with B's record before any base check could run; at v3,
    A's PUT lands and its base check finds B's v3. A's run object."""
    run_a = _run()
    run_a.goal = "A's job"
    _commit_versions(a, run_a, a_upto)
    time.sleep(1.3)
    with CheckpointStore(url, opts) as operator:
        assert forget(operator.storage, "r", force=force, fence_seconds=1.0).deleted
    with CheckpointStore(url, opts) as b:
        run_b = _run()
        run_b.goal = "B's job"
        _commit_versions(b, run_b, 3)
    return run_a


def test_a_writer_refused_for_a_forgotten_base_does_not_retry_into_the_new_run(
        s3_url: str, s3_opts: dict[str, Any]) -> None:
    """A's paid tool call returns after its run was forgotten and started again by job B. The
    base check refused it, but `log_tool_call` took that for a lost race, reloaded (B's run)
    and appended A's call there, acknowledged; A's step result and goal followed."""
    policy = CompactionPolicy(fence_seconds=2.0)
    with CheckpointStore(s3_url, s3_opts, policy=policy) as a:
        run_a = _forgotten_and_started_again(s3_url, s3_opts, a, a_upto=3, force=False)
        call = ToolCall(id="k1", tool_name="pay", arguments={"amount": 100}, result="A paid 100",
                        timestamp=0.0)
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s2", call)  # was: acknowledged as v4 of B's run
        run_a.steps["s2"].status, run_a.steps["s2"].result = StepStatus.COMPLETED, "A's result"
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.commit(run_a, [run_a.steps["s2"]])  # was: v5, A's goal and result in B's run
        assert a.load_run("r") is not None  # a load of the id: A now holds B's run, knowingly
    with CheckpointStore(s3_url, s3_opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and fresh.last_load is not None
        assert fresh.last_load.version == 3 and loaded.steps["s2"].result is None
        assert fresh.get_tool_call_history("r", "s2") == []


# ------------------------------------------------------------ left open by the third re-read


def test_a_withdrawal_that_fails_still_refuses_and_no_retry_builds_on_the_new_run(s3: EmbeddedS3) -> None:
    """As above, A's paid call returns into a run forgotten and started again by B; the check
    refuses it, and the GET of A's withdrawal is refused (403). That storage error was raised
    in place of BaseRemovedError, and A's retry, as a caller retries a storage error, reloaded
    the id and appended A's call to B's run, acknowledged. The refusal now stands: A's record
    stays at v4 (no load follows it) and B's run goes on past it."""
    url, opts = s3.url("withdraw-fails"), s3.storage_options
    policy = CompactionPolicy(fence_seconds=2.0)
    rule, denied = _deny_once_after_put(4, 4)  # the withdrawal's GET of A's own v4, once

    with FaultProxy(s3.endpoint, rule) as proxy, CheckpointStore(
            url, _proxied(opts, proxy.endpoint), policy=policy) as a:
        _forgotten_and_started_again(url, opts, a, a_upto=3, force=False)
        call = ToolCall(id="k1", tool_name="pay", arguments={"amount": 100}, result="A paid 100",
                        timestamp=0.0)
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s2", call)  # was: StorageUnavailableError (access refused)
        assert denied.is_set()
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s2", call)  # the caller's retry: was v5 of B's run, acknowledged
    with CheckpointStore(url, opts) as b:
        assert b.storage.exists("runs/r/log/000000000004.ckpt")  # A's, not withdrawn
        loaded = b.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and b.last_load is not None
        assert b.last_load.version == 3 and b.get_tool_call_history("r", "s2") == []
        loaded.steps["s2"].status, loaded.steps["s2"].result = StepStatus.COMPLETED, "B's result"
        assert b.commit(loaded, [loaded.steps["s2"]]) == 5  # past A's record
    with CheckpointStore(url, opts) as fresh:
        again = fresh.load_run("r")
        assert again is not None and again.goal == "B's job" and again.steps["s2"].result == "B's result"
        assert fresh.get_tool_call_history("r", "s2") == []


# ------------------------------------------------------------- found by the fourth hostile re-read


def _b_untouched(url: str, opts: dict[str, Any] | None) -> None:
    with CheckpointStore(url, opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and fresh.last_load is not None
        assert fresh.last_load.version == 3 and loaded.steps["s2"].result is None
        assert fresh.get_tool_call_history("r", "s1") == []


@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_lost_race_against_a_new_run_of_the_id_does_not_rebase_a_paid_call_into_it(
        where: str, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    """A's paid call returns; its PUT of v3 collides with B's v3 (ConflictError before the
    base check), and `log_tool_call`'s rebase, taking it for a lost race, reloaded B's run and
    appended A's call there, acknowledged (the review's repro, 3 of 3). The dropped head now
    remembers which run it was: the reload finds another, RunNotFoundError, nothing written."""
    url, opts = (s3_url, s3_opts) if where == "s3" else (str(tmp_path / "store"), None)
    with CheckpointStore(url, opts, policy=CompactionPolicy(fence_seconds=2.0)) as a:
        _forgotten_and_started_again(url, opts, a)
        call = ToolCall(id="k1", tool_name="charge_card", arguments={"usd": 50}, result="ok",
                        timestamp=0.0)
        for _attempt in range(2):  # and the caller's retry
            with pytest.raises(RunNotFoundError, match="forgotten"):
                a.log_tool_call("r", "s1", call)  # was: acknowledged as v4 of B's run
        assert a.get_tool_call_history("r", "s1") == []  # a read of the id holds B's run
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s1", call)  # the read did not make B's run A's
    _b_untouched(url, opts)


@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_commit_retried_after_a_conflict_with_a_new_run_of_the_id_is_refused(
        where: str, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    """A's commit meets B's v3: ConflictError ("reload the run"). A retried the commit of its
    run object without a reload, and it was acknowledged as v4: A's goal and result over B's
    acknowledged state. Now RunNotFoundError until A loads the id."""
    url, opts = (s3_url, s3_opts) if where == "s3" else (str(tmp_path / "store"), None)
    with CheckpointStore(url, opts, policy=CompactionPolicy(fence_seconds=2.0)) as a:
        run_a = _forgotten_and_started_again(url, opts, a)
        run_a.steps["s1"].status, run_a.steps["s1"].result = StepStatus.COMPLETED, "A's result"
        with pytest.raises(ConflictError):
            a.commit(run_a, [run_a.steps["s1"]])
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.commit(run_a, [run_a.steps["s1"]])  # was: v4, B's run overwritten with A's
        _b_untouched(url, opts)
        reloaded = a.load_run("r")  # the caller's own load: A now works on B's run, knowingly
        assert reloaded is not None and reloaded.goal == "B's job"
        reloaded.steps["s2"].status, reloaded.steps["s2"].result = StepStatus.COMPLETED, "on B's"
        assert a.commit(reloaded, [reloaded.steps["s2"]]) == 4


@pytest.mark.parametrize("change", ["goal", "fresh-object"])
def test_a_lost_race_within_one_run_whose_birth_another_writer_changed_still_rebases(
        change: str, s3_url: str, s3_opts: dict[str, Any]) -> None:
    """The other side of the guard: two writers of one run, and B's commit changes what the
    guard compares: the goal, or the creation time (B saves a fresh AgentRun object under the
    id, as the seed API allows). B's record builds on A's base. A's plain commit conflicts (its
    head dropped), then its tool-log append reloads and lands: B's change alone is no new run
    (the chain still holds A's base). A first cut refused a changed creation time outright."""
    with CheckpointStore(s3_url, s3_opts) as a, CheckpointStore(s3_url, s3_opts) as b:
        run_a = _run()
        _commit_versions(a, run_a, 2)
        if change == "goal":
            run_b = b.load_run("r")
            assert run_b is not None
            run_b.goal = "a better goal"
        else:
            time.sleep(0.01)
            run_b = _run()  # another created_at
            run_b.goal = "a better goal"
            assert run_b.created_at != run_a.created_at
        run_b.steps["s1"].status, run_b.steps["s1"].result = StepStatus.COMPLETED, "by B"
        assert b.save_run(run_b) == 3
        run_a.steps["s2"].status, run_a.steps["s2"].result = StepStatus.COMPLETED, "by A"
        with pytest.raises(ConflictError):
            a.commit(run_a, [run_a.steps["s2"]])  # A's plain commit: reload first, as before
        call = ToolCall(id="k2", tool_name="search", arguments={}, result="r", timestamp=0.0)
        assert a.log_tool_call("r", "s2", call) == 4
    with CheckpointStore(s3_url, s3_opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "a better goal"
        assert [c.id for c in fresh.get_tool_call_history("r", "s2")] == ["k2"]


# ------------------------------------------------------------- found by the fifth hostile re-read


@pytest.mark.parametrize(("where", "read"), [("local", "history"), ("local", "summary"),
                                             ("local", "resumable"), ("local", "refresh"),
                                             ("s3", "summary")])
def test_a_read_of_the_new_run_does_not_make_it_the_old_writers(
        where: str, read: str, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    """After the forget and B's new run, A's store reads the id before A's paid call returns:
    its tool log, a summary, the resumable runs (a supervisor thread), a refresh. Each read
    seeded A's head from B's run, or cleared what the store remembered, and A's call landed in
    B's run, acknowledged (the review's repro, every time). Only the caller's load_run does."""
    url, opts = (s3_url, s3_opts) if where == "s3" else (str(tmp_path / "store"), None)
    with CheckpointStore(url, opts, policy=CompactionPolicy(fence_seconds=2.0)) as a:
        _forgotten_and_started_again(url, opts, a)
        if read == "history":
            assert a.get_tool_call_history("r", "s1") == []
        elif read == "summary":
            summary = a.run_summary("r")
            assert summary is not None and summary["goal"] == "B's job"
        elif read == "resumable":
            assert [s["goal"] for s in a.find_resumable_runs()] == ["B's job"]
        else:
            refreshed = a.refresh("r")
            assert refreshed is not None and refreshed.goal == "B's job"
        call = ToolCall(id="k1", tool_name="charge_card", arguments={"usd": 50}, result="ok",
                        timestamp=0.0)
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s1", call)  # was: acknowledged as v4 of B's run
        a.find_resumable_runs()  # a supervisor's listing meanwhile
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s1", call)  # the caller's retry
    _b_untouched(url, opts)


def test_a_slow_writer_whose_base_retention_took_rebases_past_a_changed_goal(tmp_path: Path) -> None:
    """Two writers of one run on local disk; B refines the goal and commits on, and retention
    (keep_last=1) takes every record below its newest snapshot, A's base among them. A's paid
    call meets BaseRemovedError, rebases, and found another goal and no base to check: refused
    as a forgotten run, its call never logged. A goal edited is no new run."""
    url = str(tmp_path / "store")
    policy = CompactionPolicy(keep_last=1, min_snapshot_bytes=0, superseded_grace=0, background=False)
    with CheckpointStore(url, policy=policy) as a, CheckpointStore(url, policy=policy) as b:
        run = _run()
        _commit_versions(a, run, 2)
        run_b = b.load_run("r")
        assert run_b is not None
        run_b.goal = "a refined goal"
        for i in range(6):
            run_b.steps["s1"].metadata["n"] = i
            b.commit(run_b, [run_b.steps["s1"]])
        b.apply_retention("r", keep_last=1)
        assert not (tmp_path / "store" / "runs" / "r" / "log" / f"{2:012d}.ckpt").exists()
        call = ToolCall(id="k1", tool_name="charge_card", arguments={"usd": 50}, result="ok",
                        timestamp=0.0)
        assert a.log_tool_call("r", "s0", call) == 9  # was: RunNotFoundError ("forgotten")
    with CheckpointStore(url) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "a refined goal"
        assert [c.id for c in fresh.get_tool_call_history("r", "s0")] == ["k1"]


# ------------------------------------------------------------- found by the sixth hostile re-read


def test_a_second_drop_keeps_the_run_the_writer_wrote_to(tmp_path: Path) -> None:
    """A read arms the guard (A's head remembered, B's run seeded); B commits on and its
    retention prunes the record that seeded head stood on; A's refresh then fails to catch up
    and dropped again, remembering B's head in place of A's: A's paid call landed in B's run
    (the review's repro, every time). The first head dropped is the one kept."""
    url = str(tmp_path / "store")
    with CheckpointStore(url) as a:
        run_a = _run()
        run_a.goal = "A's job"
        _commit_versions(a, run_a, 2)
        with CheckpointStore(url) as operator:
            assert forget(operator.storage, "r", force=True).deleted
        pruning = CompactionPolicy(keep_last=1, superseded_grace=0.0, min_snapshot_bytes=0,
                                   snapshot_ratio=0.01, background=False)
        with CheckpointStore(url, policy=pruning) as b:
            run_b = _run()
            run_b.goal = "B's job"
            _commit_versions(b, run_b, 3)
            summary = a.run_summary("r")
            assert summary is not None and summary["goal"] == "B's job"
            for i in range(3):
                run_b.steps["s0"].metadata["n"] = i
                b.commit(run_b, [run_b.steps["s0"]])
            b.apply_retention("r", keep_last=1)
            assert not (tmp_path / "store" / "runs" / "r" / "log" / f"{3:012d}.ckpt").exists()
        refreshed = a.refresh("r")
        assert refreshed is not None and refreshed.goal == "B's job"
        call = ToolCall(id="k1", tool_name="charge_card", arguments={"usd": 50}, result="ok",
                        timestamp=0.0)
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s1", call)  # was: acknowledged as v7 of B's run
    with CheckpointStore(url) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job"
        assert fresh.get_tool_call_history("r", "s1") == []


def test_a_lineage_check_that_fails_keeps_the_guard_for_the_retry(s3: EmbeddedS3) -> None:
    """A's paid call meets B's run (after a forget, past A's next version); the lineage check's
    GET of A's old base is refused once (403 at a proxy). The guard was taken out before that
    GET and not put back: the caller's retry, as a paid result's log record is retried, landed
    in B's run. It stays until the check answers."""
    url, opts = s3.url("lineage-fails"), s3.storage_options
    rule, denied = _deny_once_after_put(3, 2)  # the lineage check's GET of A's base v2, once

    with FaultProxy(s3.endpoint, rule) as proxy, CheckpointStore(
            url, _proxied(opts, proxy.endpoint), policy=CompactionPolicy(fence_seconds=2.0)) as a:
        run_a = _run()
        run_a.goal = "A's job"
        _commit_versions(a, run_a, 2)
        with CheckpointStore(url, opts) as operator:
            assert forget(operator.storage, "r", force=True).deleted
        every = CompactionPolicy(min_snapshot_bytes=0, snapshot_ratio=1e-9, background=False)
        with CheckpointStore(url, opts, policy=every) as b:  # a load of B's run reads its snapshot
            run_b = _run()
            run_b.goal = "B's job"
            _commit_versions(b, run_b, 4)
        call = ToolCall(id="k1", tool_name="charge_card", arguments={"usd": 50}, result="ok",
                        timestamp=0.0)
        with pytest.raises(StorageUnavailableError, match="access refused"):
            a.log_tool_call("r", "s1", call)
        assert denied.is_set()
        with pytest.raises(RunNotFoundError, match="forgotten"):
            a.log_tool_call("r", "s1", call)  # the retry: was acknowledged as v5 of B's run
    with CheckpointStore(url, opts) as fresh:
        loaded = fresh.load_run("r")
        assert loaded is not None and loaded.goal == "B's job" and fresh.last_load is not None
        assert fresh.last_load.version == 4 and fresh.get_tool_call_history("r", "s1") == []
