"""Byte format of the LangGraph saver's objects: pack and unpack, with zstd delta frames.

Pure bytes <-> structure, no I/O, nothing executed. One object is::

    b"CKLG\\x01" | u32 len(frame0) | frame0 | channel frame 1 | channel frame 2 | ...

frame0 is a plain zstd frame of ``u32 len(header) | header JSON | raw parts`` (for a checkpoint:
LangGraph's serialized checkpoint and metadata). Each channel version is stored one of three ways
(the part's kind, ``k`` in the header):

- ``w`` whole: one zstd frame of the value.
- ``s`` splice: copy ranges of the previous version plus inserted bytes (one zstd frame of the
  inserts). A message list that gained a message serializes to the old bytes with a new length
  prefix and a new tail; finding that costs two memcmp-speed scans, where a zstd dictionary delta
  first hashes the whole previous value (5.6 ms for a 1 MB value here, against ~0.1 ms).
- ``z`` zstd delta: the value compressed with the previous version as a raw-content dictionary,
  for edits a splice cannot express cheaply.

Deltas name their base (the checkpoint id holding the previous version) and the chain depth, so
a read after a crash can rebuild them. Every frame declares its size, checked against a limit
before memory is spent; a splice also records the value's length and xxh3-64, so a wrong or
damaged base is caught rather than returned.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

import msgspec
import xxhash
import zstandard

from ckptfs.errors import CorruptFileError, DecodeLimitError

MAGIC = b"CKLG\x01"
FORMAT_VERSION = 2  # 2 adds part kinds (splice); version-1 objects still read
READABLE_VERSIONS = (1, 2)
DEFAULT_MAX_DECODED = 512 * 1024 * 1024
FULL_LEVEL = 3
MIN_DELTA_BYTES = 256  # smaller values are stored whole: a chain would cost reads for nothing
MAX_DELTA_BASE = 64 * 1024 * 1024  # past this, a raw dictionary would need a window over 2**27
SPLICE_MIN_SHARE = 0.5  # a splice must copy at least this share of the value, else zstd delta
_PROBE = 64  # bytes of the base's end looked for in the new value
_WIDE_PROBE = 1024
_SHIFTS = sorted(range(-16, 17), key=abs)  # length-prefix changes tried, smallest first
_U32 = struct.Struct("<I")
# Headers are JSON. msgspec writes them 15-20x faster than the standard library (0.6 us against
# 10 us warm, ~17 us in a put's cold caches, of a 10-message put's ~200 us of our own) and reads
# them 3x faster; the standard library stays for what msgspec would do differently (below).
_FAST_JSON_OUT = msgspec.json.Encoder()
_FAST_JSON_IN = msgspec.json.Decoder()
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_local = threading.local()  # zstd (de)compressors are not thread-safe; one per thread is reused


@dataclass
class Part:
    """One channel version inside an object: its compressed frame and how to rebuild it."""

    channel: str
    type: str
    frame: bytes
    base: str | None = None  # checkpoint id holding the previous version this one is built on
    depth: int = 0  # number of bases to read before this one (0: the frame is whole)
    kind: str = "w"  # w whole, s splice, z zstd delta
    ops: list[list[int]] | None = None  # splice: [[base offset, n] | [-1, n inserted], ...]
    size: int = 0  # splice: length of the value
    digest: str = ""  # splice: xxh3-64 hex of the value

    def meta(self) -> dict[str, Any]:
        out = {"c": self.channel, "t": self.type, "z": len(self.frame), "b": self.base, "d": self.depth,
               "k": self.kind}
        if self.kind == "s":
            out.update(o=self.ops, n=self.size, h=self.digest)
        return out


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
    cctx = getattr(_local, "cctx", None)
    if cctx is None:
        cctx = _local.cctx = zstandard.ZstdCompressor(level=FULL_LEVEL, write_checksum=True,
                                                      write_content_size=True)
    return cctx.compress(raw)


def _common_suffix(base: bytes, raw: bytes, end: int, known: int) -> int:
    """Largest L with raw[end-L:end] == base[-L:], given that `known` bytes already match.

    A changed length prefix is a few bytes at the very start, so the longest candidates are
    tried first: each failure stops at its first byte, the success is one memcmp.
    """
    view = memoryview(base)
    top = min(len(base), end)
    for length in range(top, max(known, top - 16) - 1, -1):
        if raw.endswith(view[len(base) - length :], 0, end):
            return length
    lo, hi = known, top - 16  # raw matches at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if raw.endswith(view[len(base) - mid :], 0, end):
            lo = mid
        else:
            hi = mid
    return lo


def _common_prefix(a: bytes, b: bytes, limit: int) -> int:
    lo, hi = 0, limit + 1  # a[:lo] == b[:lo]; a[:hi] != b[:hi] (or hi past the limit)
    view = memoryview(a)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b.startswith(view[:mid]):
            lo = mid
        else:
            hi = mid
    return lo


def find_splice(base: bytes, raw: bytes) -> tuple[list[list[int]], bytes] | None:
    """`raw` as copies of `base` plus inserted bytes, when one long run of `base` survives in it.

    Covers a list that grew at the end or was trimmed at the front (the serialized length
    prefix changes, the old elements stay byte for byte). Returns (ops, inserts) or None when
    the copied share would be under SPLICE_MIN_SHARE.
    """
    nb, nr = len(base), len(raw)
    if nb < _PROBE or nr < _PROBE:
        return None
    # Where base's last bytes sit in raw: for a list that grew at the end, exactly where they
    # were give or take the length prefix's change; otherwise search with a longer probe, as
    # serialized elements share their trailing bytes and a short one matches at every element.
    probe = memoryview(base)[-_PROBE:]
    end = next((nb + d for d in _SHIFTS if raw.startswith(probe, nb - _PROBE + d)), -1)
    if end < 0:
        wide = min(_WIDE_PROBE, nb)
        q = raw.find(memoryview(base)[-wide:])
        if q < 0:
            return None
        end = q + wide
    run = _common_suffix(base, raw, end, _PROBE)
    new_start, old_start = end - run, nb - run
    head = _common_prefix(base, raw, min(old_start, new_start))
    if head + run < SPLICE_MIN_SHARE * nr:
        return None
    ops: list[list[int]] = []
    if head:
        ops.append([0, head])
    if new_start > head:
        ops.append([-1, new_start - head])
    ops.append([old_start, run])
    if nr > end:
        ops.append([-1, nr - end])
    return ops, raw[head:new_start] + raw[end:]


def encode_part(channel: str, typ: str, raw: bytes, prev: bytes | None = None,
                prev_id: str | None = None, depth: int = 0) -> Part:
    """One channel version: a splice or zstd delta against `prev` (at chain `depth`), else whole."""
    if prev is None or prev_id is None:
        return Part(channel, typ, compress_full(raw))
    found = find_splice(prev, raw)
    if found is not None:
        ops, inserts = found
        return Part(channel, typ, compress_full(inserts), prev_id, depth, "s", ops, len(raw),
                    xxhash.xxh3_64_hexdigest(raw))
    return Part(channel, typ, compress_delta(raw, prev), prev_id, depth, "z")


def decode_part(part: Part, key: str, base: bytes | None, max_size: int = DEFAULT_MAX_DECODED) -> bytes:
    """The value of a part; `base` is the previous version's value when the part is a delta."""
    if part.kind == "w":
        return decompress(part.frame, key, None, max_size)
    if base is None:
        raise CorruptFileError(key, "delta part without its base")
    if part.kind == "z":
        return decompress(part.frame, key, base, max_size)
    if part.kind != "s" or part.ops is None:
        raise CorruptFileError(key, f"unknown part kind {part.kind!r}")
    if part.size > max_size:
        raise DecodeLimitError(key, f"decompresses to {part.size} bytes, over the limit of {max_size}")
    inserts = decompress(part.frame, key, None, max_size)
    pieces: list[bytes | memoryview] = []
    view, at, total = memoryview(base), 0, 0
    for src, n in part.ops:
        if n < 0 or src < -1 or (src >= 0 and src + n > len(base)):
            raise CorruptFileError(key, f"splice range [{src}, {n}] outside its base")
        if src == -1:
            pieces.append(inserts[at : at + n])
            at += n
        else:
            pieces.append(view[src : src + n])
        total += n
    if at != len(inserts) or total != part.size:
        raise CorruptFileError(key, "splice ranges do not add up to the stored value")
    out = b"".join(pieces)
    if xxhash.xxh3_64_hexdigest(out) != part.digest:
        raise CorruptFileError(key, "spliced value does not match its checksum (wrong or damaged base)")
    return out


