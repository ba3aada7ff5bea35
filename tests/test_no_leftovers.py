"""The suite and the examples leave nothing behind in the temporary directory.

tests/test_cli_commands.py made its quiet working directory with mkdtemp at import and never
removed it: one `ckptfs-cli-cwd-*` in /tmp per xdist worker per run (297 of them seen). The
workers example's leftover is checked where it runs (test_workers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_importing_the_cli_helpers_leaves_no_directory(tmp_path: Path) -> None:
    code = "import test_cli_commands as t; assert t.QUIET_CWD.is_dir(); print(t.QUIET_CWD)"
    env = {**os.environ, "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(proc.stdout.strip()).parent == tmp_path  # it was made where TMPDIR says
    assert list(tmp_path.iterdir()) == []
