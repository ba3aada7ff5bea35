"""The `ckptfs` command: parse, build, call, render. Library code never prints; this does.

Subcommands live in one module per family, each exposing `register(subparsers)`:
`runs` (runs, show, versions, diff, export, threads), `maintenance` (verify, prune, forget) and
`replication` (mirror, restore, config). Registering imports nothing heavy: each handler imports
what it needs when it runs, so `ckptfs --help` costs what argparse costs, and `ckptfs runs` does
not load the agent runtime, the mirror or the scheduler.

No parser accepts abbreviations of long options (`--dat` is not `--data`): an abbreviation that
is unambiguous today becomes another option tomorrow.

Exit codes everywhere: 0 ok, 1 problems found / incomplete, 2 usage error, nothing stored at the
URL or store unreachable, 3 internal error, 130 interrupted (see `_common` for the JSON errors).
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import io
import sys
from collections.abc import Sequence
from typing import Any

from ckptfs.cli._common import EXIT_USAGE, CliError, Output, fail, reader_gone, run_command
from ckptfs.storage.fs import key_name

COMMAND_MODULES = ("ckptfs.cli.runs", "ckptfs.cli.maintenance", "ckptfs.cli.replication",
                   "ckptfs.cli.langgraph")


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations, reporting errors the CLI's way (JSON with --json)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise SystemExit(fail("usage", f"{self.prog}: {message}", EXIT_USAGE))


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    """`-v` after the subcommand too (`ckptfs prune URL --keep-last 3 -v`), counted with the
    global one; each subcommand parser and nested action parser gets it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if not any(a.dest == "sub_verbose" for a in child._actions):
                    child.add_argument("-v", "--verbose", action="count", default=0, dest="sub_verbose",
                                       help="log more (-v info, -vv debug, -vvv third-party too)")
                _add_verbose(child)


def build_parser() -> argparse.ArgumentParser:
    from ckptfs import __version__

    parser = _Parser(prog="ckptfs", description="Durable checkpoints for long-running agents.")
    parser.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more to stderr: -v info, -vv debug (ckptfs only), -vvv also "
                             "third-party libraries; secrets are scrubbed from every line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _add_verbose(parser)
    return parser


def _printable_output() -> None:
    """Text the output's encoding cannot hold is spelled out (`\\xe9`), not fatal.

    Under PYTHONIOENCODING=ascii (or a locale whose codec lacks a character) a run id, a goal
    or a path with one non-ASCII character stopped `runs` and `show` with "unexpected
    UnicodeEncodeError", exit 3, the table half-written. stderr already does this by default;
    `--json` escapes everything non-ASCII anyway.

    In the C locale without UTF-8 mode (`LC_ALL=C PYTHONUTF8=0`) Python opens them ascii with
    "surrogateescape", which fails on any other character (a table's "…" stopped `runs` with
    exit 3): there, undecodable bytes of a file name still go out as they came in, and the
    rest is spelled out."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
            stream.reconfigure(errors=_PRINTABLE if stream.errors == "surrogateescape" else
                               "backslashreplace")


def _bytes_back_else_spelled(exc: UnicodeError) -> tuple[str | bytes, int]:
    """surrogateescape for the bytes a file name could not decode, backslashreplace for the
    rest, one character at a time (a handler answers str or bytes, never both)."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    at = exc.start
    code = ord(exc.object[at])
    if 0xDC80 <= code <= 0xDCFF:
        return bytes([code - 0xDC00]), at + 1
    one = UnicodeEncodeError(exc.encoding, exc.object, at, at + 1, exc.reason)
    return codecs.backslashreplace_errors(one)


_PRINTABLE = "ckptfs-printable"
codecs.register_error(_PRINTABLE, _bytes_back_else_spelled)


_ID_ARGS = ("run_id", "run", "thread", "threads")


def _ids_as_keys(args: argparse.Namespace) -> None:
    """Run and thread ids as the store spells them: UTF-8, whatever the locale decoded argv
    with (`key_name`). Under `LC_ALL=C PYTHONUTF8=0`, `show STORE résumé` asked for
    "r\\udcc3\\udca9sum\\udcc3\\udca9" and found nothing. Paths stay as the OS gave them."""
    for name in _ID_ARGS:
        value = getattr(args, name, None)
        try:
            if isinstance(value, str):
                setattr(args, name, key_name(value))
            elif isinstance(value, list):
                setattr(args, name, [key_name(v) if isinstance(v, str) else v for v in value])
        except UnicodeError:  # given as text, not as the OS decoded it (main([...]) from Python)
            continue


def main(argv: Sequence[str] | None = None) -> int:
    from ckptfs.cli._logging import configure

    _printable_output()
    argv = list(sys.argv[1:] if argv is None else argv)
    Output.json = "--json" in argv  # before parsing, so that a usage error is JSON too
    Output.command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser()
    args = parser.parse_args(argv)
    _ids_as_keys(args)
    Output.json = bool(getattr(args, "json", False))
    Output.command = " ".join(str(c) for c in (args.command, getattr(args, "config_command", None)) if c)
    args.verbosity = int(args.verbose) + int(getattr(args, "sub_verbose", 0) or 0)
    configure(args.verbosity)
    return run_command(args)


def entry() -> None:
    """The `ckptfs` executable. A reader that closed the pipe (`ckptfs show ... --json | head
    -c 10`) is no error: the command stops quietly with 141 (`reader_gone`). It printed a
    BrokenPipeError traceback, exit 1, where --json met it: the write failed, the failure was
    reported as "internal" in JSON, and that write failed too."""
    try:
        code = main()
    except BrokenPipeError:
        code = reader_gone()
    raise SystemExit(code)


__all__ = ["CliError", "build_parser", "entry", "main"]
