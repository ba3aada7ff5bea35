"""`subprocess.run` of the `ckptfs` executable, started by fork from a warm parent.

conftest.py installs `run` below in place of `subprocess.run` for the whole suite. A call whose
program is this checkout's `ckptfs` console script, with nothing a fork could not reproduce,
goes to tests/_cli_zygote.py (why: its docstring); every other call, and every Popen, is the
real `subprocess.run`. The test sees what it would have seen: a CompletedProcess with the
command's exit code and output, TimeoutExpired and CalledProcessError as subprocess raises
them, the command killed on a timeout.

What a fork cannot reproduce goes the real way (`forkable`): an environment that changes what
an interpreter decides as it starts (PYTHON*, the locale, TZ) or what the preloaded libraries
read as they import (FSSPEC_*, AIOHTTP_*); a program, argument or variable a real exec would
refuse (a NUL byte, bytes); any argument of subprocess.run but the plain ones. tests/
test_cli_fork_parity.py runs commands both ways and compares every byte. CKPTFS_TEST_FORK=0
sends everything the real way (`make test CKPTFS_TEST_FORK=0`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCRIPT = str(Path(sys.executable).parent / "ckptfs")
ZYGOTE = str(Path(__file__).resolve().parent / "_cli_zygote.py")
REAL_RUN = subprocess.run
HEADER = struct.Struct("!Q")
CODE = struct.Struct("!i")
# What an interpreter reads from the environment while it starts, or the preloaded libraries
# while they import: a command given other values than the zygote had must start afresh.
STARTUP_PREFIXES = ("PYTHON", "LC_", "LANG", "TZ", "FSSPEC_", "AIOHTTP_", "PYDANTIC_")
PLAIN_KWARGS = {"capture_output", "stdout", "stderr", "stdin", "text", "encoding", "errors",
                "env", "cwd", "timeout", "input", "check", "universal_newlines"}

_lock = threading.Lock()
_zygote: tuple[int, subprocess.Popen[bytes], str, dict[str, str]] | None = None  # (pid of its owner, ...)


def enabled() -> bool:
    return os.environ.get("CKPTFS_TEST_FORK", "1") != "0"


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def forkable(args: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether the zygote can run this call as the real exec would (module docstring)."""
    if not enabled() or isinstance(args, str | bytes) or not isinstance(args, Sequence) or not args:
        return False
    if not set(kwargs) <= PLAIN_KWARGS:
        return False
    for name in ("stdout", "stderr"):
        if kwargs.get(name) not in (None, subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT):
            return False
    if kwargs.get("capture_output") and (kwargs.get("stdout") is not None
                                         or kwargs.get("stderr") is not None):
        return False  # subprocess's ValueError, raised the real way
    if kwargs.get("stdin") not in (None, subprocess.DEVNULL) or (
            kwargs.get("stdin") is not None and kwargs.get("input") is not None):
        return False
    try:
        argv = [os.fspath(a) for a in args]
    except TypeError:
        return False
    if any(not isinstance(a, str) or "\0" in a for a in argv) or argv[0] != SCRIPT:
        return False
    env = kwargs.get("env")
    env = os.environ if env is None else env
    if not isinstance(env, Mapping) or any(
            not isinstance(k, str) or not isinstance(v, str) or "\0" in k + v or "=" in k or not k
            for k, v in env.items()):
        return False
    z = _zygote  # what the zygote started with, or will: this process's environment now
    started = z[3] if z is not None and z[0] == os.getpid() else _startup_env(os.environ)
    return _startup_env(env) == started


