"""Hostile review of f260dc3: a read of `memory:runs` or `s3:/b/p` (a plain path short of its
`//`) says which URL it would be, but `mirror SRC s3:/bucket/backups` copied every run into a
new local directory `s3:` and printed 'mirrored', exit 0 (restore and import-langgraph alike):
the user believes the runs are on S3. A new such path is refused (exit 2) naming the URL; one
that exists, or `./s3:/...`, is a local directory as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, Step

CLI = str(Path(sys.executable).parent / "ckptfs")


def _run(*args: str, cwd: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    extra = ["--no-progress"] if args[0] in ("mirror", "restore") else []
    proc = subprocess.run([CLI, *args, *extra], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={**env, "COLUMNS": "200"})
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    s = CheckpointStore(str(root))
    run = AgentRun(run_id="papers", goal="g")
    run.add_step(Step(id="a", title="a"))
    s.save_run(run)
    s.close()
    return root


@pytest.mark.parametrize(("dst", "meant"), [("s3:/mybucket/backups", "s3://mybucket/backups"),
                                            ("memory:scratch", "memory://scratch"),
                                            ("file:/srv/mirror", "file:///srv/mirror")])
@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_new_local_path_short_of_its_slashes_is_refused(tmp_path: Path, store: Path, dst: str,
                                                          meant: str, command: str) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    src = str(store)
    if command == "restore":  # a mirror to restore from
        code, out = _run("mirror", src, str(tmp_path / "mirror"), cwd=work)
        assert code == 0, out
        src = str(tmp_path / "mirror")
    code, out = _run(command, src, dst, cwd=work)
    assert code == 2, out
    assert meant in out and "local path" in out, out
    assert list(work.iterdir()) == [], "nothing may be created"


def test_an_existing_directory_or_a_dot_path_is_still_a_local_destination(tmp_path: Path,
                                                                          store: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    code, out = _run("mirror", str(store), "./s3:/b/p", cwd=work)
    assert code == 0 and "mirrored" in out, out
    code, out = _run("mirror", str(store), "s3:/b/p", cwd=work)  # exists now: the user's own
    assert code == 0, out
    code, out = _run("versions", "s3:/b/p", "papers", cwd=work)
    assert code == 0, out
