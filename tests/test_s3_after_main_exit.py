"""An S3 store whose first request comes after the main thread returned, in a real process.

From then on the interpreter refuses new work to every ThreadPoolExecutor, and aiobotocore
builds its HTTP session's SSL contexts in the event loop's default executor: such a store
failed its first request ("cannot schedule new futures after interpreter shutdown") and the
commit was lost. The child waits for that moment by joining the main thread (the join returns
once threading's exit hooks, concurrent.futures' among them, have run) or writes from an atexit
handler (later still); what it wrote is then read back here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import atexit, json, sys, threading
from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.storage.registry import open_storage

mode, url, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def commit(store=None):
    store = store or CheckpointStore(url, opts)
    run = AgentRun(run_id="late", goal="commit after main returned")
    run.add_step(Step(id="s1", title="the step"))
    store.save_run(run)
    run.steps["s1"].result = "written late"
    store.commit(run, ["s1"])

def raw(storage=None):
    storage = storage or open_storage(url, opts)
    storage.put_if_absent("late/object", b"written late")

def saver():
    ck = empty_checkpoint()
    ck["channel_values"] = {"n": 7}
    ck["channel_versions"] = {"n": 1}
    with CkptfsSaver(url, opts) as s:
        s.put({"configurable": {"thread_id": "late", "checkpoint_ns": ""}}, ck, {"step": 0}, {"n": 1})

def after_main(work, *args):
    def body():
        threading.main_thread().join()  # returns once the interpreter refuses new pool work
        work(*args)
    threading.Thread(target=body).start()  # not a daemon: the interpreter waits for it

if mode == "open-late":
    after_main(commit)
elif mode == "open-early":
    after_main(commit, CheckpointStore(url, opts))
elif mode == "atexit":
    atexit.register(commit)
elif mode == "storage-open-early":
    after_main(raw, open_storage(url, opts))
elif mode == "storage-atexit":
    atexit.register(raw)
elif mode == "storage-used-early-atexit":
    # registered before s3fs's finalizer, so run after it closed the session this put opened
    storage = open_storage(url, opts)
    atexit.register(raw, storage)
    storage.put("early/object", b"written early")
elif mode == "langgraph-late":
    # imported before main returns, as a program imports it (the import itself registers an
    # exit hook, which threading refuses once main has returned)
    from langgraph.checkpoint.base import empty_checkpoint
    from ckptfs.integrations.langgraph import CkptfsSaver
    after_main(saver)
'''


def _child(tmp_path: Path, mode: str, url: str, opts: dict[str, Any],
           env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    # nothing of this machine's AWS set-up: the child's credentials are the ones given here
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "no-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"), PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(script), mode, url, json.dumps(opts)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def _clean(proc: subprocess.CompletedProcess[str]) -> None:
    """The child said nothing: an exception in its late thread is printed, never its exit code."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and not out.strip(), out


@pytest.mark.parametrize("mode", ["open-late", "open-early", "atexit"])
def test_a_checkpoint_store_commits_after_main_returned(
        mode: str, s3: EmbeddedS3, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    """Opened after main returned (in the late thread, in an atexit handler) or before it and
    first used after: the save and the commit land, and load back here."""
    proc = _child(tmp_path, mode, s3_url, s3_opts)
    run = CheckpointStore(s3_url, s3_opts).load_run("late")
    assert run is not None, proc.stderr
    assert run.steps["s1"].result == "written late"
    _clean(proc)


@pytest.mark.parametrize("mode", ["storage-open-early", "storage-atexit", "storage-used-early-atexit"])
def test_storage_from_the_registry_writes_after_main_returned(
        mode: str, s3: EmbeddedS3, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    """Opened before main returned and first used after, opened at exit, or used before
    and again at exit (once s3fs's own atexit finalizer closed the HTTP session it had)."""
    proc = _child(tmp_path, mode, s3_url, s3_opts)
    storage = CheckpointStore(s3_url, s3_opts).storage
    assert storage.exists("late/object"), proc.stderr
    assert storage.get_with_etag("late/object")[0] == b"written late"
    _clean(proc)


def test_credentials_from_a_credential_process_after_main_returned(
        s3: EmbeddedS3, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    """No key in the options: the profile's `credential_process` is run at the first request,
    here after main returned."""
    key, secret = s3_opts["key"], s3_opts["secret"]
    helper = tmp_path / "creds.py"
    creds = {"Version": 1, "AccessKeyId": key, "SecretAccessKey": secret,
             "SessionToken": "token-not-real-0001"}
    helper.write_text(f"print({json.dumps(json.dumps(creds))})\n")
    config = tmp_path / "aws-config"
    config.write_text(f"[profile late]\ncredential_process = {sys.executable} {helper}\n")
    opts = {"profile": "late", "client_kwargs": s3_opts["client_kwargs"]}
    proc = _child(tmp_path, "open-late", s3_url, opts, {"AWS_CONFIG_FILE": str(config)})
    run = CheckpointStore(s3_url, s3_opts).load_run("late")
    assert run is not None, proc.stderr
    assert run.steps["s1"].result == "written late"
    _clean(proc)


def test_a_langgraph_saver_first_used_after_main_returned(
        s3: EmbeddedS3, s3_url: str, s3_opts: dict[str, Any], tmp_path: Path) -> None:
    from ckptfs.integrations.langgraph import CkptfsSaver

    proc = _child(tmp_path, "langgraph-late", s3_url, s3_opts)
    with CkptfsSaver(s3_url, s3_opts) as saver:
        tup = saver.get_tuple({"configurable": {"thread_id": "late"}})
    assert tup is not None, proc.stderr
    assert tup.checkpoint["channel_values"] == {"n": 7}
    _clean(proc)
