"""Local disk with real durability: write a file unseen, fsync it, publish it without replacing
(linkat of an O_TMPFILE inode, or rename of a temp file), fsync the directory."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import logging
import os
import secrets
import stat
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

from ckptfs.errors import StorageUnavailableError, StoreNotWritableError, UnreadableFileError, name_cut
from ckptfs.storage.base import TEMP_MARKER, Capabilities, Keys, PreconditionFailed, Storage, check_key
from ckptfs.storage.fs import (
    DENIED,
    DIR_FLAGS,
    MAX_DEPTH,
    REFUSED,
    RENAME_NOREPLACE,
    RENAMEAT2,
    LinkRefused,
    NotRegular,
    entry_kind,
    key_name,
    lstat_mode,
    open_dir_beneath,
    open_regular,
    os_name,
    read_bounded,
)

logger = logging.getLogger(__name__)
_FLUSH_STEP = 1024 * 1024
_Stack = list[tuple[int, Iterator[str], str]]  # spelled here: inside the class, `list` is a method
# An exclusive create links an O_TMPFILE inode in through its /proc fd link (linkat with
# AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH). Without either, or where the filesystem
# refuses O_TMPFILE (EOPNOTSUPP; EISDIR from a kernel that predates it), a named temp file.
_PROC_FD = "/proc/self/fd"
_TMPFILE_OK = hasattr(os, "O_TMPFILE") and os.path.isdir(_PROC_FD)
_NO_TMPFILE = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


def _named(exc: OSError, key: str) -> OSError:
    """`exc` naming the key, not the "." or /proc path the call was made with."""
    return OSError(exc.errno, exc.strerror, key)


def _names_a_path(exc: OSError) -> bool:
    """Whether `exc` is about the root's path or a folder made on the way to it: the only calls
    made with a whole path. Below the root each is made beside a directory fd with one name."""
    return isinstance(exc.filename, str) and os.path.isabs(exc.filename)


class _Unlinked(Exception):
    """An anonymous inode could not be linked in because /proc/self/fd is gone: nothing is
    stored, and the write can go again as a named temp."""


class _Staged(NamedTuple):
    """A written, fsynced file not yet in its directory (LocalStorage._write_temp)."""

    fd: int  # an anonymous O_TMPFILE inode, still open; -1 for a named temp
    tmp: str  # the named temp; "" for an anonymous inode
    etag: str


class LocalStorage(Storage):
    """Local disk with real durability: fsync the file and its directory before returning.

    Exclusive create (every journal record, snapshot and artifact) writes an anonymous
    O_TMPFILE inode in the target's directory and links it in with `linkat`, which refuses an
    existing name atomically; a crash before the link leaves nothing. Where the filesystem
    cannot, and for an overwrite, a temp file named `.<name>.tmp-<random>` in that directory
    is renamed: `renameat2(RENAME_NOREPLACE)` (else `link` + `unlink`) for exclusive create,
    `rename` for overwrite. `ckptfs verify` reports any temp file a crash leaves behind.
    Compare-and-swap holds an `flock` on the directory, so it is atomic only among ckptfs
    writers (documented in backends/local/README.md).

    Only regular files inside the root are read or written (DESIGN.md). Every operation walks
    the key from an fd of the root with openat(O_NOFOLLOW) (`open_dir_beneath`), and creates,
    renames, unlinks and fsyncs relative to the directory's fd, so a link below the root is
    never followed for a read, a write or a delete, and nothing stays cached that a removed or
    replaced directory could make stale (a walk costs a few microseconds beside a commit's
    fsyncs; see the Storage contract for what each operation does with links and special files).
    The root itself may be a link; it is opened by its path each time.
    """

    capabilities = Capabilities(
        atomic_put=True, exclusive_create=True, conditional_put=True, durable=True, shared=True
    )

    def __init__(self, url: str, root: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        self.root = os.path.abspath(os_name(root))  # a file:// URL's root is UTF-8 too
        self.fsync = bool(self.options.get("fsync", True))
        self._use_renameat2 = RENAMEAT2 is not None
        self._use_tmpfile = _TMPFILE_OK
        self._tmp_prefix = secrets.token_hex(4)
        self._tmp_seq = itertools.count()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *os_name(check_key(key)).split("/"))

    @staticmethod
    def _split(key: str) -> tuple[list[str], str]:
        """The key's directories and file name, as the OS calls take them (`os_name`)."""
        parts = os_name(check_key(key)).split("/")
        return parts[:-1], parts[-1]

    def local_path(self, key: str) -> str:
        """The file a key is stored in (for layers that manage their own files, e.g. logstore).

        The directories on the way that exist are checked now to be real directories, so the
        path handed out does not lead out of the store through a link (UnreadableFileError if
        one does); such layers open the file itself with O_NOFOLLOW and create directories
        with `make_dirs(..., root=storage.root)`.
        """
        dirs, _name = self._split(key)
        try:
            os.close(open_dir_beneath(self.root, dirs))
        except LinkRefused as exc:
            raise UnreadableFileError(key, exc.reason) from None
        except OSError:
            pass  # not there yet (made later, beneath the root) or not ours to judge: the open says
        return self._path(key)

    # ------------------------------------------------------------------ errors, in words

    def _not_writable(self, key: str, why: str, change: str = "write") -> StoreNotWritableError:
        return StoreNotWritableError(f"{self.display_name}: cannot {change} {key}: {why}")

    def _write_error(self, key: str, exc: OSError | LinkRefused, change: str = "write") -> Exception:
        """The domain error for a failed change of `key`: a read-only store or a link is one
        clear line. `change` is the verb it says, "write" or "delete": a delete refused in a
        read-only folder said "cannot write", which is not what was tried."""
        if isinstance(exc, LinkRefused):
            return self._not_writable(key, exc.reason, change)
        if exc.errno in DENIED:
            return self._not_writable(key, f"{exc.strerror} (a read-only store or filesystem, or "
                                           "not this user's?)", change)
        if exc.errno == errno.EISDIR:
            return self._not_writable(key, "a directory is in the way", change)
        if exc.errno == errno.ENOTDIR:
            where = name_cut(exc.filename) if _names_a_path(exc) else exc.filename or key
            return StorageUnavailableError(f"{self.display_name}: {exc.strerror}: {where}")
        return self._root_error(exc)

    def _root_error(self, exc: OSError) -> OSError:
        """`exc`, unless it is about the root's own path (opening or making it, see
        `_names_a_path`): then the store was not reached at all, a StorageUnavailableError
        naming it as every message does. The OS's error quoted the path whole: a root that is a
        link loop was "unexpected OSError", exit 3, in a line as long as the path. A full disk
        and a missing root (a dangling link: a mirror names it as its destination's) keep their
        type and errno (callers tell them by those), the path cut to the store's name."""
        if not _names_a_path(exc):
            return exc
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOENT):
            return _named(exc, self.display_name)
        return StorageUnavailableError(f"{self.display_name}: {exc.strerror}")

    def _read_error(self, key: str, exc: OSError | LinkRefused | NotRegular, dir_fd: int = -1,
                    name: str = "") -> Exception:
        """The error for a failed read: absent stays FileNotFoundError; whatever we must not
        or cannot read becomes UnreadableFileError (a CorruptFileError: skipped, with a warning)."""
        if isinstance(exc, LinkRefused):
            return UnreadableFileError(key, f"not read: {exc.reason}")
        if isinstance(exc, NotRegular):
            if stat.S_ISDIR(exc.mode):
                return FileNotFoundError(errno.ENOENT, "a directory, not an object", key)
            return UnreadableFileError(key, f"not read: it is {entry_kind(exc.mode)}; only regular "
                                            "files are read")
        if isinstance(exc, FileNotFoundError):
            return FileNotFoundError(errno.ENOENT, "no such object", key)
        if exc.errno == errno.ELOOP:
            return UnreadableFileError(key, "not read: it is a symbolic link, and links below the "
                                            "store root are never followed")
        if exc.errno in DENIED:
            return UnreadableFileError(key, f"cannot be read: {exc.strerror}")
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
            mode = lstat_mode(dir_fd, name) if dir_fd >= 0 else None
            what = entry_kind(mode) if mode else "a special file"
            return UnreadableFileError(key, f"not read: it is {what}")
        return self._root_error(exc)

    # ------------------------------------------------------------------------ walking

    def _dir_for_read(self, key: str) -> tuple[int, str]:
        """The fd of the key's directory (the caller closes it) and the file's name."""
        dirs, name = self._split(key)
        try:
            return open_dir_beneath(self.root, dirs), name
        except (OSError, LinkRefused) as exc:
            raise self._read_error(key, exc) from None

    def _dir_for_write(self, key: str) -> tuple[int, str]:
        """The fd of the key's directory, created (durably) beneath the root if missing."""
        dirs, name = self._split(key)
        try:
            return open_dir_beneath(self.root, dirs, create=True, fsync=self.fsync), name
        except (OSError, LinkRefused) as exc:
            raise self._write_error(key, exc) from None

    def _open_read(self, key: str) -> tuple[int, os.stat_result]:
        """(fd, fstat) of the regular file at `key`; every refusal mapped (see `_read_error`)."""
        dfd, name = self._dir_for_read(key)
        try:
            return open_regular(dfd, name)
        except (OSError, NotRegular) as exc:
            raise self._read_error(key, exc, dfd, name) from None
        finally:
            os.close(dfd)

    def _lstat(self, key: str) -> os.stat_result:
        """The entry at `key` itself (a link is not followed); a directory counts as absent."""
        dfd, name = self._dir_for_read(key)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError as exc:
            raise self._read_error(key, exc) from None
        finally:
            os.close(dfd)
        if stat.S_ISDIR(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "a directory, not an object", key)
        return st

    # ------------------------------------------------------------------------ writing

    def _fsync_fd(self, dir_fd: int) -> None:
        if self.fsync:
            os.fsync(dir_fd)

    def _etag(self, st: os.stat_result) -> str:
        return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"

    def _write_temp(self, dir_fd: int, name: str, key: str, writer: Any, *,
                    anonymous: bool = False) -> _Staged:
        """Write a file for `name` in `dir_fd`, fsync it, and return it staged, not yet published.

        `anonymous` (an exclusive create): an O_TMPFILE inode with no name at all, linked in
        by `_commit`. Nothing of it is ever visible before it is whole, a crash leaves nothing
        behind (the filesystem drops an unlinked inode), and the publish is one linkat instead
        of a rename: about 50 us of a commit's 400-700 on ext4 here (benchmarks/scale.py shows
        both floors). Where the filesystem or /proc cannot do it, a named temp beside `name`.

        The etag comes from fstat of what we wrote, before it is published: a rename keeps the
        inode and times, and once published another process may already have replaced or
        deleted it (retention of a shared run), which must not fail a write that succeeded.
        """
        fd = -1
        tmp = ""
        if anonymous and self._use_tmpfile:
            try:
                fd = os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno not in _NO_TMPFILE:
                    raise self._write_error(key, _named(exc, key)) from None
                self._use_tmpfile = False  # this filesystem cannot: named temps from now on
        if fd < 0:
            # unique without a uuid per write: this store's random prefix and a counter
            # (O_EXCL refuses a clash anyway); a commit is a few hundred microseconds
            tmp = f".{name}{TEMP_MARKER}{self._tmp_prefix}{next(self._tmp_seq):x}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise self._write_error(key, exc) from None
        try:
            writer(fd)
            if self.fsync:
                os.fsync(fd)
            etag = self._etag(os.fstat(fd))
        except BaseException:
            os.close(fd)
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
            raise
        if tmp:
            os.close(fd)
            fd = -1
        return _Staged(fd, tmp, etag)

    def _commit(self, dir_fd: int, staged: _Staged, name: str, key: str, exclusive: bool) -> None:
        """Publish `staged` as `name` in `dir_fd` (and close it); then fsync the directory.

        linkat/renameat/renameat2 create or replace the entry itself: a link already at
        `name` is replaced (overwrite) or counts as taken (exclusive), never written through.
        """
        if staged.fd >= 0:  # an anonymous inode (exclusive): linkat refuses a taken name
            try:
                os.link(f"{_PROC_FD}/{staged.fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
            except FileExistsError:
                raise
            except OSError as exc:
                if not os.path.isdir(_PROC_FD):
                    self._use_tmpfile = False  # /proc went away: named temps from now on
                    raise _Unlinked(key) from None
                raise self._write_error(key, _named(exc, key)) from None
            finally:
                os.close(staged.fd)
            self._fsync_fd(dir_fd)
            return
        tmp = staged.tmp
        try:
            if not exclusive:
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            elif self._use_renameat2:
                rc = RENAMEAT2(dir_fd, os.fsencode(tmp), dir_fd, os.fsencode(name),
                                RENAME_NOREPLACE)
                if rc != 0:
                    err = ctypes.get_errno()
                    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                        self._use_renameat2 = False  # filesystem lacks it: link from now on
                        self._commit(dir_fd, staged, name, key, exclusive)
                        return
                    raise OSError(err, os.strerror(err), key)
            else:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                os.unlink(tmp, dir_fd=dir_fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
                raise self._write_error(key, exc) from None
            raise
        self._fsync_fd(dir_fd)

    def _write_all(self, fd: int, data: bytes | memoryview) -> None:
        """Write; a large body is flushed to disk 1 MiB at a time as it goes.

        A single fsync of many megabytes makes every other fsync on the filesystem wait
        behind it (the journal commits in order), so a background snapshot would stall the
        small commits running beside it. Flushing in steps bounds that wait: in an experiment
        with plain os calls, a small commit's p99 beside a 5 MB writer fell from ~10 ms to ~6 ms.
        """
        view = memoryview(data)
        step = _FLUSH_STEP if self.fsync else max(len(view), 1)
        for off in range(0, len(view), step):
            part = view[off : off + step]
            while part:
                part = part[os.write(fd, part):]
            if self.fsync and len(view) > _FLUSH_STEP:
                os.fdatasync(fd)

    def put(self, key: str, data: bytes) -> str:
        return self._put(key, lambda fd: self._write_all(fd, data), exclusive=False)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._put(key, lambda fd: self._write_all(fd, data), exclusive=True)

    def _put(self, key: str, writer: Any, exclusive: bool, *, again: bool = True) -> str:
        dfd, name = self._dir_for_write(key)
        try:
            return self._write_and_publish(dfd, name, key, writer, exclusive, again)
        finally:
            os.close(dfd)

    def _write_and_publish(self, dfd: int, name: str, key: str, writer: Any, exclusive: bool,
                           again: bool = True) -> str:
        """`_write_temp` then `_commit`; the etag. `again`: the writer can run twice (it holds
        its bytes), so an anonymous inode that could not be linked is written once more as a
        named temp; a stream cannot be read twice and is refused."""
        try:
            staged = self._write_temp(dfd, name, key, writer, anonymous=exclusive)
            self._commit(dfd, staged, name, key, exclusive=exclusive)
        except _Unlinked:
            if not again:
                raise self._not_writable(key, f"{_PROC_FD} went away during the write, so it "
                                         "could not be linked in; nothing was stored, write it "
                                         "again") from None
            staged = self._write_temp(dfd, name, key, writer)
            self._commit(dfd, staged, name, key, exclusive=exclusive)
        return staged.etag

    def put_if_absent_beside(self, key: str, data: bytes, witness: str) -> bool:
        dirs, name = self._split(key)
        wdirs, wname = self._split(witness)
        if wdirs != dirs:
            return super().put_if_absent_beside(key, data, witness)
        dfd, name = self._dir_for_write(key)
        try:
            self._write_and_publish(dfd, name, key, lambda fd: self._write_all(fd, data), True)
            try:
                st = os.stat(wname, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            except OSError:
                st = None
        finally:
            os.close(dfd)
        if st is not None and stat.S_ISREG(st.st_mode):
            return True
        return self.exists(witness)  # anything but a regular file: exactly what `exists` says

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        import fcntl

        dfd, name = self._dir_for_write(key)
        try:
            staged = self._write_temp(dfd, name, key, lambda fd: self._write_all(fd, data))
            tmp = staged.tmp
            fcntl.flock(dfd, fcntl.LOCK_EX)  # released when dfd is closed
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                os.unlink(tmp, dir_fd=dfd)
                raise FileNotFoundError(errno.ENOENT, "no such object", key) from None
            current = self._etag(st)
            if current != etag or not stat.S_ISREG(st.st_mode):
                os.unlink(tmp, dir_fd=dfd)
                raise PreconditionFailed(f"{key}: etag is {current}, expected {etag}")
            self._commit(dfd, staged, name, key, exclusive=False)
            return self._etag(os.stat(name, dir_fd=dfd, follow_symlinks=False))
        finally:
            os.close(dfd)

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        def copy(fd: int) -> None:
            while chunk := src.read(_FLUSH_STEP):
                self._write_all(fd, chunk)
                if self.fsync:
                    os.fdatasync(fd)  # bounded flushes, as in _write_all

        self._put(key, copy, exclusive=exclusive, again=False)

    def delete(self, key: str) -> None:
        """Unlink the entry itself (unlinkat: a link is removed, never what it points at).

        A key reached through a link below the root is not in this store: nothing is deleted
        (logged). A directory at the key is no object: left alone (logged).
        """
        self.delete_many([key])

    def delete_many(self, keys: Sequence[str]) -> None:
        """`delete` for each key in order, one directory open and one fsync per run of keys in
        the same directory: retention removing a thousand records costs one directory flush,
        not a thousand beside the committing writer's own."""
        i = 0
        while i < len(keys):
            dirs, _ = self._split(keys[i])
            j = i + 1
            while j < len(keys) and self._split(keys[j])[0] == dirs:
                j += 1
            self._unlink_in(dirs, keys[i:j])
            i = j

    def _unlink_in(self, dirs: list[str], keys: Sequence[str]) -> None:
        try:
            dfd = open_dir_beneath(self.root, dirs)
        except FileNotFoundError:
            return
        except LinkRefused as exc:
            logger.warning("%s: not deleting %s: %s", self.display_name, ", ".join(keys[:3]), exc.reason)
            return
        except OSError as exc:
            raise self._write_error(keys[0], exc, "delete") from None
        try:
            removed = False
            for key in keys:
                name = self._split(key)[1]
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    continue
                except IsADirectoryError:
                    logger.warning("%s: not deleting %s: it is a directory", self.display_name, key)
                    continue
                except OSError as exc:
                    if exc.errno == errno.EPERM and stat.S_ISDIR(lstat_mode(dfd, name) or 0):
                        logger.warning("%s: not deleting %s: it is a directory", self.display_name, key)
                        continue
                    raise self._write_error(key, exc, "delete") from None
                removed = True
            if removed:
                self._fsync_fd(dfd)
        finally:
            os.close(dfd)

    def touch(self, key: str) -> None:
        dfd, name = self._dir_for_read(key)
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError as exc:
                raise self._read_error(key, exc) from None
            if not stat.S_ISREG(st.st_mode):
                raise self._read_error(key, NotRegular(st.st_mode))
            try:
                os.utime(name, dir_fd=dfd, follow_symlinks=False)
            except OSError as exc:
                raise self._write_error(key, exc) from None
        finally:
            os.close(dfd)

    # ------------------------------------------------------------------------ reading

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        fd, st = self._open_read(key)
        try:
            data = read_bounded(fd, st.st_size)
        finally:
            os.close(fd)
        if len(data) > st.st_size:
            raise UnreadableFileError(key, f"grew past the {st.st_size} bytes it had when opened "
                                           "(our files never change once named)")
        return data, self._etag(st)

    def open_read(self, key: str) -> IO[bytes]:
        fd, _st = self._open_read(key)
        return os.fdopen(fd, "rb")

    def size(self, key: str) -> int:
        """Size of the regular file at `key`; UnreadableFileError for any other entry (as `get`)."""
        st = self._lstat(key)
        if not stat.S_ISREG(st.st_mode):
            raise self._read_error(key, NotRegular(st.st_mode))
        return st.st_size

    def modified(self, key: str) -> float:
        """The entry's own modification time, whatever it is (lstat: a link is not followed),
        so retention can age out entries it will not read."""
        return self._lstat(key).st_mtime

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Sorted keys under `prefix`: every entry that is not a directory (links and special
        files included, so verify can report them), descending only into real directories."""
        stripped = prefix.rstrip("/")
        parts = os_name(check_key(stripped)).split("/") if stripped else []
        try:
            fd = open_dir_beneath(self.root, parts)
        except FileNotFoundError:
            return []
        except LinkRefused as exc:
            # the prefix itself is a file (it lists as itself, as a key would) or a link (which
            # lists as itself only where its parent is listed: it is no directory of ours)
            if exc.where == stripped and not prefix.endswith("/") and exc.mode is not None \
                    and stat.S_ISREG(exc.mode):
                return [prefix]
            return []
        except PermissionError as exc:
            raise StorageUnavailableError(f"{self.display_name}: cannot list {prefix!r}: "
                                          f"{exc.strerror}") from None
        except NotADirectoryError:
            raise StorageUnavailableError(f"{self.display_name}: not a directory") from None
        except OSError as exc:
            raise self._root_error(exc) from None
        out: list[str] = []
        self._walk(fd, "/".join(parts) + "/" if parts else "", out)
        out = [key_name(k) for k in out]
        out.sort()
        if start_after is not None:
            out = [k for k in out if k > start_after]
        return out

    def _scan(self, fd: int, rel: str, out: Keys) -> Keys:
        """Append the non-directory entries of `fd` to `out`; return its subdirectories' names."""
        subdirs: Keys = []
        with os.scandir(fd) as it:
            for e in it:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    subdirs.append(e.name)
                else:
                    out.append(rel + e.name)
        return subdirs

    def _walk(self, top: int, top_rel: str, out: Keys) -> None:
        """Depth-first below `top` (closed here), one open fd per level, without recursion."""
        stack: _Stack = []
        try:
            subdirs = self._scan(top, top_rel, out)
        except BaseException:
            os.close(top)
            raise
        stack.append((top, iter(subdirs), top_rel))
        try:
            while stack:
                fd, names, rel = stack[-1]
                name = next(names, None)
                if name is None:
                    stack.pop()
                    os.close(fd)
                    continue
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue  # removed since the scan
                except OSError as exc:
                    if exc.errno in REFUSED:
                        out.append(rel + name)  # turned into a link or a file since the scan
                    else:
                        logger.warning("%s: cannot list %s%s/: %s", self.display_name, rel, name,
                                       exc.strerror)
                    continue
                if len(stack) >= MAX_DEPTH:
                    os.close(sub)
                    logger.warning("%s: not listing below %s%s/: deeper than %d levels",
                                   self.display_name, rel, name, MAX_DEPTH)
                    continue
                try:
                    subdirs = self._scan(sub, f"{rel}{name}/", out)
                except BaseException:
                    os.close(sub)
                    raise
                stack.append((sub, iter(subdirs), f"{rel}{name}/"))
        finally:
            for fd, _names, _rel in stack:
                os.close(fd)

    def list_dirs(self, prefix: str) -> Keys:
        """Real directories directly under `prefix`; a link to a directory is none of ours."""
        stripped = prefix.rstrip("/")
        try:
            fd = open_dir_beneath(self.root, os_name(check_key(stripped)).split("/") if stripped else [])
        except (FileNotFoundError, NotADirectoryError, LinkRefused):
            return []
        except PermissionError as exc:
            raise StorageUnavailableError(f"{self.display_name}: cannot list {prefix!r}: "
                                          f"{exc.strerror}") from None
        except OSError as exc:
            raise self._root_error(exc) from None
        try:
            with os.scandir(fd) as it:
                return sorted(key_name(e.name) for e in it if e.is_dir(follow_symlinks=False))
        finally:
            os.close(fd)

    def check(self) -> None:
        """The root is a directory this user can read; a store that does not exist yet needs a
        writable parent to be created in. Writing is not required: reading (verify, runs,
        show, a restore's source) works on a read-only store, and a write there fails with
        StoreNotWritableError naming the store and the key."""
        if os.path.exists(self.root):
            if not os.path.isdir(self.root):
                raise StorageUnavailableError(f"{self.display_name}: not a directory")
            if not os.access(self.root, os.R_OK | os.X_OK):
                raise StorageUnavailableError(f"{self.display_name}: no read permission on "
                                              f"{name_cut(self.root)}")
            return
        parent = self.root
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise StorageUnavailableError(f"{self.display_name}: does not exist, and there is no "
                                          f"write permission on {name_cut(parent)} to create it")

    def local_root(self) -> str:
        return os.path.realpath(self.root)

    def check_writable(self) -> None:
        """An existing root this user cannot write in (permission bits, a read-only mount):
        access(2) answers both without writing a byte. A root still to be made is `check`'s."""
        if os.path.isdir(self.root) and not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreNotWritableError(f"{self.display_name}: no write permission on "
                                        f"{name_cut(self.root)} (a read-only directory or "
                                        "filesystem, or not this user's?)")


# --------------------------------------------------------------------------------- fsspec


