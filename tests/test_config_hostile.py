"""Hostile config files, through the real `ckptfs` executable: every mistake is one line and
exit 2, and no credential written in a file (or in $CKPTFS_STORAGE_OPTIONS) reaches stdout or
stderr, at any verbosity, with or without --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _privileges import drop_dac

CLI = str(Path(sys.executable).parent / "ckptfs")


def ckptfs(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    full.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=60)


# credentials of other fsspec backends than S3, each under the option name that backend uses
SECRETS = {
    "apikey = 'APIKEY-hostile-1'": "APIKEY-hostile-1",
    "connection_string = 'AccountName=a;AccountKey=CONNSTR-hostile-2=='": "CONNSTR-hostile-2",
    "passphrase = 'PASSPHRASE-hostile-3'": "PASSPHRASE-hostile-3",
    "aws_access_key_id = 'AKIAHOSTILEKEYID0004'": "AKIAHOSTILEKEYID0004",
    "client_kwargs = { headers = { Authorization = 'Bearer BEARER-hostile-5' } }": "BEARER-hostile-5",
    "client_kwargs = { headers = { X-Api-Key = 'XAPIKEY-hostile-6' } }": "XAPIKEY-hostile-6",
    "auth = ['user', 'AUTHPAIR-hostile-7']": "AUTHPAIR-hostile-7",
    "token = { type = 'service_account', private_key_id = 'TOKENTABLE-hostile-8' }": "TOKENTABLE-hostile-8",
}


@pytest.mark.parametrize("line", list(SECRETS))
@pytest.mark.parametrize("flags", [[], ["--json"], ["-vvv"]])
def test_a_credential_in_a_config_file_is_refused_and_never_printed(
        tmp_path: Path, line: str, flags: list[str]) -> None:
    secret = SECRETS[line]
    (tmp_path / "c.toml").write_text(f'[store]\nurl = "memory://c"\n[store.options]\n{line}\n')
    got = ckptfs("config", "show", "--config", "c.toml", *flags, cwd=tmp_path)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "do not belong in a config file" in got.stderr and "store.options." in got.stderr
    if flags == ["--json"]:
        assert json.loads(got.stdout)["error"]["code"] == "config"
    assert secret not in got.stdout + got.stderr


def test_options_that_only_name_a_key_stay_allowed_and_shown(tmp_path: Path) -> None:
    """The KMS key a bucket encrypts with is a name, not a credential (and an SSE-C customer
    key is one)."""
    (tmp_path / "c.toml").write_text(
        '[store]\nurl = "memory://c"\n[store.options.s3_additional_kwargs]\n'
        'ServerSideEncryption = "aws:kms"\nSSEKMSKeyId = "arn:aws:kms:eu-west-1:1:key/k"\n')
    got = ckptfs("config", "show", "--config", "c.toml", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    extra = json.loads(got.stdout)["store"]["options"]["s3_additional_kwargs"]
    assert extra["SSEKMSKeyId"] == "arn:aws:kms:eu-west-1:1:key/k"
    (tmp_path / "c.toml").write_text(
        '[store]\nurl = "memory://c"\n[store.options.s3_additional_kwargs]\n'
        'SSECustomerKey = "SSEC-hostile-9"\n')
    got = ckptfs("config", "show", "--config", "c.toml", cwd=tmp_path)
    assert got.returncode == 2 and "SSEC-hostile-9" not in got.stdout + got.stderr


@pytest.mark.parametrize("line", list(SECRETS))
def test_a_credential_in_the_environment_is_shown_redacted(tmp_path: Path, line: str) -> None:
    import tomllib

    secret = SECRETS[line]
    options = tomllib.loads(line)
    got = ckptfs("config", "show", "--json", cwd=tmp_path,
                 env={"CKPTFS_URL": "memory://c", "CKPTFS_STORAGE_OPTIONS": json.dumps(options)})
    assert got.returncode == 0, got.stderr
    assert secret not in got.stdout + got.stderr
    assert "***" in json.dumps(json.loads(got.stdout)["store"]["options"])
    table = ckptfs("config", "show", cwd=tmp_path,
                   env={"CKPTFS_URL": "memory://c", "CKPTFS_STORAGE_OPTIONS": json.dumps(options),
                        "COLUMNS": "400"})
    assert table.returncode == 0 and secret not in table.stdout + table.stderr


def test_a_config_path_that_is_no_readable_file_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    os.mkfifo(tmp_path / "a-fifo")  # opened, it would block every command forever
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere.toml")
    (tmp_path / "huge.toml").write_bytes(b"#" * (2 << 20))
    unreadable = tmp_path / "unreadable.toml"
    unreadable.write_text('[store]\nurl = "memory://u"\n')
    unreadable.chmod(0)
    cases = {"a-directory": "is a directory", "a-fifo": "is not a regular file",
             "dangling": "is a symbolic link to nothing", "nowhere.toml": "does not exist",
             "huge.toml": "is larger than"}
    for name, why in cases.items():
        for flags in ([], ["--json"]):
            got = ckptfs("config", "show", "--config", name, *flags, cwd=tmp_path)
            assert got.returncode == 2, (name, got.stderr)
            lines = got.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                f"error: config file {name!r} (--config) {why}"), got.stderr
            if flags:
                assert json.loads(got.stdout)["error"]["code"] == "config"
        env_got = ckptfs("runs", cwd=tmp_path, env={"CKPTFS_CONFIG": name})
        assert env_got.returncode == 2 and f"($CKPTFS_CONFIG) {why}" in env_got.stderr
    for argv, via in ((["--config", "unreadable.toml"], "(--config)"), ([], "(the default)")):
        if not argv:
            (tmp_path / "config").mkdir()
            os.rename(unreadable, tmp_path / "config" / "ckptfs.toml")
        got = subprocess.run([CLI, "runs", *argv, "--json"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60, preexec_fn=drop_dac,
                             env={k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")})
        assert got.returncode == 2, got.stderr  # was 3: "unexpected PermissionError"
        assert f"{via} cannot be read: Permission denied" in got.stderr
        assert json.loads(got.stdout)["error"]["code"] == "config"


@pytest.fixture
def small_store(tmp_path: Path) -> str:
    from ckptfs import AgentRun, CheckpointStore, Step

    url = str(tmp_path / "src")
    with CheckpointStore(url) as store:
        run = AgentRun(run_id="r", goal="g")
        run.add_step(Step(id="s", title="s"))
        store.save_run(run)
    return url


@pytest.mark.parametrize(("setting", "named"), [
    ("[mirror]\nmisfire_grace_time = 99999999999999999999999", "mirror.misfire_grace_time"),
    ('[mirror]\ninterval = "99999999999999999w"',
     "mirror.interval: duration '99999999999999999w' is too long"),
    ("[store]\nkeep_last = true", "store.keep_last: must be a whole number, not true"),
    ("[mirror]\nworkers = false", "mirror.workers: must be a whole number, not false"),
    ("[mirror]\nevery_n = true", "mirror.every_n: must be a whole number, not true"),
])
def test_a_schedule_setting_out_of_range_is_refused_before_the_mirror_starts(
        tmp_path: Path, small_store: str, setting: str, named: str) -> None:
    """A misfire grace or interval no datetime can hold passed validation: `mirror` then failed
    every scheduled tick with OverflowError in the log (or exited 3), and keep_last = true meant 1."""
    (tmp_path / "c.toml").write_text(setting + "\n")
    shown = ckptfs("config", "show", "--config", "c.toml", cwd=tmp_path)
    assert shown.returncode == 2 and named in shown.stderr, shown.stderr
    dst = tmp_path / "dst"
    got = ckptfs("mirror", small_store, str(dst), "--config", "c.toml", "--interval", "1s",
                 "--no-progress", cwd=tmp_path)
    assert got.returncode == 2 and named in got.stderr, got.stderr
    assert "Traceback" not in got.stderr and not dst.exists()


def test_an_interval_no_datetime_can_hold_is_a_usage_error(tmp_path: Path, small_store: str) -> None:
    got = ckptfs("mirror", small_store, str(tmp_path / "dst"), "--interval", "99999999999999999999w",
                 "--json", "--no-progress", cwd=tmp_path)
    assert got.returncode == 2, got.stderr  # was 3, "unexpected OverflowError"
    assert "--interval: duration '99999999999999999999w' is too long" in got.stderr
    assert json.loads(got.stdout)["error"]["code"] == "usage"


def test_mirror_job_refuses_what_its_scheduler_cannot_run(tmp_path: Path, small_store: str) -> None:
    from ckptfs.errors import ConfigError
    from ckptfs.replication.job import MirrorJob

    dst = str(tmp_path / "dst")
    for kwargs in ({"interval": float("nan")}, {"interval": 1e300}, {"misfire_grace_time": 10 ** 30},
                   {"misfire_grace_time": 0}):
        with pytest.raises(ConfigError):
            MirrorJob(small_store, dst, **kwargs)  # type: ignore[arg-type]
