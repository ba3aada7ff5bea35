"""`ckptfs` maintenance subcommands: verify, prune, runs, show (what an operator types first).

Exit codes: 0 clean / done; 1 problems found (verify: any error or warning, leftovers
included; info does not count); 2 usage error, unknown run, or a store that cannot be
reached (the message names the URL with credentials redacted).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ckptfs.cli._common import EXIT_OK, EXIT_PROBLEMS, CliError, console, console_err, emit_json
from ckptfs.cli._options import add_storage_args, storage_options_from_args
from ckptfs.errors import CheckpointCorruptError
from ckptfs.format.keys import RUNS
from ckptfs.format.models import validate_id
from ckptfs.maintenance.prune import DEFAULT_ARTIFACT_GRACE, parse_duration, prune
from ckptfs.maintenance.verify import Report, list_keys, verify
from ckptfs.storage.registry import open_storage
from ckptfs.store.checkpoint_store import RESUMABLE_STATUSES, CheckpointStore
from ckptfs.store.leases import read_leases

_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def register(sub: Any) -> None:
    """Add this family's subcommands to the `ckptfs` parser."""
    p = sub.add_parser("verify", help="check every file, the hash chain and artifacts; exit 1 on problems",
                       description="Read-only integrity check of a store (or one run).")
    p.add_argument("url", help="store URL: /path, file:///path, s3://bucket/prefix")
    p.add_argument("--run", dest="run_id", metavar="ID", help="check only this run")
    p.add_argument("--data", action="store_true", help="also read every artifact and check its sha256")
    p.add_argument("--subset", metavar="K/N", help="hash only the K-th of N slices of the artifacts")
    p.add_argument("--subset-runs", action="store_true", help="with --subset, slice runs the same way")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout, no progress bar")
    add_storage_args(p)
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("prune", help="apply snapshot retention and collect unreferenced artifacts",
                       description="Keep the newest N valid snapshots per run (and what they need); "
                                   "delete older files and unreferenced artifacts past a grace period.")
    p.add_argument("url")
    p.add_argument("--keep-last", type=int, metavar="N", help="full snapshots to keep per run (>= 1)")
    p.add_argument("--run", dest="run_id", metavar="ID", help="prune only this run (no artifact collection)")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    p.add_argument("--artifact-grace", default="24h", metavar="DURATION",
                   help="keep unreferenced artifacts younger than this (default 24h; s/m/h/d/w)")
    p.add_argument("--json", action="store_true")
    add_storage_args(p)
    p.set_defaults(handler=cmd_prune)

    p = sub.add_parser("runs", help="list runs: status, progress, latest version, resumable")
    p.add_argument("url")
    p.add_argument("--json", action="store_true")
    add_storage_args(p)
    p.set_defaults(handler=cmd_runs)

    p = sub.add_parser("show", help="show one run's steps")
    p.add_argument("url")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true")
    add_storage_args(p)
    p.set_defaults(handler=cmd_show)


def _ts(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


# ------------------------------------------------------------------------------ verify


def cmd_verify(args: argparse.Namespace) -> int:
    opts = storage_options_from_args(args)
    level = "data" if args.data else "structure"
    if args.subset_runs and not args.subset:
        raise CliError("--subset-runs needs --subset K/N")
    if args.json:
        report = verify(args.url, args.run_id, level, args.subset, opts, subset_runs=args.subset_runs)
    else:
        with Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=console_err, transient=True) as bar:
            task = bar.add_task("", total=None)

            def tick(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total or None, description=what[-40:])

            report = verify(args.url, args.run_id, level, args.subset, opts,
                            subset_runs=args.subset_runs, progress=tick)
    if report.empty:
        raise CliError(f"nothing is stored at {report.url} (wrong URL or prefix?)")
    if args.json:
        emit_json(report.to_dict())
    else:
        _render_report(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _render_report(report: Report) -> None:
    if report.findings:
        table = Table(title=f"ckptfs verify {report.url}", show_lines=False)
        for col in ("severity", "run", "version", "file", "what is wrong"):
            table.add_column(col, overflow="fold")
        order = {"error": 0, "warning": 1, "info": 2}
        for f in sorted(report.findings, key=lambda f: (order[f.severity], f.run or "", f.version or 0)):
            table.add_row(Text(f.severity, style=_STYLE[f.severity]), f.run or "-",
                          "-" if f.version is None else str(f.version), f.key or "-",
                          f"{f.code}: {f.message}")
        console.print(table)
    counts = report.to_dict()["counts"]
    subset = f", artifact subset {report.subset}" if report.subset else ""
    verdict = "[green]clean[/green]" if report.ok else "[red]problems found[/red]"
    console.print(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), "
                  f"{counts['info']} info; {report.runs} run(s), {report.files} run file(s), "
                  f"{report.artifacts_hashed}/{report.artifacts} artifact(s) hashed "
                  f"({report.level}{subset}), "
                  f"{report.bytes_read / 1e6:.1f} MB in {report.seconds:.1f}s")


# ------------------------------------------------------------------------------- prune


