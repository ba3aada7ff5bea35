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

from ckptfs.cli._common import CliError, cut
from ckptfs.cli._logging import SCRUBBER
from ckptfs.errors import NAMED_CHARS, ConfigError, cut_long_words, name_cut
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

    def __post_init__(self) -> None:
        # every command's store (and mirror's and restore's other side) is one of these
        check_option_types(self.url, self.options)

    def describe(self) -> str:
        """The URL as every message names this store: redacted, then cut (`name_cut`), since a
        store that opens may still have a 5,000-character name that each message repeated."""
        from ckptfs.storage.redact import redact_url

        shown = name_cut(redact_url(self.url))
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


def open_existing(target: Target, attempts: int | None = None) -> Storage:
    """The target's Storage, reached once: a store that cannot be reached is exit 2
    ("unreachable"), one that holds nothing (a missing directory, an empty prefix) exit 2
    ("empty"), each with one line naming the URL and where it came from. `attempts`: tries per
    request in all, as the command's `--attempts` (mirror's and restore's look at their
    source went with the client's own retries, 25 requests to an S3 answering 503)."""
    from ckptfs.storage.registry import open_storage
    from ckptfs.storage.retry import RetryingStorage

    storage = open_storage(target.url, target.options)
    if attempts is not None:
        storage = RetryingStorage(storage, attempts=attempts)
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
    meant = name_cut(redact_url(meant)) if meant else None
    # no "?" after the URL: the scrubber reads what follows one as a query string, a secret
    hint = (f"; {name_cut(redact_url(target.url))} is a local path (no '//'); the URL would be {meant}"
            if meant else "")
    return CliError(f"nothing is stored at {target.describe()} (wrong URL or prefix?){hint}", kind="empty",
                    extra=extra)


def refuse_process_memory(url: str, shown: str, command: str) -> None:
    """A destination that dies with this process is bad input (exit 2): `mirror`, `restore` and
    `import-langgraph` into memory:// said what they had copied, exit 0, and kept nothing.

    So is a new local path that starts like a URL short of its `//` (`s3:/bucket/backups`,
    `memory:scratch`): the copy went to a local directory `s3:` and said 'mirrored', exit 0.
    One that exists is the user's own directory; `./s3:/...` names a new one.

    And a local path the file system cannot name (ENAMETOOLONG): the copy's first listing of
    it failed, "unexpected OSError", exit 3, and a scheduled mirror failed so at every tick."""
    import os

    from ckptfs.storage.redact import redact_url
    from ckptfs.storage.registry import lives_in_process, meant_url

    if lives_in_process(url):
        raise CliError(f"{shown} is this process's memory: what {command} copies there is gone "
                       "when it exits; give a directory or an s3:// URL")
    meant = meant_url(url) if "://" not in url else None
    if meant and not os.path.lexists(url):
        # `./NAME` only when the name is shown whole: a cut one is no path to type
        local = f"./{shown}" if len(redact_url(url)) <= NAMED_CHARS else "the path with ./ before it"
        raise CliError(f"{shown} is a local path (no '//'), not the URL {name_cut(redact_url(meant))}: "
                       f"{command} would copy into a new local directory; give the URL, or {local} "
                       "for a local directory of that name")
    path = _local_path(url)
    if path is not None and _name_too_long(path):
        raise CliError(f"{shown}: name too long for this file system (the whole path, or one "
                       f"folder name in it): {command} cannot write there; give a shorter path")


def _local_path(url: str) -> str | None:
    """The directory a URL names on this machine's disk (a plain path, file:// or local://)."""
    if "://" not in url:
        return url
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme.lower() in ("file", "local") and parts.netloc in ("", "localhost") and parts.path:
        return parts.path
    return None


def _name_too_long(path: str) -> bool:
    """Whether the OS refuses `path` as a name (ENAMETOOLONG): the whole past PATH_MAX, or a
    folder past NAME_MAX, one that exists or one still to be made in the nearest that does
    (a lookup below a missing folder says ENOENT, and the copy made folders until it failed)."""
    import errno
    import os

    try:
        os.lstat(path)
        return False
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return True
        if exc.errno != errno.ENOENT:
            return False  # ENOTDIR, EACCES, ...: the copy says what it is
    head, missing = os.path.abspath(path), []
    while not os.path.lexists(head):
        head, tail = os.path.split(head)
        missing.append(tail)
    try:
        most = os.pathconf(head, "PC_NAME_MAX")
    except (OSError, ValueError):
        return False
    return any(len(os.fsencode(part)) > most for part in missing)


