"""`ckptfs` maintenance subcommands: verify, prune, forget.

Exit codes: 0 clean / done; 1 problems found (verify: any error or warning, leftovers included;
info does not count; prune: a run or an artifact it could not delete, or could not read; forget:
refused because a worker holds the run or, on S3, it was written within the fence time; a delete
refused after some files went; a file written during the forget); 2 usage error, a store that is
read-only as a whole (prune: every run failed and nothing was removed; forget: before its first
delete, nothing deleted), unknown run, nothing stored at the URL, or a store that cannot be
reached (the message names the URL with credentials redacted). The store comes from the URL
argument, else `--config` (store.url), else $CKPTFS_URL. Library modules are imported by the
handlers, not here.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ckptfs.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    MAX_VERSION,
    CliError,
    bad_value,
    emit_json,
    err,
    grace_seconds,
    out,
    run_not_found,
    warn,
    whole_number,
)
from ckptfs.cli._options import add_json_arg, add_store_args, nothing_stored, open_existing, store_target
from ckptfs.errors import name_cut

if TYPE_CHECKING:
    from ckptfs.maintenance.verify import Report

_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


_keep_last = whole_number(1, MAX_VERSION, why_min=" (refusing an empty retention policy)",
                          why_max=" (no run holds more versions)")


def register(sub: Any) -> None:
    """Add verify, prune and forget to the `ckptfs` parser."""
    p = sub.add_parser("verify", help="check every file, the hash chain and artifacts; exit 1 on problems",
                       description="Read-only integrity check of a store (or one run).")
    add_store_args(p)
    p.add_argument("--run", dest="run_id", metavar="ID", help="check only this run")
    p.add_argument("--data", action="store_true", help="also read every artifact and check its sha256")
    p.add_argument("--subset", metavar="K/N", help="hash only the K-th of N slices of the artifacts")
    p.add_argument("--subset-runs", action="store_true", help="with --subset, slice runs the same way")
    add_json_arg(p, "one JSON document on stdout, no progress bar")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("prune", help="apply snapshot retention and collect unreferenced artifacts",
                       description="Keep the newest N valid snapshots per run (and what they need); "
                                   "delete older files and unreferenced artifacts past a grace period. "
                                   "Prints a summary per run; -v lists every file.")
    add_store_args(p)
    p.add_argument("--keep-last", type=_keep_last, metavar="N", required=True,
                   help="full snapshots to keep per run (required, >= 1)")
    p.add_argument("--run", dest="run_id", metavar="ID", help="prune only this run (no artifact collection)")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.add_argument("--artifact-grace", default="24h", metavar="DURATION",
                   help="keep unreferenced artifacts younger than this (default 24h; s/m/h/d/w)")
    p.add_argument("--superseded-grace", default=None, metavar="SECONDS",
                   help="keep a snapshot superseded less than this long ago, with what a load from "
                        "it reads, for readers that listed it (default 60s, what a writer keeps; "
                        "0 removes them at once: for a store no reader is using)")
    add_json_arg(p)
    p.set_defaults(handler=cmd_prune)

    p = sub.add_parser("forget", help="delete a run's files (refused while a worker holds it)",
                       description="Delete every file of one run, newest version first. Refused while "
                                   "a step of the run has a live lease (a worker is on it) and, on S3, "
                                   "while the run was written to in the last 10 minutes (an agent may "
                                   "still be writing it), unless --force. Artifacts stay for `prune` to "
                                   "collect once unreferenced.")
    add_store_args(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    p.add_argument("--force", action="store_true",
                   help="forget it even if a worker holds a lease on it or it was just written")
    p.add_argument("--fence-seconds", default="600", metavar="DURATION",
                   help="on S3, refuse a run written within this long (default 600s: the writers' "
                        "default fence_seconds; give theirs if they were set longer)")
    add_json_arg(p)
    p.set_defaults(handler=cmd_forget)


# ------------------------------------------------------------------------------ verify


def cmd_verify(args: argparse.Namespace) -> int:
    from ckptfs.errors import ConfigError
    from ckptfs.maintenance.verify import parse_subset, verify

    if args.subset is not None:  # a bad K/N is the command line's (usage), not the config's
        try:
            parse_subset(args.subset)
        except ConfigError as exc:  # its only error, digits past int()'s limit included
            raise bad_value("--subset", args.subset, exc) from None
    target = store_target(args)
    level = "data" if args.data else "structure"
    if args.subset_runs and not args.subset:
        raise CliError("--subset-runs needs --subset K/N")
    if args.json or not err().is_terminal:  # a bar only where someone watches it
        report = verify(target.url, args.run_id, level, args.subset, target.options,
                        subset_runs=args.subset_runs)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                      TimeElapsedColumn(), TextColumn("{task.description}"), console=err(),
                      transient=True) as bar:
            task = bar.add_task("", total=None)

            def tick(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total or None, description=what[-40:])

            report = verify(target.url, args.run_id, level, args.subset, target.options,
                            subset_runs=args.subset_runs, progress=tick)
    if report.empty:
        raise nothing_stored(target, report.to_dict())  # the verify schema, "empty": true, plus "error"
    if args.json:
        emit_json(report.to_dict())
    else:
        _render_report(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _render_report(report: Report) -> None:
    from rich.text import Text

    from ckptfs.cli._render import Col, print_table

    console = out()
    if report.findings:
        order = {"error": 0, "warning": 1, "info": 2}
        rows: list[list[Any]] = [[Text(f.severity, style=_STYLE[f.severity]), f.run or "-",
                 "-" if f.version is None else str(f.version), f.code, f.key or "-", f.message]
                for f in sorted(report.findings,
                                key=lambda f: (order[f.severity], f.run or "", f.version or 0))]
        cols = [Col("severity"), Col("run", 3), Col("ver", 2, justify="right"), Col("code"),
                Col("file", 1), Col("what is wrong", flex=True, min_width=20)]
        print_table(console, cols, rows, title=f"ckptfs verify {name_cut(report.url)}")
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
    from ckptfs.cli._render import Col, print_table
    from ckptfs.maintenance.prune import prune
    from ckptfs.store.compactor import DEFAULT_SUPERSEDED_GRACE

    grace = grace_seconds("--artifact-grace", args.artifact_grace)
    superseded = (DEFAULT_SUPERSEDED_GRACE if args.superseded_grace is None
                  else grace_seconds("--superseded-grace", args.superseded_grace))
    target = store_target(args)
    open_existing(target).close()  # nothing stored there: exit 2, not an empty table
    report = prune(target.url, args.keep_last, args.run_id, dry_run=args.dry_run, artifact_grace=grace,
                   superseded_grace=superseded, storage_options=target.options)
    runs_failed = [f for f in report.failed if f.run_id is not None]
    if runs_failed and len(runs_failed) == len(report.runs) and not report.deleted \
            and runs_failed[0].code in ("not-writable", "unreachable"):
        # every run failed and nothing went: the store is read-only (or gone) for this user, the
        # one error every command gives for that (exit 2); with --json the report comes along.
        # Some runs pruned (or with nothing to prune) beside a failed one: exit 1, said per run.
        raise CliError(runs_failed[0].reason, kind=runs_failed[0].code, extra=report.to_dict())
    if args.json:
        emit_json(report.to_dict())
        return EXIT_OK if report.ok else EXIT_PROBLEMS
    console = out()
    verb = "would remove" if args.dry_run else "removed"
    listing = args.verbosity > 0
    rows = []
    failed = {f.run_id for f in report.failed}
    for r in report.runs:
        kinds: dict[str, int] = {}
        for key in r.deleted:
            kind = key.split("/")[2] if key.count("/") >= 3 else "other"
            kinds[kind] = kinds.get(kind, 0) + 1
        what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        if r.run_id in failed:
            what = (what + "; " if what else "") + "a delete failed, the rest stays (see below)"
        kept = r.kept_snapshots
        graced = f" (+{len(r.graced)} for the grace)" if r.graced else ""
        rows.append([r.run_id, "a folder is no directory: nothing removed (see below)" if r.unread
                     else f"{len(kept)}: " + ", ".join(f"v{v}" for v in kept) + graced if kept
                     else f"fewer than {args.keep_last} valid: nothing removed",
                     str(len(r.deleted)), what or "-"])
    title = (f"prune {name_cut(report.url)} --keep-last {args.keep_last}"
             + (" (dry run)" if args.dry_run else ""))
    if rows:
        print_table(console, [Col("run"), Col("kept snapshots", 1), Col(verb, justify="right"),
                              Col("files", flex=True)], rows, title=title)
    if listing:
        for key in report.deleted:
            console.print(f"  {verb} {key}", markup=False, soft_wrap=True)
    console.print(f"{verb} {len(report.deleted)} file(s) of {len(report.runs)} run(s), "
                  f"{len(report.artifacts_deleted)} of them artifacts; artifact collection: "
                  f"{report.artifact_gc}; {report.artifacts_referenced} artifact(s) referenced, "
                  f"{len(report.artifacts_young)} unreferenced but younger than the grace period"
                  + ("" if listing or not report.deleted else " (-v lists the files)"))
    if report.graced:  # why a run holds more than --keep-last snapshots after this prune
        console.print(f"{report.graced} superseded snapshot(s) kept for the "
                      f"{report.superseded_grace:g} s grace (readers that listed them may still "
                      "read them; a later prune removes them, --superseded-grace 0 at once)")
    for p in report.problems:
        warn(p)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


# ------------------------------------------------------------------------------ forget


def cmd_forget(args: argparse.Namespace) -> int:
    from ckptfs.cli._render import Col, print_table
    from ckptfs.format.models import validate_id
    from ckptfs.maintenance.forget import LEASE_GRACE, forget

    validate_id(args.run_id, "run id")
    fence = grace_seconds("--fence-seconds", args.fence_seconds)
    storage = open_existing(store_target(args))
    report = forget(storage, args.run_id, dry_run=args.dry_run, force=args.force, fence_seconds=fence)
    if not report.found:
        raise run_not_found(args.run_id, storage.display_name)
    if report.refused and report.live_leases:
        held = ", ".join(f"{lease.step_id} by {lease.holder} ({lease.written_s_ago:.0f}s ago)"
                         for lease in report.live_leases[:3])
        raise CliError(f"run {args.run_id!r} is in use: {len(report.live_leases)} live lease(s): {held}; "
                       f"stop its workers first, or give --force (a lease counts as live until "
                       f"{LEASE_GRACE:.0f}s past its ttl)", kind="lease-held", extra=report.to_dict())
    if report.refused:  # what else refuses: a write within the fence time
        key, ago = report.recent_write or ("?", None)
        when = ("of unknown age: the store's reply gave no time to date it by" if ago is None else
                f"{ago:.0f}s old (a forget without --force is possible {fence - ago:.0f}s from now "
                "if nothing writes the run meanwhile)")
        raise CliError(f"run {args.run_id!r} may still be written to: its newest file {key} is {when}. "
                       "On S3 a writer that committed or loaded within half its fence time commits "
                       "without looking at earlier versions, so its next commits would be "
                       f"acknowledged on a run no load can read ({fence:.0f}s covers writers with the "
                       "default fence_seconds); stop the agent first, or give --force",
                       kind="in-use", extra=report.to_dict())
    if args.json:
        emit_json(report.to_dict())
        return EXIT_OK if report.ok else EXIT_PROBLEMS
    console = out()
    verb = "would delete" if args.dry_run else "deleted"
    stale = [lease for lease in report.leases if not lease.live]
    if report.live_leases or stale:
        rows = [[lease.step_id, lease.holder, str(lease.generation), f"{lease.written_s_ago:.0f}s ago",
                 "live (forced)" if lease.live else "stale"] for lease in report.leases]
        print_table(console, [Col("step"), Col("holder", 1), Col("gen", 2, justify="right"),
                              Col("written", 3), Col("lease", flex=True)], rows, title="leases")
    if args.verbosity > 0 or args.dry_run:
        for key in report.deleted:
            console.print(f"  {verb} {key}", markup=False, soft_wrap=True)
    console.print(f"{verb} {len(report.deleted)} file(s) of run {args.run_id} ({report.versions} "
                  f"version(s)) in {storage.display_name}; its artifacts stay until `ckptfs prune` "
                  "finds them unreferenced", markup=False)
    for key, why in report.kept:
        warn(f"kept {key}: {why}; not ckptfs's, so never deleted (move it away by hand)")
    for e in report.errors:
        warn(e)
    return EXIT_OK if report.ok else EXIT_PROBLEMS
