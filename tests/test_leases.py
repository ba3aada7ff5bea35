"""Leases on local disk and on S3 over real HTTP (moto): exclusive create, observed expiry,
CAS takeover with a rising generation, and the store's fence that rejects a stalled holder."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import ConfigError, LeaseLostError, StepCompletedError
from ckptfs.format.keys import lease_key
from ckptfs.storage.base import PreconditionFailed, Storage
from ckptfs.storage.registry import open_storage
from ckptfs.store.leases import SAFETY, Heartbeat, LeaseManager
from tests._forwarding import Forwarding


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def storage(shared_url: tuple[str, dict[str, Any]]) -> Storage:
    return open_storage(*shared_url)


def test_a_held_lease_is_taken_over_only_after_a_full_ttl_unchanged(storage: Storage) -> None:
    clock = Clock()
    a = LeaseManager(storage, "worker-a", ttl=10, clock=clock)
    b = LeaseManager(storage, "worker-b", ttl=10, clock=clock)
    la = a.acquire("r1", "s1")
    assert la is not None and la.generation == 1 and la.holder == "worker-a"
    assert la.deadline == pytest.approx(clock.now + 10 * SAFETY)
    assert b.acquire("r1", "s1") is None  # first sight: the clock starts now
    clock.now += 9.9
    assert b.acquire("r1", "s1") is None
    la = a.renew(la)  # a renewal changes the etag: b's observation starts over
    clock.now += 5
    assert b.acquire("r1", "s1") is None
    clock.now += 9.99
    assert b.acquire("r1", "s1") is None
    clock.now += 0.02
    lb = b.acquire("r1", "s1")
    assert lb is not None and lb.generation == 2
    assert not a.valid(la)  # a's own trust ran out before b could take over
    with pytest.raises(LeaseLostError, match="generation 1"):
        a.renew(la)
    assert a.release(la) is False
    rec = b.read("r1", "s1")
    assert rec is not None and rec.holder == "worker-b" and rec.generation == 2 and not rec.released


def test_release_hands_over_at_once_and_keeps_counting(storage: Storage) -> None:
    clock = Clock()
    a = LeaseManager(storage, "a", ttl=60, clock=clock)
    b = LeaseManager(storage, "b", ttl=60, clock=clock)
    la = a.acquire("r1", "s1")
    assert la is not None
    assert a.release(la) is True
    lb = b.acquire("r1", "s1")
    assert lb is not None and lb.generation == 2  # never back to 1: the fence must keep rising
    assert a.acquire("r1", "s1") is None
    # leases are per step
    other = a.acquire("r1", "s2")
    assert other is not None and other.generation == 1


def test_exactly_one_of_many_contenders_wins_create_and_takeover(storage: Storage) -> None:
    clock = Clock()
    managers = [LeaseManager(storage, f"w{i}", ttl=5, clock=clock) for i in range(8)]
    barrier = threading.Barrier(len(managers))
    won: list[Any] = []

    def contend(m: LeaseManager) -> None:
        barrier.wait()
        got = m.acquire("r1", "hot")
        if got is not None:
            won.append(got)

    def race() -> None:
        threads = [threading.Thread(target=contend, args=(m,)) for m in managers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    race()
    assert len(won) == 1 and won[0].generation == 1
    first = won.pop()
    for m in managers:  # everyone (the winner's own manager too) sees it held
        assert m.acquire("r1", "hot") is None
    clock.now += 5
    race()  # all of them see it stale at once; one CAS wins
    assert len(won) == 1 and won[0].generation == 2
    assert not managers[0].valid(first)  # whoever won, generation 1 is no longer trusted


def test_an_unreadable_lease_is_held_until_stale_then_replaced(storage: Storage) -> None:
    clock = Clock()
    storage.put(lease_key("r1", "s1"), b"{not json")
    m = LeaseManager(storage, "m", ttl=3, clock=clock)
    assert m.acquire("r1", "s1") is None
    clock.now += 3
    got = m.acquire("r1", "s1")
    assert got is not None and got.generation == 1
    assert json.loads(storage.get(lease_key("r1", "s1")))["holder"] == "m"


class _LostReply(Forwarding):
    """The first conditional write of each kind 'loses its reply' after landing."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.lose = {"put_if_absent", "put_if_match"}

    def put_if_absent(self, key: str, data: bytes) -> str:
        etag = self.inner.put_if_absent(key, data)
        if "put_if_absent" in self.lose:
            self.lose.discard("put_if_absent")
            raise FileExistsError("the retry of a landed create sees the object")
        return etag

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        etag = self.inner.put_if_match(key, data, etag)
        if "put_if_match" in self.lose:
            self.lose.discard("put_if_match")
            raise PreconditionFailed("the retry of a landed write sees the new etag")
        return etag


