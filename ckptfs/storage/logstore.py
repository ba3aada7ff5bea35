"""LogStorage: small, frequent objects on local disk for one fdatasync each, not two fsyncs.

A put on `LocalStorage` is temp file + fsync + rename + fsync of the directory (~0.5-0.65 ms
here); an append to an existing file plus one fdatasync is ~0.24 ms, which is how SQLite's WAL
commits. LogStorage keeps the Storage contract but stores the keys of a *group* (a key prefix
chosen by the caller, e.g. one LangGraph thread namespace) as records of one append-only
`RecordLog` file, `<group>.records` (a name the group's own keys cannot take). A put appends a
record; a delete appends a tombstone; the newest record of a key wins. Keys outside any group
pass through to the local storage, and so do loose files already inside a group's directory
(objects written before the group had a log are read, listed and deleted as before).

Exclusivity (`put_if_absent`, `put_if_match`) holds across processes: the decision is taken
under the log's flock after reading every record appended by others. Space is reclaimed by
rewriting the log once tombstoned bytes outweigh the live ones; a group with nothing live loses
its file.
"""

from __future__ import annotations

import bisect
import functools
import io
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO

import xxhash

from ckptfs.errors import CorruptFileError
from ckptfs.storage.base import TEMP_MARKER, Capabilities, Keys, PreconditionFailed, Storage, check_key
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logfile import HEADER_SIZE, RecordLog, open_log

logger = logging.getLogger(__name__)

LOG_NAME = ".records"  # the group's log: `<group>.records`, inside the group's directory
COMPACT_MIN_DEAD = 1024 * 1024
_PUT, _DEL = b"P", b"D"
_KEYLEN = struct.Struct("<H")


def _record(op: bytes, key: str, data: bytes = b"") -> bytes:
    k = key.encode()
    return op + _KEYLEN.pack(len(k)) + k + data


def _record_len(key: str, size: int) -> int:
    """The payload length of a put record of `size` bytes of data (a read's length hint)."""
    return 3 + len(key.encode()) + size


def _parse(payload: bytes, where: str) -> tuple[bytes, str, int]:
    """(op, key, offset of the data in the payload)."""
    if len(payload) < 3 or payload[:1] not in (_PUT, _DEL):
        raise CorruptFileError(where, "log record is neither a put nor a delete")
    (n,) = _KEYLEN.unpack_from(payload, 1)
    if 3 + n > len(payload):
        raise CorruptFileError(where, "log record key runs past the record")
    try:
        key = check_key(payload[3 : 3 + n].decode())
    except (UnicodeDecodeError, ValueError):
        raise CorruptFileError(where, "log record key is not a valid key") from None
    return payload[:1], key, 3 + n


def _content_etag(data: bytes | memoryview) -> str:
    # from the content, as S3's: offsets repeat after a rewrite, so they would let a stale
    # compare-and-swap through
    return f"x{len(data):x}-{xxhash.xxh3_64_hexdigest(data)}"


