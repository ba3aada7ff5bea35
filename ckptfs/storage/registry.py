"""From a URL to its Storage: the one place that maps a scheme to a backend."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ckptfs.errors import ConfigError, StorageUnavailableError, cut_long_words, name_cut, quote_value
from ckptfs.storage.base import Storage
from ckptfs.storage.generic import FsspecStorage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.memory import MemoryStorage
from ckptfs.storage.options import check_options_depth
from ckptfs.storage.redact import has_credentials, redact_url, scrub_secrets
from ckptfs.storage.s3 import S3Storage

_INSTALL_HINTS = {"gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}
# fsspec's file systems over another file system, given as an instance or a chained URL: a URL
# alone builds none of them (dir:// raised AttributeError, generic:// RecursionError), and a
# cache in front of a store would serve stale heads
_WRAPPERS = frozenset({"dir", "blockcache", "cached", "filecache", "simplecache", "generic",
                       "asyncwrapper", "async_wrapper"})
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
# A scheme but for a '_' (RFC 3986 allows none): fsspec's arrow_hdfs and async_wrapper. urlsplit
# reads no scheme in such a URL, so it is refused by name here, never served.
_UNDERSCORED = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*_[A-Za-z0-9+.\-_]*")
_FORMS = "a path, file:///path, s3://bucket/prefix or memory://name"
_BUILT_HERE = ("file", "local", "s3", "s3a", "memory")  # the schemes served from urlsplit's parts


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """Build the Storage a URL names: `file:///p`, a plain path, `memory://n`, `s3://b/p`, ..."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("store URL must be a non-empty string")
    check_options_depth(storage_options, "storage_options")
    opts = dict(storage_options or {})
    if "://" not in url:
        return LocalStorage(url, url, opts)
    # Redacted, then cut (`name_cut`): every refusal below names the URL, some its bucket or
    # scheme and the backend's own error again, so a 5,000-character URL made a 15,000-character
    # error. Cut before redacting, a secret past the cut would be hidden by chance only.
    shown = name_cut(redact_url(url))
    head = url.split("://", 1)[0]
    if _UNDERSCORED.fullmatch(head):  # arrow_hdfs://: urlsplit finds no scheme in it
        scheme = head.lower()
        if scheme in _WRAPPERS:
            raise ConfigError(f"{shown}: {scheme}:// wraps another file system and names no store "
                              f"of its own; give the store's own URL: {_FORMS}")
        raise ConfigError(f"{shown}: unsupported storage scheme {quote_value(scheme)} (a URL scheme "
                          f"holds no '_'{_other_name(scheme)}); give {_FORMS}")
    if not _SCHEME.fullmatch(head):
        none = f" ({quote_value(head)} is none)" if head and "@" not in head else ""
        why = "chained URLs (a::b://...) are not supported" if "::" in head else \
            f"no URL scheme before '://'{none}"
        raise ConfigError(f"{shown}: {why}; give {_FORMS}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _BUILT_HERE and ("?" in url or "#" in url):
        # urlsplit puts them in a query and a fragment the backends below never see: the store
        # opened where the URL without them points (file:///d/store?x wrote into /d/store).
        # fsspec's own file system keeps them in the path instead; neither is what is named,
        # so neither is guessed: a plain path takes '?' and '#' as part of a name.
        hint = {"file": "a plain path takes '?' and '#' as part of a name",
                "memory": "name the store without them"}.get(
            "file" if scheme == "local" else scheme, "storage options go in -o KEY=VALUE, not the URL")
        raise ConfigError(f"{shown}: no query ('?') or fragment ('#') in {scheme}:// URLs: it would "
                          f"be dropped and the store opened at another place; {hint}")
    if scheme in ("file", "local"):  # local:// is fsspec's other name for file://: the same disk
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"{shown}: {scheme}:// URLs take no host; use {scheme}:///absolute/path")
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
            raise ConfigError(f"{shown}: {quote_value(bucket)} is not a valid S3 bucket name")
        return S3Storage(url, bucket, parts.path, opts)
    import fsspec

    if scheme == "memory":
        root = "/" + (parts.netloc + parts.path).strip("/")
        if root == "/":
            raise ConfigError(f"{shown}: memory:// needs a name, e.g. memory://my-run-store")
        return MemoryStorage(url, fsspec.filesystem("memory"), root, opts)
    if scheme in _WRAPPERS:
        raise ConfigError(f"{shown}: {scheme}:// wraps another file system and names no store of "
                          f"its own; give the store's own URL: {_FORMS}")
    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ValueError as exc:
        raise ConfigError(f"{shown}: unknown storage scheme {quote_value(scheme)} "
                          f"({cut_long_words(str(exc))}); give {_FORMS}") from None
    except ImportError:
        hint = _INSTALL_HINTS.get(scheme, f"the fsspec backend for {scheme}://")
        raise ConfigError(f"{shown}: {scheme}:// needs an extra package: pip install {hint}") from None
    try:
        fs = cls(**opts)
        root = fs._strip_protocol(url)
    except ImportError:
        hint = _INSTALL_HINTS.get(scheme, f"the fsspec backend for {scheme}://")
        raise ConfigError(f"{shown}: {scheme}:// needs an extra package: pip install {hint}") from None
    except TypeError as exc:  # the backend wants arguments a URL alone does not give (ftp: host)
        msg = scrub_secrets(f"{shown}: {scheme}:// cannot be opened from this URL and these "
                            f"options: {exc}", opts)
        raise ConfigError(cut_long_words(msg)) from None
    except OSError as exc:  # the backend connects or opens a file at once (zip://, ftp, sftp)
        msg = scrub_secrets(f"{shown}: cannot open {scheme}://: {type(exc).__name__}: {exc}", opts)
        raise StorageUnavailableError(cut_long_words(msg)) from None
    except Exception as exc:  # a backend's own check of its arguments: whatever type it raises
        msg = scrub_secrets(f"{shown}: {scheme}:// cannot be opened from this URL and these "
                            f"options: {type(exc).__name__}: {exc}", opts)
        raise ConfigError(cut_long_words(msg)) from None
    if not isinstance(root, str) or not root:
        raise ConfigError(f"{shown}: no path to a store in this URL; give {_FORMS}")
    return FsspecStorage(url, fs, root, opts)


