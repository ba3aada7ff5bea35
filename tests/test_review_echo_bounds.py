"""Review of the ASCII-digits and cut-values change: what it left open.

Found:

* `parse_subset` matched `\\d`: '\\uff13/\\uff11\\uff10' (full-width 3/10) was the slice (3, 10),
  so `ckptfs verify --subset` took it.
* A cron expression took any script's digits ('\\uff11 * * * *' ran at minute 1), from
  `mirror.cron` and from `ckptfs mirror --cron` alike; two checks, each cutting APScheduler's
  reason its own way, and neither cut a field made of quotes (5,000 of them came back whole).
* A cron number past int()'s conversion limit was refused with int()'s advice to call
  sys.set_int_max_str_digits().
* `open_storage` named the URL whole, up to three times in one message (the URL, its scheme or
  bucket, the backend's error): a 5,000-character URL made a 15,000-character error, through
  the settings and the command line.
* pydantic read CKPTFS_KEEP_LAST=1_0 (or `keep_last = "1_0"`) as 10.

The CLI tests run the real executable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

import pytest
from test_review_prune_cli_hostile import ckptfs

from ckptfs import AgentRun, CheckpointStore
from ckptfs.config import MirrorSettings, StoreSettings, load_settings
from ckptfs.errors import NAMED_CHARS, SHOWN_CHARS, ConfigError, cut_long_words, name_cut, quote_value
from ckptfs.maintenance.verify import parse_subset
from ckptfs.replication.job import MirrorJob, check_cron
from ckptfs.storage.redact import redact_url
from ckptfs.storage.registry import open_storage

LONG = 5000
MAX_LINE = 800  # far above any message that cuts a value, far below one that echoes 5,000 characters
# no word past the longest cut a message makes: a name (URL, key) at NAMED_CHARS, a value at SHOWN_CHARS
LONG_WORD = re.compile(rf"[^\s'\"()…]{{{max(SHOWN_CHARS, NAMED_CHARS) + 1},}}")

KEY_ID = "AKIAECHOBOUNDS7KEYID"
SECRET = "Echo+Bounds/Secret"  # fake, with the slash and plus an AWS secret may hold
QUERY_SECRET = "QUERYECHOSECRET"


def _store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    with CheckpointStore(str(root)) as store:
        store.save_run(AgentRun(run_id="r", goal="g"))
    return root


def _config_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    f = tmp_path / "c.toml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_settings(f, env=env or {})
    return str(e.value)


# ------------------------------------------------------------------ 1. verify --subset


@pytest.mark.parametrize(("value", "ascii"), [
    ("\uff13/\uff11\uff10", "3/10"),  # FULLWIDTH 3 / 10
    ("3/\uff11\uff10", "3/10"),        # one side only
    ("\u0663/\u0661\u0660", "3/10"),   # ARABIC-INDIC
    ("\U0001d7d1/4", "1/4"),           # MATHEMATICAL BOLD DIGIT ONE
])
def test_parse_subset_takes_only_ascii_digits(value: str, ascii: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_subset(value)
    message = str(e.value)
    assert quote_value(value) in message and "ASCII" in message, message
    assert parse_subset(ascii) == tuple(int(x) for x in ascii.split("/"))


def test_cli_verify_refuses_a_full_width_subset(tmp_path: Path) -> None:
    store = _store(tmp_path)
    value = "\uff13/\uff11\uff10"
    proc = ckptfs("verify", store, "--subset", value, cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert f"--subset: subset {quote_value(value)} is not K/N" in proc.stderr, proc.stderr
    assert "ASCII" in proc.stderr and len(proc.stderr) < MAX_LINE, proc.stderr


# ------------------------------------------------------------------ 2. one cron check


FOREIGN_CRONS = ["\uff11 * * * *", "0 \u0663 * * *", "*/\u0665 * * * *", "0 0 \U0001d7d9 * *"]


@pytest.mark.parametrize("cron", FOREIGN_CRONS)
def test_a_cron_takes_only_ascii_digits_everywhere_alike(tmp_path: Path, cron: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_cron(cron)
    message = str(e.value)
    assert message == f"{quote_value(cron)} is not a cron expression (digits must be ASCII 0-9)"
    with pytest.raises(ConfigError) as job:
        MirrorJob("memory://echo-a", "memory://echo-b", cron=cron)
    assert str(job.value) == message  # the same check, the same words
    from_file = _config_error(tmp_path, f'[mirror]\ncron = "{cron}"\n')
    assert from_file == f"{tmp_path / 'c.toml'}: mirror.cron: {message}", from_file
    from_env = _config_error(tmp_path, "", env={"CKPTFS_MIRROR_CRON": cron})
    assert from_env == f"$CKPTFS_MIRROR_CRON (mirror.cron): {message}", from_env
    # written in ASCII, it is a cron expression, as is one with a field past SHOWN_CHARS
    ascii = "".join(str(int(c)) if c.isdigit() else c for c in cron)
    every_two = ",".join(str(m) for m in range(0, 60, 2))  # 84 characters, one field
    for valid in (ascii, "0 0 * * mon-fri", f"{every_two} * * * *", "0005 * * * *"):
        check_cron(valid)
        MirrorJob("memory://echo-a", "memory://echo-b", cron=valid).shutdown()


@pytest.mark.parametrize("cron", [
    "'" * LONG + " * * * *",            # a field of quotes: no word between them to cut
    '"' * LONG + " * * * *",
    "1-" + "5" * 300 + " * * * *",      # the reason repeats the field and a part of it
    "* * * * mon-" + "x" * LONG,
])
def test_a_bad_cron_is_one_short_message_from_every_door(tmp_path: Path, cron: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_cron(cron)
    message = str(e.value)
    assert len(message) < MAX_LINE and quote_value(cron) in message, message[:500]
    assert not LONG_WORD.search(message), message
    with pytest.raises(ConfigError) as job:
        MirrorJob("memory://echo-a", "memory://echo-b", cron=cron)
    assert str(job.value) == message
    from_file = _config_error(tmp_path, f"[mirror]\ncron = '''{cron}'''\n" if '"' in cron
                              else f'[mirror]\ncron = "{cron}"\n')
    assert from_file.endswith(f"mirror.cron: {message}"), from_file[:500]


def test_cut_long_words_keeps_the_sentence_and_bounds_every_word() -> None:
    reason = f"Error validating expression '1-{'5' * 300}': the last value ({'5' * 300}) is high"
    cut = cut_long_words(reason)
    assert cut == (f"Error validating expression '1-{'5' * 38}… (302 characters)': the last value "
                   f"({'5' * 40}… (300 characters)) is high")
    quotes = "'" * LONG
    assert cut_long_words(f"x {quotes} y") == f"x {quotes[:SHOWN_CHARS]}… ({LONG} characters) y"
    assert cut_long_words("short (words) 'stay' as they are") == "short (words) 'stay' as they are"


def test_cli_mirror_refuses_a_full_width_cron_before_touching_anything(tmp_path: Path) -> None:
    store = _store(tmp_path)
    cron = "\uff11 * * * *"
    proc = ckptfs("mirror", store, tmp_path / "dst", "--cron", cron, "--json", cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    doc = json.loads(proc.stdout)
    assert doc["error"]["message"] == f"--cron: {quote_value(cron)} is not a cron expression " \
                                      "(digits must be ASCII 0-9)", doc
    assert len(proc.stderr) < MAX_LINE, proc.stderr
    assert not (tmp_path / "dst").exists()


def test_cli_mirror_names_a_full_width_cron_of_the_settings_by_its_key(tmp_path: Path) -> None:
    store = _store(tmp_path)
    cron = "0 \uff13 * * *"
    (tmp_path / "c.toml").write_text(f'[mirror]\ncron = "{cron}"\n', encoding="utf-8")
    proc = ckptfs("mirror", store, tmp_path / "dst", "--config", "c.toml", cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert f"mirror.cron: {quote_value(cron)} is not a cron expression" in proc.stderr, proc.stderr
    assert "ASCII" in proc.stderr and len(proc.stderr) < MAX_LINE, proc.stderr


# ------------------------------------------------------------------ 4. a number past int()'s limit


@pytest.mark.parametrize("cron", [
    "*/" + "7" * LONG + " * * * *",
    "1-" + "5" * LONG + " * * * *",
    "* * * * " + "9" * LONG,
])
def test_a_cron_number_past_ints_limit_is_too_large(tmp_path: Path, cron: str) -> None:
    with pytest.raises(ConfigError) as e:
        MirrorJob("memory://echo-a", "memory://echo-b", cron=cron)
    message = str(e.value)
    assert message == f"{quote_value(cron)} is not a cron expression (a number of {LONG} digits " \
                      "is too large)", message[:500]
    assert "set_int_max_str_digits" not in _config_error(tmp_path, f'[mirror]\ncron = "{cron}"\n')


# ------------------------------------------------------------------ 3. a store URL, redacted and cut


# (url, what must not appear): each refused by open_storage with the URL (and more) in the message
HOSTILE_URLS = [
    # credentials refused; the '@' is past the first SHOWN_CHARS characters: cut before
    # redacting, the part before the cut (key id and secret) would be shown
    (f"s3://{KEY_ID}:{SECRET}@" + "b" * LONG + "/p", (KEY_ID, SECRET)),
    ("s3://bucket/" + "p" * LONG + f"?token={QUERY_SECRET}", (QUERY_SECRET,)),
    ("s3://" + "B" * LONG + "/p", ()),      # the bucket named again
    ("zz" * (LONG // 2) + "://x", ()),      # the scheme named again, and in fsspec's reason
    ("1ab" + "x" * LONG + "://x", ()),      # no scheme, the head named again
    ("a_b" + "x" * LONG + "://x", ()),      # a scheme with '_', named again
    ("file://host/" + "d" * LONG, ()),
]


@pytest.mark.parametrize(("url", "secrets"), HOSTILE_URLS)
def test_open_storage_names_a_long_url_redacted_and_cut(url: str, secrets: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as e:
        open_storage(url)
    message = str(e.value)
    assert len(message) < MAX_LINE, (len(message), message[:500])
    shown = redact_url(url)  # redacted first, then cut: named whole, and bare, if short
    assert message.startswith(f"{name_cut(shown)}: "), message
    assert not LONG_WORD.search(message), message
    for secret in secrets:
        assert secret not in message and secret[:8] not in message, message
    with pytest.raises(ConfigError) as e:  # a short one is named whole and bare, as before
        open_storage("s3://A_B/p")
    assert str(e.value) == "s3://A_B/p: 'A_B' is not a valid S3 bucket name"


@pytest.mark.parametrize(("url", "secrets"), HOSTILE_URLS[:3])
def test_a_long_store_url_in_the_settings_is_named_by_key_cut(
        tmp_path: Path, url: str, secrets: tuple[str, ...]) -> None:
    for message, key in (
            (_config_error(tmp_path, "", env={"CKPTFS_URL": url}), "$CKPTFS_URL (store.url)"),
            (_config_error(tmp_path, "", env={"CKPTFS_MIRROR_URL": url}), "$CKPTFS_MIRROR_URL (mirror.url)"),
            (_config_error(tmp_path, f"[store]\nurl = '''{url}'''\n"), "c.toml: store.url")):
        assert key in message, message[:500]
        assert len(message) < MAX_LINE + len(str(tmp_path)), (len(message), message[:500])
        for secret in secrets:
            assert secret not in message and secret[:8] not in message, message


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_cli_names_a_long_store_url_redacted_and_cut(tmp_path: Path, flags: list[str]) -> None:
    url = f"s3://{KEY_ID}:{SECRET}@" + "b" * LONG + f"/p?token={QUERY_SECRET}"
    for args, env, named in (
            (["runs", url], {}, name_cut(redact_url(url))),
            (["runs"], {"CKPTFS_URL": url}, "$CKPTFS_URL (store.url)")):
        proc = ckptfs(*args, *flags, cwd=tmp_path, env=env)
        assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
        shown = json.loads(proc.stdout)["error"]["message"] if flags else proc.stderr
        assert named in shown, shown[:500]
        assert len(proc.stdout) < MAX_LINE and len(proc.stderr) < MAX_LINE, \
            (proc.stdout[:500], proc.stderr[:500])
        for secret in (KEY_ID, SECRET, QUERY_SECRET):
            assert secret not in proc.stdout + proc.stderr


# ------------------------------------------------------------------ 5. integer settings


def _holds_int(annotation: object) -> bool:
    return annotation is int or any(_holds_int(a) for a in get_args(annotation))


INT_SETTINGS = [(section, name) for section, model in (("store", StoreSettings), ("mirror", MirrorSettings))
                for name, field in model.model_fields.items() if _holds_int(field.annotation)]


@pytest.mark.parametrize(("section", "name"), INT_SETTINGS)
@pytest.mark.parametrize("value", ["1_0", "\uff11\uff10", "1\u0660"])
def test_an_integer_setting_given_as_text_takes_ascii_digits_only(
        tmp_path: Path, section: str, name: str, value: str) -> None:
    message = _config_error(tmp_path, f'[{section}]\n{name} = "{value}"\n')
    assert message == f"{tmp_path / 'c.toml'}: {section}.{name}: must be a whole number in ASCII " \
                      f"digits 0-9 (no '_'), got {quote_value(value)}", message


@pytest.mark.parametrize(("var", "key"), [("CKPTFS_KEEP_LAST", "store.keep_last"),
                                          ("CKPTFS_MIRROR_KEEP_LAST", "mirror.keep_last"),
                                          ("CKPTFS_MIRROR_WORKERS", "mirror.workers")])
def test_an_integer_from_the_environment_takes_no_underscore(tmp_path: Path, var: str, key: str) -> None:
    message = _config_error(tmp_path, "", env={var: "1_0"})
    assert message == f"${var} ({key}): must be a whole number in ASCII digits 0-9 (no '_'), got '1_0'"
    settings = load_settings(tmp_path / "c.toml", env={var: " 10 "})  # plain digits, as before
    section, name = key.split(".")
    assert getattr(getattr(settings, section), name) == 10
    # `workers = 1_0` is a TOML integer (TOML's own syntax allows '_'): the parser reads it, no
    # setting sees the text; and true is no number
    (tmp_path / "c.toml").write_text("[mirror]\nworkers = 1_0\n")
    assert load_settings(tmp_path / "c.toml", env={}).mirror.workers == 10
    assert "not true" in _config_error(tmp_path, "[store]\nkeep_last = true\n")
    # every integer setting is checked above (a new one is found without being listed)
    assert {f"{s}.{n}" for s, n in INT_SETTINGS} == {
        "store.keep_last", "store.artifact_threshold", "mirror.every_n", "mirror.keep_last",
        "mirror.misfire_grace_time", "mirror.workers", "mirror.attempts"}


def test_an_ordinary_url_is_named_whole() -> None:
    """Only names past NAMED_CHARS are cut: a bucket and prefix of everyday length stays whole
    in the message, so the operator can tell which store was meant."""
    url = "s3://Company_Checkpoints/agents/production/papers-run-store-2026"  # 65 characters
    with pytest.raises(ConfigError) as err:
        open_storage(url)
    assert str(err.value).startswith(f"{url}: "), str(err.value)