@dataclass
class _Group:
    """One group's log and the index of its live keys: key -> (record offset, data size, etag)."""

    log: RecordLog
    group: str
    index: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    live: int = 0
    dead: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    loose: bool = True  # may plain files (from before the log) exist in the group's directory?
    closed: bool = False  # evicted or closed: look the group up again
    damaged: dict[str, int] = field(default_factory=dict)  # key -> offset of its damaged record
    uncertain: int = -1  # offset of a damaged record whose key is unknown (-1: none)
    seen_damage: int = 0  # how many of log.damaged were looked at
    synced: bool = False  # has `sync` caught up with the log at least once?
    # The group's directory (st_ino, st_mtime_ns, st_nlink) as it was when a scan found nothing
    # in it but its log; None: not known to hold only its log, so a listing scans it.
    dir_stamp: tuple[int, int, int] | None = None
    _sorted: list[str] | None = None  # the index's keys in order, kept up to date once built
    # the last `LogStorage.newest` answer (prefix, beside prefix, key, data, keys beside), kept
    # while the index and its damage stay as they were: a reader polling an idle thread
    memo: tuple[str, str | None, str, bytes, list[str]] | None = None

    @functools.cached_property
    def dir_path(self) -> str:
        return os.path.dirname(self.log.path)

    def only_log(self) -> bool:
        """Whether the directory still holds nothing but the log (see `LogStorage._scan_loose`)."""
        return self.dir_stamp is not None and self.dir_stamp == _dir_stamp(self.dir_path)

    def _span(self, prefix: str) -> tuple[list[str], int, int]:
        """The sorted keys and the bounds of those starting with `prefix`: a bisection, not a
        sort of the index."""
        if self._sorted is None:
            self._sorted = sorted(self.index)
        keys = self._sorted
        lo = bisect.bisect_left(keys, prefix)
        if not prefix or prefix[-1] == chr(0x10FFFF):
            hi = lo
            while hi < len(keys) and keys[hi].startswith(prefix):
                hi += 1
            return keys, lo, hi
        return keys, lo, bisect.bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1), lo)

    def keys_under(self, prefix: str) -> list[str]:
        """The live keys starting with `prefix`, sorted."""
        keys, lo, hi = self._span(prefix)
        return keys[lo:hi]

    def last_under(self, prefix: str) -> str | None:
        keys, lo, hi = self._span(prefix)
        return keys[hi - 1] if hi > lo else None

    def _added(self, key: str) -> None:
        keys = self._sorted
        if keys is not None:
            if not keys or key > keys[-1]:
                keys.append(key)  # the common case: keys named by time (checkpoint ids)
            else:
                bisect.insort(keys, key)

    def _removed(self, key: str) -> None:
        keys = self._sorted
        if keys is not None:
            i = bisect.bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                del keys[i]

    def apply(self, records: Iterable[tuple[int, bytes]], replaced: bool) -> None:
        """Index `records` (file order); name the damage the log found among them, in the same
        order, so a damaged record counts only until a later record of its key supersedes it."""
        if replaced or records:
            self.memo = None
        if replaced:
            self.index.clear()
            self._sorted = None
            self.damaged.clear()
            self.live = self.dead = self.seen_damage = 0
            self.uncertain = -1
        found = self.log.damaged
        fresh = len(found) > self.seen_damage  # new damage: noted before the records after it
        if fresh:
            self.memo = None
        for offset, payload in records:
            if fresh:
                while self.seen_damage < len(found) and found[self.seen_damage][0] < offset:
                    self._note_damage(*found[self.seen_damage])
                    self.seen_damage += 1
            try:
                op, key, start = _parse(payload, f"{self.log.path}@{offset}")
            except CorruptFileError as exc:
                logger.warning("%s: skipped", exc)
                continue
            if self.damaged:
                self.damaged.pop(key, None)  # a later record of its key: the damage hides nothing now
            old = self.index.pop(key, None)
            if old is not None:
                self.live -= old[1]
                self.dead += old[1]
            if op == _PUT:
                data = memoryview(payload)[start:]
                self.index[key] = (offset, len(data), _content_etag(data))
                self.live += len(data)
                if old is None:
                    self._added(key)
            else:
                self.dead += len(payload)
                if old is not None:
                    self._removed(key)
        while self.seen_damage < len(found):
            self._note_damage(*found[self.seen_damage])
            self.seen_damage += 1

    def put_applied(self, offset: int, key: str, data: bytes) -> str:
        """`apply` of a put this process just appended: its key and bytes are known, so the
        record is not parsed (nor its key validated) again. Returns its etag."""
        self.memo = None
        old = self.index.pop(key, None)
        if old is not None:
            self.live -= old[1]
            self.dead += old[1]
        etag = _content_etag(data)
        self.index[key] = (offset, len(data), etag)
        self.live += len(data)
        if old is None:
            self._added(key)
        return etag

    def _note_damage(self, offset: int, why: str) -> None:
        """Name the key of a damaged record the log skipped, where its bytes still say it.

        A skipped record may have been a key's newest put or its delete: serving the key's older
        record instead would be a wrong answer, so such a key raises until it is written again.
        A record whose key is unreadable may have been any key: `uncertain` keeps the last one,
        which `hidden` and `LogStorage.damage` weigh against the keys written before it.
        """
        key = damaged_key(self.log.path, offset, self.group)
        if key is None:
            self.uncertain = max(self.uncertain, offset)
            logger.warning("%s: damaged record at byte %d (%s); its key is unknown", self.log.path,
                           offset, why)
        else:
            self.damaged[key] = offset
            logger.warning("%s: the record of %s at byte %d is damaged (%s)", self.log.path, key,
                           offset, why)

    def sync(self) -> None:
        replaced, records = self.log.refresh()
        self.apply(records, replaced)
        self.synced = True

    def check_readable(self, key: str) -> None:
        bad = self.damaged.get(key)
        hit = self.index.get(key)
        if bad is not None and (hit is None or hit[0] < bad):
            raise Damage(self.log.path, bad, key).error()

    def written_before(self, offset: int, ranked: str) -> str | None:
        """The greatest live key under `ranked` whose record precedes byte `offset` (None: none)."""
        for key in reversed(self.keys_under(ranked)):
            if self.index[key][0] < offset:
                return key
        return None

    def hidden(self, prefix: str, key: str | None, near: str | None) -> CorruptFileError | None:
        """Why `key`, the greatest live key under `prefix` (None: there is none), may not be the
        newest one, or the keys under `near` may not be all: a damaged record of a key under
        `prefix` from `key` on or of one under `near`, or one whose key is unreadable written
        after `key`'s record (keys named in time order, it may have been a newer key or one
        filed under `key`). None when nothing is known to hide anything there."""
        for bad, offset in sorted(self.damaged.items(), reverse=True):
            if (bad.startswith(prefix) and (key is None or bad >= key)) or (
                    near is not None and bad.startswith(near)):
                hit = self.index.get(bad)
                if hit is None or hit[0] < offset:
                    context = ("" if bad == key else f"; so the keys filed under {key} are not all known"
                               if near is not None and bad.startswith(near)
                               else f"; so the newest key under {prefix!r} is not known")
                    return Damage(self.log.path, offset, bad).error(context)
        if self.uncertain >= 0:
            hit = None if key is None else self.index.get(key)
            if hit is None or hit[0] < self.uncertain:
                return Damage(self.log.path, self.uncertain, None, key).error(
                    f"; so the newest key under {prefix!r} is not known")
        return None


