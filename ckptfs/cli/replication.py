"""`ckptfs` subcommands for replication: mirror, restore, config show.

SRC and DST default to the settings (`store.url`, `mirror.url`); `--storage-option/-o`
always addresses the primary store (mirror's SRC, restore's DST) and `--mirror-option` the
mirror side, each over the options from the config file and the environment. Progress bars
(objects and bytes) go to stderr, the summary table to stdout, or one JSON document with
`--json`. Exit codes: 0 ok, 1 incomplete or inconsistent, 2 usage error or unreachable.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ckptfs.cli._common import EXIT_OK, EXIT_PROBLEMS, CliError, console, console_err, emit_json
from ckptfs.cli._options import add_storage_args, merge_options, parse_items, storage_options_from_args
from ckptfs.config import Settings, load_settings, parse_duration
from ckptfs.errors import ConfigError
from ckptfs.replication.mirror import MirrorJob, TransferReport, mirror, restore
from ckptfs.storage.redact import redact_options

MIRROR_OPTIONS_ENV = "CKPTFS_MIRROR_STORAGE_OPTIONS"


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def _store_options(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    return merge_options(settings.store.options, storage_options_from_args(args))


def _mirror_options(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    return merge_options(settings.mirror.options, parse_items(args.mirror_option, "--mirror-option"))


class _Bars:
    """Objects and bytes bars on stderr, fed by the library's progress callbacks."""

    def __init__(self, progress: Progress) -> None:
        self.p = progress
        self.objects: TaskID = progress.add_task("objects", total=0)
        self.bytes: TaskID = progress.add_task("bytes", total=0)
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


@contextmanager
def _bars(enabled: bool) -> Iterator[_Bars | None]:
    if not enabled:
        yield None
        return
    progress = Progress(TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
                        DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
                        console=console_err, transient=False)
    with progress:
        yield _Bars(progress)


def _table(report: TransferReport) -> Table:
    verb = "mirror" if report.operation == "mirror" else "restore"
    t = Table(title=f"{verb} {report.src} -> {report.dst} ({report.seconds:.2f}s, "
                    f"{report.retries} retries)")
    for col in ("run", "status", "version", "snapshot", "copied", "skipped", "bytes", "note"):
        t.add_column(col, justify="right" if col in ("version", "snapshot", "copied", "skipped",
                                                    "bytes") else "left",
                     no_wrap=col in ("status", "version"), overflow="fold")
    for r in report.runs:
        style = "green" if r.status in ("mirrored", "restored", "up-to-date") else (
            "yellow" if r.ok else "red")
        note = r.error or "; ".join(r.notes) or (
            f"{r.source_version - r.previous} new version(s), every_n not reached"
            if r.status == "not-due" else "")
        t.add_row(r.run_id, f"[{style}]{r.status}[/{style}]", "" if r.version is None else str(r.version),
                  "-" if r.snapshot is None else str(r.snapshot), str(r.copied), str(r.skipped),
                  str(r.bytes), note)
    return t


def _finish(report: TransferReport, as_json: bool) -> int:
    if as_json:
        emit_json(report.to_dict())
    else:
        console.print(_table(report))
        for err in report.errors + [f"run {r.run_id}: {r.error}" for r in report.runs if r.error]:
            console_err.print(f"[red]error:[/red] {err}")
        if report.missing:
            console_err.print("[red]missing:[/red]")
            for m in report.missing[:20]:
                console_err.print(f"  {m}")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _cmd_mirror(args: argparse.Namespace) -> int:
    settings = _settings(args)
    m = settings.mirror
    src = args.src or settings.store.url
    dst = args.dst or m.url
    if not dst:
        raise CliError("no mirror destination: give DST, or set mirror.url (or $CKPTFS_MIRROR_URL)")
    every_n = args.every_n if args.every_n is not None else m.every_n
    keep_last = args.keep_last if args.keep_last is not None else m.keep_last
    latest = args.latest or m.latest
    workers = args.workers or m.workers
    attempts = args.attempts or m.attempts
    src_opts, dst_opts = _store_options(args, settings), _mirror_options(args, settings)
    interval = cron = None
    if not args.once:
        if args.interval:
            try:
                interval = parse_duration(args.interval)
            except ValueError as exc:
                raise CliError(f"--interval: {exc}") from None
        elif args.cron:
            cron = args.cron
        elif m.interval:
            interval = m.interval_seconds
        elif m.cron:
            cron = m.cron
    if interval is None and cron is None:
        with _bars(not args.no_progress) as bars:
            report = mirror(src, dst, every_n=every_n, run_id=args.run, src_options=src_opts,
                            dst_options=dst_opts, latest=latest, keep_last=keep_last,
                            workers=workers, attempts=attempts, progress=bars)
        return _finish(report, args.json)
    return _scheduled(args, src, dst, src_opts, dst_opts, every_n, keep_last, latest, workers,
                      attempts, interval, cron, m.misfire_grace_time)


