"""S3 through s3fs: one PUT per commit, If-None-Match for exclusivity, If-Match for CAS."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import functools
import hashlib
import logging
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from ckptfs.errors import ConfigError, StorageUnavailableError, StoreNotWritableError
from ckptfs.storage.base import COPY_CHUNK, Capabilities, Keys, PreconditionFailed, Storage, check_key
from ckptfs.storage.exit_pools import serve_blocking_calls_at_exit
from ckptfs.storage.redact import redact_url, scrub_secrets

logger = logging.getLogger(__name__)


_UNAVAILABLE_CODES = {
    "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
    "ExpiredToken", "InvalidToken", "AllAccessDisabled", "InvalidBucketName", "403",
    "AuthorizationHeaderMalformed", "PermanentRedirect", "301",
}


# What a change needs that S3's AccessDenied (HTTP 403; a bare "403" when the reply has no
# body) refused, by the verb a message says: a policy without it makes the store read-only.
_CHANGE_ACTIONS = {"write": "s3:PutObject", "delete": "s3:DeleteObject"}
_DENIED_CODES = ("AccessDenied", "403")


def http_date(value: object) -> float | None:
    """An HTTP date header (RFC 9110 5.6.7: "Sun, 06 Nov 1994 08:49:37 GMT") as POSIX seconds,
    or None when absent or unparsable. A date without a zone is taken as UTC, which an HTTP
    date always is."""
    if not isinstance(value, str):
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return when.timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def s3_error(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status found anywhere in the exception's chain (botocore
    errors arrive wrapped by s3fs and aiobotocore, so the response may sit a few causes down)."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        resp = getattr(cur, "response", None)
        if isinstance(resp, dict):
            code = resp.get("Error", {}).get("Code")
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None,
                    int(status) if isinstance(status, int) else None)
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None, None


# Connection settings. botocore retries a connection it cannot establish (refused, DNS failure,
# connect timeout) with backoff, 5 times by default, and RetryingStorage retried each such call
# again: against a wrong endpoint a command took 10-50 s to say so. Until an endpoint has answered
# once, "cannot connect" is an answer (a wrong URL, a server that is not there), so the client
# gives up on it at once; after that (a server restarting, a dropped connection) the retries of
# whichever layer retries apply (see ONE_ATTEMPT). Throttling and 5xx are answers, always retried.
CONNECT_TIMEOUT = 3.0  # seconds to establish a connection (s3fs's default is 5)

# Retries, one layer of them. botocore (legacy mode: 5 attempts, backoff up to 2**n s, for 5xx
# and throttling) and s3fs (5 tries around each botocore call for SlowDown and lost
# connections) both retry beneath RetryingStorage, so their counts multiplied with `--attempts`:
# `mirror --attempts 2` sent a PUT answered 503 SlowDown 50 times, giving up after 77-84 s. A store
# that RetryingStorage wraps (single_attempt) therefore asks botocore for one attempt and s3fs
# for one try; RetryingStorage's attempts are then the requests sent, its jittered backoff the
# only wait, each retry logged and counted in the reports. A user's own `config_kwargs.retries`
# is kept (botocore then retries beneath ckptfs as told). A store used on its own (the
# checkpoint store's commits) keeps botocore's and s3fs's retries: nothing else retries there.
# Beneath all of them aiohttp resends, once, a request whose connection closed unanswered (RFC
# 9112 9.3.1): never a 5xx, and a conditional PUT settles that resend as it does any retry.
ONE_ATTEMPT = {"mode": "standard", "total_max_attempts": 1}
_GUARDED: weakref.WeakSet[Any] = weakref.WeakSet()
_GUARD_LOCK = threading.Lock()

# Silence. An endpoint that accepts connections and never replies (a hung server, a firewall
# swallowing replies) costs a whole read timeout per request (s3fs's: 15 s), and botocore's 5
# attempts ran inside each of s3fs's 5 tries: `ckptfs runs` gave up after ~418 s, 25 timeouts,
# saying nothing meanwhile, though any of them said what the first did. Until the endpoint has
# answered once, silence is treated like a refused connection, an answer about the endpoint:
# SILENT_TRIES requests in a row unanswered and it is reported (NoReplyError, which neither
# botocore nor s3fs retries), so the whole wait is SILENT_TRIES read timeouts (30 s by default,
# `-o config_kwargs.read_timeout=SECONDS` sets the timeout). Whichever one layer retries sends
# the second request. Once the endpoint has answered, a read timeout is a slow network or a busy
# server, and every layer's retries apply as before: a slow link must not fail a commit.
SILENT_TRIES = 2


class NoReplyError(StorageUnavailableError):
    """An endpoint that has never answered left SILENT_TRIES requests in a row without a reply
    for a whole read timeout each: a hung server, or a middlebox dropping its replies. Not
    transient to any retry layer: the next request would wait just as long for nothing."""


def is_silence(exc: BaseException) -> bool:
    """A request sent on an established connection that got no reply within the read timeout
    (botocore's ReadTimeoutError, which aiobotocore raises for aiohttp's read timeouts).
    RetryingStorage asks this of any backend's errors: botocore is not imported for it, since
    none of its errors can have been raised before it was."""
    boto = sys.modules.get("botocore.exceptions")
    silent: tuple[type[BaseException], ...] = (NoReplyError,)
    if boto is not None:
        silent += (boto.ReadTimeoutError,)
    chain: BaseException | None = exc
    for _ in range(8):
        if chain is None:
            return False
        if isinstance(chain, silent):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _bad_endpoint_errors() -> tuple[type[BaseException], ...]:
    """botocore's errors for an endpoint it cannot use as given (a port past 65535, a malformed
    URL): the user's settings, refused at once. Their names hold "Endpoint", which the retry
    layer reads as a connection glitch (EndpointConnectionError): six tries, then "still
    failing", where `runs` said at once what was wrong."""
    boto = sys.modules.get("botocore.exceptions")
    return () if boto is None else (boto.EndpointResolutionError, boto.InvalidEndpointConfigurationError)


