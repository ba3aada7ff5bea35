"""The CLI reviews' store: a copy per test of the agent store `test_cli_commands` writes (run
`papers` v1..v17, snapshots at 3, 6, 9, 12, 15; run `finished` v1..v2), built once a module,
and the two ways those tests damage it. A module takes the fixtures by binding their names
(an import of them would read as unused and shadowed to the linter):

    pristine, store = _cli_store.pristine, _cli_store.store
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_cli_commands import _agent_store

RUN = "papers"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store as written, once a module: never damaged (a test damages its `store`)."""
    root = tmp_path_factory.mktemp("cli-store") / "store"
    _agent_store(root)  # papers: v1..v17, snapshots at 3, 6, 9, 12, 15; finished: v1..v2
    return root


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    """This test's own copy of the pristine store, to damage at will."""
    root = tmp_path / "store"
    shutil.copytree(pristine, root, symlinks=True)
    return root


def flip(path: Path) -> None:
    """One bit of the file's middle byte flipped: its hash no longer matches."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def log_file(root: Path, version: int) -> Path:
    """Run `papers`' log record of `version`."""
    return root / "runs" / RUN / "log" / f"{version:012d}.ckpt"
