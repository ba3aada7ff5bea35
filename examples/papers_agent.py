"""The article's story, for real: 500 papers, a 429 at paper 347, a second process finishes.

    python examples/papers_agent.py [--store URL] [--workdir DIR]

Two real subprocesses share one store. The first extracts papers 1..346, is rate-limited at
paper 347 on every attempt, exhausts its retries and exits non-zero with its checkpoint
intact. The second resumes the run at paper 347 and finishes. The extraction tool is a
deterministic simulation (no network) that costs "tokens" and appends each real call to a
file, so the demo can prove that no paper was extracted twice. Exit code 0 only if the
story holds.

Importable too: `run_demo(store_url, storage_options, workdir) -> bool`, and
`finish_run(store_url, storage_options, run_id) -> AgentRun` resumes an existing run to
completion in this process (for a demo that restores the store elsewhere first).
Storage options reach the child processes through the environment, never the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall  # noqa: E402
from ckptfs.errors import RetriesExhaustedError  # noqa: E402
from ckptfs.runtime.agent import CheckpointedAgent  # noqa: E402
from ckptfs.runtime.execution import ProgressEvent, StepResult  # noqa: E402
from ckptfs.runtime.policy import RetryPolicy  # noqa: E402

PAPERS = 500
RATE_LIMIT_AT = 347
GOAL = "Extract key findings from 500 research papers and build a knowledge graph"
OPTIONS_ENV = "CKPTFS_DEMO_STORAGE_OPTIONS"
# Short backoffs so the demo takes seconds; the 429 carries retry_after, which wins.
DEMO_RETRY = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05, jitter=0.5)
STOPPED_EXIT = 3


class RateLimitError(Exception):
    """What an LLM API raises on HTTP 429; `retry_after` is its Retry-After header, in seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def paper_tokens(paper: int) -> int:
    """Deterministic 'tokens' one extraction costs."""
    return 900 + (paper * 7919) % 1100


def step_id(paper: int) -> str:
    return f"paper-{paper:03d}"


def make_steps() -> list[Step]:
    return [Step(id=step_id(n), title=f"Extract findings from paper {n}",
                 description=f"Read paper {n}, extract key findings and citations",
                 milestone=n % 50 == 0) for n in range(1, PAPERS + 1)]


class SimulatedExtractor:
    """The tool: counts each real call in a file (one line per paper), can be rate-limited."""

    def __init__(self, calls_file: Path, rate_limit_from: int | None) -> None:
        self.calls_file = calls_file
        self.rate_limit_from = rate_limit_from
        self.limited: list[int] = []

    def __call__(self, paper: int) -> dict[str, Any]:
        if self.rate_limit_from is not None and paper >= self.rate_limit_from:
            self.limited.append(paper)
            raise RateLimitError("429 Too Many Requests: rate limit reached for requests", 0.01)
        fd = os.open(self.calls_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{paper}\n".encode())
        finally:
            os.close(fd)
        return {"paper": paper, "tokens": paper_tokens(paper),
                "findings": [f"finding {paper}.{k}" for k in range(3)],
                "cites": sorted({(paper * 31 + k * 17) % PAPERS + 1 for k in range(4)})}


def build_agent(store: CheckpointStore, tool: SimulatedExtractor,
                on_progress: Any = None) -> tuple[CheckpointedAgent, Any]:
    agent = CheckpointedAgent(store, retry=DEMO_RETRY, on_progress=on_progress)

    def executor(step: Step, prior_calls: list[ToolCall]) -> StepResult:
        paper = int(step.id.split("-")[1])
        out = agent.tools().run("extract_findings", {"paper": paper}, tool)
        summary = f"{len(out['findings'])} findings; cites {', '.join(map(str, out['cites']))}"
        return StepResult(summary, tokens=out["tokens"])

    return agent, executor


def finish_run(store_url: str, storage_options: dict[str, Any] | None, run_id: str,
               workdir: Path | None = None) -> AgentRun:
    """Resume `run_id` in this process and run it to the end; real calls go to workdir/calls.txt."""
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="papers-"))
    work.mkdir(parents=True, exist_ok=True)
    with CheckpointStore(store_url, storage_options=storage_options) as store:
        agent, executor = build_agent(store, SimulatedExtractor(work / "calls.txt", None))
        run = agent.resume_run(run_id)
        if run is None:
            raise LookupError(f"run {run_id!r} is not in the store")
        return agent.execute_run(run, executor)


