"""A slow, lossy network between the writers and S3: moto over real HTTP behind a loopback proxy
(`tests/_fault_proxy.py`) that delays requests, answers 503 SlowDown, and drops connections
*after* forwarding a request, so that a write lands while its client sees an error.

* A single writer whose conditional PUTs land with their replies lost: botocore retries them,
  the retry meets the writer's own object (412), and that must count as the success it is:
  every commit acknowledged, none refused as a conflict, the acknowledged run is what a fresh
  load reads, and no tool call is logged twice.
* Several worker processes with a short lease ttl and delayed requests, so that a holder's
  trust in its lease runs out while a paid call runs: the paid result is still logged (the
  store's fence decides whether it counts), and no call is paid for twice.

Run with: .venv/bin/python -m pytest tests/test_slow_network.py
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _fault_proxy import FaultProxy, Request, random_faults

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointedAgent, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.format.keys import log_key
from ckptfs.storage.base import PreconditionFailed, Storage
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage
from tests._forwarding import Forwarding

logger = logging.getLogger(__name__)

ROOT = str(Path(__file__).resolve().parent.parent)
RUN = "slow"


def _through(s3: EmbeddedS3, endpoint: str) -> dict[str, Any]:
    """Storage options that reach the moto server through the proxy at `endpoint`, with the SDK's
    default retries (what a user has): botocore itself retries what the proxy breaks."""
    return {**s3.storage_options,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": s3.region}}


def _lease_write(req: Request) -> bool:
    return req.method == "PUT" and "/lease/" in req.path


def test_a_single_writer_whose_writes_land_with_their_replies_lost_gets_every_commit(
        s3: EmbeddedS3, s3_url: str) -> None:
    steps = 40
    rule = random_faults(7, drop_after=0.10, error=0.03, drop_after_if=lambda r: r.method == "PUT")
    paid: Counter[str] = Counter()
    with FaultProxy(s3.endpoint, rule) as proxy:
        store = CheckpointStore(s3_url, _through(s3, proxy.endpoint))
        agent = CheckpointedAgent(store)
        run = agent.start_run("papers over a bad link",
                              [Step(id=f"p{i:03d}", title=f"paper {i}") for i in range(steps)],
                              run_id=RUN)

        def executor(step: Step, prior: list[ToolCall]) -> str:
            def llm(**_: Any) -> str:
                paid[step.id] += 1
                return f"summary of {step.id}"

            return str(agent.tools().run("llm", {"paper": step.id}, llm))

        done = agent.execute_run(run, executor)  # raised ConflictError on its own landed write
        store.close()
    dropped_logs = [p for m, p in proxy.landed_then_dropped if "/log/" in p]
    logger.info("proxy: %s; %d journal PUTs landed with their reply lost", dict(proxy.counts),
                len(dropped_logs))
    assert len(dropped_logs) >= 3 and proxy.counts["error"] >= 1  # the faults did happen

    assert done.status == "completed"
    fresh = CheckpointStore(s3_url, s3.storage_options)  # straight to the server, a new reader
    loaded = fresh.load_run(RUN)
    assert loaded is not None
    assert loaded.model_dump() == done.model_dump()  # what was acknowledged is what is stored
    assert paid == Counter({s: 1 for s in done.steps})
    for sid in done.steps:
        history = fresh.get_tool_call_history(RUN, sid)
        assert [(c.tool_name, c.phase) for c in history] == [("llm", "completed")], sid
    # the journal is unbroken up to the newest record: no commit was withdrawn
    versions = [int(k.rsplit("/", 1)[-1].split(".")[0]) for k in fresh.storage.list(f"runs/{RUN}/log/")]
    assert versions == list(range(versions[0], versions[-1] + 1))
    assert fresh.storage.exists(log_key(RUN, versions[-1] + 1)) is False
    fresh.close()


class _LandsThenDrops(Forwarding):
    """Every first conditional write per key lands, then fails as a dropped connection would."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.dropped: set[str] = set()

    def _drop_once(self, key: str) -> None:
        if key not in self.dropped:
            self.dropped.add(key)
            raise ConnectionResetError(104, "Connection reset by peer")

    def put_if_absent(self, key: str, data: bytes) -> str:
        etag = self.inner.put_if_absent(key, data)
        self._drop_once(key)
        return etag

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        new = self.inner.put_if_match(key, data, etag)
        self._drop_once(key + "#cas")
        return new


