"""POSIX primitives local disk needs: durable directory changes, and never leaving the root.

`fsync_dir` and `make_dirs` make a create, rename or unlink durable (a file fsync'd in a
directory whose own entry was never synced can vanish in a crash). `open_dir_beneath` walks a
key's directories from the store root's fd with O_NOFOLLOW, so a link below the root stops the
walk instead of leading out of the store, and `open_regular` / `read_bounded` read only regular
files, at most the size they had when opened. Used by `LocalStorage` and the record log.
`path_within` tells whether a path lies in a directory, by any spelling.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any


def _load_renameat2() -> Any:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


RENAMEAT2 = _load_renameat2()
# Keys are UTF-8 on disk whatever the locale. Python names files in its filesystem encoding:
# under `LC_ALL=C PYTHONUTF8=0` (ascii) a run "résumé" written from a UTF-8 shell listed as
# "r\udcc3\udca9sum\udcc3\udca9", and every command read that healthy run as corrupt.
_UTF8_NAMES = codecs.lookup(sys.getfilesystemencoding()).name == "utf-8"


def os_name(name: str) -> str:
    """A key (or part of one) as the OS calls take it: its UTF-8 bytes, in the locale's str."""
    return name if _UTF8_NAMES else os.fsdecode(name.encode("utf-8", "surrogateescape"))


def key_name(name: str) -> str:
    """A name the OS gave back (from `os_name`, a listing) as the key it stands for."""
    return name if _UTF8_NAMES else os.fsencode(name).decode("utf-8", "surrogateescape")
AT_FDCWD = -100
RENAME_NOREPLACE = 1


