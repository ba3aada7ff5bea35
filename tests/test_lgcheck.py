"""`ckptfs verify` on a store a LangGraph saver shares: healthy data is clean (not "stray"), and
flipped bytes, lost versions and junk are reported with the file that holds them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.cli import main as cli_main
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.maintenance.verify import verify
from ckptfs.storage.registry import open_storage
from tests.test_langgraph_saver import _put_chain


def _shared_store(url: str, opts: dict[str, Any] | None = None, log: bool = True) -> list[Any]:
    store = CheckpointStore(url, storage_options=opts)
    try:
        run = AgentRun(run_id="r1", goal="shared")
        run.add_step(Step(id="a", title="a"))
        store.save_run(run)
        saver = CkptfsSaver(store=store, log=log, full_every=4)
        chain = _put_chain(saver, "t", 9)
        saver.put_writes(chain[-1][0], [("__interrupt__", {"q": "?"})], "task-1")
        return chain
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["log", "file-per-put", "s3"])
def test_a_shared_healthy_store_is_clean(tmp_path: Path, backend: str,
                                         request: pytest.FixtureRequest) -> None:
    if backend == "s3":
        url, opts = request.getfixturevalue("s3_url"), request.getfixturevalue("s3_opts")
    else:
        url, opts = str(tmp_path / "s"), {}
    _shared_store(url, opts, log=backend == "log")
    for level in ("structure", "data"):
        report = verify(url, level=level, storage_options=opts)
        assert report.ok, [f.to_dict() for f in report.findings]
        assert report.runs == 1


def test_a_flipped_byte_in_the_log_is_an_error_naming_it(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    _shared_store(url)
    log = tmp_path / "s" / "langgraph" / "threads" / "t" / "_" / ".records"
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0x10
    log.write_bytes(bytes(data))
    assert cli_main(["verify", url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    codes = {(f["code"], f["key"]) for f in doc["findings"]}
    assert ("lg-damaged-record", "langgraph/threads/t/_/.records") in codes


def test_data_level_rebuilds_every_chain(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    chain = _shared_store(url, log=False)
    raw = open_storage(url)
    keys = raw.list("langgraph/threads/t/_/ckpt/")
    assert len(keys) == len(chain)
    # damage the whole copy the first deltas build on, inside a channel frame: every frame has
    # its own checksum, so structure still parses; only rebuilding the values finds it
    data = bytearray(raw.get(keys[0]))
    data[-20] ^= 0x01
    raw.put(keys[0], bytes(data))
    assert verify(url, level="structure").ok
    report = verify(url, level="data")
    corrupt = {f.key for f in report.findings if f.code == "lg-corrupt"}
    assert corrupt == {keys[0]}
    # the checkpoints whose values build on it are named as unreadable too
    assert {f.code for f in report.findings} == {"lg-corrupt", "lg-unreadable"}


def test_a_lost_version_and_junk_are_reported(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _shared_store(url, log=False)
    raw = open_storage(url)
    first = raw.list("langgraph/threads/t/_/ckpt/")[0]
    raw.delete(first)
    raw.put("langgraph/threads/t/_/notes.txt", b"junk")
    raw.put("langgraph/runs/r1/t/_", b"not json")
    findings = {(f.code, f.severity) for f in verify(url).findings}
    assert ("lg-missing-version", "error") in findings
    assert ("stray", "warning") in findings
    assert ("lg-bad-marker", "error") in findings


def test_a_linked_or_fifo_log_is_one_finding_and_the_rest_is_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One log that is a symbolic link or a FIFO must not end verify: it is one finding naming
    it, and damage elsewhere in the store is still reported."""
    url = str(tmp_path / "s")
    saver = CkptfsSaver(url)
    _put_chain(saver, "t1", 3)
    _put_chain(saver, "t2", 3)
    saver.close()
    threads = tmp_path / "s" / "langgraph" / "threads"
    data = bytearray((threads / "t2" / "_" / ".records").read_bytes())
    data[len(data) // 2] ^= 0x10
    (threads / "t2" / "_" / ".records").write_bytes(bytes(data))
    (threads / "zz" / "_").mkdir(parents=True)
    (threads / "zz" / "_" / ".records").symlink_to("../../t1/_/.records")
    (threads / "ff" / "_").mkdir(parents=True)
    os.mkfifo(threads / "ff" / "_" / ".records")
    assert cli_main(["verify", url, "--json"]) == 1  # was: one "corrupt:" line, no report
    findings = {f["key"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert findings["langgraph/threads/zz/_/.records"]["code"] == "lg-unreadable-log"
    assert "symbolic link" in findings["langgraph/threads/zz/_/.records"]["message"]
    assert findings["langgraph/threads/ff/_/.records"]["code"] == "lg-unreadable-log"
    assert "FIFO" in findings["langgraph/threads/ff/_/.records"]["message"]
    assert findings["langgraph/threads/t2/_/.records"]["code"] == "lg-damaged-record"
    assert set(findings) - {None} == {f"langgraph/threads/{t}/_/.records" for t in ("zz", "ff", "t2")}


def test_threads_lists_the_other_threads_past_a_linked_or_fifo_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ckptfs threads` stopped at the first namespace whose log is a link or a FIFO (exit 1,
    nothing listed): now that namespace is skipped with a warning naming it."""
    url = str(tmp_path / "s")
    saver = CkptfsSaver(url)
    _put_chain(saver, "t1", 3)
    saver.close()
    threads = tmp_path / "s" / "langgraph" / "threads"
    (threads / "zz" / "_").mkdir(parents=True)
    (threads / "zz" / "_" / ".records").symlink_to("../../t1/_/.records")
    (threads / "ff" / "_").mkdir(parents=True)
    os.mkfifo(threads / "ff" / "_" / ".records")
    assert cli_main(["threads", url, "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["thread_id"] for r in json.loads(captured.out)["threads"]] == ["t1"]
    assert "langgraph/threads/zz/_/ skipped" in captured.err and "symbolic link" in captured.err
    assert "langgraph/threads/ff/_/ skipped" in captured.err and "FIFO" in captured.err
