"""Every code block of the README runs as written.

The ```python blocks and the ```sh blocks are taken from README.md in order and run one after
another in one empty working directory, as a reader would paste them: each python block in a
fresh interpreter, each sh block with `bash -e` and the venv's `ckptfs` on PATH. Paths in the
examples are relative (`.ckpt`), so nothing outside that directory is touched. The S3 examples
(`s3://bucket/...`) run against the embedded moto server: the test only sets what any reader
would set for another endpoint, AWS_ENDPOINT_URL_S3 and credentials, and creates the bucket.

Untagged blocks are layouts and command synopses; a literal `ckptfs` command in one (no
placeholder such as URL, RUN or [options]) fails the test, so a runnable example cannot hide
where it is not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends.s3.embedded import FAKE_CREDENTIALS, EmbeddedS3

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PLACEHOLDER = re.compile(r"\[|\bURL\b|\bRUN\b|\bSRC\b|\bDST\b|\bRUN_ID\b|--interval|--cron|\bID\b")


def blocks() -> list[tuple[str, str, int]]:
    """(language, code, line) of every fenced block, in order."""
    text = README.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def test_untagged_blocks_hold_no_runnable_command() -> None:
    for lang, code, line in blocks():
        if lang:
            continue
        for cmd in code.splitlines():
            if cmd.startswith("ckptfs "):
                assert PLACEHOLDER.search(cmd), (f"README line {line}: {cmd!r} looks runnable: put it in "
                                                 "a ```sh block (this test runs those)")


def test_every_python_and_sh_block_runs_as_written(s3: EmbeddedS3, tmp_path: Path) -> None:
    s3.create_bucket("bucket")
    s3.create_bucket("my-bucket")
    work = tmp_path / "reader"
    work.mkdir()
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTFS_", "AWS_"))}
    env.update(FAKE_CREDENTIALS)
    env.update(AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_DEFAULT_REGION=s3.region, COLUMNS="120",
               PATH=bin_dir + os.pathsep + env.get("PATH", ""))
    ran = {"python": 0, "sh": 0}
    for lang, code, line in blocks():
        if lang not in ran:
            assert lang in ("",), f"README line {line}: a ```{lang} block: tag it python or sh, or not at all"
            continue
        if lang == "python":
            argv = [sys.executable, "-c", code]
        else:
            argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            pytest.fail(f"README block at line {line} ({lang}) exited {proc.returncode}:\n{code}\n"
                        f"--- stdout\n{proc.stdout[-1500:]}\n--- stderr\n{proc.stderr[-1500:]}")
        ran[lang] += 1
    assert ran == {"python": 5, "sh": 2}, ran
    # what the blocks left is what the README says: the restore of the mirror loads
    from ckptfs import CheckpointStore

    restored = CheckpointStore(str(work / "agent-new")).load_run("papers")
    assert restored is not None and restored.steps["paper-000"].result == "3 findings, 12 citations"
