"""Hostile review of the 2026-12-07 changes (7ef8355..717054e): what they left open.

Each test fails on the code as reviewed; none is skipped or expected to fail.

Store, misfiled steps:

* `commit(run, steps)` given Step objects checks a step's key only when its id is no key of the
  run: a run whose keys hold other ids' steps (two steps swapped between keys, an impostor
  `run.steps["b"] = Step(id="a")`, a step renamed in place to an id the run has) was
  acknowledged, and the load returned other steps than the run held under those keys.
* `commit_many` (group commit) checks no key at all: `run.steps["x"] = Step(id="y")` committed
  through a `GroupPart` was acknowledged and stored as "y" (`commit` refuses it).

Runtime:

* An executor that renames its step (`step.id = "zz"`, a validated assignment): execute_run
  raised the store's UnstorableValueError with the run left "running" and the finished step
  not committed; aexecute_run's group commit stored a COMPLETED "zz" beside a pending "a" and
  the run ended "failed" ("no runnable step left").
* An added Step that the store refuses for its content (a subclass field, a lone surrogate in
  its title): UnstorableValueError out of execute_run/aexecute_run, the run left "running"
  and the step that had finished before it not committed, so a resume runs it again.

Values:

* `prune(artifact_grace=...)` is unchecked, beside `superseded_grace`, which goes through
  `seconds_value`: True was a grace of 1 s, NaN was accepted (and the report's JSON holds
  NaN), "1h" was a bare TypeError naming nothing.
* `CompactionPolicy(background="false")` was accepted (a background compactor).
* RetryPolicy/CheckpointPolicy refusals of non-numeric fields repr the value: 10**5000 gave
  int()'s "Exceeds the limit (4300 digits)" naming no field; a 5,000-character granularity
  was echoed whole.
* `MirrorJob(interval="\\uff11\\uff10")` (full-width digits), "1_0" and True were taken as 10, 10 and 1 s,
  where the same digits are refused in a duration, a cron field and an integer setting.

Command line (the real executable):

* `ckptfs mirror SRC DST --cron ''` (or `--interval ''`) ran a one-off mirror pass and exited
  0; `mirror.cron = ""` in the settings file is refused.
* A cron expression that never fires ('0 0 31 2 *') was accepted: `ckptfs mirror --cron` ran
  one pass and then waited forever.
* CKPTFS_KEEP_LAST=10.0 was taken as 10 where `--keep-last 10.0` is refused.
* A store URL that opens but names nothing (a 5,000-character local path, file:// or
  memory:// URL) was echoed whole, twice: 5,000-10,000-character errors.
* `s3:/KEY:SECRET@bucket/<5,000 characters>` (an S3 URL short of a slash, so a local path)
  printed the secret in the OSError's text (the absolute path) on `ckptfs verify`.
* `ckptfs mirror SRC <5,000-character local path> --once` exited 3 ("unexpected OSError").

Exit and threads:

* A non-daemon thread that outlives the main thread cannot load a run (the loader's thread
  pool, after concurrent.futures stopped taking work at interpreter exit), on any store; on
  S3 its commits fail too once the base check is due (fence_seconds / 2 since the last
  confirmation).
* A writer's compaction that lands after another writer's first listing pass (the exit flush
  runs up to 10 s after the last commit, while a successor may already write): its late
  snapshot below the successor's fences makes `ckptfs verify` report a missing journal
  record on a store that loads fine.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_review_prune_cli_hostile import ckptfs

from ckptfs import (
    AgentRun,
    CheckpointedAgent,
    CheckpointPolicy,
    CheckpointStore,
    CompactionPolicy,
    MirrorJob,
    RetryPolicy,
    RunStoppedError,
    Step,
    StepStatus,
    open_storage,
    prune,
)
from ckptfs.errors import ConfigError, UnstorableValueError
from ckptfs.store.group_commit import GroupPart

RUN = "r"
LONG = 5000
MAX_LINE = 1000  # far above a message that cuts a name at 160 characters, far below one echoing 5,000
SECRET = "Dec7HostileSecretValue"


def _store_with(root: Path, ids: str = "abc") -> tuple[CheckpointStore, AgentRun]:
    store = CheckpointStore(str(root))
    run = AgentRun(run_id=RUN, goal="g")
    for sid in ids:
        run.add_step(Step(id=sid, title=sid.upper()))
    store.save_run(run)
    return store, run


def _titles(run: AgentRun) -> dict[str, tuple[str, str]]:
    return {k: (s.id, s.title) for k, s in run.steps.items()}


# ------------------------------------------------------------------ store: misfiled steps


def _swap(run: AgentRun) -> None:
    run.steps["a"], run.steps["b"] = run.steps["b"], run.steps["a"]


def _impostor(run: AgentRun) -> None:
    run.steps["b"] = Step(id="a", title="impostor")


def _renamed_to_an_id_of_the_run(run: AgentRun) -> None:
    run.steps["b"].id = "a"


@pytest.mark.parametrize("misfile", [_swap, _impostor, _renamed_to_an_id_of_the_run])
def test_commit_of_step_objects_refuses_keys_holding_other_ids(
        tmp_path: Path, misfile: Callable[[AgentRun], None]) -> None:
    """commit(run, ["b"]) and save_run refuse each of these; commit(run, <the Step objects>)
    acknowledged them, and the load then differs from the run it acknowledged."""
    store, run = _store_with(tmp_path / "s")
    misfile(run)
    with pytest.raises(UnstorableValueError, match="'b'"):
        store.commit(run, list(run.steps.values()))
    loaded = CheckpointStore(str(tmp_path / "s")).load_run(RUN)
    assert loaded is not None
    assert _titles(loaded) == {"a": ("a", "A"), "b": ("b", "B"), "c": ("c", "C")}


def test_commit_many_refuses_a_misfiled_step_as_commit_does(tmp_path: Path) -> None:
    store, run = _store_with(tmp_path / "s", "a")
    run.steps["x"] = Step(id="y", title="y")
    with pytest.raises(UnstorableValueError, match="'x'"):
        store.commit(run, [run.steps["x"]])  # the ungrouped path refuses it
    part = GroupPart(RUN, run=run, steps=[run.steps["x"]])
    store.commit_many([part])
    assert isinstance(part.future.exception(timeout=10), UnstorableValueError), part.future.result()
    loaded = CheckpointStore(str(tmp_path / "s")).load_run(RUN)
    assert loaded is not None and set(loaded.steps) == {"a"}


# ------------------------------------------------------------------ runtime


def _execute(agent: CheckpointedAgent, run: AgentRun, fn: Callable[[Step], str], mode: str) -> None:
    if mode == "sync":
        agent.execute_run(run, lambda step, calls: fn(step))
    else:
        async def aexec(step: Step, calls: Any) -> str:
            return fn(step)
        asyncio.run(agent.aexecute_run(run, aexec))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_executor_that_renames_its_step_stops_the_run_without_storing_the_new_id(
        tmp_path: Path, mode: str) -> None:
    store = CheckpointStore(str(tmp_path / "s"))
    agent = CheckpointedAgent(store)
    run = agent.start_run("g", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"])],
                          run_id=RUN)

    def rename(step: Step) -> str:
        if step.id == "a":
            step.id = "zz"
        return "ok"

    with pytest.raises(RunStoppedError):
        _execute(agent, run, rename, mode)
    loaded = CheckpointStore(str(tmp_path / "s")).load_run(RUN)
    assert loaded is not None
    assert set(loaded.steps) == {"a", "b"}, _titles(loaded)  # async: a COMPLETED 'zz' was stored
    assert loaded.status == "failed" == run.status


class _Annotated(Step):
    reviewer_note: str = "kept only in memory"


def _subclass_with_a_field() -> Step:
    return _Annotated(id="n", title="n", dependencies=["s0"])


def _lone_surrogate() -> Step:
    return Step(id="n", title="n\udc80", dependencies=["s0"])


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("added", [_subclass_with_a_field, _lone_surrogate])
def test_an_added_step_the_store_refuses_stops_the_run_with_the_finished_step_committed(
        tmp_path: Path, mode: str, added: Callable[[], Step]) -> None:
    """As an added dict or None does (test_runtime_added_nonstep.py): the run stops naming it,
    it is taken back out, and "s0", finished before, is in the checkpoint (else a resume runs
    it again)."""
    store = CheckpointStore(str(tmp_path / "s"))
    agent = CheckpointedAgent(store)
    run = agent.start_run("g", [Step(id=f"s{i}", title="t", dependencies=[f"s{i - 1}"] if i else [])
                                for i in range(3)], run_id=RUN)

    def add(step: Step) -> str:
        if step.id == "s0":
            run.add_step(added())
        return "ok"

    with pytest.raises(RunStoppedError, match="'n'"):
        _execute(agent, run, add, mode)
    loaded = CheckpointStore(str(tmp_path / "s")).load_run(RUN)
    assert loaded is not None
    assert loaded.steps["s0"].status == StepStatus.COMPLETED
    assert "n" not in loaded.steps and loaded.status == "failed" == run.status


# ------------------------------------------------------------------ values


@pytest.mark.parametrize("grace", [True, "1h", math.nan])
def test_prune_artifact_grace_is_checked_by_name_like_superseded_grace(tmp_path: Path, grace: Any) -> None:
    store, _run = _store_with(tmp_path / "s", "a")
    store.close()
    with pytest.raises((TypeError, ValueError), match="artifact_grace"):
        prune(str(tmp_path / "s"), 1, dry_run=True, artifact_grace=grace)


@pytest.mark.parametrize("value", ["false", 0.5, None])
def test_compaction_policy_background_must_be_a_bool(value: Any) -> None:
    with pytest.raises(TypeError, match="background"):
        CompactionPolicy(background=value)


@pytest.mark.parametrize(("build", "field"), [
    (lambda: RetryPolicy(on_exhausted=10**5000), "on_exhausted"),  # type: ignore[arg-type]
    (lambda: RetryPolicy(retry_on=10**5000), "retry_on"),  # type: ignore[arg-type]
    (lambda: CheckpointPolicy(granularity=10**5000), "granularity"),  # type: ignore[arg-type]
    (lambda: CheckpointPolicy(durable_attempts=10**5000), "durable_attempts"),  # type: ignore[arg-type]
    (lambda: CheckpointPolicy(granularity="x" * LONG), "granularity"),  # type: ignore[arg-type]
], ids=["on_exhausted-huge", "retry_on-huge", "granularity-huge", "durable_attempts-huge",
        "granularity-long"])
def test_policy_refusals_name_the_field_and_stay_short(build: Callable[[], object], field: str) -> None:
    with pytest.raises((TypeError, ValueError)) as e:
        build()
    message = str(e.value)
    assert field in message and len(message) < MAX_LINE, message[:300]


@pytest.mark.parametrize("interval", ["\uff11\uff10", "1_0", True])
def test_mirror_job_interval_takes_ascii_digits_only(tmp_path: Path, interval: Any) -> None:
    store, _run = _store_with(tmp_path / "src", "a")
    store.close()
    try:
        job = MirrorJob(str(tmp_path / "src"), str(tmp_path / "dst"), interval=interval)
    except (ConfigError, TypeError) as exc:
        assert "interval" in str(exc)
        return
    job.shutdown()
    pytest.fail(f"interval {interval!r} was taken as {job.interval} s")


# ------------------------------------------------------------------ command line


@pytest.mark.parametrize("option", ["--cron=", "--interval="])
def test_mirror_with_an_empty_schedule_is_a_usage_error(tmp_path: Path, option: str) -> None:
    store, _run = _store_with(tmp_path / "src", "a")
    store.close()
    proc = ckptfs("mirror", tmp_path / "src", tmp_path / "dst", option, "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert option.rstrip("=") in proc.stderr
    assert not (tmp_path / "dst").exists()  # refused before any pass


def test_a_cron_expression_that_never_fires_is_refused(tmp_path: Path) -> None:
    """February 31st: APScheduler's next fire time is None, and `ckptfs mirror --cron` ran one
    pass and then waited forever."""
    proc = ckptfs("config", "show", cwd=tmp_path, env={"CKPTFS_MIRROR_CRON": "0 0 31 2 *"})
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-300:])
    assert "mirror.cron" in proc.stderr or "CKPTFS_MIRROR_CRON" in proc.stderr


def test_keep_last_from_the_environment_is_read_as_the_option_reads_it(tmp_path: Path) -> None:
    """`--keep-last 10.0` is refused ("not a whole number"); CKPTFS_KEEP_LAST=10.0 was 10."""
    store, _run = _store_with(tmp_path / "s", "a")
    store.close()
    option = ckptfs("prune", tmp_path / "s", "--keep-last", "10.0", "--dry-run", cwd=tmp_path)
    env = ckptfs("config", "show", cwd=tmp_path, env={"CKPTFS_KEEP_LAST": "10.0"})
    assert option.returncode == env.returncode, (option.stderr[-200:], env.stdout[-300:])
    if env.returncode == 2:
        assert "CKPTFS_KEEP_LAST" in env.stderr


@pytest.mark.parametrize("form", ["local", "file", "memory"])
def test_a_long_store_url_that_opens_is_named_cut_short(tmp_path: Path, form: str) -> None:
    tail = "p" * LONG
    url = {"local": str(tmp_path / tail), "file": f"file://{tmp_path}/{tail}",
           "memory": f"memory://{tail}"}[form]
    proc = ckptfs("verify", url, cwd=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr) < MAX_LINE, (len(proc.stderr), proc.stderr[:200])


def test_an_s3_url_short_of_a_slash_with_a_long_path_never_prints_its_secret(tmp_path: Path) -> None:
    proc = ckptfs("verify", f"s3:/AKIADEC7KEYID:{SECRET}@bucket/{'p' * LONG}", cwd=tmp_path)
    assert proc.returncode == 2
    assert SECRET not in proc.stderr + proc.stdout, proc.stderr.replace("p" * 100, "")[:600]


def test_mirror_into_an_over_long_local_path_is_a_usage_error(tmp_path: Path) -> None:
    store, _run = _store_with(tmp_path / "src", "a")
    store.close()
    proc = ckptfs("mirror", tmp_path / "src", tmp_path / ("p" * LONG), "--once", "--no-progress",
                  cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-300:])


# ------------------------------------------------------------------ exit and threads

# A non-daemon thread that waits until the main thread has returned (threading's exit hooks,
# concurrent.futures' among them, have run by then), then uses the store.
_AFTER_MAIN = textwrap.dedent("""
    import json, sys, threading, time
    from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus
    url, options, what = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    policy = CompactionPolicy(fence_seconds=0.2)
    store = CheckpointStore(url, options, policy=policy)
    run = AgentRun(run_id="r", goal="g")
    run.add_step(Step(id="a", title="a"))
    run.add_step(Step(id="b", title="b"))
    store.save_run(run)

    def later():
        while threading.main_thread().is_alive():
            time.sleep(0.01)
        time.sleep(0.3)  # past fence_seconds / 2: the next commit checks its base
        try:
            if what == "load":
                got = CheckpointStore(url, options).load_run("r")
                print("OK", got.run_id)
            else:
                step = run.steps["a"]
                step.status, step.result = StepStatus.COMPLETED, "done"
                print("OK", store.commit(run, [step]))
        except Exception as exc:
            print("FAILED", type(exc).__name__, exc)
        sys.stdout.flush()

    threading.Thread(target=later, daemon=False).start()