def fsync_dir(d: str, enabled: bool = True) -> None:
    """Make a directory's entries (a create, rename or unlink in it) durable."""
    if not enabled:
        return
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(d: str, fsync: bool = True, *, root: str | None = None) -> None:
    """Create `d` and missing parents, each made durable by an fsync of its own parent: a file
    fsync'd inside a directory whose own entry was never synced can vanish in a crash.

    With `root`, `d` must lie inside it and everything below `root` is created and walked with
    `open_dir_beneath` (no link below the root is followed: `LinkRefused` instead). Without it,
    the path is taken as the user gave it, links included: that is for a store's root itself.
    """
    if root is not None:
        rel = os.path.relpath(d, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and parts[0] == os.pardir:
            raise ValueError(f"{d!r} is not inside {root!r}")
        os.close(open_dir_beneath(root, parts, create=True, fsync=fsync))
        return
    missing = []
    cur = d
    while not os.path.isdir(cur):
        missing.append(cur)
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    for m in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(m)
        fsync_dir(os.path.dirname(m), fsync)


# ------------------------------------------------------------------- never out of the root
#
# Every operation below the store root goes through a directory fd: the root is opened by
# its path (it may itself be a link: /var/lib/agent -> /data/agent is common and fine), then
# each key component with openat(O_DIRECTORY | O_NOFOLLOW) from its parent's fd, and the last
# one with O_NOFOLLOW too. A link anywhere below the root therefore stops the walk instead of
# leading out of the store, and no check-then-use window lets a link slip in between a check
# and the open: the kernel refuses the link at the moment of the open.

_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO opens at once instead of waiting forever for a writer (fstat then refuses
# it); O_NOCTTY: a terminal device never becomes our controlling terminal. Neither changes how
# a regular file reads.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
REFUSED = (errno.ELOOP, errno.ENOTDIR)  # what O_NOFOLLOW / O_DIRECTORY say of a link or a file
DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
MAX_DEPTH = 64  # far deeper than any layout of ours; bounds the fds a hostile tree can cost


class LinkRefused(Exception):
    """A component below the store root is a symbolic link, or not a directory: not followed.

    `where` is that component's path relative to the root, `mode` its lstat mode (None when it
    could not be told), `reason` a sentence for messages. Not an OSError on purpose, so no
    `except OSError` written for ordinary failures swallows it; LocalStorage maps it to a domain
    error (UnreadableFileError for reads, StoreNotWritableError for writes).
    """

    def __init__(self, where: str, mode: int | None) -> None:
        self.where = where
        self.mode = mode
        self.reason = (f"{where!r} is {entry_kind(mode)}, and links below the store root are "
                       "never followed" if mode is None or stat.S_ISLNK(mode)
                       else f"{where!r} is {entry_kind(mode)}, not a directory")
        super().__init__(self.reason)


def entry_kind(mode: int | None) -> str:
    """What a directory entry is, in words, for messages ("a symbolic link", "a FIFO", ...)."""
    if mode is None:
        return "a symbolic link or not a directory"
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def lstat_mode(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None


def _open_child_dir(dir_fd: int, name: str, where: str, create: bool, fsync: bool) -> int:
    """openat(name, O_DIRECTORY|O_NOFOLLOW); with `create`, mkdirat it first if missing (and fsync
    the parent, so the new entry survives a crash as the file later put in it must)."""
    for attempt in (0, 1):
        try:
            return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create or attempt:
                raise
        except OSError as exc:
            if exc.errno in REFUSED:
                raise LinkRefused(where, lstat_mode(dir_fd, name)) from None
            raise
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)  # mkdirat never follows a link: EEXIST on one
        except FileExistsError:
            pass  # a concurrent creator (fine), or a link, which the open then refuses
        else:
            if fsync:
                os.fsync(dir_fd)
    raise AssertionError("unreachable")


def open_dir_beneath(root: str, parts: Sequence[str], *, create: bool = False,
                     fsync: bool = True) -> int:
    """An O_DIRECTORY fd of `root/parts...`, reached one component at a time from an fd of the
    root, never through a link below it; the caller closes it.

    FileNotFoundError when a component is missing (unless `create`: then it is made, durably),
    LinkRefused when one is a link or not a directory. The root itself is opened by its path
    (created with `make_dirs` when missing and `create`): links there are the user's choice.
    """
    try:
        fd = os.open(root, _ROOT_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
        make_dirs(root, fsync)
        fd = os.open(root, _ROOT_FLAGS)
    try:
        for i, name in enumerate(parts):
            nfd = _open_child_dir(fd, name, "/".join(parts[: i + 1]), create, fsync)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(dir_fd: int | None, name: str, flags: int = READ_FLAGS,
                 mode: int = 0o644) -> tuple[int, os.stat_result]:
    """Open `name` (in `dir_fd`, or a path) and return (fd, fstat) only if it is a regular file.

    The open never follows a link (ELOOP) and never blocks on a FIFO; the fstat of what was
    opened (not a stat of the name before: no window for a swap) decides. Anything else is
    closed again and refused with `NotRegular`; the caller closes the fd it gets.
    """
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(st.st_mode)
    return fd, st


class NotRegular(Exception):
    """`open_regular` found something else than a regular file (see `mode`)."""

    def __init__(self, mode: int) -> None:
        self.mode = mode
        super().__init__(f"{entry_kind(mode)}, not a regular file")


def read_bounded(fd: int, size: int) -> bytes:
    """At most `size + 1` bytes from `fd`: what fstat said, plus one to notice growth.

    Bounded whatever the file is, so a name that grows while we read (not one of our files,
    which are immutable once named) can never make a read unbounded.
    """
    want = size + 1
    chunks: list[bytes] = []
    got = 0
    while got < want:
        chunk = os.read(fd, want - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def path_within(where: str, root: str) -> bool:
    """Whether the resolved path `where` is `root` or below it. Its directories are compared
    with the root itself (device and inode), not only by name: a bind mount, a second mount of
    the same volume or a case-insensitive file system reaches the same directory by another
    spelling. What writes a user's file (`export --output`) or a copy (mirror, restore) asks
    it, so as never to write among a store's own files."""
    if where == root or where.startswith(root.rstrip(os.sep) + os.sep):
        return True
    try:
        st = os.stat(root)
    except OSError:  # a root still to be made: no other spelling reaches it yet
        return False
    node = (st.st_dev, st.st_ino)
    path = where
    while True:
        with contextlib.suppress(OSError):
            here = os.stat(path)
            if (here.st_dev, here.st_ino) == node:
                return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