def _plain_dctx() -> zstandard.ZstdDecompressor:
    """This thread's decompressor for frames without a dictionary: making one costs ~13 us, more
    than decoding a checkpoint's small frames, and `decompress` resets it before each frame."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor(max_window_size=2**27)
    return dctx


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
            dctx = _plain_dctx()
        else:
            cdict = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
            dctx = zstandard.ZstdDecompressor(dict_data=cdict, max_window_size=2**27)
        out = dctx.decompress(frame, max_output_size=max(size, 1))
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"zstd decode failed: {exc}") from None
    if len(out) != size:
        raise CorruptFileError(key, f"decoded {len(out)} bytes, frame declared {size}")
    return out


_PLAIN = frozenset((int, str, float, type(None)))  # exact types (a bool, an int subclass, is not one)
_NAMES = frozenset((str,))


def _msgspec_writes_as_before(header: dict[str, Any]) -> bool:
    """Whether msgspec writes the header's user values (channel names and versions in refs, the
    parent id, a writes header's task path) as the standard library does or would refuse to.

    msgspec writes a NaN or an infinity as null, where JSON has no spelling for it, and writes
    types the standard library refuses (Decimal, UUID, datetime, bytes, set, Enum, dataclasses)
    as strings, lists or objects: a version stored so reads back as another value of another
    type, never equal to the checkpoint's own version again, and a channel a later put inherits
    unchanged (not in its values) would be dropped from that put's refs. Those go through the
    standard encoder, which refuses them as it always has."""
    if type(header.get("parent")) not in _PLAIN or type(header.get("path")) not in _PLAIN:
        return False
    refs = header.get("refs")
    if not isinstance(refs, dict) or not refs:
        return True
    try:
        versions = {type(version) for _holder, version in refs.values()}
    except (TypeError, ValueError):  # not [holder, version] pairs: the standard encoder decides
        return False
    if not versions <= _PLAIN or not {type(channel) for channel in refs} <= _NAMES:
        return False
    return float not in versions or all(
        math.isfinite(version) for _holder, version in refs.values() if type(version) is float)


def encode_header(header: dict[str, Any]) -> bytes:
    """The header's JSON, compact, UTF-8. A value msgspec cannot write, or would write otherwise
    than the standard library (NaN, infinities, a type JSON has no spelling for), goes through
    the standard library's encoder, which raises as it always has."""
    if _msgspec_writes_as_before(header):
        try:
            return _FAST_JSON_OUT.encode(header)
        except (TypeError, OverflowError):
            pass  # an unusual type (an int subclass, say): the standard encoder decides
    return _HEADER_JSON.encode(header).encode()


