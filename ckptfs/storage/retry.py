"""RetryingStorage: retry throttling, 5xx and dropped connections on any Storage, with backoff.

Cross-cutting behaviour wraps a backend instead of living inside it (restic's backend/retry):
the mirror and restore wrap both ends, a store may wrap its own. Only transient failures are
retried: throttling (SlowDown, 429, RequestLimitExceeded), server errors (5xx, InternalError,
ServiceUnavailable), timeouts and connections refused or reset (a restarting server).
Absence, existence, failed preconditions, refused credentials and a missing bucket are
answers, not accidents, and pass through at once.

Retrying a conditional write is ambiguous when the first attempt reached the server but its
answer was lost: `put_if_absent` may then raise `FileExistsError` for an object this very
call created. Callers that copy immutable objects (the mirror) compare content in that case.
`put_stream` is retried only when its source can seek back to where it started.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

from ckptfs.errors import StorageUnavailableError
from ckptfs.storage.base import Keys, Storage
from ckptfs.storage.s3 import s3_error

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
_TRANSIENT_NAMES = ("Connect", "Timeout", "Endpoint", "ConnectionClosed", "IncompleteRead",
                    "ResponseParser", "ReadTimeout", "ClientPayload", "ServerDisconnected")
_TRANSIENT_WORDS = ("SlowDown", "reduce your request rate", "InternalError", "ServiceUnavailable",
                    "Too Many Requests", "TooManyRequests", "Throttl", "Connection refused",
                    "Could not connect", "Connection reset", "Connection was closed",
                    "Server disconnected", "timed out", "Remote end closed")


def is_transient(exc: BaseException) -> bool:
    """True for failures worth another try: throttling, 5xx, timeouts, lost connections."""
    if isinstance(exc, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError):
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


class RetriesExhausted(StorageUnavailableError):
    """A transient failure outlived every retry; the message says what and how often."""


class RetryingStorage(Storage):
    """A Storage whose every operation is retried on transient failures, with jittered backoff.

    attempts: tries per operation, the first included (1 disables retrying).
    base_delay / max_delay: the n-th wait is uniform in [0, min(max_delay, base_delay * 2**n)]
        ("full jitter"), so many clients throttled together do not retry in step.
    """

    def __init__(self, inner: Storage, attempts: int = 6, base_delay: float = 0.2,
                 max_delay: float = 5.0, sleep: Callable[[float], None] = time.sleep) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        super().__init__(inner.url, inner.options)
        self.inner = inner
        # Capabilities are the wrapped backend's; retrying adds no guarantee and removes none.
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._sleep = sleep
        self._count_lock = threading.Lock()
        self.retries = 0  # retries performed so far, for reports

    def __repr__(self) -> str:
        return f"RetryingStorage({self.inner!r})"

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "retry": {"attempts": self.attempts,
                                                    "base_delay": self.base_delay,
                                                    "max_delay": self.max_delay}}

    def _call(self, what: str, key: str, fn: Callable[[], T],
              rewind: Callable[[], None] | None = None) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if attempt == self.attempts:
                    raise RetriesExhausted(f"{self.display_url}: {what} {key!r} still failing after "
                                           f"{self.attempts} attempts: {exc}") from exc
                delay = random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))
                with self._count_lock:
                    self.retries += 1
                logger.warning("%s: %s %r failed (%s); retry %d/%d in %.2fs", self.display_url,
                               what, key, exc, attempt, self.attempts - 1, delay)
                self._sleep(delay)
                if rewind is not None:
                    rewind()
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes) -> str:
        return self._call("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._call("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._call("put_if_match", key, lambda: self.inner.put_if_match(key, data, etag))

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

    def size(self, key: str) -> int:
        return self._call("size", key, lambda: self.inner.size(key))

    def modified(self, key: str) -> float:
        return self._call("modified", key, lambda: self.inner.modified(key))

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

    def check(self) -> None:
        self._call("check", "", self.inner.check)

    def close(self) -> None:
        self.inner.close()
