"""Hostile review: worker processes sharing one run on S3 (moto over real HTTP) behind the fault
proxy (`tests/_fault_proxy.py`): 503 bursts, writes that land with their replies lost, slow lease
renewals. Every real paid call appends a line to a side file (O_APPEND, as a paid API bills it);
no (step, args) may be paid twice while every worker is alive.

* A burst of 503s on the journal PUT carrying a paid call's record, longer than the S3 client's
  own retries: the worker gave the record up, the StorageUnavailableError failed the attempt,
  the step went back to PENDING (that commit landed a moment later) and the next attempt paid
  the call again. Now the record is written again until the store answers (worker.py
  `_until_logged`), and a write that had landed with its reply lost is recognised as ours.

Run with: .venv/bin/python -m pytest tests/test_review_workers_s3_faults.py
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from _fault_proxy import Fault, FaultProxy, Request

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall

ROOT = str(Path(__file__).resolve().parent.parent)
RUN = "faulty"
CLI = str(Path(sys.executable).parent / "ckptfs")


def _child(url: str, opts: str, wid: str, ttl: str, side: str) -> None:
    """One worker process: each step makes two paid calls (a line each in `side`) and reports
    7 tokens and $0.5; prints its report as JSON."""
    from ckptfs.runtime.execution import StepResult
    from ckptfs.runtime.policy import RetryPolicy
    from ckptfs.runtime.worker import Worker

    logging.basicConfig(level=logging.WARNING, format=f"{wid} %(name)s %(message)s")
    store = CheckpointStore(url, json.loads(opts))
    worker = Worker(store, worker_id=wid, lease_ttl=float(ttl), poll_interval=0.05,
                    retry=RetryPolicy(max_attempts=5, base_delay=0.05, jitter=0.0))

    def executor(step: Step, prior: list[ToolCall]) -> StepResult:
        def pay(step: str, n: int) -> str:
            fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"paid {step} {n} {wid}\n".encode())
            finally:
                os.close(fd)
            return f"answer {step} {n}"

        got = [worker.tools().run("paid", {"step": step.id, "n": n}, pay) for n in range(2)]
        return StepResult(f"{got} by {wid}", tokens=7, cost_usd=0.5)

    report = worker.work(RUN, executor, idle_timeout=30)
    print(json.dumps({"completed": report.completed, "lost": report.lost, "retried": report.retried,
                      "status": report.run_status}), flush=True)
    store.close()


def _save(s3: EmbeddedS3, url: str, n: int) -> None:
    run = AgentRun(run_id=RUN, goal="paid calls over a bad link")
    for i in range(n):
        run.add_step(Step(id=f"s{i:02d}", title=f"step {i}"))
    with CheckpointStore(url, s3.storage_options) as st:
        st.save_run(run)


def _opts(s3: EmbeddedS3, endpoint: str, wid: str) -> dict[str, Any]:
    """Through the proxy; the worker's id in its User-Agent so a rule can pick its requests;
    two attempts per request (a user's `config_kwargs.retries`, kept by ckptfs), so a burst of
    two 503s is one request that fails past the client's retries."""
    return {**s3.storage_options,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": s3.region},
            "config_kwargs": {"user_agent_extra": f"ckptfs-review-{wid}",
                              "retries": {"mode": "standard", "total_max_attempts": 2}}}


def _workers(s3: EmbeddedS3, url: str, proxy: FaultProxy, side: Path, ids: list[str],
             ttl: float) -> list[tuple[int, dict[str, Any], str]]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT}/tests"}
    procs = [subprocess.Popen([sys.executable, __file__, "child", url,
                               json.dumps(_opts(s3, proxy.endpoint, wid)), wid, str(ttl), str(side)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=ROOT) for wid in ids]
    outs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, json.loads(out) if p.returncode == 0 else {}, err)
            for p, (out, err) in zip(procs, outs, strict=True)]


