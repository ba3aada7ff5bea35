"""A LangGraph agent that dies mid-run and picks up where it stopped, from ckptfs on S3.

The parent starts the embedded S3 server (moto, loopback only). A first child process runs a
five-node graph with a fake model on a CkptfsSaver and kills itself (os._exit, no cleanup)
inside node 4. A second child opens the same URL and resumes with `invoke(None, ...)`: nodes
1-3 are not run again, node 4 and 5 are. Exit status 0 only if that is what happened.

One writer per thread: the dead child still holds the thread's lease, so the second one first
watches it go unrenewed for a full lease ttl (3 s here, 20 s by default) and then takes the
thread over; a live holder would have got it a `ThreadBusyError` instead.

    .venv/bin/python examples/langgraph_agent.py
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
from typing import Annotated, Any, TypedDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NODES = ["plan", "search", "read", "write", "review"]
CRASH_IN = "write"
LEASE_TTL = 3.0


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    ran: Annotated[list[str], operator.add]


def fake_model(node: str, messages: list[str]) -> str:
    """Deterministic stand-in for an LLM call: no network."""
    return f"[{node}] after {len(messages)} messages: " + "lorem ipsum dolor " * 40


def child(url: str, options: dict[str, Any], crash: bool) -> None:
    from langgraph.graph import END, START, StateGraph

    from ckptfs.integrations.langgraph import CkptfsSaver
    from ckptfs.integrations.langgraph.ownership import read_thread_lease

    def make(node: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            if crash and node == CRASH_IN:
                print(f"  child {os.getpid()}: crashing inside '{node}' (os._exit, no cleanup)", flush=True)
                os._exit(137)
            return {"messages": [fake_model(node, state["messages"])], "ran": [node]}
        return run

    g = StateGraph(State)
    prev = START
    for node in NODES:
        g.add_node(node, make(node))
        g.add_edge(prev, node)
        prev = node
    g.add_edge(prev, END)
    saver = CkptfsSaver(url, options, lease_ttl=LEASE_TTL)
    graph = g.compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "report-42"}}
    if crash:
        graph.invoke({"messages": ["user: write me a report"], "ran": []}, cfg, durability="sync")
        return
    before = graph.get_state(cfg)
    print(f"  child {os.getpid()}: found checkpoint at step {before.metadata['step']}, "
          f"nodes done {before.values['ran']}, next {list(before.next)}", flush=True)
    dead = read_thread_lease(saver.storage, "report-42")
    started = time.monotonic()
    out = graph.invoke(None, cfg, durability="sync")
    now = read_thread_lease(saver.storage, "report-42")
    if dead is not None and now is not None:
        print(f"  child {os.getpid()}: took the thread over from {dead.holder} (generation "
              f"{dead.generation} -> {now.generation}) after {time.monotonic() - started:.1f}s", flush=True)
    print(json.dumps({"ran": out["ran"], "messages": len(out["messages"])}), flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "crash")
        return 0
    from backends.s3.embedded import EmbeddedS3

    with EmbeddedS3(bucket="ckptfs-demo") as s3:
        url = s3.url("langgraph-demo")
        opts = json.dumps(s3.storage_options)
        print(f"embedded S3 at {s3.endpoint}; checkpoints go to {url}")
        print("1) run the agent; it dies inside node 'write'")
        first = subprocess.run([sys.executable, __file__, "--child", url, opts, "crash"],
                               capture_output=True, text=True, timeout=120)
        print(first.stdout, end="")
        print(f"   exit status {first.returncode}")
        print("2) a new process resumes from the stored checkpoint")
        second = subprocess.run([sys.executable, __file__, "--child", url, opts, "resume"],
                                capture_output=True, text=True, timeout=120)
        lines = second.stdout.rstrip().splitlines()
        print("\n".join(lines[:-1]))
        if second.returncode != 0 or not lines:
            print(second.stderr, file=sys.stderr)
            print("resume FAILED")
            return 1
        result = json.loads(lines[-1])
        ok = first.returncode == 137 and result["ran"] == NODES and result["messages"] == 1 + len(NODES)
        print(f"   nodes in the final state: {result['ran']} (each exactly once)")
        print("resume worked: no node ran twice, none was lost" if ok else "resume FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