def is_connect_failure(exc: BaseException) -> bool:
    """A connection that could not be established: refused, DNS failure, connect timeout."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    return isinstance(exc, BotoConnectionError) and not isinstance(exc, HTTPClientError)


def guard_connections(client: Any) -> None:
    """Register, first in line, a botocore needs-retry handler on `client` (once per client):
    before the endpoint ever answered, a connection failure is raised at once instead of
    retried, and the SILENT_TRIES-th request in a row left unanswered raises NoReplyError.

    The silent requests are counted per client, not per call: s3fs retries a read timeout
    around botocore with a new call each time, which a per-call count would let through."""
    with _GUARD_LOCK:
        try:
            if client in _GUARDED:
                return
            _GUARDED.add(client)
        except TypeError:  # not weak-referenceable: guard it anyway, once per S3Storage call path
            pass
    answered = [False]
    silent = [0]

    def needs_retry(response: Any = None, caught_exception: BaseException | None = None,
                    **_: Any) -> None:
        if response is not None:
            answered[0] = True
        elif caught_exception is None or answered[0]:
            pass
        elif is_connect_failure(caught_exception):
            raise caught_exception
        elif is_silence(caught_exception):
            silent[0] += 1
            endpoint = redact_url(str(client.meta.endpoint_url))
            timeout = client.meta.config.read_timeout
            if silent[0] >= SILENT_TRIES:
                raise NoReplyError(
                    f"no reply from {endpoint} to {silent[0]} requests in a row, {timeout} s each "
                    "(read timeout), and never one before: it accepts connections but does not "
                    "answer (a hung server, or a firewall dropping its replies?)")
            logger.info("no reply from %s within %s s (read timeout) and none before; %d more "
                        "request unanswered and it is reported unreachable", endpoint, timeout,
                        SILENT_TRIES - silent[0])
        return None

    client.meta.events.register_first("needs-retry.s3", needs_retry,
                                      unique_id="ckptfs-connect-guard")


@functools.cache
def _one_try_filesystem() -> type[Any]:
    """S3FileSystem trying each call once. s3fs's `retries` is a class attribute, not an
    option; a subclass has an fsspec instance cache of its own, so the shared clients of stores
    that keep their client's retries are never changed under them."""
    import s3fs

    class OneTryS3FileSystem(s3fs.S3FileSystem):  # type: ignore[misc]
        retries = 1

    return OneTryS3FileSystem