def _check_run(s3: EmbeddedS3, url: str, side: Path, n: int) -> None:
    """Each (step, n) paid once, the run completed, verify clean, show's totals not doubled."""
    paid = Counter(tuple(line.split()[1:3]) for line in side.read_text().splitlines())
    twice = {k: v for k, v in paid.items() if v > 1}
    assert twice == {}, f"paid twice: {twice}"
    assert sorted(paid) == sorted((f"s{i:02d}", str(k)) for i in range(n) for k in range(2))
    with CheckpointStore(url, s3.storage_options) as st:
        run = st.load_run(RUN)
        assert run is not None and run.status == "completed"
        assert all(s.status == StepStatus.COMPLETED for s in run.steps.values())
        for sid in run.steps:
            logged = [(c.arguments["n"], c.phase) for c in st.get_tool_call_history(RUN, sid)]
            assert sorted(logged) == [(0, "completed"), (1, "completed")], (sid, logged)
        assert (run.total_tokens, run.total_cost_usd) == (7 * n, 0.5 * n)
    env = {**os.environ, "CKPTFS_STORAGE_OPTIONS": json.dumps(s3.storage_options)}
    verified = subprocess.run([CLI, "verify", url], capture_output=True, text=True, env=env, timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    shown = subprocess.run([CLI, "show", url, RUN, "--json"], capture_output=True, text=True, env=env,
                           timeout=60)
    totals = json.loads(shown.stdout)["totals"]
    assert (totals["tokens"], totals["cost_usd"], totals["tool_calls"]) == (7 * n, 0.5 * n, 2 * n)
    assert totals["by_status"] == {"completed": n}


class _BurstAfterPaid:
    """503 ServiceUnavailable for `burst` journal PUTs of the worker that paid the first call,
    from then on: one request failing past the client's retries. With `land_first`, the first
    of them is forwarded and its reply dropped instead: the record landed, the client saw an
    error, and its retries then fail too."""

    def __init__(self, side: Path, burst: int, *, land_first: bool = False) -> None:
        self.side, self.left, self.land_first = side, burst, land_first
        self.payer: str | None = None
        self.lock = threading.Lock()

    def __call__(self, req: Request) -> Fault | None:
        if req.method != "PUT" or "/log/" not in req.path:
            return None
        with self.lock:
            if self.payer is None and self.side.exists():
                first = self.side.read_text().split("\n", 1)[0].split()
                self.payer = first[3] if len(first) == 4 else None
            if self.payer is None or self.left == 0:
                return None
            if f"ckptfs-review-{self.payer}" not in req.headers.get("User-Agent", ""):
                return None
            self.left -= 1
            if self.land_first:
                self.land_first = False
                return Fault(drop="after")
            return Fault(status=503, code="ServiceUnavailable")


def test_a_503_burst_on_a_paid_calls_record_does_not_get_the_call_paid_again(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    """Before: `paid twice: {('s..', '0'): 2}`, the step's attempt 1 'failed
    (StorageUnavailableError ... ServiceUnavailable)' and went back to PENDING, both workers alive."""
    n, side = 4, tmp_path / "paid.log"
    _save(s3, s3_url, n)
    rule = _BurstAfterPaid(side, 2)
    with FaultProxy(s3.endpoint, rule) as proxy:
        results = _workers(s3, s3_url, proxy, side, ["w0", "w1"], ttl=10)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    assert rule.left == 0 and proxy.counts["error"] == 2  # the burst did happen
    _check_run(s3, s3_url, side, n)
    payer = results[int(str(rule.payer)[1:])][1]
    assert payer["retried"] == [], payer  # no attempt failed for it


def test_a_paid_calls_record_that_landed_with_its_reply_lost_then_503s_is_kept_once(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    """The record (carrying the step's claim) lands, its reply is lost and the client's retry
    gets a 503: the worker must find its own record, not pay again, and not take the claim it
    made for another holder's (a retried claim is refused by its own generation)."""
    n, side = 3, tmp_path / "paid.log"
    _save(s3, s3_url, n)
    rule = _BurstAfterPaid(side, 3, land_first=True)
    with FaultProxy(s3.endpoint, rule) as proxy:
        results = _workers(s3, s3_url, proxy, side, ["w0", "w1"], ttl=10)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    assert rule.left == 0 and proxy.counts["drop-after"] == 1 and proxy.counts["error"] == 2
    _check_run(s3, s3_url, side, n)
    payer = results[int(str(rule.payer)[1:])][1]
    assert payer["retried"] == [] and payer["lost"] == [], payer


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    _child(*sys.argv[2:7])