def test_retrying_storage_settles_a_conditional_write_whose_first_attempt_landed(
        tmp_path: Path) -> None:
    inner = open_storage(str(tmp_path / "s"))
    storage = RetryingStorage(_LandsThenDrops(inner), attempts=4, base_delay=0.001)
    etag = storage.put_if_absent("k/a", b"ours")  # raised FileExistsError for its own object
    assert inner.get_with_etag("k/a") == (b"ours", etag)
    new = storage.put_if_match("k/a", b"ours, renewed", etag)  # raised PreconditionFailed
    assert inner.get_with_etag("k/a") == (b"ours, renewed", new)
    assert storage.retries == 2
    # a refusal is still a refusal: someone else's object, or an etag moved on by someone else
    inner.put("k/b", b"theirs")
    try:
        storage.put_if_absent("k/b", b"ours")
    except FileExistsError:
        pass
    else:
        raise AssertionError("created over another writer's object")
    try:
        storage.put_if_match("k/b", b"ours", etag)
    except PreconditionFailed:
        pass
    else:
        raise AssertionError("replaced an object whose etag was not the one expected")
    assert inner.get("k/b") == b"theirs"


class _LandsThenConflicts(Forwarding):
    """The first journal record lands, then is reported as taken (as a retried PUT meeting its
    own object would be by a backend that cannot read it back)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.lied = False

    def put_if_absent(self, key: str, data: bytes) -> str:
        etag = self.inner.put_if_absent(key, data)
        if "/log/" in key and not self.lied:
            self.lied = True
            raise FileExistsError(key)
        return etag


def test_a_tool_call_rebased_onto_its_own_landed_record_is_logged_once(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    run = AgentRun(run_id=RUN, goal="g")
    run.add_step(Step(id="a", title="a"))
    with CheckpointStore(url) as st:
        st.save_run(run)
    liar = _LandsThenConflicts(open_storage(url))
    store = CheckpointStore(url, storage=liar)
    store.load_run(RUN)
    call = ToolCall(id="c1", tool_name="llm", arguments={"q": 1}, result="paid", cache_key="k")
    store.log_tool_call(RUN, "a", call)  # conflict, rebase onto its own record: logged it twice
    assert liar.lied
    assert [c.id for c in CheckpointStore(url).get_tool_call_history(RUN, "a")] == ["c1"]
    store.close()


def test_a_successor_replays_what_the_holder_it_replaced_logged_after_losing_the_lease(
        tmp_path: Path) -> None:
    """A's paid call is still running when B takes the step over (generation 2) and claims it.
    A's result comes back after that: refused as step state by the fence, it must still reach
    the tool log, and B, calling after it landed, must be served from the log, not pay again.
    Before: A dropped the result (its commit was refused), and B had read the log at its claim."""
    url = str(tmp_path / "s")
    run = AgentRun(run_id=RUN, goal="g")
    run.add_step(Step(id="a", title="a"))
    with CheckpointStore(url) as st:
        st.save_run(run)
    from ckptfs.runtime.worker import Worker

    shift = [0.0]
    wa = Worker(CheckpointStore(url), worker_id="A", lease_ttl=600)  # renews every 150 s: silent
    wb = Worker(CheckpointStore(url), worker_id="B", lease_ttl=600, poll_interval=0.02,
                clock=lambda: time.monotonic() + shift[0])
    paid: list[str] = []
    a_paying, b_running, a_done = threading.Event(), threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def exec_a(step: Step, prior: list[ToolCall]) -> str:
        def pay(**_: Any) -> str:
            paid.append("A")
            a_paying.set()
            assert b_running.wait(20)  # B took the step over while this call ran
            return "A's answer"

        return str(wa.tools().run("paid", {"q": 1}, pay))

    def exec_b(step: Step, prior: list[ToolCall]) -> str:
        b_running.set()
        assert a_done.wait(20)  # A's late result has landed (or was dropped)

        def pay(**_: Any) -> str:
            paid.append("B")
            return "B's answer"

        return f"{wb.tools().run('paid', {'q': 1}, pay)}, used by B"

    ta = threading.Thread(target=lambda: out.setdefault("a", wa.work(RUN, exec_a, max_steps=1)))
    ta.start()
    assert a_paying.wait(20)
    tb = threading.Thread(target=lambda: out.setdefault("b", wb.work(RUN, exec_b, max_steps=1)))
    tb.start()
    time.sleep(0.3)  # B has seen A's lease ...
    shift[0] = 1000.0  # ... and a full ttl passes on B's clock with no renewal: B takes over
    ta.join(30)
    a_done.set()
    tb.join(30)
    assert out["a"].lost == ["a"] and out["b"].completed == ["a"]
    assert paid == ["A"], f"paid by {paid}"
    final = CheckpointStore(url).load_run(RUN)
    assert final is not None and final.steps["a"].result == "A's answer, used by B"
    assert final.steps["a"].lease_generation == 2
    history = CheckpointStore(url).get_tool_call_history(RUN, "a")
    assert [(c.result, c.phase) for c in history] == [("A's answer", "completed")]
    for w in (wa, wb):
        w.store.close()


# ------------------------------------------------------------------- several worker processes

def _child(url: str, opts: str, wid: str, ttl: str, side: str, seed: str) -> None:
    """One worker process: each real paid call appends a line to `side` (O_APPEND, as a paid
    API bills it) and takes 0.3-0.8 s; prints its report as JSON."""
    from ckptfs.runtime.worker import Worker

    logging.basicConfig(level=logging.WARNING, format=f"{wid} %(name)s %(message)s")
    rng = random.Random(int(seed))
    store = CheckpointStore(url, json.loads(opts))
    worker = Worker(store, worker_id=wid, lease_ttl=float(ttl), poll_interval=0.1)
    late = [0]  # paid calls that came back after this holder's trust in its lease ran out

    def executor(step: Step, prior: list[ToolCall]) -> str:
        def pay(**_: Any) -> str:
            fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"paid {step.id} {wid}\n".encode())
            finally:
                os.close(fd)
            time.sleep(rng.uniform(0.3, 0.8))
            hb = worker._beats.get((RUN, step.id))
            if hb is not None and not worker.leases.valid(hb.lease):
                late[0] += 1
            return f"answer for {step.id}"

        return f"{worker.tools().run('paid', {'step': step.id}, pay)} by {wid}"

    report = worker.work(RUN, executor, idle_timeout=30)
    print(json.dumps({"completed": report.completed, "lost": report.lost, "late": late[0],
                      "status": report.run_status}), flush=True)
    store.close()


def test_workers_whose_lease_trust_runs_out_mid_call_never_pay_a_call_twice(
        s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    steps, workers, ttl = 32, 4, 2.0
    run = AgentRun(run_id=RUN, goal="many hands, slow link")
    for i in range(steps):
        run.add_step(Step(id=f"s{i:03d}", title=f"step {i}"))
    with CheckpointStore(s3_url, s3.storage_options) as st:
        st.save_run(run)
    side = tmp_path / "paid.log"
    # Writes of lease objects (creates, renewals, releases) are slow: often 1.0-1.3 s, so that a
    # holder's trust (0.8 ttl from sending its last write) runs out while its call runs. Never
    # slower than that: a contender takes a lease over only after seeing it unchanged for a
    # full ttl, which these delays alone cannot produce (a renewal follows the last one within
    # ttl/4 + 1.3 s < ttl). So no call is ever in flight at two holders, and a call paid twice
    # is a result that was not logged. Other requests are now and then slow too.
    slow_lease = random_faults(3, delay=0.5, delay_range=(1.0, 1.3))
    other = random_faults(4, delay=0.1, delay_range=(0.2, 0.6))
    rule = lambda req: (slow_lease if _lease_write(req) else other)(req)  # noqa: E731
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT}/tests"}
    t0 = time.monotonic()
    with FaultProxy(s3.endpoint, rule) as proxy:
        opts = json.dumps(_through(s3, proxy.endpoint))
        procs = [subprocess.Popen([sys.executable, __file__, "child", s3_url, opts, f"w{i}", str(ttl),
                                   str(side), str(100 + i)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                 for i in range(workers)]
        outs = [p.communicate(timeout=120) for p in procs]
    elapsed = time.monotonic() - t0
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]  # no process killed, none crashed
    reports = [json.loads(out) for out, _ in outs]
    paid = Counter(line.split()[1] for line in side.read_text().splitlines())
    twice = {sid: n for sid, n in paid.items() if n > 1}
    late = sum(r["late"] for r in reports)
    logger.info("%d steps, %d workers, %.1fs; proxy %s; %d paid results came back after the "
                "holder's lease trust ran out; %d step attempts lost their lease; paid twice: %s",
                steps, workers, elapsed, dict(proxy.counts), late,
                sum(len(r["lost"]) for r in reports), twice)
    final = CheckpointStore(s3_url, s3.storage_options).load_run(RUN)
    assert final is not None and final.status == "completed"
    assert all(s.status == StepStatus.COMPLETED for s in final.steps.values())
    assert late >= 1, "the network was not slow enough to let a lease's trust run out mid-call"
    assert twice == {}, f"paid twice: {twice}"
    assert sorted(paid) == sorted(final.steps)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    _child(*sys.argv[2:8])
