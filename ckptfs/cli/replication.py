"""`ckptfs` subcommands for replication: mirror, restore, config show.

SRC and DST default to the settings (`store.url`, `mirror.url`), read the same way as every
command's store (argument, `--config`, $CKPTFS_URL / $CKPTFS_MIRROR_URL). Storage options name
their side by direction, on both commands: `--from-option` for SRC, `--to-option` for DST, each
over the options of that side from the config file and the environment. The older names stay
where they cannot be misread: on `mirror`, `-o/--storage-option` is the store (SRC) and
`--mirror-option` the mirror (DST); on `restore`, `--mirror-option` is the mirror (SRC), and
`-o` is refused with a message naming the two new options (it used to mean DST there, and an
endpoint given to the wrong side sent the request to the public AWS endpoint).

Progress bars (objects, and bytes) go to stderr, the summary table to stdout, or one JSON
document with `--json`. Exit codes: 0 ok, 1 incomplete or inconsistent, 2 usage error, nothing
stored at SRC, a --run (or restore's --version) SRC does not hold, a DST that overlaps SRC
(the same store, one inside the other: a copy there wrote among the source's own files), or
unreachable.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ckptfs.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    MAX_VERSION,
    CliError,
    bad_value,
    emit_json,
    err,
    error_kind,
    grace_seconds,
    out,
    run_not_found,
    whole_number,
)
from ckptfs.cli._logging import SCRUBBER
from ckptfs.cli._options import (
    Target,
    add_config_arg,
    add_json_arg,
    add_storage_args,
    check_option_types,
    load_cli_settings,
    merge_options,
    open_existing,
    parse_items,
    refuse_process_memory,
    storage_options_from_args,
)
from ckptfs.errors import ConfigError, name_cut

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.progress import Progress, Task, TaskID
    from rich.text import Text

    from ckptfs.config import Settings
    from ckptfs.replication.report import TransferReport

MIRROR_OPTIONS_ENV = "CKPTFS_MIRROR_STORAGE_OPTIONS"


def _store_options(args: argparse.Namespace, settings: Settings, *flags: str) -> dict[str, Any]:
    """The primary store's options: settings (file, $CKPTFS_STORAGE_OPTIONS), then the flags."""
    opts = merge_options(settings.store.options, storage_options_from_args(args)
                         if "storage_option" in flags else {})
    for flag in flags:
        if flag != "storage_option":
            opts = merge_options(opts, parse_items(getattr(args, flag), "--" + flag.replace("_", "-")))
    SCRUBBER.add_options(opts)
    return opts


def _mirror_options(args: argparse.Namespace, settings: Settings, *flags: str) -> dict[str, Any]:
    """The mirror's options: mirror.options (file, $CKPTFS_MIRROR_STORAGE_OPTIONS), then the flags."""
    opts = dict(settings.mirror.options)
    for flag in flags:
        opts = merge_options(opts, parse_items(getattr(args, flag), "--" + flag.replace("_", "-")))
    SCRUBBER.add_options(opts)
    return opts


class _Bars:
    """Objects and bytes bars on stderr, fed by the library's progress callbacks."""

    def __init__(self, progress: Progress) -> None:
        self.p = progress
        self.objects: TaskID = progress.add_task("objects", total=0, unit="objects")
        self.bytes: TaskID = progress.add_task("bytes", total=0, unit="bytes")
        self._lock = threading.Lock()

    def planned(self, objects: int, nbytes: int) -> None:
        with self._lock:
            for task, n in ((self.objects, objects), (self.bytes, nbytes)):
                total = self.p.tasks[task].total or 0
                self.p.update(task, total=total + n)

    def done(self, key: str, nbytes: int, skipped: bool) -> None:
        with self._lock:
            self.p.advance(self.objects, 1)
            self.p.advance(self.bytes, nbytes)


