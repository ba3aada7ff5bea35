"""Credentials out of URLs, options and messages: nothing secret reaches a log line or an error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Option keys whose values are credentials, in every backend fsspec opens: S3's key/secret/token,
# the access key id (not a secret to AWS, but it names the account), Azure's account_key and
# connection_string, an SSH passphrase, an HTTP header (Authorization, X-Api-Key, Cookie), a
# webdav `auth` pair, an SSE-C customer key. The one list: a config file holding one is refused,
# `config show` and every log line hide it. Not SSEKMSKeyId: the name of a KMS key, no secret.
SECRET_OPTION_KEY = re.compile(
    r"secret|token|password|passwd|passphrase|credential|session|signature|authori[sz]ation|"
    r"cookie|connection[_-]?string|access[_-]?key|key[_-]id|api[_-]?key|customer[_-]?key|^key$|"
    r"[_-]key$|^auth$|[_-]auth$", re.I)


def redact_url(url: str) -> str:
    """The URL with any credentials and query string hidden, for messages and logs.

    Not `urlsplit`'s netloc: it ends at the first '/', and an AWS secret key often holds '/'
    (and '+', sometimes '@'), so `s3://KEY:SEC/RET@bucket` would pass with its secret in
    full. Whenever the part before the first '/' holds an '@', or a ':' with an '@' later
    (user:secret@, the secret with '/' in it), everything up to the last '@' is hidden: a
    host:port with an '@' in its path is hidden too, the safe way to be wrong. Built by hand,
    so `s3://` stays `s3://`.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        # a local path, unless it is a URL short of a slash (s3:/KEY:SECRET@b, s3//KEY:SECRET@b)
        return redact_mangled(url)
    if "@" in scheme and not _SCHEME.fullmatch(scheme):  # KEY:SECRET@bucket://...: no scheme
        scheme = "***@" + scheme.rsplit("@", 1)[1]
    if has_credentials(url):
        rest = "***@" + rest.rsplit("@", 1)[1]
    if "?" in rest:
        rest = rest.split("?", 1)[0] + "?***"
    return f"{scheme}://{rest}"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
# A URL short of one of its slashes (s3:/KEY:SECRET@bucket, s3:KEY:SECRET@b, s3//KEY:SECRET@b):
# opened as a local path, so no '://' marks it, and every message naming the path printed the
# credentials. A scheme, ':', ':/' or '//', then user:secret@ (the secret may hold '/' and '@'):
# all up to the last '@' of the word is hidden. A local path rarely looks like that; one that
# does is hidden in messages, the safe way to be wrong. After a '/' too: the OSError of such a
# path quotes it absolute ('/tmp/x/s3:/KEY:SECRET@bucket/...: File name too long'), and a match
# that had to start a word left the secret in every message that quoted the error.
_MANGLED = re.compile(r"(?<![A-Za-z0-9+.\-:@])([A-Za-z][A-Za-z0-9+.\-]*(?::/?|//))"
                      r"[^/@:\s'\"]*:[^\s'\"]*@")


def redact_mangled(text: str) -> str:
    """`text` with the credentials of any URL short of a slash hidden (see `_MANGLED`)."""
    return _MANGLED.sub(r"\1***@", text) if "@" in text else text


def has_credentials(url: str) -> bool:
    """Whether a URL's host part may hold user:secret (see `redact_url`): refused as a store URL."""
    _scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return False
    host = rest.split("/", 1)[0]  # a key id holds no '/': its ':' is before the first one
    return "@" in host or ":" in host.split("@", 1)[0]


def is_secret_option(key: object) -> bool:
    """Whether an option of this name holds a credential (its whole value, whatever its type)."""
    return bool(SECRET_OPTION_KEY.search(str(key)))


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """storage_options with every secret-looking value replaced, recursively (lists too)."""
    return {k: "***" if is_secret_option(k) and v is not None else _redact_value(v)
            for k, v in options.items()}


def _redact_value(v: Any) -> Any:
    if isinstance(v, Mapping):
        return redact_options(v)
    if isinstance(v, list | tuple):  # a list of tables in a config file: each one redacted
        return [_redact_value(x) for x in v]
    return v


def secret_option_values(options: Mapping[str, Any] | None) -> set[str]:
    """Every credential value in storage options: each leaf under a secret-looking key (a
    token given as a table or a list too), found through tables and lists at any depth."""
    out: set[str] = set()

    def leaves(v: Any) -> None:
        if isinstance(v, Mapping):
            for x in v.values():
                leaves(x)
        elif isinstance(v, list | tuple):
            for x in v:
                leaves(x)
        elif v is not None and not isinstance(v, bool) and str(v) != "":
            out.add(str(v))

    def walk(v: Any) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                (leaves if is_secret_option(k) else walk)(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    walk(options or {})
    return out


def scrub_secrets(text: str, options: Mapping[str, Any] | None) -> str:
    """Remove every secret option value (as redact_options sees them) from a message, and the
    credentials of any URL short of a slash (`redact_mangled`).

    Libraries build error messages around the values they were given; this is the last
    line of defence before such a message reaches a log line or the terminal. An OSError
    quotes the path it was given, and a local path may be a URL short of a slash with its
    credentials in it: the library's own messages hide them, not only the CLI's scrubber.
    """
    for value in sorted(secret_option_values(options), key=len, reverse=True):
        text = text.replace(value, "***")
    return redact_mangled(text)
