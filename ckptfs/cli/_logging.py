"""Verbose output as clean as plain output: only ckptfs's loggers get louder, and nothing secret
gets through.

`-v` shows ckptfs's INFO lines and `-vv` its DEBUG lines; third-party loggers (botocore, s3fs,
aiobotocore, urllib3, asyncio) stay at WARNING, because botocore at DEBUG prints every request's
headers: the access key id in `Authorization: ... Credential=<key id>/...` and the session token
in `X-Amz-Security-Token`. `-vvv` opens them too, for debugging a connection, but every record
of every logger passes through `SecretFilter`, which replaces the values it knows (the secret
options given on the command line, in the environment or in settings, and the AWS_* variables)
and the shapes it recognises (credential scopes, signatures, security-token headers) by `***`.
The same scrubber cleans the CLI's own error lines, whatever library built the message.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ckptfs.storage.redact import is_secret_option, redact_mangled, redact_url, secret_option_values

# option keys whose values are credentials: storage.redact's one list, the access key id in it
# (not a secret to AWS, but it names the account and the brief of this module is "nothing")
_SECRET_ENV = re.compile(r"^AWS_\w*(KEY|SECRET|TOKEN|PASSWORD)\w*$", re.I)
_MIN_SECRET = 4  # shorter values would scrub ordinary words; no real credential is this short

# shapes of credentials in botocore's debug lines and in URLs, whatever their values
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(Credential=)[^/\s,'\"]+"), r"\1***"),
    (re.compile(r"(Signature=)[0-9a-fA-F]+"), r"\1***"),
    (re.compile(r"((?:X-Amz-Security-Token|x-amz-security-token|X-Amz-Credential)['\"]?\s*[:=]\s*b?['\"]?)"
                r"[^'\"\s,&}]+"), r"\1***"),
    (re.compile(r"((?:aws_secret_access_key|aws_session_token|aws_access_key_id|secret_key|access_key)"
                r"['\"]?\s*[:=]\s*['\"]?)[^'\"\s,}]+", re.I), r"\1***"),
    # a libpq keyword/value connection string ("host=db password=s3cret"), quoted value too
    (re.compile(r"(\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s'\",}&]+)", re.I), r"\1***"),
)
# Any URL in a line (an argparse "invalid choice: 's3://...'" too) is shown as redact_url shows
# it, the one rule for credentials in a URL: user:secret@ whatever the secret holds ('/', '@'),
# a bare user (a token, a key id), an empty user (":secret@"), and the query string.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
# the punctuation of the sentence a URL ends in ("s3://b/p?***: not a valid bucket name"): the
# token above takes it in, and redact_url hid it with the query ("s3://b/p?***", the ':' gone)
_URL_END = re.compile(r"[:;,.!)\]}]+$")
# user:secret@ whose secret holds a quote, a space or a bracket, where the URL token above ends
# early: a ':' before any '/' after "://" and an '@' later on the line hide all up to the last '@'
_USERINFO = re.compile(r"(://)[^/\n:@]*:[^\n]*@")
# user:secret@ in front of a scheme (KEY:SECRET@bucket://p, the scheme forgotten before it)
_BEFORE_SCHEME = re.compile(r"(?<![^\s'\"(\[=])[^\s'\"@:]*:[^\s'\"]*@(?=[A-Za-z][A-Za-z0-9+.\-]*://)")


def secret_values(options: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> set[str]:
    """The credential values found in storage options (recursively) and in the environment.

    Options nested deeper than storage.options.MAX_OPTIONS_DEPTH are a ConfigError, never a
    RecursionError: every parser of options refuses them, so none should arrive, and a scrubber
    that cannot read them must stop the command rather than let their secrets through. A
    variable of options that does not parse is skipped: the settings name it, exit 2."""
    out: set[str] = set()

    def walk(opts: Mapping[str, Any]) -> None:
        out.update(v for v in secret_option_values(opts) if len(v) >= _MIN_SECRET)

    if options:
        from ckptfs.storage.options import check_options_depth

        check_options_depth(options, "storage options")
        walk(options)
    environ = os.environ if env is None else env
    profile = (options or {}).get("profile") or environ.get("AWS_PROFILE")
    if profile and environ.get("AWS_SHARED_CREDENTIALS_FILE"):
        # a profile's keys come from a file botocore reads: they are known values too
        out |= _profile_secrets(environ["AWS_SHARED_CREDENTIALS_FILE"])
    for name, value in environ.items():
        if _SECRET_ENV.search(name) and len(value) >= _MIN_SECRET:
            out.add(value)
        elif name.startswith("CKPTFS_") and name.endswith("OPTIONS"):
            from ckptfs.config import json_object_env
            from ckptfs.errors import ConfigError

            try:
                doc = json_object_env(name, value)
            except ConfigError:
                continue
            walk(doc)
    return out


def _profile_secrets(path: str) -> set[str]:
    """Every credential value in an AWS shared-credentials file (all profiles)."""
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return set()
    return {v for section in parser.sections() for k, v in parser.items(section)
            if is_secret_option(k) and len(v) >= _MIN_SECRET}


class Scrubber:
    """Replaces known secret values and credential shapes in text; values can be added later
    (each command adds the options it resolved)."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: list[str] = []
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            merged = set(self._values) | {v for v in values if len(v) >= _MIN_SECRET}
            # longest first, so a value containing another is replaced whole
            self._values = sorted(merged, key=len, reverse=True)

    def add_options(self, options: Mapping[str, Any] | None) -> None:
        self.add(secret_values(options))

    def scrub(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, "***")
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        text = _USERINFO.sub(r"\1***@", text)
        text = _BEFORE_SCHEME.sub("***@", redact_mangled(text))
        return _URL.sub(_redact_url_token, text)


def _redact_url_token(m: re.Match[str]) -> str:
    """A URL found in a line, redacted, with the punctuation after it kept as it was."""
    url = m.group(0)
    end = _URL_END.search(url)
    if end is None:
        return redact_url(url)
    return redact_url(url[: end.start()]) + end.group(0)


SCRUBBER = Scrubber()


class SecretFilter(logging.Filter):
    """A handler filter: every record's message, arguments, traceback and stack are scrubbed."""

    def __init__(self, scrubber: Scrubber) -> None:
        super().__init__()
        self.scrubber = scrubber

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: show its template, never its arguments
            message = str(record.msg)
        record.msg = self.scrubber.scrub(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.scrubber.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self.scrubber.scrub(record.stack_info)
        return True


def configure(verbosity: int) -> logging.Handler:
    """Log to stderr: ckptfs at WARNING / INFO (-v) / DEBUG (-vv); everyone else at WARNING,
    DEBUG from -vvv. Every record is scrubbed. Returns the handler (tests remove it)."""
    SCRUBBER.add(secret_values())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(SecretFilter(SCRUBBER))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "ckptfs_cli", False)]:
        root.removeHandler(old)
    handler.ckptfs_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbosity >= 3 else logging.WARNING)
    ours = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.getLogger("ckptfs").setLevel(ours)
    sys.unraisablehook = _log_unraisable
    return handler


def _log_unraisable(info: Any) -> None:
    """An exception in a destructor (fsspec's FTP filesystem, half-built by a bad URL, fails in
    its `__del__`): a DEBUG line through the scrubbing handler, not a raw traceback on stderr
    after the command's own clear error."""
    logging.getLogger("ckptfs.cli").debug("ignored in %r: %s: %s", info.object,
                                          type(info.exc_value).__name__, info.exc_value)
