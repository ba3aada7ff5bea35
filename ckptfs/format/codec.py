"""Snapshot file format: one standard zstd frame around a self-describing JSON document.

Pure bytes <-> document, no I/O. A file opens with `zstd -d FILE | jq .`. The frame carries
zstd's content checksum and its content size; the document carries a format name and
version, the run and version it belongs to, the hash chain (`base_hash` -> `hash`) and the
sha256 of the exact body bytes. Decoding is bounded: the declared size is checked before
any memory is spent, the frame is walked to refuse trailing or missing bytes, and nothing
in a file is ever executed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import zstandard
from pydantic import BaseModel, ConfigDict, ValidationError

from ckptfs.errors import CorruptFileError, DecodeLimitError, UnsupportedFormatError

FORMAT_NAME = "ckptfs"
FORMAT_VERSION = 1
DEFAULT_MAX_DECODED_BYTES = 512 * 1024 * 1024
DEFAULT_LEVEL = 3

RecordKind = Literal["journal", "delta", "snapshot"]

# A zstd skippable frame (RFC 8878 3.1.2) after the data frame carries the sha256 of the data
# frame's bytes. zstd's own checksum covers the decompressed content only, and some bit flips
# in a compressed frame (unused entropy-table bits) decode to identical content; the trailer
# makes every byte of the file count. `zstd -d` skips the frame, so standard tools still work.
_SKIPPABLE_MAGIC = (0x184D2A5C).to_bytes(4, "little")
_TRAILER_LEN = 4 + 4 + 32


class RecordHeader(BaseModel):
    """Everything in a file but its body; validated strictly so a stray file is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str
    format_version: int
    kind: RecordKind
    run_id: str
    version: int
    base: int
    base_hash: str
    hash: str
    body_sha256: str
    writer: str
    time: float
    summary: dict[str, Any] = {}


class Record(BaseModel):
    """A decoded file: header plus the parsed body."""

    model_config = ConfigDict(frozen=True)

    header: RecordHeader
    body: Any
    stored_size: int = 0


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes; NaN and infinities are refused because `jq` cannot read them."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chain_hash(base_hash: str, body_sha256: str, version: int) -> str:
    """The hash a version is known by: it commits to every earlier version through `base_hash`."""
    return sha256_hex(f"{base_hash}:{version}:{body_sha256}".encode())


