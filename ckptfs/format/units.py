"""Durations as people write them ('90', '30s', '15m', '1h30m', '7d', '2w'): one parser for the
config file, the environment and every CLI option, so `24h` means the same everywhere."""

from __future__ import annotations

import math
import re

from ckptfs.errors import ConfigError, quote_value

# ASCII only: \d, float() and int() also take full-width digits (U+FF10..U+FF19), Arabic-Indic
# ones and every other script's. Nobody types those into a config file or a command line on
# purpose; a paste that brought them in was taken as a number (a full-width zero a grace of 0:
# prune removed superseded snapshots at once).
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)", re.ASCII)
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


# The longest interval or grace a schedule takes: APScheduler adds it to the time of day as a
# timedelta, and a datetime ends at the year 9999 (a '99999999999999999999w' interval made every
# `ckptfs mirror` exit 3 with OverflowError, a misfire grace that long failed every tick).
MAX_SCHEDULE_SECONDS = 100 * 365 * 86400


def parse_duration(text: str | float | int, *, allow_zero: bool = False,
                   limit: float | None = None) -> float:
    """Seconds in a duration; ConfigError (a ValueError) naming the text for anything else.

    A bare number is seconds and may only stand last: '1h30' is 1 h 30 s (3630), as it has
    been since the first release, so configs that hold it keep their meaning; '30 1h' is
    refused. Digits are ASCII 0-9 only. Zero is refused unless `allow_zero` (an interval of 0
    would spin; a grace period of 0 is a choice); more than `limit` seconds too (a schedule's,
    MAX_SCHEDULE_SECONDS). The message quotes the text cut short (`quote_value`): it comes from
    a config file, the environment or a command line, any length.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        try:
            seconds = float(text)
        except OverflowError:  # an int past a float's range; str() of it may not even work
            digits = int(abs(int(text)).bit_length() * math.log10(2)) + 1
            raise ConfigError(f"duration of about {digits} digits is too long") from None
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            raise ConfigError(f"{text!r} is not a duration")
        shown = f"{seconds:g}"
    else:
        shown = quote_value(str(text))
        s = str(text).strip().lower()
        pos, seconds = 0, 0.0
        for m in _PART.finditer(s):
            if m.start() != pos or (m.group(2) == "" and m.end() != len(s)):
                break
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
            while pos < len(s) and s[pos] == " ":
                pos += 1
        if not s or pos != len(s):
            foreign = any(c.isdigit() and not c.isascii() for c in s)  # why a full-width '10s' fails
            raise ConfigError(f"{shown} is not a duration: a number with optional units s/m/h/d/w "
                              f"(e.g. 30s, 24h, 1h30m)"
                              + ("; digits must be ASCII 0-9" if foreign else ""))
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"duration {shown} must be {'zero or ' if allow_zero else ''}positive")
    if seconds == float("inf"):  # digits past a float's range ('9' * 400): no length of time
        raise ConfigError(f"duration {shown} is too long")
    if limit is not None and seconds > limit:
        raise ConfigError(f"duration {shown} is too long: at most {limit:g}s "
                          f"({limit / (365 * 86400):g} years)")
    return seconds
