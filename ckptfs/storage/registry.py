"""From a URL to its Storage: the one place that maps a scheme to a backend."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ckptfs.errors import ConfigError, StorageUnavailableError
from ckptfs.storage.base import Storage
from ckptfs.storage.generic import FsspecStorage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.memory import MemoryStorage
from ckptfs.storage.redact import has_credentials, redact_url, scrub_secrets
from ckptfs.storage.s3 import S3Storage

_INSTALL_HINTS = {"gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """Build the Storage a URL names: `file:///p`, a plain path, `memory://n`, `s3://b/p`, ..."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("store URL must be a non-empty string")
    opts = dict(storage_options or {})
    if "://" not in url:
        return LocalStorage(url, url, opts)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    shown = redact_url(url)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"{shown}: file:// URLs take no host; use file:///absolute/path")
        if not parts.path:
            raise ConfigError(f"{shown}: no path")
        return LocalStorage(url, parts.path, opts)
    if scheme in ("s3", "s3a"):
        if has_credentials(url):  # s3fs would ignore them: refused rather than silently unused
            raise ConfigError(f"{shown}: credentials do not belong in a store URL (shell history "
                              "and process lists keep it); give them as storage options "
                              "(-o key=... -o secret=...), AWS_* environment variables or a profile")
        bucket = parts.netloc
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
            raise ConfigError(f"{shown}: {bucket!r} is not a valid S3 bucket name")
        return S3Storage(url, bucket, parts.path, opts)
    import fsspec

    if scheme == "memory":
        root = "/" + (parts.netloc + parts.path).strip("/")
        if root == "/":
            raise ConfigError(f"{shown}: memory:// needs a name, e.g. memory://my-run-store")
        return MemoryStorage(url, fsspec.filesystem("memory"), root, opts)
    try:
        fs = fsspec.filesystem(scheme, **opts)
    except ValueError as exc:
        raise ConfigError(f"{shown}: unknown storage scheme {scheme!r} ({exc})") from None
    except ImportError:
        hint = _INSTALL_HINTS.get(scheme, f"the fsspec backend for {scheme}://")
        raise ConfigError(f"{shown}: {scheme}:// needs an extra package: pip install {hint}") from None
    except TypeError as exc:  # the backend wants arguments a URL alone does not give (ftp: host)
        msg = scrub_secrets(f"{shown}: {scheme}:// cannot be opened from this URL and these "
                            f"options: {exc}", opts)
        raise ConfigError(msg) from None
    except OSError as exc:  # the backend connects or opens a file at once (zip://, ftp, sftp)
        msg = scrub_secrets(f"{shown}: cannot open {scheme}://: {type(exc).__name__}: {exc}", opts)
        raise StorageUnavailableError(msg) from None
    root = fs._strip_protocol(url)
    return FsspecStorage(url, fs, root, opts)


def lives_in_process(url: str) -> bool:
    """Whether the backend a URL names keeps nothing past this process (memory:// today), asked
    without opening it: a command that writes there from the CLI would report what it copied and
    keep none of it, so destinations of mirror, restore and import-langgraph refuse such a URL."""
    if not isinstance(url, str) or "://" not in url:
        return False
    return urlsplit(url).scheme.lower() == "memory"


def open_target(target: str | Storage, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """A Storage for `target`: a URL is opened, a Storage is used as it is."""
    if isinstance(target, Storage):
        return target
    return open_storage(target, storage_options)


def list_keys(storage: Storage, prefix: str) -> list[str]:
    """List once, turning any failure to reach the store into StorageUnavailableError."""
    try:
        return storage.list(prefix)
    except (StorageUnavailableError, ConfigError):
        raise
    except Exception as exc:  # botocore/s3fs raise many types for a bad endpoint
        msg = scrub_secrets(f"{storage.display_url}: cannot list the store: {type(exc).__name__}: {exc}",
                            storage.options)
        raise StorageUnavailableError(msg) from None