def holds_anything(storage: Storage) -> bool:
    """One cheap listing (the top-level names): does the store hold anything at all?"""
    from ckptfs.errors import StorageUnavailableError

    try:
        return bool(storage.list_dirs(""))
    except (StorageUnavailableError, ConfigError):
        raise
    except FileNotFoundError:
        return False
    except (TypeError, AttributeError) as exc:  # an option of a type the backend cannot use
        raise ConfigError(SCRUBBER.scrub(
            f"{storage.display_name}: a storage option has a value of the wrong type "
            f"({_quoted_error(exc)})")) from None
    except Exception as exc:  # botocore/s3fs raise many types for a bad endpoint
        raise StorageUnavailableError(SCRUBBER.scrub(
            f"{storage.display_name}: cannot list the store: {_quoted_error(exc)}")) from None


def _quoted_error(exc: BaseException) -> str:
    """`Type: text` of another library's error for a message: scrubbed, then each long word
    cut (`cut_long_words`); an OSError quotes the path it was given, whole, as long as it is."""
    return cut_long_words(SCRUBBER.scrub(f"{type(exc).__name__}: {exc}"))


# What s3fs (and fsspec below it) takes per option, dotted paths for nested ones. A value of
# another type went through to the client and failed at its first request: `-o client_kwargs=5`
# was "unreachable" ('int' object has no attribute 'copy'), a store that was never asked.
_S3_OPTION_TYPES: dict[str, type] = {
    **dict.fromkeys(("client_kwargs", "config_kwargs", "s3_additional_kwargs",
                     "config_kwargs.retries", "config_kwargs.s3", "config_kwargs.proxies"), dict),
    **dict.fromkeys(("anon", "use_ssl", "requester_pays", "version_aware", "cache_regions",
                     "use_listings_cache", "skip_instance_cache", "default_fill_cache",
                     "fixed_upload_size", "asynchronous", "client_kwargs.use_ssl"), bool),
    **dict.fromkeys(("key", "secret", "token", "username", "password", "profile", "endpoint_url",
                     "default_cache_type", "client_kwargs.endpoint_url", "client_kwargs.region_name",
                     "client_kwargs.aws_access_key_id", "client_kwargs.aws_secret_access_key",
                     "client_kwargs.aws_session_token", "config_kwargs.region_name",
                     "config_kwargs.signature_version"), str),
    **dict.fromkeys(("default_block_size", "max_concurrency", "max_paths",
                     "config_kwargs.max_pool_connections"), int),
    **dict.fromkeys(("listings_expiry_time", "config_kwargs.connect_timeout",
                     "config_kwargs.read_timeout"), float),
}
# -o keeps these strings even when they read as numbers (a profile named 2024, a region)
_STRING_OPTIONS = {path.rsplit(".", 1)[-1] for path, kind in _S3_OPTION_TYPES.items() if kind is str}
_WANTED = {dict: "a table of options (from the command line: dotted keys, -o {path}.KEY=VALUE)",
           bool: "true or false", str: "a string", int: "a whole number", float: "a number"}


def _kind_of(value: Any) -> str:
    """What a value is, never the value itself (it may be a secret)."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a table"
    return "a list" if isinstance(value, list) else type(value).__name__


def _fits(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # an int to Python, never a number to a user
        return kind is bool
    return isinstance(value, int | float) if kind is float else isinstance(value, kind)


def check_option_types(url: str, options: dict[str, Any]) -> None:
    """Refuse, before any connection, an S3 option whose value has a type s3fs cannot use,
    naming the option and the type it takes (never the value): bad input is exit 2 with the
    cause, not an unreachable store. Unknown options, and other schemes' options, are left to
    the backend."""
    if url.split("://", 1)[0].lower() not in ("s3", "s3a") or "://" not in url:
        return
    for path, kind in _S3_OPTION_TYPES.items():
        value: Any = options
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            continue
        if not _fits(value, kind):
            raise CliError(f"storage option {path} must be {_WANTED[kind].format(path=path)}, "
                           f"not {_kind_of(value)}")


def _looks_secret(key: str) -> bool:
    return bool(redact_options({key: "x"})[key] == "***")


def _value(key: str, raw: str) -> Any:
    if raw in _LITERALS:
        return _LITERALS[raw]
    if _NUMBER.match(raw) and not _looks_secret(key) and key not in _STRING_OPTIONS:
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
    from ckptfs.storage.options import check_options_depth

    opts: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not p for p in key.split(".")):
            shown = cut(key) if sep else "(no '=')"
            raise CliError(f"{flag} must be KEY=VALUE; got a malformed option: {shown}")
        parts = key.split(".")
        target = opts
        for p in parts[:-1]:
            nxt = target.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise CliError(f"{flag} {cut(key)}: {cut(p)!r} is already a plain value")
            target = nxt
        try:
            target[parts[-1]] = _value(parts[-1], raw)
        except ValueError:  # digits past Python's conversion limit: was "internal", exit 3
            raise CliError(f"{flag} {cut(key)}: a number of more than {sys.get_int_max_str_digits()} "
                           "digits") from None
        check_options_depth(opts, f"{flag} {cut(key)}")
    return opts


def merge_options(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` applied on `base`, nested dicts merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_options(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
