"""How deep storage options may nest: the one limit every walk over them relies on.

Storage options nest a few levels (config_kwargs.s3.addressing_style is three). Every walk over
them recurses (merging -o over the settings, redaction, the scrubber's search for secrets), so
options nested thousands deep ended in a RecursionError: a raw traceback from
$CKPTFS_STORAGE_OPTIONS (the scrubber reads it before the CLI's error handling), "internal",
exit 3, from `-o a.a.(...).b=1` or a TOML file, and a RecursionError from `open_storage` or
`CheckpointStore(url, storage_options=...)` in Python. Each parser of options refuses them, and
so does `open_storage`, which every store, mirror and restore opens its storage through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptfs.errors import ConfigError

MAX_OPTIONS_DEPTH = 32


def too_deep(where: str) -> ConfigError:
    return ConfigError(f"{where}: storage options nested deeper than {MAX_OPTIONS_DEPTH} levels "
                       "(tables and lists within each other); no storage option is that deep")


def check_options_depth(options: Any, where: str) -> None:
    """ConfigError naming `where` for options whose tables and lists nest deeper than
    MAX_OPTIONS_DEPTH, so no later walk meets a deeper tree (options that contain themselves
    included). Iterative: it must not fail as they did."""
    stack: list[tuple[Any, int]] = [(options, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Any = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if depth >= MAX_OPTIONS_DEPTH:
            raise too_deep(where)
        stack.extend((child, depth + 1) for child in children)