def _amount(task: Task) -> Text:
    """'12/40 objects' or '1.2/3.4 MB', and its rate in the same unit."""
    from rich.filesize import decimal
    from rich.text import Text

    done, total = task.completed, task.total or 0
    speed = task.finished_speed or task.speed
    if task.fields.get("unit") == "bytes":
        rate = f"{decimal(int(speed))}/s" if speed else "-"
        return Text(f"{decimal(int(done))}/{decimal(int(total))}  {rate}", style="progress.download")
    rate = f"{speed:.0f} objects/s" if speed else "-"
    return Text(f"{int(done)}/{int(total)} objects  {rate}", style="progress.download")


@contextmanager
def _bars(enabled: bool) -> Iterator[_Bars | None]:
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

    class Amount(ProgressColumn):
        def render(self, task: Task) -> RenderableType:
            return _amount(task)

    progress = Progress(TextColumn("{task.description:>8}"), BarColumn(), Amount(), TimeElapsedColumn(),
                        console=err(), transient=False)
    with progress:
        yield _Bars(progress)


def _table(report: TransferReport) -> None:
    from rich.text import Text

    from ckptfs.cli._render import Col, print_table

    verb = "mirror" if report.operation == "mirror" else "restore"
    rows: list[list[Any]] = []
    for r in report.runs:
        style = "green" if r.status in ("mirrored", "restored", "up-to-date") else (
            "yellow" if r.ok else "red")
        note = r.error or "; ".join(r.notes) or (
            f"{r.source_version - r.previous} new version(s), every_n not reached"
            if r.status == "not-due" else "")
        rows.append([r.run_id, Text(r.status, style=style), "" if r.version is None else str(r.version),
                     "-" if r.snapshot is None else str(r.snapshot), str(r.copied), str(r.skipped),
                     str(r.bytes), note])
    cols = [Col("run"), Col("status"), Col("version", justify="right"), Col("snap", 2, justify="right"),
            Col("copied", 4, justify="right"), Col("skipped", 3, justify="right"),
            Col("bytes", 1, justify="right"), Col("note", flex=True)]
    # the report keeps each store's name whole (its JSON's "src" and "dst"); a title cuts them
    print_table(out(), cols, rows, title=f"{verb} {name_cut(report.src)} -> {name_cut(report.dst)} "
                                          f"({report.seconds:.2f}s, {report.retries} retries)")


def _finish(report: TransferReport, as_json: bool) -> int:
    from rich.text import Text

    if as_json:
        emit_json(report.to_dict())
    else:
        _table(report)
        for e in report.errors + [f"run {r.run_id}: {r.error}" for r in report.runs if r.error]:
            err().print(Text.assemble(("error: ", "red"), SCRUBBER.scrub(e)), soft_wrap=True)
        if report.missing:
            err().print("[red]missing:[/red]")
            for m in report.missing[:20]:
                err().print(f"  {SCRUBBER.scrub(m)}", markup=False, soft_wrap=True)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _source(url: str | None, fallback: str | None, origin: str, opts: dict[str, Any],
            settings: Settings, what: str) -> Target:
    """SRC as a Target, checked to hold something: `mirror ./nonexistent DST` is exit 2."""
    if url:
        return Target(url, opts, "argument", settings)
    if not fallback:
        raise CliError(what)
    return Target(fallback, opts, origin, settings)


def _named_runs(source: Target, runs: list[str] | None, attempts: int) -> dict[str, set[str]] | None:
    """Check SRC holds something, and every run `--run` names: a run it does not hold is bad
    input (exit 2), refused before anything is copied. A mirror pass reports such a run as
    `empty` and succeeds, so a typo in a scheduled mirror would mirror nothing, forever. A
    whole store (no --run) that holds no run is fine: there is nothing to mirror yet.
    Returns each named run's listing, for a pass right away to plan from (`mirror(listings=)`:
    a second LIST of the run is a round trip on S3)."""
    from ckptfs.format.models import validate_id
    from ckptfs.replication.plan import run_files

    storage = open_existing(source, attempts)
    try:
        if runs is None:
            return None
        ids = list(dict.fromkeys(validate_id(r, "run id") for r in runs))
        listed = {r: run_files(storage, r) for r in ids}
        unknown = [r for r in ids if not listed[r][0]]
        if unknown:  # named with what stands where its folders belong, if anything does
            raise run_not_found(unknown, source.describe(), storage)
    finally:
        storage.close()
    return {r: keys for r, (_, keys) in listed.items()}


