"""`ckptfs` subcommands: maintenance (filled in by its own issue)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add this family's subcommands to the `ckptfs` parser."""
    del sub