def _prefix(header: RecordHeader) -> bytes:
    head = json.dumps(
        header.model_dump(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    return head[:-1] + b',"body":'


def encode(header: RecordHeader, body_json: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """Frame `body_json` (already serialised, so its sha256 is exact) under `header`."""
    if header.body_sha256 != sha256_hex(body_json):
        raise ValueError("header.body_sha256 does not match the body being encoded")
    text = _prefix(header) + body_json + b"}"
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    frame = cctx.compress(text)
    return frame + _SKIPPABLE_MAGIC + (32).to_bytes(4, "little") + hashlib.sha256(frame).digest()


def file_digest(data: bytes) -> str | None:
    """The sha256 a file's trailer claims for its data frame (hex), without decoding it.

    Used to compare copies cheaply (mirror); None when the trailer is missing.
    """
    if len(data) < _TRAILER_LEN or data[-_TRAILER_LEN:-36] != _SKIPPABLE_MAGIC:
        return None
    return data[-32:].hex()


def _frame_end(data: bytes, has_checksum: bool) -> int:
    """Walk the block headers to find where the single frame ends (format: RFC 8878 3.1.1.2)."""
    pos = zstandard.frame_header_size(data)
    while True:
        if pos + 3 > len(data):
            raise ValueError("frame is truncated")
        hdr = int.from_bytes(data[pos : pos + 3], "little")
        pos += 3
        block_type = (hdr >> 1) & 3
        if block_type == 3:
            raise ValueError("reserved block type")
        pos += 1 if block_type == 1 else hdr >> 3
        if hdr & 1:
            break
    return pos + (4 if has_checksum else 0)


def verify_digest(data: bytes, key: str) -> None:
    """Check a file's bytes against its trailer without decoding it (CorruptFileError if not)."""
    claimed = file_digest(data)
    if claimed is None:
        raise CorruptFileError(key, "missing or damaged integrity trailer (truncated file?)")
    if hashlib.sha256(data[:-_TRAILER_LEN]).hexdigest() != claimed:
        raise CorruptFileError(key, "file sha256 does not match its trailer (bytes changed)")


def decompress(data: bytes, key: str, max_size: int = DEFAULT_MAX_DECODED_BYTES) -> bytes:
    """Bounded, strict zstd decode of one whole frame with its content checksum and trailer."""
    if len(data) < _TRAILER_LEN or data[-_TRAILER_LEN:-36] != _SKIPPABLE_MAGIC or (
            data[-36:-32] != (32).to_bytes(4, "little")):
        raise CorruptFileError(key, "missing or damaged integrity trailer (truncated file?)")
    digest, data = data[-32:], data[:-_TRAILER_LEN]
    if hashlib.sha256(data).digest() != digest:
        raise CorruptFileError(key, "file sha256 does not match its trailer (bytes changed)")
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"not a zstd frame ({exc})") from None
    if not params.has_checksum:
        raise CorruptFileError(key, "zstd frame has no content checksum")
    size = params.content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN or size == zstandard.CONTENTSIZE_ERROR:
        raise CorruptFileError(key, "zstd frame does not declare its decompressed size")
    if size > max_size:
        raise DecodeLimitError(
            key, f"decompresses to {size} bytes, over the limit of {max_size} (zstd bomb?)"
        )
    try:
        end = _frame_end(data, params.has_checksum)
    except (ValueError, zstandard.ZstdError) as exc:
        raise CorruptFileError(key, f"damaged zstd frame: {exc}") from None
    if end != len(data):
        raise CorruptFileError(key, f"zstd frame is {end} bytes but the file has {len(data)}")
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=max_size)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"zstd decode failed: {exc}") from None
    if len(out) != size:
        raise CorruptFileError(key, f"decoded {len(out)} bytes, header declared {size}")
    return out


def decode(data: bytes, key: str, max_size: int = DEFAULT_MAX_DECODED_BYTES) -> Record:
    """Decode and validate one file; every failure is a CorruptFileError naming `key`."""
    text = decompress(data, key, max_size)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, giant ints, deep nesting
        raise CorruptFileError(key, f"document is not JSON: {type(exc).__name__}: "
                                    f"{str(exc)[:200]}") from None
    if not isinstance(doc, dict) or "body" not in doc:
        raise CorruptFileError(key, "document is not a ckptfs record")
    if doc.get("format") != FORMAT_NAME:
        raise CorruptFileError(key, f"format is {doc.get('format')!r}, not {FORMAT_NAME!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise UnsupportedFormatError(
            key,
            f"format version {doc.get('format_version')!r} is not supported by this ckptfs "
            f"(it reads version {FORMAT_VERSION}); upgrade ckptfs to read it",
        )
    body = doc.pop("body")
    try:
        header = RecordHeader.model_validate(doc)
    except ValidationError as exc:
        raise CorruptFileError(key, f"bad header: {exc.errors()[0]['msg']}") from None
    prefix = _prefix(header)
    if not text.startswith(prefix) or not text.endswith(b"}"):
        raise CorruptFileError(key, "document layout is not canonical")
    body_bytes = text[len(prefix) : -1]
    if sha256_hex(body_bytes) != header.body_sha256:
        raise CorruptFileError(key, "body sha256 does not match")
    if header.kind == "journal" and header.hash != chain_hash(
        header.base_hash, header.body_sha256, header.version
    ):
        raise CorruptFileError(key, "journal record hash does not follow from its base")
    if header.version <= header.base and header.kind != "snapshot":
        raise CorruptFileError(key, f"version {header.version} does not follow base {header.base}")
    return Record(header=header, body=body, stored_size=len(data))