def _ensure_zygote() -> tuple[str, dict[str, str]]:
    global _zygote
    with _lock:
        z = _zygote
        if z is not None and z[0] == os.getpid() and z[1].poll() is None:
            return z[2], z[3]
        sock = os.path.join(tempfile.mkdtemp(prefix="ckptfs-zygote-"), "s")
        proc = subprocess.Popen([sys.executable, ZYGOTE, sock, SCRIPT], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line != b"ready\n":
            proc.kill()
            raise RuntimeError(f"the ckptfs zygote did not start: {line!r}")
        env = _startup_env(os.environ)
        _zygote = (os.getpid(), proc, sock, env)
        atexit.register(_stop, proc)
        return sock, env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
        proc.wait(5)


def _recv_code(conn: socket.socket, deadline: float | None) -> int | None:
    buf = b""
    while len(buf) < CODE.size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            conn.settimeout(left)
        try:
            chunk = conn.recv(CODE.size - len(buf))
        except TimeoutError:
            return None
        if not chunk:
            raise RuntimeError("the ckptfs zygote hung up before the command's exit code")
        buf += chunk
    (value,) = CODE.unpack(buf)
    return int(value)


def _via_zygote(args: Sequence[Any], kwargs: dict[str, Any]) -> subprocess.CompletedProcess[Any]:
    sock_path, _ = _ensure_zygote()
    argv = [os.fspath(a) for a in args]
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    try:
        cwd = os.fspath(kwargs["cwd"]) if kwargs.get("cwd") is not None else os.getcwd()
    except OSError:  # this process's folder was removed: a real child would still start in it
        return REAL_RUN(args, **kwargs)
    if not os.path.isdir(cwd):  # what the real exec raises, before any process exists
        return REAL_RUN(args, **kwargs)
    umask = os.umask(0o22)  # a child inherits it: read it (there is no other way) and put it back
    os.umask(umask)
    timeout = kwargs.get("timeout")
    deadline = None if timeout is None else time.monotonic() + timeout
    capture = kwargs.get("capture_output", False)
    text = bool(kwargs.get("text") or kwargs.get("universal_newlines")
                or kwargs.get("encoding") or kwargs.get("errors"))
    data: Any = kwargs.get("input")
    mine: list[int] = []  # our ends, closed when done
    theirs: list[int] = []  # the command's ends, closed once sent
    readers: dict[int, str] = {}

    def target(spec: Any, name: str, inherit: int) -> int:
        if capture or spec == subprocess.PIPE:
            r, w = os.pipe()
            mine.append(r)
            readers[r] = name
            theirs.append(w)
            return w
        fd = os.open(os.devnull, os.O_RDWR) if spec == subprocess.DEVNULL else os.dup(inherit)
        theirs.append(fd)
        return fd

    stdin_w = -1
    if data is not None:
        r, stdin_w = os.pipe()
        mine.append(stdin_w)
        theirs.append(r)
        stdin_fd = r
    elif kwargs.get("stdin") == subprocess.DEVNULL:
        stdin_fd = os.open(os.devnull, os.O_RDONLY)
        theirs.append(stdin_fd)
    else:
        stdin_fd = os.dup(0)
        theirs.append(stdin_fd)
    stdout_fd = target(kwargs.get("stdout"), "stdout", 1)
    if kwargs.get("stderr") == subprocess.STDOUT:
        stderr_fd = os.dup(stdout_fd)
        theirs.append(stderr_fd)
    else:
        stderr_fd = target(kwargs.get("stderr"), "stderr", 2)
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = 0
    try:
        conn.connect(sock_path)
        body = json.dumps({"argv": argv, "env": env, "cwd": cwd, "umask": umask}).encode(
            "utf-8", "surrogatepass")
        socket.send_fds(conn, [HEADER.pack(len(body))], [stdin_fd, stdout_fd, stderr_fd])
        conn.sendall(body)
        for fd in theirs:
            os.close(fd)
        theirs.clear()
        got = _recv_code(conn, None)
        assert got is not None
        pid = got
        if stdin_w >= 0:
            payload = data.encode(kwargs.get("encoding") or locale.getpreferredencoding(False),
                                  kwargs.get("errors") or "strict") \
                if isinstance(data, str) else bytes(data)
            writer = threading.Thread(target=_feed, args=(stdin_w, payload), daemon=True)
            mine.remove(stdin_w)
            writer.start()
        timed_out = not _drain(readers, out, deadline)
        code = None if timed_out else _recv_code(conn, deadline)
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _drain(readers, out, time.monotonic() + 5)
            # as subprocess's: what was read so far, undecoded, None where nothing was
            raise subprocess.TimeoutExpired(args, timeout or 0.0, b"".join(out["stdout"]) or None,
                                            b"".join(out["stderr"]) or None)
    finally:
        conn.close()
        for fd in mine + theirs:
            with contextlib.suppress(OSError):
                os.close(fd)
    stdout = _decode(out["stdout"], text, kwargs) if "stdout" in readers.values() else None
    stderr = _decode(out["stderr"], text, kwargs) if "stderr" in readers.values() else None
    done = subprocess.CompletedProcess(args, code, stdout, stderr)
    if kwargs.get("check") and code:
        raise subprocess.CalledProcessError(code, args, stdout, stderr)
    return done


def _feed(fd: int, payload: bytes) -> None:
    """Write `input` to the command's stdin and close it, as communicate() does."""
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _drain(readers: dict[int, str], out: dict[str, list[bytes]], deadline: float | None) -> bool:
    """Read the command's pipes until each is at its end (True) or `deadline` passes (False)."""
    open_fds = [fd for fd in readers if fd >= 0]
    with selectors.DefaultSelector() as sel:
        for fd in open_fds:
            with contextlib.suppress(ValueError, KeyError):
                sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    out[readers[key.fd]].append(chunk)
                else:
                    sel.unregister(key.fd)
    return True


def _decode(chunks: list[bytes], text: bool, kwargs: Mapping[str, Any]) -> Any:
    raw = b"".join(chunks)
    if not text:
        return raw
    decoded = raw.decode(kwargs.get("encoding") or locale.getpreferredencoding(False),
                         kwargs.get("errors") or "strict")
    return decoded.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as subprocess


def run(*popenargs: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, with `ckptfs` commands forked from the zygote where that is the same."""
    if len(popenargs) == 1 and forkable(popenargs[0], kwargs):
        return _via_zygote(popenargs[0], kwargs)
    return REAL_RUN(*popenargs, **kwargs)


def install() -> None:
    subprocess.run = run
