"""`ckptfs` subcommands that read runs: runs, show, versions, diff, export, threads.

All of them only read. The store comes from the URL argument, else `--config` (store.url),
else $CKPTFS_URL; a store that holds nothing is exit 2 ("empty"), one that cannot be reached
exit 2 ("unreachable"). Heavy imports happen inside the handlers: registering costs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import time
from typing import TYPE_CHECKING, Any

from ckptfs.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    MAX_VERSION,
    CliError,
    blocked_dirs_of,
    dumps_json,
    emit_json,
    err,
    out,
    quoted,
    run_not_found,
    warn,
    what_stands_there,
    whole_number,
)
from ckptfs.cli._options import add_json_arg, add_store_args, open_existing, store_target
from ckptfs.cli._render import (
    Col,
    age,
    count,
    fit_line,
    money,
    print_table,
    printable,
    seconds,
    timestamp,
    version_list,
)
from ckptfs.errors import NAMED_CHARS, name_cut
from ckptfs.storage.fs import path_within
from ckptfs.storage.redact import redact_mangled

if TYPE_CHECKING:
    from pathlib import Path

    from ckptfs.format.models import Step, ToolCall
    from ckptfs.maintenance.history import RunState
    from ckptfs.storage.base import Storage


_nonneg = whole_number(0, MAX_VERSION, why_max=" (a version has at most 12 digits)")


def register(sub: Any) -> None:
    """Add runs, show, versions, diff, export and threads to the `ckptfs` parser."""
    p = sub.add_parser("runs", help="list runs: status, progress, latest version, resumable",
                       description="List the runs of a store (and count its LangGraph threads).")
    add_store_args(p)
    add_json_arg(p)
    p.set_defaults(handler=cmd_runs)

    p = sub.add_parser("show", help="one run's steps, their tool calls, tokens and cost",
                       description="Show a run at its newest version (or --version V): its steps "
                                   "with status, attempts, duration, tokens, cost and tool calls, "
                                   "and run totals; --step ID for one step in full; --thread T "
                                   "for a LangGraph thread.")
    add_store_args(p)
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="the run (not with --thread)")
    p.add_argument("--version", type=_nonneg, default=None, metavar="V", help="this stored version")
    p.add_argument("--step", default=None, metavar="ID", help="one step in full, with its tool calls")
    p.add_argument("--calls", action="store_true", help="list every step's tool calls")
    p.add_argument("--thread", default=None, metavar="THREAD_ID",
                   help="show a LangGraph thread's checkpoints instead of a run")
    add_json_arg(p)
    p.set_defaults(handler=cmd_show)

    p = sub.add_parser("versions", help="a run's stored versions (and a mirror's restore points)",
                       description="Every stored version of a run: which files make it (journal "
                                   "record, delta, snapshot), when it was written, how far the run "
                                   "was, and whether a restore can target it.")
    add_store_args(p)
    p.add_argument("run_id", metavar="RUN_ID")
    add_json_arg(p)
    p.set_defaults(handler=cmd_versions)

    p = sub.add_parser("diff", help="what changed in a run between two versions",
                       description="Steps added, removed and changed, status changes and tool calls "
                                   "logged between version V1 and version V2 of a run.")
    add_store_args(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("v1", type=_nonneg, metavar="V1")
    p.add_argument("v2", type=_nonneg, metavar="V2")
    add_json_arg(p)
    p.set_defaults(handler=cmd_diff)

    p = sub.add_parser("export", help="a run's state as JSON, tool log included",
                       description="Write a run's state at its newest version (or --version V) as "
                                   "one JSON document: the run with its steps, the tool log, totals. "
                                   "Large values are read back from artifacts (--no-artifacts: keep "
                                   "their summaries).")
    add_store_args(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--version", type=_nonneg, default=None, metavar="V")
    p.add_argument("--output", "-O", default=None, metavar="FILE", help="write here instead of stdout")
    p.add_argument("--no-artifacts", action="store_true", help="keep large values as their summaries")
    add_json_arg(p, "accepted for symmetry: export always writes JSON")
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser("threads", help="list LangGraph threads (CkptfsSaver data under langgraph/)",
                       description="List the LangGraph threads a CkptfsSaver stored: namespaces, "
                                   "checkpoints, pending writes, newest checkpoint.")
    add_store_args(p)
    add_json_arg(p)
    p.set_defaults(handler=cmd_threads)


def _storage(args: argparse.Namespace) -> Storage:
    return open_existing(store_target(args))


# ----------------------------------------------------------------------------------- runs


def cmd_runs(args: argparse.Namespace) -> int:
    from ckptfs.cli.threads import thread_ids
    from ckptfs.errors import (
        CheckpointCorruptError,
        CorruptFileError,
        InvalidIdError,
        StorageUnavailableError,
    )
    from ckptfs.format.models import validate_id
    from ckptfs.maintenance.history import read_only_store
    from ckptfs.store.checkpoint_store import RESUMABLE_STATUSES

    storage = _storage(args)
    store = read_only_store(storage)
    rows: list[dict[str, Any]] = []
    code = EXIT_OK
    for run_id in store.list_runs():
        try:
            validate_id(run_id, "run id")
        except InvalidIdError as exc:  # a stray directory (.snapshot of a NAS): not a run
            warn(f"{storage.display_name}: runs/{run_id[:60]}: not a run, ignored ({exc}); "
                 "`ckptfs verify` reports it")
            continue
        try:
            s = store.run_summary(run_id)
        except (CheckpointCorruptError, CorruptFileError, ValueError) as exc:
            rows.append({"run_id": run_id, "status": "corrupt", "error": str(exc)})
            code = EXIT_PROBLEMS
            continue
        except StorageUnavailableError as exc:  # the store was listed: one run this user cannot read
            rows.append({"run_id": run_id, "status": "unreadable", "error": str(exc)})
            code = EXIT_PROBLEMS
            continue
        if s is None:
            if blocked := blocked_dirs_of(storage, run_id):
                rows.append({"run_id": run_id, "status": "unreadable", "error": what_stands_there(blocked)})
                code = EXIT_PROBLEMS
            continue
        s["resumable"] = s["status"] in RESUMABLE_STATUSES
        rows.append(s)
    threads = len(thread_ids(storage))
    if args.json:
        emit_json({"url": store.url, "runs": rows, "threads": threads})
        return code
    from rich.text import Text

    cols = [Col("run"), Col("status"), Col("done", justify="right"), Col("failed", 2, justify="right"),
            Col("ver", 3, justify="right"), Col("updated", 1), Col("resume", 4),
            Col("goal", flex=True, min_width=14)]
    table: list[list[Any]] = []
    for r in rows:
        if r["status"] in ("corrupt", "unreadable"):
            table.append([r["run_id"], Text(r["status"], style="bold red"), "-", "-", "-", "-", "-",
                          r.get("error", "")])
            continue
        table.append([r["run_id"], r["status"], f"{r['completed_steps']}/{r['total_steps']}",
                      str(r["failed_steps"]), str(r["version"]), age(r.get("updated_at")),
                      "yes" if r["resumable"] else "no", str(r.get("goal", ""))])
    console = out()
    if rows:
        print_table(console, cols, table, title=f"runs in {storage.display_name}")
    else:
        console.print(f"no runs in {storage.display_name}", markup=False)
    for r in rows:  # the table's last column cuts a long reason short
        if r["status"] in ("corrupt", "unreadable"):
            warn(f"{r['run_id']}: {r['error']}")
    if threads:
        # a command to type again only when the name is shown whole: a cut or redacted one is
        # no URL (and a path with a space is one word only quoted)
        whole = storage.display_name == storage.display_url == storage.url
        again = shlex.quote(storage.display_url) if whole else "URL"
        console.print(f"and {threads} LangGraph thread(s) under langgraph/: ckptfs threads {again}",
                      markup=False)
    return code


# ----------------------------------------------------------------------------------- show


def _usage_of(call: ToolCall) -> tuple[int | None, float | None]:
    from ckptfs.maintenance.history import call_usage

    return call_usage(call)


def _call_doc(call: ToolCall) -> dict[str, Any]:
    tokens, cost = _usage_of(call)
    return {"id": call.id, "tool": call.tool_name, "phase": call.phase, "duration_ms": call.duration_ms,
            "tokens": tokens, "cost_usd": cost, "timestamp": call.timestamp, "error": call.error,
            "arguments": call.arguments, "result": call.result, "cache_key": call.cache_key,
            "idempotency_key": call.idempotency_key}


def _step_doc(state: RunState, step: Step, lease: dict[str, Any] | None) -> dict[str, Any]:
    calls = state.calls(step.id)
    return {"id": step.id, "title": step.title, "status": step.status.value, "attempts": step.attempt_count,
            "duration_s": step.duration_seconds, "started_at": step.started_at,
            "completed_at": step.completed_at, "dependencies": step.dependencies,
            "result": step.result, "error": step.error, "tokens": step.tokens, "cost_usd": step.cost_usd,
            "tool_calls": len(calls), "calls": [_call_doc(c) for c in calls], "lease": lease}


def _leases(storage: Storage, state: RunState) -> dict[str, dict[str, Any]]:
    """Who holds the steps still to do, when several workers share the run (store/leases.py).

    A lease key that cannot be read (a FIFO, a link) becomes a note: it once made `show` of the
    whole run exit 1 with nothing shown."""
    from ckptfs.store.leases import read_leases

    open_steps = [s.id for s in state.run.steps.values() if s.status.value in ("pending", "running")]
    if not open_steps:
        return {}
    now = time.time()
    unread: list[str] = []
    records = read_leases(storage, state.run.run_id, open_steps, unread)
    state.notes += [f"lease not read, so who holds that step is not shown: {why}" for why in unread]
    return {sid: {"holder": rec.holder, "generation": rec.generation, "ttl_s": rec.ttl,
                  "written_s_ago": round(now - rec.time, 1)}
            for sid, rec in records.items() if not rec.released}


def _load(storage: Storage, run_id: str, version: int | None, artifacts: bool = True) -> RunState:
    from ckptfs.errors import CheckpointCorruptError, VersionNotFoundError, first_of
    from ckptfs.format.keys import blocked_run_dirs, run_prefix
    from ckptfs.format.models import validate_id
    from ckptfs.maintenance.history import list_versions, load_state, run_files

    validate_id(run_id, "run id")

    def no_such_version() -> CliError:
        have = [i.version for i in list_versions(storage, run_id)]
        if not have:
            return run_not_found(run_id, storage.display_name, storage)
        return CliError(f"run {run_id!r} has no version {version} that loads in "
                        f"{storage.display_name}; it has {len(have)}: {version_list(have)} "
                        "(`ckptfs versions` says which a restore can target)", kind="not-found")

    # Artifacts resolved (and their sha256 checked) by default: show and diff must report the
    # state a load, and so a resume, returns; one damaged artifact makes that an earlier one.
    try:
        state = load_state(storage, run_id, version, artifacts=artifacts)
    except VersionNotFoundError:
        raise no_such_version() from None
    except CheckpointCorruptError as exc:
        # A version no file of the run ends at was never stored: "no version V" (exit 2), as on
        # an undamaged store, not "version V could not be loaded" (exit 1) because some lower
        # file is damaged (a review found `show --version 9` called corrupt beside a torn v5).
        # Unless a run folder is a link or a file: what it holds is unknown, V may be there.
        if version is not None:
            keys = storage.list(run_prefix(run_id))
            if not blocked_run_dirs(keys) and version not in {
                    rf.version for rf in run_files(storage, run_id, keys)}:
                raise no_such_version() from None
        # files exist but none loads; with a version given, only that one: the others may load.
        # Each distinct reason is named (the load lists each once; the per-attempt lines that
        # also named them are -v's): two damaged artifacts are two reasons, not "first: one".
        problems = exc.problems or ["no file could be read"]
        shown = first_of(problems)
        what = "no stored version could be loaded" if version is None else \
            f"version {version} could not be loaded"
        raise CliError(f"run {run_id!r} in {storage.display_name}: {what} "
                       f"({len(exc.problems)} problem(s): {shown}); see `ckptfs verify`",
                       kind="corrupt") from None
    if state is None:
        raise run_not_found(run_id, storage.display_name, storage)
    return state


def cmd_show(args: argparse.Namespace) -> int:
    if args.thread is not None:
        from ckptfs.cli.threads import show_thread

        if args.run_id is not None:
            raise CliError("give a RUN_ID or --thread, not both")
        return show_thread(args, _storage(args))
    if args.run_id is None:
        if args.url is None:
            raise CliError("show needs a RUN_ID (or --thread THREAD_ID)")
        args.run_id, args.url = args.url, None  # `show RUN`: the store from --config / $CKPTFS_URL
    storage = _storage(args)
    state = _load(storage, args.run_id, args.version)
    if args.step is not None and args.step not in state.run.steps:
        raise CliError(f"run {args.run_id!r} v{state.version} has no step {quoted(args.step)}",
                       kind="not-found")
    leases = _leases(storage, state)
    steps = [_step_doc(state, s, leases.get(s.id)) for s in state.run.steps.values()
             if args.step is None or s.id == args.step]
    from ckptfs.maintenance.history import totals

    run = state.run
    if args.json:
        emit_json({"url": storage.display_url, "run_id": run.run_id, "goal": run.goal, "status": run.status,
                   "version": state.version, "created_at": run.created_at, "updated_at": run.updated_at,
                   "completed": run.completed_count, "failed": run.failed_count,
                   "total_tokens": run.total_tokens, "total_cost_usd": run.total_cost_usd,
                   "totals": totals(state), "skipped": state.skipped, "notes": state.notes,
                   "steps": steps})
        return EXIT_OK
    console = out()
    fit_line(console, f"{run.run_id} {run.status} v{state.version}: {run.goal}", bold=len(run.run_id))
    t = totals(state)
    statuses = ", ".join(f"{n} {k}" for k, n in sorted(t["by_status"].items()))
    console.print(f"{t['steps']} steps ({statuses or 'none'}); {count(t['tokens'])} tokens, "
                  f"{money(t['cost_usd'])}; {t['tool_calls']} tool call(s), {seconds(t['tool_ms'])} in "
                  f"tools; updated {timestamp(run.updated_at)}")
    from rich.text import Text

    for note in state.notes + [f"skipped: {s}" for s in state.skipped]:  # data: never markup
        err().print(Text.assemble(("note: ", "yellow"), printable(note)), soft_wrap=True)
    if args.step is not None:
        _render_step(steps[0])
        return EXIT_OK
    rows = []
    for s in steps:
        dur = "-" if s["duration_s"] is None else f"{s['duration_s']:.1f}s"
        summary = s["error"] if s["error"] and (s["status"] == "failed" or s["result"] is None) \
            else (s["result"] or "")
        held = s["lease"]
        if held is not None:  # the holder's own clock dates the write: a hint, not a verdict
            summary = (f"leased by {held['holder']} (generation {held['generation']}, written "
                       f"{held['written_s_ago']:.0f}s ago, ttl {held['ttl_s']:.0f}s)")
        rows.append([s["id"], s["status"], str(s["attempts"]), dur, count(s["tokens"] or None),
                     money(s["cost_usd"] or None), str(s["tool_calls"]), str(summary)])
    cols = [Col("step"), Col("status"), Col("att", 3, justify="right"), Col("dur", 4, justify="right"),
            Col("tokens", 2, justify="right"), Col("cost", 1, justify="right"),
            Col("calls", 5, justify="right"), Col("result", flex=True)]
    print_table(console, cols, rows)
    if args.calls:
        _render_calls([(s["id"], c) for s in steps for c in s["calls"]], with_step=True)
    return EXIT_OK


def _render_step(s: dict[str, Any]) -> None:
    console = out()
    dur = "-" if s["duration_s"] is None else f"{s['duration_s']:.1f}s"
    fit_line(console, f"step {s['id']}: {s['title']}")
    console.print(f"  status {s['status']}, {s['attempts']} attempt(s), {dur}, {count(s['tokens'])} "
                  f"tokens, {money(s['cost_usd'])}; started {timestamp(s['started_at'])}, finished "
                  f"{timestamp(s['completed_at'])}")
    if s["dependencies"]:
        console.print(f"  depends on: {', '.join(s['dependencies'])}", soft_wrap=True)
    if s["lease"]:
        held = s["lease"]
        console.print(f"  leased by {held['holder']} (generation {held['generation']}, written "
                      f"{held['written_s_ago']:.0f}s ago, ttl {held['ttl_s']:.0f}s)")
    if s["result"] is not None:
        console.print("  result:", printable(str(s["result"])), markup=False, soft_wrap=True)
    if s["error"]:
        console.print("  error:", printable(str(s["error"])), markup=False, soft_wrap=True)
    _render_calls([(s["id"], c) for c in s["calls"]], with_step=False)


def _render_calls(calls: list[tuple[str, dict[str, Any]]], with_step: bool) -> None:
    console = out()
    if not calls:
        console.print("no tool calls logged")
        return
    rows = []
    for sid, c in calls:
        d = c["duration_ms"]
        ms = "-" if d is None else f"{d:.0f}ms" if d < 1e15 else f"{d:.2e}ms"
        shown = c["error"] if c["error"] else c["result"]
        if isinstance(shown, dict | list):
            shown = json.dumps(shown, default=str)
        row = [c["tool"], c["phase"], ms, count(c["tokens"]), money(c["cost_usd"]), timestamp(c["timestamp"]),
               str(shown)]
        rows.append([sid, *row] if with_step else row)
    cols = [Col("tool"), Col("status"), Col("took", 4, justify="right"), Col("tokens", 3, justify="right"),
            Col("cost", 2, justify="right"), Col("at", 1), Col("result", flex=True)]
    if with_step:
        cols.insert(0, Col("step"))
    print_table(console, cols, rows, title="tool calls")


# ------------------------------------------------------------------------------- versions


def cmd_versions(args: argparse.Namespace) -> int:
    from ckptfs.format.keys import blocked_run_dirs, not_a_directory, run_prefix
    from ckptfs.format.models import validate_id
    from ckptfs.maintenance.history import list_versions
    from ckptfs.store.retention import keeps_fences

    validate_id(args.run_id, "run id")
    storage = _storage(args)
    keys = storage.list(run_prefix(args.run_id))  # one listing, for the versions and the folders
    infos = list_versions(storage, args.run_id, keys=keys)
    if not infos:
        raise run_not_found(args.run_id, storage.display_name, storage)
    # a run folder that is a link or a file: the versions behind it are listed by nothing here,
    # and the table would say "a restore can target v15" of a run whose log/ held v16 and v17
    blocked = blocked_run_dirs(keys)
    unread = f"{not_a_directory(blocked)}: the versions stored there are not listed" if blocked else None
    # what a load of exactly that version reaches through files that read (list_versions)
    points = {i.version for i in infos if i.restore_point}
    # A journal record below the oldest snapshot is a fence retention keeps on a remote store
    # for a while (store/retention.py), then deletes: a restore point only while the chain up
    # to it is still whole (the oldest fences go first). A store that keeps no fences (local
    # disk deletes pruned records at once) has none: its early records are history that
    # retention has not pruned (a store that never ran it showed v1 and v2 as fences).
    oldest = min((i.version for i in infos if "snap" in i.kinds), default=0)
    fences = {i.version for i in infos if i.kinds == ["log"] and i.version < oldest} \
        if keeps_fences(storage) else set()
    if args.json:
        emit_json({"url": storage.display_url, "run_id": args.run_id,
                   "restore_points": sorted(points), "fences": sorted(fences),
                   "versions": [i.to_dict() for i in infos], "unread": blocked})
        return EXIT_OK
    rows = []
    for i in infos:
        done = "-" if i.completed is None else f"{i.completed}/{i.total}"
        files = "+".join(i.kinds) + (" (fence)" if i.version in fences else "")
        rows.append([str(i.version), files, timestamp(i.time), i.status or "-", done,
                     count(i.failed), "yes" if i.restore_point else "-",
                     i.writer or ("unreadable" if not i.readable else "-")])
    cols = [Col("version", justify="right"), Col("files"), Col("written", 5), Col("status", 4),
            Col("done", 6, justify="right"), Col("failed", 1, justify="right"), Col("restore", 7),
            Col("writer", 0)]
    console = out()
    print_table(console, cols, rows, title=f"versions of {args.run_id} in {storage.display_name}")
    console.print(f"{len(infos)} version(s); a restore can target {len(points)}: "
                  f"{version_list(sorted(points))}", soft_wrap=True)
    if unread:
        console.print(f"note: {unread}", markup=False, soft_wrap=True)
    return EXIT_OK


# ----------------------------------------------------------------------------------- diff


def cmd_diff(args: argparse.Namespace) -> int:
    from rich.text import Text

    from ckptfs.maintenance.history import diff_states

    storage = _storage(args)
    old = _load(storage, args.run_id, args.v1)
    new = _load(storage, args.run_id, args.v2)
    d = diff_states(old, new)
    if args.json:
        emit_json({"url": storage.display_url, **d.to_dict()})
        return EXIT_OK
    console = out()
    console.print(Text.assemble((d.run_id, "bold"), f" v{d.old} -> v{d.new}"))
    if d.empty:
        console.print("no differences")
        return EXIT_OK
    for name, (a, b) in d.run_changes.items():
        console.print(f"run {name}: {a!r} -> {b!r}", markup=False, soft_wrap=True)
    console.print(f"{len(d.added)} step(s) added, {len(d.removed)} removed, {len(d.changed)} changed, "
                  f"{sum(len(c) for c in d.calls_added.values())} tool call(s) logged")
    rows: list[list[Any]] = []
    changes = {sid: (a, b) for sid, a, b in d.status_changes}
    for sid in d.removed:
        rows.append([sid, "removed", "-", ""])
    for sid in d.added:
        rows.append([sid, "added", f"- -> {changes[sid][1]}", ", ".join(d.changed.get(sid, []))])
    for sid, fields in d.changed.items():
        status = f"{changes[sid][0]} -> {changes[sid][1]}" if sid in changes else "-"
        rows.append([sid, "changed", status, ", ".join(fields)])
    if rows:
        print_table(console, [Col("step"), Col("change"), Col("status"), Col("fields", flex=True)], rows)
    calls = [(sid, _call_doc(c)) for sid, cs in d.calls_added.items() for c in cs]
    if calls:
        _render_calls(calls, with_step=True)
    return EXIT_OK


# --------------------------------------------------------------------------------- export


def cmd_export(args: argparse.Namespace) -> int:
    target = _output_path(args.output) if args.output else None  # refused before the run is read
    storage = _storage(args)
    if target is not None:
        _refuse_inside_store(args.output, target, storage)
    state = _load(storage, args.run_id, args.version, artifacts=not args.no_artifacts)
    doc = {"url": storage.display_url, **state.to_dict()}
    if target is not None:
        _write_output(args.output, target, dumps_json(doc) + "\n")
        err().print(f"exported {args.run_id} v{state.version} to {_shown(args.output)}", markup=False,
                    soft_wrap=True)
        return EXIT_OK
    emit_json(doc)
    return EXIT_OK


def _shown(path: str | Path) -> str:
    """A path the user gave, as a message names it: redacted first (a cut credential is no
    longer found whole to hide), then cut as a store's name is (`name_cut`). Whole, a path of
    thousands of characters made each line about it as long, twice where its folder is named."""
    return name_cut(redact_mangled(str(path)))


def _output_path(given: str) -> Path:
    """The file `--output` names, checked before anything is read: a directory, or a file in a
    directory that does not exist, is bad input (exit 2 naming the path), not a traceback after
    the whole run was loaded. A symlink is followed, as a plain write would follow it.

    So is a path the OS will not look up (a name past NAME_MAX, a folder on the way this user
    may not search, a link loop): it was "unexpected OSError", exit 3, quoting the path whole."""
    import errno
    import os
    import stat
    from pathlib import Path

    shown = _shown(given)
    try:
        mode: int | None = os.stat(given).st_mode
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # ENOTDIR: its folder's check says it
            denied = exc.errno in (errno.EACCES, errno.EPERM)
            raise CliError(f"--output {shown}: {exc.strerror}",
                           kind="not-writable" if denied else "usage") from None
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return Path(given)  # /dev/stdout, a FIFO, a device: written in place, as given
    if mode is not None and stat.S_ISDIR(mode):
        example = Path(given) / "export.json"
        raise CliError(f"--output {shown}: is a directory; give a file name (e.g. "
                       f"{_shown(example) if len(str(example)) <= NAMED_CHARS else 'export.json in it'})")
    target = Path(os.path.realpath(given))
    if not os.path.isdir(target.parent):
        what = "is not a directory" if os.path.exists(target.parent) else "does not exist"
        raise CliError(f"--output {shown}: its directory {_shown(Path(given).parent)} {what}")
    if not os.access(target.parent, os.W_OK | os.X_OK):  # said now, not after the whole run was read
        raise CliError(f"--output {shown}: cannot write in {_shown(target.parent)} (no permission, "
                       "or a read-only file system)", kind="not-writable")
    return target


def _refuse_inside_store(given: str, target: Path, storage: Storage) -> None:
    """An export written into the store it reads would replace a store file with JSON (a typo'd
    `--output STORE/runs/r/log/...ckpt` destroyed that version): bad input, refused unread."""
    import os

    root = storage.local_root()
    if root is None:
        return
    if path_within(os.path.realpath(target), root):
        # both cut: a path inside a long store's root is longer still (two of 4,000 characters
        # made one line of 8,000)
        raise CliError(f"--output {_shown(given)}: is inside the store "
                       f"{storage.display_name}; an export must not write among the store's "
                       "files (give a path outside it)")


def _write_output(given: str, target: Path, text: str) -> None:
    """Write beside the target, then rename over it: a write that fails (no space, no
    permission) leaves no half-written file and the old one, if any, as it was.

    Not when the target is there and is no regular file (/dev/stdout, a FIFO, a device): the
    rename would replace the device node itself (a review renamed a file over /dev/full, as
    root); such a target is written in place, and a failed write (ENOSPC) is an error too."""
    import os
    import stat

    shown = _shown(given)
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # changed since `_output_path` looked
        raise CliError(f"--output {shown}: cannot write it: {exc.strerror}") from None
    if mode is not None and not stat.S_ISREG(mode):
        try:
            with open(target, "w", encoding="utf-8") as out_file:
                out_file.write(text)
        except OSError as exc:
            raise CliError(f"--output {shown}: cannot write it: {exc.strerror or exc}") from None
        return
    tmp = _temp_beside(target)
    created = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        created = True
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if mode is not None:  # the file it replaces keeps its permissions (0600 stays 0600)
                os.fchmod(f.fileno(), stat.S_IMODE(mode))
        os.replace(tmp, target)
    except OSError as exc:
        if created:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise CliError(f"--output {shown}: cannot write it: {exc.strerror or exc}") from None


def _temp_beside(target: Path) -> Path:
    """The temporary file `_write_output` renames over `target`: named after it, where that
    name fits the file system's limit. A target of a name near the limit was refused, "File
    name too long", though a plain write to it works: its temp's name was the longer one."""
    import os

    name = f".{target.name}.{os.getpid()}.tmp"
    try:
        most = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255  # NAME_MAX of every common Linux file system
    if len(os.fsencode(name)) > most:
        name = f".export.{os.getpid()}.tmp"
    return target.with_name(name)


# -------------------------------------------------------------------------------- threads


def cmd_threads(args: argparse.Namespace) -> int:
    from ckptfs.cli.threads import list_threads

    return list_threads(args, _storage(args))
