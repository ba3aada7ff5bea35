"""Credentials out of URLs, options and messages: nothing secret reaches a log line or an error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SECRET_KEY = re.compile(r"secret|token|password|passwd|credential|session|signature|^key$|_key$", re.I)


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
        return url  # a local path: no credentials or query syntax
    if has_credentials(url):
        rest = "***@" + rest.rsplit("@", 1)[1]
    if "?" in rest:
        rest = rest.split("?", 1)[0] + "?***"
    return f"{scheme}://{rest}"


def has_credentials(url: str) -> bool:
    """Whether a URL's host part may hold user:secret (see `redact_url`): refused as a store URL."""
    _scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return False
    host = rest.split("/", 1)[0]  # a key id holds no '/': its ':' is before the first one
    return "@" in host or ":" in host.split("@", 1)[0]


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """storage_options with every secret-looking value replaced, recursively."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if isinstance(v, Mapping):
            out[k] = redact_options(v)
        elif _SECRET_KEY.search(str(k)) and v is not None:
            out[k] = "***"
        else:
            out[k] = v
    return out


def scrub_secrets(text: str, options: Mapping[str, Any] | None) -> str:
    """Remove every secret option value (as redact_options sees them) from a message.

    Libraries build error messages around the values they were given; this is the last
    line of defence before such a message reaches a log line or the terminal.
    """
    for k, v in (options or {}).items():
        if isinstance(v, Mapping):
            text = scrub_secrets(text, v)
        elif _SECRET_KEY.search(str(k)) and v not in (None, ""):
            text = text.replace(str(v), "***")
    return text


