"""verify() over a real store: clean means zero findings; 300 real mutations are each found by file."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO, Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.cli import main as cli_main
from ckptfs.errors import ConfigError
from ckptfs.format import codec
from ckptfs.format.keys import log_key, parse_artifact_key
from ckptfs.maintenance.verify import in_subset, verify
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from tests.test_integrity_support import KINDS, POLICY, THRESHOLD, all_files, build_store, mutate

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("base") / "store"
    build_store(str(root))
    return root


@pytest.fixture
def store_copy(base_store: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(base_store, dst)
    return dst


def referenced_artifacts(root: Path) -> list[str]:
    report = verify(str(root))
    unref = {f.key for f in report.findings if f.code == "unreferenced-artifact"}
    return [k for k in all_files(root) if parse_artifact_key(k) and k not in unref]


def test_base_store_has_every_file_kind(base_store: Path) -> None:
    keys = all_files(base_store)
    for part in ("/log/", "/delta/", "/snap/", "artifacts/sha256/"):
        assert any(part in k for k in keys), part
    assert {k.split("/")[1] for k in keys if k.startswith("runs/")} == {"alpha", "beta", "gamma"}


def test_clean_store_has_no_findings(base_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = verify(str(base_store), level="data")
    assert report.findings == [], report.findings
    assert report.ok and report.runs == 3 and report.artifacts_hashed == report.artifacts > 0
    assert cli_main(["verify", str(base_store), "--data", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["findings"] == [] and doc["counts"]["error"] == 0


def test_three_hundred_mutations_each_found_by_file(store_copy: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(20240611)
    referenced = referenced_artifacts(store_copy)
    assert referenced
    seen: Counter[str] = Counter()
    for i in range(300):
        kind = KINDS[i % len(KINDS)]
        m = mutate(store_copy, rng, kind, referenced)
        try:
            code = cli_main(["verify", str(store_copy), "--data", "--json"])
            doc = json.loads(capsys.readouterr().out)
            named = {f["key"] for f in doc["findings"] if f["severity"] in ("error", "warning")}
            assert code == 1, (i, m.kind, m.expected, doc["findings"])
            assert named & m.expected, (i, m.kind, m.expected, doc["findings"])
            seen[kind] += 1
        finally:
            m.revert(store_copy)
    assert set(seen) == set(KINDS) and sum(seen.values()) == 300
    assert verify(str(store_copy), level="data").findings == []


def test_real_subprocess_exit_codes(store_copy: Path) -> None:
    exe = ROOT / ".venv" / "bin" / "ckptfs"
    ok = subprocess.run([str(exe), "verify", str(store_copy), "--json"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    victim = next(k for k in all_files(store_copy) if "/snap/" in k)
    data = bytearray((store_copy / victim).read_bytes())
    data[len(data) // 2] ^= 0x40
    (store_copy / victim).write_bytes(bytes(data))
    bad = subprocess.run([str(exe), "verify", str(store_copy)], capture_output=True, text=True,
                         timeout=120, env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 1
    assert victim in bad.stdout and "error" in bad.stdout


class WriteForbidden(Storage):
    """Delegates reads; any write or delete fails the test."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner.url, inner.options)
        self.inner = inner
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.reads = 0

    def _no(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("verify tried to write")

    put = put_if_absent = put_if_match = put_stream = delete = _no  # type: ignore[assignment]

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        self.reads += 1
        return self.inner.get_with_etag(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self.inner.list(prefix, start_after)

    def list_dirs(self, prefix: str) -> list[str]:
        return self.inner.list_dirs(prefix)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def open_read(self, key: str) -> IO[bytes]:
        self.reads += 1
        return self.inner.open_read(key)


def test_verify_only_reads(store_copy: Path) -> None:
    rng = random.Random(3)
    for kind in KINDS:
        mutate(store_copy, rng, kind, referenced_artifacts(store_copy))
    before = {k: (store_copy / k).read_bytes() for k in all_files(store_copy)}
    guard = WriteForbidden(open_storage(str(store_copy)))
    report = verify(guard, level="data")
    assert guard.reads > 0 and report.count("error") > 0
    run_report = verify(guard, run_id="alpha", level="data")
    assert run_report.runs == 1
    assert {k: (store_copy / k).read_bytes() for k in all_files(store_copy)} == before


def test_subsets_partition_the_artifacts(store_copy: Path) -> None:
    arts = [k for k in all_files(store_copy) if parse_artifact_key(k)]
    hashed = [verify(str(store_copy), level="data", subset=f"{k}/4").artifacts_hashed for k in range(1, 5)]
    assert sum(hashed) == len(arts)
    victim = arts[0]
    data = bytearray((store_copy / victim).read_bytes())
    data[0] ^= 1
    (store_copy / victim).write_bytes(bytes(data))
    sha = parse_artifact_key(victim)
    assert sha is not None
    found = [k for k in range(1, 5)
             if victim in verify(str(store_copy), level="data", subset=f"{k}/4").named_keys()]
    assert found == [k for k in range(1, 5) if in_subset(sha, k, 4)] and len(found) == 1
    for bad in ("0/4", "5/4", "x", "1/0"):
        with pytest.raises(ConfigError):
            verify(str(store_copy), subset=bad)


def test_branch_after_corruption_warns_about_orphans_only(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = CheckpointStore(url, policy=POLICY, artifact_threshold=THRESHOLD)
    run = AgentRun(run_id="r", goal="g")
    for i in range(5):
        run.add_step(Step(id=f"s{i}", title="t", status=StepStatus.COMPLETED, result=f"{i}"))
        store.save_run(run)
    store.close()
    top = max(store.list_versions("r"))
    victim = tmp_path / "s" / log_key("r", top - 1)
    victim.write_bytes(victim.read_bytes()[:-5])
    store = CheckpointStore(url, policy=POLICY, artifact_threshold=THRESHOLD)
    loaded = store.load_run("r")
    assert loaded is not None
    loaded.add_step(Step(id="late", title="t"))
    v = store.save_run(loaded)
    store.close()
    report = verify(url)
    by_code = {(f.code, f.key) for f in report.findings}
    assert ("corrupt", log_key("r", top - 1)) in by_code
    assert ("unreachable", log_key("r", top)) in by_code
    assert all(f.version != v for f in report.findings if f.severity == "error")
    assert report.count("error") == 1


def test_record_with_invalid_graph_is_reported(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = CheckpointStore(url, policy=POLICY)
    run = AgentRun(run_id="r", goal="g")
    run.add_step(Step(id="a", title="t"))
    store.save_run(run)
    store.close()
    # A well-formed record (valid checksums and hash chain) whose step depends on nothing known.
    st = open_storage(url)
    rec = codec.decode(st.get(log_key("r", 1)), "k")
    body = codec.dumps({"run": None, "steps": {"b": Step(id="b", title="t", dependencies=["zz"])
                                                .model_dump(mode="json")}, "removed": [], "tool_log": {}})
    sha = codec.sha256_hex(body)
    header = rec.header.model_copy(update={"version": 2, "base": 1, "base_hash": rec.header.hash,
                                           "body_sha256": sha,
                                           "hash": codec.chain_hash(rec.header.hash, sha, 2)})
    st.put_if_absent(log_key("r", 2), codec.encode(header, body))
    report = verify(url)
    assert [(f.code, f.key) for f in report.problems] == [("graph", log_key("r", 2))]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
