"""aexecute_run: concurrency, retries while others run, and resuming after a crash mid-batch.

The SIGKILL test runs this file as a child process that kills itself while several steps
are in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall  # noqa: E402
from ckptfs.errors import RetriesExhaustedError  # noqa: E402
from ckptfs.runtime.agent import CheckpointedAgent  # noqa: E402
from ckptfs.runtime.policy import RetryPolicy  # noqa: E402

WIDTH = 8
FAST = RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0)


class Crash(BaseException):
    pass


def fan() -> list[Step]:
    """root -> w0..w7 (independent) -> join."""
    steps = [Step(id="root", title="root")]
    steps += [Step(id=f"w{i}", title=f"worker {i}", dependencies=["root"]) for i in range(WIDTH)]
    steps.append(Step(id="join", title="join", dependencies=[f"w{i}" for i in range(WIDTH)]))
    return steps


def out(step_id: str, deps: list[str]) -> str:
    return hashlib.sha256(f"{step_id}:{'+'.join(deps)}".encode()).hexdigest()[:8]


def expected() -> dict[str, str]:
    r = {"root": out("root", [])}
    for i in range(WIDTH):
        r[f"w{i}"] = out(f"w{i}", [r["root"]])
    r["join"] = out("join", [r[f"w{i}"] for i in range(WIDTH)])
    return r


def make_executor(agent: CheckpointedAgent, run: AgentRun, count: Callable[[str], None],
                  on_flight: Callable[[int], None], delay: Callable[[str], float]) -> Any:
    in_flight = [0]

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        deps = [run.steps[d].result or "" for d in step.dependencies]
        in_flight[0] += 1
        try:
            on_flight(in_flight[0])

            async def tool(step_id: str, deps: list[str]) -> str:
                await asyncio.sleep(delay(step_id))
                count(step_id)
                return out(step_id, deps)

            result = await agent.tools().arun("compute", {"step_id": step.id, "deps": deps}, tool)
            await asyncio.sleep(0.005)
            return str(result)
        finally:
            in_flight[0] -= 1

    return executor


@pytest.fixture
def url() -> Iterator[str]:
    u = f"memory://async-{uuid.uuid4().hex[:10]}"
    yield u
    st = CheckpointStore(u)
    for key in st.storage.list(""):
        st.storage.delete(key)
    st.close()


def test_independent_steps_run_concurrently_up_to_the_limit(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("fan", fan())
    peaks: list[int] = []
    calls: Counter[str] = Counter()
    ex = make_executor(agent, run, lambda k: calls.update([k]), peaks.append, lambda s: 0.03)
    t0 = time.monotonic()
    asyncio.run(agent.aexecute_run(run, ex, concurrency=3))
    elapsed = time.monotonic() - t0
    assert max(peaks) == 3
    assert {sid: s.result for sid, s in run.steps.items()} == expected()
    assert run.status == "completed" and set(calls.values()) == {1}
    assert elapsed < (WIDTH + 2) * 0.03 + 1.0  # not strictly serial
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and {sid: s.result for sid, s in loaded.steps.items()} == expected()
    store.close()


def test_a_step_waiting_for_retry_does_not_block_the_others(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=2, base_delay=0.0))
    run = agent.start_run("retry", fan())
    finished: list[str] = []

    class RateLimited(Exception):
        retry_after = 0.2

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "w0" and step.attempt_count == 1:
            raise RateLimited("429")
        await asyncio.sleep(0.001)
        finished.append(step.id)
        return "ok"

    asyncio.run(agent.aexecute_run(run, executor, concurrency=2))
    assert finished.index("w0") == WIDTH  # every other worker finished during w0's wait
    assert finished[-1] == "join" and run.steps["w0"].attempt_count == 2
    store.close()


def test_exhaustion_waits_for_steps_in_flight_and_keeps_their_work(url: str) -> None:
    store = CheckpointStore(url)
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=1))
    run = agent.start_run("stop", fan())

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        if step.id == "w1":
            raise ConnectionError("down")
        await asyncio.sleep(0.05 if step.id == "w2" else 0)
        return "ok"

    with pytest.raises(RetriesExhaustedError, match="'w1'"):
        asyncio.run(agent.aexecute_run(run, executor, concurrency=4))
    loaded = CheckpointStore(url).load_run(run.run_id)
    assert loaded is not None and loaded.status == "failed"
    assert loaded.steps["w2"].status == StepStatus.COMPLETED  # in flight at the stop, kept
    assert loaded.steps["w1"].status == StepStatus.PENDING
    assert loaded.steps["join"].status == StepStatus.PENDING
    store.close()


@pytest.mark.parametrize("crash_in", ["w0", "w3", "w6", "join"])
def test_crash_mid_batch_then_resume_gives_the_crash_free_result(url: str, crash_in: str) -> None:
    calls: Counter[str] = Counter()
    armed = [True]

    def delay(step_id: str) -> float:
        return 0.002 * (int(step_id[1:]) % 3) if step_id.startswith("w") else 0.0

    def count(step_id: str) -> None:
        calls.update([step_id])
        if step_id == crash_in and armed[0]:
            armed[0] = False
            raise Crash()  # after the tool ran, before its result was logged: a lost call

    store = CheckpointStore(url)
    agent = CheckpointedAgent(store)
    run = agent.start_run("crash", fan(), run_id="crash-run")
    with pytest.raises(Crash):
        asyncio.run(agent.aexecute_run(run, make_executor(agent, run, count, lambda n: None, delay),
                                       concurrency=4))
    store.close()
    mid = CheckpointStore(url).load_run("crash-run")
    assert mid is not None and mid.status == "running" and mid.steps[crash_in].status != StepStatus.COMPLETED

    store2 = CheckpointStore(url)
    agent2 = CheckpointedAgent(store2)
    again = agent2.resume_run("crash-run")
    assert again is not None
    asyncio.run(agent2.aexecute_run(again, make_executor(agent2, again, count, lambda n: None, delay),
                                    concurrency=4))
    assert {sid: s.result for sid, s in again.steps.items()} == expected()
    # the crashed call was never logged, so it ran again; every other call ran exactly once
    assert calls.pop(crash_in) == 2
    assert set(calls.values()) == {1} and len(calls) == WIDTH + 1
    store2.close()


# ------------------------------------------------------------------ SIGKILL with steps in flight

def child_main(store_dir: str, calls_file: str, kill: str) -> int:
    store = CheckpointStore(store_dir)
    agent = CheckpointedAgent(store)
    run = agent.resume_run("akill") or agent.start_run("akill", fan(), run_id="akill")

    def count(step_id: str) -> None:
        fd = os.open(calls_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{step_id}\n".encode())
        os.close(fd)

    def on_flight(n: int) -> None:
        if kill == "yes" and n == 4 and run.completed_count >= 3:
            os.kill(os.getpid(), signal.SIGKILL)  # four steps in flight, some done

    def delay(step_id: str) -> float:
        return 0.01 * (1 + int(step_id[1:]) % 4) if step_id.startswith("w") else 0.0

    asyncio.run(agent.aexecute_run(run, make_executor(agent, run, count, on_flight, delay), concurrency=4))
    store.close()
    print(json.dumps({sid: s.result for sid, s in run.steps.items()}))
    return 0


def test_sigkill_with_steps_in_flight_then_resume(tmp_path: Path) -> None:
    store_dir, calls_file = tmp_path / "store", tmp_path / "calls.txt"

    def spawn(kill: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, __file__, str(store_dir), str(calls_file), kill],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))

    first = spawn("yes")
    assert first.returncode == -signal.SIGKILL, first.stderr
    mid_store = CheckpointStore(str(store_dir))
    mid = mid_store.load_run("akill")
    assert mid is not None and 3 <= mid.completed_count < WIDTH + 2
    logged = {sid for sid in mid.steps
              if any(c.phase == "completed" for c in mid_store.get_tool_call_history("akill", sid))}
    second = spawn("no")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == expected()
    calls = Counter(calls_file.read_text().split())
    assert set(calls) == set(expected())
    # a call whose result was durable before the kill never ran again; one killed between
    # returning and being logged may run twice (the window `irreversible=True` closes)
    assert all(calls[sid] == 1 for sid in logged) and len(logged) >= 3
    assert all(n <= 2 for n in calls.values())


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1], sys.argv[2], sys.argv[3]))
