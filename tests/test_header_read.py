"""Reading a record's header without its body (`codec.read_header`, `reader.read_run_header`).

A writer resuming an idle run on S3 checks, after its PUT, that the version it builds on is the
one it loaded: it compares that file's header hash with its head's. Where retention left only a
snapshot there, the check used to decode the whole snapshot (measured last session: 150,000 steps
took 2.1 s and 316 MB above the load's peak) to read a few hundred bytes of header. These tests
pin that the header read checks every byte of the file and the body's sha256 (a piece at a time),
never parses the body, agrees with a full decode on every file the store writes, and is what the
base check uses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import CorruptFileError, MisplacedFileError
from ckptfs.format import codec
from ckptfs.format.keys import parse_run_key
from ckptfs.format.reader import decode_run_file, read_run_header
from ckptfs.store.compactor import CompactionPolicy


def _header(body_json: bytes, **over: Any) -> codec.RecordHeader:
    fields: dict[str, Any] = dict(
        format="ckptfs", format_version=1, kind="journal", run_id="r", version=1, base=0,
        base_hash="", body_sha256=codec.sha256_hex(body_json), writer="w", time=time.time())
    fields["hash"] = codec.chain_hash("", fields["body_sha256"], 1)
    fields.update(over)
    return codec.RecordHeader.model_validate(fields)


def _dense_store(url: str, opts: dict[str, Any] | None = None) -> None:
    """A run with journal records, deltas and snapshots: every kind of file the store writes."""
    policy = CompactionPolicy(fanout=2, max_plan=2, min_snapshot_bytes=1, keep_last=0, background=False)
    with CheckpointStore(url, opts, policy=policy) as st:
        run = AgentRun(run_id="r", goal="g", metadata={"note": "ü \u2028 \"q\""})
        for i in range(6):
            run.add_step(Step(id=f"s{i}", title=f"step {i}"))
        st.save_run(run)
        for i in range(6):
            step = run.steps[f"s{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"{i}:" + "x" * 100 * i
            st.commit(run, [step])


def test_the_header_is_the_one_a_full_decode_gives_for_every_file_the_store_writes(memory_url: str) -> None:
    _dense_store(memory_url)
    with CheckpointStore(memory_url) as st:
        keys = st.storage.list("runs/r/")
        kinds = set()
        for key in keys:
            rf = parse_run_key(key)
            assert rf is not None, key
            data = st.storage.get(key)
            assert read_run_header(data, rf, "r") == decode_run_file(data, rf, "r").header, key
            kinds.add(rf.kind)
    assert kinds == {"log", "delta", "snap"}, keys


def test_every_flipped_byte_is_refused_though_the_body_is_not_read() -> None:
    """The trailer's sha256 covers the file: a flip anywhere, the body's bytes included,
    is refused as a full decode refuses it."""
    body = codec.dumps({"run": {"goal": "g" * 300}, "steps": {f"s{i}": {"r": i} for i in range(40)}})
    data = codec.encode(_header(body), body)
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(CorruptFileError):
            codec.read_header(bytes(bad), "k")
    for cut in (0, 1, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptFileError):
            codec.read_header(data[:cut], "k")


def _framed(text: bytes) -> bytes:
    """A document framed as the store frames it (zstd with size and checksum, then the
    skippable-frame trailer holding the sha256 of the frame), whatever the document says: how
    a file that passes every byte check yet disagrees with its own header is made."""
    frame = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(text)
    trailer = (0x184D2A5C).to_bytes(4, "little") + (32).to_bytes(4, "little") + hashlib.sha256(frame).digest()
    return frame + trailer


def test_a_body_that_does_not_hash_to_its_header_is_refused_as_decode_refuses_it() -> None:
    """Every byte check holds (the trailer was made for these bytes: a writer's bug, or a file
    made by hand), the body is not the one the header names. The header read decodes and
    hashes the body a piece at a time: it refuses the file as a full decode does. (Found by a
    review: an idle writer's base check that read the header alone took such a snapshot for
    its base and acknowledged a commit no load returned.)"""
    good = codec.dumps({"run": {"goal": "g"}, "steps": {f"s{i}": "x" * 3000 for i in range(1000)}})
    header = _header(good)  # a 3 MB body: read in pieces
    document = codec.decompress(codec.encode(header, good), "k")
    assert codec.read_header(_framed(document), "k") == header
    prefix = document[: len(document) - len(good) - 1]
    for body in (good[:-1] + b" ", good.replace(b"x", b"y", 1), b'"other"', b""):
        for text in (prefix + body + b"}", prefix + body + b" "):
            data = _framed(text)
            with pytest.raises(CorruptFileError):
                codec.decode(data, "k")
            with pytest.raises(CorruptFileError, match=r"body sha256 does not match|not canonical"):
                codec.read_header(data, "k")


def test_a_body_that_would_not_parse_is_not_parsed() -> None:
    """A body that is not JSON at all, under a header whose sha256 names it: a full decode
    refuses the file, the header read returns the header. So the body is hashed, never
    parsed: what the base check of a large snapshot is spared."""
    body = b"{" * 200_000 + b" not json"
    header = _header(body)
    data = codec.encode(header, body)
    with pytest.raises(CorruptFileError, match="not JSON"):
        codec.decode(data, "k")
    assert codec.read_header(data, "k") == header


@pytest.mark.parametrize("summary", [
    {"nested": {"body": 1}},          # a `,"body":` inside the header: not the canonical split
    {"big": "s" * 200_000},           # a header past what is decoded looking for it
], ids=["body-key-in-summary", "header-past-the-peek"])
def test_a_header_the_peek_cannot_split_is_read_by_a_full_decode(summary: dict[str, Any]) -> None:
    body = codec.dumps({"run": {"goal": "g"}, "steps": {}})
    header = _header(body, summary=summary)
    data = codec.encode(header, body)
    assert codec.read_header(data, "k") == header == codec.decode(data, "k").header


def test_a_file_under_another_name_is_refused_as_the_loader_refuses_it(memory_url: str) -> None:
    _dense_store(memory_url)
    with CheckpointStore(memory_url) as st:
        data = st.storage.get("runs/r/log/000000000003.ckpt")
    rf = parse_run_key("runs/r/log/000000000004.ckpt")
    assert rf is not None
    with pytest.raises(MisplacedFileError):
        read_run_header(data, rf, "r")
    with pytest.raises(MisplacedFileError):
        read_run_header(data, parse_run_key("runs/q/log/000000000003.ckpt") or rf, "q")


_RESUME_AND_COMMIT = """
import json, sys, time, tracemalloc
from ckptfs import CheckpointStore, StepStatus
from ckptfs.format import codec
from ckptfs.store.compactor import CompactionPolicy