def _other_name(scheme: str) -> str:
    """`; fsspec's other name for it is hdfs://` when fsspec serves `scheme` by a class that a
    valid scheme names too (arrow_hdfs is hdfs), else ""."""
    from fsspec.registry import known_implementations

    cls = known_implementations.get(scheme, {}).get("class")
    same = sorted(p for p, impl in known_implementations.items()
                  if cls and impl.get("class") == cls and _SCHEME.fullmatch(p))
    return f"; fsspec's other name for it is {same[0]}://" if same else ""


def meant_url(path: str) -> str | None:
    """The URL a plain path that starts like one may have meant: `memory:runs` is a local
    directory of that name (no `//`), which holding nothing is likelier `memory://runs`."""
    scheme, colon, rest = path.partition(":")
    if not colon or "://" in path or not _SCHEME.fullmatch(scheme):
        return None
    lower = scheme.lower()
    if lower in ("file", "local"):  # no host: the path after three slashes
        return f"{scheme}:///{rest.lstrip('/') or 'path'}"
    if lower not in ("memory", "s3", "s3a", *_INSTALL_HINTS):
        return None
    return f"{scheme}://{rest.lstrip('/') or ('NAME' if lower == 'memory' else 'BUCKET/PREFIX')}"


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
        # the URL cut by name, the error's long words cut (an OSError quotes the whole path),
        # each after its secrets are hidden: a cut secret is no longer found whole
        why = cut_long_words(scrub_secrets(f"{type(exc).__name__}: {exc}", storage.options))
        msg = scrub_secrets(f"{storage.display_name}: cannot list the store: {why}",
                            storage.options)
        raise StorageUnavailableError(msg) from None