def decode_header(data: bytes | memoryview) -> Any:
    """A header's JSON. What msgspec refuses but the standard library reads (a NaN literal, an
    escaped lone surrogate, a number past a double's range) is read as before, by the standard
    library; what neither reads raises its ValueError (json.JSONDecodeError, UnicodeDecodeError,
    and nesting past either parser's depth, where both raised RecursionError: `verify` said
    'unexpected RecursionError', exit 3, of a damaged object instead of naming it)."""
    try:
        return _FAST_JSON_IN.decode(data)
    except msgspec.MsgspecError:
        pass
    except RecursionError:  # both parsers give up on deep nesting: no header of ours nests
        raise ValueError("header nests too deeply") from None
    try:
        return json.loads(bytes(data))
    except RecursionError:
        raise ValueError("header nests too deeply") from None


def pack(header: dict[str, Any], raw: bytes, parts: list[Part]) -> bytes:
    """Build one object; `header` gains the part list, `raw` goes after it in frame0."""
    header = dict(header, v=FORMAT_VERSION, parts=[p.meta() for p in parts])
    head = encode_header(header)
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
        header = decode_header(payload[4 : 4 + nh])
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError, deep nesting
        raise CorruptFileError(key, f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("v") not in READABLE_VERSIONS:
        raise CorruptFileError(key, f"header is not a LangGraph object header of version {READABLE_VERSIONS}")
    out = Unpacked(header=header, raw=payload[4 + nh :])
    try:
        for meta in header.get("parts", []):
            z = int(meta["z"])
            frame = data[pos : pos + z]
            if len(frame) != z:
                raise CorruptFileError(key, f"channel {meta['c']!r}: frame is truncated")
            pos += z
            base = meta["b"]
            kind = str(meta.get("k", "w" if base is None else "z"))
            part = Part(channel=str(meta["c"]), type=str(meta["t"]), frame=frame,
                        base=None if base is None else str(base), depth=int(meta["d"]), kind=kind)
            if kind == "s":
                part.ops = [[int(src), int(n)] for src, n in meta["o"]]
                part.size, part.digest = int(meta["n"]), str(meta["h"])
            out.parts[part.channel] = part
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptFileError(key, f"bad part list in header: {exc}") from None
    if pos != len(data):
        raise CorruptFileError(key, f"object has {len(data) - pos} unexpected trailing bytes")
    return out


def repack(obj: Unpacked, keep: set[str], **header_changes: Any) -> bytes:
    """The object with only the channel frames in `keep` (no recompression), e.g. for `held/`."""
    header = {k: v for k, v in obj.header.items() if k not in ("v", "parts")}
    header.update(header_changes)
    return pack(header, obj.raw, [p for c, p in obj.parts.items() if c in keep])
