"""`ckptfs restore --run R` and `ckptfs mirror --run R` list the run once on the source.

The command checks the run exists before it touches DST (exit 2 for a run SRC does not
hold), then the library planned from a listing of its own: two LISTs of runs/R/ on S3,
counted over real HTTP through the recording proxy. The command's listing is passed
through (`listings=`), as `ckptfs versions` passes its own to `restore_points(keys=)`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest
from _fault_proxy import FaultProxy, Request
from test_cli_commands import CLI
from test_mirror import POLICY, RUN, work

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore
from ckptfs.format.keys import parse_run_key, run_prefix
from ckptfs.replication.mirror import mirror
from ckptfs.replication.restore import restore
from ckptfs.storage.registry import open_storage


def _env(s3: EmbeddedS3) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=s3.region)
    return env


def _run_lists(seen: list[Request]) -> list[str]:
    quoted = "runs%2F" + RUN
    return [r.path for r in seen if r.method == "GET" and "list-type" in r.path and quoted in r.path]


def _counted(s3: EmbeddedS3, tmp_path: Path, *args: str) -> tuple[dict[str, object], list[str]]:
    seen: list[Request] = []
    with FaultProxy(s3.endpoint, seen.append) as proxy:
        got = subprocess.run([CLI, *args, f"client_kwargs.endpoint_url={proxy.endpoint}", "--json",
                              "--no-progress"], capture_output=True, text=True, env=_env(s3),
                             timeout=120, cwd=tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    return json.loads(got.stdout), _run_lists(seen)


def test_restore_of_one_run_lists_it_once(s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 8)
    assert mirror(src, s3_url, dst_options=s3.storage_options, latest=True).ok
    dst = tmp_path / "restored"
    doc, lists = _counted(s3, tmp_path, "restore", s3_url, str(dst), "--run", RUN, "--from-option")
    assert doc["ok"] and doc["runs"][0]["status"] == "restored", doc  # type: ignore[index]
    assert len(lists) == 1, lists
    assert CheckpointStore(str(dst)).load_run(RUN) == store.load_run(RUN)


def test_mirror_of_one_run_lists_it_once(s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    store = CheckpointStore(s3_url, s3.storage_options, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 8)
    dst = tmp_path / "mirror"
    doc, lists = _counted(s3, tmp_path, "mirror", s3_url, str(dst), "--once", "--latest", "--run", RUN,
                          "--from-option")
    assert doc["ok"] and doc["runs"][0]["status"] == "mirrored", doc  # type: ignore[index]
    assert len(lists) == 1, lists
    assert CheckpointStore(str(dst)).load_run(RUN) == store.load_run(RUN)
    store.close()


def test_a_stale_listing_is_planned_again_from_a_fresh_one(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A listing handed in may name a file retention removed since: the read's
    FileNotFoundError makes the pass list the run again, as it does for its own listing."""
    src, mir = str(tmp_path / "src"), str(tmp_path / "mirror")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 8)
    st = open_storage(src)
    listed = st.list(run_prefix(RUN))
    st.close()
    head = max(rf.version for k in listed if (rf := parse_run_key(k)) is not None)
    stale = {*listed, f"runs/{RUN}/log/000000000099.ckpt"}  # a file that is gone by the pass
    with caplog.at_level(logging.INFO, logger="ckptfs.replication"):
        report = mirror(src, mir, run_id=RUN, latest=True, listings={RUN: stale})
        assert report.ok and report.runs[0].version == head, report.to_dict()
        dst = str(tmp_path / "restored")
        rreport = restore(mir, dst, run_id=RUN, listings={RUN: stale})
        assert rreport.ok and rreport.runs[0].status == "restored", rreport.to_dict()
    assert sum("planning again" in r.getMessage() for r in caplog.records) == 2, caplog.records
    assert CheckpointStore(dst).load_run(RUN) == store.load_run(RUN)
