"""LangGraph's own conformance suite against CkptfsSaver, on local disk and on S3 over HTTP.

Every capability group must be detected and pass, the optional ones (delete_for_runs,
copy_thread, prune) included; a failing group fails the test with the suite's own messages.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from ckptfs.integrations.langgraph import CkptfsSaver


async def _run(name: str, url: str, opts: dict[str, Any]) -> None:
    @checkpointer_test(name=name)
    async def factory() -> AsyncGenerator[CkptfsSaver, None]:
        # a fresh prefix per capability group, as the suite expects a fresh checkpointer
        saver = CkptfsSaver(f"{url}/{uuid.uuid4().hex[:8]}", opts)
        yield saver
        saver.close()  # gives its thread leases back while the store is still there

    report = await validate(factory)
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is not True}
    assert not failures, f"conformance failures: {failures}"
    assert set(report.results) == {c.value for c in Capability}
    assert all(r.detected and r.tests_passed > 0 and r.tests_failed == 0 for r in report.results.values())
    assert report.conformance_level() == "FULL"


async def test_conformance_local_disk(tmp_path: Path) -> None:
    await _run("CkptfsSaver-local", str(tmp_path / "store"), {})


async def test_conformance_s3(s3_url: str, s3_opts: dict[str, Any]) -> None:
    await _run("CkptfsSaver-s3", s3_url, s3_opts)
