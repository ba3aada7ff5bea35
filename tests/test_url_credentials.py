"""Credentials written into a store URL never reach the terminal, whatever characters they hold.

AWS secret keys often hold '/' and '+'. `urlsplit` ends the host part at the first '/', so
`s3://KEY:SEC/RET@bucket` used to pass redaction untouched, and the S3 opener then named
"KEY:SEC" as an invalid bucket: a hostile review saw the key id and half the secret printed.
Now such a URL is refused as a store URL (s3fs would ignore the credentials anyway), with the
URL shown as `s3://***@bucket/...`, by every command, at every verbosity.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.errors import ConfigError
from ckptfs.storage.redact import redact_url
from ckptfs.storage.registry import open_storage

CLI = str(Path(sys.executable).parent / "ckptfs")
KEY_ID = "AKIAURLCREDS7KEYID"
SECRET = "Url+Secret/With/Slashes@and+at"


@pytest.mark.parametrize(("url", "shown"), [
    (f"s3://{KEY_ID}:{SECRET}@bucket/p", "s3://***@bucket/p"),
    ("s3://KEY:p@ss@bucket/p", "s3://***@bucket/p"),
    ("s3://KEY@bucket/x", "s3://***@bucket/x"),
    ("s3://bucket/path@x", "s3://bucket/path@x"),  # an '@' in a key of the store is not a secret
    ("s3://bucket/runs:2026@x", "s3://bucket/runs:2026@x"),
    ("s3://bucket/p?X-Amz-Signature=abc", "s3://bucket/p?***"),
    ("ftp://user:pw/x@host/p", "ftp://***@host/p"),
    ("s3://", "s3://"),  # not mangled into "s3:"
    ("s3:///x", "s3:///x"),
    ("/plain/local/path", "/plain/local/path"),
])
def test_redacted_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_opening_an_s3_url_with_credentials_is_refused_without_echoing_them() -> None:
    with pytest.raises(ConfigError) as err:
        open_storage(f"s3://{KEY_ID}:{SECRET}@bucket/p")
    msg = str(err.value)
    assert "credentials do not belong in a store URL" in msg and "s3://***@bucket/p" in msg
    assert not _leaked(msg)


def _leaked(text: str) -> list[str]:
    pieces = [KEY_ID, SECRET, *(p for part in SECRET.split("/") for p in part.split("@") if len(p) >= 3)]
    return [p for p in pieces if p in text]


@pytest.mark.parametrize("level", ["", "-v", "-vv", "-vvv"])
def test_no_command_prints_credentials_from_a_url(tmp_path: Path, level: str) -> None:
    bad = f"s3://{KEY_ID}:{SECRET}@bucket/store"
    local = str(tmp_path / "local")
    with CheckpointStore(local) as store:  # a real source for mirror
        run = AgentRun(run_id="r1", goal="g")
        run.add_step(Step(id="s1", title="t"))
        store.save_run(run)
    commands = [
        ["runs", bad], ["verify", bad], ["show", bad, "r1"], ["versions", bad, "r1"],
        ["mirror", local, bad, "--once", "--no-progress"], ["restore", bad, local, "--no-progress"],
        ["runs", bad, "-o", f"key={KEY_ID}", "-o", f"secret={SECRET}"],
    ]
    for argv in commands:
        proc = subprocess.run([CLI, *([level] if level else []), *argv], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, (argv, proc.returncode, out[-400:])
        assert not _leaked(out), (argv, _leaked(out), out[-400:])
        assert "s3://***@bucket/store" in out, (argv, out[-400:])


@pytest.mark.parametrize("url", ["s3://:SECRETPART@bucket/p", "s3://bucket/p?secret=SECRETPART",
                                 "s3://SECRETPART@bucket/p", "gs://SECRETPART@b/p",
                                 "https://SECRETPART@host/x", "s3://AKIA:SECRET'PART@b/p",
                                 "s3://AKIA:SECRET PART@b/p", 's3://AKIA:SECRET"PART@b/p',
                                 "s3://AKIA:SECRET<PART>@b/p"])
@pytest.mark.parametrize("level", ["", "-vvv", "--json"])
def test_a_url_in_a_usage_error_is_redacted_too(tmp_path: Path, url: str, level: str) -> None:
    """argparse echoes a bad argument ("invalid choice: 's3://...'"), and --json echoed the
    command word: an empty user (":secret@"), a bare user (a token) or a query string passed
    the CLI's scrubber, which now shows every URL in a line as redact_url does."""
    for argv in (["config", url], [url], ["runs", url]):
        proc = subprocess.run([CLI, *([level] if level else []), *argv], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        assert proc.returncode == 2, (argv, proc.returncode)
        shown = proc.stdout + proc.stderr
        assert "SECRETPART" not in shown and "PART" not in shown, (argv, proc.stdout, proc.stderr)
