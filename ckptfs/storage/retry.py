"""RetryingStorage: retry throttling, 5xx and dropped connections on any Storage, with backoff.

Cross-cutting behaviour wraps a backend instead of living inside it (restic's backend/retry):
the mirror and restore wrap both ends, a store may wrap its own. Only transient failures are
retried: throttling (SlowDown, 429, RequestLimitExceeded), server errors (5xx, InternalError,
ServiceUnavailable), timeouts and connections refused or reset (a restarting server).
Absence, existence, failed preconditions, refused credentials and a missing bucket are
answers, not accidents, and pass through at once.

Retrying a conditional write is ambiguous when the first attempt reached the server but its
answer was lost: the retry of `put_if_absent` then finds the object this very call created
(`FileExistsError`), the retry of `put_if_match` finds the etag moved on by it
(`PreconditionFailed`). After a failed attempt, such a refusal is settled by reading the object
back: if it holds exactly the bytes sent, the write landed and the call succeeds. (What ckptfs
writes conditionally is unique to its writer: records carry a writer id, a time and a hash,
leases a nonce; so the same bytes are the same write.) A refusal on the first attempt is an
answer and passes through as it is. `put_stream` is retried only when its source can seek back
to where it started.

This is the only layer that retries: the wrapped backend's own client retries are turned off
(`Storage.single_attempt`; on S3 botocore's and s3fs's, see storage/s3.py ONE_ATTEMPT), so
`attempts` is the number of requests an operation that keeps failing sends, and every retry
and its wait are in the log. Beneath this layer they multiplied it (50 requests and about 80 s
for `--attempts 2`).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

from ckptfs.errors import StorageUnavailableError
from ckptfs.storage.base import Keys, PreconditionFailed, Storage
from ckptfs.storage.s3 import NoReplyError, is_silence, s3_error

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
    "RequestThrottled", "InternalError", "ServiceUnavailable", "RequestTimeout",
    "RequestTimeTooSkewed", "BadGateway", "GatewayTimeout", "500", "502", "503", "504", "429",
})
_PERMANENT_CODES = frozenset({
    "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
    "InvalidToken", "AllAccessDisabled", "InvalidBucketName", "AuthorizationHeaderMalformed",
    "PermanentRedirect", "301", "403",
})
# FlexibleChecksumError: a response body that does not match the checksum the server sent
# with it, i.e. bytes damaged or cut in transit: another GET is the cure. (A stored object
# whose body differs from its checksum is not transient, but S3 refuses such a PUT; the torn
# objects our tests once met were a test proxy forwarding a killed writer's partial body.)
_TRANSIENT_NAMES = ("Connect", "Timeout", "Endpoint", "ConnectionClosed", "IncompleteRead",
                    "ResponseParser", "ReadTimeout", "ClientPayload", "ServerDisconnected",
                    "FlexibleChecksum")
_TRANSIENT_WORDS = ("SlowDown", "reduce your request rate", "InternalError", "ServiceUnavailable",
                    "Too Many Requests", "TooManyRequests", "Throttl", "Connection refused",
                    "Could not connect", "Connection reset", "Connection was closed",
                    "Server disconnected", "timed out", "Remote end closed")


def is_transient(exc: BaseException) -> bool:
    """True for failures worth another try: throttling, 5xx, timeouts, lost connections."""
    if isinstance(exc, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError):
        return False
    if isinstance(exc, NoReplyError):  # an endpoint that never answered stayed silent again
        return False
    if not isinstance(exc, StorageUnavailableError | OSError | TimeoutError):
        name = type(exc).__name__
        return any(n in name for n in _TRANSIENT_NAMES)
    code, status = s3_error(exc)
    if code in _PERMANENT_CODES:
        return False
    if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
        return True
    text = str(exc)
    if any(c in text for c in _PERMANENT_CODES if not c.isdigit()):
        return False
    if any(w in text for w in _TRANSIENT_WORDS):
        return True
    chain: BaseException | None = exc
    for _ in range(8):
        if chain is None:
            break
        if any(n in type(chain).__name__ for n in _TRANSIENT_NAMES):
            return True
        if isinstance(chain, ConnectionError | TimeoutError):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


# Connection settings: a connection that cannot be established before the endpoint ever answered
# (refused, DNS failure, connect timeout) is a wrong URL or a server that is not there, not a
# glitch: it gets CONNECT_ATTEMPTS tries, CONNECT_RETRY_DELAY apart, so a command fails in about
# a second instead of backing off for a minute. Once the endpoint has answered (any response, even
# a 404 or a 503), such failures are a restarting server or a dropped connection and get the full
# `attempts` with backoff, like throttling and 5xx always do.
CONNECT_ATTEMPTS = 2
CONNECT_RETRY_DELAY = 0.25
_CONNECT_WORDS = ("Could not connect to the endpoint", "Connection refused", "Cannot connect to host",
                  "Name or service not known", "Temporary failure in name resolution",
                  "nodename nor servname", "No address associated with hostname",
                  "EndpointConnectionError", "ConnectTimeoutError", "Connect timeout on endpoint")


def is_connect_failure(exc: BaseException) -> bool:
    """True when a connection could not be established at all (as opposed to one that dropped)."""
    chain: BaseException | None = exc
    for _ in range(8):
        if chain is None:
            return False
        if isinstance(chain, ConnectionRefusedError) or type(chain).__name__ in (
                "EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                "ClientConnectorDNSError", "gaierror"):
            return True
        if any(w in str(chain) for w in _CONNECT_WORDS):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


class RetriesExhausted(StorageUnavailableError):
    """A transient failure outlived every retry; the message says what and how often."""


class RetryingStorage(Storage):
    """A Storage whose every operation is retried on transient failures, with jittered backoff.

    attempts: tries per operation, the first included (1 disables retrying); with the
        inner client's retries off (see the module docstring), the requests it sends.
    base_delay / max_delay: the n-th wait is uniform in [0, min(max_delay, base_delay * 2**n)]
        ("full jitter"), so many clients throttled together do not retry in step.
    """

    def __init__(self, inner: Storage, attempts: int = 6, base_delay: float = 0.2,
                 max_delay: float = 5.0, sleep: Callable[[float], None] = time.sleep) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        super().__init__(inner.url, inner.options)
        self.inner = inner.single_attempt()
        # Capabilities are the wrapped backend's; retrying adds no guarantee and removes none.
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._sleep = sleep
        self._count_lock = threading.Lock()
        self.retries = 0  # retries performed so far, for reports
        self.answered = False  # the endpoint has answered at least once (see CONNECT_ATTEMPTS)

    def __repr__(self) -> str:
        return f"RetryingStorage({self.inner!r})"

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "retry": {"attempts": self.attempts,
                                                    "base_delay": self.base_delay,
                                                    "max_delay": self.max_delay}}

    def _call(self, what: str, key: str, fn: Callable[[], T],
              rewind: Callable[[], None] | None = None) -> T:
        connect_failures = 0
        for attempt in range(1, self.attempts + 1):
            try:
                result = fn()
            except Exception as exc:
                connect_failure = is_connect_failure(exc)
                if not connect_failure and not is_silence(exc):
                    # a 404, a 503, a dropped reply: the endpoint is there; no reply at all
                    # within the read timeout says nothing of it (see storage/s3.py SILENT_TRIES)
                    self.answered = True
                if not is_transient(exc):
                    raise
                if not self.answered and connect_failure:
                    # never reached: a wrong endpoint or a server that is not there; say so now
                    # a connect timeout already waited its whole timeout: one is enough
                    connect_failures += CONNECT_ATTEMPTS if "timeout" in str(exc).lower() else 1
                    if connect_failures >= CONNECT_ATTEMPTS or attempt == self.attempts:
                        raise RetriesExhausted(
                            f"{self.display_name}: {what} {key!r}: the endpoint cannot be reached "
                            f"({_attempts(connect_failures)}): {exc}") from exc
                    delay = CONNECT_RETRY_DELAY
                elif attempt == self.attempts:
                    raise RetriesExhausted(f"{self.display_name}: {what} {key!r} still failing after "
                                           f"{_attempts(self.attempts)}: {exc}") from exc
                else:
                    delay = random.uniform(0, min(self.max_delay,
                                                  self.base_delay * 2 ** (attempt - 1)))
                with self._count_lock:
                    self.retries += 1
                # a first connection that failed is retried once, quietly: its error says it all
                logger.log(logging.INFO if connect_failures else logging.WARNING,
                           "%s: %s %r failed (%s); retry %d/%d in %.2fs", self.display_name,
                           what, key, exc, attempt, self.attempts - 1, delay)
                self._sleep(delay)
                if rewind is not None:
                    rewind()
            else:
                self.answered = True
                return result
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes) -> str:
        return self._call("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._conditional("put_if_absent", key, data, FileExistsError,
                                 lambda: self.inner.put_if_absent(key, data))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._conditional("put_if_match", key, data, PreconditionFailed,
                                 lambda: self.inner.put_if_match(key, data, etag))

    def _conditional(self, what: str, key: str, data: bytes, refused: type[Exception],
                     fn: Callable[[], str]) -> str:
        """A conditional write, retried; a refusal after a failed attempt may be our own write.

        The first attempt may have landed with its reply lost; the retry is then refused
        because of it. Reading the object back tells: the same bytes are ours (success), other
        bytes are a rival's (the refusal stands). Without a failed attempt before it, a
        refusal is not ambiguous and is not read back.
        """
        failed = [False]

        def attempt() -> str:
            try:
                return fn()
            except refused:
                if failed[0]:
                    etag = self._holds(key, data)
                    if etag is not None:
                        logger.info("%s: %s %r: a retry met the write of an earlier attempt; it "
                                    "landed", self.display_name, what, key)
                        return etag
                raise
            except Exception:
                failed[0] = True
                raise

        return self._call(what, key, attempt)

    def _holds(self, key: str, data: bytes) -> str | None:
        """The object's etag if it holds exactly `data` (read back with retries), else None."""
        try:
            stored, etag = self._call("get", key, lambda: self.inner.get_with_etag(key))
        except FileNotFoundError:
            return None
        return etag if stored == data else None

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self._call("get", key, lambda: self.inner.get_with_etag(key))

    def get(self, key: str) -> bytes:
        return self._call("get", key, lambda: self.inner.get(key))

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self._call("list", prefix, lambda: self.inner.list(prefix, start_after))

    def list_dirs(self, prefix: str) -> Keys:
        return self._call("list_dirs", prefix, lambda: self.inner.list_dirs(prefix))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key))

    def delete_many(self, keys: Sequence[str]) -> None:
        # deleting is idempotent: a batch retried after a lost reply deletes nothing twice
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            self._call("delete_many", chunk[0], functools.partial(self.inner.delete_many, chunk))

    def size(self, key: str) -> int:
        return self._call("size", key, lambda: self.inner.size(key))

    def modified(self, key: str) -> float:
        return self._call("modified", key, lambda: self.inner.modified(key))

    def modified_and_now(self, key: str) -> tuple[float, float | None]:
        return self._call("modified", key, lambda: self.inner.modified_and_now(key))

    def touch(self, key: str) -> None:
        self._call("touch", key, lambda: self.inner.touch(key))

    def exists(self, key: str) -> bool:
        return self._call("exists", key, lambda: self.inner.exists(key))

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        if not src.seekable():
            self.inner.put_stream(key, src, exclusive)
            return
        start = src.tell()

        def rewind() -> None:
            src.seek(start)

        self._call("put_stream", key, lambda: self.inner.put_stream(key, src, exclusive), rewind=rewind)

    def open_read(self, key: str) -> IO[bytes]:
        return self._call("open_read", key, lambda: self.inner.open_read(key))

    def read_through(self, key: str, read: Callable[[IO[bytes]], T]) -> T:
        """The open and every read after it, retried as one: a connection closed mid-body
        (aiohttp's ClientPayloadError) surfaced in the reads, past `open_read`'s retries, and
        a restore of a streamed artifact exited 3 on the first glitch where a small one's GET
        was retried and converged."""
        return self._call("read", key, lambda: self.inner.read_through(key, read))

    def check(self) -> None:
        self._call("check", "", self.inner.check)

    def check_writable(self) -> None:
        self.inner.check_writable()  # a local question, nothing to retry

    def local_root(self) -> str | None:
        return self.inner.local_root()

    def location(self) -> tuple[str, str] | None:
        return self.inner.location()

    def close(self) -> None:
        self.inner.close()