def cmd_prune(args: argparse.Namespace) -> int:
    if not args.keep_last or args.keep_last < 1:
        raise CliError("refusing an empty retention policy: give --keep-last N with N >= 1")
    grace = parse_duration(args.artifact_grace) if args.artifact_grace else DEFAULT_ARTIFACT_GRACE
    opts = storage_options_from_args(args)
    report = prune(args.url, args.keep_last, args.run_id, dry_run=args.dry_run, artifact_grace=grace,
                   storage_options=opts)
    if args.json:
        emit_json(report.to_dict())
        return EXIT_OK if report.ok else EXIT_PROBLEMS
    verb = "would remove" if args.dry_run else "removed"
    table = Table(title=f"ckptfs prune {report.url} --keep-last {args.keep_last}"
                        + (" (dry run)" if args.dry_run else ""))
    for col in ("run", "kept snapshots", verb):
        table.add_column(col, overflow="fold")
    for r in report.runs:
        table.add_row(r.run_id, ", ".join(str(v) for v in r.kept_snapshots) or "-",
                      "\n".join(r.deleted) or "-")
    if report.artifacts_deleted:
        table.add_row("(artifacts)", "-", "\n".join(report.artifacts_deleted))
    console.print(table)
    console.print(f"{verb} {len(report.deleted)} file(s); artifacts: {report.artifact_gc}, "
                  f"{report.artifacts_referenced} referenced, {len(report.artifacts_young)} unreferenced "
                  f"but younger than the grace period")
    for p in report.problems:
        console_err.print(f"[yellow]warning:[/yellow] {p}")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


# -------------------------------------------------------------------------- runs, show


def _open_store(args: argparse.Namespace) -> CheckpointStore:
    storage = open_storage(args.url, storage_options_from_args(args))
    list_keys(storage, f"{RUNS}/")  # reach it now: a bad URL is exit 2, not an empty list
    return CheckpointStore(storage=storage)


def cmd_runs(args: argparse.Namespace) -> int:
    store = _open_store(args)
    rows: list[dict[str, Any]] = []
    code = EXIT_OK
    for run_id in store.list_runs():
        try:
            s = store.run_summary(run_id)
        except (CheckpointCorruptError, ValueError) as exc:
            rows.append({"run_id": run_id, "status": "corrupt", "error": str(exc)})
            code = EXIT_PROBLEMS
            continue
        if s is None:
            continue
        s["resumable"] = s["status"] in RESUMABLE_STATUSES
        rows.append(s)
    if args.json:
        emit_json({"url": store.url, "runs": rows})
        return code
    table = Table(title=f"runs in {store.url}")
    for col in ("run", "status", "done/total", "failed", "version", "updated", "resumable", "goal"):
        table.add_column(col, overflow="fold")
    for r in rows:
        if r["status"] == "corrupt":
            table.add_row(r["run_id"], Text("corrupt", style="bold red"), "-", "-", "-", "-", "-",
                          r.get("error", "")[:120])
            continue
        table.add_row(r["run_id"], r["status"], f"{r['completed_steps']}/{r['total_steps']}",
                      str(r["failed_steps"]), str(r["version"]), _ts(r.get("updated_at")),
                      "yes" if r["resumable"] else "no", str(r.get("goal", ""))[:60])
    console.print(table)
    return code


def cmd_show(args: argparse.Namespace) -> int:
    validate_id(args.run_id, "run id")
    store = _open_store(args)
    run = store.load_run(args.run_id, resolve_artifacts=False)
    if run is None:
        raise CliError(f"run {args.run_id!r} not found in {store.url}")
    version = store.last_load.version if store.last_load else None
    # who holds the steps still to do, when several workers share the run (leases.py)
    open_steps = [s.id for s in run.steps.values() if s.status.value in ("pending", "running")]
    leases = read_leases(store.storage, run.run_id, open_steps) if open_steps else {}
    now = time.time()
    steps: list[dict[str, Any]] = []
    for s in run.steps.values():
        lease = leases.get(s.id)
        held = None if lease is None or lease.released else {
            "holder": lease.holder, "generation": lease.generation, "ttl_s": lease.ttl,
            "written_s_ago": round(now - lease.time, 1)}
        steps.append({"id": s.id, "title": s.title, "status": s.status.value, "attempts": s.attempt_count,
                      "duration_s": s.duration_seconds, "dependencies": s.dependencies,
                      "result": s.result, "error": s.error, "tool_calls": len(s.tool_calls),
                      "lease": held})
    if args.json:
        emit_json({"url": store.url, "run_id": run.run_id, "goal": run.goal, "status": run.status,
                   "version": version, "created_at": run.created_at, "updated_at": run.updated_at,
                   "completed": run.completed_count, "failed": run.failed_count, "steps": steps})
        return EXIT_OK
    console.print(f"[bold]{run.run_id}[/bold] {run.status} v{version}: {run.goal}")
    console.print(f"{run.completed_count}/{len(run.steps)} completed, {run.failed_count} failed, "
                  f"updated {_ts(run.updated_at)}")
    table = Table()
    for col in ("step", "title", "status", "attempts", "duration", "result"):
        table.add_column(col, overflow="fold")
    for row in steps:
        dur = "-" if row["duration_s"] is None else f"{row['duration_s']:.1f}s"
        summary = row["error"] if row["status"] == "failed" and row["error"] else (row["result"] or "")
        held = row["lease"]
        if held is not None:  # the holder's own clock dates the write: a hint, not a verdict
            summary = (f"leased by {held['holder']} (generation {held['generation']}, written "
                       f"{held['written_s_ago']:.0f}s ago, ttl {held['ttl_s']:.0f}s)")
        table.add_row(row["id"], row["title"], row["status"], str(row["attempts"]), dur,
                      str(summary).replace("\n", " ")[:80])
    console.print(table)
    return EXIT_OK
