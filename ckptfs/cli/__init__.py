"""The `ckptfs` command: parse, build, call, render. Library code never prints; this does.

Subcommands live in one module per family, each exposing `register(subparsers)`:
`maintenance` (verify, prune, runs, show) and `replication` (mirror, restore, config).
Exit codes everywhere: 0 ok, 1 problems found / incomplete, 2 usage error or unreachable.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from ckptfs.cli._common import EXIT_USAGE, CliError, console_err, run_command

COMMAND_MODULES = ("ckptfs.cli.maintenance", "ckptfs.cli.replication")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        console_err.print(f"[red]error:[/red] {message}")
        self.print_usage(sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from ckptfs import __version__

    parser = _Parser(prog="ckptfs", description="Durable checkpoints for long-running agents.")
    parser.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug) to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    code = run_command(args)
    return code


def entry() -> None:
    raise SystemExit(main())


__all__ = ["CliError", "build_parser", "entry", "main"]