@dataclass(frozen=True)
class Damage:
    """A damaged record of a group's log that may hide a key's newest record (a put or a delete).

    `key`: the key it was for, where its bytes still say it; None when they do not, and then
    `after` is the greatest key (of the range asked about) whose live record was written before
    it, None if none was: keys named in time order (LangGraph's checkpoint ids), the damaged
    record may have been any key written after that one, or one filed under it.
    """

    log: str
    offset: int
    key: str | None
    after: str | None = None

    def error(self, context: str = "") -> CorruptFileError:
        """The error a read that this damage may make wrong raises instead of answering."""
        if self.key is not None:
            return CorruptFileError(self.key, f"its newest record (byte {self.offset} of {self.log}) is "
                                              f"damaged{context}; rewrite the key or delete it "
                                              "(see `ckptfs verify`)")
        where = (f"written after the record of {self.after}, it may have held a newer key or one "
                 "filed under that one" if self.after is not None
                 else "written before every intact record, it may have held any key")
        return CorruptFileError(self.log, f"the record at byte {self.offset} is damaged and its key "
                                          f"unreadable ({where}){context} (see `ckptfs verify`)")


# A directory stamp is trusted once its mtime is this far in the past: 50 ms where mtimes have
# fractions of a second (a clock tick is at most 10 ms), 2 s where they are whole seconds.
_RACY_NS = 50_000_000
_RACY_COARSE_NS = 2_000_000_000


def _dir_stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_nlink)


def damaged_key(path: str, offset: int, group: str) -> str | None:
    """The key a damaged record was for, if its first bytes are still a plausible key of `group`."""
    try:
        fd = open_log(path)  # never through a link, never a FIFO
        try:
            head = os.pread(fd, 3 + 65535, offset + HEADER_SIZE)
        finally:
            os.close(fd)
        _op, key, _start = _parse(head, path)
    except (OSError, CorruptFileError, struct.error):
        return None
    return key if key.startswith(group) else None


class _Hold:
    """`LogStorage._held`: a class, not a generator context manager, as it is on every read's
    path (a generator-based one costs a few microseconds more per use)."""

    __slots__ = ("_group", "_store", "_taken")

    def __init__(self, store: LogStorage, group: str) -> None:
        self._store, self._group = store, group
        self._taken: _Group | None = None

    def __enter__(self) -> _Group:
        self._taken = self._store._take(self._group)
        return self._taken

    def __exit__(self, *exc: object) -> None:
        assert self._taken is not None
        self._taken.lock.release()


