"""The replication entry points close the storages they open from URLs, and only those.

`restore_points(url, run)` opened the mirror's storage and left it open; `mirror()`,
`restore()` and `MirrorJob` (through `Mirror`) shut down their pool but never closed the two
storages they opened. A Storage the caller passes in is the caller's: it is not closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_mirror import POLICY, RUN, work

import ckptfs.replication.copy as copy_mod
from ckptfs import CheckpointStore
from ckptfs.replication.mirror import mirror
from ckptfs.replication.restore import restore, restore_points
from ckptfs.storage.base import Storage
from ckptfs.storage.registry import open_storage
from tests._forwarding import Forwarding


class _Closing(Forwarding):
    def __init__(self, inner: Storage, closed: list[str]) -> None:
        super().__init__(inner)
        self.closed = closed

    def close(self) -> None:
        self.closed.append(self.url)
        super().close()


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URL of every storage the replication code opened and then closed."""
    seen: list[str] = []

    def spy(url: str, options: Any = None) -> Storage:
        return _Closing(open_storage(url, options), seen)

    monkeypatch.setattr(copy_mod, "open_storage", spy)
    return seen


def test_restore_points_closes_the_storage_it_opens(tmp_path: Path, closed: list[str]) -> None:
    src, mir = str(tmp_path / "src"), str(tmp_path / "mirror")
    work(CheckpointStore(src, policy=POLICY, artifact_threshold=1024), RUN, 4)
    assert mirror(src, mir, latest=True).ok
    closed.clear()
    assert restore_points(mir, RUN)
    assert closed == [mir]
    closed.clear()
    given = _Closing(open_storage(mir), closed)
    assert restore_points(given, RUN)
    assert closed == []  # the caller's storage stays the caller's


def test_mirror_and_restore_close_the_storages_they_open(tmp_path: Path, closed: list[str]) -> None:
    src, mir, dst = str(tmp_path / "src"), str(tmp_path / "mirror"), str(tmp_path / "dst")
    work(CheckpointStore(src, policy=POLICY, artifact_threshold=1024), RUN, 4)
    assert mirror(src, mir, latest=True).ok
    assert sorted(closed) == sorted([src, mir])
    closed.clear()
    assert restore(mir, dst).ok
    assert sorted(closed) == sorted([mir, dst])
    closed.clear()
    given = _Closing(open_storage(src), closed)
    assert mirror(given, str(tmp_path / "mirror2"), latest=True).ok
    assert closed == [str(tmp_path / "mirror2")]
