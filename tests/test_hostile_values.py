"""Issue 11, values a reader refuses: whatever a commit acknowledges, a fresh load must return.

A commit that writes a value the reader will not take back (NaN or infinity in a float field,
an int over Python's 4,300-digit str limit, a record over `max_decoded_bytes`) is acknowledged
today, and a fresh `CheckpointStore` on the same URL then skips that record and every record
after it: innocent commits are lost with it. The rule asserted here is the one the README
promises ("acknowledged means durable"): such a value is refused at commit with a clear
ckptfs / ValueError-derived error and nothing is written, and the writer goes on working.

Planted files (a 12-digit name of 999999999999, or a directory named like the next record)
must not make commits land where a load does not look, nor wedge them, nor make `verify`
build a list of 10**12 versions.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptfs import (
    AgentRun,
    CheckpointedAgent,
    CheckpointStore,
    CkptfsError,
    Step,
    StepResult,
    StepStatus,
    ToolCall,
    open_storage,
)

RUN = "r-hostile"
# The decoder's limit is a constructor argument (codec.DEFAULT_MAX_DECODED_BYTES is 512 MiB,
# too big for a unit test): writer and reader below share this smaller one.
LIMIT = 256 * 1024
BIG_INT = 10**5000  # over sys.int_info.str_digits_check_threshold's default of 4,300 digits
CHILD_MEMORY = 2 << 30  # address-space cap of CLI children: 10**12 versions do not fit


def _cli_path() -> str:
    """The real console script of this venv (the CLI's module path is being moved)."""
    script = Path(sys.executable).parent / "ckptfs"
    found = str(script) if script.exists() else shutil.which("ckptfs")
    assert found, "the ckptfs console script is not installed"
    return found


def _limit_memory() -> None:
    """preexec_fn: a child that tries to hold 10**12 ints fails fast instead of swapping."""
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def _files(url: str, opts: dict[str, Any]) -> dict[str, str]:
    """Every stored key with the sha256 of its bytes: what a refused commit must leave alone."""
    storage = open_storage(url, opts)
    try:
        return {k: hashlib.sha256(storage.get(k)).hexdigest() for k in storage.list("")}
    finally:
        storage.close()


def _fresh(url: str, opts: dict[str, Any], **kw: Any) -> tuple[AgentRun, int]:
    """The run as a new process would see it, and the version that load ended at."""
    store = CheckpointStore(url, opts, **kw)
    try:
        run = store.load_run(RUN)
        assert run is not None and store.last_load is not None
        return run, store.last_load.version
    finally:
        store.close()


def _complete(run: AgentRun, sid: str, result: str = "ok") -> Step:
    step = run.steps[sid]
    step.status = StepStatus.COMPLETED
    step.result = result
    return step


def _seed(store: CheckpointStore, n: int = 6) -> tuple[AgentRun, int]:
    """A run saved (v1) with one step done (v2): something a fallback could silently return."""
    run = AgentRun(run_id=RUN, goal="hostile values")
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title=f"step {i}"))
    store.save_run(run)
    return run, store.commit(run, [_complete(run, "s0")])


# ------------------------------------------------------------------ what a reader refuses


@dataclass(frozen=True)
class Hostile:
    """One hostile write: `attempt` makes it (returns the acknowledged version), `revert` undoes
    it in memory, `shown` says what a fresh load made of it, `needle` must be in the error."""

    id: str
    attempt: Callable[[CheckpointStore, AgentRun], int]
    revert: Callable[[AgentRun], None]
    shown: Callable[[AgentRun], str]
    needle: str | None = None


def _step_field(field: str, value: Any) -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        step = _complete(run, "s1")
        setattr(step, field, value)
        return store.commit(run, [step])
    return attempt


def _step_meta(value: Any) -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        step = _complete(run, "s1")
        step.metadata["hostile"] = value
        return store.commit(run, [step])
    return attempt


def _run_meta(value: Any) -> Callable[[CheckpointStore, AgentRun], int]:
    def attempt(store: CheckpointStore, run: AgentRun) -> int:
        run.metadata["hostile"] = value
        return store.commit(run, [])
    return attempt


