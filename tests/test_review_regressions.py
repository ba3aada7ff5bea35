"""Regressions from the second reading of the core: each once lost an acknowledged commit,
crashed a load, or left a partial object. Real processes and real bytes, as everywhere."""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, ConflictError, Step
from ckptfs.errors import CorruptFileError
from ckptfs.format import codec
from ckptfs.storage.registry import open_storage

ROOT = str(Path(__file__).resolve().parent.parent)
# superseded_grace=0: the versions a stale writer must not recreate are gone at once
PRUNING = CompactionPolicy(fanout=4, max_plan=4, min_snapshot_bytes=1, keep_last=1,
                           superseded_grace=0.0, background=False)


# local: records go at once and every commit checks its base with two stats. s3: a pruned
# record stays as a fence (the stale PUT itself is refused, one request); s3-expired: the
# fences are gone and A's head is older than half the fence time, so A checks its base.
@pytest.mark.parametrize("backend", ["local", "s3", "s3-expired"])
def test_stale_writer_cannot_recreate_versions_retention_removed(tmp_path: Path, backend: str,
                                                                 request: pytest.FixtureRequest) -> None:
    if backend == "local":
        url, opts = str(tmp_path), {}
    else:
        url, opts = request.getfixturevalue("s3_url"), request.getfixturevalue("s3_opts")
    policy = PRUNING if backend != "s3-expired" else dataclasses.replace(PRUNING, fence_seconds=0.4)
    a = CheckpointStore(url, opts, policy=policy)
    b = CheckpointStore(url, opts, policy=policy)
    run = AgentRun(run_id="r", goal="g", steps={"s1": Step(id="s1", title="t")})
    a.save_run(run)
    run_b = b.load_run("r")
    assert run_b is not None
    run_b.add_step(Step(id="b_only", title="B's acknowledged work"))
    b.save_run(run_b)
    for i in range(12):  # B moves on; compaction and retention (keep 1) prune old records
        run_b.steps["s1"].description = f"B{i}"
        b.commit(run_b, ["s1"])
        if backend == "s3-expired" and i == 5:
            time.sleep(0.5)  # the snapshots so far age past the fence time
    fence = a.storage.exists("runs/r/log/000000000002.ckpt")
    assert fence == (backend == "s3")
    assert not a.storage.exists("runs/r/snap/000000000002.ckpt")
    run.steps["s1"].description = "stale A"
    with pytest.raises(ConflictError, match="reload the run" if fence else "removed by retention"):
        a.commit(run, ["s1"])
    if fence:  # B's record is still there, untouched
        assert b"stale A" not in codec.decompress(a.storage.get("runs/r/log/000000000002.ckpt"), "k")
    else:
        assert not a.storage.exists("runs/r/log/000000000002.ckpt")  # the stale record was withdrawn
    loaded = CheckpointStore(url, opts).load_run("r")
    assert loaded is not None and "b_only" in loaded.steps and loaded.steps["s1"].description == "B11"
    again = a.load_run("r")  # after reloading, A continues on top of B's work
    assert again is not None
    again.steps["s1"].description = "A after reload"
    a.commit(again, ["s1"])
    final = CheckpointStore(url, opts).load_run("r")
    assert final is not None and "b_only" in final.steps
    assert final.steps["s1"].description == "A after reload"


