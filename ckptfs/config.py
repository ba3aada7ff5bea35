"""Settings: one TOML file, overridden by the environment, validated with errors that name the key.

Where from, in order: the file given with `--config`, else `$CKPTFS_CONFIG`, else
`config/ckptfs.toml` if it exists, else the defaults; then the environment variables in
`ENV_VARS` on top. Every problem is one `ConfigError` naming the key (or the variable) and
what is wrong with it, never a secret value.

Credentials are not settings. They come from the standard AWS chain (AWS_ACCESS_KEY_ID and
friends, AWS_PROFILE, ~/.aws, instance roles); `options.profile = "name"` picks a profile. A
config file that holds a secret-looking option is refused, and ckptfs never writes one.
`CKPTFS_STORAGE_OPTIONS` / `CKPTFS_MIRROR_STORAGE_OPTIONS` (JSON) may carry secrets for
test servers: they live in the environment only and are redacted wherever shown.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ckptfs.errors import ConfigError, StorageUnavailableError, name_cut, quote_value
from ckptfs.format.units import MAX_SCHEDULE_SECONDS, foreign_digits, parse_duration
from ckptfs.storage.options import MAX_OPTIONS_DEPTH, check_options_depth, too_deep
from ckptfs.storage.redact import is_secret_option, redact_options, redact_url
from ckptfs.storage.registry import open_storage

DEFAULT_PATH = "config/ckptfs.toml"
CONFIG_ENV = "CKPTFS_CONFIG"

# variable -> (section, key, kind); kind "json" is a JSON object, the rest plain text
ENV_VARS: dict[str, tuple[str, str, str]] = {
    "CKPTFS_URL": ("store", "url", "text"),
    "CKPTFS_KEEP_LAST": ("store", "keep_last", "text"),
    "CKPTFS_ARTIFACT_THRESHOLD": ("store", "artifact_threshold", "text"),
    "CKPTFS_STORAGE_OPTIONS": ("store", "options", "json"),
    "CKPTFS_MIRROR_URL": ("mirror", "url", "text"),
    "CKPTFS_MIRROR_EVERY_N": ("mirror", "every_n", "text"),
    "CKPTFS_MIRROR_KEEP_LAST": ("mirror", "keep_last", "text"),
    "CKPTFS_MIRROR_LATEST": ("mirror", "latest", "text"),
    "CKPTFS_MIRROR_INTERVAL": ("mirror", "interval", "text"),
    "CKPTFS_MIRROR_CRON": ("mirror", "cron", "text"),
    "CKPTFS_MIRROR_WORKERS": ("mirror", "workers", "text"),
    "CKPTFS_MIRROR_ATTEMPTS": ("mirror", "attempts", "text"),
    "CKPTFS_MIRROR_STORAGE_OPTIONS": ("mirror", "options", "json"),
}

def json_object_env(var: str, raw: str) -> dict[str, Any]:
    """An environment variable that holds a JSON object (storage options); errors name it."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"${var}: not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except ValueError:  # an integer longer than Python converts: it was "internal", exit 3
        raise ConfigError(f"${var}: holds a number of more than {sys.get_int_max_str_digits()} "
                          "digits") from None
    except RecursionError:  # the decoder gives up on deep nesting, far past the limit
        raise too_deep(f"${var}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"${var}: must be a JSON object")
    check_options_depth(value, f"${var}")
    return value


def _secret_paths(options: Any, prefix: str) -> list[str]:
    """Where options hold a credential (`store.options.client_kwargs.headers.Authorization`),
    through tables and lists of tables at any depth."""
    out = []
    items = options.items() if isinstance(options, Mapping) else (
        enumerate(options) if isinstance(options, list | tuple) else ())
    for k, v in items:
        if isinstance(k, str) and is_secret_option(k) and v is not None:
            out.append(f"{prefix}.{name_cut(k)}")
        else:
            out += _secret_paths(v, f"{prefix}.{name_cut(k)}" if isinstance(k, str)
                                 else f"{prefix}[{k}]")
    return out


_DIGIT = re.compile(r"[0-9]")
_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _whole_number(v: Any) -> Any:
    """Refuse what only looks like a whole number, before pydantic reads it as one.

    `keep_last = true` is a mistake, not 1. Text (every environment variable, a quoted TOML
    value) with a '_' or a digit of another script is refused saying so: pydantic took
    CKPTFS_KEEP_LAST=1_0 as 10 (Python's int() syntax, which no operator means in a setting)
    and a full-width '10' as "not a valid integer", which it looks like. A TOML integer written
    1_000 is TOML's own syntax, read by the parser, and stays as it is. Other text without a
    digit is left to pydantic, whose message already says what is wrong with "many".

    A number with a fraction part is refused even when it is zero: pydantic took
    CKPTFS_KEEP_LAST=10.0 (and `keep_last = 10.0`) as 10, where `--keep-last 10.0` is "not a
    whole number" and `prune(keep_last=10.0)` a TypeError; the same setting reads the same
    wherever it is given. Text with digits is whole by the CLI's rule (`[+-]?[0-9]+`, spaces
    around allowed)."""
    if isinstance(v, bool):
        raise ValueError(f"must be a whole number, not {str(v).lower()}")
    if isinstance(v, float):
        raise ValueError(f"must be a whole number, got {v!r}")
    if isinstance(v, str) and ("_" in v or foreign_digits(v)):
        raise ValueError(f"must be a whole number in ASCII digits 0-9 (no '_'), got {quote_value(v)}")
    if isinstance(v, str) and _DIGIT.search(v) and not _WHOLE.fullmatch(v.strip()):
        raise ValueError(f"must be a whole number, got {quote_value(v)}")
    return v


# Every integer setting is one of these: the check above lives in the type, not in a list of
# field names a new setting could be left out of.
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]


