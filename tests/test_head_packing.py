"""The head packs what it committed off the commit path: the compactor packs each step's JSON
and hands it back (compactor.Entry.head_plain -> Head.adopt_packed). What must hold: after the
hand-back the head holds packed bytes of exactly the newest committed JSON, shared with the
compactor's replica; a step committed again meanwhile keeps its newer bytes; an unchanged
step compares equal whether held plain or packed, so it writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
from ckptfs.format import codec

RUN = "packing"


def _run(n: int) -> AgentRun:
    run = AgentRun(run_id=RUN, goal="g")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title="t", description="d" * 300))
    return run


@pytest.mark.parametrize("background", [True, False])
def test_the_head_ends_up_packed_shared_with_the_replica(tmp_path: Path, background: bool) -> None:
    policy = CompactionPolicy(background=background)
    with CheckpointStore(str(tmp_path / "s"), policy=policy, artifact_threshold=2000) as store:
        run = _run(12)
        store.save_run(run)
        for i, step in enumerate(run.steps.values()):
            step.status = StepStatus.COMPLETED
            step.result = ("big " * 1000) if i % 4 == 3 else f"result {i} " * 40  # some offloaded
            store.commit(run, [step])
        head = store._heads[RUN]
        assert any(not codec.is_packed(b) for b in head.steps_cmp.values()) or not background
        store.flush()
        before = head.version
        store.commit(run, [run.steps["s0"]])  # unchanged: no record; adopts the hand-back
        assert head.version == before
        replica = store._compactor._runs[RUN].replica.steps
        for sid, step in run.steps.items():
            held = head.steps_cmp[sid]
            assert codec.is_packed(held), sid
            assert codec.unpack(held) == step.model_dump_json().encode()
            if int(sid[1:]) % 4 != 3:  # stored as its model JSON: one copy for both holders
                assert replica[sid] is held
            else:  # stored with its result in an artifact: the replica keeps that form
                assert replica[sid] is not None and b"$refs" in codec.unpack(replica[sid])


def test_a_step_committed_again_keeps_its_newer_bytes(tmp_path: Path) -> None:
    with CheckpointStore(str(tmp_path / "s")) as store:
        run = _run(2)
        store.save_run(run)
        step = run.steps["s0"]
        step.result = "first " * 100
        store.commit(run, [step])
        head = store._heads[RUN]
        first = head.steps_cmp["s0"]
        store.flush()  # the compactor has packed `first` and queued it for the head
        step.result = "second " * 100
        store.commit(run, [step])  # takes the hand-back first, then holds the new JSON plain
        newer = head.steps_cmp["s0"]
        assert newer == step.model_dump_json().encode() and newer is not first
        head.packed_later.append(("s0", first, codec.pack(first)))  # a late hand-back of `first`
        head.adopt_packed()
        assert head.steps_cmp["s0"] is newer  # not replaced by the packed older JSON
        store.flush()
        store.commit(run, [step])  # unchanged
        assert codec.unpack(head.steps_cmp["s0"]) == step.model_dump_json().encode()
        step.result = "first " * 100  # back to the first value: a change against the head
        v = store.commit(run, [step])
        assert v == head.version and v > 3
    with CheckpointStore(str(tmp_path / "s")) as fresh:
        got = fresh.load_run(RUN)
        assert got is not None and got.steps["s0"].result == "first " * 100
