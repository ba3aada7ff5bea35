"""Property tests: random step graphs, random crash points, results equal to a crash-free run.

Each workload is a random DAG whose steps call 0-2 tools through the idempotent runner;
a tool's output depends on its step, its index and the results of the step's dependencies,
so any replay that served a stale or wrong value would change the final results. Crashes
are exceptions that escape the agent (BaseException, like KeyboardInterrupt) in most
tests, and a real SIGKILL of a child process (this file, run as a script) in one.

Claims checked: the final results equal those of a crash-free run, and every distinct tool
call ran exactly once (a call that returned was logged before anything else could happen).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ckptfs import AgentRun, CheckpointStore, Step, ToolCall  # noqa: E402
from ckptfs.runtime.agent import CheckpointedAgent  # noqa: E402
from ckptfs.runtime.policy import CheckpointPolicy, RetryPolicy  # noqa: E402

Spec = list[dict[str, Any]]  # [{"id", "deps", "tools", "milestone", "flaky"}]
POLICIES = {
    "step": CheckpointPolicy.every_step(),
    "tool_call": CheckpointPolicy.every_tool_call(),
    "every_3": CheckpointPolicy.every_n_steps(3),
    "milestone": CheckpointPolicy.at_milestones(),
}
RETRY = RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0)


class Crash(BaseException):
    """A process dying mid-run, as far as the agent can tell (not an Exception)."""


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def tool_output(step_id: str, k: int, deps: list[str]) -> str:
    return h(f"{step_id}/{k}/{'+'.join(deps)}")


def expected_results(spec: Spec) -> dict[str, str]:
    """What a crash-free run must produce, computed without the agent."""
    out: dict[str, str] = {}
    for s in spec:  # spec order is topological: deps always point backwards
        deps = [out[d] for d in s["deps"]]
        parts = [tool_output(s["id"], k, deps) for k in range(s["tools"])]
        out[s["id"]] = "|".join(parts) or h(f"{s['id']}:{'+'.join(deps)}")
    return out


def make_steps(spec: Spec) -> list[Step]:
    return [Step(id=s["id"], title=f"step {s['id']}", dependencies=list(s["deps"]),
                 milestone=bool(s["milestone"])) for s in spec]


def make_executor(agent: CheckpointedAgent, run: AgentRun, spec: Spec, count: Callable[[str], None],
                  tick: Callable[[], None]) -> Callable[[Step, list[ToolCall]], str]:
    by_id = {s["id"]: s for s in spec}
    flaky_left = {s["id"]: 1 for s in spec if s["flaky"]}

    def executor(step: Step, prior: list[ToolCall]) -> str:
        s = by_id[step.id]
        deps = [run.steps[d].result or "" for d in s["deps"]]
        parts = []
        for k in range(s["tools"]):
            tick()

            def tool(step_id: str, k: int, deps: list[str]) -> str:
                count(f"{step_id}/{k}")
                return tool_output(step_id, k, deps)

            parts.append(agent.tools().run("compute", {"step_id": step.id, "k": k, "deps": deps}, tool))
            tick()
        if flaky_left.get(step.id):
            flaky_left[step.id] -= 1
            raise ConnectionError("transient")  # retried; the tool results come from the log
        tick()
        return "|".join(parts) or h(f"{step.id}:{'+'.join(deps)}")

    return executor


@st.composite
def workloads(draw: st.DrawFn) -> Spec:
    n = draw(st.integers(1, 9))
    spec: Spec = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        spec.append({"id": f"s{i}", "deps": [f"s{d}" for d in sorted(deps)],
                     "tools": draw(st.integers(0, 2)), "milestone": draw(st.booleans()),
                     "flaky": draw(st.booleans()) and draw(st.booleans())})
    return spec


def wipe(url: str) -> None:
    st_ = CheckpointStore(url)
    for key in st_.storage.list(""):
        st_.storage.delete(key)
    st_.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=workloads(), crash_points=st.lists(st.integers(0, 30), max_size=3, unique=True),
       policy=st.sampled_from(sorted(POLICIES)))
def test_crashes_by_exception_change_nothing_but_time(spec: Spec, crash_points: list[int],
                                                      policy: str) -> None:
    url = f"memory://prop-{uuid.uuid4().hex[:10]}"
    calls: Counter[str] = Counter()
    ticks = [0]
    crashes = set(crash_points)

    def tick() -> None:
        ticks[0] += 1
        if ticks[0] in crashes:
            raise Crash()

    run_id = "prop-run"
    processes = 0
    try:
        while True:
            processes += 1
            assert processes <= len(crashes) + 1
            store = CheckpointStore(url)  # a new "process": nothing shared but the store
            agent = CheckpointedAgent(store, policy=POLICIES[policy], retry=RETRY)
            run = agent.resume_run(run_id) or agent.start_run("prop", make_steps(spec), run_id=run_id)
            try:
                agent.execute_run(run, make_executor(agent, run, spec, lambda k: calls.update([k]), tick))
            except Crash:
                store.close()
                continue
            store.close()
            break
        final = CheckpointStore(url).load_run(run_id)
        assert final is not None and final.status == "completed"
        assert {sid: s.result for sid, s in final.steps.items()} == expected_results(spec)
        assert all(n == 1 for n in calls.values()), calls
        assert sum(calls.values()) == sum(s["tools"] for s in spec)
    finally:
        wipe(url)


# ------------------------------------------------------------------ real SIGKILL, real processes

def child_main(store_dir: str, spec_json: str, calls_file: str, kill_at: int) -> int:
    spec: Spec = json.loads(spec_json)
    ticks = [0]

    def tick() -> None:
        ticks[0] += 1
        if ticks[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def count(key: str) -> None:
        fd = os.open(calls_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{key}\n".encode())
        os.close(fd)

    store = CheckpointStore(store_dir)
    agent = CheckpointedAgent(store, retry=RETRY)
    run = agent.resume_run("kill-run") or agent.start_run("kill", make_steps(spec), run_id="kill-run")
    agent.execute_run(run, make_executor(agent, run, spec, count, tick))
    store.close()
    return 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(spec=workloads(), kill_at=st.integers(1, 20))
def test_sigkill_at_a_random_point_then_resume_in_a_new_process(spec: Spec, kill_at: int,
                                                                 tmp_path_factory: Any) -> None:
    work = tmp_path_factory.mktemp("kill")
    store_dir, calls_file = work / "store", work / "calls.txt"

    def spawn(kill: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, __file__, str(store_dir), json.dumps(spec), str(calls_file),
                               str(kill)], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))

    first = spawn(kill_at)
    assert first.returncode in (0, -signal.SIGKILL), first.stderr
    if first.returncode != 0:
        second = spawn(0)
        assert second.returncode == 0, second.stderr
    final = CheckpointStore(str(store_dir)).load_run("kill-run")
    assert final is not None and final.status == "completed"
    assert {sid: s.result for sid, s in final.steps.items()} == expected_results(spec)
    calls = Counter(calls_file.read_text().split()) if calls_file.exists() else Counter()
    assert all(n == 1 for n in calls.values()), calls
    assert sum(calls.values()) == sum(s["tools"] for s in spec)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
