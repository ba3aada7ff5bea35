"""Issue 11 (items 1 and 2): whatever a commit acknowledges, a fresh load returns.

Before the fix a commit acknowledged values its own reader refuses (NaN written by pydantic as
null, a 5,000-digit int json.loads rejects, a record over `max_decoded_bytes`) or silently
changes (a set or a tuple comes back as a list): a fresh load then skipped the record, and every
later, innocent commit with it. A file planted at log/999999999999.ckpt pushed the next version
to 10**12, a 13-digit key the loader ignores; a directory named like the next record wedged
every commit as "already committed by another writer".

Each test here states the rule from the outside: the error type and the field it names, that
not one byte was written (every key with its sha256, before and after), that the writer goes on
at the version it would have used (its in-memory head rolled back), and that each acknowledged
version is the one a new CheckpointStore on the same URL loads. Local disk and S3 over real
HTTP (moto) throughout; memory too where the backend does not matter.
"""

from __future__ import annotations

import collections
import datetime
import enum
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    AgentRun,
    CheckpointedAgent,
    CheckpointStore,
    RetryPolicy,
    RunStoppedError,
    Step,
    StepResult,
    StepStatus,
    ToolCall,
    open_storage,
)
from ckptfs import errors as ckerrors
from ckptfs.store.compactor import CompactionPolicy

RUN = "r-refuse"
LIMIT = 128 * 1024  # the decoder's limit for these tests (the default 512 MiB is too big)
BIG_INT = 10**5000  # over CPython's 4,300-digit int <-> str limit, which json.loads applies


def _error(name: str) -> type[BaseException]:
    """A ckptfs error class by name, looked up when the test runs (so the test fails on an
    unfixed tree by what a commit does, not by an import)."""
    cls = getattr(ckerrors, name, None)
    assert isinstance(cls, type), f"ckptfs.errors has no {name}"
    return cls


def _files(url: str, opts: dict[str, Any]) -> dict[str, str]:
    """Every stored key with the sha256 of its bytes."""
    storage = open_storage(url, opts)
    try:
        return {k: hashlib.sha256(storage.get(k)).hexdigest() for k in storage.list("")}
    finally:
        storage.close()


def _fresh(url: str, opts: dict[str, Any], **kw: Any) -> tuple[AgentRun, int]:
    """The run as a new process sees it, and the version that load ended at."""
    store = CheckpointStore(url, opts, **kw)
    try:
        run = store.load_run(RUN)
        assert run is not None and store.last_load is not None
        return run, store.last_load.version
    finally:
        store.close()


def _done(run: AgentRun, sid: str, result: str = "ok") -> Step:
    step = run.steps[sid]
    step.status = StepStatus.COMPLETED
    step.result = result
    return step


def _seed(store: CheckpointStore, n: int = 6) -> tuple[AgentRun, int]:
    """v1: the run; v2: s0 done. A fallback would have something to fall back to."""
    run = AgentRun(run_id=RUN, goal="refuse what a load cannot return")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title=f"step {i}"))
    store.save_run(run)
    return run, store.commit(run, [_done(run, "s0")])


# ------------------------------------------------------------------ the hostile values


@dataclass(frozen=True)
class Case:
    """One hostile write: `attempt` makes it, `revert` undoes it in memory; the refusal must be
    `error`, name `step` (None: run-level) and contain `needle` (the field, and why)."""

    id: str
    attempt: Callable[[CheckpointStore, AgentRun], int]
    revert: Callable[[AgentRun], None]
    error: str
    step: str | None
    needle: tuple[str, ...]


def _step_set(field: str, value: Any) -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        step = _done(run, "s1")
        setattr(step, field, value)
        return store.commit(run, [step])
    return attempt


def _step_meta(value: Any, result: str = "ok") -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        step = _done(run, "s1", result)
        step.metadata["x"] = value
        return store.commit(run, [step])
    return attempt


def _run_set(field: str, value: Any) -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        if field == "metadata":
            run.metadata["x"] = value
        else:
            setattr(run, field, value)  # AgentRun does not validate assignments
        return store.commit(run, [])
    return attempt


def _tool_log(result: Any) -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        return store.log_tool_call(RUN, "s1", ToolCall(tool_name="count", arguments={}, result=result))
    return attempt


def _step_tool_args(store: CheckpointStore, run: AgentRun) -> int:
    step = _done(run, "s1")
    step.tool_calls.append(ToolCall(tool_name="price", arguments={"limit": math.inf}))
    return store.commit(run, [step])