class LogStorage(Storage):
    """`LocalStorage` whose grouped keys live in append-only logs; see the module docstring.

    ``group_of(key)`` returns the group prefix (ending in "/") a key or listing prefix falls in,
    or None for keys stored as plain files.
    """

    capabilities = Capabilities(
        atomic_put=True, exclusive_create=True, conditional_put=True, durable=True, shared=True
    )

    def __init__(self, inner: LocalStorage, group_of: Callable[[str], str | None],
                 max_open_groups: int = 256) -> None:
        super().__init__(inner.url, inner.options)
        self.inner = inner
        self.display_url = inner.display_url
        self.group_of = group_of
        self.max_open_groups = max_open_groups
        self._groups: OrderedDict[str, _Group] = OrderedDict()
        self._lock = threading.Lock()

    def _held(self, group: str) -> _Hold:
        """The group's state with its lock held (a `with` block). At most `max_open_groups` logs
        stay open (an fd and an index each); the least recently used idle one is closed to make
        room."""
        return _Hold(self, group)

    def _take(self, group: str) -> _Group:
        """The group's state, its lock acquired (the caller releases it)."""
        while True:
            with self._lock:
                g = self._groups.get(group)
                if g is None:
                    path = self.inner.local_path(group + LOG_NAME)
                    g = self._groups[group] = _Group(
                        RecordLog(path, fsync=self.inner.fsync, root=self.inner.root), group)
                    # checked once: a put then skips two syscalls for files that cannot be there
                    self._scan_loose(g)
                    self._evict()
                self._groups.move_to_end(group)
            g.lock.acquire()
            if not g.closed:
                return g
            g.lock.release()

    def _evict(self) -> None:
        for name in list(self._groups)[: max(0, len(self._groups) - self.max_open_groups)]:
            g = self._groups[name]
            if g.lock.acquire(blocking=False):  # in use: stays open for now
                try:
                    del self._groups[name]
                    g.closed = True
                    g.log.close()
                finally:
                    g.lock.release()

    def _scan_loose(self, g: _Group) -> list[str]:
        """The plain files in the group's directory (keys from before the log); notes whether
        there are any (`loose`) and, when there are none, the directory's stamp (`dir_stamp`).

        Why a stamp: listing a group is then a bisection of its index instead of a walk of its
        directory (two thirds of a LangGraph `get_tuple` on local disk). A plain file needs a
        directory entry: one made in a subdirectory made that subdirectory first, which adds a
        link to the group's directory (st_nlink counts subdirectories on ext4, xfs, tmpfs; a
        filesystem where a directory's st_nlink is not 2 is always walked), and one made in the
        group's directory itself changes its mtime. The stamp is taken before the walk, so what
        the walk missed changes it. A directory changed too recently is not stamped (git's
        "racily clean" rule): a timestamp has the granularity of the kernel's clock tick (a few
        milliseconds; whole seconds on filesystems such as FAT, which write no fraction), so a
        file made within the tick of the stamp could leave the mtime as it was; once the mtime
        is safely in the past, any change moves it.
        """
        stamp = _dir_stamp(g.dir_path)
        loose = [k for k in self.inner.list(g.group) if not self._is_log_file(k)]
        g.loose = bool(loose)
        racy = _RACY_NS if stamp is None or stamp[1] % 1_000_000_000 else _RACY_COARSE_NS
        settled = stamp is not None and stamp[1] < time.time_ns() - racy
        g.dir_stamp = stamp if not loose and settled and stamp is not None and stamp[2] == 2 else None
        return loose

    @staticmethod
    def _is_log_file(key: str) -> bool:
        name = key.rpartition("/")[2]
        return name == LOG_NAME or (name.startswith("." + LOG_NAME) and TEMP_MARKER in name)

    def _write(self, group: str, key: str, data: bytes, check: Callable[[_Group], None] | None = None) -> str:
        with self._held(group) as g, g.log.locked() as w:
            replaced, records = w.new_records()
            g.apply(records, replaced)
            if check is not None:
                check(g)
            record = _record(_PUT, key, data)
            offset = w.append([record])[0]
            etag = g.put_applied(offset, key, data)
            g.damaged.pop(key, None)  # written again: its damaged record no longer matters
            g.memo = None
        if g.loose:
            self.inner.delete(key)  # the record replaces the key's plain file from before the log
        return etag

    # ------------------------------------------------------------------------------ writes

    def _grouped(self, key: str) -> str | None:
        """The group whose log holds `key` (None: a plain file); the log's own name is no key
        (ValueError)."""
        group = self.group_of(check_key(key))
        if group is None:
            return None
        if key == group + LOG_NAME or self._is_log_file(key):
            raise ValueError(f"invalid storage key {key!r}: the name of its group's log")
        return group

    def put(self, key: str, data: bytes) -> str:
        group = self._grouped(key)
        if group is None:
            return self.inner.put(key, data)
        return self._write(group, key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        group = self._grouped(key)
        if group is None:
            return self.inner.put_if_absent(key, data)

        def absent(g: _Group) -> None:
            if key in g.index or (g.loose and self.inner.exists(key)):
                raise FileExistsError(key)

        return self._write(group, key, data, absent)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        group = self._grouped(key)
        if group is None:
            return self.inner.put_if_match(key, data, etag)

        def matches(g: _Group) -> None:
            if key in g.index:
                current = g.index[key][2]
            elif g.loose:  # still a plain file from before the log: its own etag
                current = self.inner.get_with_etag(key)[1]
            else:
                raise FileNotFoundError(key)
            if current != etag:
                raise PreconditionFailed(f"{key}: etag is {current}, expected {etag}")

        return self._write(group, key, data, matches)

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        if not self._grouped(key):
            self.inner.put_stream(key, src, exclusive)
        elif exclusive:
            self.put_if_absent(key, src.read())
        else:
            self.put(key, src.read())

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Sequence[str]) -> None:
        """All of `keys` gone with one fdatasync per group, in the order given."""
        by_group: dict[str, list[str]] = {}
        for key in keys:
            group = self._grouped(key)
            if group is not None:
                by_group.setdefault(group, []).append(key)
            else:
                self.inner.delete(key)
        for group, members in by_group.items():
            with self._held(group) as g:
                if g.loose:
                    # plain files first: while a key's record lives it stays right, so a crash
                    # between the two leaves "not deleted", never an older value come back
                    for key in members:
                        self.inner.delete(key)
                with g.log.locked() as w:
                    replaced, records = w.new_records()
                    g.apply(records, replaced)
                    # a key whose newest record is damaged gets its tombstone too: once deleted,
                    # the damage hides nothing from any reader, not only from this one
                    doomed = list(dict.fromkeys(k for k in members if k in g.index or k in g.damaged))
                    for key in members:
                        g.damaged.pop(key, None)
                    g.memo = None
                    everything = sum(k in g.index for k in doomed) == len(g.index)
                    if doomed and everything and g.uncertain < 0 and not g.damaged:
                        g.log.remove()  # nothing stays live: the file goes
                        g.apply([], True)
                    elif doomed:
                        tombstones = [_record(_DEL, k) for k in doomed]
                        g.apply(zip(w.append(tombstones), tombstones, strict=True), False)
                        if g.dead > max(g.live, COMPACT_MIN_DEAD):
                            self._compact(g)

    def _compact(self, g: _Group) -> None:
        """Rewrite the log with only live records; called inside its locked() block.

        Not while the log holds damage: the rewrite would drop the evidence and make what the
        damaged record hid (a newer value, a delete) permanently wrong instead of reported.
        """
        if g.log.damaged:
            logger.warning("%s: not compacted: it holds damaged records (see `ckptfs verify`)", g.log.path)
            return
        live = sorted(g.index.items(), key=lambda item: item[1][0])
        payloads = [g.log.read(entry[0], _record_len(key, entry[1])) for key, entry in live]
        before = g.live + g.dead
        g.apply(zip(g.log.rewrite(payloads), payloads, strict=True), True)
        logger.info("%s: compacted %d bytes of records to %d", g.log.path, before, g.live)

    # ------------------------------------------------------------------------------- reads

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        group = self._grouped(key)
        if group is None:
            return self.inner.get_with_etag(key)
        for _ in range(3):  # another process can rewrite the file between our index and the read
            with self._held(group) as g:
                g.sync()
                g.check_readable(key)
                hit = g.index.get(key)
                if hit is None:
                    break
                try:
                    payload = g.log.read(hit[0], _record_len(key, hit[1]))
                except FileNotFoundError:
                    continue
            op, found, start = _parse(payload, f"{g.log.path}@{hit[0]}")
            if op == _PUT and found == key:
                return payload[start:], hit[2]
        else:
            raise CorruptFileError(key, "its log kept changing under the read")
        return self.inner.get_with_etag(key)

    def newest(self, prefix: str, beside: Callable[[str], str] | None = None, *, current: bool = False
               ) -> tuple[str, bytes, list[str]] | None:
        """The greatest key under `prefix`, its bytes and the keys under `beside(key)` (None: no
        key there): `list(prefix)[-1]`, `get` and `list(beside(key))` in one look at the group's
        log when only the log is in its directory.

        For readers that want the latest of keys named in time order and what is filed under
        it (LangGraph's `get_tuple`: a thread's newest checkpoint and its pending writes): a
        bisection of the index and one pread, not a listing of every key then two more
        catch-ups with the file. FileNotFoundError when the key went between the listing and
        the read (possible only on the fallback path, with a loose file).

        CorruptFileError, naming the log and the byte, when damage may make the answer wrong:
        a damaged record of a key under `prefix` from the answer's key on (its only record, or
        one newer than the one indexed), of a key under `beside(key)`, or one whose key is
        unreadable written after the answer's record (`_Group.hidden`). An older state served
        as the newest is the one wrong answer a checkpoint reader must never get; a log with no
        damage pays one truth test for this.

        `current`: the caller knows that nobody else has written the group since this object's
        last look at it with `current` False (it held the group's one-writer lease all along,
        and no other object writes it in the process): the two stats that look for others'
        appends and for plain files are skipped when that look found only the log (a look
        either compares a settled directory stamp or lists the directory, so it is true then
        even in the "racy" tick after the directory changed, when only a listing would do).
        They are most of a warm read's cost beside the deserialisation; SQLite's reads make no
        syscall at all.
        """
        group = self.group_of(prefix)
        if group is not None and prefix.startswith(group):
            for _ in range(3):  # another process can rewrite the file between our index and the read
                with self._held(group) as g:
                    if not (current and g.synced and not g.loose):
                        g.sync()
                        if not g.only_log():
                            break  # plain files may be there too: list them (below)
                    memo = g.memo
                    if memo is not None and memo[0] == prefix and (
                            None if beside is None else beside(memo[2])) == memo[1]:
                        return memo[2], memo[3], list(memo[4])  # bytes are immutable; the list is a copy
                    key = g.last_under(prefix)
                    near = None if beside is None or key is None else beside(key)
                    if g.damaged or g.uncertain >= 0:
                        hidden = g.hidden(prefix, key, near)
                        if hidden is not None:
                            raise hidden
                    if key is None:
                        return None
                    hit = g.index[key]
                    under = [] if near is None else g.keys_under(near)
                    try:
                        payload = g.log.read(hit[0], _record_len(key, hit[1]))
                    except FileNotFoundError:
                        continue
                    # the record the index names (the view is the file the index was built
                    # from): its key is compared as bytes, not parsed and validated again
                    head = _record(_PUT, key)
                    if payload.startswith(head):
                        data = payload[len(head):]
                        g.memo = (prefix, near, key, data, under)
                        return key, data, list(under)
        keys = self.list(prefix)
        last = keys[-1] if keys else None
        if group is not None and prefix.startswith(group):
            with self._held(group) as g:  # plain files beside the log: its damage counts all the same
                g.sync()
                hidden = g.hidden(prefix, last, None if beside is None or last is None else beside(last))
            if hidden is not None:
                raise hidden
        if last is None:
            return None
        return last, self.get(last), [] if beside is None else self.list(beside(last))

    def damage(self, prefix: str, ranked: str | None = None, *, sync: bool = True) -> list[Damage]:
        """The damaged records of the log of `prefix`'s group that may hide a key's newest
        record: those of keys under `prefix` (their only record, or one newer than the one
        indexed), and the last one whose key is unreadable, with (`Damage.after`) the greatest
        key under `ranked` (default: `prefix`) written before it. Empty for keys outside groups
        and for a log without damage (the common case: one look at the index).

        For readers that must not skip silently what damage hid, as a listing does (LangGraph's
        `list`: a checkpoint missing from a history is a wrong answer too). `sync=False`: as the
        log was at the last look (of a read or listing just made, whose answer the damage is
        weighed against), without looking at the file again; a group never looked at is read.
        """
        group = self.group_of(prefix)
        if group is None or not prefix.startswith(group):
            return []
        if not sync:
            g = self._groups.get(group)  # a peek without the locks: what the last look left there
            if g is not None and g.synced and not g.closed and not g.damaged and g.uncertain < 0:
                return []
        with self._held(group) as g:
            if sync or not g.synced:
                g.sync()
            out = [Damage(g.log.path, offset, key) for key, offset in sorted(g.damaged.items())
                   if key.startswith(prefix) and (key not in g.index or g.index[key][0] < offset)]
            if g.uncertain >= 0:
                out.append(Damage(g.log.path, g.uncertain, None,
                                  g.written_before(g.uncertain, prefix if ranked is None else ranked)))
        return out

    def size(self, key: str) -> int:
        group = self._grouped(key)
        if group is not None:
            with self._held(group) as g:
                g.sync()
                g.check_readable(key)
                hit = g.index.get(key)
            if hit is not None:
                return hit[1]
        return self.inner.size(key)

    def modified(self, key: str) -> float:
        return self.inner.modified(self._dated(key))

    def modified_and_now(self, key: str) -> tuple[float, float | None]:
        return self.inner.modified_and_now(self._dated(key))

    def _dated(self, key: str) -> str:
        """The file whose time is `key`'s: a live record's is its log's."""
        group = self._grouped(key)
        if group is not None and key in self._live_keys(group):
            return group + LOG_NAME
        return key

    def touch(self, key: str) -> None:
        if self._grouped(key):
            raise NotImplementedError("records in a log have no modification time of their own")
        self.inner.touch(key)

    def open_read(self, key: str) -> IO[bytes]:
        if not self._grouped(key):
            return self.inner.open_read(key)
        return io.BytesIO(self.get(key))

    def _live_keys(self, group: str) -> list[str]:
        with self._held(group) as g:
            g.sync()
            return list(g.index)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        group = self.group_of(prefix)
        if group is not None:
            with self._held(group) as g:
                g.sync()
                if g.only_log():
                    keys = g.keys_under(prefix)  # only the log there: no walk (see _scan_loose)
                else:
                    keys = sorted(set(g.keys_under(prefix)).union(
                        k for k in self._scan_loose(g) if k.startswith(prefix)))
            if start_after is not None:
                keys = keys[bisect.bisect_right(keys, start_after):]
            return keys
        out: set[str] = set()
        inner = self.inner.list(group if group is not None else prefix)
        if group is not None:
            out.update(self._live_keys(group))
        for key in inner:
            head = key.rpartition("/")[0]
            if key.endswith("/" + LOG_NAME) and self.group_of(head + "/") is not None:
                if group is None:
                    out.update(self._live_keys(head + "/"))
            elif not self._is_log_file(key):
                out.add(key)
        keys = sorted(k for k in out if k.startswith(prefix))
        return keys if start_after is None else [k for k in keys if k > start_after]

    def list_dirs(self, prefix: str) -> Keys:
        folder = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        if self.group_of(folder) is None:
            return self.inner.list_dirs(prefix)
        return sorted({k[len(folder):].split("/", 1)[0] for k in self.list(folder) if "/" in k[len(folder):]})

    def check(self) -> None:
        self.inner.check()

    def check_writable(self) -> None:
        self.inner.check_writable()

    def local_root(self) -> str:
        return self.inner.local_root()

    def location(self) -> tuple[str, str] | None:
        return self.inner.location()

    def close(self) -> None:
        """Close the open logs; the storage stays usable (callers in flight look groups up again)."""
        with self._lock:
            groups, self._groups = list(self._groups.values()), OrderedDict()
        for g in groups:
            with g.lock:
                g.closed = True
                g.log.close()
        self.inner.close()