def test_branch_after_fallback_survives_a_crash_before_compaction(tmp_path: Path) -> None:
    common = textwrap.dedent(f"""
        import os, logging
        logging.disable(logging.WARNING)
        from ckptfs import AgentRun, CheckpointStore, Step
        S = CheckpointStore({str(tmp_path)!r})
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}

    def proc(body: str) -> str:
        return subprocess.run([sys.executable, "-c", common + textwrap.dedent(body)], check=True,
                              env=env, capture_output=True, text=True).stdout

    proc("""
        run = AgentRun(run_id="r", goal="g", steps={"s1": Step(id="s1", title="t"),
                                                    "s2": Step(id="s2", title="u")})
        S.save_run(run)
        run.steps["s1"].result = "x" * 100_000
        run.steps["s1"].status = "completed"
        S.commit(run, ["s1"])
        S.close()
    """)
    art = glob.glob(str(tmp_path / "artifacts/sha256/*/*"))[0]
    data = bytearray(Path(art).read_bytes())
    data[10] ^= 1
    Path(art).write_bytes(bytes(data))  # v2 no longer materialises
    out = proc("""
        run = S.load_run("r")
        run.steps["s2"].description = "acknowledged on the branch"
        print(S.last_load.version, S.commit(run, ["s2"]))
        os._exit(0)  # die before any background work
    """)
    assert out.split() == ["1", "3"]
    loaded = CheckpointStore(str(tmp_path)).load_run("r")
    assert loaded is not None and loaded.steps["s2"].description == "acknowledged on the branch"


def _framed(doc_text: bytes) -> bytes:
    import hashlib

    import zstandard

    frame = zstandard.ZstdCompressor(write_checksum=True).compress(doc_text)
    return frame + (0x184D2A5C).to_bytes(4, "little") + (32).to_bytes(4, "little") + \
        hashlib.sha256(frame).digest()


@pytest.mark.parametrize("text", [b"[" * 100_000 + b"]" * 100_000, b"1" * 5000])
def test_hostile_json_is_a_corrupt_file_not_a_crash(text: bytes) -> None:
    with pytest.raises(CorruptFileError, match="not JSON"):
        codec.decode(_framed(text), "hostile.ckpt")


@pytest.mark.parametrize("body", [
    {"run": None, "steps": {}, "removed": [[1]], "tool_log": {}},
    {"run": None, "steps": {}, "removed": [], "tool_log": {"s1": [1, 2]}},
    {"run": None, "steps": {"s1": {"id": "s1", "title": "t", "$refs": 5}}, "removed": [],
     "tool_log": {}},
])
def test_hostile_record_bodies_fall_back_instead_of_crashing(tmp_path: Path, body: Any) -> None:
    store = CheckpointStore(str(tmp_path))
    run = AgentRun(run_id="r", goal="g", steps={"s1": Step(id="s1", title="t")})
    store.save_run(run)
    body_json = codec.dumps(body)
    head = codec.decode(store.storage.get("runs/r/log/000000000001.ckpt"), "k").header
    sha = codec.sha256_hex(body_json)
    header = codec.RecordHeader(
        format="ckptfs", format_version=1, kind="journal", run_id="r", version=2, base=1,
        base_hash=head.hash, hash=codec.chain_hash(head.hash, sha, 2), body_sha256=sha,
        writer="evil", time=time.time())
    store.storage.put("runs/r/log/000000000002.ckpt", codec.encode(header, body_json))
    loaded = CheckpointStore(str(tmp_path)).load_run("r")
    assert loaded == run  # version 1: the hostile record is skipped, never executed or crashed on


class _FailingSource(io.RawIOBase):
    def __init__(self) -> None:
        self.sent = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.sent >= 2 << 20:
            raise OSError("source disk read error")
        self.sent += 1 << 20
        return b"x" * (1 << 20)


@pytest.mark.parametrize("exclusive", [True, False])
def test_s3_stream_failure_leaves_nothing_visible(s3_url: str, s3_opts: dict[str, Any],
                                                  exclusive: bool) -> None:
    storage = open_storage(s3_url, s3_opts)
    with pytest.raises(OSError, match="source disk read error"):
        storage.put_stream("artifacts/sha256/aa/partial", _FailingSource(), exclusive=exclusive)  # type: ignore[arg-type]
    assert storage.list("artifacts") == []
    assert json.dumps(storage.describe())  # still usable afterwards
    storage.put("ok", b"1")
    assert storage.get("ok") == b"1"