def _revert_step(run: AgentRun) -> None:
    run.steps["s1"] = Step(id="s1", title="step 1")


def _revert_run(run: AgentRun) -> None:
    run.metadata.pop("x", None)
    run.total_cost_usd = 0.0
    run.total_tokens = 0


CASES = [
    Case("cost-nan", _step_set("cost_usd", math.nan), _revert_step, "NonFiniteValueError", "s1",
         ("cost_usd", "nan")),
    Case("cost-minus-inf", _step_set("cost_usd", -math.inf), _revert_step, "NonFiniteValueError",
         "s1", ("cost_usd", "-inf")),
    Case("nested-nan-in-step-metadata", _step_meta({"scores": [0.5, math.nan]}), _revert_step,
         "NonFiniteValueError", "s1", ("metadata.x.scores[1]",)),
    Case("nan-in-run-metadata", _run_set("metadata", math.nan), _revert_run, "NonFiniteValueError",
         None, ("metadata.x",)),
    Case("inf-run-total-cost", _run_set("total_cost_usd", math.inf), _revert_run,
         "NonFiniteValueError", None, ("total_cost_usd",)),
    Case("set-in-step-metadata", _step_meta({"a", "b"}), _revert_step, "UnstorableValueError",
         "s1", ("metadata.x", "a set")),
    Case("tuple-in-step-metadata", _step_meta((1, 2)), _revert_step, "UnstorableValueError", "s1",
         ("metadata.x", "a tuple")),
    Case("int-key-in-step-metadata", _step_meta({1: "one"}), _revert_step, "UnstorableValueError",
         "s1", ("metadata.x", "key of type int")),
    Case("datetime-in-step-metadata", _step_meta(datetime.datetime(2024, 1, 1)), _revert_step,
         "UnstorableValueError", "s1", ("metadata.x", "datetime")),
    Case("bigint-in-step-metadata", _step_meta(BIG_INT), _revert_step, "UnstorableValueError",
         "s1", ("metadata.x", "4300 digits")),
    Case("bigint-in-run-metadata", _run_set("metadata", [1, BIG_INT]), _revert_run,
         "UnstorableValueError", None, ("metadata.x[1]", "4300 digits")),
    Case("bigint-in-logged-tool-result", _tool_log({"n": BIG_INT}), _revert_step,
         "UnstorableValueError", "s1", ("tool call 'count' result.n", "4300 digits")),
    Case("inf-in-tool-call-arguments", _step_tool_args, _revert_step, "NonFiniteValueError", "s1",
         ("tool_calls[0].arguments.limit",)),
    Case("str-in-int-run-field", _run_set("total_tokens", "many"), _revert_run,
         "UnstorableValueError", None, ("total_tokens",)),
    # The 70 KiB result alone would move to artifacts/ first: the refusal must not even do that.
    Case("inline-metadata-over-max-decoded", _step_meta("m" * (LIMIT + 1), "r" * (70 * 1024)),
         _revert_step, "RecordTooLargeError", "s1", ("metadata.x", "max_decoded_bytes")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_commit_refuses_a_value_no_load_returns_and_writes_nothing(
        case: Case, shared_url: tuple[str, dict[str, Any]]) -> None:
    url, opts = shared_url
    store = CheckpointStore(url, opts, max_decoded_bytes=LIMIT)
    try:
        run, v2 = _seed(store)
        store.flush()
        before = _files(url, opts)
        try:
            acked = case.attempt(store, run)
        except Exception as exc:  # judged below: type, message, what was written
            refused: BaseException = exc
        else:
            store.flush()
            fresh, version = _fresh(url, opts, max_decoded_bytes=LIMIT)
            pytest.fail(f"{case.id}: commit acknowledged v{acked}, a fresh load returned v{version} "
                        f"(s1 {fresh.steps['s1'].status.value}, metadata={fresh.steps['s1'].metadata!r:.60}, "
                        f"run metadata={fresh.metadata!r:.60})")
        assert isinstance(refused, _error(case.error)), f"{case.id}: {type(refused).__name__}: {refused}"
        assert isinstance(refused, ValueError) and isinstance(refused, ckerrors.CkptfsError)
        msg = str(refused)
        assert f"run {RUN!r}" in msg, msg
        assert getattr(refused, "run_id", None) == RUN and getattr(refused, "step_id", 0) == case.step
        if case.step is not None:
            assert f"step {case.step!r}" in msg, msg
        for needle in case.needle:
            assert needle in msg, f"{case.id}: {needle!r} not in {msg!r}"
        assert "nothing was written" in msg
        store.flush()
        assert _files(url, opts) == before, f"{case.id}: the refused commit wrote files"

        # The head rolled back: the next innocent commit takes the very next version and loads.
        case.revert(run)
        acked = store.commit(run, [_done(run, "s2", "innocent")])
        assert acked == v2 + 1, f"{case.id}: the refused commit used up a version (now v{acked})"
    finally:
        store.close()
    fresh, version = _fresh(url, opts, max_decoded_bytes=LIMIT)
    assert (version, fresh.steps["s2"].result, fresh.steps["s1"].status) == (
        acked, "innocent", StepStatus.PENDING), f"{case.id}: acknowledged v{acked}, fresh load v{version}"


# -------------------------------------------------------- acknowledged == loaded, always


class Colour(str, enum.Enum):
    RED = "red"


def test_every_acknowledged_commit_is_what_a_fresh_load_returns(
        any_store_url: tuple[str, dict[str, Any]]) -> None:
    """Innocent and hostile commits interleaved on one writer: each acknowledged version is the
    newest a fresh load finds, with the values committed (compared equal). The values a load
    does give back equal are accepted, edge cases included, so the check is not a blanket ban:
    a str enum, an OrderedDict, an int of exactly 4,300 digits, -0.0, 1e308, 200 nested lists."""
    url, opts = any_store_url
    nested: Any = "core"
    for _ in range(200):
        nested = [nested]
    accepted: list[Any] = [Colour.RED, collections.OrderedDict(b=1, a=2), 10**4299, -0.0, 1e308,
                           "naïve ünïcode ✓ 日本", nested, {"deep": {"er": [None, True, 1.5]}}]
    hostile: list[Any] = [math.nan, {1, 2}, (3,), BIG_INT, {"k": math.inf}, b"bytes"]
    store = CheckpointStore(url, opts)
    acked: list[int] = []
    refused: list[str] = []
    try:
        run, v = _seed(store, n=len(accepted) + 1)
        acked.append(v)
        for i, good in enumerate(accepted, start=1):
            bad = hostile[i % len(hostile)]
            step = _done(run, f"s{i}", f"result {i}")
            step.metadata["v"] = bad
            try:
                store.commit(run, [step])
            except ckerrors.CkptfsError as exc:
                refused.append(type(exc).__name__)
            else:
                fresh, version = _fresh(url, opts)
                pytest.fail(f"hostile value {type(bad).__name__} acknowledged; fresh load v{version}, "
                            f"metadata {fresh.steps[f's{i}'].metadata!r:.60}")
            step.metadata["v"] = good
            acked.append(store.commit(run, [step]))
            store.flush()
            fresh, version = _fresh(url, opts)
            assert version == acked[-1], f"acknowledged v{acked[-1]}, fresh load v{version}"
            got = fresh.steps[f"s{i}"]
            assert (got.status, got.result) == (StepStatus.COMPLETED, f"result {i}")
            assert got.metadata["v"] == good, f"committed {good!r:.40}, loaded {got.metadata['v']!r:.40}"
    finally:
        store.close()
    assert acked == list(range(2, 3 + len(accepted))), f"versions were burnt: {acked}"
    assert len(refused) == len(accepted)


def test_snapshot_over_max_decoded_is_not_written_so_retention_cannot_lose_the_chain(
        any_store_url: tuple[str, dict[str, Any]]) -> None:
    """Every record is small but the whole state outgrows `max_decoded_bytes`: the compactor
    used to write the snapshot anyway, retention (keep_last=1) then counted it as the kept one
    and deleted the older snapshot and records, and no load could start any more. Now it is
    not written and every acknowledged commit still loads."""
    url, opts = any_store_url
    limit = 64 * 1024
    policy = CompactionPolicy(fanout=2, max_plan=4, min_snapshot_bytes=1, keep_last=1,
                              background=False)
    store = CheckpointStore(url, opts, max_decoded_bytes=limit, policy=policy)
    try:
        run, acked = _seed(store, n=20)
        for i in range(1, 20):
            step = _done(run, f"s{i}")
            step.metadata["notes"] = f"{i:03d}" * 2000  # 6 KB inline, ~120 KB of state in all
            acked = store.commit(run, [step])
            fresh, version = _fresh(url, opts, max_decoded_bytes=limit)
            assert version == acked, f"acknowledged v{acked}, fresh load v{version}"
            assert fresh.steps[f"s{i}"].metadata["notes"] == step.metadata["notes"]
    finally:
        store.close()
    assert fresh.completed_count == 20


# ------------------------------------------------------------------------ through the agent


class _Acks(CheckpointStore):
    """A CheckpointStore that remembers the newest version its write methods acknowledged."""

    acked = 0

    def _ack(self, version: int) -> int:
        self.acked = max(self.acked, version)
        return version

    def commit(self, run: AgentRun, steps: Any = None) -> int:
        return self._ack(super().commit(run, steps))

    def save_run(self, run: AgentRun) -> int:
        return self._ack(super().save_run(run))

    def log_tool_call(self, run_id: str, step_id: str, tool_call: ToolCall, **kw: Any) -> int:
        return self._ack(super().log_tool_call(run_id, step_id, tool_call, **kw))


def _agent_run(url: str, opts: dict[str, Any], bad: StepResult) -> tuple[
        BaseException | None, AgentRun, int, collections.Counter[str], int]:
    """20 papers, one tool call each; the executor returns `bad` at p03, then a resume with a
    fixed executor. (error of the first run, the resumed run, versions the first store
    acknowledged, real tool calls per paper, executor calls.)"""
    paid: collections.Counter[str] = collections.Counter()
    calls = 0

    def extract(paper: str) -> str:
        paid[paper] += 1
        return f"summary of {paper}"

    store = _Acks(url, opts)
    agent = CheckpointedAgent(store)
    run = agent.start_run("papers", [Step(id=f"p{i:02d}", title=f"paper {i}") for i in range(1, 21)],
                          run_id=RUN)

    def first(step: Step, prior: list[ToolCall]) -> StepResult:
        nonlocal calls
        calls += 1
        out = agent.tools().run("extract", {"paper": step.id}, extract)
        return bad if step.id == "p03" else StepResult(out, tokens=10, cost_usd=0.01)

    error: BaseException | None = None
    try:
        agent.execute_run(run, first)
    except Exception as exc:  # the refusal must surface: checked by the caller
        error = exc
    finally:
        store.close()
    acked = store.acked

    store2 = CheckpointStore(url, opts)
    agent2 = CheckpointedAgent(store2)
    try:
        resumed = agent2.resume_run(RUN)
        assert resumed is not None

        def fixed(step: Step, prior: list[ToolCall]) -> StepResult:
            nonlocal calls
            calls += 1
            out = agent2.tools().run("extract", {"paper": step.id}, extract)
            return StepResult(out, tokens=10, cost_usd=0.01)

        agent2.execute_run(resumed, fixed)
    finally:
        store2.close()
    return error, resumed, acked, paid, calls


def test_agent_nan_cost_at_step_3_of_20_stops_clearly_and_no_call_is_paid_twice(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """Before: execute_run reported completed, a fresh load had 2 of 20 steps and the resume
    paid 17 tool calls again. Now the run stops at p03 (RunStoppedError naming cost_usd; p03
    back to PENDING, the run "failed", its checkpoint intact), the store holds exactly what it
    acknowledged, and the resume finishes the run with each paper's tool paid once."""
    url, opts = shared_url
    error, resumed, _acked, paid, calls = _agent_run(url, opts, StepResult("summary", 10, math.nan))
    twice = sorted(p for p, n in paid.items() if n > 1)
    assert not twice, f"paid again on resume: {twice}"
    assert sum(paid.values()) == 20 and set(paid) == {f"p{i:02d}" for i in range(1, 21)}
    assert calls == 21, f"{calls} executor calls: p03 twice (refused, then resumed), others once"
    assert resumed.status == "completed" and resumed.completed_count == 20
    assert math.isclose(resumed.total_cost_usd, 0.20) and resumed.total_tokens == 200
    assert isinstance(error, RunStoppedError), f"{type(error).__name__}: {error}"
    assert "cost_usd" in str(error) and "p03" in str(error), str(error)
    cause = error.cause
    assert isinstance(cause, _error("NonFiniteValueError")), repr(cause)
    assert (getattr(cause, "run_id", None), getattr(cause, "step_id", None),
            getattr(cause, "field", None)) == (RUN, "p03", "cost_usd")


def test_agent_stop_is_what_a_fresh_load_sees(shared_url: tuple[str, dict[str, Any]]) -> None:
    """The state the stop committed is the newest a fresh load finds: 2 of 20 done, p03 PENDING
    with the refusal as its error, the run "failed" and resumable, totals finite."""
    url, opts = shared_url
    store = _Acks(url, opts)
    agent = CheckpointedAgent(store)
    run = agent.start_run("papers", [Step(id=f"p{i:02d}", title=f"paper {i}") for i in range(1, 21)],
                          run_id=RUN)

    def executor(step: Step, prior: list[ToolCall]) -> StepResult:
        agent.tools().run("extract", {"paper": step.id}, lambda paper: f"summary of {paper}")
        return StepResult("s", tokens=10, cost_usd=math.nan if step.id == "p03" else 0.01)

    with pytest.raises(ckerrors.CkptfsError, match="cost_usd"):
        agent.execute_run(run, executor)
    store.close()
    fresh, version = _fresh(url, opts)
    assert version == store.acked, f"acknowledged v{store.acked}, fresh load v{version}"
    p03 = fresh.steps["p03"]
    assert (fresh.status, fresh.completed_count, p03.status) == ("failed", 2, StepStatus.PENDING)
    assert "cost_usd" in (p03.error or "") and fresh.metadata["stopped"]["step_id"] == "p03"
    assert math.isfinite(fresh.total_cost_usd) and math.isclose(fresh.total_cost_usd, 0.02)
    assert [r["run_id"] for r in CheckpointStore(url, opts).find_resumable_runs()] == [RUN]


@pytest.mark.parametrize("bad", [StepResult("s", 10, math.inf), StepResult("s", BIG_INT, 0.01)],
                         ids=["cost-inf", "tokens-5000-digits"])
def test_agent_other_unstorable_outputs_stop_without_paying_twice(bad: StepResult,
                                                                 tmp_path: Path) -> None:
    error, resumed, _acked, paid, _calls = _agent_run(str(tmp_path / "store"), {}, bad)
    twice = sorted(p for p, n in paid.items() if n > 1)
    assert not twice and len(paid) == 20, f"paid again on resume: {twice}"
    assert resumed.completed_count == 20
    assert isinstance(error, RunStoppedError), repr(error)
    assert isinstance(error.cause, _error("UnstorableValueError")), repr(error.cause)


def test_agent_tool_result_the_log_refuses_stops_instead_of_paying_retries(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """A paid tool returns a 5,000-digit int: before, it was logged and the record poisoned
    the run (a fresh load fell back past it and every later commit). Now the log refuses it
    and the run stops at that step at once: a retry would pay for the call again and meet the
    same refusal. The store holds what it acknowledged, and of the refused call only that it
    was paid for (phase "unkept")."""
    url, opts = shared_url
    paid: collections.Counter[str] = collections.Counter()

    def quote(paper: str) -> dict[str, int]:
        paid[paper] += 1
        return {"n": BIG_INT if paper == "p02" else 1}

    store = _Acks(url, opts)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0))
    run = agent.start_run("quotes", [Step(id=f"p{i:02d}", title=f"paper {i}") for i in range(1, 5)],
                          run_id=RUN)

    def executor(step: Step, prior: list[ToolCall]) -> str:
        agent.tools().run("quote", {"paper": step.id}, quote)
        return "ok"

    with pytest.raises(RunStoppedError) as info:
        agent.execute_run(run, executor)
    store.close()
    assert paid["p02"] == 1, f"the refused call was paid {paid['p02']} times (retried)"
    cause = info.value.cause
    assert isinstance(cause, _error("UnstorableValueError")), repr(cause)
    assert "tool call 'quote' result.n" in str(info.value) and "4300 digits" in str(info.value)
    fresh, version = _fresh(url, opts)
    assert version == store.acked, f"acknowledged v{store.acked}, fresh load v{version}"
    assert (fresh.status, fresh.completed_count, fresh.steps["p02"].status) == (
        "failed", 1, StepStatus.PENDING)
    # what the log holds of it: that it was paid for, not its result (a resume asks a guard
    # instead of paying again: tests/test_tools.py)
    history = CheckpointStore(url, opts).get_tool_call_history(RUN, "p02")
    assert [(c.phase, c.result) for c in history] == [("unkept", None)]
    assert "result not kept" in (history[0].error or "") and "4300 digits" in (history[0].error or "")


# ---------------------------------------------------------------------- planted files


@pytest.mark.parametrize("planted", ["garbage", "valid-copy"])
def test_top_version_file_makes_commits_refuse_naming_it(
        planted: str, shared_url: tuple[str, dict[str, Any]]) -> None:
    """Before: "commit acknowledged v1000000000000, fresh reload v3" (a 13-digit key the loader
    ignores). Now VersionLimitError names the file and the limit, nothing is written (no
    13-digit key ever), and once the file is moved away the same writer goes on."""
    url, opts = shared_url
    store = CheckpointStore(url, opts)
    try:
        run, _ = _seed(store)
        v3 = store.commit(run, [_done(run, "s1")])
    finally:
        store.close()
    planted_key = f"runs/{RUN}/log/999999999999.ckpt"
    storage = open_storage(url, opts)
    try:
        data = b"garbage" if planted == "garbage" else storage.get(f"runs/{RUN}/log/{v3:012d}.ckpt")
        storage.put(planted_key, data)
    finally:
        storage.close()
    before = _files(url, opts)
    store = CheckpointStore(url, opts)
    try:
        run2 = store.load_run(RUN)
        assert run2 is not None and store.last_load is not None and store.last_load.version == v3
        try:
            acked = store.commit(run2, [_done(run2, "s2")])
        except ckerrors.CkptfsError as exc:
            refused: BaseException = exc
        else:
            store.flush()
            _, version = _fresh(url, opts)
            pytest.fail(f"commit acknowledged v{acked}, fresh reload v{version}")
        assert isinstance(refused, _error("VersionLimitError")), f"{type(refused).__name__}: {refused}"
        assert planted_key in str(refused) and "999999999999" in str(refused)
        assert getattr(refused, "version", None) == 10**12
        store.flush()
        after = _files(url, opts)
        assert after == before, "the refused commit wrote files"
        assert not [k for k in after if len(k.rsplit("/", 1)[-1].split(".")[0]) > 12]

        storage = open_storage(url, opts)
        try:
            storage.delete(planted_key)
        finally:
            storage.close()
        run2 = store.load_run(RUN)  # the reload the message asks for
        assert run2 is not None
        acked = store.commit(run2, [_done(run2, "s2")])
    finally:
        store.close()
    fresh, version = _fresh(url, opts)
    assert (acked, version, fresh.steps["s2"].status) == (v3 + 1, v3 + 1, StepStatus.COMPLETED)


def test_directory_at_the_next_version_is_named_not_retried_as_a_race(tmp_path: Path) -> None:
    """Before: every commit, after every reload, failed with "version 4 was already committed
    by another writer", and log_tool_call retried that for half a minute. Now KeyOccupiedError
    names the directory at once, nothing is written, and after `rmdir` the writer goes on."""
    url = str(tmp_path / "store")
    store = CheckpointStore(url)
    try:
        run, _ = _seed(store)
        v3 = store.commit(run, [_done(run, "s1")])
    finally:
        store.close()
    blocker = tmp_path / "store" / "runs" / RUN / "log" / f"{v3 + 1:012d}.ckpt"
    blocker.mkdir()
    before = _files(url, {})
    store = CheckpointStore(url)
    try:
        run2 = store.load_run(RUN)
        assert run2 is not None
        for attempt in (lambda: store.commit(run2, [_done(run2, "s2")]),
                        lambda: store.log_tool_call(RUN, "s2", ToolCall(tool_name="t", arguments={}))):
            t0 = time.monotonic()
            try:
                acked = attempt()
            except Exception as exc:  # judged below
                refused: BaseException = exc
            else:
                pytest.fail(f"commit acknowledged v{acked} with a directory at its key")
            elapsed = time.monotonic() - t0
            assert not isinstance(refused, ckerrors.ConflictError), (
                f"after {elapsed:.1f}s, mistaken for a lost race: {refused}")
            assert isinstance(refused, _error("KeyOccupiedError")), f"{type(refused).__name__}: {refused}"
            assert f"runs/{RUN}/log/{v3 + 1:012d}.ckpt" in str(refused)
            assert elapsed < 2.0, f"refused only after {elapsed:.1f}s of retrying a race"
            run2.steps["s2"] = Step(id="s2", title="step 2")
        assert _files(url, {}) == before
        blocker.rmdir()
        acked = store.commit(run2, [_done(run2, "s2")])  # same writer, no reload needed
    finally:
        store.close()
    fresh, version = _fresh(url, {})
    assert (acked, version, fresh.steps["s2"].status) == (v3 + 1, v3 + 1, StepStatus.COMPLETED)
