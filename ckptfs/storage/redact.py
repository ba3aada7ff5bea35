"""Credentials out of URLs, options and messages: nothing secret reaches a log line or an error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_SECRET_KEY = re.compile(r"secret|token|password|passwd|credential|session|signature|^key$|_key$", re.I)


def redact_url(url: str) -> str:
    """The URL with any user:password part and query string hidden, for messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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


