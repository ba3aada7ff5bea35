"""IdempotentToolRunner: stable cache keys, durable results, uncached errors, intents and guards.

The intent/guard tests kill a real child process (SIGKILL) between an irreversible call and
its completion record; this file is also that child (`python tests/test_tools.py child ...`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from ckptfs import AgentRun, CheckpointStore, Step, ToolCall  # noqa: E402
from ckptfs.errors import RunStoppedError  # noqa: E402
from ckptfs.runtime.agent import CheckpointedAgent  # noqa: E402
from ckptfs.runtime.tools import (  # noqa: E402
    Done,
    IdempotentToolRunner,
    UnconfirmedActionError,
    cache_key,
    canonical_json,
)

STOPPED = 3


def wipe(store: CheckpointStore) -> None:
    store.flush()
    for key in store.storage.list(""):
        store.storage.delete(key)
    store.close()


@pytest.fixture
def url() -> str:
    return f"memory://tools-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(url: str) -> Iterator[CheckpointStore]:
    st = CheckpointStore(url)
    yield st
    wipe(st)


def saved_run(store: CheckpointStore) -> AgentRun:
    run = AgentRun(goal="tools")
    run.add_step(Step(id="s1", title="fetch"))
    store.save_run(run)
    return run


def test_cache_key_ignores_argument_order_and_is_stable_across_processes() -> None:
    args = {"query": "Python performance", "k": 3, "filters": {"year": 2024, "lang": "en"}, "x": [1.5, None]}
    shuffled = {"x": [1.5, None], "filters": {"lang": "en", "year": 2024}, "k": 3,
                "query": "Python performance"}
    assert cache_key("search", args) == cache_key("search", shuffled)
    assert cache_key("search", args) != cache_key("search2", args)
    assert cache_key("search", {"k": 1}) != cache_key("search", {"k": 1.5})
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    # pinned: a different value here would orphan every cached result in existing stores
    assert cache_key("search", {"query": "Python performance"}) == (
        "9bf2a469c9d1def13a4134fc4f0b5b90ebf4a544bc7ced3e49f195373c7eb665")
    code = ("import json,sys; from ckptfs.runtime.tools import cache_key; "
            "print(cache_key('search', json.loads(sys.argv[1])))")
    keys = set()
    for seed in ("0", "123", "random"):
        out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT)), check=True)
        keys.add(out.stdout.strip())
    assert keys == {cache_key("search", args)}


def test_non_json_arguments_are_refused_before_the_call(store: CheckpointStore) -> None:
    run = saved_run(store)
    runner = IdempotentToolRunner(CheckpointedAgent(store), run.run_id, "s1")
    called = []
    with pytest.raises(TypeError, match="JSON"):
        runner.run("t", {"when": object()}, lambda when: called.append(1))
    with pytest.raises(TypeError, match="JSON"):
        runner.run("t", {"x": float("nan")}, lambda x: called.append(1))
    assert called == []


def test_result_is_durable_before_return(store: CheckpointStore, url: str) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    result = IdempotentToolRunner(agent, run.run_id, "s1").run("add", {"a": 2, "b": 3}, lambda a, b: a + b)
    assert result == 5
    other = CheckpointStore(url)  # what a new process would read
    history = other.get_tool_call_history(run.run_id, "s1")
    assert [(c.tool_name, c.result, c.phase) for c in history] == [("add", 5, "completed")]
    assert history[0].cache_key == cache_key("add", {"a": 2, "b": 3})
    # and a new process's runner serves it without calling
    agent2 = CheckpointedAgent(other)
    calls = []
    again = IdempotentToolRunner(agent2, run.run_id, "s1").run(
        "add", {"b": 3, "a": 2}, lambda a, b: calls.append(1) or -1)
    assert again == 5 and calls == []


def test_errors_are_logged_but_not_cached(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    attempts = []

    def flaky(q: str) -> str:
        attempts.append(q)
        if len(attempts) == 1:
            raise TimeoutError("upstream timeout")
        return q.upper()

    with pytest.raises(TimeoutError):
        runner.run("fetch", {"q": "x"}, flaky)
    assert runner.run("fetch", {"q": "x"}, flaky) == "X"
    assert runner.run("fetch", {"q": "x"}, flaky) == "X"
    assert len(attempts) == 2
    phases = [(c.phase, c.error) for c in store.get_tool_call_history(run.run_id, "s1")]
    assert phases == [("failed", "TimeoutError: upstream timeout"), ("completed", None)]


def test_none_results_are_cached_too(store: CheckpointStore) -> None:
    run = saved_run(store)
    runner = IdempotentToolRunner(CheckpointedAgent(store), run.run_id, "s1")
    calls: list[int] = []
    assert runner.run("void", {}, lambda: calls.append(1)) is None
    assert runner.run("void", {}, lambda: calls.append(1)) is None
    assert calls == [1]


def test_the_seed_articles_keyword_for_the_tool_works(store: CheckpointStore) -> None:
    """`runner.run(name, args, actual_tool_fn=f)`, as the article calls it (a TypeError before:
    the keyword had become `fn`); exactly one of the two names."""
    run = saved_run(store)
    runner = IdempotentToolRunner(CheckpointedAgent(store), run.run_id, "s1")
    calls: list[str] = []
    assert runner.run("search", {"q": "x"}, actual_tool_fn=lambda q: calls.append(q) or "hit") == "hit"
    assert runner.run("search", {"q": "x"}, fn=lambda q: calls.append(q) or "again") == "hit"
    assert calls == ["x"]
    with pytest.raises(TypeError, match="exactly one"):
        runner.run("search", {"q": "y"}, lambda q: q, actual_tool_fn=lambda q: q)
    with pytest.raises(TypeError, match="exactly one"):
        runner.run("search", {"q": "y"})
    assert calls == ["x"]


def test_idempotency_key_is_deterministic_and_reaches_the_tool(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    seen: list[str] = []

    def charge(amount: int, idem: str) -> str:
        seen.append(idem)
        return "charged"

    r1 = IdempotentToolRunner(agent, run.run_id, "s1")
    r1.run("pay", {"amount": 10}, charge, idempotency_key_arg="idem")
    r1.run("pay", {"amount": 20}, charge, idempotency_key_arg="idem")
    assert len(set(seen)) == 2 and all(k.startswith("ckpt-") for k in seen)
    logged = [c.idempotency_key for c in store.get_tool_call_history(run.run_id, "s1")]
    assert logged == seen
    # the key is a function of (run, step, call index, call): a replay reproduces it
    from ckptfs.runtime.tools import idempotency_key

    assert seen[0] == idempotency_key(run.run_id, "s1", 0, cache_key("pay", {"amount": 10}))
    assert seen[1] == idempotency_key(run.run_id, "s1", 1, cache_key("pay", {"amount": 20}))


def test_open_intent_without_guard_refuses_to_call_again(store: CheckpointStore) -> None:
    run = saved_run(store)
    agent = CheckpointedAgent(store)
    intent = ToolCall(tool_name="email", arguments={"to": "x"}, phase="intent",
                      cache_key=cache_key("email", {"to": "x"}), idempotency_key="ckpt-abc")
    agent.record_tool_call(run.run_id, "s1", intent)
    sent: list[str] = []
    runner = IdempotentToolRunner(agent, run.run_id, "s1")
    with pytest.raises(UnconfirmedActionError, match="ckpt-abc"):
        runner.run("email", {"to": "x"}, lambda to: sent.append(to), irreversible=True)
    assert sent == []
    # a guard returning True closes the intent without calling
    assert runner.run("email", {"to": "x"}, lambda to: sent.append(to), irreversible=True,
                      guard=lambda c: Done("was sent")) == "was sent"
    assert sent == []
    assert [c.phase for c in store.get_tool_call_history(run.run_id, "s1")] == ["intent", "completed"]
    # an answer out of type leaves the outcome as unknown as no guard: quoted, clipped
    for n, (answer, shown) in enumerate([("maybe", "returned str 'maybe'"),
                                         (10**5000, "returned int <int that cannot be shown>"),
                                         ({"to": "x" * 10**6}, "returned dict {'to': 'xxx")]):
        agent.record_tool_call(run.run_id, f"s{n + 2}", intent.model_copy(update={"id": f"i{n}"}))
        with pytest.raises(UnconfirmedActionError, match="must return Done") as err:
            IdempotentToolRunner(agent, run.run_id, f"s{n + 2}").run(
                "email", {"to": "x"}, lambda to: sent.append(to), irreversible=True,
                guard=lambda c, answer=answer: answer)  # type: ignore[misc]
        assert f"tool 'email' of step 's{n + 2}'" in str(err.value) and shown in str(err.value)
        assert len(str(err.value)) < 600
    assert sent == []


# ------------------------------------------------------------- real SIGKILL around an email

def _unreachable(intent: ToolCall) -> object:
    raise ConnectionError("mail server unreachable")


# guards a user may get wrong (mode resume_guard_<name>): answers out of type, or a raise
BROKEN_GUARDS: dict[str, Callable[[ToolCall], object]] = {
    "yes": lambda intent: "yes", "one": lambda intent: 1,
    "dict": lambda intent: {"sent": True, "log": "x" * 1_000_000}, "raises": _unreachable}


def child(store_dir: str, outbox: str, mode: str, how: str = "sync") -> int:
    """One process: send the report email (irreversible), then a follow-up step. Each time a
    guard is asked, a line goes to `outbox`.asked."""
    store = CheckpointStore(store_dir)
    agent = CheckpointedAgent(store)
    run_id = "mail-run"
    run = agent.resume_run(run_id, retry_failed=mode == "retry_failed_with_guard")
    if run is None:
        run = agent.start_run("email the weekly report", [
            Step(id="notify", title="email the report"),
            Step(id="archive", title="archive", dependencies=["notify"])], run_id=run_id)

    def send(to: str, body: str, idem: str) -> str:
        if mode == "kill_before_send":
            os.kill(os.getpid(), signal.SIGKILL)
        fd = os.open(outbox, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{idem} {to}\n".encode())
        os.fsync(fd)
        os.close(fd)
        if mode == "kill_after_send":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"sent to {to}"

    def guard(intent: ToolCall) -> object:
        with open(outbox + ".asked", "a") as f:
            f.write(f"{mode}\n")
        if mode.startswith("resume_guard_"):
            return BROKEN_GUARDS[mode.removeprefix("resume_guard_")](intent)
        text = Path(outbox).read_text() if Path(outbox).exists() else ""
        if intent.idempotency_key and intent.idempotency_key in text:
            return Done(f"sent to {intent.arguments['to']} (confirmed)")
        return False

    def executor(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "notify":
            return str(agent.tools().run("send_email", {"to": "team@example.com", "body": "weekly"}, send,
                                         irreversible=True, idempotency_key_arg="idem",
                                         guard=None if mode == "resume_without_guard" else guard))
        return "archived"

    async def aexecutor(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "notify":
            return str(await agent.tools().arun(
                "send_email", {"to": "team@example.com", "body": "weekly"}, send, irreversible=True,
                idempotency_key_arg="idem", guard=None if mode == "resume_without_guard" else guard))
        return "archived"

    try:
        if how == "async":
            asyncio.run(agent.aexecute_run(run, aexecutor))
        else:
            agent.execute_run(run, executor)
    except RunStoppedError as exc:
        print(json.dumps({"stopped": str(exc)}))
        return STOPPED
    print(json.dumps({"status": run.status, "notify": run.steps["notify"].result}))
    return 0


def spawn(store_dir: Path, outbox: Path, mode: str, how: str = "sync") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, __file__, "child", str(store_dir), str(outbox), mode, how],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def lines(p: Path) -> list[str]:
    return p.read_text().splitlines() if p.exists() else []


def test_crash_after_irreversible_call_guard_says_done_no_double_send(tmp_path: Path) -> None:
    store_dir, outbox = tmp_path / "store", tmp_path / "outbox.txt"
    first = spawn(store_dir, outbox, "kill_after_send")
    assert first.returncode == -signal.SIGKILL
    assert len(lines(outbox)) == 1
    history = CheckpointStore(str(store_dir)).get_tool_call_history("mail-run", "notify")
    assert [c.phase for c in history] == ["intent"]  # the completion record never made it
    second = spawn(store_dir, outbox, "resume_with_guard")
    assert second.returncode == 0, second.stderr
    assert len(lines(outbox)) == 1  # no double send
    assert json.loads(second.stdout)["notify"] == "sent to team@example.com (confirmed)"
    run = CheckpointStore(str(store_dir)).load_run("mail-run")
    assert run is not None and run.status == "completed"
    history = CheckpointStore(str(store_dir)).get_tool_call_history("mail-run", "notify")
    assert [c.phase for c in history] == ["intent", "completed"]
    assert history[0].idempotency_key == history[1].idempotency_key


def test_crash_before_the_send_guard_says_not_done_sends_once_with_the_same_key(tmp_path: Path) -> None:
    store_dir, outbox = tmp_path / "store", tmp_path / "outbox.txt"
    assert spawn(store_dir, outbox, "kill_before_send").returncode == -signal.SIGKILL
    assert lines(outbox) == []
    intent = CheckpointStore(str(store_dir)).get_tool_call_history("mail-run", "notify")[0]
    second = spawn(store_dir, outbox, "resume_with_guard")
    assert second.returncode == 0, second.stderr
    assert lines(outbox) == [f"{intent.idempotency_key} team@example.com"]


def test_crash_after_send_without_guard_stops_the_run_rather_than_guess(tmp_path: Path) -> None:
    store_dir, outbox = tmp_path / "store", tmp_path / "outbox.txt"
    assert spawn(store_dir, outbox, "kill_after_send").returncode == -signal.SIGKILL
    second = spawn(store_dir, outbox, "resume_without_guard")
    assert second.returncode == STOPPED, second.stderr
    assert "recorded an intent but no completion" in json.loads(second.stdout)["stopped"]
    assert len(lines(outbox)) == 1
    run = CheckpointStore(str(store_dir)).load_run("mail-run")
    assert run is not None and run.status == "failed" and run.steps["notify"].status.value == "pending"


# each broken guard once, each executor twice: the answer is judged in one place for both
# (`_verdict`), and each case costs three subprocesses (~1.9 s)
@pytest.mark.parametrize("kind, answer, how", [
    ("yes", "its guard returned str 'yes'", "sync"), ("one", "its guard returned int 1", "async"),
    ("dict", "its guard returned dict {'log': 'xxx", "sync"),
    ("raises", "its guard raised ConnectionError: mail server unreachable", "async")])
def test_a_broken_guard_stops_the_run_as_no_guard_does_and_a_mended_one_sends_nothing_twice(
        tmp_path: Path, kind: str, answer: str, how: str) -> None:
    """A guard answering out of type raised TypeError in the step: with the default policy the
    step FAILED at once (a programming error), its dependant SKIPPED, and the way back,
    resume_run(retry_failed=True), fenced the intent off and paid again without asking; a
    raising guard was retried, asking it again, until the retries ran out."""
    store_dir, outbox = tmp_path / "store", tmp_path / "outbox.txt"
    asked = Path(f"{outbox}.asked")
    assert spawn(store_dir, outbox, "kill_after_send", how).returncode == -signal.SIGKILL
    assert len(lines(outbox)) == 1
    for n in (1, 2):  # each resume stops again, asks the guard once, and sends nothing
        broken = spawn(store_dir, outbox, f"resume_guard_{kind}", how)
        assert broken.returncode == STOPPED, broken.stdout + broken.stderr
        stopped = json.loads(broken.stdout)["stopped"]
        assert "tool 'send_email' of step 'notify'" in stopped and answer in stopped, stopped
        assert "must return Done(result) or True" in stopped and len(stopped) < 1000
        assert len(lines(outbox)) == 1 and len(lines(asked)) == n
        run = CheckpointStore(str(store_dir)).load_run("mail-run")
        assert run is not None and run.status == "failed"  # stopped, as with no guard
        assert {s.id: s.status.value for s in run.steps.values()} == {"notify": "pending",
                                                                        "archive": "pending"}
        assert run.steps["notify"].attempt_count == 1 + n  # the resume's own attempt: no retry
    from tests.test_cli_commands import cli

    code, out, err = cli("show", str(store_dir), "mail-run", "--json")
    assert code == 0, err
    shown = {s["id"]: s for s in json.loads(out)["steps"]}
    assert [shown[s]["status"] for s in ("notify", "archive")] == ["pending", "pending"]
    assert answer in shown["notify"]["error"]
    mended = spawn(store_dir, outbox, "resume_with_guard", how)
    assert mended.returncode == 0, mended.stderr
    assert json.loads(mended.stdout) == {"status": "completed",
                                         "notify": "sent to team@example.com (confirmed)"}
    assert len(lines(outbox)) == 1 and len(lines(asked)) == 3
    history = CheckpointStore(str(store_dir)).get_tool_call_history("mail-run", "notify")
    assert [c.phase for c in history] == ["intent", "completed"]


def test_a_broken_guard_fails_a_workers_step_at_once_as_no_guard_does(tmp_path: Path) -> None:
    """Workers fail a step whose paid call's outcome is unknown (one worker cannot stop the
    others); a raising guard was instead retried, asked again each time, then failed."""
    from ckptfs.runtime.policy import RetryPolicy
    from ckptfs.runtime.worker import Worker

    store_dir, outbox = tmp_path / "store", tmp_path / "outbox.txt"
    assert spawn(store_dir, outbox, "kill_after_send").returncode == -signal.SIGKILL
    asked: list[str] = []

    def guard(intent: ToolCall) -> object:
        asked.append(intent.tool_name)
        return _unreachable(intent)

    with CheckpointStore(str(store_dir)) as store:
        worker = Worker(store, retry=RetryPolicy(base_delay=0.0), poll_interval=0.05)

        def executor(step: Step, prior: list[ToolCall]) -> str:
            return str(worker.tools().run("send_email", {"to": "team@example.com", "body": "weekly"},
                                          lambda **_: "resent", irreversible=True, guard=guard))

        report = worker.work("mail-run", executor, idle_timeout=10)
    assert report.failed == ["notify"] and asked == ["send_email"] and len(lines(outbox)) == 1
    run = CheckpointStore(str(store_dir)).load_run("mail-run")
    assert run is not None and run.steps["notify"].status.value == "failed"
    assert "its guard raised ConnectionError" in (run.steps["notify"].error or "")
    # the way back from FAILED, resume_run(retry_failed=True) with a mended guard: it fenced the
    # open intent off and sent the email again without asking; now the guard is asked
    second = spawn(store_dir, outbox, "retry_failed_with_guard")
    assert second.returncode == 0, second.stderr
    assert len(lines(outbox)) == 1, lines(outbox)  # not sent again
    assert lines(Path(str(outbox) + ".asked")) == ["retry_failed_with_guard"]
    assert json.loads(second.stdout)["notify"] == "sent to team@example.com (confirmed)"


@pytest.mark.parametrize("bad", [float("nan"), 10**5000, (1, 2), object(), b"\xff\xfe", b"ok", "\ud800"],
                         ids=["nan", "huge-int", "tuple", "object", "bad-utf8", "bytes", "surrogate"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_paid_call_whose_result_the_store_refuses_is_not_paid_again_on_resume(
        tmp_path: Path, bad: object, mode: str) -> None:
    """A hostile review: the completion record was refused (NaN), nothing said the call was
    paid, and every resume_run paid for it again. Now an `unkept` record says so durably."""
    url, paid = str(tmp_path / "store"), tmp_path / "paid.txt"
    returns: list[object] = [{"v": bad}]

    def tool(q: str) -> object:
        with paid.open("a") as f:
            f.write(q + "\n")
        return returns[0]

    def attempt(guard: object = None) -> AgentRun:
        store = CheckpointStore(url)  # a new store and agent each time: what a new process has
        agent = CheckpointedAgent(store)
        try:
            if mode == "sync":
                def executor(step: Step, prior: list[ToolCall]) -> object:
                    return agent.tools().run("paid", {"q": step.id}, tool, guard=guard)  # type: ignore[arg-type]
                run = agent.resume_run("r") if store.load_run("r") else agent.start_run(
                    "g", [Step(id="a", title="a")], run_id="r")
                return agent.execute_run(run, executor)

            async def aexecutor(step: Step, prior: list[ToolCall]) -> object:
                return await agent.tools().arun("paid", {"q": step.id}, tool, guard=guard)  # type: ignore[arg-type]
            import asyncio
            run = agent.resume_run("r") if store.load_run("r") else agent.start_run(
                "g", [Step(id="a", title="a")], run_id="r")
            return asyncio.run(agent.aexecute_run(run, aexecutor))
        finally:
            store.close()

    with pytest.raises(RunStoppedError):
        attempt()
    assert lines(paid) == ["a"]
    for _ in range(2):  # each resume stops again, and pays for nothing
        with pytest.raises(RunStoppedError) as err:
            attempt()
        assert isinstance(err.value.cause, UnconfirmedActionError)
        assert "could not keep its result" in str(err.value) and "guard=" in str(err.value)
        assert lines(paid) == ["a"]
    history = CheckpointStore(url).get_tool_call_history("r", "a")
    assert [c.phase for c in history] == ["unkept"] and "result not kept" in (history[0].error or "")
    # the caller decides: a guard that has the result (Done) finishes the step without a call
    run = attempt(guard=lambda call: Done({"v": "recovered"}))
    assert run.status == "completed" and run.steps["a"].result == str({"v": "recovered"})
    assert lines(paid) == ["a"]
    history = CheckpointStore(url).get_tool_call_history("r", "a")
    assert [c.phase for c in history] == ["unkept", "completed"]
    assert history[1].result == {"v": "recovered"}


def test_a_guard_may_choose_to_pay_again_for_an_unkept_result(tmp_path: Path) -> None:
    url, paid = str(tmp_path / "store"), tmp_path / "paid.txt"
    returns: list[object] = [float("inf")]

    def tool(q: str) -> object:
        with paid.open("a") as f:
            f.write(q + "\n")
        return returns[0]

    def attempt(guard: object = None) -> AgentRun:
        with CheckpointStore(url) as store:
            agent = CheckpointedAgent(store)
            run = agent.resume_run("r") if store.load_run("r") else agent.start_run(
                "g", [Step(id="a", title="a")], run_id="r")
            return agent.execute_run(run, lambda step, prior: agent.tools().run(
                "paid", {"q": step.id}, tool, guard=guard))  # type: ignore[arg-type]

    with pytest.raises(RunStoppedError):
        attempt()
    returns[0] = 1.5  # the tool mended; the operator says: call it again
    run = attempt(guard=lambda call: False)
    assert run.status == "completed" and run.steps["a"].result == "1.5"
    assert lines(paid) == ["a", "a"]


# a file name that is not UTF-8, as os.listdir gives it back (surrogateescape)
ODD_NAME = b"report-\xff.pdf".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tool_error_naming_an_odd_file_fails_the_step_as_that_error(tmp_path: Path, mode: str) -> None:
    """A tool raised OSError("cannot read report-\\udcff.pdf"): the failed call's record could
    not be written (a lone surrogate), that refusal was raised as an UnstorableResultError
    about the tool's *result*, and the run stopped there, the OSError lost, no record logged;
    each resume called the tool again and stopped again. Now the record keeps the message with
    the surrogate escaped, and the tool's own error goes through the retry policy."""
    from ckptfs.runtime.policy import RetryPolicy

    calls: list[str] = []

    def tool(q: str) -> object:
        calls.append(q)
        raise OSError(f"cannot read {ODD_NAME}")

    with CheckpointStore(str(tmp_path / "s")) as store:
        agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=2, base_delay=0.0, jitter=0.0,
                                                           on_exhausted="fail"))
        run = agent.start_run("g", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"])],
                              run_id="r")
        if mode == "sync":
            done = agent.execute_run(run, lambda step, prior: agent.tools().run("read", {"q": step.id}, tool))
        else:
            import asyncio

            async def aexecutor(step: Step, prior: list[ToolCall]) -> object:
                return await agent.tools().arun("read", {"q": step.id}, tool)
            done = asyncio.run(agent.aexecute_run(run, aexecutor))
    assert calls == ["a", "a"]
    assert done.status == "completed_with_errors" and done.steps["a"].status.value == "failed"
    assert done.steps["a"].error == "OSError: cannot read report-\\udcff.pdf"
    loaded = CheckpointStore(str(tmp_path / "s")).load_run("r")
    assert loaded is not None and loaded.steps["a"].error == done.steps["a"].error
    assert loaded.steps["b"].status.value == "skipped"
    history = CheckpointStore(str(tmp_path / "s")).get_tool_call_history("r", "a")
    failed = ("failed", "OSError: cannot read report-\\udcff.pdf")
    assert [(c.phase, c.error) for c in history] == [failed, failed]


