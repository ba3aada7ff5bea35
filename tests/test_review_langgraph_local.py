"""Review of CkptfsSaver on local disk with real LangGraph graphs, and of the CLI over its
threads: a process SIGKILLed mid-node and resumed by another, deleted threads and deeply nested
subgraph namespaces as `ckptfs threads` / `ckptfs show --thread` show them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import START, StateGraph
from test_cli_commands import cli_json

from ckptfs.integrations.langgraph import CkptfsSaver

ROOT = Path(__file__).resolve().parent.parent


class Count(TypedDict):
    n: int


def _counter() -> StateGraph[Any]:
    b: StateGraph[Any] = StateGraph(Count)
    b.add_node("inc", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "inc")
    return b


def test_show_of_a_deleted_thread_is_not_found_as_threads_says(tmp_path: Path) -> None:
    """`delete_thread` leaves the thread's empty directory on local disk. `ckptfs threads` skips
    it, but `ckptfs show --thread` of it answered exit 0 with `"checkpoints": []` (an empty
    table), where a thread never written is exit 2 not-found. Now both are not-found."""
    url = str(tmp_path / "s")
    long_id = "y" * 300  # hashed segment: its directory stays too
    with CkptfsSaver(url) as saver:
        g = _counter().compile(checkpointer=saver)
        for t in ("gone", "kept", long_id):
            g.invoke({"n": 1}, {"configurable": {"thread_id": t}}, durability="sync")
        saver.delete_thread("gone")
        saver.delete_thread(long_id)
    code, doc, err = cli_json("threads", url)
    assert code == 0, err
    assert [r["thread_id"] for r in doc["threads"]] == ["kept"]
    for t in ("gone", long_id, "never"):
        code, doc, err = cli_json("show", url, "--thread", t)
        assert code == 2, (t[:10], doc)
        assert doc["error"]["code"] == "not-found", doc
    code, doc, err = cli_json("show", url, "--thread", "kept")
    assert code == 0 and len(doc["checkpoints"]) == 3, (doc, err)


def test_a_hashed_subgraph_namespace_is_shown_as_the_saver_lists_it(tmp_path: Path) -> None:
    """A namespace whose encoding passes 200 characters (subgraphs nested a few deep, or a long
    node name) is stored under "~" + sha256 and named only in its objects' headers. The saver's
    `list()` gives the namespace; `threads` and `show --thread` (--json too) gave the hash, so
    a script matching their rows to the saver's (or filtering by checkpoint_ns) found nothing."""
    url = str(tmp_path / "s")
    sub = _counter().compile(checkpointer=True)
    node = "节点/..%~" * 30
    b: StateGraph[Any] = StateGraph(Count)
    b.add_node(node, sub)
    b.add_edge(START, node)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    with CkptfsSaver(url) as saver:
        g = b.compile(checkpointer=saver)
        for i in range(3):
            g.invoke({"n": i}, cfg, durability="sync")
        expected = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg)}
        saver.prune(["t"], keep_last=1)
        after_prune = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg)}
    assert node in expected and after_prune == expected
    code, doc, err = cli_json("threads", url)
    assert code == 0, err
    assert {r["checkpoint_ns"] for r in doc["threads"]} == expected
    code, doc, err = cli_json("show", url, "--thread", "t")
    assert code == 0, err
    assert {r["checkpoint_ns"] for r in doc["checkpoints"]} == expected


_GRAPH = r"""
import json, operator, sys, threading, time
from typing import Annotated, TypedDict
from langgraph.graph import START, END, StateGraph
from langgraph.types import Command, interrupt
from ckptfs.integrations.langgraph import CkptfsSaver

class S(TypedDict):
    log: Annotated[list, operator.add]
    answer: str

url, mode, marker = sys.argv[1], sys.argv[2], sys.argv[3]
_out = threading.Lock()

def say(line):
    # b and c run in parallel threads: print() writes the text and the newline apart, and
    # two of them interleaved ("in-cb-written")
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

def ran(name):
    with open(marker, "a") as f:
        f.write(name + "\n")

def a(s):
    ran("a"); return {"log": ["a"]}
def b(s):
    ran("b"); return {"log": ["b"]}
def c(s):
    ran("c")
    if mode == "hang":
        say("in-c"); time.sleep(600)
    return {"log": ["c"]}
def ask(s):
    ran("ask"); return {"answer": interrupt("question?"), "log": ["ask"]}

bld = StateGraph(S)
for name, fn in [("a", a), ("b", b), ("c", c), ("ask", ask)]:
    bld.add_node(name, fn)
bld.add_edge(START, "a"); bld.add_edge("a", "b"); bld.add_edge("a", "c")
bld.add_edge(["b", "c"], "ask"); bld.add_edge("ask", END)
class Saver(CkptfsSaver):
    def put_writes(self, config, writes, task_id, task_path=""):
        super().put_writes(config, writes, task_id, task_path)
        if mode == "hang" and ("log", ["b"]) in [tuple(w) for w in writes]:
            say("b-written")  # acknowledged: the kill comes after this

g = bld.compile(checkpointer=Saver(url, lease_ttl=1.0, busy_timeout=60))
cfg = {"configurable": {"thread_id": "T/../1"}}
if mode == "hang":
    g.invoke({"log": [], "answer": ""}, cfg, durability="sync")
elif mode == "resume":
    r = g.invoke(None, cfg, durability="sync")
    print(json.dumps({"log": r["log"], "interrupted": "__interrupt__" in r}), flush=True)
    print("hold", flush=True); time.sleep(600)
else:
    r = g.invoke(Command(resume="42"), cfg, durability="sync")
    print(json.dumps({"log": r["log"], "answer": r["answer"]}), flush=True)
"""


def test_a_graph_killed_mid_node_resumes_in_a_new_process(tmp_path: Path) -> None:
    """SIGKILL while one of two parallel nodes runs: a new process resumes the thread (taking
    the dead holder's lease over), reruns only the unfinished node (the finished one's pending
    writes are kept), stops at the interrupt; killed again while holding the interrupted thread,
    a third process answers it with `Command(resume=...)`."""
    url, marker = str(tmp_path / "s"), tmp_path / "ran"

    def start(mode: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", _GRAPH, url, mode, str(marker)], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)

    kid = start("hang")
    assert kid.stdout is not None
    assert sorted(kid.stdout.readline() for _ in range(2)) == ["b-written\n", "in-c\n"]
    kid.send_signal(signal.SIGKILL)
    kid.wait(timeout=30)
    assert sorted(marker.read_text().split()) == ["a", "b", "c"]
    kid = start("resume")
    assert kid.stdout is not None
    first = json.loads(kid.stdout.readline())
    assert kid.stdout.readline() == "hold\n"
    kid.send_signal(signal.SIGKILL)
    kid.wait(timeout=30)
    assert first == {"log": ["a", "b", "c"], "interrupted": True}
    assert sorted(marker.read_text().split()) == ["a", "ask", "b", "c", "c"]  # b did not rerun
    done = subprocess.run([sys.executable, "-c", _GRAPH, url, "answer", str(marker)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"log": ["a", "b", "c", "ask"], "answer": "42"}
    with CkptfsSaver(url) as saver:
        history = list(saver.list({"configurable": {"thread_id": "T/../1"}}))
        parents = [h.parent_config["configurable"]["checkpoint_id"] for h in history if h.parent_config]
        assert len(parents) == len(set(parents)), "the history forked"
    code, doc, err = cli_json("show", url, "--thread", "T/../1")
    assert code == 0 and len(doc["checkpoints"]) == len(history), (doc, err)

