"""What a LangGraph saver keeps in memory between calls: serialized channel versions (so a put
deltas against memory, not a read) and recently parsed objects (so a warm read skips the zstd
decode and the header's JSON). Both are bounded; neither is trusted for anything a read could
get wrong: the value cache holds what this process wrote or rebuilt and checked, the parsed
cache is keyed by the object's bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ckptfs.integrations.langgraph import codec as fmt

PARSED_ITEMS = 64  # objects kept parsed, by key (`ParsedCache`)
PARSED_MAX_BYTES = 256 * 1024  # an object larger than this is parsed again on each read


@dataclass
class Loaded:
    """One checkpoint object read back: where it lives and its parsed content."""

    key: str
    obj: fmt.Unpacked

    @property
    def header(self) -> dict[str, Any]:
        return self.obj.header


# What an entry costs beyond its value's bytes: its key (a 4-tuple and the checkpoint id's
# string), the item's tuple and the OrderedDict's node; ~230 bytes measured with a 4-byte value.
ENTRY_BYTES = 200


class ValueCache:
    """Bounded LRU of serialized channel versions, so a put compresses against memory, not a read.

    Bounded by `max_bytes` counting each entry's keeping (`ENTRY_BYTES`), not its value's bytes
    alone: small channels (a counter, a flag, a routing key) cost ~10 bytes of value and ~200 of
    keeping, so a thread putting them grew the cache by ~400 bytes a put, unbounded in practice
    (64 MB of such values is 6 million entries, ~1.5 GB). The newest entry always stays."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str, str, str], tuple[str, bytes, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str, str]) -> tuple[str, bytes, int] | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: tuple[str, str, str, str], item: tuple[str, bytes, int]) -> None:
        if len(item[1]) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old[1]) + ENTRY_BYTES
            self._items[key] = item
            self._bytes += len(item[1]) + ENTRY_BYTES
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped[1]) + ENTRY_BYTES

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def forget_thread(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k[0] == thread_id]:
                self._bytes -= len(self._items.pop(key)[1]) + ENTRY_BYTES


class ParsedCache:
    """The last objects read, parsed, by key: a read whose bytes are the very bytes parsed
    before skips the zstd decode and the header's JSON (a third of a warm `get_tuple` of a
    small thread). Keyed by content, not trusted by key: an object replaced meanwhile (a
    checkpoint stored again, another process) has other bytes and is parsed anew."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[bytes, fmt.Unpacked]] = OrderedDict()
        self._lock = threading.Lock()

    def parse(self, key: str, data: bytes, max_decoded: int) -> fmt.Unpacked:
        with self._lock:
            hit = self._items.get(key)
        if hit is not None and hit[0] == data:
            return hit[1]
        obj = fmt.unpack(data, key, max_decoded)
        if len(data) <= PARSED_MAX_BYTES:
            with self._lock:
                self._items[key] = (data, obj)
                self._items.move_to_end(key)
                while len(self._items) > PARSED_ITEMS:
                    self._items.popitem(last=False)
        return obj
