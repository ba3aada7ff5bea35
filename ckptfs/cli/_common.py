"""What every subcommand shares: consoles, exit codes, JSON output, error rendering.

Errors are one line on stderr (`error: ...`, scrubbed of every secret the command knows). With
`--json` the same error is also one JSON object on stdout, so a script that parses stdout always
gets a document:

    {"ok": false, "command": "runs", "error": {"code": "unreachable", "message": "..."},
     "exit_code": 2}

Codes (exit code): usage (2), config (2), not-found (2), empty (2: nothing is stored at the URL),
unreachable (2: the store cannot be reached), not-writable (2: a read-only directory or mount),
no-space (2: a full disk), corrupt (1), conflict (1), lease-held (1: forget
refused a run a worker holds), in-use (1: forget refused a run an S3 store says was written
to within the fence time), interrupted (130), internal (3: a bug; -vv logs the traceback).
A reader that stops reading (`ckptfs runs | head -1`) ends the command quietly with 141, what a
shell reports for a program SIGPIPE stopped (`reader_gone`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptfs.cli._logging import SCRUBBER
from ckptfs.errors import (
    SHOWN_CHARS,
    CheckpointCorruptError,
    CkptfsError,
    ConfigError,
    ConflictError,
    CorruptFileError,
    InvalidIdError,
    RunNotFoundError,
    StorageUnavailableError,
    StoreNotWritableError,
    VersionNotFoundError,
    quote_value,
)

if TYPE_CHECKING:
    from rich.console import Console

    from ckptfs.storage.base import Storage

logger = logging.getLogger("ckptfs.cli")

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away
MIN_COLUMNS = 20  # a narrower width is no terminal a table is read in (COLUMNS=0, COLUMNS=5)

# error code -> exit code
ERROR_EXIT = {"usage": EXIT_USAGE, "config": EXIT_USAGE, "not-found": EXIT_USAGE, "empty": EXIT_USAGE,
              "unreachable": EXIT_USAGE, "not-writable": EXIT_USAGE, "no-space": EXIT_USAGE,
              "corrupt": EXIT_PROBLEMS, "conflict": EXIT_PROBLEMS, "lease-held": EXIT_PROBLEMS,
              "in-use": EXIT_PROBLEMS, "interrupted": EXIT_INTERRUPTED, "internal": EXIT_INTERNAL}


class Output:
    """How this invocation reports: set once by `main` (and by the parser before that)."""

    json = False
    command = ""


def _console(stderr: bool) -> Console:
    """A rich console that leaves a closed pipe to `reader_gone` and never renders at a width
    no table or line fits in.

    Rich's own answer to a reader that went away (`ckptfs verify STORE | head -1`) is exit 1,
    which is verify's and prune's "problems found": a clean store read through `head` reported
    damage to a `set -o pipefail` script. Here the BrokenPipeError goes on to `entry`, which
    exits 141 without a word.

    `COLUMNS=0` (some CI runners and editors' shells export it) made rich render at width 0:
    every table, summary and even the `error:` line came out empty, a failing command silent
    but for its exit code; `COLUMNS=5` cut every run id to five characters. Below MIN_COLUMNS
    the width is taken as unknown: 80, rich's default, and the terminal wraps what it must."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")

    console = PipeConsole(stderr=stderr)
    if console.width < MIN_COLUMNS:
        console.width = 80
    return console


@functools.cache
def out() -> Console:
    """The stdout console (tables, summaries), made on first use: `--help` never imports rich."""
    return _console(stderr=False)


@functools.cache
def err() -> Console:
    """The stderr console (progress, warnings, errors)."""
    return _console(stderr=True)


def reader_gone() -> int:
    """The exit code of a command whose reader closed the pipe (`| head -1`), after pointing
    stdout and stderr at /dev/null: what is still buffered for them is dropped at exit instead
    of ending in "Exception ignored ... BrokenPipeError". Nothing is said: nobody is reading."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return EXIT_BROKEN_PIPE
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no fd: a test's capture
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


Handler = Callable[[argparse.Namespace], int]

# format.keys.MAX_VERSION (a key holds 12 digits), not imported: registering a subcommand
# imports nothing heavy, and format.keys brings pydantic. A version, a count of versions
# or of snapshots past it names nothing a store can hold.
MAX_VERSION = 10**12 - 1
_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)


def quoted(text: str, limit: int = SHOWN_CHARS) -> str:
    """A value the user gave, quoted for an error message and cut to `limit` characters: a
    5,000-digit `--keep-last` filled the terminal (and a CI log) with itself, and told nothing
    the first characters do not. The library's `quote_value`, so a value the CLI names and one
    a library message names (parse_duration, parse_subset, a cron expression) read alike."""
    return quote_value(text, limit)


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """`quoted` for a name shown bare (an option's key): cut the same way, not quoted."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def bad_value(flag: str, text: str, exc: Exception) -> CliError:
    """A usage error for `flag` from a parser's message (parse_duration, parse_subset), with
    the value as that message quoted it cut short (`quoted`)."""
    message = str(exc)
    if len(text) > SHOWN_CHARS and quoted(text) not in message:  # not cut by the library already
        message = message.replace(repr(text), quoted(text))
        if len(message) > len(text):  # the value is in it some other way: say it without
            message = f"{quoted(text)} is not a valid value"
    return CliError(f"{flag}: {message}")


def grace_seconds(flag: str, text: str) -> float:
    """A grace period option's seconds (`--artifact-grace`, `--superseded-grace`): a duration
    (parse_duration: 90, 30s, 24h), zero allowed, at most 100 years; anything else, "" too, is a
    usage error naming `flag`. "" is refused because `--artifact-grace "$GRACE"` with GRACE
    unset silently meant the default; the bound because a 5,000-digit grace was infinity, and
    --json wrote `Infinity`, which is no JSON. One parser, so every grace option says the same
    about the same mistake (a negative, NaN or inf is "not a duration")."""
    from ckptfs.format.units import MAX_SCHEDULE_SECONDS, parse_duration

    try:
        return parse_duration(text, allow_zero=True, limit=MAX_SCHEDULE_SECONDS)
    except ValueError as exc:
        raise bad_value(flag, text, exc) from None


def whole_number(minimum: int, maximum: int, *, why_min: str = "", why_max: str = "") -> Callable[[str], int]:
    """An argparse type: an ASCII whole number in [minimum, maximum], refused with the value shown
    cut short (`quoted`). Every integer option uses it, so each says the same about the same
    mistake; the bound is checked on the digits before any conversion, so a number past
    Python's int-string limit is "too large", not "not a whole number" (or exit 3)."""

    def parse(text: str) -> int:
        s = text.strip()
        if not _WHOLE.fullmatch(s):
            raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number")
        digits = s.lstrip("+-").lstrip("0")
        if len(digits) <= 30:  # leading zeros dropped: 5,000 of them before a 1 is still 1
            n = -int(digits or "0") if s.startswith("-") else int(digits or "0")
        else:  # far past either bound: not converted (Python refuses ints of over 4,300 digits)
            n = minimum - 1 if s.startswith("-") else maximum + 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{why_min}, got {quoted(s)}")
        if n > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}{why_max}, got {quoted(s)}")
        return n

    return parse


class CliError(Exception):
    """A message for the user, the error code of the JSON document and the exit code."""

    def __init__(self, message: str, code: int | None = None, kind: str = "usage",
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = ERROR_EXIT.get(kind, EXIT_USAGE) if code is None else code
        self.extra = extra or {}


def run_not_found(run_ids: str | list[str], where: str, storage: Storage | None = None) -> CliError:
    """The one wording of "no such run" (show, versions, export, diff, forget, mirror, restore):
    a run id the store does not hold is bad input, exit 2, code not-found. Given the storage, a
    run whose folders something else stands in place of is named with it."""
    ids = [run_ids] if isinstance(run_ids, str) else run_ids
    if len(ids) == 1:
        blocked = blocked_dirs_of(storage, ids[0]) if storage is not None else []
        note = f"; {what_stands_there(blocked)}" if blocked else ""
        return CliError(f"run {ids[0]!r} not found in {where}{note}", kind="not-found")
    return CliError(f"runs {', '.join(repr(r) for r in ids)} not found in {where}", kind="not-found")


def blocked_dirs_of(storage: Storage, run_id: str) -> list[str]:
    """What stands, not being a directory, where a run's own folders belong (`log`, `delta`,
    `snap`) in a run no load finds (`format.keys.blocked_run_dirs`): such a run vanished from
    `runs`, and `show` said "not found" with nothing to go on. Anything else left in a run
    directory is no run: a forget keeps files that are not ckptfs's, and an empty directory is
    a forget cut short or a first commit in flight."""
    from ckptfs.format.keys import blocked_run_dirs, run_prefix

    try:
        return blocked_run_dirs(storage.list(run_prefix(run_id)))
    except (StorageUnavailableError, InvalidIdError):
        return []


def what_stands_there(blocked: list[str]) -> str:
    from ckptfs.format.keys import not_a_directory

    return (f"{not_a_directory(blocked)}, so no version of the run can be read; "
            "`ckptfs verify` says what each is")


def dumps_json(doc: Any) -> str:
    """`doc` as indented JSON. Python refuses to spell out an int over 4,300 digits: a commit
    accepts one at that limit, and a total of two (`totals()["step_tokens"]`) is one digit
    more, which stopped show --json and export with "unexpected ValueError". Only our own
    output is written past the limit (a sum is at most a few digits longer than a stored value)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(doc, indent=2, default=str)
    finally:
        sys.set_int_max_str_digits(limit)


def emit_json(doc: Any) -> None:
    """Machine output: one JSON document on stdout, nothing else there."""
    sys.stdout.write(dumps_json(doc) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    """One warning line on stderr, scrubbed."""
    from rich.text import Text

    err().print(Text.assemble(("warning: ", "yellow"), SCRUBBER.scrub(message)), soft_wrap=True)


def fail(kind: str, message: str, code: int | None = None, extra: dict[str, Any] | None = None) -> int:
    """Report an error the documented way (stderr line; JSON object with --json); its exit code."""
    from rich.text import Text

    exit_code = ERROR_EXIT.get(kind, EXIT_USAGE) if code is None else code
    message = " ".join(SCRUBBER.scrub(message).split())  # one line, whatever the library wrote
    label = "corrupt" if kind == "corrupt" else "error"
    err().print(Text.assemble((f"{label}: ", "red"), message), soft_wrap=True)
    if Output.json:
        try:
            emit_json({"command": SCRUBBER.scrub(Output.command), **(extra or {}), "ok": False,
                       "error": {"code": kind, "message": message}, "exit_code": exit_code})
        except BrokenPipeError:  # nobody reads the document; the error stands, and its code
            reader_gone()
    return exit_code


def run_command(args: argparse.Namespace) -> int:
    """Call the subcommand's handler, turning known errors into a message and exit code."""
    handler: Handler = args.handler
    try:
        return handler(args)
    except CliError as exc:
        return fail(exc.kind, str(exc), exc.code, exc.extra)
    except KeyboardInterrupt:
        return fail("interrupted", "interrupted")
    except BrokenPipeError:  # the reader went away: `entry` exits quietly, not "internal"
        raise
    except Exception as exc:
        kind = error_kind(exc)
        if kind == "internal":
            return _internal(exc)
        if kind == "no-space":  # the machine's state, not a bug
            logger.debug("no space", exc_info=True)
            return fail("no-space", f"{getattr(exc, 'strerror', None) or exc}: the filesystem being "
                                    "written is full (or a quota is reached); what was acknowledged "
                                    "before is kept: free space and run the command again")
        return fail(kind, str(exc))


def error_kind(exc: BaseException) -> str:
    """The documented error code (module docstring) of a library exception: the one mapping,
    used for a command's error and for each failed pass of a scheduled mirror alike."""
    if isinstance(exc, VersionNotFoundError | RunNotFoundError):
        return "not-found"
    if isinstance(exc, StoreNotWritableError):  # reachable, but this user or mount cannot write
        return "not-writable"
    if isinstance(exc, StorageUnavailableError):
        return "unreachable"
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, InvalidIdError):
        return "usage"
    if isinstance(exc, CheckpointCorruptError | CorruptFileError):
        return "corrupt"
    if isinstance(exc, ConflictError):
        return "conflict"
    if isinstance(exc, CkptfsError):
        return "usage"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no-space"
    return "internal"


def _internal(exc: Exception) -> int:
    """A bug: one line, the traceback at -vv (scrubbed like every record)."""
    logger.debug("unexpected error", exc_info=True)
    return fail("internal", f"unexpected {type(exc).__name__}: {exc} (run with -vv for the traceback)")
