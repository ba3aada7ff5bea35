"""Review of the agent's "a value the store refuses stops the run" beyond the executor's own step.

Under every-n, finished steps wait in memory for their batch's commit. An executor (or a
progress callback) holding the run could spoil one of those *siblings* (a NaN in its metadata,
a 5,000-digit int in its tokens): the batch's commit refused it out of execute_run, the run left
"running" and every acknowledged step of the batch lost. The put-back that makes a stop
committable read the stored run; when that read failed (the store being what fails) the
store's error escaped with the run left "running" and no stop anywhere. And an executor that
adds steps to the run, or removes one, had them silently dropped or crashed with a KeyError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from ckptfs import (
    CheckpointedAgent,
    CheckpointPolicy,
    CheckpointStore,
    ProgressEvent,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
)
from ckptfs.errors import StorageUnavailableError
from tests._forwarding import Forwarding

NAN = float("nan")
IDS = ["a", "b", "c", "d", "e", "f"]


def _chain(agent: CheckpointedAgent, **kw: Any) -> Any:
    steps = [Step(id=s, title=s, dependencies=[IDS[i - 1]] if i else []) for i, s in enumerate(IDS)]
    return agent.start_run("g", steps, run_id="r", metadata={"owner": "me"}, **kw)


def _execute(agent: CheckpointedAgent, run: Any, fn: Callable[[Step, Any], Any], mode: str) -> None:
    if mode == "sync":
        agent.execute_run(run, fn)
        return

    async def ex(step: Step, prior: Any) -> Any:
        await asyncio.sleep(0)
        return fn(step, prior)

    asyncio.run(agent.aexecute_run(run, ex, concurrency=3))


def _ok(step: Step, prior: Any) -> StepResult:
    return StepResult(f"{step.id} ok", tokens=10, cost_usd=0.5)


def _resume_completes(url: str, mode: str, ran: list[str] | None = None) -> Any:
    agent = CheckpointedAgent(CheckpointStore(url))
    again = agent.resume_run("r")
    assert again is not None

    def fn(step: Step, prior: Any) -> StepResult:
        if ran is not None:
            ran.append(step.id)
        return _ok(step, prior)

    _execute(agent, again, fn, mode)
    done = CheckpointStore(url).load_run("r")
    assert done is not None and done.status == "completed" and "stopped" not in done.metadata
    assert done.total_tokens == sum(s.tokens for s in done.steps.values())
    assert done.total_cost_usd == sum(s.cost_usd for s in done.steps.values())
    return done


def _spoil(kind: str, step: Step) -> str:
    """Spoil a finished step another executor holds; the field the refusal names."""
    if kind == "nan-metadata":
        step.metadata["score"] = NAN
        return r"metadata\.score: nan"
    if kind == "giant-tokens":
        step.tokens = 10**5000  # an int field takes it; no record could hold it
        return r"tokens: an int of about 5001 digits"
    step.cost_usd = NAN
    return r"cost_usd: nan"


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["nan-metadata", "giant-tokens", "nan-cost"])
@pytest.mark.parametrize("at", ["batch", "tool-mark"])
def test_a_value_spoiled_in_a_finished_sibling_stops_the_run_keeping_every_finished_step(
        tmp_path: Path, mode: str, kind: str, at: str) -> None:
    """every_n(3): "a" and "b" finished (acknowledged, uncommitted); "c"'s executor spoils "a".
    Met at the batch's commit ("c" the third step) or at "c"'s RUNNING mark before its tool
    call. Before: the store's bare refusal out of execute_run, the run "running", "a" and "b"
    lost (all three steps PENDING in the store). Now: RunStoppedError naming "a" and the field,
    the stop committed with a, b, c, the refused field as acknowledged, and a resume runs only
    what is left."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(3))
    run = _chain(agent)
    ran: list[str] = []
    paid: list[str] = []
    field = ""

    def fn(step: Step, prior: Any) -> StepResult:
        nonlocal field
        ran.append(step.id)
        step.metadata["note"] = f"by {step.id}"
        if step.id == "c":
            field = _spoil(kind, run.steps["a"])
            if at == "tool-mark":
                agent.tools().run("search", {"q": "c"}, lambda q: paid.append(q) or "hits")
        return StepResult(f"{step.id} done", tokens=10, cost_usd=0.5)

    with pytest.raises(RunStoppedError) as info:
        _execute(agent, run, fn, mode)
    assert info.value.step_id == "a"
    assert f"step 'a' holds a value the store cannot keep ({field.replace(chr(92), '')}" in str(info.value)
    assert ran == ["a", "b", "c"]  # stopped: "d" never started
    assert paid == (["c"] if at == "tool-mark" else [])
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["stopped"]["step_id"] == "a" and stored.metadata["owner"] == "me"
    for sid in "abc":  # every acknowledged step is there, as acknowledged
        s = stored.steps[sid]
        assert s.status == StepStatus.COMPLETED and s.result == f"{sid} done", sid
        assert s.tokens == 10 and s.cost_usd == 0.5 and s.metadata == {"note": f"by {sid}"}, sid
    assert stored.total_tokens == 30 and stored.total_cost_usd == 1.5

    again: list[str] = []
    done = _resume_completes(url, mode, again)
    assert sorted(again) == ["d", "e", "f"]
    assert done.steps["a"].result == "a done"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_progress_callback_spoiling_the_run_at_the_last_step_keeps_the_finished_steps(
        tmp_path: Path, mode: str) -> None:
    """A callback on the last `step_completed` puts NaN in run.metadata: met by the final
    commit, which held every step of the run (every_n(10)). Before: the store's refusal out
    of execute_run, nothing of the run saved beyond its start."""
    url = str(tmp_path / "store")
    run_box: list[Any] = []

    def on_progress(ev: ProgressEvent) -> None:
        if ev.kind == "step_completed" and ev.step_id == "f":
            run_box[0].metadata["score"] = NAN

    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(10),
                              on_progress=on_progress)
    run_box.append(_chain(agent))
    with pytest.raises(RunStoppedError, match=r"met a value in the run the store cannot keep "
                                              r"\(metadata\.score: nan"):
        _execute(agent, run_box[0], _ok, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed" and "score" not in stored.metadata
    assert all(s.status == StepStatus.COMPLETED for s in stored.steps.values())
    assert stored.total_cost_usd == 3.0
    _resume_completes(url, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_run_totals_spoiled_under_every_n_go_back_to_what_the_finished_steps_count(
        tmp_path: Path, mode: str) -> None:
    """NaN in run.total_cost_usd with "a" and "b" finished but uncommitted: put back from the
    store, the total lost their 1.0 while the stop committed them, so the resumed run's total
    (2.0) no longer matched its steps (3.0)."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(10))
    run = _chain(agent)

    def fn(step: Step, prior: Any) -> StepResult:
        if step.id == "c":
            run.total_cost_usd = NAN
        return _ok(step, prior)

    with pytest.raises(RunStoppedError, match=r"step 'c' left a value in the run .*total_cost_usd"):
        _execute(agent, run, fn, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.steps["b"].status == StepStatus.COMPLETED and stored.total_cost_usd == 1.0
    assert _resume_completes(url, mode).total_cost_usd == 3.0


class _Failing(Forwarding):
    """A store that starts failing on demand: reads, or reads and writes (a 503 outage)."""

    reads = False
    writes = False

    def _read(self, key: str) -> None:
        if self.reads:
            raise StorageUnavailableError(f"GET {key}: 503 Slow Down")

    def _write(self, key: str) -> None:
        if self.writes:
            raise StorageUnavailableError(f"PUT {key}: 503 Slow Down")

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        self._read(key)
        return self.inner.get_with_etag(key)

    def get(self, key: str) -> bytes:
        self._read(key)
        return self.inner.get(key)

    def open_read(self, key: str) -> IO[bytes]:
        self._read(key)
        return self.inner.open_read(key)

    def read_through(self, key: str, read: Any) -> Any:
        self._read(key)
        return self.inner.read_through(key, read)

    def put(self, key: str, data: bytes) -> str:
        self._write(key)
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self._write(key)
        return self.inner.put_if_absent(key, data)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("where", ["step", "run"])
def test_a_put_back_whose_read_fails_still_commits_the_stop(tmp_path: Path, mode: str,
                                                            where: str) -> None:
    """The stored run cannot be read when "b" leaves a NaN. Before: the store's
    StorageUnavailableError out of execute_run, the run "running", no stop. Now the refused
    entry is removed without the read (the rest of the metadata kept), the stop is committed,
    and the message says the stored run could not be read."""
    url = str(tmp_path / "store")
    storage = _Failing(CheckpointStore(url).storage)
    agent = CheckpointedAgent(CheckpointStore(url, storage=storage))
    run = _chain(agent)

    def fn(step: Step, prior: Any) -> StepResult:
        if step.id == "b":
            storage.reads = True
            target = step.metadata if where == "step" else run.metadata
            target.update(kept="yes", score=NAN)
        return _ok(step, prior)

    with pytest.raises(RunStoppedError, match=r"step 'b' left a value in the "
                       rf"{where} .*metadata\.score: nan.*put back without the stored run, which "
                       r"could not be read \(StorageUnavailableError: GET .*503"):
        _execute(agent, run, fn, mode)
    storage.reads = False
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["stopped"]["step_id"] == "b" and stored.metadata["owner"] == "me"
    holder = stored.steps["b"].metadata if where == "step" else stored.metadata
    assert holder["kept"] == "yes" and "score" not in holder
    assert stored.steps["a"].status == StepStatus.COMPLETED
    assert stored.steps["b"].status == StepStatus.PENDING
    _resume_completes(url, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stop_the_failing_store_cannot_commit_says_so_and_names_the_run(tmp_path: Path,
                                                                          mode: str) -> None:
    """Reads and writes fail (an outage) when "b" leaves a NaN: the stop cannot be committed.
    Before: a bare StorageUnavailableError naming no run or step. Now a RunStoppedError that
    names both and says the stop is not in the store; what was committed is intact (the run
    "running", "a" completed), and once the store is back a resume completes the run."""
    url = str(tmp_path / "store")
    storage = _Failing(CheckpointStore(url).storage)
    agent = CheckpointedAgent(CheckpointStore(url, storage=storage))
    run = _chain(agent)

    def fn(step: Step, prior: Any) -> StepResult:
        if step.id == "b":
            storage.reads = storage.writes = True
            step.metadata["score"] = NAN
        return _ok(step, prior)

    with pytest.raises(RunStoppedError, match=r"run 'r': step 'b' was to stop the run "
                       r"\(NonFiniteValueError: .*metadata\.score: nan.*\), but the stop could not "
                       r"be committed \(StorageUnavailableError: PUT .*503.*\): the store holds "
                       r"the run as of its last commit, not marked stopped") as info:
        _execute(agent, run, fn, mode)
    assert isinstance(info.value.__cause__, StorageUnavailableError)
    storage.reads = storage.writes = False
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "running" and "stopped" not in stored.metadata
    assert stored.steps["a"].status == StepStatus.COMPLETED  # acknowledged: durable
    ran: list[str] = []
    _resume_completes(url, mode, ran)
    assert sorted(ran) == ["b", "c", "d", "e", "f"]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("every_n", [1, 10])
def test_steps_an_executor_adds_are_run_and_stored(tmp_path: Path, mode: str, every_n: int) -> None:
    """A planner step adds work. Before: the new step was neither run nor ever committed, the
    run ended "failed" with no error raised, and the store (and every resume) never had it."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), every_n)
    run = _chain(agent)
    ran: list[str] = []

    def fn(step: Step, prior: Any) -> StepResult:
        ran.append(step.id)
        if step.id == "c":
            run.add_step(Step(id="c2", title="follow-up", dependencies=["c"]))
            run.add_step(Step(id="c3", title="after it", dependencies=["c2"]))
        return _ok(step, prior)

    _execute(agent, run, fn, mode)
    assert sorted(ran) == sorted([*IDS, "c2", "c3"]) and ran.index("c3") > ran.index("c2")
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "completed" and len(stored.steps) == 8
    assert stored.steps["c3"].result == "c3 ok" and stored.total_cost_usd == 4.0


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("victim", ["e", "a"])
def test_a_step_an_executor_removes_stops_the_run_by_name(tmp_path: Path, mode: str,
                                                          victim: str) -> None:
    """Removing a pending step ("e") was a bare KeyError with the run left "running";
    removing a finished one ("a") went unnoticed while the store kept it. No commit can remove
    a step: the run stops naming it, committed, and a resume (from the store, which has it)
    completes the run."""
    url = str(tmp_path / "store")
    agent = CheckpointedAgent(CheckpointStore(url), policy=CheckpointPolicy.every_n_steps(10))
    run = _chain(agent)

    def fn(step: Step, prior: Any) -> StepResult:
        if step.id == "c":
            del run.steps[victim]
        return _ok(step, prior)

    with pytest.raises(RunStoppedError, match=rf"step '{victim}' was removed from run.steps"):
        _execute(agent, run, fn, mode)
    stored = CheckpointStore(url).load_run("r")
    assert stored is not None and stored.status == "failed"
    assert stored.metadata["stopped"]["step_id"] == victim
    assert all(stored.steps[s].status == StepStatus.COMPLETED for s in "abcd")
    done = _resume_completes(url, mode)
    assert len(done.steps) == 6