""")


def _after_main(tmp_path: Path, url: str, options: dict[str, Any], what: str) -> str:
    script = tmp_path / "after_main.py"
    script.write_text(_AFTER_MAIN, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), url, json.dumps(options), what],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return proc.stdout.strip()


def test_a_non_daemon_thread_loads_a_run_after_the_main_thread_returned(tmp_path: Path) -> None:
    out = _after_main(tmp_path, str(tmp_path / "s"), {}, "load")
    assert out.startswith("OK"), out  # FAILED RuntimeError cannot schedule new futures ...


def test_a_non_daemon_thread_commits_on_s3_after_the_main_thread_returned(
        tmp_path: Path, s3_url: str, s3_opts: dict[str, Any]) -> None:
    out = _after_main(tmp_path, s3_url, s3_opts, "commit")
    assert out.startswith("OK"), out
    loaded = CheckpointStore(s3_url, s3_opts).load_run("r")
    assert loaded is not None and loaded.steps["a"].status == StepStatus.COMPLETED


def test_a_writers_late_compaction_leaves_a_store_verify_finds_clean(
        tmp_path: Path, s3_url: str, s3_opts: dict[str, Any]) -> None:
    """Writer A's compaction is held back (as its exit flush may run for 10 s after its last
    commit) while writer B takes the run over, commits once, then more past the fence; B's
    first listing pass retires A's records and its own first one by the store's times. A's
    compaction then writes its snapshot and delta below them: verify reports B's first record
    missing, "above the oldest snapshot", and every later one off the chain, on a store
    whose newest version loads."""
    gate = threading.Event()
    storage = open_storage(s3_url, s3_opts)

    class HeldBack(type(storage)):  # type: ignore[misc]
        def put_if_absent(self, key: str, data: bytes) -> str:
            if "/snap/" in key or "/delta/" in key:
                gate.wait(30)
            return str(super().put_if_absent(key, data))

    storage.__class__ = HeldBack
    policy = CompactionPolicy(fanout=2, max_plan=4, min_snapshot_bytes=1, keep_last=1,
                              superseded_grace=0, fence_seconds=1.0)
    a = CheckpointStore(storage=storage, policy=policy)
    run = AgentRun(run_id=RUN, goal="g")
    for i in range(40):
        run.add_step(Step(id=f"s{i}", title="t"))
    a.save_run(run)
    for i in range(20):
        step = run.steps[f"s{i}"]
        step.status, step.result = StepStatus.COMPLETED, "a"
        a.commit(run, [step])
    b = CheckpointStore(s3_url, s3_opts, policy=policy)
    taken = b.load_run(RUN)
    assert taken is not None
    for i in range(20, 40):
        if i == 21:
            time.sleep(1.5)  # B's first record and all of A's are past the fence
        step = taken.steps[f"s{i}"]
        step.status, step.result = StepStatus.COMPLETED, "b"
        b.commit(taken, [step])
    b.flush()
    gate.set()
    a.close()
    b.close()
    loaded = CheckpointStore(s3_url, s3_opts).load_run(RUN)
    assert loaded is not None and loaded.completed_count == 40
    env = {"CKPTFS_STORAGE_OPTIONS": json.dumps(s3_opts)}
    proc = ckptfs("verify", s3_url, "--json", cwd=tmp_path, env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, [f["message"] for f in report["findings"]][:3]