def _cmd_mirror(args: argparse.Namespace) -> int:
    from ckptfs.format.units import MAX_SCHEDULE_SECONDS, parse_duration
    from ckptfs.store.compactor import DEFAULT_SUPERSEDED_GRACE

    settings = load_cli_settings(args)
    m = settings.mirror
    src_opts = _store_options(args, settings, "storage_option", "from_option")
    dst_opts = _mirror_options(args, settings, "mirror_option", "to_option")
    source = _source(args.src, settings.store.url, settings.origin_of("store.url"), src_opts, settings,
                     "no store to mirror: give SRC, or set store.url (or $CKPTFS_URL)")
    dst = args.dst or m.url
    if not dst:
        raise CliError("no mirror destination: give DST, or set mirror.url (or $CKPTFS_MIRROR_URL)")
    dst_origin = "argument" if args.dst else settings.origin_of("mirror.url")
    target = Target(dst, dst_opts, dst_origin, settings)
    refuse_process_memory(dst, target.describe(), "mirror")
    every_n = args.every_n if args.every_n is not None else m.every_n
    keep_last = args.keep_last if args.keep_last is not None else m.keep_last
    superseded = DEFAULT_SUPERSEDED_GRACE
    if args.superseded_grace is not None:
        superseded = grace_seconds("--superseded-grace", args.superseded_grace)
        if keep_last is None:  # no retention on the mirror: the grace would be silently moot
            raise CliError("--superseded-grace needs --keep-last (or mirror.keep_last): it is a "
                           "grace of the mirror's retention")
    latest = args.latest or m.latest
    workers = args.workers or m.workers
    attempts = args.attempts or m.attempts
    interval = cron = None
    if not args.once:
        # `is not None`: `--cron "$CRON"` with CRON unset is an empty value, refused as the
        # option's (as `mirror.cron = ""` is), never read as no schedule: a one-off pass, exit 0
        if args.interval is not None:
            try:
                interval = parse_duration(args.interval, limit=MAX_SCHEDULE_SECONDS)
            except ValueError as exc:
                raise bad_value("--interval", args.interval, exc) from None
        elif args.cron is not None:  # refused as the option's (usage), before any store is listed
            from ckptfs.replication.job import check_cron

            try:
                check_cron(args.cron)
            except ValueError as exc:
                raise bad_value("--cron", args.cron, exc) from None
            cron = args.cron
        elif m.interval:
            interval = m.interval_seconds
        elif m.cron:
            cron = m.cron
    listings = _named_runs(source, args.run, attempts)
    runs = None if listings is None else list(listings)
    src = source.url
    if interval is None and cron is None:
        from ckptfs.replication.mirror import mirror

        with _bars(not args.no_progress) as bars:
            report = mirror(src, dst, every_n=every_n, run_id=runs, src_options=src_opts,
                            dst_options=dst_opts, latest=latest, keep_last=keep_last,
                            workers=workers, attempts=attempts, progress=bars, listings=listings,
                            superseded_grace=superseded)
        return _finish(report, args.json)
    # a scheduled pass lists afresh: the check's listing is stale by its first tick
    return _scheduled(args, src, dst, src_opts, dst_opts, every_n, keep_last, latest, workers,
                      attempts, interval, cron, m.misfire_grace_time, runs, superseded)


