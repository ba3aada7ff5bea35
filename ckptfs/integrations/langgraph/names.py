"""Reading a hashed thread's name object (`langgraph/names/<sha256>`, see keys.py): bounded.

Every listing of threads (`list(None)`, `ckptfs threads`, verify) reads one per hashed thread,
so a file planted there that is gigabytes long must cost a bounded read, not all of memory.
"""

from __future__ import annotations

from ckptfs.errors import CkptfsError, CorruptFileError
from ckptfs.integrations.langgraph.keys import LG_MAX_NAME_BYTES, lg_name_key, lg_parse_name
from ckptfs.storage.base import Storage


def read_name_body(storage: Storage, key: str) -> bytes:
    """The bytes of a name object, its size looked at first: CorruptFileError when it is over
    LG_MAX_NAME_BYTES (no id the saver takes is that long), FileNotFoundError when absent, the
    storage's own error for a link, a FIFO or a directory there (never followed or opened).
    Two requests on S3 (HEAD, GET), both retried and mapped like any other; only listings read
    names, one per hashed thread."""
    if storage.size(key) > LG_MAX_NAME_BYTES:
        raise CorruptFileError(key, f"over {LG_MAX_NAME_BYTES:,} bytes: no thread id is that long")
    return storage.get(key)


def read_name(storage: Storage, segment: str) -> str | None:
    """The id of the thread whose segment is `segment` (a hash), None when its name object is
    missing, unreadable, too large or not an id hashing to it."""
    try:
        return lg_parse_name(segment, read_name_body(storage, lg_name_key(segment)))
    except (FileNotFoundError, CkptfsError):
        return None
