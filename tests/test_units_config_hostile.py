"""Hostile values for the duration parser and the settings file.

Found:

* `parse_duration` took any Unicode digit: '\\uff11\\uff10s' (full-width) was 10 s, '\\u0663'
  (Arabic-Indic) 3 s, because `\\d`, float() and int() accept them. Operators type ASCII; such a
  value in a config file or on a command line is a paste accident, and `prune
  --superseded-grace` with a full-width 0 removed the superseded snapshots at once. Only 0-9
  are digits now; the refusal quotes the value and says why.
* A bad `mirror.cron` was echoed whole, and so was APScheduler's reason, which repeats the bad
  field (twice): a 5,000-character value made a 5,000-character error. An unknown setting, or an
  option table holding a credential, was named by its key whole, however long.

The CLI test runs the real executable.
"""

from __future__ import annotations

from pathlib import Path

import _cli_store
import pytest
from test_review_prune_cli_hostile import ckptfs

from ckptfs.config import load_settings
from ckptfs.errors import ConfigError, name_cut, quote_value
from ckptfs.format.units import parse_duration

pristine, store = _cli_store.pristine, _cli_store.store  # fixtures: papers v1..v17, snaps at 3..15

LONG = 5000
MAX_LINE = 400  # far above any message that cuts a value, far below one that echoes 5,000 characters

FULL_WIDTH = "\uff11\uff10s"  # FULLWIDTH DIGIT ONE, ZERO: looks like 10s in most terminals


# ------------------------------------------------------------------ parse_duration


@pytest.mark.parametrize(("value", "ascii", "seconds"), [
    (FULL_WIDTH, "10s", 10),
    ("\u0663", "3", 3),                   # ARABIC-INDIC DIGIT THREE
    ("\u06f5m", "5m", 300),               # EXTENDED ARABIC-INDIC DIGIT FIVE
    ("1h\uff13\uff10m", "1h30m", 5400),  # one full-width part among ASCII ones
    ("1h\uff13\uff10", "1h30", 3630),    # a bare number last is seconds, not minutes
    ("1.\uff15s", "1.5s", 1.5),           # after the decimal point
    ("\U0001d7d7", "9", 9),               # MATHEMATICAL BOLD DIGIT NINE (float() takes it)
    ("\u0967\u0966", "10", 10),          # DEVANAGARI
])
def test_a_duration_takes_only_ascii_digits(value: str, ascii: str, seconds: float) -> None:
    with pytest.raises(ConfigError) as e:
        parse_duration(value, allow_zero=True)
    message = str(e.value)
    assert quote_value(value) in message, message
    assert "ASCII" in message, message  # says why a value that looks right is refused
    assert parse_duration(ascii) == seconds  # the same written in ASCII keeps its meaning


def test_a_long_non_ascii_duration_is_named_cut() -> None:
    value = "\uff11" * LONG
    with pytest.raises(ConfigError) as e:
        parse_duration(value)
    message = str(e.value)
    assert len(message) < MAX_LINE and quote_value(value) in message, message[:300]
    assert "ASCII" in message, message  # not "too long": it is no number at all


# ------------------------------------------------------------------ settings file


def _error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    f = tmp_path / "c.toml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_settings(f, env=env or {})
    return str(e.value)


def test_full_width_interval_in_a_config_file_is_refused_naming_key_and_value(tmp_path: Path) -> None:
    message = _error(tmp_path, f'[mirror]\ninterval = "{FULL_WIDTH}"\n')
    assert "mirror.interval" in message and quote_value(FULL_WIDTH) in message, message


@pytest.mark.parametrize("cron", [
    "x" * LONG,                       # one field: APScheduler's reason is short, the value is not
    "* * * * " + "9" * LONG,          # APScheduler's reason repeats the field, twice
    "1-" + "5" * LONG + " * * * *",   # and parts of it
    "* * * * mon-" + "x" * LONG,      # a part only (the weekday name), not the field
])
def test_a_bad_cron_is_named_cut(tmp_path: Path, cron: str) -> None:
    message = _error(tmp_path, f'[mirror]\ncron = "{cron}"\n')
    assert len(message) < MAX_LINE + len(str(tmp_path)), message[:300]
    assert "mirror.cron" in message and quote_value(cron) in message, message[:300]
    # a short one is named whole, with APScheduler's reason whole
    message = _error(tmp_path, '[mirror]\ncron = "61 * * * *"\n')
    assert "'61 * * * *' is not a cron expression" in message and "maximum value (59)" in message


def test_a_bad_cron_from_the_environment_is_named_cut(tmp_path: Path) -> None:
    cron = "* * * * " + "9" * LONG
    message = _error(tmp_path, "", env={"CKPTFS_MIRROR_CRON": cron})
    assert len(message) < MAX_LINE, message[:300]
    assert "$CKPTFS_MIRROR_CRON" in message and quote_value(cron) in message, message[:300]


@pytest.mark.parametrize(("text", "key"), [
    (f'[mirror]\n{"k" * LONG} = 1\n', "k" * LONG),                               # an unknown setting
    (f'{"s" * LONG} = 1\n', "s" * LONG),                                          # an unknown section
    (f'[store.options]\n{"t" * LONG} = {{ password = "pw" }}\n', "t" * LONG),    # a credential in it
])
def test_a_long_key_is_named_cut(tmp_path: Path, text: str, key: str) -> None:
    message = _error(tmp_path, text)
    assert len(message) < MAX_LINE + len(str(tmp_path)), message[:300]
    assert name_cut(key) in message, message[:300]
    # a short one is named whole and bare, as before
    assert _error(tmp_path, "[mirror]\nfoo = 1\n").endswith("mirror.foo: unknown setting")


# ------------------------------------------------------------------ the CLI


def _contents(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("flag", "value"), [
    ("--superseded-grace", "\uff10"),        # was 0: every superseded snapshot removed at once
    ("--superseded-grace", "\u0661\u0660"),  # Arabic-Indic 10
    ("--artifact-grace", FULL_WIDTH),
])
def test_prune_refuses_a_non_ascii_grace_and_changes_nothing(
        store: Path, tmp_path: Path, flag: str, value: str) -> None:
    before = _contents(store)
    proc = ckptfs("prune", store, "--keep-last", "1", flag, value, cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert f"{flag}: {quote_value(value)} is not a duration" in proc.stderr, proc.stderr
    assert "ASCII" in proc.stderr, proc.stderr
    assert _contents(store) == before
