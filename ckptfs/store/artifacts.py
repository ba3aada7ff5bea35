"""Large values, stored once under their sha256 and verified on every read.

Written before anything references them (restic's order: data first, the snapshot that
points at it last), streamed in both directions so a 1 GB artifact never sits in memory,
and deduplicated: storing the same bytes twice costs one existence check.

A deduplicated store *re-references* bytes that may be old and, for the moment, referenced by
no record at all: exactly what `prune` collects once they are older than its grace period. So a
re-reference refreshes the object's modification time when it is older than TOUCH_AFTER (and
trusts its own memory of an object for no longer than that), and an object that vanished in
between is simply written again. With the default 24 h grace, prune then never collects bytes a
writer is about to commit a reference to, except in the instant between prune's last age check
and its delete.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import IO, BinaryIO

from ckptfs.errors import CkptfsError, CorruptFileError, UnreadableFileError
from ckptfs.format.keys import artifact_key
from ckptfs.format.models import ArtifactRef
from ckptfs.storage.base import Storage

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
TOUCH_AFTER = 600.0  # seconds; a prune grace period should exceed twice this
ArtifactSource = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]


def _hash_stream(src: IO[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    while chunk := src.read(_CHUNK):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


class _VerifyingReader(io.RawIOBase):
    """Reads through to the stored object and checks size and sha256 when it reaches the end."""

    def __init__(self, inner: IO[bytes], ref: ArtifactRef) -> None:
        self._inner = inner
        self._ref = ref
        self._hash = hashlib.sha256()
        self._n = 0
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(b))
        if not data:
            self._check()
            return 0
        self._hash.update(data)
        self._n += len(data)
        if self._n > self._ref.size:
            self._check()
        b[: len(data)] = data
        return len(data)

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        if self._n != self._ref.size or self._hash.hexdigest() != self._ref.sha256:
            raise CorruptFileError(self._ref.uri, "artifact content does not match its sha256")

    def close(self) -> None:
        self._inner.close()
        super().close()


def _unreadable(ref: ArtifactRef, exc: PermissionError) -> UnreadableFileError:
    """A backend's PermissionError on one object (S3 AccessDenied) as the domain condition the
    readers skip like a damaged file; local disk raises UnreadableFileError itself."""
    return UnreadableFileError(ref.uri, f"cannot be read: {exc}")


class ArtifactStore:
    """Content-addressed blobs on a Storage; knows nothing about runs."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._known: dict[str, float] = {}  # sha256 -> when we last saw (and touched) it

    def put(
        self, source: ArtifactSource, media_type: str = "application/octet-stream", summary: str = ""
    ) -> ArtifactRef:
        """Store bytes, a file path or a binary file object; return its reference.

        Paths and seekable files are hashed in one streaming pass and uploaded in a second
        (skipped when the content is already stored); other streams are spooled to a local
        temp file first. Memory use stays bounded by the chunk size either way.
        """
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
            sha = hashlib.sha256(data).hexdigest()
            ref = self._ref(sha, len(data), media_type, summary)
            present = self._present(ref)
            if not present:
                self._write(ref, io.BytesIO(data), replace=present is None)
            return ref
        if isinstance(source, str | os.PathLike):
            with open(source, "rb") as f:
                return self._put_seekable(f, media_type, summary)
        if source.seekable():
            return self._put_seekable(source, media_type, summary)
        with tempfile.TemporaryFile() as spool:
            shutil.copyfileobj(source, spool, _CHUNK)
            spool.seek(0)
            return self._put_seekable(spool, media_type, summary)

    def _put_seekable(self, f: IO[bytes], media_type: str, summary: str) -> ArtifactRef:
        start = f.tell()
        sha, n = _hash_stream(f)
        ref = self._ref(sha, n, media_type, summary)
        present = self._present(ref)
        if not present:
            f.seek(start)
            self._write(ref, f, replace=present is None)
        return ref

    def _ref(self, sha: str, size: int, media_type: str, summary: str) -> ArtifactRef:
        return ArtifactRef(uri=artifact_key(sha), sha256=sha, size=size, media_type=media_type,
                           summary=summary)

    def _present(self, ref: ArtifactRef) -> bool | None:
        """True: stored and young enough; False: absent; None: stored but it could not be
        touched (e.g. S3 refuses to copy an archived object onto itself): write it afresh."""
        now = time.time()
        seen = self._known.get(ref.sha256)
        if seen is not None and now - seen < TOUCH_AFTER:
            return True
        try:
            if self.storage.size(ref.uri) != ref.size:
                return False
            self._touch_if_old(ref.uri, now)
        except FileNotFoundError:  # never there, or collected since we last looked
            self._known.pop(ref.sha256, None)
            return False
        except CkptfsError as exc:
            logger.warning("cannot renew the age of %s (%s): writing it again", ref.uri, exc)
            return None
        self._known[ref.sha256] = now
        return True

    def _touch_if_old(self, key: str, now: float) -> None:
        try:
            if now - self.storage.modified(key) > TOUCH_AFTER:
                self.storage.touch(key)
        except NotImplementedError:
            pass  # no ages on this backend: prune refuses to collect artifacts there anyway

    def _write(self, ref: ArtifactRef, src: IO[bytes], replace: bool = False) -> None:
        try:
            self.storage.put_stream(ref.uri, src, exclusive=not replace)
        except FileExistsError:
            # A concurrent writer stored the same content first, or a torn object sits there
            # from a non-atomic backend: check the size and replace it if it is wrong.
            if self.storage.size(ref.uri) != ref.size:
                logger.warning("replacing damaged artifact %s", ref.uri)
                src.seek(0)
                self.storage.put_stream(ref.uri, src, exclusive=False)
        self._known[ref.sha256] = time.time()

    def open(self, ref: ArtifactRef) -> BinaryIO:
        """A stream of the artifact that raises CorruptFileError at the end if it was altered."""
        try:
            inner = self.storage.open_read(ref.uri)
        except PermissionError as exc:
            raise _unreadable(ref, exc) from None
        return io.BufferedReader(_VerifyingReader(inner, ref), _CHUNK)

    def read(self, ref: ArtifactRef) -> bytes:
        """The artifact's bytes, checked against its size and sha256 (CorruptFileError if not)."""
        try:
            data = self.storage.get(ref.uri)
        except PermissionError as exc:
            raise _unreadable(ref, exc) from None
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise CorruptFileError(ref.uri, "artifact content does not match its sha256")
        return data

    def iter_chunks(self, ref: ArtifactRef) -> Iterator[bytes]:
        with self.open(ref) as f:
            while chunk := f.read(_CHUNK):
                yield chunk