def _scheduled(args: argparse.Namespace, src: str, dst: str, src_opts: dict[str, Any],
               dst_opts: dict[str, Any], every_n: int, keep_last: int | None, latest: bool,
               workers: int, attempts: int, interval: float | None, cron: str | None,
               grace: int, runs: list[str] | None, superseded: float) -> int:
    from ckptfs.replication.job import MirrorJob

    stop = threading.Event()
    # the exit code is the last pass's: 0 only if it completed and was ok; None: no pass did
    last_ok: list[bool | None] = [None]

    def on_report(report: Any) -> None:
        last_ok[0] = bool(report.ok)
        if args.json:
            print(json.dumps(report.to_dict(), default=str), flush=True)
        else:
            _table(report)

    def on_error(exc: Exception) -> None:
        last_ok[0] = False
        message = " ".join(SCRUBBER.scrub(f"mirror pass failed: {type(exc).__name__}: {exc}").split())
        if args.json:  # the documented error object, one line per failed pass; the job goes on
            print(json.dumps({"operation": "mirror", "command": "mirror", "ok": False,
                              "error": {"code": error_kind(exc), "message": message}}), flush=True)
        else:
            from rich.text import Text

            err().print(Text.assemble(("error: ", "red"), message), soft_wrap=True)

    job = MirrorJob(src, dst, every_n=every_n, interval=interval, cron=cron, keep_last=keep_last,
                    latest=latest, src_options=src_opts, dst_options=dst_opts,
                    misfire_grace_time=grace, workers=workers, attempts=attempts,
                    on_report=on_report, run_ids=runs, on_error=on_error,
                    superseded_grace=superseded)
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    job.start()
    when = f"every {interval:g}s" if interval is not None else f"on cron {cron!r}"
    err().print(f"mirroring {name_cut(job.src_display)} -> {name_cut(job.dst_display)} {when}; "
                "Ctrl-C to stop",
                markup=False, soft_wrap=True)
    interrupted = False
    try:
        job.tick()  # a first pass right away, then on schedule
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, old)
        job.shutdown(wait=True)
    if last_ok[0] is None:
        # Ctrl-C during the first pass (it runs on this thread): no pass completed, so no
        # report, and the exit was 0, "ok", where `--once` stopped the same way says 130
        return EXIT_INTERRUPTED if interrupted else EXIT_PROBLEMS
    return EXIT_OK if last_ok[0] else EXIT_PROBLEMS


def _check_restorable(source: Target, run: str | None, version: int | None,
                      attempts: int) -> dict[str, set[str]]:
    """Check the mirror holds something, the run `--run` names and a file at `--version`:
    asking for what the mirror does not have is bad input (exit 2, naming the versions a
    restore can target, as `ckptfs versions` lists them), refused before DST is touched. A
    version the mirror does hold but cannot load stays the restore's report: exit 1, and so
    does one the mirror may hold behind a run folder that is no directory (a symlink or a
    file: `format.keys.blocked_run_dirs`): the restore names the folder; "no version 16" was
    wrong when v16 sat in a linked `log/`. A run with nothing but such folders is named with
    what stands there. The run is listed once (a second LIST is a round trip on S3): the
    listing is returned, run id -> keys, for the restore to plan from (`restore(listings=)`)."""
    from ckptfs.cli._render import version_list
    from ckptfs.format.keys import blocked_run_dirs
    from ckptfs.format.models import validate_id
    from ckptfs.replication.copy import run_ids
    from ckptfs.replication.plan import run_files
    from ckptfs.replication.report import LANGGRAPH_ENTRY
    from ckptfs.replication.restore import restore_points
    from ckptfs.storage.registry import list_keys

    storage = open_existing(source, attempts)
    try:
        if run is None:
            if not run_ids(storage, None) and not list_keys(storage, LANGGRAPH_ENTRY):
                # Only other files (what a first mirror pass stopped in its artifacts phase
                # leaves): exit 1 "holds no runs" where verify and runs said 0 and a recovery
                # script re-ran the restore forever. Nothing to restore is bad input, as an
                # empty store is.
                raise CliError(f"{source.describe()} holds no runs to restore (other files only: "
                               "a first mirror pass that stopped before its records?)", kind="empty")
            return {}
        validate_id(run, "run id")
        files, keys = run_files(storage, run)
        if not files:
            raise run_not_found(run, source.describe(), storage)
        if version is not None and version not in {f.version for f in files} \
                and not blocked_run_dirs(keys):
            points = restore_points(storage, run, keys=keys)
            raise CliError(f"run {run!r} has no version {version} in {source.describe()}; a restore "
                           f"can target {len(points)}: {version_list(points)}", kind="not-found")
    finally:
        storage.close()
    return {run: keys}


