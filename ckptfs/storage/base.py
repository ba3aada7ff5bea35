"""The storage contract: six operations, capabilities as data, and key hygiene.


Six operations carry the whole contract (numpydoc on `Storage`): `put` (atomic replace),
`put_if_absent` (exclusive create), `put_if_match` (compare-and-swap), `get`, `list`,
`delete`, plus streaming for large artifacts. Each backend states what it guarantees as a
frozen `Capabilities` value; callers read flags, never protocol strings.

- local disk: temp file in the same directory (O_EXCL), fsync, then `renameat2(NOREPLACE)`
  (or `link`) for exclusive create / `replace` for overwrite, then fsync the directory.
  fsspec's local backend never fsyncs and stages transactions in /tmp, so it is not used.
- S3 (s3fs): there is no rename, so one PUT to the final key is the commit;
  `If-None-Match: *` makes it exclusive and `If-Match` makes it a compare-and-swap.
  The listings cache is off: a cached listing would hide new versions.
- memory: fsspec's in-process store, shared within the process as fsspec users expect.
- anything else fsspec knows: a documented fallback whose weaker guarantee is logged once.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, ClassVar, TypeVar

from ckptfs.errors import name_cut
from ckptfs.format.keys import TEMP_MARKER as TEMP_MARKER
from ckptfs.storage.redact import redact_options, redact_url

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

COPY_CHUNK = 1024 * 1024
Keys = list[str]  # spelled once here: inside classes, `list` is the method


class PreconditionFailed(Exception):
    """`put_if_match` found a different version of the object than the one expected."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend promises; callers branch on these, never on the URL scheme."""

    atomic_put: bool  # a reader sees the old object or the new one, never a part
    exclusive_create: bool  # put_if_absent cannot let two writers both succeed
    conditional_put: bool  # put_if_match is a true compare-and-swap
    durable: bool  # acknowledged writes survive a crash of this process and of the machine
    shared: bool  # other processes see the same objects
    remote: bool = False  # each call is a network round trip: worth overlapping independent calls


def check_key(key: str) -> str:
    """Keys are relative, '/'-separated and never climb out of the store root."""
    if not key or key[0] == "/" or "\\" in key or "\x00" in key:
        raise ValueError(f"invalid storage key {key!r}")
    # an empty, "." or ".." segment, found without splitting: every storage call checks its key
    framed = f"/{key}/"
    if "//" in framed or "/./" in framed or "/../" in framed:
        raise ValueError(f"invalid storage key {key!r}")
    return key


