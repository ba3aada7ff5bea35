"""A store URL the backend cannot open from is bad input: exit 2, one clear line, no traceback.

fsspec backends fail in their own ways when a URL alone does not give them what they need:
ftp:// raises TypeError (no host) and leaves a half-built object whose `__del__` raises too,
zip:// opens a file at once and raises IsADirectoryError. Both used to end as exit 3
("unexpected ...") with a raw destructor traceback on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_commands import _agent_store

CLI = str(Path(sys.executable).parent / "ckptfs")


@pytest.mark.parametrize(("url", "says"), [
    ("ftp://x/y", "ftp:// cannot be opened from this URL"),
    ("zip://x", "cannot open zip://"),
])
@pytest.mark.parametrize("command", [["runs"], ["verify"], ["mirror", "{local}", "--once", "--no-progress"]])
def test_an_unopenable_url_is_exit_2_with_one_clear_line(tmp_path: Path, url: str, says: str,
                                                         command: list[str]) -> None:
    argv = [command[0], url, *(a.replace("{local}", str(tmp_path / "dst")) for a in command[1:])]
    proc = subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    assert says in proc.stderr, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert "unexpected" not in proc.stderr, proc.stderr


# A URL the registry cannot serve, with what the one line must say: the scheme it names is a
# wrapper of another file system, unknown, or given no bucket, name or path it needs.
_REFUSED = [
    ("dir:///tmp/store", "dir:// wraps another file system"),  # was exit 3, AttributeError
    ("dir://", "dir:// wraps another file system"),
    ("generic://", "generic:// wraps another file system"),  # was exit 3, RecursionError
    ("simplecache:///tmp/store", "simplecache:// wraps another file system"),  # was "unknown scheme"
    ("simplecache::file:///tmp/store", "chained URLs"),
    ("://store", "no URL scheme"),  # was a local directory named '://store' under the cwd
    ("1abc://store", "no URL scheme"),
    ("foo://bar", "unknown storage scheme 'foo'"),
    ("s3://", "is not a valid S3 bucket name"),
    ("s3:///prefix", "is not a valid S3 bucket name"),
    ("memory://", "memory:// needs a name"),
    ("file://relative", "file:// URLs take no host"),
]


def _run_cli(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    return subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)


@pytest.mark.parametrize(("url", "says"), _REFUSED)
@pytest.mark.parametrize("command", [["runs"], ["show", "{url}", "papers"], ["verify"]])
def test_a_url_the_registry_cannot_serve_is_exit_2_naming_the_problem(tmp_path: Path, url: str, says: str,
                                                                       command: list[str]) -> None:
    """`ckptfs runs dir:///tmp/store` was exit 3, "unexpected AttributeError" (fsspec's
    DirFileSystem built with no file system under it); generic:// recursed until RecursionError;
    simplecache:// was "unknown storage scheme" though fsspec knows it. Each is a URL no store
    can be opened from: exit 2, code config, one line naming the URL and why."""
    argv = [a.replace("{url}", url) for a in command] if "{url}" in command else [*command, url]
    proc = _run_cli(tmp_path, [*argv, "--json"])
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] == "config", (argv, doc)
    assert says in doc["error"]["message"] and url in doc["error"]["message"], (argv, doc)
    assert says in proc.stderr and "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, \
        proc.stderr[-500:]


@pytest.mark.parametrize(("url", "meant"), [("memory:", "memory://NAME"), ("memory:runs", "memory://runs"),
                                             ("s3:bucket/prefix", "s3://bucket/prefix")])
@pytest.mark.parametrize("command", [["runs"], ["show", "{url}", "papers"], ["verify"]])
def test_a_scheme_without_its_slashes_is_named_as_a_local_path(tmp_path: Path, url: str, meant: str,
                                                               command: list[str]) -> None:
    """`memory:runs` has no `//`: it is a local directory of that name, as any path is. Nothing
    being stored there said only "wrong URL or prefix?"; the line says what was meant."""
    argv = [a.replace("{url}", url) for a in command] if "{url}" in command else [*command, url]
    proc = _run_cli(tmp_path, [*argv, "--json"])
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] == "empty", (argv, doc)
    message = doc["error"]["message"]
    assert f"{url} is a local path (no '//'); the URL would be {meant}" in message and "***" not in message, \
        (argv, doc)
    assert "Traceback" not in proc.stderr, proc.stderr[-500:]


def test_the_supported_forms_still_open(tmp_path: Path) -> None:
    """The same store by a plain path, file:///path and local:///path is listed, shown and
    verified; memory://name is served (an empty store: nothing is stored, not a refused URL)."""
    root = tmp_path / "store"
    _agent_store(root)
    for url in (str(root), f"file://{root}", f"local://{root}"):
        for argv in (["runs", url], ["show", url, "papers"], ["verify", url]):
            proc = _run_cli(tmp_path, [*argv, "--json"])
            assert proc.returncode == 0, (argv, proc.returncode, proc.stderr[-500:])
            assert json.loads(proc.stdout), argv
    proc = _run_cli(tmp_path, ["runs", "memory://runs", "--json"])
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "empty", proc.stdout