def _cmd_restore(args: argparse.Namespace) -> int:
    if args.storage_option:
        raise CliError("restore: -o/--storage-option is ambiguous here (it meant DST, the store "
                       "restored into); say which side: --from-option KEY=VALUE for SRC (the mirror), "
                       "--to-option KEY=VALUE for DST")
    settings = load_cli_settings(args)
    src_opts = _mirror_options(args, settings, "mirror_option", "from_option")
    dst_opts = _store_options(args, settings, "to_option")
    source = _source(args.src, settings.mirror.url, settings.origin_of("mirror.url"), src_opts, settings,
                     "no mirror to restore from: give SRC, or set mirror.url (or $CKPTFS_MIRROR_URL)")
    dst = args.dst or settings.store.url
    dst_origin = "argument" if args.dst else settings.origin_of("store.url")
    target = Target(dst, dst_opts, dst_origin, settings)
    refuse_process_memory(dst, target.describe(), "restore")
    if args.version is not None and not args.run:
        raise CliError("--version needs --run: versions are per run")
    attempts = args.attempts or settings.mirror.attempts
    listings = _check_restorable(source, args.run, args.version, attempts)
    from ckptfs.replication.restore import restore

    with _bars(not args.no_progress) as bars:
        report = restore(source.url, dst, run_id=args.run, version=args.version,
                         src_options=src_opts, dst_options=dst_opts,
                         workers=args.workers or settings.mirror.workers,
                         attempts=attempts, progress=bars, listings=listings)
    return _finish(report, args.json)


def _cmd_config_show(args: argparse.Namespace) -> int:
    from ckptfs.storage.redact import redact_options

    settings = load_cli_settings(args)
    store_cli = storage_options_from_args(args)
    if store_cli:  # what -o adds is checked and shown too (redacted)
        merged = merge_options(settings.store.options, store_cli)
        SCRUBBER.add_options(merged)
        settings.store = settings.store.model_copy(update={"options": merged})
    check_option_types(settings.store.url, settings.store.options)
    if settings.mirror.url:
        check_option_types(settings.mirror.url, settings.mirror.options)
    doc = settings.redacted()
    if store_cli:
        doc["store"]["options"] = redact_options(settings.store.options)
    if args.check:
        settings.check()
    if args.json:
        emit_json(doc)
        return EXIT_OK
    from ckptfs.cli._render import Col, print_table

    rows = [[f"{section}.{k}", json.dumps(v) if isinstance(v, dict | list) else str(v)]
            for section, values in doc.items() for k, v in values.items()]
    print_table(out(), [Col("key"), Col("value", flex=True, min_width=20)], rows,
                title="ckptfs settings (secrets redacted)")
    if args.check:
        out().print("[green]reachable[/green]")
    return EXIT_OK


_versions = whole_number(1, MAX_VERSION, why_max=" (no run holds more versions)")
_nonneg = whole_number(0, MAX_VERSION, why_max=" (a version has at most 12 digits)")
# the bounds mirror.workers and mirror.attempts have in the settings (config.py)
_workers = whole_number(1, 128)
_attempts = whole_number(1, 100)