reads = []
read_header = codec.read_header
def counted(*args, **kwargs):
    reads.append(args[1])
    return read_header(*args, **kwargs)
codec.read_header = counted
policy = CompactionPolicy(background=False, min_snapshot_bytes=0, keep_last=1, fence_seconds=1.0,
                          superseded_grace=0.0)
with CheckpointStore(sys.argv[1], json.loads(sys.argv[2]), policy=policy) as a:
    run = a.load_run("big")
    time.sleep(0.6)  # past half the fence, however the head is dated: the commit checks its base
    step = run.steps["s0001"]
    step.status, step.result = StepStatus.COMPLETED, "done"
    tracemalloc.start()
    version = a.commit(run, [step])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
print(json.dumps({"version": version, "peak": peak, "header_reads": len(reads)}))
"""


def test_an_idle_s3_writer_checks_a_large_snapshot_base_by_its_header(
        s3_url: str, s3_opts: dict[str, Any]) -> None:
    """Over the embedded S3 server: a run of 3,000 steps (10.6 MB decoded) whose records
    retention took, so its base is the snapshot alone. A writer resumes it past half its fence,
    so its first commit checks that base after the PUT. Measured in the writer's process: that
    commit's peak was 34 MB with a full decode of the snapshot, 0.89 MB with its header read.
    (That a new run of the same id is still told apart by the header's hash is
    test_forget_s3_writer's snapshot-only test, which goes through this same read.)"""
    policy = CompactionPolicy(background=False, min_snapshot_bytes=0, keep_last=1, fence_seconds=1.0,
                              superseded_grace=0.0)
    run = AgentRun(run_id="big", goal="g")
    for i in range(3000):
        run.add_step(Step(id=f"s{i:04d}", title=f"paper {i}", result=f"summary of paper {i} " * 150))
    every_commit = dataclasses.replace(policy, snapshot_ratio=1e-9)  # a snapshot at v2
    with CheckpointStore(s3_url, s3_opts, policy=every_commit) as w:
        w.save_run(run)
        step = run.steps["s0000"]
        step.status = StepStatus.COMPLETED
        w.commit(run, [step])
    time.sleep(1.2)
    with CheckpointStore(s3_url, s3_opts, policy=policy) as p:
        p.apply_retention("big", keep_last=1)
        keys = p.storage.list("runs/big/")
        assert keys == ["runs/big/snap/000000000002.ckpt"], keys
        rf = parse_run_key(keys[0])
        assert rf is not None
        decoded = len(codec.decompress(p.storage.get(keys[0]), keys[0]))
    assert decoded > 10_000_000, decoded
    # The writer is a process of its own, so that what is measured is its memory alone (the
    # embedded server answers from a thread of this one).
    proc = subprocess.run([sys.executable, "-c", _RESUME_AND_COMMIT, s3_url, json.dumps(s3_opts)],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["version"] == 3 and out["header_reads"] >= 1, out
    assert out["peak"] < decoded // 4, (out, decoded)
    with CheckpointStore(s3_url, s3_opts) as fresh:
        again = fresh.load_run("big")
        assert again is not None and again.steps["s0001"].result == "done"
