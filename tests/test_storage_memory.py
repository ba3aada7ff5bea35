from __future__ import annotations

import pytest

from ckptfs.storage.base import Storage
from ckptfs.storage.memory import MemoryStorage
from ckptfs.storage.registry import open_storage
from tests.storage_conformance import StorageConformance


@pytest.fixture
def storage(memory_url: str) -> Storage:
    return open_storage(memory_url)


class TestMemory(StorageConformance):
    def test_shared_within_process_by_url(self, memory_url: str) -> None:
        a, b = open_storage(memory_url), open_storage(memory_url)
        assert isinstance(a, MemoryStorage)
        a.put("k", b"v")
        assert b.get("k") == b"v"

    def test_memory_url_needs_a_name(self) -> None:
        from ckptfs.errors import ConfigError

        with pytest.raises(ConfigError, match="needs a name"):
            open_storage("memory://")