def _option(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    p.add_argument(flag, action="append", default=[], metavar="KEY=VALUE",
                   help=help + "; repeatable, dotted keys nest (client_kwargs.endpoint_url=...)")


def _common(p: argparse.ArgumentParser, operation: str) -> None:
    add_config_arg(p)
    if operation == "mirror":
        _option(p, "--from-option", "storage option for SRC (the store), over store.options")
        _option(p, "--to-option", f"storage option for DST (the mirror), over mirror.options and "
                                  f"${MIRROR_OPTIONS_ENV}")
        add_storage_args(p)  # SRC, the store: the same side as every other command's -o
        _option(p, "--mirror-option", "the same as --to-option (DST, the mirror)")
    else:
        _option(p, "--from-option", f"storage option for SRC (the mirror), over mirror.options and "
                                    f"${MIRROR_OPTIONS_ENV}")
        _option(p, "--to-option", "storage option for DST (the store restored into), over store.options")
        _option(p, "--mirror-option", "the same as --from-option (SRC, the mirror)")
        p.add_argument("--storage-option", "-o", action="append", default=[], dest="storage_option",
                       metavar="KEY=VALUE", help="refused: say --from-option or --to-option")
    p.add_argument("--workers", type=_workers, default=None, help="parallel transfers (default 8)")
    p.add_argument("--attempts", type=_attempts, default=None,
                   help="tries per request on throttling/5xx/dropped connections (default 6)")
    add_json_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def register(sub: Any) -> None:
    """Add mirror, restore and config to the `ckptfs` parser."""
    p = sub.add_parser("mirror", help="copy restore points of runs to a mirror (e.g. S3)",
                       description="Copy every run's newest restore point from SRC to DST when it "
                                   "advanced --every-n versions (or at all, with --latest): "
                                   "artifacts, then the snapshot, then records in chain order; "
                                   "reruns converge.")
    p.add_argument("src", nargs="?", metavar="SRC", help="primary store URL (default store.url, $CKPTFS_URL)")
    p.add_argument("dst", nargs="?", metavar="DST",
                   help="mirror URL (default mirror.url, $CKPTFS_MIRROR_URL)")
    p.add_argument("--every-n", type=_versions, default=None, help="versions between points")
    p.add_argument("--latest", action="store_true", help="always mirror the newest version")
    p.add_argument("--keep-last", type=_versions, default=None,
                   help="retention on the mirror: keep the newest N snapshots per run")
    p.add_argument("--superseded-grace", default=None, metavar="SECONDS",
                   help="with --keep-last: keep a snapshot superseded less than this long ago on "
                        "the mirror, for its readers (default 60s; 0 removes them at once)")
    p.add_argument("--run", action="append", default=None, metavar="ID",
                   help="only this run (repeatable); one SRC does not hold is refused (exit 2)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true",
                      help="one pass, then exit (the default unless the settings give mirror.interval "
                           "or mirror.cron, as config/ckptfs.toml of this repository does)")
    when.add_argument("--interval", metavar="DURATION", help="a pass every 30s / 5m / 1h")
    when.add_argument("--cron", metavar="EXPR", help="passes on a crontab schedule ('*/5 * * * *')")
    _common(p, "mirror")
    p.set_defaults(handler=_cmd_mirror)

    r = sub.add_parser("restore", help="restore runs from a mirror into a fresh store",
                       description="Stage SRC's restore point locally, verify it by loading it, "
                                   "then publish it into DST; the agent can resume there.")
    r.add_argument("src", nargs="?", metavar="SRC",
                   help="mirror URL (default mirror.url, $CKPTFS_MIRROR_URL)")
    r.add_argument("dst", nargs="?", metavar="DST",
                   help="store URL to restore into (default store.url, $CKPTFS_URL)")
    r.add_argument("--run", default=None, metavar="ID", help="only this run (default: all)")
    r.add_argument("--version", type=_nonneg, default=None, metavar="V",
                   help="restore this version of --run instead of the newest")
    _common(r, "restore")
    r.set_defaults(handler=_cmd_restore)

    c = sub.add_parser("config", help="show the effective settings")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    show = csub.add_parser("show", help="print the effective settings, secrets redacted")
    add_config_arg(show)
    add_json_arg(show)
    show.add_argument("--check", action="store_true", help="also reach each configured URL once")
    add_storage_args(show)
    show.set_defaults(handler=_cmd_config_show)


__all__ = ["ConfigError", "register"]
