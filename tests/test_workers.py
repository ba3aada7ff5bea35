"""Several workers share one run through one bucket (moto over real HTTP, and local disk):
each step runs once, a SIGKILLed worker's step is taken over without repeating its paid call,
and a SIGSTOPped worker that wakes up after losing its lease cannot overwrite its successor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.format.keys import lease_key
from ckptfs.runtime.policy import RetryPolicy
from ckptfs.runtime.worker import NOT_BEFORE, Worker

CHILD = str(Path(__file__).with_name("_child_worker.py"))
ROOT = str(Path(__file__).resolve().parent.parent)


def _graph(n: int = 12) -> AgentRun:
    """Three layers: 4 independent fetches, 4 reads each needing two fetches, then 4 merges."""
    run = AgentRun(run_id="shared", goal="papers, many hands")
    for i in range(n):
        layer, k = divmod(i, 4)
        deps = [] if layer == 0 else [f"s{(layer - 1) * 4 + k:02d}", f"s{(layer - 1) * 4 + (k + 1) % 4:02d}"]
        run.add_step(Step(id=f"s{i:02d}", title=f"step {i}", dependencies=deps))
    return run


def _start(url: str, opts: dict[str, Any]) -> None:
    with CheckpointStore(url, opts) as st:
        st.save_run(_graph())


def test_three_workers_share_a_run_over_s3_each_step_once(s3: EmbeddedS3, s3_url: str) -> None:
    opts = s3.storage_options
    _start(s3_url, opts)
    billed: Counter[str] = Counter()
    lock = threading.Lock()
    reports = []

    def work(wid: str) -> None:
        store = CheckpointStore(s3_url, opts)
        worker = Worker(store, worker_id=wid, lease_ttl=5, poll_interval=0.05)

        def executor(step: Step, prior: list[ToolCall]) -> str:
            def pay(**_: Any) -> str:
                with lock:
                    billed[step.id] += 1
                time.sleep(0.05)
                return f"paper {step.id}"

            got = worker.tools().run("llm", {"step": step.id}, pay)
            return f"{got} read by {wid}"

        reports.append(worker.work("shared", executor, idle_timeout=30))
        store.close()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    run = CheckpointStore(s3_url, opts).load_run("shared")
    assert run is not None and run.status == "completed"
    assert all(s.status == StepStatus.COMPLETED for s in run.steps.values())
    assert billed == Counter({sid: 1 for sid in run.steps})  # each paid call made once
    done = [sid for r in reports for sid in r.completed]
    assert sorted(done) == sorted(run.steps)  # each step completed by exactly one worker
    assert len({r.worker_id for r in reports if r.completed}) >= 2  # the work was shared
    for s in run.steps.values():
        assert s.result is not None and s.result.startswith(f"paper {s.id} read by w")
        assert s.attempt_count == 1 and s.lease_generation == 1
        for d in s.dependencies:  # nothing started before what it needs was done
            assert run.steps[d].completed_at is not None and s.started_at is not None
            assert run.steps[d].completed_at <= s.started_at


def test_workers_add_what_their_steps_spent_to_the_runs_totals(tmp_path: Path) -> None:
    """The run's tokens and cost stayed 0 when workers ran it (only the agent counted them; a
    hostile review): each worker's completion now adds its attempt's spend, in the same record,
    against the version it extends, so three writers racing never overwrite each other's."""
    from ckptfs.runtime.execution import StepResult

    url = str(tmp_path / "store")
    _start(url, {})

    def work(wid: str) -> None:
        with CheckpointStore(url) as store:
            worker = Worker(store, worker_id=wid, lease_ttl=5, poll_interval=0.01)
            worker.work("shared", lambda step, prior: StepResult(f"{step.id} by {wid}", tokens=6,
                                                                 cost_usd=0.25), idle_timeout=30)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    run = CheckpointStore(url).load_run("shared")
    assert run is not None and run.status == "completed"
    assert sum(s.tokens for s in run.steps.values()) == 6 * len(run.steps)
    assert (run.total_tokens, run.total_cost_usd) == (6 * len(run.steps), 0.25 * len(run.steps))
    cli = str(Path(sys.executable).parent / "ckptfs")
    shown = subprocess.run([cli, "show", url, "shared", "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(shown.stdout)["totals"]["tokens"] == 6 * len(run.steps), shown.stdout[-300:]


def test_a_worker_fails_a_step_whose_paid_result_was_refused_at_once_paying_once(tmp_path: Path) -> None:
    """A paid call returns NaN: the store refuses the result and logs the call `unkept`. The
    agent stops the run there; a Worker retried it attempt after attempt (each meeting the same
    refusal, paying nothing, burning the attempts): now the step fails at once, saying why."""
    url = str(tmp_path / "store")
    run = AgentRun(run_id="nan", goal="g")
    run.add_step(Step(id="a", title="a"))
    with CheckpointStore(url) as st:
        st.save_run(run)
    paid: list[str] = []
    with CheckpointStore(url) as store:
        worker = Worker(store, worker_id="w", lease_ttl=5, poll_interval=0.01,
                        retry=RetryPolicy(max_attempts=5, base_delay=0.0, jitter=0.0))

        def executor(step: Step, prior: list[ToolCall]) -> str:
            worker.tools().run("paid", {"q": step.id}, lambda q: paid.append(q) or {"v": float("nan")})
            return "never"

        worker.work("nan", executor, idle_timeout=10)
    done = CheckpointStore(url).load_run("nan")
    assert done is not None
    step = done.steps["a"]
    assert paid == ["a"]
    assert step.status == StepStatus.FAILED and step.attempt_count <= 2, (step.status, step.attempt_count)
    assert "could not keep its result" in (step.error or ""), step.error


def test_a_worker_records_an_error_naming_an_odd_file(tmp_path: Path) -> None:
    """Worker._failed kept the message raw: a lone surrogate (a file name that is not UTF-8)
    made each commit of the failure refused, so the step never failed in the store."""
    url = str(tmp_path / "store")
    run = AgentRun(run_id="odd", goal="g")
    run.add_step(Step(id="a", title="a"))
    with CheckpointStore(url) as st:
        st.save_run(run)
    odd = b"\xff".decode("utf-8", "surrogateescape")

    def executor(step: Step, prior: list[ToolCall]) -> str:
        raise OSError(f"cannot read {odd}")

    with CheckpointStore(url) as store:
        worker = Worker(store, worker_id="w", lease_ttl=5, poll_interval=0.01,
                        retry=RetryPolicy(max_attempts=2, base_delay=0.0, jitter=0.0))
        worker.work("odd", executor, idle_timeout=10)
    done = CheckpointStore(url).load_run("odd")
    assert done is not None and done.status == "completed_with_errors"
    assert done.steps["a"].status == StepStatus.FAILED and done.steps["a"].attempt_count == 2
    assert done.steps["a"].error == "OSError: cannot read \\udcff"


def _spawn(url: str, opts: dict[str, Any], wid: str, ttl: float, side: Path, slow: str,
           nap: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen([sys.executable, CHILD, url, json.dumps(opts), wid, str(ttl), str(side),
                             slow, str(nap)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def _wait_for(side: Path, line: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if side.exists() and line in side.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError(f"no {line!r} in {side}")


def test_a_killed_workers_step_is_taken_over_without_paying_twice(
        shared_url: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, opts = shared_url
    _start(url, opts)
    side = tmp_path / "side.log"
    a = _spawn(url, opts, "a", 1.0, side, "s05", 30)
    _wait_for(side, "started s05 a", a)
    a.send_signal(signal.SIGKILL)  # mid-step, lease held, paid call already logged
    a.wait()
    b = _spawn(url, opts, "b", 1.0, side, "none", 0)
    out, err = b.communicate(timeout=120)
    assert b.returncode == 0, err
    report = json.loads(out)
    assert report["status"] == "completed" and "s05" in report["completed"]
    run = CheckpointStore(url, opts).load_run("shared")
    assert run is not None and run.status == "completed"
    s05 = run.steps["s05"]
    assert s05.result == "answer for s05 by b"
    assert s05.attempt_count == 2 and s05.lease_generation == 2  # taken over, fenced
    paid = Counter(line.split()[1] for line in side.read_text().splitlines() if line.startswith("paid"))
    assert paid == Counter({sid: 1 for sid in run.steps})  # s05's call was served from the log
    assert "taking over generation 1 from a" in err


def test_a_stopped_worker_that_wakes_up_late_is_fenced_off(
        shared_url: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, opts = shared_url
    _start(url, opts)
    side = tmp_path / "side.log"
    a = _spawn(url, opts, "a", 1.0, side, "s05", 1.5)
    _wait_for(side, "started s05 a", a)
    a.send_signal(signal.SIGSTOP)  # a suspended VM: its heartbeat stops too
    try:
        b = _spawn(url, opts, "b", 1.0, side, "none", 0)
        out_b, err_b = b.communicate(timeout=120)
    finally:
        a.send_signal(signal.SIGCONT)
    assert b.returncode == 0, err_b
    assert json.loads(out_b)["status"] == "completed"
    out_a, err_a = a.communicate(timeout=60)
    assert a.returncode == 0, err_a
    report_a = json.loads(out_a)
    assert "s05" in report_a["lost"] and "s05" not in report_a["completed"]
    assert "lost the lease of step 's05' (generation 1)" in err_a
    run = CheckpointStore(url, opts).load_run("shared")
    assert run is not None and run.status == "completed"
    assert run.steps["s05"].result == "answer for s05 by b"  # a's late result was refused
    assert run.steps["s05"].lease_generation == 2


def test_retry_then_failure_skips_dependants_and_finishes_the_run(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _start(url, {})
    store = CheckpointStore(url)
    worker = Worker(store, worker_id="solo", lease_ttl=5, poll_interval=0.01,
                    retry=RetryPolicy(max_attempts=2, base_delay=0.05, give_up_on=(ValueError,)))

    class RateLimited(Exception):
        retry_after = 0.2

    seen: Counter[str] = Counter()
    seen_not_before: list[Any] = []

    def executor(step: Step, prior: list[ToolCall]) -> str:
        seen[step.id] += 1
        if step.id == "s01" and seen[step.id] == 1:
            raise RateLimited("429")
        if step.id == "s01":
            seen_not_before.append(step.metadata.get(NOT_BEFORE))
        if step.id == "s02":
            raise ValueError("this paper is unreadable")
        return "ok"

    t0 = time.time()
    report = worker.work("shared", executor)
    run = store.load_run("shared")
    assert run is not None and run.status == "completed_with_errors"
    assert report.retried == ["s01"] and report.failed == ["s02"]
    s01 = run.steps["s01"]
    assert s01.status == StepStatus.COMPLETED and s01.attempt_count == 2
    assert seen_not_before == [None] and s01.started_at is not None and s01.started_at >= t0 + 0.2
    assert run.steps["s02"].status == StepStatus.FAILED and run.steps["s02"].attempt_count == 1
    # s02 feeds s05 and s06 (layer 1), which feed s08, s09, s10 (layer 2): all skipped
    skipped = sorted(sid for sid, s in run.steps.items() if s.status == StepStatus.SKIPPED)
    assert skipped == ["s05", "s06", "s08", "s09", "s10"]
    assert all(run.steps[sid].status == StepStatus.COMPLETED
               for sid in run.steps if sid not in skipped and sid != "s02")
    # every lease was handed back: another worker could start at once
    for sid in run.steps:
        if run.steps[sid].lease_generation:
            assert json.loads(store.storage.get(lease_key("shared", sid)))["released"] is True
    store.close()


def test_no_paid_call_once_the_lease_is_no_longer_trusted(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _start(url, {})
    now = [1000.0]
    store = CheckpointStore(url)
    worker = Worker(store, worker_id="w", lease_ttl=600, clock=lambda: now[0])
    calls: list[str] = []

    def executor(step: Step, prior: list[ToolCall]) -> str:
        worker.tools().run("llm", {"n": 1}, lambda **_: calls.append(step.id))
        now[0] += 600 * 0.9  # a long pause: the lease's trusted time is over, no renewal came
        worker.tools().run("llm", {"n": 2}, lambda **_: calls.append(step.id))
        return "never"

    report = worker.work("shared", executor, max_steps=1, idle_timeout=0)
    assert len(calls) == 1 and report.lost == [calls[0]] and not report.completed
    run = store.load_run("shared")
    assert run is not None and run.steps[calls[0]].status == StepStatus.RUNNING  # for a successor
    store.close()


@pytest.mark.parametrize("durable", [False, True])
def test_the_claim_rides_on_the_first_durable_write_unless_attempts_must_be_durable(
        tmp_path: Path, durable: bool) -> None:
    url = str(tmp_path / "s")
    _start(url, {})
    store = CheckpointStore(url)
    worker = Worker(store, worker_id="w", lease_ttl=30, durable_attempts=durable)
    seen: list[tuple[str, int, int]] = []
    before = len(store.list_versions("shared"))

    def executor(step: Step, prior: list[ToolCall]) -> str:
        stored = CheckpointStore(url).load_run("shared").steps[step.id]  # type: ignore[union-attr]
        seen.append((stored.status.value, stored.attempt_count, stored.lease_generation))
        worker.tools().run("llm", {"s": step.id}, lambda **_: "paid")
        return "ok"

    report = worker.work("shared", executor, max_steps=1, idle_timeout=0)
    assert len(report.completed) == 1
    if durable:  # RUNNING, attempt 1, fenced, before the executor ran; then call, outcome
        assert seen == [("running", 1, 1)]
        assert len(store.list_versions("shared")) - before == 3
    else:  # nothing written before the first call; the claim went with the call's record
        assert seen == [("pending", 0, 0)]
        assert len(store.list_versions("shared")) - before == 2
    done = store.load_run("shared").steps[report.completed[0]]  # type: ignore[union-attr]
    assert (done.attempt_count, done.lease_generation) == (1, 1)
    assert [c.result for c in store.get_tool_call_history("shared", done.id)] == ["paid"]
    store.close()


def test_the_workers_example_holds_its_claims(tmp_path: Path) -> None:
    """examples/workers.py: three worker processes on the embedded S3 server, one SIGKILLed.
    It left its ckptfs-workers-* directory (the bill of calls) in /tmp on every run."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(Path(ROOT) / "examples" / "workers.py"), "--papers", "30",
                           "--latency", "0.1"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(tmp_path.glob("ckptfs-workers-*")) == []
    assert "[FAILED]" not in proc.stdout and proc.stdout.count("[ok]") == 5
    assert "taken over (lease generation 2" in proc.stdout