def test_an_executor_error_naming_an_odd_file_is_recorded(tmp_path: Path) -> None:
    """The agent kept `Type: message` raw as the step's error: its commit was refused and
    execute_run raised UnstorableValueError, the failure itself never recorded."""
    from ckptfs.runtime.policy import RetryPolicy

    def executor(step: Step, prior: list[ToolCall]) -> object:
        raise ValueError(f"cannot parse {ODD_NAME}")

    with CheckpointStore(str(tmp_path / "s")) as store:
        agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=1, on_exhausted="stop"))
        run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
        with pytest.raises(RunStoppedError):
            agent.execute_run(run, executor)
    loaded = CheckpointStore(str(tmp_path / "s")).load_run("r")
    assert loaded is not None and loaded.status == "failed"
    assert loaded.metadata["stopped"]["error"] == "ValueError: cannot parse report-\\udcff.pdf"


if __name__ == "__main__":
    sys.exit(child(*sys.argv[2:6]))


@pytest.mark.parametrize("how", ["arun", "run"])
def test_an_async_guard_is_awaited_by_arun(tmp_path: Path, how: str) -> None:
    """A guard written as `async def` (it asks the outside world with the async client the tool
    uses): arun took the coroutine for its answer, stopped the run with "its guard returned
    coroutine" on every resume and left a 'coroutine was never awaited' warning. arun awaits
    it now; run, which cannot, says so, and closes the coroutine."""
    import warnings

    sent: list[str] = []
    crash = [True]

    def send() -> str:
        sent.append("mail")
        if crash[0]:
            raise KeyboardInterrupt  # the process dies mid-call: an intent, no completion
        return "sent"

    async def guard(intent: ToolCall) -> Done:
        return Done("sent (confirmed)")

    def agent_and_executor() -> tuple[CheckpointedAgent, Callable[..., object]]:
        agent = CheckpointedAgent(CheckpointStore(str(tmp_path)))

        async def ex(step: Step, prior: list[ToolCall]) -> str:
            if how == "arun":
                return str(await agent.tools().arun("send", {}, send, irreversible=True, guard=guard))
            return str(agent.tools().run("send", {}, send, irreversible=True, guard=guard))

        return agent, ex

    agent, ex = agent_and_executor()
    run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(agent.aexecute_run(run, ex))  # type: ignore[arg-type]
    crash[0] = False
    agent, ex = agent_and_executor()
    again = agent.resume_run("r")
    assert again is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine never awaited
        if how == "arun":
            asyncio.run(agent.aexecute_run(again, ex))  # type: ignore[arg-type]
            assert again.steps["a"].result == "sent (confirmed)"
        else:
            with pytest.raises(RunStoppedError, match="coroutine function, which only arun can await"):
                asyncio.run(agent.aexecute_run(again, ex))  # type: ignore[arg-type]
    assert sent == ["mail"]


def test_a_monitors_history_shows_calls_another_store_logged_after_its_first_read(
        shared_url: tuple[str, dict[str, Any]]) -> None:
    """A long-lived store (a monitor, a dashboard) reads a step's history, then another process
    logs two calls: the monitor sees them on its next read, as a fresh store does (it kept
    answering 0 until something else made it reload)."""
    url, opts = shared_url
    with CheckpointStore(url, opts) as monitor, CheckpointStore(url, opts) as writer:
        run = AgentRun(run_id="watched", goal="g")
        run.add_step(Step(id="s1", title="fetch"))
        writer.save_run(run)
        assert monitor.get_tool_call_history("watched", "s1") == []
        for i in range(2):
            writer.log_tool_call("watched", "s1", ToolCall(tool_name="search", arguments={"i": i},
                                                           result=f"r{i}", idempotency_key=f"k{i}"))
        seen = monitor.get_tool_call_history("watched", "s1")
        assert [c.result for c in seen] == ["r0", "r1"]
        assert [c.result for c in monitor.get_tool_call_history("watched", "s1", fresh=False)] == ["r0", "r1"]
