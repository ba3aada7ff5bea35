"""Hostile review of f260dc3 (plain paths that start like a URL): a URL short of one slash
(`s3:/KEY:SECRET@bucket/p`, `s3//KEY:SECRET@bucket/p`) is a local path, and 'nothing is stored
at ...' printed it whole, key id and secret, while the new hint beside it showed the URL it meant
redacted; `versions` named it as a bad run id, whole too. Credentials before a '://' with no
scheme (`KEY:SECRET@bucket://p`) were echoed by the 'no URL scheme' message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs.storage.redact import redact_url

CLI = str(Path(sys.executable).parent / "ckptfs")
KEY_ID = "AKIAMANGLED7KEYID"
SECRET = "Mangled+Secret/With@Slash"
PIECES = [KEY_ID, SECRET, "Mangled+Secret", "With@Slash", "Secret/With"]

MANGLED = [
    f"s3:/{KEY_ID}:{SECRET}@bucket/p",
    f"s3:{KEY_ID}:{SECRET}@bucket/p",
    f"s3//{KEY_ID}:{SECRET}@bucket/p",
    f"S3:/{KEY_ID}:{SECRET}@bucket",
    f"https:/{KEY_ID}:{SECRET}@host/x",
    f"memory:{KEY_ID}:{SECRET}@n",
    f"{KEY_ID}:{SECRET}@bucket://p",
]


@pytest.mark.parametrize(("url", "shown"), [
    (f"s3:/{KEY_ID}:{SECRET}@bucket/p", "s3:/***@bucket/p"),
    (f"s3//{KEY_ID}:{SECRET}@bucket/p", "s3//***@bucket/p"),
    (f"{KEY_ID}:{SECRET}@bucket://p", "***@bucket://p"),
    ("/data/runs@2026/x", "/data/runs@2026/x"),  # a local path with '@' is left alone
    ("c:/Users/me@work/store", "c:/Users/me@work/store"),
    ("runs:2026@x", "runs:2026@x"),
    ("memory:runs", "memory:runs"),
])
def test_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def _run(*args: str, cwd: Path) -> tuple[int, str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(cwd),
                               **({"PYTHONPATH": p} if (p := _pythonpath()) else {})})
    return proc.returncode, proc.stdout + proc.stderr


def _pythonpath() -> str | None:
    import os

    return os.environ.get("PYTHONPATH")


@pytest.mark.parametrize("url", MANGLED)
@pytest.mark.parametrize("command", [["runs"], ["verify"], ["threads"], ["show", "--thread", "t"],
                                     ["versions"], ["-vv", "verify"]])
def test_no_command_prints_the_credentials_of_a_url_short_of_a_slash(tmp_path: Path, url: str,
                                                                      command: list[str]) -> None:
    code, out = _run(*command, url, cwd=tmp_path)
    assert code == 2, out
    assert not [p for p in PIECES if p in out], out
    assert "***@" in out, out