def _tool_result(store: CheckpointStore, run: AgentRun) -> int:
    return store.log_tool_call(RUN, "s1", ToolCall(tool_name="count", arguments={}, result=BIG_INT))


def _revert_step(run: AgentRun) -> None:
    run.steps["s1"] = Step(id="s1", title="step 1")


def _revert_run(run: AgentRun) -> None:
    run.metadata.pop("hostile", None)


def _show_step(run: AgentRun) -> str:
    s = run.steps["s1"]
    return f"s1 {s.status.value}, cost_usd={s.cost_usd!r}, metadata keys={sorted(s.metadata)}"


def _show_run(run: AgentRun) -> str:
    return f"run.metadata['hostile']={run.metadata.get('hostile', '<absent>')!r:.40}"


def _show_calls(run: AgentRun) -> str:
    return f"s1 tool calls={len(run.steps['s1'].tool_calls)}"


HOSTILE = [
    Hostile("cost-nan", _step_field("cost_usd", float("nan")), _revert_step, _show_step, "cost_usd"),
    Hostile("cost-inf", _step_field("cost_usd", float("inf")), _revert_step, _show_step, "cost_usd"),
    Hostile("bigint-step-metadata", _step_meta(BIG_INT), _revert_step, _show_step),
    Hostile("bigint-run-metadata", _run_meta(BIG_INT), _revert_run, _show_run),
    Hostile("bigint-tool-result", _tool_result, _revert_step, _show_calls),
    Hostile("inline-over-max-decoded", _step_meta("x" * (LIMIT + 1)), _revert_step, _show_step),
    Hostile("nan-run-metadata", _run_meta(float("nan")), _revert_run, _show_run),
    Hostile("set-run-metadata", _run_meta({1, 2}), _revert_run, _show_run),
    Hostile("set-step-metadata", _step_meta({1, 2}), _revert_step, _show_step),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[c.id for c in HOSTILE])
def test_commit_refuses_a_value_a_fresh_load_would_not_return(
        case: Hostile, shared_url: tuple[str, dict[str, Any]]) -> None:
    """The writer knows what its reader refuses (JSON has no NaN, the int and size limits), so
    it must refuse the value itself, clearly and before anything is stored; acknowledging it
    leaves a record every later load skips (or, for NaN and sets, returns changed)."""
    url, opts = shared_url
    store = CheckpointStore(url, opts, max_decoded_bytes=LIMIT)
    try:
        run, _ = _seed(store)
        store.flush()
        before = _files(url, opts)
        try:
            acked = case.attempt(store, run)
        except (CkptfsError, ValueError) as exc:
            refused: Exception | None = exc
        else:
            refused = None
        store.flush()
        if refused is None:
            fresh, version = _fresh(url, opts, max_decoded_bytes=LIMIT)
            pytest.fail(f"{case.id}: commit acknowledged v{acked}, a fresh load returned "
                        f"v{version} with {case.shown(fresh)}; the value should have been refused")
        assert str(refused), f"{case.id}: refused without a message"
        if case.needle is not None:
            assert case.needle in str(refused), f"{case.id}: the error does not name {case.needle}: {refused}"
        assert _files(url, opts) == before, f"{case.id}: the refused commit still wrote files"
    finally:
        store.close()


@pytest.mark.parametrize("case", HOSTILE, ids=[c.id for c in HOSTILE])
def test_innocent_commit_after_a_hostile_one_is_loaded(
        case: Hostile, shared_url: tuple[str, dict[str, Any]]) -> None:
    """Whatever happened to the hostile write, the next innocent commit the writer acknowledges
    must be what a fresh load returns: today the loader falls back to before the hostile record
    and takes every later, valid record down with it."""
    url, opts = shared_url
    store = CheckpointStore(url, opts, max_decoded_bytes=LIMIT)
    try:
        run, _ = _seed(store)
        with contextlib.suppress(CkptfsError, ValueError):
            case.attempt(store, run)
        case.revert(run)
        acked = store.commit(run, [_complete(run, "s2", "innocent")])
    finally:
        store.close()
    fresh, version = _fresh(url, opts, max_decoded_bytes=LIMIT)
    assert (version, fresh.steps["s2"].status, fresh.steps["s2"].result) == (
        acked, StepStatus.COMPLETED, "innocent"), (
        f"{case.id}: innocent commit acknowledged v{acked}, fresh load v{version} "
        f"(s2 {fresh.steps['s2'].status.value})")


