"""Hostile review, second round: the chain an operator runs after machine loss, with the real
`ckptfs` executable, over a loopback proxy in front of the moto server.

agent run (tool calls, artifacts > 64 KiB) -> `ckptfs mirror` to S3 (replies of landed PUTs
lost, 503 bursts, replies slower than the client's read timeout) -> `ckptfs verify` of the mirror
-> `ckptfs restore` (GET bodies cut mid-way) -> `ckptfs verify` -> resume with the library and
finish -> mirror again from the restored store. Plus two defects found on the way:

* an artifact over the single-GET size whose GET body was cut once made `ckptfs restore` exit 3
  ("unexpected ClientPayloadError") instead of reading it again;
* a mirror whose DST is a dangling symlink blamed every artifact on the source ("referenced
  artifact is missing at the source"), sending the operator to a healthy store.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _fault_proxy import Fault, FaultProxy, Request

from backends.s3.embedded import EmbeddedS3
from ckptfs import (
    CheckpointedAgent,
    CheckpointStore,
    CompactionPolicy,
    Step,
    StepResult,
    StepStatus,
)
from ckptfs.replication.copy import SMALL
from ckptfs.replication.mirror import mirror

CLI = str(Path(sys.executable).with_name("ckptfs"))
KEY_ID = "AKIAREVIEWFAULTS2KEY"  # moto takes any credentials: these must never be printed
SECRET = "review-faults2-secret-do-not-print-0042"
RUN = "papers"
POLICY = CompactionPolicy(fanout=4, max_plan=6, min_snapshot_bytes=4096, keep_last=0, background=False)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    return env


def ckptfs(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=_env(), cwd=cwd,
                          timeout=120, check=False)


def side(flag: str, endpoint: str, *extra: str) -> list[str]:
    """Storage options of one side (`--to-option` / `--from-option` / `-o`), credentials included."""
    items = [f"client_kwargs.endpoint_url={endpoint}", "client_kwargs.region_name=us-east-1",
             f"key={KEY_ID}", f"secret={SECRET}", *extra]
    return [a for item in items for a in (flag, item)]


def no_secret(p: subprocess.CompletedProcess[str]) -> None:
    text = p.stdout + p.stderr
    assert SECRET not in text and KEY_ID not in text
    assert "Traceback" not in p.stderr


def cuts(*, first_only: bool, over: int = 1024, where: str = "") -> Callable[[Request], Fault | None]:
    """A FaultProxy rule cutting GET bodies over `over` bytes short mid-stream: every one, or
    only the first GET of each path (`first_only`), of paths holding `where`."""
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def rule(req: Request) -> Fault | None:
        path = req.path.split("?")[0]
        if req.method != "GET" or where not in path:
            return None
        with lock:
            seen[path] += 1
            n = seen[path]
        return Fault(cut=over) if n == 1 or not first_only else None

    return rule


def agent_run(url: str, n: int, paid: list[int], stop_at: int | None = None) -> None:
    """A CheckpointedAgent whose steps each pay one tool call and keep a ~100 KB result (an
    artifact); `stop_at`: the executor raises there, the finished steps are committed."""
    store = CheckpointStore(url, policy=POLICY)
    agent = CheckpointedAgent(store)
    if store.load_run(RUN) is None:
        run = agent.start_run("read papers", [Step(id=f"s{i:02d}", title=f"paper {i}") for i in range(n)],
                              run_id=RUN)
    else:
        run = agent.resume_run(RUN)

    def fetch(i: int) -> dict[str, str]:
        paid.append(i)
        return {"text": f"{i}-" * 40_000}

    def executor(step: Step, prior: Any) -> StepResult:
        i = int(step.id[1:])
        if stop_at is not None and i >= stop_at:
            raise KeyboardInterrupt  # the machine goes away here
        out = agent.tools().run("fetch", {"i": i}, fetch)
        return StepResult(out["text"][:100_000])

    with contextlib.suppress(KeyboardInterrupt):
        agent.execute_run(run, executor)
    store.close()


def test_machine_loss_chain_through_a_bad_network(tmp_path: Path, s3: EmbeddedS3) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "restored")
    url = s3.url("faults2-chain")
    paid: list[int] = []
    agent_run(src, 10, paid, stop_at=6)
    assert sorted(paid) == list(range(6))
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    lock = threading.Lock()

    def rule(req: Request) -> Fault | None:
        path = req.path.split("?")[0]
        with lock:
            seen[req.method, path] += 1
            k = seen[req.method, path]
        if req.method == "PUT" and k == 1:
            return Fault(drop="after")  # stored, then the reply is lost
        if req.n % 7 in (3, 4):
            return Fault(status=503, code="SlowDown")  # bursts of two
        if req.method == "GET" and "/runs/" in path and k == 1:
            return Fault(delay=2.0)  # past the client's read timeout of 1 s
        return None

    with FaultProxy(s3.endpoint, rule) as proxy:
        timeout = "config_kwargs.read_timeout=1"
        p = ckptfs(tmp_path, "-vvv", "mirror", src, url, "--once", "--latest", "--json", "--no-progress",
                   "--attempts", "10", *side("--to-option", proxy.endpoint, timeout))
        no_secret(p)
        assert p.returncode == 0, p.stderr[-2000:]
        doc = json.loads(p.stdout)
        assert doc["ok"] and doc["runs"][0]["status"] == "mirrored" and doc["retries"] > 0
        assert proxy.counts["drop-after"] > 0 and proxy.counts["error"] > 0
        p = ckptfs(tmp_path, "verify", url, "--json", *side("-o", s3.endpoint))
        assert p.returncode == 0, p.stdout[-2000:]
        seen.clear()
        with FaultProxy(proxy.endpoint, cuts(first_only=True)) as cut:
            p = ckptfs(tmp_path, "-vv", "restore", url, dst, "--json", "--no-progress", "--attempts", "10",
                       *side("--from-option", cut.endpoint, timeout))
        no_secret(p)
        assert p.returncode == 0, p.stderr[-2000:]
        assert any("/artifacts/" in c for c in cut.cut_paths)
        rdoc = json.loads(p.stdout)
        assert rdoc["ok"] and rdoc["runs"][0]["status"] == "restored"
        p = ckptfs(tmp_path, "verify", dst)
        assert p.returncode == 0, p.stdout[-2000:]
        agent_run(dst, 10, paid)  # the new machine finishes the run
        assert sorted(paid) == list(range(10)), "a tool call was paid twice"
        done = CheckpointStore(dst).load_run(RUN)
        assert done is not None and all(s.status == StepStatus.COMPLETED for s in done.steps.values())
        p = ckptfs(tmp_path, "mirror", dst, url, "--once", "--latest", "--json", "--no-progress",
                   "--attempts", "10", *side("--to-option", proxy.endpoint, timeout))
        no_secret(p)
        assert p.returncode == 0, p.stderr[-2000:]
        again = json.loads(p.stdout)
        assert again["ok"] and again["runs"][0]["status"] == "mirrored"
    assert CheckpointStore(url, {**s3.storage_options}).load_run(RUN) == done


def test_a_big_artifact_whose_body_is_cut_is_read_again_by_restore(tmp_path: Path, s3: EmbeddedS3) -> None:
    """Over the single-GET size an artifact is streamed; a connection closed mid-body escaped
    as exit 3 ("unexpected ClientPayloadError") on the first cut, where a small GET is retried."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "restored")
    url = s3.url("faults2-big")
    agent_run(src, 3, [], stop_at=2)
    store = CheckpointStore(src, policy=POLICY)
    run = store.load_run(RUN)
    assert run is not None
    step = run.steps["s02"]
    step.status, step.result = StepStatus.COMPLETED, os.urandom(4_300_000).hex()  # 8.6 MB > 8 MiB
    store.commit(run, [step])
    store.close()
    assert mirror(src, url, dst_options=s3.storage_options, latest=True).ok
    with FaultProxy(s3.endpoint, cuts(first_only=True, where="/artifacts/")) as cut:
        p = ckptfs(tmp_path, "restore", url, dst, "--json", "--no-progress", "--attempts", "4",
                   *side("--from-option", cut.endpoint))
    no_secret(p)
    assert len(cut.cut_paths) >= 1
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert json.loads(p.stdout)["runs"][0]["status"] == "restored"
    assert ckptfs(tmp_path, "verify", dst).returncode == 0
    back = CheckpointStore(dst).load_run(RUN)
    assert back is not None and back.steps["s02"].result == step.result


