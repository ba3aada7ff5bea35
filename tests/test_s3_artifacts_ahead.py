"""A load from S3 fetches a run's artifacts together, not one round trip after another.

A resumed agent loads its run with every large value back in place; on S3 each artifact is a
GET. Fetched in turn, 300 of them cost 300 round trips (1.4 s on the loopback moto server,
~9 s at a real region's ~30 ms). Over real HTTP, through a proxy that holds each artifact GET
for 0.3 s: fetched in turn, no two GETs can arrive within 0.3 s of each other; together, many
do. What comes back, and what a missing or altered artifact does to the load, is unchanged.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from _fault_proxy import Fault, FaultProxy, Request

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, CompactionPolicy, Step, StepStatus, ToolCall

POLICY = CompactionPolicy(background=False, keep_last=0)
HOLD = 0.3


class HoldArtifacts:
    """Holds every artifact GET for HOLD seconds and notes when each arrived."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, req: Request) -> Fault | None:
        if req.method == "GET" and "/artifacts/sha256/" in req.path:
            with self.lock:
                self.arrivals.append(time.monotonic())
            return Fault(delay=HOLD)
        return None

    def most_within(self, window: float) -> int:
        """The most artifact GETs that arrived within one `window`."""
        times = sorted(self.arrivals)
        best, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] > window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best


def _through(s3: EmbeddedS3, endpoint: str) -> dict[str, Any]:
    return {**s3.storage_options, "client_kwargs": {"endpoint_url": endpoint, "region_name": s3.region}}


def _write(url: str, opts: dict[str, Any], steps: int) -> dict[str, str]:
    store = CheckpointStore(url, storage_options=opts, policy=POLICY, artifact_threshold=1024)
    run = AgentRun(run_id="arts", goal="g")
    for i in range(steps):
        run.add_step(Step(id=f"s{i}", title=f"t{i}"))
    store.save_run(run)
    results = {}
    for i in range(steps):
        step = run.steps[f"s{i}"]
        step.status, step.result = StepStatus.COMPLETED, f"{i}:" + "abcdefgh" * (200 + i)
        results[step.id] = step.result
        store.log_tool_call("arts", step.id, ToolCall(tool_name="search", arguments={"i": i},
                                                      result={"hits": "ijklmnop" * (300 + i)}))
        store.commit(run, [step])
    store.close()
    return results


def test_a_load_fetches_its_artifacts_together_and_returns_each_value(s3: EmbeddedS3, s3_url: str) -> None:
    results = _write(s3_url, s3.storage_options, 24)
    rule = HoldArtifacts()
    with FaultProxy(s3.endpoint, rule) as proxy:
        store = CheckpointStore(s3_url, storage_options=_through(s3, proxy.endpoint), policy=POLICY)
        got = store.load_with_tool_log("arts")
        store.close()
    assert got is not None
    run, tool_log = got
    assert {sid: s.result for sid, s in run.steps.items()} == results
    assert {sid: [c.result for c in calls] for sid, calls in tool_log.items()} == {
        f"s{i}": [{"hits": "ijklmnop" * (300 + i)}] for i in range(24)}
    assert len(rule.arrivals) == 48  # a step's result and its tool call's, each an artifact
    # in turn, each GET is sent after the previous one's 0.3 s hold: one per window at most
    assert rule.most_within(HOLD * 0.8) >= 8, sorted(rule.arrivals)


def test_a_missing_or_altered_artifact_still_fails_its_version_by_name(
        s3: EmbeddedS3, s3_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Fetched together or not, a version whose artifact is gone or altered does not load: the
    load falls back to the newest version whose artifacts are all there, and says why."""
    results = _write(s3_url, s3.storage_options, 6)
    store = CheckpointStore(s3_url, storage_options=s3.storage_options, policy=POLICY)
    keys = store.storage.list("artifacts/")
    assert len(keys) == 12
    last = max((k for k in keys if b"abcdefgh" in store.storage.get(k)),
               key=lambda k: len(store.storage.get(k)))  # step s5's result, the largest
    data = store.storage.get(last)
    kept = {sid: r for sid, r in results.items() if sid != "s5"}
    for damage, reason in ((lambda: store.storage.put(last, data[:-1] + bytes([data[-1] ^ 1])),
                            "does not match its sha256"),
                           (lambda: store.storage.delete(last), "referenced artifact is missing")):
        damage()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ckptfs"):
            run = CheckpointStore(s3_url, storage_options=s3.storage_options, policy=POLICY).load_run("arts")
        assert run is not None
        assert run.steps["s5"].result is None
        assert {sid: s.result for sid, s in run.steps.items() if s.result} == kept
        assert reason in caplog.text, caplog.text
    store.close()


def test_a_reference_of_negative_size_does_not_lift_the_bound_on_what_is_held(
        s3: EmbeddedS3, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record's `$refs` may be hostile: one of size -10**12 made the sizes sum below
    ARTIFACTS_AHEAD_BYTES however large the others were, and all were fetched at once."""
    from ckptfs.store import loader

    _write(s3_url, s3.storage_options, 4)
    store = CheckpointStore(s3_url, storage_options=s3.storage_options, policy=POLICY)
    refs = []
    for key in store.storage.list("artifacts/"):
        data = store.storage.get(key)
        refs.append({"uri": key, "sha256": key.rsplit("/", 1)[-1], "size": len(data)})
    bound = sum(r["size"] for r in refs) - 1
    monkeypatch.setattr(loader, "ARTIFACTS_AHEAD_BYTES", bound)
    assert store._loader.fetch_artifacts(refs) == {}  # past the bound: one at a time
    hostile = {"uri": refs[0]["uri"], "sha256": "0" * 64, "size": -10**12}
    assert store._loader.fetch_artifacts([*refs, hostile]) == {}
    store.close()
