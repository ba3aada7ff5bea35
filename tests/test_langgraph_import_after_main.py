"""The LangGraph saver imported for the first time after the main thread returned, in a real process.

Its ownership module registers a hook that releases thread leases at exit; registering one
once the interpreter is exiting raises ("can't register atexit after shutdown"), so the import
itself failed and the worker thread doing it lost its checkpoint. (LangChain needs
concurrent.futures.thread imported before then, as any program that started a thread pool has.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckptfs.integrations.langgraph import CkptfsSaver

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import sys, threading
import concurrent.futures.thread  # a program that used a thread pool in main()

url = sys.argv[1]

def late():
    threading.main_thread().join()  # returns once threading's exit hooks have run
    from langgraph.checkpoint.base import empty_checkpoint
    from ckptfs.integrations.langgraph import CkptfsSaver
    ck = empty_checkpoint()
    ck["channel_values"] = {"n": 7}
    ck["channel_versions"] = {"n": 1}
    with CkptfsSaver(url) as s:
        s.put({"configurable": {"thread_id": "late", "checkpoint_ns": ""}}, ck, {"step": 0}, {"n": 1})

threading.Thread(target=late).start()  # not a daemon: the interpreter waits for it
'''


def test_a_saver_imported_and_used_after_main_returned_writes_its_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    url = (tmp_path / "store").as_uri()
    proc = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert "can't register atexit" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr == "", proc.stderr[-2000:]
    with CkptfsSaver(url) as saver:
        tup = saver.get_tuple({"configurable": {"thread_id": "late"}})
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"n": 7}