def test_a_write_whose_reply_was_lost_is_recognised_as_ours(storage: Storage) -> None:
    clock = Clock()
    m = LeaseManager(_LostReply(storage), "m", ttl=10, clock=clock)
    lease = m.acquire("r1", "s1")  # the create landed, the caller heard "exists"
    assert lease is not None and lease.generation == 1
    renewed = m.renew(lease)  # the CAS landed, the caller heard "precondition failed"
    assert renewed.renewals == 1 and renewed.etag == storage.get_with_etag(lease_key("r1", "s1"))[1]
    # and a rival's write is not mistaken for ours
    rival = LeaseManager(storage, "rival", ttl=10, clock=clock)
    clock.now += 100
    assert rival.acquire("r1", "s1") is None
    clock.now += 10
    assert rival.acquire("r1", "s1") is not None
    with pytest.raises(LeaseLostError):
        m.renew(renewed)


def test_heartbeat_keeps_a_lease_and_reports_losing_it(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s"))
    m = LeaseManager(storage, "m", ttl=0.4)
    lease = m.acquire("r1", "s1")
    assert lease is not None
    with Heartbeat(m, lease) as hb:
        threading.Event().wait(1.0)  # 2.5 ttls: without renewals it would have run out
        assert hb.check().renewals >= 3
        # someone overwrites the lease as a takeover would: a conditional write on what it read
        # (a plain put could land between a renewal's etag check and its rename, and be lost:
        # lease writers only ever use the conditional ones). The next beat notices.
        key = lease_key("r1", "s1")
        while True:
            body, etag = storage.get_with_etag(key)
            try:
                storage.put_if_match(key, body.replace(b'"m"', b'"x"'), etag)
                break
            except PreconditionFailed:
                continue  # a renewal landed between our read and our write: read it again
        deadline = time.monotonic() + 10.0  # a beat is due within ttl/4; a loaded machine is late
        with pytest.raises(LeaseLostError, match="taken it over"):
            while time.monotonic() < deadline:
                hb.check()
                threading.Event().wait(0.05)


def test_leases_refuse_a_backend_without_shared_cas(memory_url: str) -> None:
    with pytest.raises(ConfigError, match="leases need a shared backend"):
        LeaseManager(open_storage(memory_url))
    with pytest.raises(ConfigError, match="ttl"):
        LeaseManager(open_storage(str(Path("/tmp") / uuid.uuid4().hex)), ttl=0)


# ----------------------------------------------------------------------- the store's fence


def _run(url: str, opts: dict[str, Any]) -> None:
    run = AgentRun(run_id="r1", goal="fenced")
    run.add_step(Step(id="s1", title="one"))
    run.add_step(Step(id="s2", title="two"))
    with CheckpointStore(url, opts) as st:
        st.save_run(run)


def test_a_stalled_holder_cannot_overwrite_its_successor(shared_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = shared_url
    _run(url, opts)
    clock = Clock()
    wa, wb = CheckpointStore(url, opts), CheckpointStore(url, opts)  # two machines' views
    a = LeaseManager(wa.storage, "a", ttl=5, clock=clock)
    b = LeaseManager(wb.storage, "b", ttl=5, clock=clock)
    la = a.acquire("r1", "s1")
    assert la is not None
    step_a = wa.load_run("r1").steps["s1"]  # type: ignore[union-attr]
    step_a.status = StepStatus.RUNNING
    wa.commit_step("r1", step_a, la)
    # a stalls; b sees the lease unchanged for a ttl and takes it over, then claims the step
    assert b.acquire("r1", "s1") is None
    clock.now += 5
    lb = b.acquire("r1", "s1")
    assert lb is not None and lb.generation == 2
    run_b = wb.load_run("r1")
    assert run_b is not None
    step_b = run_b.steps["s1"]
    step_b.status, step_b.result = StepStatus.COMPLETED, "b's result"
    v_b = wb.commit_step("r1", step_b, lb)
    # a wakes up and commits its (late) result: refused, nothing written
    step_a.status, step_a.result = StepStatus.COMPLETED, "a's late result"
    with pytest.raises(LeaseLostError, match="generation 2 has committed"):
        wa.commit_step("r1", step_a, la)
    fresh = CheckpointStore(url, opts)
    assert fresh.list_versions("r1")[-1] == v_b
    got = fresh.load_run("r1")
    assert got is not None and got.steps["s1"].result == "b's result"
    assert got.steps["s1"].lease_generation == 2
    for st in (wa, wb, fresh):
        st.close()


def test_a_completed_step_is_not_redone_by_a_successor(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _run(url, {})
    clock = Clock()
    wa, wb = CheckpointStore(url), CheckpointStore(url)
    a = LeaseManager(wa.storage, "a", ttl=5, clock=clock)
    b = LeaseManager(wb.storage, "b", ttl=5, clock=clock)
    la = a.acquire("r1", "s1")
    assert la is not None and b.acquire("r1", "s1") is None
    clock.now += 5
    lb = b.acquire("r1", "s1")  # a is slow, b takes over ...
    assert lb is not None
    run_b = wb.load_run("r1")
    assert run_b is not None
    step_a = wa.load_run("r1").steps["s1"]  # type: ignore[union-attr]
    step_a.status, step_a.result = StepStatus.COMPLETED, "a finished first"
    wa.commit_step("r1", step_a, la)  # ... but a's result lands before b has claimed anything
    step_b = run_b.steps["s1"]
    step_b.status = StepStatus.RUNNING  # b's claim, made from its older view of the run
    with pytest.raises(LeaseLostError, match="already completed"):
        wb.commit_step("r1", step_b, lb)
    # meanwhile another worker's commit to another step merged rather than conflicted
    step2 = run_b.steps["s2"]
    l2 = b.acquire("r1", "s2")
    assert l2 is not None
    step2.status, step2.result = StepStatus.COMPLETED, "two"
    wb.commit_step("r1", step2, l2)
    got = CheckpointStore(url).load_run("r1")
    assert got is not None
    assert (got.steps["s1"].result, got.steps["s2"].result) == ("a finished first", "two")
    with pytest.raises(ValueError, match="lease is for"):
        wb.commit_step("r1", step2, lb)


def test_errors_cross_a_process_boundary_intact() -> None:
    import pickle

    from ckptfs.errors import CheckpointCorruptError, ConflictError, CorruptFileError, StepCompletedError

    for err in (ConflictError("r1", 7, "reload"), CorruptFileError("k", "bad crc"),
                CheckpointCorruptError("r1", ["a", "b"]), LeaseLostError("r1", "s1", 3, "taken"),
                StepCompletedError("r1", "s1", 2, "done")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__


def test_a_lost_lease_object_never_gives_two_holders_one_generation(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _run(url, {})
    clock = Clock()
    wa, wb = CheckpointStore(url), CheckpointStore(url)
    a = LeaseManager(wa.storage, "a", ttl=60, clock=clock)
    b = LeaseManager(wb.storage, "b", ttl=60, clock=clock)
    la = a.acquire("r1", "s1")
    assert la is not None
    step_a = wa.load_run("r1").steps["s1"]  # type: ignore[union-attr]
    step_a.status = StepStatus.RUNNING
    wa.commit_step("r1", step_a, la, claim=True)
    wa.storage.delete(lease_key("r1", "s1"))  # by hand, or a bucket lifecycle rule
    step_b = wb.load_run("r1").steps["s1"]  # type: ignore[union-attr]
    blind = b.acquire("r1", "s1")  # not told what the step was committed under: generation 1 again
    assert blind is not None and blind.generation == 1
    with pytest.raises(LeaseLostError, match="generation 1 has committed"):
        wb.commit_step("r1", step_b, blind, claim=True)  # a claim must raise the fence
    wb.storage.delete(lease_key("r1", "s1"))
    lb = b.acquire("r1", "s1", after=step_b.lease_generation)  # what a worker does
    assert lb is not None and lb.generation == 2
    wb.commit_step("r1", step_b, lb, claim=True)
    step_a.status, step_a.result = StepStatus.COMPLETED, "a"
    with pytest.raises(LeaseLostError):
        wa.commit_step("r1", step_a, la)
    wa.close()
    wb.close()


def test_a_new_generation_exceeds_what_the_step_was_committed_under(storage: Storage) -> None:
    clock = Clock()
    m = LeaseManager(storage, "m", ttl=60, clock=clock)
    first = m.acquire("r1", "s1")
    assert first is not None and m.release(first)
    # the lease object says 1, the step was committed under 4 (a restore, a lost object): 5
    got = m.acquire("r1", "s1", after=4)
    assert got is not None and got.generation == 5
    assert m.acquire("r1", "s9", after=7).generation == 8  # type: ignore[union-attr]


@pytest.mark.parametrize("outcome", [StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED])
def test_a_finished_step_stands_against_any_other_generation(tmp_path: Path, outcome: StepStatus) -> None:
    url = str(tmp_path / "s")
    _run(url, {})
    m = LeaseManager(open_storage(url), "m", ttl=60, clock=Clock())
    with CheckpointStore(url) as st:
        la = m.acquire("r1", "s1")
        assert la is not None
        step = st.load_run("r1").steps["s1"]  # type: ignore[union-attr]
        step.status, step.result, step.error = outcome, "done", "x"
        st.commit_step("r1", step, la, claim=True)
        m.release(la)
        lb = m.acquire("r1", "s1", after=step.lease_generation)
        assert lb is not None and lb.generation == 2
        step.status = StepStatus.RUNNING
        with pytest.raises(StepCompletedError, match=f"already {outcome.value}"):
            st.commit_step("r1", step, lb, claim=True)
        assert st.load_run("r1").steps["s1"].status == outcome  # type: ignore[union-attr]


def test_show_names_who_holds_the_open_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckptfs.cli import main

    url = str(tmp_path / "s")
    _run(url, {})
    m = LeaseManager(open_storage(url), "host-a:4242:beef", ttl=30)
    held = m.acquire("r1", "s1")
    assert held is not None
    done = m.acquire("r1", "s2")
    assert done is not None and m.release(done)
    assert main(["show", url, "r1", "--json"]) == 0
    steps = {s["id"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert steps["s1"]["lease"]["holder"] == "host-a:4242:beef"
    assert steps["s1"]["lease"]["generation"] == 1 and steps["s1"]["lease"]["ttl_s"] == 30
    assert steps["s2"]["lease"] is None  # released: nobody holds it
    assert main(["show", url, "r1"]) == 0
    flat = re.sub(r"[\s│┃]+", "", capsys.readouterr().out)  # cells are cut to fit 80 columns
    assert "leasedbyhost-a:4242:beef" in flat and flat.count("leasedby") == 1


def test_release_with_an_older_lease_object_of_ours_still_releases(storage: Storage) -> None:
    clock = Clock()
    m = LeaseManager(storage, "m", ttl=60, clock=clock)
    first = m.acquire("r1", "s1")
    assert first is not None
    m.renew(first)  # a heartbeat renewed it after `first` was handed out
    assert m.release(first) is True
    assert json.loads(storage.get(lease_key("r1", "s1")))["released"] is True
    other = LeaseManager(storage, "other", ttl=60, clock=clock)
    assert other.acquire("r1", "s1") is not None  # at once: it was really released
