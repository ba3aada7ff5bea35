"""Child process for the group-commit SIGKILL test: aexecute_run, 64 steps in flight, forever.

Every acknowledgement it sees is appended to a side file the moment it is seen: a completion
(`step_completed`, which fires only once the step's record is durable) as "done <id>", a tool
result (`arun` returned, so it must be durable) as "tool <id>". One `os.write` per line on an
O_APPEND descriptor: the kernel keeps it whatever happens to this process afterwards.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from ckptfs import CheckpointStore, CompactionPolicy, Step, ToolCall
from ckptfs.runtime.agent import CheckpointedAgent
from ckptfs.runtime.execution import ProgressEvent

STEPS = 20_000


def main() -> None:
    url, side, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def ack(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "step_completed" and event.step_id is not None:
            ack(f"done {event.step_id}")

    policy = CompactionPolicy(fanout=4, max_plan=6, min_snapshot_bytes=8192, keep_last=2)
    store = CheckpointStore(url, policy=policy)
    agent = CheckpointedAgent(store, on_progress=on_progress)
    run = agent.resume_run("gc") or agent.start_run(
        "survive SIGKILL with 64 steps in flight",
        [Step(id=f"s{i:05d}", title=f"step {i}") for i in range(STEPS)], run_id="gc")

    async def tool(step: str) -> str:  # the call's arguments, as keywords
        await asyncio.sleep(rng.uniform(0.0, 0.002))
        return f"paid for {step}"

    async def executor(step: Step, prior: list[ToolCall]) -> str:
        await asyncio.sleep(rng.uniform(0.0, 0.003))
        if int(step.id[1:]) % 3 == 0:  # a third of the steps pay for a tool call
            await agent.tools().arun("pay", {"step": step.id}, tool)
            ack(f"tool {step.id}")
        return f"result of {step.id}"

    print("ready", flush=True)
    asyncio.run(agent.aexecute_run(run, executor, concurrency=64))


if __name__ == "__main__":
    main()
