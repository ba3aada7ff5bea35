"""Settings: the shipped files load, env overrides files, each mistake is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.s3.embedded import EmbeddedS3, free_port
from ckptfs.cli import main as cli_main
from ckptfs.config import ENV_VARS, load_settings
from ckptfs.errors import ConfigError, StorageUnavailableError
from ckptfs.format.units import parse_duration

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["ckptfs", "local", "s3", "embedded-s3", "mirror"])
def test_shipped_config_files_load(name: str) -> None:
    s = load_settings(ROOT / "config" / f"{name}.toml", env={})
    assert s.store.url and s.mirror.every_n >= 1
    if name != "ckptfs":
        assert s.mirror.url


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[store]\nurl = "/a"\n[mirror]\nurl = "/m"\nevery_n = 3\n')
    env = {"CKPTFS_URL": "/b", "CKPTFS_MIRROR_EVERY_N": "7", "CKPTFS_MIRROR_LATEST": "true",
           "CKPTFS_MIRROR_STORAGE_OPTIONS": '{"secret": "s3cr3t"}'}
    s = load_settings(f, env=env)
    assert (s.store.url, s.mirror.url, s.mirror.every_n, s.mirror.latest) == ("/b", "/m", 7, True)
    assert s.mirror.options == {"secret": "s3cr3t"}  # env may carry secrets; files may not
    assert "s3cr3t" not in json.dumps(s.redacted())
    env2 = {"CKPTFS_CONFIG": str(f)}
    assert load_settings(env=env2).store.url == "/a"


@pytest.mark.parametrize(("text", "env", "expected"), [
    ('[mirror]\nevery_nn = 3\n', {}, r"mirror\.every_nn: unknown setting"),
    ('[store]\nurl = "/a"\nkeep_lats = 2\n', {}, r"store\.keep_lats: unknown setting"),
    ('[mirror]\nevery_n = 0\n', {}, r"mirror\.every_n: Input should be greater than or equal to 1"),
    ('[mirror]\nevery_n = "many"\n', {}, r"mirror\.every_n: Input should be a valid integer"),
    ('[mirror]\ninterval = "5 parsecs"\n', {}, r"mirror\.interval: '5 parsecs' is not a duration"),
    ('[mirror]\ncron = "every tuesday"\n', {}, r"mirror\.cron: 'every tuesday' is not a cron"),
    ('[mirror]\ninterval = "5m"\ncron = "* * * * *"\n', {}, r"interval or cron, not both"),
    ('[store]\nurl = "s3://Bad_Bucket/x"\n', {}, r"store\.url: .*not a valid S3 bucket name"),
    ('[store]\nurl = "nosuchscheme://x/y"\n', {}, r"store\.url: .*unknown storage scheme"),
    ('[mirror]\nurl = "file://host/x"\n', {}, r"mirror\.url: .*file:// URLs take no host"),
    ('[store.options]\nsecret = "abc"\n', {}, r"store\.options\.secret: credentials do not belong"),
    ('[mirror.options]\nclient_kwargs = { aws_session_token = "t" }\n', {},
     r"mirror\.options\.client_kwargs\.aws_session_token: credentials"),
    ("[store\nurl=", {}, r"not valid TOML"),
    ("", {"CKPTFS_MIRROR_EVERY_N": "-2"}, r"\$CKPTFS_MIRROR_EVERY_N \(mirror\.every_n\)"),
    ("", {"CKPTFS_MIRROR_URL": "s3://x/"}, r"\$CKPTFS_MIRROR_URL \(mirror\.url\)"),
    ("", {"CKPTFS_STORAGE_OPTIONS": "{nope"}, r"\$CKPTFS_STORAGE_OPTIONS: not valid JSON"),
    ("", {"CKPTFS_MIRROR_STORAGE_OPTIONS": "[1]"}, r"must be a JSON object"),
])
def test_each_mistake_is_one_clear_error_naming_the_key(
        tmp_path: Path, text: str, env: dict[str, str], expected: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=expected) as err:
        load_settings(f, env=env)
    assert "abc" not in str(err.value)  # never the secret value itself


def test_missing_config_file_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_settings(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match=r"\$CKPTFS_CONFIG"):
        load_settings(env={"CKPTFS_CONFIG": str(tmp_path / "nope.toml")})


def test_durations() -> None:
    assert [parse_duration(x) for x in ("90", "30s", "5m", "1h30m", "1d", 2)] == [
        90, 30, 300, 5400, 86400, 2]
    for bad in ("", "m", "5x", "-3s", "0"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_unreachable_endpoint_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    port = free_port()  # nothing listens there
    f.write_text(f'[store]\nurl = "{tmp_path / "s"}"\n[mirror]\nurl = "s3://ckptfs-x/m"\n'
                 f'[mirror.options]\nclient_kwargs = {{ endpoint_url = "http://127.0.0.1:{port}" }}\n')
    s = load_settings(f, env={})
    with pytest.raises(StorageUnavailableError, match=r"mirror\.url: unreachable: s3://ckptfs-x/m"):
        s.check(timeout=1)


def test_missing_bucket_is_one_clear_error(tmp_path: Path, s3: EmbeddedS3) -> None:
    f = tmp_path / "c.toml"
    f.write_text(f'[mirror]\nurl = "s3://no-such-bucket-here/m"\n[mirror.options]\n'
                 f'client_kwargs = {{ endpoint_url = "{s3.endpoint}" }}\n')
    with pytest.raises(StorageUnavailableError,
                       match=r"mirror\.url: unreachable: .*(does not exist|NoSuchBucket)"):
        load_settings(f, env={}).check(timeout=2)


def test_config_show_redacts_and_exits_2_on_bad_settings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [*ENV_VARS, "CKPTFS_CONFIG"]:
        monkeypatch.delenv(var, raising=False)
    f = tmp_path / "c.toml"
    # credentials in a store URL are refused, and the refusal does not echo them
    f.write_text('[store]\nurl = "s3://user:pw/x+y@my-bucket/x"\n')
    assert cli_main(["config", "show", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "credentials do not belong in a store URL" in err and "pw" not in err and "user" not in err
    f.write_text('[store]\nurl = "s3://my-bucket/x"\n[mirror]\nurl = "/m"\nevery_n = 4\n')
    monkeypatch.setenv("CKPTFS_MIRROR_STORAGE_OPTIONS", '{"password": "hunter2", "anon": false}')
    assert cli_main(["config", "show", "--config", str(f), "--json",
                     "-o", "token=tok-123", "-o", "client_kwargs.region_name=eu-west-1"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["mirror"]["every_n"] == 4 and doc["mirror"]["options"]["password"] == "***"
    assert doc["store"]["options"]["token"] == "***"
    assert doc["store"]["options"]["client_kwargs"]["region_name"] == "eu-west-1"
    assert "hunter2" not in out and "tok-123" not in out and "pw@" not in out
    assert cli_main(["config", "show", "--config", str(f)]) == 0
    assert "hunter2" not in capsys.readouterr().out
    f.write_text('[mirror]\nevry_n = 4\n')
    assert cli_main(["config", "show", "--config", str(f)]) == 2
    assert "mirror.evry_n: unknown setting" in capsys.readouterr().err.replace("\n", "")
