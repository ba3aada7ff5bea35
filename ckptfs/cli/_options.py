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
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptfs.cli._common import CliError
from ckptfs.cli._logging import SCRUBBER
from ckptfs.errors import ConfigError
from ckptfs.storage.redact import redact_options

if TYPE_CHECKING:
    from ckptfs.config import Settings
    from ckptfs.storage.base import Storage

ENV_VAR = "CKPTFS_STORAGE_OPTIONS"
URL_ENV = "CKPTFS_URL"
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


def add_config_arg(parser: argparse.ArgumentParser) -> None:
    """Add `--config PATH`, the settings file every command reads."""
    parser.add_argument("--config", metavar="PATH", default=None,
                        help="settings file (default: $CKPTFS_CONFIG, else config/ckptfs.toml if present)")


def add_store_args(parser: argparse.ArgumentParser, *, url: bool = True) -> None:
    """The store every command addresses the same way: URL argument, else --config's store.url,
    else $CKPTFS_URL (which overrides the file, as every CKPTFS_* variable does); options from
    the settings, $CKPTFS_STORAGE_OPTIONS and -o, in that order."""
    if url:
        parser.add_argument("url", nargs="?", metavar="URL", default=None,
                            help=f"store URL: /path, file:///path, s3://bucket/prefix, memory://name "
                                 f"(default: store.url from --config, or ${URL_ENV})")
    add_config_arg(parser)
    add_storage_args(parser)


def add_json_arg(parser: argparse.ArgumentParser, what: str = "one JSON document on stdout") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def load_cli_settings(args: argparse.Namespace) -> Settings:
    """The settings this invocation reads (`--config`, $CKPTFS_CONFIG, config/ckptfs.toml, env)."""
    from ckptfs.config import load_settings

    settings = load_settings(getattr(args, "config", None))
    SCRUBBER.add_options(settings.store.options)
    SCRUBBER.add_options(settings.mirror.options)
    return settings


@dataclass
class Target:
    """A store this command works on: its URL, its options, and where the URL came from."""

    url: str
    options: dict[str, Any]
    origin: str  # "argument", "$CKPTFS_URL", "<file> (store.url)", "default store.url"
    settings: Settings

    def describe(self) -> str:
        from ckptfs.storage.redact import redact_url

        shown = redact_url(self.url)
        return shown if self.origin == "argument" else f"{shown} (from {self.origin})"


def store_target(args: argparse.Namespace, url: str | None = None) -> Target:
    """Resolve the primary store's URL and options, the one way every command does."""
    settings = load_cli_settings(args)
    given = url if url is not None else getattr(args, "url", None)
    opts = merge_options(settings.store.options, storage_options_from_args(args))
    SCRUBBER.add_options(opts)
    if given:
        return Target(given, opts, "argument", settings)
    return Target(settings.store.url, opts, settings.origin_of("store.url"), settings)


def open_existing(target: Target) -> Storage:
    """The target's Storage, reached once: a store that cannot be reached is exit 2
    ("unreachable"), one that holds nothing (a missing directory, an empty prefix) exit 2
    ("empty"), each with one line naming the URL and where it came from."""
    from ckptfs.storage.registry import open_storage

    storage = open_storage(target.url, target.options)
    if not holds_anything(storage):
        storage.close()
        raise nothing_stored(target)
    return storage


def nothing_stored(target: Target, extra: dict[str, Any] | None = None) -> CliError:
    """The one wording of an empty store (exit 2, code empty); a plain path that starts like a
    URL without its `//` (`memory:runs`, a local directory of that name) says what was meant."""
    from ckptfs.storage.redact import redact_url
    from ckptfs.storage.registry import meant_url

    meant = meant_url(target.url)
    meant = redact_url(meant) if meant else None
    # no "?" after the URL: the scrubber reads what follows one as a query string, a secret
    hint = f"; {redact_url(target.url)} is a local path (no '//'); the URL would be {meant}" if meant else ""
    return CliError(f"nothing is stored at {target.describe()} (wrong URL or prefix?){hint}", kind="empty",
                    extra=extra)


def refuse_process_memory(url: str, shown: str, command: str) -> None:
    """A destination that dies with this process is bad input (exit 2): `mirror`, `restore` and
    `import-langgraph` into memory:// said what they had copied, exit 0, and kept nothing.

    So is a new local path that starts like a URL short of its `//` (`s3:/bucket/backups`,
    `memory:scratch`): the copy went to a local directory `s3:` and said 'mirrored', exit 0.
    One that exists is the user's own directory; `./s3:/...` names a new one."""
    import os

    from ckptfs.storage.redact import redact_url
    from ckptfs.storage.registry import lives_in_process, meant_url

    if lives_in_process(url):
        raise CliError(f"{shown} is this process's memory: what {command} copies there is gone "
                       "when it exits; give a directory or an s3:// URL")
    meant = meant_url(url) if "://" not in url else None
    if meant and not os.path.lexists(url):
        raise CliError(f"{shown} is a local path (no '//'), not the URL {redact_url(meant)}: {command} "
                       f"would copy into a new local directory; give the URL, or ./{shown} for "
                       "a local directory of that name")


def holds_anything(storage: Storage) -> bool:
    """One cheap listing (the top-level names): does the store hold anything at all?"""
    from ckptfs.errors import StorageUnavailableError

    try:
        return bool(storage.list_dirs(""))
    except (StorageUnavailableError, ConfigError):
        raise
    except FileNotFoundError:
        return False
    except Exception as exc:  # botocore/s3fs raise many types for a bad endpoint
        raise StorageUnavailableError(SCRUBBER.scrub(
            f"{storage.display_url}: cannot list the store: {type(exc).__name__}: {exc}")) from None


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
    from ckptfs.config import json_object_env

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
        try:
            target[parts[-1]] = _value(parts[-1], raw)
        except ValueError:  # digits past Python's conversion limit: was "internal", exit 3
            raise CliError(f"{flag} {key}: a number of more than {sys.get_int_max_str_digits()} "
                           "digits") from None
    return opts


def merge_options(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` applied on `base`, nested dicts merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_options(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
