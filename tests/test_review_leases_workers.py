"""Review regressions for multi-worker runs (leases.py, worker.py, store.commit_step).

Each test fails on the code as reviewed (commit e8ff80e): a paid call repeated because its log
write lost a race with another worker's commit, a stale view of a step that bypasses a retry's
not-before time and re-runs a step that had failed for good, a worker killed by ConflictError
after ten rebases, and a renewal whose reply was lost taken for a lost lease.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path
from typing import Any

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.errors import StorageUnavailableError
from ckptfs.format.keys import lease_key
from ckptfs.runtime.policy import RetryPolicy
from ckptfs.runtime.worker import NOT_BEFORE, Worker
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from ckptfs.store.leases import Heartbeat, LeaseManager
from tests._forwarding import Forwarding


def _save(url: str, *ids: str) -> None:
    run = AgentRun(run_id="r", goal="review")
    for sid in ids:
        run.add_step(Step(id=sid, title=sid))
    with CheckpointStore(url) as st:
        st.save_run(run)


def test_a_paid_call_logged_while_another_worker_commits_is_paid_once(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _save(url, "a", "b")
    wa = Worker(CheckpointStore(url), worker_id="A", lease_ttl=30, poll_interval=0.01)
    wb = Worker(CheckpointStore(url), worker_id="B", lease_ttl=30, poll_interval=0.01)
    billed: list[str] = []

    def exec_a(step: Step, prior: list[ToolCall]) -> str:
        if not billed:  # meanwhile another worker takes the other step: a commit A has not seen
            wb.work("r", lambda s, p: "b done", max_steps=1)

        def pay(**_: Any) -> str:
            billed.append(step.id)
            return "paid"

        return str(wa.tools().run("llm", {"step": step.id}, pay))

    wa.work("r", exec_a, idle_timeout=1)
    run = CheckpointStore(url).load_run("r")
    assert run is not None and run.status == "completed"
    assert sorted(billed) == sorted(set(billed))  # each step's paid call made once
    assert all(s.attempt_count == 1 for s in run.steps.values())


class _RateLimited(Exception):
    retry_after = 60.0


def _stale_pair(url: str, policy: RetryPolicy) -> tuple[Worker, Worker]:
    wa = Worker(CheckpointStore(url), worker_id="A", lease_ttl=30, retry=policy)
    wb = Worker(CheckpointStore(url), worker_id="B", lease_ttl=30, retry=policy, poll_interval=0.01)
    return wa, wb


def _before_b_acquires(wb: Worker, action: Any) -> None:
    """Run `action` once, after B loaded the run and before B acquires a lease."""
    orig = wb.leases.acquire
    done: list[bool] = []

    def acquire(run_id: str, step_id: str, **kw: Any) -> Any:
        if not done:
            done.append(True)
            action()
        return orig(run_id, step_id, **kw)

    wb.leases.acquire = acquire  # type: ignore[method-assign]


def test_a_retry_not_before_is_honoured_by_a_worker_with_a_stale_view(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _save(url, "a")
    wa, wb = _stale_pair(url, RetryPolicy(max_attempts=3))
    starts: list[float] = []

    def executor(step: Step, prior: list[ToolCall]) -> str:
        starts.append(time.time())
        raise _RateLimited("429: come back in a minute")

    _before_b_acquires(wb, lambda: wa.work("r", executor, max_steps=1))
    wb.work("r", executor, max_steps=1, idle_timeout=0.3)
    run = CheckpointStore(url).load_run("r")
    assert run is not None
    assert len(starts) == 1, "B started the step again before the 60 s the 429 asked for"
    assert run.steps["a"].metadata[NOT_BEFORE] > time.time() + 50


def test_a_step_failed_for_good_is_not_run_again_by_a_stale_worker(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _save(url, "a")
    wa, wb = _stale_pair(url, RetryPolicy(max_attempts=1))
    calls: list[str] = []

    def executor(step: Step, prior: list[ToolCall]) -> str:
        calls.append(step.id)
        if len(calls) == 1:
            raise ValueError("unreadable")
        return "fine the second time"

    _before_b_acquires(wb, lambda: wa.work("r", executor, idle_timeout=0.2))
    wb.work("r", executor, idle_timeout=0.2)
    run = CheckpointStore(url).load_run("r")
    assert run is not None and run.status == "completed_with_errors"
    assert calls == ["a"], "a FAILED step of a finished run was run again"
    assert run.steps["a"].status == StepStatus.FAILED


def test_a_worker_outlasts_more_than_ten_conflicting_commits(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _save(url, "a", "other")
    w = Worker(CheckpointStore(url), worker_id="W", lease_ttl=30, poll_interval=0.01)
    inner = w.store.storage
    interfere = [12]  # another worker commits just before each of W's next 12 log writes
    real_put_if_absent = inner.put_if_absent

    def put_if_absent(key: str, data: bytes) -> str:
        if "/log/" in key and interfere[0] > 0:
            interfere[0] -= 1
            with CheckpointStore(url) as other:  # a fresh head: its own commit always lands
                call = ToolCall(id=f"x{interfere[0]}", tool_name="t", arguments={})
                other.log_tool_call("r", "other", call)
        return real_put_if_absent(key, data)

    inner.put_if_absent = put_if_absent  # type: ignore[method-assign]
    # commits come through put_if_absent_beside on disk: its general form calls the patch
    inner.put_if_absent_beside = functools.partial(  # type: ignore[method-assign]
        Storage.put_if_absent_beside, inner)
    report = w.work("r", lambda s, p: "ok", max_steps=1)  # raised ConflictError before
    assert len(report.completed) == 1 and interfere == [0]
    run = CheckpointStore(url).load_run("r")
    assert run is not None and run.steps[report.completed[0]].status == StepStatus.COMPLETED


class _ReplyLostOnce(Forwarding):
    """The first CAS (a heartbeat renewal) lands, but its reply is lost: ConnectionError."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.cas = 0

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        out = self.inner.put_if_match(key, data, etag)
        self.cas += 1
        if self.cas == 1:
            raise StorageUnavailableError("timed out reading the response")
        return out


def test_a_renewal_whose_reply_was_lost_does_not_lose_the_lease(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s"))
    m = LeaseManager(_ReplyLostOnce(storage), "m", ttl=2.0)
    lease = m.acquire("r1", "s1")
    assert lease is not None
    with Heartbeat(m, lease, interval=0.05) as hb:
        threading.Event().wait(0.5)
        assert hb.lost is None, f"the heartbeat gave up a lease nobody else wrote: {hb.lost}"
        held = hb.check()
    assert m.release(held) is True
    assert json.loads(storage.get(lease_key("r1", "s1")))["released"] is True
