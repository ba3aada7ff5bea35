"""The maintenance CLI: runs/show output, bad input exits 2 with a clear message and no secret."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from backends.s3.embedded import EmbeddedS3, free_port
from ckptfs.cli import main as cli_main
from ckptfs.cli._common import CliError
from ckptfs.cli._options import storage_options_from_args
from ckptfs.maintenance.verify import TEMP_GRACE
from ckptfs.storage.registry import open_storage
from tests.test_integrity_support import all_files, build_store

SECRET = "sup3r-s3cret-VALUE-0042"


@pytest.fixture(scope="module")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "store"
    build_store(str(root))
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_lists_status_progress_and_resumable(base_store: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runs", str(base_store), "--json")
    assert code == 0
    runs = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert set(runs) == {"alpha", "beta", "gamma"}
    assert runs["gamma"]["status"] == "completed" and runs["gamma"]["resumable"] is False
    assert runs["alpha"]["resumable"] is True
    assert runs["alpha"]["completed_steps"] == runs["alpha"]["total_steps"] == 14
    assert runs["beta"]["total_steps"] == 13 and runs["beta"]["version"] > 0
    code, out, _ = run_cli(capsys, "runs", str(base_store))
    assert code == 0 and "alpha" in out and "14/14" in out


def test_show_lists_steps(base_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "show", str(base_store), "beta", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [s["id"] for s in doc["steps"]] == [f"s{i}" for i in range(13)]
    s4 = doc["steps"][4]
    assert s4["status"] == "completed" and s4["attempts"] == 1 and s4["duration_s"] == pytest.approx(1.5)
    assert s4["result"].startswith("result 4")  # the offloaded result's summary, not the artifact
    code, out, _ = run_cli(capsys, "show", str(base_store), "beta")
    assert code == 0 and "s12" in out and "completed" in out


def test_nonexistent_run_exits_2(base_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["show", str(base_store), "nope"], ["verify", str(base_store), "--run", "nope"]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and "'nope' not found" in err and out == ""


def test_bad_usage_exits_2(base_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "verify", str(base_store), "--subset", "11/10")[0] == 2
    assert run_cli(capsys, "verify", str(tmp_path / "nothing-here"))[0] == 2
    code, _, err = run_cli(capsys, "verify", str(base_store), "-o", f"novalue{SECRET}")
    assert code == 2 and SECRET not in err and "KEY=VALUE" in err
    with pytest.raises(SystemExit) as exc:
        cli_main(["verify", "--bogus"])
    assert exc.value.code == 2
    assert run_cli(capsys, "show", str(base_store), "../etc")[0] == 2


def test_leftovers_count_as_problems(base_store: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    shutil.copytree(base_store, root)
    temp = root / "runs" / "alpha" / "log" / ".000000000099.ckpt.tmp-abc"
    temp.write_bytes(b"x")
    stale = time.time() - 3600  # left by a crash an hour ago
    os.utime(temp, (stale, stale))
    (root / "notes.txt").write_text("hello")
    code, out, _ = run_cli(capsys, "verify", str(root), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["counts"] == {"error": 0, "warning": 2, "info": 0}
    assert {f["code"] for f in doc["findings"]} == {"temp-file", "stray"}


def test_a_temp_file_of_a_write_in_flight_is_no_problem(base_store: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Live writers make temp files (a LangGraph saver's lease keeper rewrites its lease through
    one every few seconds, a Worker's heartbeat too): a verify beside a running agent found one
    now and then and exited 1 on a healthy store. A young one is info; past the grace, a leftover."""
    root = tmp_path / "s"
    shutil.copytree(base_store, root)
    (root / "langgraph" / "leases").mkdir(parents=True)
    temp = root / "langgraph" / "leases" / ".t.lease.tmp-84b971a91"
    temp.write_bytes(b"{}")
    code, out, _ = run_cli(capsys, "verify", str(root), "--json")
    doc = json.loads(out)
    assert code == 0, doc
    assert [(f["severity"], f["code"], f["key"]) for f in doc["findings"]] == [
        ("info", "temp-file-young", "langgraph/leases/.t.lease.tmp-84b971a91")]
    stale = time.time() - TEMP_GRACE - 5
    os.utime(temp, (stale, stale))
    code, out, _ = run_cli(capsys, "verify", str(root), "--json")
    assert code == 1 and [f["code"] for f in json.loads(out)["findings"]] == ["temp-file"]


def s3_args(endpoint: str) -> list[str]:
    return ["-o", "key=AKIDEXAMPLE", "-o", f"secret={SECRET}", "-o", f"client_kwargs.endpoint_url={endpoint}",
            "-o", "client_kwargs.region_name=us-east-1", "-o", "config_kwargs.retries.max_attempts=1"]


def test_unreachable_endpoint_exits_2_without_secret(capsys: pytest.CaptureFixture[str]) -> None:
    url = "s3://some-bucket/prefix"
    code, out, err = run_cli(capsys, "verify", url, *s3_args(f"http://127.0.0.1:{free_port()}"))
    assert code == 2 and url in err and SECRET not in out + err
    code, out, err = run_cli(capsys, "verify", url, *s3_args("not a url"))
    assert code == 2 and url in err and SECRET not in out + err
    code, out, err = run_cli(capsys, "runs", url, *s3_args(f"http://127.0.0.1:{free_port()}"))
    assert code == 2 and SECRET not in out + err


def test_missing_bucket_exits_2_without_secret(s3: EmbeddedS3, capsys: pytest.CaptureFixture[str]) -> None:
    """moto accepts any credentials, so a refused login cannot be shown here; a missing bucket can."""
    url = "s3://no-such-bucket-here/p"
    for cmd in ("verify", "prune"):
        extra = ["--keep-last", "1"] if cmd == "prune" else []
        code, out, err = run_cli(capsys, cmd, url, *extra, *s3_args(s3.endpoint))
        assert code == 2 and "no-such-bucket-here" in err and SECRET not in out + err, err


def test_verify_over_s3_cli(base_store: Path, s3_url: str, s3_opts: dict[str, Any],
                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    remote = open_storage(s3_url, s3_opts)
    for key in all_files(base_store):
        remote.put(key, (base_store / key).read_bytes())
    monkeypatch.setenv("CKPTFS_STORAGE_OPTIONS", json.dumps(s3_opts))
    code, out, _ = run_cli(capsys, "verify", s3_url, "--data", "--json")
    assert code == 0 and json.loads(out)["checked"]["runs"] == 3


def test_storage_options_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_STORAGE_OPTIONS", '{"anon": false, "client_kwargs": {"region_name": "x"}}')
    ns = argparse.Namespace(storage_option=["client_kwargs.endpoint_url=http://h:1", "secret=12345",
                                            "config_kwargs.connect_timeout=5", "use_ssl=false"])
    assert storage_options_from_args(ns) == {
        "anon": False, "client_kwargs": {"region_name": "x", "endpoint_url": "http://h:1"},
        "secret": "12345", "config_kwargs": {"connect_timeout": 5}, "use_ssl": False}
    monkeypatch.setenv("CKPTFS_STORAGE_OPTIONS", "{not json")
    with pytest.raises(CliError, match="CKPTFS_STORAGE_OPTIONS"):
        storage_options_from_args(argparse.Namespace(storage_option=[]))
