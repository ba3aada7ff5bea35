"""What every subcommand shares: consoles, exit codes, JSON output, error rendering."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from ckptfs.errors import (
    CheckpointCorruptError,
    CkptfsError,
    ConfigError,
    InvalidIdError,
    StorageUnavailableError,
)

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

console = Console()
console_err = Console(stderr=True)

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """A message for the user and the exit code to leave with."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def emit_json(doc: Any) -> None:
    """Machine output: one JSON document on stdout, nothing else there."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def run_command(args: argparse.Namespace) -> int:
    """Call the subcommand's handler, turning known errors into a message and exit code."""
    handler: Handler = args.handler
    try:
        return handler(args)
    except CliError as exc:
        console_err.print(f"[red]error:[/red] {exc}")
        return exc.code
    except (StorageUnavailableError, ConfigError, InvalidIdError) as exc:
        console_err.print(f"[red]error:[/red] {exc}")
        return EXIT_USAGE
    except CheckpointCorruptError as exc:
        console_err.print(f"[red]corrupt:[/red] {exc}")
        return EXIT_PROBLEMS
    except CkptfsError as exc:
        console_err.print(f"[red]error:[/red] {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        console_err.print("interrupted")
        return 130
