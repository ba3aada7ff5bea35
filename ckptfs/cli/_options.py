"""Storage options from the command line and the environment, shared by every subcommand.

`--storage-option key=value` (repeatable; dotted keys nest: client_kwargs.endpoint_url=...)
is applied over the JSON object in CKPTFS_STORAGE_OPTIONS. Values stay strings except the
literals true/false/null and plain numbers under keys that do not look secret, so a numeric
secret is never turned into an int. Error messages name the key or the variable, never a value.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from ckptfs.cli._common import CliError
from ckptfs.config import json_object_env
from ckptfs.errors import ConfigError
from ckptfs.storage.redact import redact_options

ENV_VAR = "CKPTFS_STORAGE_OPTIONS"
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
_LITERALS: dict[str, Any] = {"true": True, "false": False, "null": None}


def add_storage_args(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable `--storage-option KEY=VALUE` flag."""
    parser.add_argument(
        "--storage-option", "-o", action="append", default=[], metavar="KEY=VALUE",
        dest="storage_option",
        help=f"fsspec/s3fs storage option, repeatable; dotted keys nest "
             f"(client_kwargs.endpoint_url=http://127.0.0.1:9000); applied over ${ENV_VAR} (JSON)",
    )


def _looks_secret(key: str) -> bool:
    return bool(redact_options({key: "x"})[key] == "***")


def _value(key: str, raw: str) -> Any:
    if raw in _LITERALS:
        return _LITERALS[raw]
    if _NUMBER.match(raw) and not _looks_secret(key):
        return float(raw) if "." in raw else int(raw)
    return raw


def storage_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The storage_options dict: the env var's JSON object, then each --storage-option over it."""
    env = os.environ.get(ENV_VAR, "").strip()
    try:
        opts = json_object_env(ENV_VAR, env) if env else {}
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    return merge_options(opts, parse_items(getattr(args, "storage_option", None) or [],
                                           "--storage-option"))


def parse_items(items: list[str], flag: str) -> dict[str, Any]:
    """KEY=VALUE items into a nested dict (dotted keys nest); errors name the key, never a value."""
    opts: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not p for p in key.split(".")):
            shown = key if sep else "(no '=')"
            raise CliError(f"{flag} must be KEY=VALUE; got a malformed option: {shown}")
        parts = key.split(".")
        target = opts
        for p in parts[:-1]:
            nxt = target.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise CliError(f"{flag} {key}: {p!r} is already a plain value")
            target = nxt
        target[parts[-1]] = _value(parts[-1], raw)
    return opts


def merge_options(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` applied on `base`, nested dicts merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_options(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
