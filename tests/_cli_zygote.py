"""A warm parent for the suite's `ckptfs` processes: forks one per command instead of starting an
interpreter and importing its libraries each time.

    python tests/_cli_zygote.py SOCKET SCRIPT

The suite runs the real `ckptfs` executable about 1,600 times, at ~0.4 s of CPU apiece on
2 cores (1.2 s for an S3 URL, which imports s3fs, aiobotocore and aiohttp): half of the
suite's CPU went on starting interpreters and importing the same modules. This process imports
them once, the third-party libraries and then every module of ckptfs, and for each request on
SOCKET forks a child. The child takes the caller's stdin/stdout/stderr, environment, working
folder, umask and arguments. It then runs SCRIPT, the console script pip wrote, as `__main__`,
as the interpreter would have. Each command is still a process of its own with its own exit
code, killed for real on a timeout. tests/_cli_fork.py is the caller's side, and it sends here
only what a fork cannot tell from a fresh interpreter (see `_cli_fork.forkable`).

A module imported here saw this process's environment, not the command's. ckptfs reads the
environment only when a command runs, never while it imports
(test_cli_fork_parity.test_importing_ckptfs_reads_no_environment holds it to that). The
third-party libraries' import-time reads are covered by the caller: a command whose
environment differs in them starts the real way.

One request: an 8-byte length with the caller's three descriptors attached (SCM_RIGHTS), then
that many bytes of JSON {argv, env, cwd, umask}. The answer: the command's pid (4 bytes, so the
caller can kill it), then its exit code as `subprocess` reports it (4 bytes, signed).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import struct
import sys
import threading

# The third-party and standard modules `ckptfs` commands import (2026-12-07: 700 modules in
# all, s3fs alone ~0.5 s on 2 cores), by the roots that pull in the rest; ckptfs's own after
# them (`ckptfs_modules`). A module missing here is imported by the child itself: slower,
# never different.
PRELOAD = [
    "argparse", "asyncio", "concurrent.futures", "ctypes.util", "dataclasses", "decimal",
    "email.utils", "fractions", "hashlib", "hmac", "http.client", "importlib.metadata", "json",
    "logging", "logging.handlers", "pathlib", "selectors", "shutil", "socket", "sqlite3", "ssl",
    "statistics", "subprocess", "tempfile", "tomllib", "urllib.parse", "uuid", "zoneinfo",
    "annotated_types", "typing_extensions", "pydantic", "pydantic_core", "pydantic.main",
    "pydantic.fields", "pydantic.types", "pydantic.functional_validators", "pydantic.json_schema",
    "msgspec", "zstandard", "rich", "rich.console", "rich.table", "rich.text", "rich.progress",
    "rich.markup", "rich.panel", "rich.logging", "rich.highlighter", "fsspec",
    "fsspec.implementations.local", "fsspec.implementations.memory", "s3fs", "aiobotocore",
    "aiobotocore.session", "aiobotocore.client", "aiobotocore.endpoint", "botocore.session",
    "botocore.client", "botocore.exceptions", "botocore.config", "aiohttp", "apscheduler",
    "apscheduler.schedulers.background", "apscheduler.triggers.cron",
    "langgraph.checkpoint.base", "langgraph.checkpoint.serde.jsonplus", "ormsgpack",
]

HEADER = struct.Struct("!Q")
CODE = struct.Struct("!i")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("caller hung up mid-request")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _run_command(script: str, request: dict[str, object], fds: list[int]) -> None:
    """In the command's own process: become what the interpreter would have made of
    `SCRIPT argv...` in that environment, then run it. Never returns: the script's SystemExit
    unwinds to the top of this process and the interpreter exits as a fresh one would."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(str(request["cwd"]))
    umask = request["umask"]
    assert isinstance(umask, int)
    os.umask(umask)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    argv = request["argv"]
    assert isinstance(argv, list)
    sys.argv = [str(a) for a in argv]
    sys.path[0] = os.path.dirname(script)  # as for a script run directly: its own folder first
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        _finish(1, signal.SIGINT)
    except BaseException:  # what the interpreter does with an uncaught error
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code)


def _exit_code(value: object) -> int:
    """What the interpreter exits with for `sys.exit(value)`."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{value}\n")
    return 1


def _finish(code: int, signum: int = 0) -> None:
    """The interpreter's exit, in its order, without tearing down the ~700 preloaded modules
    one by one: that cost 0.3-0.4 s of CPU per command, as much as the imports it saved.
    Threading's exit hooks (ckptfs's compactor flush among them) and the wait for non-daemon
    threads, then atexit's functions, then a collection (what an object's __del__ says at exit
    is still said), then stdout and stderr flushed: a failed flush is exit 120, as Python's."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    gc.collect()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            stream.flush()
        except Exception as exc:
            with contextlib.suppress(Exception):
                os.write(2, f"Exception ignored in: {stream!r}\n{type(exc).__name__}: {exc}\n".encode())
            code = code or 120
    if signum:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code)


def _serve_one(conn: socket.socket, script: str, request: dict[str, object],
               fds: list[int]) -> None:
    """In a child of the zygote: fork the command, tell the caller its pid, wait for it and
    send its exit code. Returns only in the command's process (to run it)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote's auto-reaping would hide it
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(script, request, fds)
        return
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(CODE.pack(pid))
        _, status, ru = os.wait4(pid, 0)
        if os.environ.get("CKPTFS_ZYGOTE_LOG"):
            with open(os.environ["CKPTFS_ZYGOTE_LOG"], "a") as f:
                f.write(f"{ru.ru_utime + ru.ru_stime:.3f}\n")
        conn.sendall(CODE.pack(os.waitstatus_to_exitcode(status)))
    except OSError:
        pass  # the caller went away (its test timed out and killed the command)
    os._exit(0)


def ckptfs_modules() -> list[str]:
    """Every module of the ckptfs package, by name (imported or not)."""
    import ckptfs

    return ["ckptfs", *(m.name for m in pkgutil.walk_packages(ckptfs.__path__, "ckptfs."))]


def main(sock_path: str, script: str) -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # absent or broken here: the child imports it itself
            importlib.import_module(name)
    for name in ckptfs_modules():
        with contextlib.suppress(Exception):  # an optional integration's library is absent
            importlib.import_module(name)
    gc.freeze()  # the children's collections skip the preload's objects (their pages stay shared)
    if threading.active_count() != 1:  # a fork copies one thread only: a library left one
        raise SystemExit(f"zygote: {threading.active_count()} threads after the preload")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # request handlers are reaped by the kernel
    parent = os.getppid()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([listener], [], [], 1.0)
        if os.getppid() != parent:  # the pytest worker is gone: so are we
            os._exit(0)
        if not ready:
            continue
        conn, _ = listener.accept()
        try:
            head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            head += _recv_exact(conn, HEADER.size - len(head)) if len(head) < HEADER.size else b""
            (size,) = HEADER.unpack(head)
            request = json.loads(_recv_exact(conn, size))
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            _serve_one(conn, script, request, fds)
            return  # the command's process: unwind to the top and let the script's exit end it
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