class StoreSettings(BaseModel):
    """The primary store the agent writes."""

    model_config = ConfigDict(extra="forbid")

    url: str = "agent_checkpoints"
    keep_last: WholeNumber = Field(default=3, ge=1)
    artifact_threshold: WholeNumber = Field(default=64 * 1024, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)


class MirrorSettings(BaseModel):
    """Where and how often restore points are copied; `url` None means no mirror configured."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    every_n: WholeNumber = Field(default=10, ge=1)
    keep_last: WholeNumber | None = Field(default=None, ge=1)
    latest: bool = False
    interval: str | None = None
    cron: str | None = None
    misfire_grace_time: WholeNumber = Field(default=60, ge=1, le=MAX_SCHEDULE_SECONDS)
    workers: WholeNumber = Field(default=8, ge=1, le=128)
    attempts: WholeNumber = Field(default=6, ge=1, le=100)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v, limit=MAX_SCHEDULE_SECONDS)
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is not None:
            # imported here: loading the settings of every command should not load the mirror
            from ckptfs.replication.job import check_cron

            check_cron(v)
        return v

    @model_validator(mode="after")
    def _one_schedule(self) -> MirrorSettings:
        if self.interval is not None and self.cron is not None:
            raise ValueError("set interval or cron, not both")
        return self

    @property
    def interval_seconds(self) -> float | None:
        return None if self.interval is None else parse_duration(self.interval,
                                                                  limit=MAX_SCHEDULE_SECONDS)


class Settings(BaseModel):
    """Everything ckptfs reads from configuration; `origin` says where each value came from."""

    model_config = ConfigDict(extra="forbid")

    store: StoreSettings = Field(default_factory=lambda: StoreSettings())
    mirror: MirrorSettings = Field(default_factory=lambda: MirrorSettings())
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    _file: str | None = PrivateAttr(default=None)

    def origin_of(self, key: str) -> str:
        """Where `key` ("store.url") came from: "$CKPTFS_URL", "<file> (store.url)", or
        "default store.url"; error messages name it, so a wrong default is recognisable."""
        if key in self._origins:
            return self._origins[key]
        section, _, name = key.partition(".")
        sec = getattr(self, section, None)
        if self._file is not None and isinstance(sec, BaseModel) and name in sec.model_fields_set:
            return f"{self._file} ({key})"
        return f"default {key}"

    def redacted(self) -> dict[str, Any]:
        """The effective settings, safe to print: URLs and options with secrets hidden."""
        doc = self.model_dump()
        for section in ("store", "mirror"):
            if doc[section].get("url"):
                doc[section]["url"] = redact_url(doc[section]["url"])
            doc[section]["options"] = redact_options(doc[section]["options"])
        return doc

    def check(self, timeout: float = 3.0) -> None:
        """Reach the store (and the mirror, if set) once; StorageUnavailableError names which."""
        targets = [("store.url", self.store.url, self.store.options)]
        if self.mirror.url:
            targets.append(("mirror.url", self.mirror.url, self.mirror.options))
        for key, url, options in targets:
            opts = dict(options)
            if url.startswith(("s3://", "s3a://")):
                ck = dict(opts.get("config_kwargs", {}))
                ck.setdefault("connect_timeout", timeout)
                ck.setdefault("read_timeout", timeout)
                ck.setdefault("retries", {"max_attempts": 1})
                opts["config_kwargs"] = ck
            storage = open_storage(url, opts)
            try:
                storage.check()
            except StorageUnavailableError as exc:
                raise StorageUnavailableError(f"{key}: unreachable: {exc}") from None
            finally:
                storage.close()


def _describe(loc: tuple[Any, ...], origin: Mapping[str, str], where: str) -> str:
    """`file: key`, or `$VARIABLE (key)` when the environment set the value."""
    key = ".".join(name_cut(str(p)) for p in loc)
    for n in range(len(loc), 0, -1):
        prefix = ".".join(str(p) for p in loc[:n])
        if prefix in origin:
            return f"{origin[prefix]} ({key})"
    return f"{where}: {key}"


MAX_CONFIG_BYTES = 1 << 20  # a settings file is a few hundred bytes; nothing bigger is read


def _not_a_file(file: Path) -> str:
    """Why a config path that is not a regular file cannot be read, in a few words."""
    import stat

    try:
        st = file.stat()
    except FileNotFoundError:
        return "is a symbolic link to nothing" if file.is_symlink() else "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or type(exc).__name__}"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    return "is not a regular file (a FIFO, a socket or a device): never read"


def _read_toml(file: Path, via: str) -> dict[str, Any]:
    """The TOML document in a regular file; ConfigError naming the file for anything else.

    A UTF-8 byte-order mark (Notepad writes one) is read past: tomllib refused it with "Invalid
    statement (at line 1, column 1)" on a file that looks right in every editor. An integer
    longer than Python converts (`keep_last = 999...`, 5,000 digits) is tomllib's plain
    ValueError, not a TOMLDecodeError: it was "unexpected ValueError", exit 3, not a config error."""
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {str(file)!r} ({via}) cannot be read: "
                          f"{exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {str(file)!r} ({via}) is larger than "
                          f"{MAX_CONFIG_BYTES} bytes: not a settings file")
    try:
        return tomllib.loads(data.decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except ValueError:
        raise ConfigError(f"{file}: holds a number of more than {sys.get_int_max_str_digits()} "
                          "digits: not a setting") from None
    except RecursionError:  # inline tables or arrays nested past what the parser's stack takes
        raise ConfigError(f"{file}: tables or arrays nested deeper than {MAX_OPTIONS_DEPTH} "
                          "levels: not a settings file") from None


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None) -> Settings:
    """Read, override and validate the settings; ConfigError names the first bad key."""
    env = os.environ if env is None else env
    explicit = path if path is not None else env.get(CONFIG_ENV) or None
    file = Path(explicit) if explicit else Path(DEFAULT_PATH)
    doc: dict[str, Any] = {}
    where = "defaults"
    via = "--config" if path is not None else f"${CONFIG_ENV}" if explicit else "the default"
    # The default file is optional, but one that is there and is no regular file (a dangling
    # symlink to /etc, a directory, a FIFO, a symlink loop) is a config the operator meant:
    # running on the defaults instead sent `prune` and `forget` to ./agent_checkpoints.
    if (explicit or os.path.lexists(file)) and not file.is_file():
        raise ConfigError(f"config file {str(file)!r} ({via}) {_not_a_file(file)}")
    if file.is_file():
        where = str(file)
        doc = _read_toml(file, via)
    origin: dict[str, str] = {}
    for section in ("store", "mirror"):
        sec = doc.get(section)
        if isinstance(sec, dict) and isinstance(sec.get("options"), dict):
            check_options_depth(sec["options"], f"{where}: {section}.options")
            bad = _secret_paths(sec["options"], f"{section}.options")
            if bad:
                raise ConfigError(
                    f"{where}: {bad[0]}: credentials do not belong in a config file; use the AWS "
                    "chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws) or "
                    "options.profile")
    for var, (section, key, kind) in ENV_VARS.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        value: Any = raw
        if kind == "json":
            value = json_object_env(var, raw)
            base = doc.get(section, {}).get(key, {}) if isinstance(doc.get(section), dict) else {}
            value = {**(base if isinstance(base, dict) else {}), **value}
        sec = doc.setdefault(section, {})
        if not isinstance(sec, dict):
            raise ConfigError(f"{where}: [{section}] must be a table")
        sec[key] = value
        origin[f"{section}.{key}"] = f"${var}"
    try:
        settings = Settings.model_validate(doc)
    except ValidationError as exc:
        errs = exc.errors()
        lines = []
        for e in errs:
            loc = tuple(e["loc"])
            what = "unknown setting" if e["type"] == "extra_forbidden" else e["msg"].removeprefix(
                "Value error, ")
            lines.append(f"{_describe(loc, origin, where)}: {what}")
        raise ConfigError("; ".join(lines)) from None
    settings._origins = dict(origin)
    settings._file = where if where != "defaults" else None
    for section_name in ("store", "mirror"):
        sec_obj: StoreSettings | MirrorSettings = getattr(settings, section_name)
        url = sec_obj.url
        if url is None:
            continue
        try:
            open_storage(url, sec_obj.options).close()
        except (ConfigError, StorageUnavailableError) as exc:
            raise ConfigError(f"{_describe((section_name, 'url'), origin, where)}: {exc}") from None
    return settings
