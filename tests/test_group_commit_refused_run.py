"""A grouped record writes the run-level fields of the last part it ACCEPTS, never a refused one's.

Each `GroupPart` carries its own copy of the run-level fields (taken at submit). The group
commit used to pick the fields to write from the last part carrying a run before any part
was checked: when that part was then refused (a step of it unstorable or misfiled), its
caller got an error while its run-level fields were written with the accepted parts, and a
load returned them. And when those fields were themselves refused, every part carrying a
run failed with them, the parts whose own fields were fine included.

Parts are queued on a real `GroupCommitter` behind a busy writer, so they share one write,
on local disk, and a fresh store reads back only what was stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import NonFiniteValueError, UnstorableValueError
from tests._held_writer import OneWrite

RUN = "m"


def fresh(url: str) -> tuple[AgentRun, int]:
    store = CheckpointStore(url)
    run = store.load_run(RUN)
    assert run is not None and store.last_load is not None
    version = store.last_load.version
    store.close()
    return run, version


def done(step: Step, result: str) -> Step:
    step.status, step.result = StepStatus.COMPLETED, result
    return step


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, CheckpointStore, AgentRun]]:
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    run = AgentRun(run_id=RUN, goal="refused run fields")
    for i in range(3):
        run.add_step(Step(id=f"s{i}", title="t"))
    run.metadata["phase"] = "saved"
    store.save_run(run)
    yield url, store, run
    store.close()


@pytest.fixture
def group(setup: tuple[str, CheckpointStore, AgentRun]) -> Iterator[OneWrite]:
    held = OneWrite(setup[1])
    yield held
    held.close()  # a test that failed before its write must not leave the writer held


def misfiled(run: AgentRun) -> Step:
    step = Step(id="y", title="t")
    run.steps["x"] = step  # a commit would write it as "y": acknowledged "x", loaded "y"
    return step


def nan_result(run: AgentRun) -> Step:
    step = run.steps["s1"]
    step.metadata["score"] = float("nan")  # no load could give it back
    return step


@pytest.mark.parametrize("bad_step", [misfiled, nan_result], ids=["misfiled", "nan"])
def test_a_refused_last_part_does_not_write_its_run_fields(
        setup: tuple[str, CheckpointStore, AgentRun], group: OneWrite,
        bad_step: Callable[[AgentRun], Step]) -> None:
    url, store, run = setup
    _, v0 = fresh(url)
    run.metadata["phase"] = "accepted"
    good = group.committer.submit(RUN, run=run, steps=[done(run.steps["s0"], "zero")])
    run.metadata["phase"] = "refused"
    run.status = "paused"
    refused_step = bad_step(run)
    bad = group.committer.submit(RUN, run=run, steps=[refused_step])
    group.write()

    assert good.result() == v0 + 1
    assert isinstance(bad.exception(), UnstorableValueError)  # NonFiniteValueError is one
    loaded, version = fresh(url)
    assert version == v0 + 1
    assert loaded.metadata["phase"] == "accepted" and loaded.status == "running"
    assert loaded.steps["s0"].result == "zero"
    assert "x" not in loaded.steps and "y" not in loaded.steps
    assert "score" not in loaded.steps["s1"].metadata
    run.steps.pop("x", None)  # fixed, the refused part's change commits
    run.steps["s1"].metadata.pop("score", None)
    assert store.commit(run, [done(run.steps["s1"], "one")]) == v0 + 2
    loaded, _ = fresh(url)
    assert (loaded.metadata["phase"], loaded.status) == ("refused", "paused")
    assert loaded.steps["s1"].result == "one"


@pytest.mark.parametrize("value", [float("nan"), "\udc80"], ids=["nan", "lone-surrogate"])
def test_refused_run_fields_fail_only_their_part(
        setup: tuple[str, CheckpointStore, AgentRun], group: OneWrite, value: object) -> None:
    url, store, run = setup
    _, v0 = fresh(url)
    run.metadata["phase"] = "accepted"
    good = group.committer.submit(RUN, run=run, steps=[done(run.steps["s0"], "zero")])
    run.metadata["bad"] = value
    bad = group.committer.submit(RUN, run=run, steps=[done(run.steps["s1"], "one")])
    group.write()

    exc = bad.exception()
    assert isinstance(exc, UnstorableValueError)
    assert isinstance(exc, NonFiniteValueError) == isinstance(value, float)
    assert good.result() == v0 + 1  # before: failed with the other part's error
    loaded, version = fresh(url)
    assert version == v0 + 1
    assert loaded.metadata == {"phase": "accepted"}
    assert loaded.steps["s0"].result == "zero"
    assert loaded.steps["s1"].status == StepStatus.PENDING  # the refused part's step not written
    del run.metadata["bad"]  # the refused part left nothing behind: fixed, it commits
    assert store.commit(run, [run.steps["s1"]]) == v0 + 2
    assert fresh(url)[0].steps["s1"].result == "one"


def test_refused_run_fields_of_an_earlier_part_fail_it_as_a_commit_alone_would(
        setup: tuple[str, CheckpointStore, AgentRun], group: OneWrite) -> None:
    """Whether a part is refused must not depend on what else happens to share its write:
    alone, `commit` refuses these run-level fields, so grouped the part fails too (before,
    a later part's fields hid them and the part was acknowledged)."""
    url, _, run = setup
    _, v0 = fresh(url)
    run.metadata["bad"] = float("inf")
    bad = group.committer.submit(RUN, run=run, steps=[done(run.steps["s0"], "zero")])
    del run.metadata["bad"]
    run.metadata["phase"] = "accepted"
    good = group.committer.submit(RUN, run=run, steps=[done(run.steps["s1"], "one")])
    group.write()

    assert isinstance(bad.exception(), NonFiniteValueError)
    assert good.result() == v0 + 1
    loaded, _ = fresh(url)
    assert loaded.metadata == {"phase": "accepted"}
    assert loaded.steps["s1"].result == "one"
    assert loaded.steps["s0"].status == StepStatus.PENDING


def test_a_new_runs_first_save_grouped_with_a_part_without_the_run(tmp_path: Path) -> None:
    """The run's first save and a commit queued after it share a record: the follower lands
    (it was refused 'no saved state', the head being empty while the group was planned), and
    one queued before any save is still refused."""
    url = str(tmp_path / "new")
    store = CheckpointStore(url)
    run = AgentRun(run_id=RUN, goal="first save grouped")
    run.add_step(Step(id="s0", title="t"))
    run.add_step(Step(id="s1", title="t"))
    held = OneWrite(store)
    try:
        early = held.committer.submit(RUN, steps=[run.steps["s1"]])
        first = held.committer.submit(RUN, run=run, steps=list(run.steps.values()))
        follower = held.committer.submit(RUN, steps=[done(run.steps["s0"], "zero")])
        held.close()
        assert (held.committer.writes, held.committer.parts) == (1, 3)
        assert "no saved state" in str(early.exception())
        assert first.result() == follower.result() == 1
    finally:
        held.close()
        store.close()
    loaded, version = fresh(url)
    assert version == 1
    assert loaded.steps["s0"].status == StepStatus.COMPLETED and loaded.steps["s0"].result == "zero"
