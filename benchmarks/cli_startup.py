"""How long the `ckptfs` command takes to start: `--help`, `runs`, `show` on a small local store.

Each command runs N times as a real subprocess of the installed console script (the way an
operator types it), interleaved so that every command sees the same machine; the table gives
the median, the fastest and the 90th percentile, next to `python -c pass` (the interpreter's
own start, the floor) and `python -c "import ckptfs.cli"`. It also lists which heavy modules a
`ckptfs runs` process imported, since the target (<= 0.25 s for `--help` and `runs`) is met by
not importing the agent runtime, the mirror or the scheduler, not by doing them faster.

    python benchmarks/cli_startup.py [--runs 21]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.25
HEAVY = ("ckptfs.runtime.agent", "ckptfs.replication.mirror", "ckptfs.replication.job", "apscheduler",
         "ckptfs.maintenance.verify", "s3fs", "botocore")


def _cli() -> str:
    script = Path(sys.executable).parent / "ckptfs"
    return str(script) if script.exists() else "ckptfs"


def _make_store(root: Path) -> str:
    from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

    store = CheckpointStore(str(root))
    run = AgentRun(run_id="bench", goal="startup benchmark")
    for i in range(20):
        run.add_step(Step(id=f"s{i:02d}", title=f"step {i}"))
    store.save_run(run)
    for i in range(10):
        step = run.steps[f"s{i:02d}"]
        step.status, step.result = StepStatus.COMPLETED, f"result {i}"
        store.commit(run, [step])
    store.close()
    return run.run_id


def _time(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-300:]}")
    return elapsed


def _imported(argv: list[str], env: dict[str, str], cwd: str) -> list[str]:
    code = (f"import sys; sys.argv = {argv!r}; from ckptfs.cli import main\n"
            "try:\n    main(sys.argv[1:])\nfinally:\n"
            "    print('\\n'.join(sorted(sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
    loaded = set(proc.stderr.split())
    return [m for m in HEAVY if m in loaded]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21, help="runs per command (default 21)")
    args = ap.parse_args()
    cli = _cli()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    env["COLUMNS"] = "100"
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-cli-") as tmp:
        store = str(Path(tmp) / "store")
        run_id = _make_store(Path(store))
        commands = {
            "python -c pass (floor)": [sys.executable, "-c", "pass"],
            "python -c 'import ckptfs.cli'": [sys.executable, "-c", "import ckptfs.cli"],
            "ckptfs --help": [cli, "--help"],
            "ckptfs runs URL": [cli, "runs", store],
            "ckptfs runs URL --json": [cli, "runs", store, "--json"],
            "ckptfs show URL RUN": [cli, "show", store, run_id],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # warm the page cache and the bytecode once
            _time(argv, env, tmp)
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(_time(argv, env, tmp))
        heavy = _imported(["ckptfs", "runs", store], env, tmp)

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"ckptfs startup, {args.runs} runs each, interleaved (target <= {TARGET:.2f} s)")
    for col in ("command", "median s", "min s", "p90 s", "target"):
        t.add_column(col, justify="left" if col == "command" else "right", no_wrap=True)
    for name, xs in times.items():
        xs.sort()
        p90 = xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]
        med = statistics.median(xs)
        judged = name.startswith(("ckptfs --help", "ckptfs runs"))
        verdict = ("met" if med <= TARGET else "MISSED") if judged else ""
        t.add_row(name, f"{med:.3f}", f"{xs[0]:.3f}", f"{p90:.3f}", verdict)
    console = Console()
    console.print(t)
    console.print(f"heavy modules imported by `ckptfs runs`: {', '.join(heavy) or 'none'} "
                  f"(checked: {', '.join(HEAVY)})")
    with contextlib.suppress(OSError):
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        console.print(f"load average: {load} on {os.cpu_count()} cpu(s)")


if __name__ == "__main__":
    main()