class Storage(ABC):
    """A flat key space of immutable-by-convention objects under one root URL.

    Contract for every backend
    --------------------------
    put(key, data)
        Replace the object atomically (see ``capabilities.atomic_put``); durable on return.
    put_if_absent(key, data)
        Create the object only if no object has that key. Raises ``FileExistsError`` when one
        does; on backends with ``exclusive_create`` two concurrent callers cannot both win.
    put_if_match(key, data, etag)
        Replace the object only if its current etag is ``etag``; raises ``PreconditionFailed``
        otherwise and ``FileNotFoundError`` if it is gone. Returns the new etag.
    put_if_absent_beside(key, data, witness)
        ``put_if_absent``, then whether ``witness`` exists (a commit and its base check). Built
        from the two by default; a backend may do both at once (local disk: one directory fd).
    get(key) / get_with_etag(key)
        The whole object; ``FileNotFoundError`` if absent.
    list(prefix, start_after=None)
        Sorted keys under ``prefix`` (recursive), fresh (no cached listing).
    delete(key)
        Remove the object; absent is not an error.

    Any failure to reach the backend at all (bad URL, missing bucket, refused credentials,
    connection refused) raises ``StorageUnavailableError`` naming the redacted URL.

    Names that are not objects (file-system backends)
    --------------------------------------------------
    Objects are regular files inside the root; links below the root are never followed, for
    a read, a write or a delete (the root itself may be a link). On local disk:

    list / list_dirs
        ``list`` reports every entry that is not a directory, links (even dangling) and special
        files (FIFOs, sockets, devices) included, so ``verify`` can name them; it never descends
        into a link. A reported name that is not a regular file is *not ours*: reading it
        raises ``UnreadableFileError``. ``list_dirs`` reports real directories only, so a link
        under ``runs/`` is no run (verify reports it as a stray key).
    get / get_with_etag / open_read / size / exists
        Only a regular file is read (opened without following a link, without blocking on a
        FIFO, at most the size it had when opened); anything else, a key reached through a
        link, or a file the system will not let us read (permission) raises
        ``UnreadableFileError`` naming the key. It is a ``CorruptFileError``: loads, summaries,
        verify and prune already skip such a file with a warning and fall back. A directory
        at the key is absent (``FileNotFoundError``).
    modified
        The entry's own time (lstat), whatever it is, so retention can age out what it skips.
    put / put_if_absent / put_if_match / put_stream / touch
        Temp file, rename and fsync relative to the directory's fd: a link at the key is
        replaced (put) or counts as present (put_if_absent), never written through. A key whose
        directory is a link, or a store this user cannot write (read-only directory or
        filesystem), raises ``StoreNotWritableError`` (a ``StorageUnavailableError`` and a
        ``PermissionError``) naming the store and the key. Reading such a store still works.
    delete
        Unlinks the entry itself (a link, never its target). A key reached through a link, or
        a directory at the key, is left alone (logged): absent is not an error.
    """

    capabilities: ClassVar[Capabilities]

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.display_url = redact_url(url)
        self.options = dict(options or {})

    @property
    def display_name(self) -> str:
        """The store as a message or a title names it: `display_url` cut past NAMED_CHARS
        (`name_cut`); a 5,000-character prefix, repeated by every message, made each that long.

        `display_url` itself stays whole: it is the store's name where one is kept or compared
        (`describe()`, a report's and a --json document's "url", which a script matches against
        the URL it gave), and a cut one is no name of the store. Derived, not stored, so a
        wrapper that takes its inner storage's `display_url` names the store the same way."""
        return name_cut(self.display_url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display_url!r})"

    def describe(self) -> dict[str, Any]:
        """What this storage is, safe to print: redacted URL and options, capabilities."""
        return {
            "url": self.display_url,
            "backend": type(self).__name__,
            "options": redact_options(self.options),
            "capabilities": self.capabilities.__dict__,
        }

    @abstractmethod
    def put(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str) -> str: ...

    @abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str]: ...

    def get(self, key: str) -> bytes:
        return self.get_with_etag(key)[0]

    @abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]: ...

    @abstractmethod
    def list_dirs(self, prefix: str) -> Keys:
        """Names of the immediate 'directories' under prefix (no trailing slash)."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        """Write a stream of any size without holding it in memory; same atomicity as put."""

    @abstractmethod
    def open_read(self, key: str) -> IO[bytes]: ...

    def read_through(self, key: str, read: Callable[[IO[bytes]], _T]) -> _T:
        """Open `key` and give the stream to `read`, which reads it to its end.

        The unit a retrying storage retries whole (`RetryingStorage.read_through`): a body cut
        short mid-stream fails in `read`, after `open_read` has returned, where retrying the
        open alone cannot help. So `read` must start afresh each time it is called.
        """
        with self.open_read(key) as f:
            return read(f)

    def modified(self, key: str) -> float:
        """Last modification time (POSIX seconds); prune's artifact grace period needs it.

        Raises ``FileNotFoundError`` if absent, ``NotImplementedError`` where unknown.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot tell modification times")

    def modified_and_now(self, key: str) -> tuple[float, float | None]:
        """`modified(key)` and the store's own clock read in the same answer (POSIX seconds), or
        None for the second where the store does not tell it.

        Retention judges a fence's age on the store's clock, which may differ from this
        machine's (store/retention.py `fence_floor`); a backend that hears its server's time
        with the object's (S3: the reply's Date header) says it at no extra request. None by
        default, not this machine's clock: a local disk's times may be an NFS server's, and a
        wrapper that forgot to pass this on must not vouch for the clock of the store beneath
        it. Raises as `modified` does.
        """
        return self.modified(key), None

    def touch(self, key: str) -> None:
        """Set an object's modification time to now (a re-referenced artifact must look young to
        prune). ``FileNotFoundError`` if absent, ``NotImplementedError`` where unsupported."""
        raise NotImplementedError(f"{type(self).__name__} cannot touch objects")

    def delete_many(self, keys: Sequence[str]) -> None:
        """Remove several objects in this order; backends that can batch it do (LogStorage:
        one fdatasync per group)."""
        for key in keys:
            self.delete(key)

    def put_if_absent_beside(self, key: str, data: bytes, witness: str) -> bool:
        """`put_if_absent`, then whether `witness` exists: a commit and the check, after it,
        that the version it builds on was not pruned meanwhile (store/retention.py). One call
        so a backend may do both together: local disk stats a witness in the key's directory
        through the directory fd the create already holds, where `exists` walks to it again
        from the root (two of those were a tenth of a local commit's own cost)."""
        self.put_if_absent(key, data)
        return self.exists(witness)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True

    def check(self) -> None:
        """Reach the backend once; raise StorageUnavailableError with a clear reason if not."""
        self.list_dirs("")

    def check_writable(self) -> None:
        """Raise StoreNotWritableError when this store visibly cannot take a write at all, before
        a command that must write (mirror, restore) starts: it then says so in one line, exit 2,
        instead of a line per file. Only what is known without writing is checked, and nothing
        here by default: on S3 a write's answer is the test (a policy may allow some prefixes
        and not others, which no probe of one key tells)."""

    def local_root(self) -> str | None:
        """The directory on this machine that holds the store (links resolved), None when it lives
        elsewhere (S3, memory). Lets a command that writes a user's file refuse one inside the
        store, and a saver know two handles share a store."""
        return None

    def location(self) -> tuple[str, str] | None:
        """Where a store elsewhere keeps its objects: (a namespace, its '/'-separated path in
        it), or None when not known. Two stores share objects when their namespaces are equal
        and one path is the other or lies below it at a '/' (s3://b/p2 is not below s3://b/p):
        a mirror or restore must not copy a store into itself. A directory on this machine
        answers with `local_root`, where links and mounts give one place many spellings."""
        return None

    def single_attempt(self) -> Storage:
        """This storage, or a twin of it whose client sends each request once.

        For a caller that retries on its own (RetryingStorage): retries beneath it multiply its
        attempts instead of adding to them, and wait with a backoff its logs do not show. A
        backend whose client does not retry (local disk, memory) is its own twin.
        """
        return self

    def close(self) -> None:
        """Release cached handles; the storage stays usable."""


