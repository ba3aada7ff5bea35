"""A store URL the backend cannot open from is bad input: exit 2, one clear line, no traceback.

fsspec backends fail in their own ways when a URL alone does not give them what they need:
ftp:// raises TypeError (no host) and leaves a half-built object whose `__del__` raises too,
zip:// opens a file at once and raises IsADirectoryError. Both used to end as exit 3
("unexpected ...") with a raw destructor traceback on stderr.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
