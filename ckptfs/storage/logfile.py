"""One append-only local file of checksummed records: durable appends at one fdatasync each.

Why it exists: on local disk a `Storage.put` costs a temp file, an fsync, a rename and an fsync
of the directory (~0.5-0.65 ms measured here), while appending to a file that already exists and
calling `fdatasync` once costs ~0.25 ms (what SQLite's WAL pays). A log-structured layer above
this one keeps a group of keys in one such file; this module is only the file mechanics and knows
nothing about keys.

Record framing, little-endian::

    MAGIC b"\\xc7CKR" | u32 length | u32 crc32(length bytes + payload) | u32 crc32(12 bytes before)
    | payload

A record at an offset is whole and valid when its header crc matches, it ends inside the file and
its payload crc matches. A header that is intact but claims bytes past the end of the file is a
record being written right now or torn by a crash: the scan stops there. A payload that fails its
crc under an intact header, with all its bytes present, is damage bounded by that header, even as
the last record (a file grows only as the pages of a write land, so a crash leaves a record short,
not long and wrong): it is kept, so it can be reported.

A damaged header is told apart from a torn write by proof, not by position: a torn write leaves a
*prefix* of a record, and a prefix of 16 bytes or more has an intact header (the case above). So
when the bytes at a damaged header still hold a length whose payload is present in full and
matches the header's payload crc (crc32(length bytes + payload), which covers the length too), or
when the bytes up to the end of the file do (the length field itself was hit), that is a whole
record with a damaged header: damage bounded by its proven end, kept and reported, never
truncated, even as the last record. A false proof needs a 32-bit crc to match by chance. Only a
damaged header with no such proof makes the scan search forward (for the next valid record); no
search ever starts inside a record whose end is known, so bytes stored *inside* a value (which may
well contain a whole valid frame: a state can hold a copy of a log) are never taken for a record.
Bytes skipped before a later valid record are damage (recorded in `RecordLog.damaged`, logged);
with no valid record after them and no proof they are a torn tail (`RecordLog.torn` says where,
how long and why), which readers leave alone and the next writer, holding the lock, truncates
away.

Not detected, as in a truncated SQLite WAL: a file cut exactly at a record boundary (by something
other than ckptfs, which never shrinks a log below a whole record) reads as a shorter valid log;
its last records are lost without a trace in the file itself.

Concurrency: writers serialize with `flock` on the log file itself, so exclusion holds among
ckptfs processes (not against programs that ignore the lock). Readers never lock: a record only
becomes visible to them once it is whole, because its crc is checked. A rewrite replaces the
file (new inode); every other `RecordLog` notices the new inode on its next `refresh` and is told
to rebuild from the full new record list.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Iterator, Sequence

from ckptfs.errors import CorruptFileError, StoreNotWritableError, UnreadableFileError
from ckptfs.storage.base import TEMP_MARKER
from ckptfs.storage.fs import (
    READ_FLAGS,
    LinkRefused,
    NotRegular,
    entry_kind,
    fsync_dir,
    make_dirs,
    open_regular,
)

logger = logging.getLogger(__name__)

MAGIC = b"\xc7CKR"
_HEADER = struct.Struct("<4sIII")  # magic, payload length, crc32(length + payload), crc32(the 12 before)
HEADER_SIZE = _HEADER.size
MAX_PAYLOAD = 0xFFFFFFFF

_READ_AHEAD = 16 * 1024  # one pread serves a small record's header and payload together

Record = tuple[int, bytes]  # (offset of the record's header, payload)
# the write fd: O_NOFOLLOW refuses a link at the log's name, O_NONBLOCK a FIFO's wait
_WRITE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_log(path: str, flags: int = READ_FLAGS, mode: int = 0o644) -> int:
    """Open a log file, never through a link at its name, and only if it is a regular file.

    Only regular files inside the store are read or written (DESIGN.md): a link planted at a
    log's name is refused instead of followed (ELOOP), a FIFO opens without waiting and is then
    refused by the fstat of what was opened, so nothing can hang a reader or make it read
    without bound. Both are UnreadableFileError (a CorruptFileError, named by the path).
    """
    try:
        fd, _st = open_regular(None, path, flags, mode)
    except NotRegular as exc:
        raise UnreadableFileError(path, f"is {entry_kind(exc.mode)}, not a regular file; only "
                                        "regular files are opened in a store") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableFileError(path, "is a symbolic link; links in a store are never "
                                            "followed") from None
        raise
    return fd


_Ident = tuple[int, int]  # (st_dev, st_ino): a replaced file has another one


def frame(payload: bytes) -> bytes:
    """The bytes of one record. The header has its own crc, so a scan that meets a damaged
    payload still knows where the record ends and never looks for records inside it."""
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"record payload of {n} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    length = n.to_bytes(4, "little")
    head = MAGIC + length + zlib.crc32(payload, zlib.crc32(length)).to_bytes(4, "little")
    return head + zlib.crc32(head).to_bytes(4, "little") + payload


def _claimed(buf: bytes | memoryview, pos: int) -> int:
    """Payload length a record header at `pos` claims if the header itself is intact, else -1."""
    if len(buf) - pos < HEADER_SIZE:
        return -1
    magic, n, _crc, hcrc = _HEADER.unpack_from(buf, pos)
    if magic != MAGIC or zlib.crc32(buf[pos : pos + HEADER_SIZE - 4]) != hcrc:
        return -1
    return int(n)


def _check(buf: bytes | memoryview, pos: int) -> tuple[int, str]:
    """Length of the valid record at `pos` in `buf`, or (-1, why not)."""
    if len(buf) - pos < HEADER_SIZE:
        return -1, f"header cut short ({len(buf) - pos} of {HEADER_SIZE} bytes)"
    n = _claimed(buf, pos)
    if n < 0:
        return -1, "bad magic" if bytes(buf[pos : pos + 4]) != MAGIC else "header crc mismatch"
    end = pos + HEADER_SIZE + n
    if end > len(buf):
        return -1, f"length {n} runs past the end of the file"
    crc = _HEADER.unpack_from(buf, pos)[2]
    if zlib.crc32(buf[pos + HEADER_SIZE : end], zlib.crc32(buf[pos + 4 : pos + 8])) != crc:
        return -1, "crc mismatch"
    return n, ""


class RecordLog:
    """One append-only file of checksummed records.

    Why a class with a view: callers (an index over the records) must learn cheaply what changed
    since they last looked; the object remembers which file (inode) it has read and how far, so
    `refresh` on an unchanged file is a single `stat`. One object may be shared by threads: its
    state sits behind a lock, held for a whole `locked()` block too, because `flock` does not
    exclude threads that share one open file.
    """

    def __init__(self, path: str, *, fsync: bool = True, root: str | None = None) -> None:
        self.path = os.path.abspath(path)
        self.fsync = fsync
        # the store root the log lives in: its directories are made beneath it, never through
        # a link (LogStorage passes it; a bare RecordLog takes its path as given)
        self.root = root
        self.damaged: list[tuple[int, str]] = []
        # the bytes after the last whole record, as the last scan found them: (offset, size, why),
        # a write in progress or torn by a crash (never acknowledged); None when there are none
        self.torn: tuple[int, int, str] | None = None
        self._lock = threading.RLock()  # view state and locked() sessions
        self._fd_lock = threading.Lock()  # only around swapping or using _fd, so reads stay short
        self._fd: int | None = None  # read fd of the file in view
        self._ident: _Ident | None = None  # None: no file in view (never seen, or seen gone)
        self._end = 0  # offset after the last whole record (or skipped damage) scanned
        self._pending: list[Record] = []  # found by an implicit scan in append, not yet returned
        self._pending_replaced = False
        self._session: LockedLog | None = None
        self._wfd: int | None = None  # O_RDWR fd that carries the flock, kept between blocks
        self._wident: _Ident | None = None
        self._wpid = 0  # a forked child shares the open file, hence the lock: it must reopen
        self._dir_ready = False
        self._swept = False
        self._closed = False

    def __repr__(self) -> str:
        return f"RecordLog({self.path!r})"

    # -- reading ---------------------------------------------------------------------------------

    def refresh(self) -> tuple[bool, list[Record]]:
        """Catch up with the file without locking: (replaced, records not returned before).

        replaced=True means the file was rewritten, deleted or recreated since this object last
        looked; `records` then holds every record of the current file (none if it is gone) and
        the caller rebuilds its index from them. Records this object appended itself are not
        returned (the caller has their offsets from `append`), except after an append that had
        to catch up first (see `LockedLog.append`). A partial record at the end is
        left for the next call: it is another writer mid-append, or a torn tail the next writer
        removes.
        """
        with self._lock:
            self._check_open()
            try:
                st = os.lstat(self.path)  # a link has its own inode: open_log then refuses it
            except FileNotFoundError:
                return self._deliver(self._lose_file(), [])
            ident = (st.st_dev, st.st_ino)
            if ident == self._ident and st.st_size == self._end and not self._pending:
                return False, []
            replaced = False
            if ident != self._ident:
                try:
                    fd = open_log(self.path)
                except FileNotFoundError:
                    return self._deliver(self._lose_file(), [])
                fst = os.fstat(fd)
                replaced = self._adopt(fd, (fst.st_dev, fst.st_ino))
                size = fst.st_size
            else:
                size = st.st_size
            replaced |= self._rewind_if_shrunk(size)
            assert self._fd is not None
            records, _ = self._scan(self._fd, size)
            return self._deliver(replaced, records)

    def read(self, offset: int, length: int = -1) -> bytes:
        """The payload of the record at `offset`, its crc verified.

        `length`: the payload's length if the caller knows it (an index built from the
        records), so that one read of exactly the record serves; a wrong one only costs
        another read.

        Reads the file this object last looked at (by `refresh` or under the lock), the one its
        offsets refer to: a file replaced since is not read at stale offsets, where another valid
        record could sit. FileNotFoundError when this object found the file gone, or has looked
        at none and there is none.
        """
        self._check_open()
        with self._fd_lock:
            if self._fd is not None:
                return self._read_at(self._fd, offset, length)
        fd = open_log(self.path)  # nothing in view yet: the file as it is
        try:
            return self._read_at(fd, offset, length)
        finally:
            os.close(fd)

    def _read_at(self, fd: int, offset: int, length: int = -1) -> bytes:
        if offset < 0:
            raise ValueError(f"{self.path}: negative record offset {offset}")
        buf = os.pread(fd, HEADER_SIZE + length if length >= 0 else _READ_AHEAD, offset)
        if length >= 0 and len(buf) == HEADER_SIZE + length:
            # the common case, checked in one pass: the header, then the payload's crc
            magic, n, crc, hcrc = _HEADER.unpack_from(buf)
            if (n == length and magic == MAGIC
                    and zlib.crc32(memoryview(buf)[: HEADER_SIZE - 4]) == hcrc
                    and zlib.crc32(memoryview(buf)[HEADER_SIZE:], zlib.crc32(buf[4:8])) == crc):
                return buf[HEADER_SIZE:]
        if len(buf) >= HEADER_SIZE:
            n = _claimed(buf, 0)
            if n >= 0 and len(buf) < HEADER_SIZE + n <= os.fstat(fd).st_size - offset:
                buf += _pread_all(fd, HEADER_SIZE + n - len(buf), offset + len(buf))
        n, why = _check(buf, 0)
        if n < 0:
            raise CorruptFileError(self.path, f"record at offset {offset}: {why}")
        return bytes(buf[HEADER_SIZE : HEADER_SIZE + n])

    # -- writing ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[LockedLog]:
        """Hold the log exclusively among ckptfs processes (and this object's threads).

        `flock(LOCK_EX)` on the log file itself, opened O_RDWR|O_CREAT. The path may be replaced
        (a rewrite) or removed between our open and our lock; then we hold a lock on a file
        nobody uses any more, so we compare inodes after locking and start again. The write fd
        stays open between blocks (unlocked with LOCK_UN): open + close cost ~0.03 ms a commit.
        """
        with self._lock:
            self._check_open()
            if self._session is not None:
                raise RuntimeError(f"{self.path}: locked() is not reentrant")
            self._ensure_dir()
            fd, size = self._acquire()
            if not self._swept:
                self._sweep_temps()
            session = LockedLog(self, fd, size)
            self._session = session
            try:
                yield session
            finally:
                self._session = None
                session._end_session()

    def _sweep_temps(self) -> None:
        """Remove temp files a rewrite killed midway left (once per object, under the lock: no
        rewrite can be running, so every such file is dead)."""
        d, name = os.path.split(self.path)
        stem = f".{name}{TEMP_MARKER}"
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(d):
                if entry.name.startswith(stem):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    logger.info("%s: removed %s, left by an interrupted rewrite", self.path, entry.name)
        self._swept = True

    def rewrite(self, payloads: Sequence[bytes]) -> list[int]:
        """Replace the log by one holding exactly these records; return their offsets.

        The compaction step: temp file beside the log, fsync, `os.replace`, fsync of the
        directory, so a crash leaves the old log or the new one, never a mix. The new file is
        locked before it takes the log's name, so no other writer slips in between. With no
        payloads the log is removed. Takes the lock itself, or uses the `locked()` block this
        thread is in (so a caller can read with `new_records()` and rewrite atomically).
        """
        if not payloads:
            self.remove()
            return []
        with self._lock:
            if self._session is not None:
                return self._session._rewrite(payloads)
            with self.locked() as session:
                return session._rewrite(payloads)

    def remove(self) -> None:
        """Unlink the log (and fsync its directory) under the lock; a missing log is fine."""
        with self._lock:
            self._check_open()
            if self._session is not None:
                self._session._remove()
                return
            if not os.path.exists(self.path):
                self._lose_file()  # our own doing: a following refresh reports nothing
                self._pending, self._pending_replaced = [], False
                return
            with self.locked() as session:
                session._remove()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._set_fd(None)
            self._drop_wfd()

    # -- internals -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: RecordLog is closed")

    def _set_fd(self, fd: int | None) -> None:
        with self._fd_lock:
            old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def _adopt(self, fd: int, ident: _Ident) -> bool:
        """Put another file in view; True when it replaces one we had seen."""
        replaced = self._ident is not None
        self._set_fd(fd)
        self._ident = ident
        self._end = 0
        self.damaged = []
        self.torn = None
        return replaced

    def _lose_file(self) -> bool:
        """The file is gone: True when we had one in view (the caller must drop its index)."""
        replaced = self._ident is not None
        self._set_fd(None)
        self._ident = None
        self._end = 0
        self.damaged = []
        self.torn = None
        return replaced

    def _rewind_if_shrunk(self, size: int) -> bool:
        """ckptfs never shrinks a log below its last whole record; something else did: start over."""
        if size >= self._end:
            return False
        logger.warning("%s: shrank in place from %d to %d bytes; rereading it from the start",
                       self.path, self._end, size)
        self._end = 0
        self.damaged = []
        return True

    def _deliver(self, replaced: bool, records: list[Record]) -> tuple[bool, list[Record]]:
        """Merge with what an earlier append found and nobody returned yet."""
        if replaced:
            out_replaced, out = True, records  # the pending ones belonged to the old file
        else:
            out_replaced, out = self._pending_replaced, self._pending + records
        self._pending, self._pending_replaced = [], False
        return out_replaced, out

    def _scan(self, fd: int, size: int) -> tuple[list[Record], int]:
        """Whole records from `_end` to `size`; returns them and the size of a torn tail."""
        start = self._end
        if size <= start:
            self.torn = None
            return [], 0
        raw = _pread_all(fd, size - start, start)
        buf = memoryview(raw)
        records: list[Record] = []
        pos = 0
        while pos < len(buf):
            n, why = _check(buf, pos)
            if n >= 0:
                records.append((start + pos, bytes(buf[pos + HEADER_SIZE : pos + HEADER_SIZE + n])))
                pos += HEADER_SIZE + n
                continue
            claimed = _claimed(buf, pos)
            if claimed >= 0 and pos + HEADER_SIZE + claimed > len(buf):
                break  # a record still being written, or torn by a crash: never look inside it
            if claimed >= 0:
                # An intact header and all its bytes present, yet the payload fails: damage
                # bounded by the header, even as the last record (a file grows only as its
                # pages are written, so a crash leaves a short record, not a long wrong one).
                # Kept, not truncated, so verify can name it and its key is not served stale.
                nxt = pos + HEADER_SIZE + claimed
            else:
                # A damaged header: a whole record if its payload proves its length (the
                # stored one); else the next valid record bounds it; else, if the bytes to the
                # end prove that length (the length field was hit), it is the last record.
                # Without a proof it is a torn tail (a torn write leaves a prefix of a record,
                # whose header is intact once 16 bytes are there: see the module docstring).
                proven = _proven_length(buf, pos)
                if proven >= 0:
                    nxt = pos + HEADER_SIZE + proven
                else:
                    nxt = _next_valid(raw, buf, pos + 1)
                    if nxt < 0:
                        if not _proves(buf, pos, len(buf) - pos - HEADER_SIZE):
                            break  # a torn tail
                        nxt = len(buf)
            self.damaged.append((start + pos, why))
            logger.warning("%s: %d damaged bytes at offset %d skipped (%s)",
                           self.path, nxt - pos, start + pos, why)
            pos = nxt
        self._end = start + pos
        tail = len(buf) - pos
        self.torn = (start + pos, tail, _check(buf, pos)[1]) if tail else None
        return records, tail

    def _ensure_dir(self) -> None:
        """Create missing parents, each made durable by an fsync of its own parent."""
        if not self._dir_ready:
            try:
                make_dirs(os.path.dirname(self.path), self.fsync, root=self.root)
            except LinkRefused as exc:
                raise StoreNotWritableError(f"{self.path}: cannot create its directory: "
                                            f"{exc.reason}") from None
            self._dir_ready = True

    def _acquire(self) -> tuple[int, int]:
        """Lock the file now at our path; return the write fd and the file's size."""
        while True:
            if self._wfd is not None and self._wpid != os.getpid():
                self._drop_wfd()  # the parent's description: closing our copy leaves its lock be
            if self._wfd is None:
                try:
                    fd = open_log(self.path, _WRITE_FLAGS)
                except FileNotFoundError:  # our directory was removed since we made it
                    self._dir_ready = False
                    self._ensure_dir()
                    continue
                fst = os.fstat(fd)
                self._wfd, self._wident, self._wpid = fd, (fst.st_dev, fst.st_ino), os.getpid()
            fd = self._wfd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    st = os.lstat(self.path)
                except FileNotFoundError:
                    st = None
            except BaseException:
                self._drop_wfd()
                raise
            if st is not None and (st.st_dev, st.st_ino) == self._wident:
                if st.st_size == 0:
                    # New (or emptied) file: make its name durable before any record relies
                    # on it; a creator killed before doing so is covered by the next writer.
                    fsync_dir(os.path.dirname(self.path), self.fsync)
                return fd, st.st_size
            self._drop_wfd()  # replaced or removed since we opened it: try the file there now

    def _drop_wfd(self) -> None:
        fd, self._wfd, self._wident = self._wfd, None, None
        if fd is not None:
            os.close(fd)  # also releases a flock held through it


class LockedLog:
    """The log while this process holds its lock: catch up, repair a torn tail, append."""

    def __init__(self, log: RecordLog, fd: int, size: int) -> None:
        self._log = log
        self._fd: int | None = fd
        self._size: int | None = size  # as stat() found it once locked: spares an fstat
        self._caught_up = False
        self._removed = False

    def new_records(self) -> tuple[bool, list[Record]]:
        """Like `RecordLog.refresh`, but under the lock, so a torn tail is truly dead bytes.

        It is truncated away (ftruncate + fdatasync, logged) so that new records follow the last
        whole one and a later scan never mistakes the junk for damage before valid data.
        """
        log, fd = self._log, self._live_fd()
        size = os.fstat(fd).st_size if self._size is None else self._size
        self._size = None
        ident = log._wident
        assert ident is not None
        replaced = False
        if ident != log._ident:
            replaced = log._adopt(_open_view(log.path, ident), ident)
        replaced |= log._rewind_if_shrunk(size)
        records, tail = log._scan(fd, size)
        if tail:
            logger.warning("%s: truncating a torn tail of %d bytes at offset %d", log.path, tail,
                           log._end)
            os.ftruncate(fd, log._end)
            if log.fsync:
                os.fdatasync(fd)
        self._caught_up = True
        return log._deliver(replaced, records)

    def append(self, payloads: Sequence[bytes]) -> list[int]:
        """Write the records with one write and one fdatasync; durable on return.

        Catches up first if the caller has not, so records by others are never overwritten and
        no torn tail precedes ours. What that finds is returned by the next `refresh`, followed
        by the records appended here (normally a refresh leaves out this object's own appends).
        Callers that check their index before appending (put-if-absent, compare-and-swap) must
        call `new_records()` themselves first.
        """
        log = self._log
        fd = self._live_fd()
        if not self._caught_up:
            if self._size == log._end and log._wident == log._ident:
                self._caught_up = True  # the common case: nobody wrote since our last look
            else:
                replaced, found = self.new_records()
                log._pending_replaced, log._pending = replaced, found
        if not payloads:
            return []
        start = pos = log._end
        if len(payloads) == 1:
            data = frame(payloads[0])
            offsets = [start]
            pos += len(data)
        else:
            frames = [frame(p) for p in payloads]
            offsets = []
            for f in frames:
                offsets.append(pos)
                pos += len(f)
            data = b"".join(frames)
        try:
            written = os.pwrite(fd, data, start)
            while written < len(data):  # a short write only happens near ENOSPC; the next one raises
                written += os.pwrite(fd, data[written:], start + written)
            if log.fsync:
                os.fdatasync(fd)
        except BaseException:
            # Not acknowledged: take the partial bytes back so no later record follows them.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        log._end = pos
        if log._pending or log._pending_replaced:
            # The caller has not seen what the catch-up found: hand ours back after it, so a
            # caller applying the next refresh in order ends in file order (and a rebuild after
            # replaced=True is complete).
            log._pending.extend(zip(offsets, (bytes(p) for p in payloads), strict=True))
        return offsets

    def _rewrite(self, payloads: Sequence[bytes]) -> list[int]:
        log = self._log
        old_fd = self._live_fd()
        frames = [frame(p) for p in payloads]
        d, name = os.path.split(log.path)
        tmp = os.path.join(d, f".{name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # nobody knows it yet: never blocks
            data = b"".join(frames)
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], written)
            if log.fsync:
                os.fsync(fd)
            os.replace(tmp, log.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        # The new file holds our lock and our name: waiters on the old one will find it replaced.
        assert old_fd == log._wfd
        log._drop_wfd()
        fst = os.fstat(fd)
        ident = (fst.st_dev, fst.st_ino)
        self._fd, self._size = fd, None
        log._wfd, log._wident, log._wpid = fd, ident, os.getpid()
        fsync_dir(d, log.fsync)
        log._adopt(_open_view(log.path, ident), ident)
        log._end = len(data)
        log._pending, log._pending_replaced = [], False
        self._caught_up = True
        offsets, pos = [], 0
        for f in frames:
            offsets.append(pos)
            pos += len(f)
        return offsets

    def _remove(self) -> None:
        log = self._log
        self._live_fd()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log.path)
        fsync_dir(os.path.dirname(log.path), log.fsync)
        log._lose_file()
        log._pending, log._pending_replaced = [], False
        self._removed = True  # keep holding the old lock until the block ends; it guards nothing now

    def _live_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"{self._log.path}: used outside its locked() block")
        if self._removed:
            raise RuntimeError(f"{self._log.path}: the log was removed in this locked() block")
        return self._fd

    def _end_session(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._removed:
            self._log._drop_wfd()  # its file is gone: closing releases the lock
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            self._log._drop_wfd()
            raise


def _proves(buf: bytes | memoryview, pos: int, n: int) -> bool:
    """Whether a record of `n` payload bytes at `pos`, all present, matches the payload crc its
    header bytes hold (crc32 of the length bytes it would have, then the payload): the proof
    that a record whose header is damaged is whole, not a torn write."""
    if n < 0 or n > MAX_PAYLOAD or pos + HEADER_SIZE + n > len(buf):
        return False
    crc = int.from_bytes(buf[pos + 8 : pos + 12], "little")
    payload = buf[pos + HEADER_SIZE : pos + HEADER_SIZE + n]
    return zlib.crc32(payload, zlib.crc32(n.to_bytes(4, "little"))) == crc


def _proven_length(buf: bytes | memoryview, pos: int) -> int:
    """The payload length stored in the (damaged) header at `pos` if its payload proves it, else -1."""
    if len(buf) - pos < HEADER_SIZE:
        return -1
    n = int.from_bytes(buf[pos + 4 : pos + 8], "little")
    return n if _proves(buf, pos, n) else -1


def _next_valid(raw: bytes, buf: memoryview, pos: int) -> int:
    """Offset of the next valid record at or after `pos`, or -1 (`buf` is a view of `raw`)."""
    while True:
        pos = raw.find(MAGIC, pos)
        if pos < 0:
            return -1
        if _check(buf, pos)[0] >= 0:
            return pos
        pos += 1


def _open_view(path: str, ident: _Ident) -> int:
    """A separate read fd for the view, so that it never carries the write fd's lock."""
    fd = open_log(path)
    fst = os.fstat(fd)
    if (fst.st_dev, fst.st_ino) != ident:
        os.close(fd)
        raise RuntimeError(f"{path}: replaced while we held its lock (a writer ignoring the lock?)")
    return fd


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    """Up to `n` bytes from `offset`: fewer only at end of file (pread may return short)."""
    parts = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 30), offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)
