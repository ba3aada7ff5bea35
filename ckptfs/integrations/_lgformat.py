"""Byte format of the LangGraph saver's objects: pack and unpack, with zstd delta frames.

Pure bytes <-> structure, no I/O, nothing executed. One object is::

    b"CKLG\\x01" | u32 len(frame0) | frame0 | channel frame 1 | channel frame 2 | ...

frame0 is a plain zstd frame of ``u32 len(header) | header JSON | raw parts`` (for a checkpoint:
LangGraph's serialized checkpoint and metadata). Each channel version is its own zstd frame,
either whole or compressed against the previous version of that channel used as a raw-content
dictionary; the header names that base (the checkpoint id holding it) and the chain depth, so a
read after a crash can rebuild it, and a frame's content checksum catches a wrong base. Every
frame declares its size, which is checked against a limit before any memory is spent.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import zstandard

from ckptfs.errors import CorruptFileError, DecodeLimitError

MAGIC = b"CKLG\x01"
FORMAT_VERSION = 1
DEFAULT_MAX_DECODED = 512 * 1024 * 1024
FULL_LEVEL = 3
MIN_DELTA_BYTES = 256  # smaller values are stored whole: a chain would cost reads for nothing
MAX_DELTA_BASE = 64 * 1024 * 1024  # past this, a raw dictionary would need a window over 2**27
_U32 = struct.Struct("<I")


@dataclass
class Part:
    """One channel version inside an object: its compressed frame and how to rebuild it."""

    channel: str
    type: str
    frame: bytes
    base: str | None = None  # checkpoint id whose version of this channel is the dictionary
    depth: int = 0  # number of bases to read before this one (0: the frame is whole)

    def meta(self) -> dict[str, Any]:
        return {"c": self.channel, "t": self.type, "z": len(self.frame), "b": self.base, "d": self.depth}


@dataclass
class Unpacked:
    """A decoded object: header, raw parts of frame0, and the still-compressed channel frames."""

    header: dict[str, Any]
    raw: bytes  # frame0's payload after the header (checkpoint bytes, then metadata bytes)
    parts: dict[str, Part] = field(default_factory=dict)

    def section(self, offset_field: str, length_field: str) -> bytes:
        start = int(self.header.get(offset_field, 0))
        return self.raw[start : start + int(self.header.get(length_field, 0))]


def compress_full(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=FULL_LEVEL, write_checksum=True,
                                    write_content_size=True).compress(raw)


def compress_delta(raw: bytes, base: bytes) -> bytes:
    """`raw` compressed with `base` as a raw-content dictionary: the cost is the change, not the value.

    Parameters are chosen for a dictionary about as large as the value: a window covering both,
    a hash table big enough that the dictionary's positions survive, and the fast strategy
    (hashing the dictionary is most of the CPU; matches then run long).
    """
    total = len(raw) + len(base)
    window_log = min(27, max(17, total.bit_length() + 1))
    hash_log = min(18, max(12, len(base).bit_length() - 2))
    params = zstandard.ZstdCompressionParameters(
        window_log=window_log, hash_log=hash_log, chain_log=hash_log, search_log=1, min_match=6,
        target_length=0, strategy=zstandard.STRATEGY_FAST, write_checksum=1, write_content_size=1)
    cdict = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdCompressor(dict_data=cdict, compression_params=params).compress(raw)


def decompress(frame: bytes, key: str, base: bytes | None = None,
               max_size: int = DEFAULT_MAX_DECODED) -> bytes:
    """Bounded decode of one whole frame (with `base` as its dictionary when it is a delta)."""
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"not a zstd frame ({exc})") from None
    size = params.content_size
    if size in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR):
        raise CorruptFileError(key, "zstd frame does not declare its size")
    if not params.has_checksum:
        raise CorruptFileError(key, "zstd frame has no content checksum")
    if size > max_size:
        raise DecodeLimitError(key, f"decompresses to {size} bytes, over the limit of {max_size}")
    try:
        if base is None:
            dctx = zstandard.ZstdDecompressor(max_window_size=2**27)
        else:
            cdict = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
            dctx = zstandard.ZstdDecompressor(dict_data=cdict, max_window_size=2**27)
        out = dctx.decompress(frame, max_output_size=max(size, 1))
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"zstd decode failed: {exc}") from None
    if len(out) != size:
        raise CorruptFileError(key, f"decoded {len(out)} bytes, frame declared {size}")
    return out


def pack(header: dict[str, Any], raw: bytes, parts: list[Part]) -> bytes:
    """Build one object; `header` gains the part list, `raw` goes after it in frame0."""
    header = dict(header, v=FORMAT_VERSION, parts=[p.meta() for p in parts])
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    frame0 = compress_full(_U32.pack(len(head)) + head + raw)
    return b"".join([MAGIC, _U32.pack(len(frame0)), frame0, *(p.frame for p in parts)])


def unpack(data: bytes, key: str, max_size: int = DEFAULT_MAX_DECODED) -> Unpacked:
    """Parse an object; channel frames stay compressed until someone needs their value."""
    if not data.startswith(MAGIC):
        if data[:4] == MAGIC[:4]:
            raise CorruptFileError(key, f"LangGraph object format {data[4:5]!r} is not supported")
        raise CorruptFileError(key, "not a ckptfs LangGraph object")
    pos = len(MAGIC)
    if len(data) < pos + 4:
        raise CorruptFileError(key, "object is truncated")
    (n0,) = _U32.unpack_from(data, pos)
    pos += 4
    payload = decompress(data[pos : pos + n0], key, max_size=max_size)
    pos += n0
    if len(payload) < 4:
        raise CorruptFileError(key, "header is truncated")
    (nh,) = _U32.unpack_from(payload, 0)
    try:
        header = json.loads(payload[4 : 4 + nh])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(key, f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("v") != FORMAT_VERSION:
        raise CorruptFileError(key, "header is not a version-1 LangGraph object header")
    out = Unpacked(header=header, raw=payload[4 + nh :])
    try:
        for meta in header.get("parts", []):
            z = int(meta["z"])
            frame = data[pos : pos + z]
            if len(frame) != z:
                raise CorruptFileError(key, f"channel {meta['c']!r}: frame is truncated")
            pos += z
            out.parts[str(meta["c"])] = Part(channel=str(meta["c"]), type=str(meta["t"]), frame=frame,
                                             base=meta["b"], depth=int(meta["d"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(key, f"bad part list in header: {exc}") from None
    if pos != len(data):
        raise CorruptFileError(key, f"object has {len(data) - pos} unexpected trailing bytes")
    return out


def repack(obj: Unpacked, keep: set[str], **header_changes: Any) -> bytes:
    """The object with only the channel frames in `keep` (no recompression), e.g. for `held/`."""
    header = {k: v for k, v in obj.header.items() if k not in ("v", "parts")}
    header.update(header_changes)
    return pack(header, obj.raw, [p for c, p in obj.parts.items() if c in keep])