def _worker(args: argparse.Namespace) -> int:
    """One 'process' of the story; writes what it saw to workdir/<role>.json."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    work = Path(args.workdir)
    tool = SimulatedExtractor(work / "calls.txt", args.rate_limit_at)
    first: list[str] = []

    def progress(ev: ProgressEvent) -> None:
        if ev.kind == "step_started" and not first:
            first.append(ev.step_id or "")

    report: dict[str, Any] = {"role": args.worker}
    with CheckpointStore(args.store, storage_options=options) as store:
        agent, executor = build_agent(store, tool, progress)
        if args.worker == "start":
            run = agent.start_run(GOAL, make_steps(), run_id=args.run_id)
        else:
            got = agent.resume_run(args.run_id)
            if got is None:
                print(f"run {args.run_id} not found", file=sys.stderr)
                return 2
            run = got
        code = 0
        try:
            agent.execute_run(run, executor)
        except RetriesExhaustedError as exc:
            report["error"] = str(exc)
            report["stopped_at"] = exc.step_id
            code = STOPPED_EXIT
        report.update(first_step=first[0] if first else None, rate_limited=tool.limited,
                      completed=run.completed_count, status=run.status, tokens=run.total_tokens)
    (work / f"{args.worker}.json").write_text(json.dumps(report))
    return code


def _spawn(role: str, store_url: str, options: dict[str, Any] | None, workdir: Path, run_id: str,
           rate_limit_at: int | None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", role, "--store", store_url,
           "--workdir", str(workdir), "--run-id", run_id]
    if rate_limit_at is not None:
        cmd += ["--rate-limit-at", str(rate_limit_at)]
    env = dict(os.environ, **{OPTIONS_ENV: json.dumps(options or {})})
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def run_demo(store_url: str, storage_options: dict[str, Any] | None, workdir: Path) -> bool:
    """Play the story with two real processes; print it; True only if every claim holds."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    run_id = f"papers-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    p1 = _spawn("start", store_url, storage_options, work, run_id, RATE_LIMIT_AT)
    with CheckpointStore(store_url, storage_options=storage_options) as store:
        mid = store.load_run(run_id)
    p2 = _spawn("resume", store_url, storage_options, work, run_id, None)
    with CheckpointStore(store_url, storage_options=storage_options) as store:
        final = store.load_run(run_id)
    elapsed = time.monotonic() - t0

    def report(role: str) -> dict[str, Any]:
        f = work / f"{role}.json"
        return json.loads(f.read_text()) if f.exists() else {}

    r1, r2 = report("start"), report("resume")
    calls_file = work / "calls.txt"
    calls = [int(x) for x in calls_file.read_text().split()] if calls_file.exists() else []
    done_before = mid.completed_count if mid is not None else -1
    resumed_at = r2.get("first_step")
    saved = sum(paper_tokens(n) for n in range(1, RATE_LIMIT_AT))
    expected_total = sum(paper_tokens(n) for n in range(1, PAPERS + 1))
    checks = {
        "process 1 exited non-zero": p1.returncode != 0,
        f"{RATE_LIMIT_AT - 1} papers done before the crash": done_before == RATE_LIMIT_AT - 1,
        f"process 2 resumed at paper {RATE_LIMIT_AT}": resumed_at == step_id(RATE_LIMIT_AT),
        "process 2 exited 0": p2.returncode == 0,
        f"all {PAPERS} papers completed": final is not None and final.completed_count == PAPERS
        and final.status == "completed",
        f"real tool calls = {PAPERS}, none repeated": len(calls) == PAPERS and len(set(calls)) == PAPERS,
        "token totals survived the resume": final is not None and final.total_tokens == expected_total,
    }
    print(f"Run {run_id}: {GOAL.lower()}.")
    limited = r1.get("rate_limited") or [0]
    print(f"  Process 1: extracted papers 1-{done_before}; paper {RATE_LIMIT_AT} hit a 429 rate limit "
          f"({len(limited)} rate-limited calls, papers {min(limited)}-{max(limited)}); retries exhausted, "
          f"exit code {p1.returncode}, checkpoint intact.")
    at = resumed_at.split("-")[1].lstrip("0") if isinstance(resumed_at, str) else "?"
    print(f"  Process 2: resumed at paper {at} ({done_before} papers untouched), finished the rest, "
          f"exit code {p2.returncode}.")
    print(f"  Real extraction calls: {len(calls)} for {PAPERS} papers "
          f"({len(calls) - len(set(calls))} repeated).")
    total = final.total_tokens if final is not None else 0
    print(f"  Tokens: {total:,} in total; {saved:,} saved versus starting over "
          f"({saved / max(expected_total, 1):.0%} of the job). Took {elapsed:.1f}s.")
    for claim, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {claim}")
    if not all(checks.values()):
        for name, p in (("process 1", p1), ("process 2", p2)):
            print(f"--- {name} stderr (last lines) ---\n" + "\n".join(p.stderr.splitlines()[-15:]))
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--store", default=str(Path(".demo") / "papers" / "store"),
                    help="checkpoint store URL (default: .demo/papers/store)")
    ap.add_argument("--workdir", default=None,
                    help="where the call counter goes (default: .demo/papers/work-<id>)")
    ap.add_argument("--worker", choices=("start", "resume"), help=argparse.SUPPRESS)
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    ap.add_argument("--rate-limit-at", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)
    workdir = (Path(args.workdir) if args.workdir
               else Path(".demo") / "papers" / f"work-{uuid.uuid4().hex[:6]}")
    options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    return 0 if run_demo(args.store, options, workdir) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PAPERS", "RATE_LIMIT_AT", "RateLimitError", "StepStatus", "finish_run", "run_demo"]
