"""Durations as people write them ('90', '30s', '15m', '1h30m', '7d', '2w'): one parser for the
config file, the environment and every CLI option, so `24h` means the same everywhere.

And the checks of the numbers a caller passes to a policy or a command in code (`require_whole`,
`require_number`, `seconds_value`): here, the lowest layer, so the store's policies, prune and
the runtime's policies refuse the same mistakes alike, each naming its field."""

from __future__ import annotations

import math
import numbers
import operator
import re

from ckptfs.errors import SHOWN_CHARS, ConfigError, quote_value

# ASCII only: \d, float() and int() also take full-width digits (U+FF10..U+FF19), Arabic-Indic
# ones and every other script's. Nobody types those into a config file or a command line on
# purpose; a paste that brought them in was taken as a number (a full-width zero a grace of 0:
# prune removed superseded snapshots at once).
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)", re.ASCII)
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
FOREIGN_DIGITS = "; digits must be ASCII 0-9"  # what a refusal adds when `foreign_digits` is why


def foreign_digits(text: str) -> bool:
    """Whether `text` holds a digit of another script than ASCII: why a value that looks right
    on screen (a full-width '10s' or '3/10') is refused, for the message to say so."""
    return any(c.isdigit() and not c.isascii() for c in text)


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
            raise ConfigError(f"duration of about {_digits(int(text))} digits is too long") from None
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
            raise ConfigError(f"{shown} is not a duration: a number with optional units s/m/h/d/w "
                              f"(e.g. 30s, 24h, 1h30m)" + (FOREIGN_DIGITS if foreign_digits(s) else ""))
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"duration {shown} must be {'zero or ' if allow_zero else ''}positive")
    if seconds == float("inf"):  # digits past a float's range ('9' * 400): no length of time
        raise ConfigError(f"duration {shown} is too long")
    if limit is not None and seconds > limit:
        raise ConfigError(f"duration {shown} is too long: at most {limit:g}s "
                          f"({limit / (365 * 86400):g} years)")
    return seconds


def _digits(whole: int) -> int:
    """About how many decimal digits `whole` has, without str() (it refuses past 4,300)."""
    return int(whole.bit_length() * math.log10(2)) + 1


def shown_number(value: object) -> str:
    """`value` for a message about a number: its repr, cut short past SHOWN_CHARS as any value
    a caller gave (`quote_value`); an int longer than that is described by its size instead,
    since str() of one past 4,300 digits raises ValueError (a message about 10**5000 failed)."""
    if isinstance(value, int) and not isinstance(value, bool) and _digits(value) > SHOWN_CHARS:
        return f"an int of about {_digits(value)} digits"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else quote_value(text)


def require_whole(owner: str, name: str, value: object, least: int | None = None) -> int:
    """`value` as an int; TypeError naming `owner`'s `name` unless it is a whole number, and
    ConfigError (a ValueError) unless >= `least`, if given.

    Checked when a policy is built, not when it is used: a count of "3" raised a bare TypeError
    from a comparison deep inside execute_run (the run left "running"), and `fanout=16.0`
    sliced the compactor's merge stack, where every commit's compaction then failed and was
    only logged. A bool is a mistake, not 1 (`keep_last=True` kept one snapshot). A whole
    number that is no int (numpy.int64 from a config or a DataFrame: it has `__index__`, as
    floats and strings do not) is taken, as a plain int.
    """
    whole: int | None = None
    if not isinstance(value, bool) and hasattr(type(value), "__index__"):
        try:
            whole = operator.index(value)  # type: ignore[arg-type]
        except TypeError:  # numpy.bool_ has one that refuses
            whole = None
    if whole is None or isinstance(whole, bool):
        raise TypeError(f"{owner}: {name} must be a whole number, got {shown_number(value)} "
                        f"({type(value).__name__})")
    whole = int(whole)
    if least is not None and whole < least:
        raise ConfigError(f"{owner}: {name} must be >= {least}, got {shown_number(whole)}")
    return whole


def require_real(owner: str, name: str, value: object, what: str = "a number") -> float:
    """`value` as a float, inf for an int past a float's range (10**400); TypeError naming
    `owner`'s `name` unless it is a real number and no bool (`jitter=True` is a mistake, not
    1.0). Another real (numpy.float32, numpy.int64, a Fraction: `numbers.Real`) is taken, as a
    float; a Decimal is no Real (its arithmetic with a float raises) and is refused. Whether
    the number is finite and within bounds is the caller's to say (`require_number`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be {what}, got {shown_number(value)} "
                        f"({type(value).__name__})")
    try:
        return float(value)
    except OverflowError:  # an int (or a Fraction) past a float's range
        return math.inf
    except (TypeError, ValueError) as exc:  # a Real whose __float__ refuses
        raise TypeError(f"{owner}: {name} must be {what}, got {shown_number(value)} "
                        f"({type(value).__name__})") from exc


def require_number(owner: str, name: str, value: object, least: float,
                   most: float | None = None, unit: str = "") -> float:
    """`value` (`require_real`), an int kept as it is; ConfigError (a ValueError) naming
    `owner`'s `name` unless finite and in [least, most].

    NaN passes every `<` check (a NaN max_delay was accepted, and every delay became NaN, which
    time.sleep refuses mid-run); an infinite delay sleeps forever or overflows, and so does an
    int past a float (10**400). `unit` follows the bound in the message (" seconds").
    """
    number = require_real(owner, name, value)
    if not math.isfinite(number):
        raise ConfigError(f"{owner}: {name} must be a finite number, got {shown_number(value)}")
    if number < least or (most is not None and number > most):
        bound = f">= {least:g}" if most is None else f"within [{least:g}, {most:.0f}]"
        raise ConfigError(f"{owner}: {name} must be {bound}{unit}, got {shown_number(value)}")
    return value if isinstance(value, int | float) else number


def seconds_value(owner: str, name: str, value: object) -> float:
    """`value` as seconds (a float), or an error naming `owner`'s `name`: TypeError unless a
    real number that is no bool (`require_real`), ConfigError (a ValueError) unless finite and
    >= 0.

    One check for every grace or fence a caller gives in code (`CompactionPolicy`, `prune`,
    `mirror`), so each says the same about the same mistake, as `--superseded-grace` does on
    the command line: `superseded_grace=True` was taken as a grace of 1 s, a Decimal was kept
    and compared with floats on every retention, and 10**400 raised a bare OverflowError."""
    seconds = require_real(owner, name, value, "a number of seconds")
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{owner}: {name} must be finite and >= 0, got {shown_number(value)}")
    return seconds