def _scheduled(args: argparse.Namespace, src: str, dst: str, src_opts: dict[str, Any],
               dst_opts: dict[str, Any], every_n: int, keep_last: int | None, latest: bool,
               workers: int, attempts: int, interval: float | None, cron: str | None,
               grace: int) -> int:
    stop = threading.Event()
    failures = [0]

    def on_report(report: Any) -> None:
        if not report.ok:
            failures[0] += 1
        if args.json:
            print(json.dumps(report.to_dict(), default=str), flush=True)
        else:
            console.print(_table(report))

    job = MirrorJob(src, dst, every_n=every_n, interval=interval, cron=cron, keep_last=keep_last,
                    latest=latest, src_options=src_opts, dst_options=dst_opts,
                    misfire_grace_time=grace, workers=workers, attempts=attempts,
                    on_report=on_report)
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    job.start()
    when = f"every {interval:g}s" if interval is not None else f"on cron {cron!r}"
    console_err.print(f"mirroring {job.src_display} -> {job.dst_display} {when}; "
                      "Ctrl-C to stop")
    try:
        job.tick()  # a first pass right away, then on schedule
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        job.shutdown(wait=True)
    return EXIT_OK if failures[0] == 0 or (job.last_report is not None and job.last_report.ok) \
        else EXIT_PROBLEMS


def _cmd_restore(args: argparse.Namespace) -> int:
    settings = _settings(args)
    src = args.src or settings.mirror.url
    if not src:
        raise CliError("no mirror to restore from: give SRC, or set mirror.url (or $CKPTFS_MIRROR_URL)")
    dst = args.dst or settings.store.url
    if args.version is not None and not args.run:
        raise CliError("--version needs --run: versions are per run")
    with _bars(not args.no_progress) as bars:
        report = restore(src, dst, run_id=args.run, version=args.version,
                         src_options=_mirror_options(args, settings),
                         dst_options=_store_options(args, settings),
                         workers=args.workers or settings.mirror.workers,
                         attempts=args.attempts or settings.mirror.attempts, progress=bars)
    return _finish(report, args.json)


def _cmd_config_show(args: argparse.Namespace) -> int:
    settings = _settings(args)
    doc = settings.redacted()
    store_cli = storage_options_from_args(args)
    if store_cli:
        doc["store"]["options"] = redact_options(merge_options(settings.store.options, store_cli))
    if args.check:
        settings.check()
    if args.json:
        emit_json(doc)
        return EXIT_OK
    t = Table(title="ckptfs settings (secrets redacted)")
    t.add_column("key")
    t.add_column("value")
    for section, values in doc.items():
        for k, v in values.items():
            t.add_row(f"{section}.{k}", json.dumps(v) if isinstance(v, dict | list) else str(v))
    console.print(t)
    if args.check:
        console.print("[green]reachable[/green]")
    return EXIT_OK


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= minimum, with a message naming what was wrong."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n

    return parse


_positive = _int_at_least(1)
_nonneg = _int_at_least(0)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", default=None,
                   help="settings file (default: $CKPTFS_CONFIG, else config/ckptfs.toml if present)")
    add_storage_args(p)
    p.add_argument("--mirror-option", action="append", default=[], metavar="KEY=VALUE",
                   help=f"storage option for the mirror side, repeatable, dotted keys nest; "
                        f"over ${MIRROR_OPTIONS_ENV} (JSON) and mirror.options")
    p.add_argument("--workers", type=_positive, default=None, help="parallel transfers (default 8)")
    p.add_argument("--attempts", type=_positive, default=None,
                   help="tries per request on throttling/5xx/connection errors (default 6)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def register(sub: Any) -> None:
    """Add mirror, restore and config to the `ckptfs` parser."""
    p = sub.add_parser("mirror", help="copy restore points of runs to a mirror (e.g. S3)",
                       description="Copy every run's newest restore point from SRC to DST when it "
                                   "advanced --every-n versions (or at all, with --latest): "
                                   "artifacts, records, snapshot last; reruns converge.")
    p.add_argument("src", nargs="?", metavar="SRC", help="primary store URL (default store.url)")
    p.add_argument("dst", nargs="?", metavar="DST", help="mirror URL (default mirror.url)")
    p.add_argument("--every-n", type=_positive, default=None, help="versions between points")
    p.add_argument("--latest", action="store_true", help="always mirror the newest version")
    p.add_argument("--keep-last", type=_positive, default=None,
                   help="retention on the mirror: keep the newest N snapshots per run")
    p.add_argument("--run", default=None, metavar="ID", help="only this run")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one pass, then exit (default)")
    when.add_argument("--interval", metavar="DURATION", help="a pass every 30s / 5m / 1h")
    when.add_argument("--cron", metavar="EXPR", help="passes on a crontab schedule ('*/5 * * * *')")
    _common(p)
    p.set_defaults(handler=_cmd_mirror)

    r = sub.add_parser("restore", help="restore runs from a mirror into a fresh store",
                       description="Stage SRC's restore point locally, verify it by loading it, "
                                   "then publish it into DST; the agent can resume there.")
    r.add_argument("src", nargs="?", metavar="SRC", help="mirror URL (default mirror.url)")
    r.add_argument("dst", nargs="?", metavar="DST", help="store URL to restore into (default store.url)")
    r.add_argument("--run", default=None, metavar="ID", help="only this run (default: all)")
    r.add_argument("--version", type=_nonneg, default=None, metavar="V",
                   help="restore this version of --run instead of the newest")
    _common(r)
    r.set_defaults(handler=_cmd_restore)

    c = sub.add_parser("config", help="show the effective settings")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    show = csub.add_parser("show", help="print the effective settings, secrets redacted")
    show.add_argument("--config", metavar="PATH", default=None)
    show.add_argument("--json", action="store_true")
    show.add_argument("--check", action="store_true", help="also reach each configured URL once")
    add_storage_args(show)
    show.set_defaults(handler=_cmd_config_show)


__all__ = ["ConfigError", "register"]
