"""A paid call whose record meets an unavailable store is written again, never paid again.

Found by a review of Workers behind a fault proxy (tests/test_review_workers_s3_faults.py) and
then checked on the agent: a StorageUnavailableError from the write of a paid call's record (a
503 burst past the storage's own retries) went up through the executor as the attempt's
failure, and the retry paid the call a second time, the process alive the whole while. The
agent, sync and async (group commit), now writes the record again while the store is
unavailable; a write that landed with its reply lost is not logged twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ckptfs import CheckpointStore, RetryPolicy, Step, StepResult
from ckptfs.errors import StorageUnavailableError
from ckptfs.runtime.agent import CheckpointedAgent


class Outage:
    """Fails the store's next `n` journal writes with StorageUnavailableError once armed;
    with `lands`, each of them is written first and only its reply is lost."""

    def __init__(self, store: CheckpointStore, n: int, lands: bool, skip: int = 0) -> None:
        self.n, self.lands, self.armed, self.failed, self.skip = n, lands, False, 0, skip
        storage = store.storage
        put = storage.put_if_absent

        def put_if_absent(key: str, data: bytes) -> str:
            if self.armed and "/log/" in key and self.skip:
                self.skip -= 1
            elif self.armed and "/log/" in key and self.failed < self.n:
                self.failed += 1
                if self.lands:
                    put(key, data)
                raise StorageUnavailableError(f"memory://x: put_if_absent {key!r} still failing "
                                              "after 6 attempts: 503 SlowDown")
            return put(key, data)

        storage.put_if_absent = put_if_absent  # type: ignore[method-assign]


@pytest.fixture
def store() -> Iterator[CheckpointStore]:
    st = CheckpointStore(f"memory://paid-{uuid.uuid4().hex[:10]}")
    yield st
    st.close()


def setup(store: CheckpointStore, n: int, lands: bool, skip: int = 0
          ) -> tuple[CheckpointedAgent, Any, Outage, list[int]]:
    agent = CheckpointedAgent(store, retry=RetryPolicy(max_attempts=3, base_delay=0.01))
    run = agent.start_run("paid", [Step(id="a", title="a"), Step(id="b", title="b", dependencies=["a"])])
    return agent, run, Outage(store, n, lands, skip), []


def check(store: CheckpointStore, run_id: str, paid: list[int], outage: Outage, n: int) -> None:
    assert outage.failed == n  # the outage really met the record
    assert paid == [1, 2]  # each call paid once, though its record failed to write
    back = store.load_run(run_id)
    assert back is not None and back.status == "completed"
    assert back.steps["a"].attempt_count == 1  # no attempt failed for it
    for sid in ("a", "b"):
        logged = [c for c in store.get_tool_call_history(run_id, sid) if c.phase == "completed"]
        assert len(logged) == 1, logged  # a record that landed with its reply lost is not doubled


@pytest.mark.parametrize("lands", [False, True], ids=["lost", "landed-reply-lost"])
def test_sync_agent_writes_a_paid_record_again_instead_of_paying_again(
        store: CheckpointStore, lands: bool) -> None:
    agent, run, outage, paid = setup(store, 2, lands)

    def executor(step: Step, prior: Any) -> StepResult:
        x = 1 if step.id == "a" else 2
        return StepResult(agent.tools().run("paid", {"x": x}, tool))

    tool = paid_tool(outage, paid)
    agent.execute_run(run, executor)
    check(store, run.run_id, paid, outage, 2)


@pytest.mark.parametrize("lands", [False, True], ids=["lost", "landed-reply-lost"])
async def test_async_agent_writes_a_paid_record_again_instead_of_paying_again(
        store: CheckpointStore, lands: bool) -> None:
    agent, run, outage, paid = setup(store, 2, lands)
    tool = paid_tool(outage, paid)

    async def executor(step: Step, prior: Any) -> StepResult:
        x = 1 if step.id == "a" else 2
        return StepResult(await agent.tools().arun("paid", {"x": x}, tool))

    await agent.aexecute_run(run, executor, concurrency=2)
    check(store, run.run_id, paid, outage, 2)


def test_an_intent_meeting_an_outage_fails_the_attempt_at_once(store: CheckpointStore) -> None:
    """Nothing is paid before an intent is durable: its write is not held for minutes."""
    agent, run, outage, paid = setup(store, 1, False, skip=1)

    def executor(step: Step, prior: Any) -> StepResult:
        outage.armed = True  # the step's RUNNING mark is let through, then its intent fails
        return StepResult(agent.tools().run("send", {"x": 1}, lambda x: paid.append(x) or "sent",
                                            irreversible=True, guard=lambda call: False))

    agent.execute_run(run, executor)
    back = store.load_run(run.run_id)
    assert back is not None and back.status == "completed"
    assert outage.failed == 1 and back.steps["a"].attempt_count == 2  # the attempt failed, then retried
    assert paid == [1, 1]  # one for each step: never before its intent was durable


def paid_tool(outage: Outage, paid: list[int]) -> Any:
    def tool(x: int) -> str:
        paid.append(x)
        outage.armed = True  # the write that follows is the paid call's record
        return f"result {x}"
    return tool