class S3Storage(Storage):
    """S3 (or any S3-compatible server) through s3fs, one PUT per commit.

    `put_if_absent` sends `If-None-Match: *` and `put_if_match` sends `If-Match`, so both
    are decided by the server: two writers cannot both win. Objects appear whole or not at
    all (single PUT, or a multipart upload completed in one call). Never `put_if_absent`
    an empty body: a conditional PUT of zero bytes is the one s3fs path that can empty an
    existing object, so the codec never produces one and `put_stream` refuses it.
    """

    capabilities = Capabilities(
        atomic_put=True, exclusive_create=True, conditional_put=True, durable=True, shared=True,
        remote=True,
    )

    def __init__(self, url: str, bucket: str, prefix: str, options: Mapping[str, Any] | None,
                 *, client_retries: bool = True) -> None:
        super().__init__(url, options)
        import s3fs

        self.client_retries = client_retries
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        opts = dict(self.options)
        # Listings must be fresh (a cached one hides new versions); the client itself is
        # shared through fsspec's instance cache, which is keyed by these options and cleared
        # after fork, so opening the same store again costs no new connection pool.
        opts.setdefault("use_listings_cache", False)
        ck = opts.get("config_kwargs")
        if ck is None or isinstance(ck, Mapping):
            # a shorter connect timeout than s3fs's 5 s: establishing a connection is quick or
            # broken; 32 connections, not botocore's 10: a load prefetches 8 files and a
            # LangGraph read fetches a delta chain of up to 16 objects at once, and a request
            # past the pool waits for a whole round trip
            defaults: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT,
                                        "max_pool_connections": 32}
            if not client_retries:
                defaults["retries"] = dict(ONE_ATTEMPT)
            opts["config_kwargs"] = {**defaults, **(ck or {})}
        cls = s3fs.S3FileSystem if client_retries else _one_try_filesystem()
        try:
            self.fs = cls(**opts)
        except TypeError as exc:
            raise ConfigError(f"{self.display_name}: bad storage option: {exc}") from None
        if self.fs.loop is not None:  # None only with asynchronous=True, which no sync call serves
            serve_blocking_calls_at_exit(self.fs.loop)

    def location(self) -> tuple[str, str]:
        # by bucket and prefix only: two spellings of one endpoint are not told apart, so a
        # mirror to another S3 service takes another bucket or prefix
        return f"s3://{self.bucket}", self.prefix

    def single_attempt(self) -> S3Storage:
        if not self.client_retries:
            return self
        return S3Storage(self.url, self.bucket, self.prefix, self.options, client_retries=False)

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _guard_connections(self) -> None:
        """Have the client fail at once on a connection it cannot establish, until it was answered.

        s3fs creates its botocore client on the first call; this creates it now (as that call
        would) so the guard is in place before any request. Shared clients are guarded once.
        """
        client = getattr(self.fs, "_s3", None)
        if client is None:
            self.fs.connect()
            client = getattr(self.fs, "_s3", None)
        if client is not None:
            guard_connections(client)

    def _denied(self, key: str | None, change: str, detail: str) -> StoreNotWritableError:
        """The error for a write or delete S3 answered AccessDenied: the store is not writable
        to these credentials (an IAM policy without s3:PutObject or s3:DeleteObject, a bucket
        policy protecting the objects), not unreachable. Reported as unreachable, it sent an
        operator after the network, and `prune` called such a run's failure `unreachable`.
        Names the key and the permission; the server's words are scrubbed of every secret in
        the options (the store's URL is already redacted)."""
        return StoreNotWritableError(
            f"{self.display_name}: cannot {change} {key}: access denied ({_CHANGE_ACTIONS[change]} "
            f"refused by an IAM or bucket policy?): {scrub_secrets(detail, self.options)}")

    @contextlib.contextmanager
    def _errors(self, key: str | None = None, change: str | None = None) -> Iterator[None]:
        """S3 and s3fs errors as the domain's, for a call about `key`.

        `change` says what a call that changes the store does ("write" or "delete"): an
        AccessDenied on it is StoreNotWritableError (see `_denied`). On a read, or a refusal
        of the credentials themselves (InvalidAccessKeyId, SignatureDoesNotMatch,
        ExpiredToken: s3fs makes these PermissionError too), it stays StorageUnavailableError,
        "access refused": the store cannot be used with these credentials at all.
        """
        try:
            self._guard_connections()
            yield
        except NoReplyError as exc:  # raised inside the client, which knows no store's name
            raise NoReplyError(f"{self.display_name}: {exc}") from None
        except (FileExistsError, PreconditionFailed, FileNotFoundError) as exc:
            code = s3_error(exc)[0]
            if code in _UNAVAILABLE_CODES:
                raise StorageUnavailableError(f"{self.display_name}: {code}: {exc}") from None
            raise
        except StorageUnavailableError:
            raise
        except PermissionError as exc:
            if change is not None and s3_error(exc)[0] in _DENIED_CODES:
                raise self._denied(key, change, str(exc)) from None
            raise StorageUnavailableError(f"{self.display_name}: access refused: {exc}") from None
        except OSError as exc:
            code = s3_error(exc)[0]
            if code == "PreconditionFailed":
                raise PreconditionFailed(f"{key}: object changed") from None
            if code in ("NoSuchKey", "404"):
                raise FileNotFoundError(key) from None
            if code in ("ConditionalRequestConflict", "409"):
                raise PreconditionFailed(f"{key}: concurrent conditional write") from None
            raise StorageUnavailableError(f"{self.display_name}: {code or ''} {exc}") from None
        except (ValueError, TypeError) as exc:
            # botocore refuses a malformed endpoint or an unknown option only at the first call
            raise ConfigError(f"{self.display_name}: bad S3 settings: {scrub_secrets(str(exc), self.options)}"
                              ) from None
        except Exception as exc:  # botocore connection errors and the like
            name = type(exc).__name__
            if isinstance(exc, _bad_endpoint_errors()):  # "Endpoint" in its name: no glitch
                raise ConfigError(f"{self.display_name}: bad S3 settings: {name}: "
                                  f"{scrub_secrets(str(exc), self.options)}") from None
            if name == "HTTPClientError":  # the HTTP client refused the request itself (an
                # endpoint with user:password@ in it): not the network, and not ours (exit 3)
                raise StorageUnavailableError(f"{self.display_name}: {name}: "
                                              f"{scrub_secrets(str(exc), self.options)}") from None
            if ("Connect" in name or "Endpoint" in name or "Credentials" in name or "Timeout" in name
                    or "Checksum" in name):  # a body damaged in transit: retried (retry.py)
                raise StorageUnavailableError(f"{self.display_name}: {name}: {exc}") from None
            raise

    def _put(self, key: str, data: bytes, **cond: str) -> str:
        with self._errors(key, "write"):
            resp = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self._key(key),
                                   Body=data, **cond)
        return str(resp.get("ETag", ""))

    def put(self, key: str, data: bytes) -> str:
        return self._put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Exclusive create; a 412 for an object holding exactly `data` is our own write.

        botocore retries a PUT whose connection dropped or that got a 5xx, and s3fs retries
        around botocore, invisibly to us (under RetryingStorage aiohttp still resends a PUT
        whose connection closed unanswered, see ONE_ATTEMPT): when the first attempt had
        landed, the retry meets that very object and S3 answers 412. Telling that apart from
        a rival's object takes one HEAD (and a GET only if the etag is not the body's MD5, as
        under SSE-KMS). What ckptfs creates exclusively is unique to its writer (records carry
        the writer id, the time and their hash; leases a nonce), so the same bytes mean the
        same write.
        """
        if not data:
            raise ValueError("refusing an exclusive PUT of zero bytes (s3fs can empty the object)")
        try:
            return self._put(key, data, IfNoneMatch="*")
        except (FileExistsError, PreconditionFailed):  # s3fs spells an If-None-Match 412 so
            etag = self._holds(key, data)
            if etag is None:
                raise FileExistsError(key) from None
            logger.info("%s: %s: a retried exclusive PUT met its own first attempt; it landed",
                        self.display_name, key)
            return etag

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Compare-and-swap; a 412 for an object now holding exactly `data` is our own write
        (its first attempt landed and a retry found the etag moved on: see put_if_absent)."""
        try:
            return self._put(key, data, IfMatch=etag)
        except PreconditionFailed:
            landed = self._holds(key, data)
            if landed is None:
                raise
            logger.info("%s: %s: a retried conditional PUT met its own first attempt; it landed",
                        self.display_name, key)
            return landed

    def _holds(self, key: str, data: bytes) -> str | None:
        """The object's etag if it holds exactly `data`, else None (absent, or other bytes)."""
        try:
            with self._errors(key):
                head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return None
        etag = str(head.get("ETag", ""))
        if int(head.get("ContentLength", -1)) != len(data):
            return None
        if etag.strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest():
            return etag
        try:  # an etag that is not the MD5 (SSE-KMS, multipart): compare the bytes themselves
            stored, etag = self.get_with_etag(key)
        except FileNotFoundError:
            return None
        return etag if stored == data else None

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        from fsspec.asyn import sync

        async def _get() -> tuple[bytes, str]:
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self._key(key))
            body = resp["Body"]
            try:
                data = await body.read()
            finally:
                body.close()
            return data, str(resp.get("ETag", ""))

        with self._errors(key):
            result: tuple[bytes, str] = sync(self.fs.loop, _get)
            return result

    def _list(self, prefix: str, delimiter: bool, start_after: str | None) -> Keys:
        full = self._key(prefix.rstrip("/")) + "/" if prefix else (self.prefix + "/" if self.prefix else "")
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
        if delimiter:
            kw["Delimiter"] = "/"
        if start_after:
            kw["StartAfter"] = self._key(start_after)
        out: Keys = []
        with self._errors(prefix):
            while True:
                resp = self.fs.call_s3("list_objects_v2", **kw)
                if delimiter:
                    out.extend(p["Prefix"] for p in resp.get("CommonPrefixes", []))
                else:
                    out.extend(o["Key"] for o in resp.get("Contents", []))
                if not resp.get("IsTruncated"):
                    return out
                kw["ContinuationToken"] = resp["NextContinuationToken"]
                kw.pop("StartAfter", None)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return sorted(self._rel(k) for k in self._list(prefix, False, start_after))

    def list_dirs(self, prefix: str) -> Keys:
        return sorted(self._rel(p).rstrip("/").rsplit("/", 1)[-1]
                      for p in self._list(prefix, True, None))

    def delete(self, key: str) -> None:
        with self._errors(key, "delete"):
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self._key(key))

    def delete_many(self, keys: Sequence[str]) -> None:
        """DeleteObjects, 1,000 keys a request (S3's limit), in order: retention removes a
        thousand records in one round trip instead of a thousand. A key S3 reports it could not
        delete is an error naming it; an absent key is no error (as `delete`)."""
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            objects = [{"Key": self._key(k)} for k in chunk]
            with self._errors(chunk[0] if chunk else None, "delete"):
                resp = self.fs.call_s3("delete_objects", Bucket=self.bucket,
                                       Delete={"Objects": objects, "Quiet": True})
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                if first.get("Code") in _DENIED_CODES:  # a policy without s3:DeleteObject answers so
                    raise self._denied(self._rel(first.get("Key", "")), "delete",
                                       f"{len(errors)} of {len(chunk)} objects refused, first with "
                                       f"{first.get('Code')}: {first.get('Message')}")
                raise StorageUnavailableError(
                    f"{self.display_name}: could not delete {len(errors)} of {len(chunk)} objects, "
                    f"first {self._rel(first.get('Key', ''))!r}: {first.get('Code')} {first.get('Message')}")

    def size(self, key: str) -> int:
        with self._errors(key):
            resp = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(key))
        return int(resp["ContentLength"])

    def modified(self, key: str) -> float:
        return self.modified_and_now(key)[0]

    def modified_and_now(self, key: str) -> tuple[float, float | None]:
        """LastModified and the server's Date from one HEAD: the reply's Date is the store's
        now, on the clock that dates its objects (both whole seconds). None for it when the
        reply has no Date a parser takes (a proxy that strips it): the caller then bounds the
        store's now itself."""
        with self._errors(key):
            resp = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(key))
        headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return float(resp["LastModified"].timestamp()), http_date(headers.get("date"))

    def touch(self, key: str) -> None:
        """Copy the object onto itself with new metadata: S3's only way to renew LastModified."""
        full = self._key(key)
        with self._errors(key, "write"):
            self.fs.call_s3("copy_object", Bucket=self.bucket, Key=full,
                            CopySource={"Bucket": self.bucket, "Key": full},
                            MetadataDirective="REPLACE", Metadata={"ckptfs-touched": f"{time.time():.0f}"})

    def put_stream(self, key: str, src: IO[bytes], exclusive: bool = False) -> None:
        """Stream to one object; a failure aborts the upload so nothing partial appears.

        fsspec's file would upload whatever it buffered when closed during an exception, so
        the file is discarded (aborting any multipart upload) and marked closed instead.
        Errors reading `src` propagate as they are; errors writing are mapped as usual.
        """
        path = f"{self.bucket}/{self._key(key)}"
        first = src.read(COPY_CHUNK)
        if not first:
            self.put_if_absent(key, b"") if exclusive else self.put(key, b"")
            return
        with self._errors(key, "write"):
            f = self.fs.open(path, "xb" if exclusive else "wb", block_size=8 * COPY_CHUNK)
        try:
            chunk = first
            while chunk:
                with self._errors(key, "write"):
                    f.write(chunk)
                chunk = src.read(COPY_CHUNK)
        except BaseException:
            with contextlib.suppress(Exception):
                f.discard()
            f.closed = True
            raise
        with self._errors(key, "write"):
            f.close()

    def open_read(self, key: str) -> IO[bytes]:
        with self._errors(key):
            f: IO[bytes] = self.fs.open(f"{self.bucket}/{self._key(key)}", "rb")
            return f

    def check(self) -> None:
        """Reach the bucket with a listing of this store's own prefix, one key at most.

        Not HeadBucket: AWS authorises it as s3:ListBucket with no s3:prefix, which a policy
        granting only this prefix (backends/s3/iam-policy.json) refuses.
        """
        try:
            with self._errors():
                self.fs.call_s3("list_objects_v2", Bucket=self.bucket, MaxKeys=1,
                                Prefix=f"{self.prefix}/" if self.prefix else "")
        except FileNotFoundError:
            raise StorageUnavailableError(
                f"{self.display_name}: bucket {self.bucket!r} does not exist") from None


# -------------------------------------------------------------------------------- factory
