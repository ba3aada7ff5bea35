"""verify over S3 (moto server, real HTTP) finds exactly what it finds on local disk."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckptfs.maintenance.verify import Report, verify
from ckptfs.storage.registry import open_storage
from tests.test_integrity_support import KINDS, all_files, build_store, mutate


@pytest.fixture(scope="module")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3base") / "store"
    build_store(str(root))
    return root


def signature(report: Report) -> set[tuple[str, str, str | None, int | None]]:
    return {(f.severity, f.code, f.key, f.version) for f in report.findings}


def test_s3_and_local_find_the_same_problems(base_store: Path, tmp_path: Path, s3_url: str,
                                             s3_opts: dict[str, Any]) -> None:
    local = tmp_path / "store"
    shutil.copytree(base_store, local)
    remote = open_storage(s3_url, s3_opts)
    for key in all_files(local):
        remote.put(key, (local / key).read_bytes())
    assert verify(s3_url, level="data", storage_options=s3_opts).findings == []
    rng = random.Random(99)
    referenced = [k for k in all_files(local) if k.startswith("artifacts/")
                  and k not in verify(str(local)).named_keys()]
    for i in range(len(KINDS)):
        m = mutate(local, rng, KINDS[i % len(KINDS)], referenced)
        for key in m.undo:
            p = local / key
            if p.exists():
                remote.put(key, p.read_bytes())
            else:
                remote.delete(key)
        try:
            on_local = verify(str(local), level="data")
            on_s3 = verify(s3_url, level="data", storage_options=s3_opts)
            assert on_s3.problems and m.expected & on_s3.named_keys(), (m.kind, m.expected)
            assert signature(on_s3) == signature(on_local), m.kind
        finally:
            m.revert(local)
            for key, data in m.undo.items():
                if data is None:
                    remote.delete(key)
                else:
                    remote.put(key, data)
    run_only = verify(s3_url, run_id="beta", level="data", storage_options=s3_opts)
    assert run_only.runs == 1 and run_only.findings == [] and run_only.artifacts_hashed > 0