# ---------------------------------------------------------------------- through the agent


class _AckLog(CheckpointStore):
    """A CheckpointStore that remembers the newest version any write method acknowledged."""

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


def _exception_text(exc: BaseException) -> str:
    """The message of an error and of its causes, where a clear refusal may be wrapped."""
    parts = []
    cur: BaseException | None = exc
    while cur is not None and len(parts) < 5:
        parts.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or getattr(cur, "cause", None)
    return " <- ".join(parts)


def test_agent_step_with_nan_cost_fails_clearly_and_resume_pays_no_call_twice(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """An executor reporting cost_usd=NaN at step 3 of 20: today execute_run says completed,
    a fresh load has 2 of 20 steps and a resume pays 17 tool calls again. The step must fail
    clearly (naming cost_usd), the store must hold what it acknowledged, and across the first
    run and the resume each paid tool call happens once."""
    url, opts = shared_url
    papers = [f"p{i:02d}" for i in range(1, 21)]
    paid: collections.Counter[str] = collections.Counter()

    def extract(paper: str) -> dict[str, str]:
        paid[paper] += 1
        return {"summary": f"summary of {paper}"}

    store = _AckLog(url, opts)
    agent = CheckpointedAgent(store)
    run = agent.start_run("hostile cost", [Step(id=p, title=p) for p in papers], run_id=RUN)

    def executor(step: Step, prior: list[ToolCall]) -> StepResult:
        out = agent.tools().run("extract", {"paper": step.id}, extract)
        return StepResult(out["summary"], tokens=10, cost_usd=float("nan") if step.id == "p03" else 0.01)

    problems: list[str] = []
    error: BaseException | None = None
    try:
        agent.execute_run(run, executor)
    except Exception as exc:  # a clear refusal may surface as an exception: checked below
        error = exc
    finally:
        store.close()
    p03 = run.steps["p03"]
    if error is not None:
        if "cost_usd" not in _exception_text(error):
            problems.append(f"execute_run raised without naming cost_usd: {_exception_text(error)}")
    elif not (p03.status == StepStatus.FAILED and "cost_usd" in (p03.error or "")):
        problems.append(f"execute_run reported {run.status!r} {run.completed_count}/20 with p03 "
                        f"{p03.status.value} cost_usd={p03.cost_usd!r}")
    fresh, version = _fresh(url, opts)
    if version != store.acked:
        problems.append(f"acknowledged v{store.acked}, fresh load v{version} "
                        f"({fresh.completed_count}/20 completed)")

    store2 = CheckpointStore(url, opts)
    agent2 = CheckpointedAgent(store2)
    try:
        resumed = agent2.resume_run(RUN)
        assert resumed is not None

        def executor2(step: Step, prior: list[ToolCall]) -> StepResult:
            out = agent2.tools().run("extract", {"paper": step.id}, extract)
            return StepResult(out["summary"], tokens=10, cost_usd=0.01)

        agent2.execute_run(resumed, executor2)
    finally:
        store2.close()
    twice = sorted(p for p, n in paid.items() if n > 1)
    if twice:
        problems.append(f"resume paid {len(twice)} tool call(s) again: {twice[:5]}...")
    assert not problems, "; ".join(problems)


# -------------------------------------------------------------------------- planted files


def _seeded_url(url: str, opts: dict[str, Any], commits: int = 3) -> int:
    """A run with a few commits, the store closed: what a planted file is added to."""
    store = CheckpointStore(url, opts)
    try:
        run, version = _seed(store, n=12)
        for i in range(1, commits):
            version = store.commit(run, [_complete(run, f"s{i}")])
        return version
    finally:
        store.close()


@pytest.mark.parametrize("planted", ["garbage", "valid-copy"])
def test_planted_top_version_file_does_not_swallow_later_commits(
        planted: str, shared_url: tuple[str, dict[str, Any]]) -> None:
    """A file at log/999999999999.ckpt made the next version 10**12, whose 13-digit name the
    loader's pattern ignores: "commit acknowledged v1000000000000, fresh reload v4". Each
    commit must load as acknowledged (or be refused with an error naming the planted file)."""
    url, opts = shared_url
    last = _seeded_url(url, opts)
    storage = open_storage(url, opts)
    try:
        prefix = f"runs/{RUN}/log/"
        data = b"garbage" if planted == "garbage" else storage.get(f"{prefix}{last:012d}.ckpt")
        storage.put(f"{prefix}999999999999.ckpt", data)
    finally:
        storage.close()
    store = CheckpointStore(url, opts)
    try:
        run = store.load_run(RUN)
        assert run is not None
        for i in range(3, 6):
            try:
                acked = store.commit(run, [_complete(run, f"s{i}")])
            except CkptfsError as exc:
                assert "999999999999" in str(exc), f"commit refused without naming the planted file: {exc}"
                return
            store.flush()
            _, version = _fresh(url, opts)
            assert version == acked, f"commit acknowledged v{acked}, fresh reload v{version}"
    finally:
        store.close()


@pytest.mark.parametrize("planted", ["garbage", "valid-copy"])
def test_verify_finishes_and_reports_a_planted_top_version_file(planted: str, tmp_path: Path) -> None:
    """`ckptfs verify` checked that journal versions are unbroken by building the list of every
    missing version up to 999999999999 (MemoryError, or hours): it must finish quickly, exit 1
    and name the planted file."""
    url = str(tmp_path / "store")
    last = _seeded_url(url, {})
    log = tmp_path / "store" / "runs" / RUN / "log"
    planted_path = log / "999999999999.ckpt"
    planted_path.write_bytes(b"garbage" if planted == "garbage" else (log / f"{last:012d}.ckpt").read_bytes())
    try:
        proc = subprocess.run([_cli_path(), "verify", url, "--json"], capture_output=True, text=True,
                              timeout=20, preexec_fn=_limit_memory, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("ckptfs verify did not finish within 20 s over a planted log/999999999999.ckpt")
    crash = proc.stderr.strip().splitlines()[-1:] if "Traceback" in proc.stderr else []
    assert not crash, f"ckptfs verify crashed: {crash}"
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-300:]}"
    keys = [f.get("key") or "" for f in json.loads(proc.stdout)["findings"]]
    assert any(k.endswith("log/999999999999.ckpt") for k in keys), f"not reported; findings on {keys}"


def test_directory_named_like_the_next_record_does_not_wedge_commits(tmp_path: Path) -> None:
    """A directory at log/<next version>.ckpt made every commit fail forever with "already
    committed by another writer" (no reload helps). A commit must succeed and load as
    acknowledged, or fail with a clear error that names the path in the way."""
    url = str(tmp_path / "store")
    last = _seeded_url(url, {})
    blocker = f"{last + 1:012d}.ckpt"
    (tmp_path / "store" / "runs" / RUN / "log" / blocker).mkdir()
    for attempt in range(2):  # a reload after the first failure must not meet the same wall
        store = CheckpointStore(url)
        try:
            run = store.load_run(RUN)
            assert run is not None
            try:
                acked = store.commit(run, [_complete(run, f"s{5 + attempt}")])
            except CkptfsError as exc:
                assert blocker in str(exc), (
                    f"attempt {attempt + 1}: commit failed without naming {blocker}: {exc}")
                return
        finally:
            store.close()
        _, version = _fresh(url, {})
        assert version == acked, f"commit acknowledged v{acked}, fresh reload v{version}"