def test_a_big_artifact_cut_on_every_try_is_incomplete_and_nothing_published(
        tmp_path: Path, s3: EmbeddedS3) -> None:
    """Out of attempts, the run is incomplete (exit 1, the artifact named), not exit 3."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "restored")
    url = s3.url("faults2-big-always")
    agent_run(src, 2, [], stop_at=1)
    store = CheckpointStore(src, policy=POLICY)
    run = store.load_run(RUN)
    assert run is not None
    step = run.steps["s01"]
    step.status, step.result = StepStatus.COMPLETED, os.urandom(4_300_000).hex()
    store.commit(run, [step])
    store.close()
    assert mirror(src, url, dst_options=s3.storage_options, latest=True).ok
    with FaultProxy(s3.endpoint, cuts(first_only=False, over=SMALL)) as cut:
        p = ckptfs(tmp_path, "restore", url, dst, "--json", "--no-progress", "--attempts", "2",
                   *side("--from-option", cut.endpoint))
    no_secret(p)
    assert cut.cut_paths
    assert p.returncode == 1, p.stdout[-1500:] + p.stderr[-1500:]
    doc = json.loads(p.stdout)
    assert not doc["ok"] and doc["runs"][0]["status"] == "incomplete"
    assert "still failing" in doc["runs"][0]["error"] and "artifacts/" in doc["runs"][0]["error"]
    assert not Path(dst, "runs").exists()  # nothing of the run published


def test_a_mirror_into_a_dangling_link_names_the_destination_not_the_source(tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    agent_run(src, 4, [])
    dangling = tmp_path / "mirror"
    dangling.symlink_to(tmp_path / "gone")
    p = ckptfs(tmp_path, "mirror", src, str(dangling), "--once", "--latest", "--json", "--no-progress")
    assert "Traceback" not in p.stderr
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    text = json.dumps(doc["runs"])
    assert "missing at the source" not in text, text[:600]
    assert "destination" in doc["runs"][0]["error"]
    assert CheckpointStore(src).load_run(RUN) is not None  # the source was fine all along
