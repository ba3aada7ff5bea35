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
import math
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple

import zstandard
from pydantic import BaseModel, ConfigDict, ValidationError

from ckptfs.errors import (
    CorruptFileError,
    DecodeLimitError,
    RecordTooLargeError,
    UnsupportedFormatError,
)

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


_PLAIN_KEY = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' and '\\': quoted as it is


def dumps_key(key: str) -> bytes:
    """`dumps` of a step id (a JSON object key), without the encoder for the ids nearly every
    run uses: a snapshot names every step, and json.dumps costs ~3 us a call."""
    if _PLAIN_KEY.fullmatch(key):
        return b'"' + key.encode() + b'"'
    return dumps(key)


# ------------------------------------------------------------ what a load can give back

# CPython's default limit on int <-> str conversion (sys.int_info.default_max_str_digits): the
# reader's json.loads refuses a longer int literal, so a record holding one never loads again.
MAX_INT_DIGITS = 4300
# Containers nested deeper than this are refused: pydantic's serialiser stops far earlier (254),
# so in practice this only ends the walk over a value that contains itself.
MAX_NESTING = 1000


class Problem(NamedTuple):
    """Where a value stops being one a load gives back equal, and why."""

    path: str
    reason: str
    nonfinite: bool = False


def _int_bound() -> int:
    """Ints must stay below this in magnitude: the default limit, or this process's if lower."""
    limit = sys.get_int_max_str_digits()
    digits = MAX_INT_DIGITS if limit == 0 else min(limit, MAX_INT_DIGITS)
    bound = _INT_BOUNDS.get(digits)
    if bound is None:
        bound = _INT_BOUNDS[digits] = 10**digits
    return bound


_INT_BOUNDS: dict[int, int] = {}
_Node = tuple[Any, Any, Any, int]  # (value, parent node, key in the parent, depth)


def _path_of(node: _Node | None, key: Any = None) -> str:
    """`metadata.scores[3]` for a node of the walk (long paths keep their two ends)."""
    keys: list[Any] = [] if key is None else [key]
    root = ""
    while node is not None:
        if node[1] is None:
            root = node[2]
            break
        keys.append(node[2])
        node = node[1]
    keys.reverse()
    if len(keys) > 16:
        keys = [*keys[:8], f"...({len(keys) - 12} more)...", *keys[-4:]]
    out = root
    for k in keys:
        out += f"[{k}]" if type(k) is int else (f".{k}" if out else str(k))
    return out


def _scalar_problem(v: Any, bound: int) -> tuple[str, bool] | None:
    """(reason, non-finite) for a value that is not a JSON scalar a load returns equal."""
    if isinstance(v, str) or v is None:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        if -bound < v < bound:
            return None
        digits = int(v.bit_length() * math.log10(2)) + 1
        return (f"an int of about {digits} digits: JSON readers (Python's json among them) refuse "
                f"ints over {MAX_INT_DIGITS} digits, so no load could read the record (store it as "
                "a string)"), False
    if isinstance(v, float):
        if math.isfinite(v):
            return None
        return (f"{v!r} is not a number JSON can hold (it would be written as null, which a load "
                "refuses or returns as None)"), True
    if isinstance(v, set | frozenset):
        return "a set: JSON has none, a load would return a list (store a sorted list)", False
    if isinstance(v, tuple):
        return "a tuple: a load would return a list, which does not compare equal (store a list)", False
    if isinstance(v, bytes | bytearray | memoryview):
        return ("bytes: JSON has none (store text, or put_artifact() the bytes and keep the "
                "reference)"), False
    if isinstance(v, BaseModel):
        return (f"a {type(v).__name__} object: a load would return a plain dict (store "
                "model_dump(mode='json'))"), False
    return (f"a {type(v).__name__}: not a JSON value (dict, list, str, int, float, bool or None), "
            "so a load would not return it"), False


def _encodes(text: str) -> bool:
    """Whether `text` is valid Unicode text, which UTF-8 holds (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def json_problem(value: Any, path: str, bound: int | None = None) -> Problem | None:
    """The first place where `value` is not plain JSON that a load gives back equal, else None.

    The writer's half of "what a commit acknowledges, a load returns": the reader takes back
    exactly dicts with string keys, lists, strings, finite floats, ints of at most
    MAX_INT_DIGITS digits, booleans and None. Anything else is either refused by the reader
    (NaN, which pydantic writes as null; a giant int json.loads rejects) or silently changed
    (a set or tuple becomes a list, an int key a string key), so it is reported here, before a
    byte is written. Subclasses that compare equal to what a load returns (a str enum, an
    OrderedDict) pass. Iterative, so no depth of nesting costs the stack; scalars are checked
    inline by exact type, without allocating, since this runs on every commit.
    """
    if bound is None:
        bound = _int_bound()
    stack: list[_Node] = [(value, None, path, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        v = node[0]
        t = type(v)
        if t is dict or t is list or isinstance(v, dict | list):
            depth = node[3] + 1
            if depth > MAX_NESTING:
                return Problem(_path_of(node), f"nested deeper than {MAX_NESTING} levels (or it "
                                               "contains itself)")
            is_dict = t is dict or (t is not list and isinstance(v, dict))
            for k, x in (v.items() if is_dict else enumerate(v)):
                if is_dict and type(k) is not str and not isinstance(k, str):
                    return Problem(_path_of(node, repr(k)), f"a key of type {type(k).__name__}: "
                                   "JSON keys are strings, so a load would return a different key")
                if is_dict and isinstance(k, str) and not k.isascii() and not _encodes(k):
                    # a lone surrogate: a value holding one fails to serialize, but pydantic
                    # writes such a key of a model's dict field lossily ('\ufffd'): acknowledged,
                    # and loaded back as another key
                    return Problem(_path_of(node, ascii(k)), "a key that is no valid Unicode text "
                                   "(a lone surrogate): a load would return a different key")
                tx = type(x)
                if tx is str or x is None or tx is bool:
                    continue
                if tx is int:
                    if -bound < x < bound:
                        continue
                elif tx is float:
                    if x - x == 0.0:  # finite: inf - inf and nan - nan are nan
                        continue
                elif (tx is dict or tx is list) and not x:
                    continue
                push((x, node, k, depth))
        elif t is not str and v is not None:
            got = _scalar_problem(v, bound)
            if got is not None:
                return Problem(_path_of(node), got[0], got[1])
    return None


def model_problem(model: BaseModel, prefix: str = "",
                  exclude: frozenset[str] = frozenset()) -> Problem | None:
    """`json_problem` over a model's fields (nested models, such as a step's tool calls, too).

    The model's own typed fields are walked like free-form ones: a float field holds NaN as
    easily as `metadata` does (pydantic accepts NaN unless told otherwise).
    """
    bound = _int_bound()
    for name, v in model.__dict__.items():  # pydantic keeps exactly the fields there
        t = type(v)
        if t is str or v is None or t is bool or (t is int and -bound < v < bound) or (
                t is float and v - v == 0.0) or ((t is dict or t is list) and not v):
            continue
        if name in exclude:
            continue
        where = f"{prefix}{name}"
        got: Problem | None = None
        if isinstance(v, BaseModel):
            got = model_problem(v, f"{where}.")
        elif t is list and isinstance(v[0], BaseModel):
            for i, item in enumerate(v):
                got = (model_problem(item, f"{where}[{i}].") if isinstance(item, BaseModel)
                       else json_problem(item, f"{where}[{i}]", bound))
                if got is not None:
                    break
        else:
            got = json_problem(v, where, bound)
        if got is not None:
            return got
    return None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chain_hash(base_hash: str, body_sha256: str, version: int) -> str:
    """The hash a version is known by: it commits to every earlier version through `base_hash`."""
    return sha256_hex(f"{base_hash}:{version}:{body_sha256}".encode())


def _prefix(header: RecordHeader) -> bytes:
    """The document up to its body: the header as `json.dumps(sort_keys=True)` writes it.

    The reader insists on exactly these bytes (a canonical layout), so they are defined by
    `_prefix_by_dumps`. Every commit writes one and every load checks one, so headers of the
    types this store writes (the usual case) are spelled out field by field with the very
    functions json's encoder uses (`encode_basestring`, `int.__repr__`, `float.__repr__`),
    in sorted key order: 5 us -> 2 us. Any other value takes the general path.
    """
    d = header.__dict__
    t, summary = d["time"], d["summary"]
    if (type(t) is float and t - t == 0.0 and type(summary) is dict
            and type(d["version"]) is int and type(d["base"]) is int
            and type(d["format_version"]) is int
            and all(type(d[name]) is str for name in _STR_FIELDS)):
        q = _quote
        return (f'{{"base":{d["base"]!r},"base_hash":{q(d["base_hash"])},'
                f'"body_sha256":{q(d["body_sha256"])},"format":{q(d["format"])},'
                f'"format_version":{d["format_version"]!r},"hash":{q(d["hash"])},'
                f'"kind":{q(d["kind"])},"run_id":{q(d["run_id"])},'
                f'"summary":{_SORTED.encode(summary)},"time":{float.__repr__(t)},'
                f'"version":{d["version"]!r},"writer":{q(d["writer"])},"body":').encode()
    return _prefix_by_dumps(header)


def _prefix_by_dumps(header: RecordHeader) -> bytes:
    head = json.dumps(
        header.model_dump(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    return head[:-1] + b',"body":'


_STR_FIELDS = ("base_hash", "body_sha256", "format", "hash", "kind", "run_id", "writer")
_quote = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) quotes str with
_SORTED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_compressors = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor for `level`: a context costs ~15 us to set up, as much as
    compressing a whole journal record, and one is not safe to share between threads."""
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_compressors, "by_level", None)
    if cache is None:
        cache = _compressors.by_level = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=True,
                                                       write_content_size=True)
    return cctx


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A step's JSON as a writer holds it: bytes, or a view into the decompressed record a load read
# it from (a long run's state is not copied step by step: 0.1-0.4 s and 190 MB at 100k steps).
Fragment = bytes | memoryview
PACK_MIN = 256  # fragments shorter than this stay as they are: packing would not pay


def pack(fragment: Fragment) -> bytes:
    """A JSON fragment as a writer keeps it in memory: zstd-compressed when that pays.

    A writer holds every step's JSON (to diff against, and for the compactor to write
    snapshots without reading back); packed it costs about a third (measured on ~1.8 KB steps
    of text). Packing is deterministic for a given input, so packed fragments compare equal
    exactly when their JSON does. A JSON text never starts with zstd's magic number, so packed
    and plain fragments can sit side by side (`is_packed`)."""
    if len(fragment) < PACK_MIN:
        return bytes(fragment)  # the very object when it is bytes
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_compressors, "packing", None)
    if cache is None:
        cache = _compressors.packing = {}
    cctx = cache.get(0)
    if cctx is None:
        cctx = cache[0] = zstandard.ZstdCompressor(level=DEFAULT_LEVEL, write_checksum=False,
                                                   write_content_size=True)
    # A copy of exact size: zstandard's result keeps the allocation of the worst case (about
    # the input's size), which would give back none of the memory packing is for.
    return bytes(memoryview(cctx.compress(fragment)))


def is_packed(fragment: Fragment) -> bool:
    return fragment[:4] == _ZSTD_MAGIC


def packed_equals(packed: Fragment, fragment: Fragment) -> bool:
    """Whether `packed` (a `pack` output) holds exactly `fragment`, without unpacking when
    the sizes differ (the frame header states its content size)."""
    if zstandard.frame_content_size(packed) != len(fragment):
        return False
    return unpack(packed) == fragment


def unpack(fragment: Fragment) -> Fragment:
    """The JSON of a fragment `pack` may have packed (memory this process wrote: trusted)."""
    if not is_packed(fragment):
        return fragment
    dctx: zstandard.ZstdDecompressor | None = getattr(_compressors, "unpacking", None)
    if dctx is None:
        dctx = _compressors.unpacking = zstandard.ZstdDecompressor()
    return dctx.decompress(fragment)


def _check_size(header: RecordHeader, size: int, max_decoded: int | None) -> None:
    """RecordTooLargeError before any compression work for a record over the reader's limit:
    `decompress` refuses exactly that size, so it could be written but never read back."""
    if max_decoded is not None and size > max_decoded:
        raise RecordTooLargeError(
            header.run_id, None, f"{header.kind} record v{header.version}",
            f"it would decode to {size} bytes, over the max_decoded_bytes of {max_decoded} "
            "that a load refuses")


def _framed(frame: bytes) -> bytes:
    return frame + _SKIPPABLE_MAGIC + (32).to_bytes(4, "little") + hashlib.sha256(frame).digest()


def encode(header: RecordHeader, body_json: bytes, level: int = DEFAULT_LEVEL,
           max_decoded: int | None = None) -> bytes:
    """Frame `body_json` (already serialised, so its sha256 is exact) under `header`.

    With `max_decoded` (the reader's `max_decoded_bytes`), a record that would decode to more
    is refused with RecordTooLargeError (see `_check_size`).
    """
    if header.body_sha256 != sha256_hex(body_json):
        raise ValueError("header.body_sha256 does not match the body being encoded")
    text = _prefix(header) + body_json + b"}"
    _check_size(header, len(text), max_decoded)
    return _framed(_compressor(level).compress(text))


def body_digest(parts: Iterable[bytes]) -> tuple[str, int]:
    """(sha256 hex, length) of a body given as parts, without joining them."""
    h = hashlib.sha256()
    n = 0
    for part in parts:
        h.update(part)
        n += len(part)
    return h.hexdigest(), n


def encode_parts(header: RecordHeader, parts: Callable[[], Iterable[bytes]], body_len: int,
                 level: int = DEFAULT_LEVEL, max_decoded: int | None = None) -> bytes:
    """`encode` of a body given as parts (a snapshot: the whole state), streamed through the
    compressor so the state is never joined into one buffer beside the one the writer holds:
    peak memory is the compressed file, not twice the state. `parts()` is called once; the
    caller computed `header.body_sha256` and `body_len` from the same parts (`body_digest`)."""
    prefix = _prefix(header)
    size = len(prefix) + body_len + 1
    _check_size(header, size, max_decoded)
    cobj = _compressor(level).compressobj(size=size)
    out = [cobj.compress(prefix)]
    out += [cobj.compress(part) for part in parts()]
    out.append(cobj.compress(b"}"))
    out.append(cobj.flush())
    return _framed(b"".join(out))


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


def _checked_frame(data: bytes, key: str, max_size: int) -> tuple[bytes, int]:
    """The file's zstd frame and its declared decoded size, once every check short of decoding
    it holds: trailer, sha256 of every byte, content checksum, declared size within the limit,
    one frame filling the file. What `decompress` and `read_header` both stand on."""
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
    return data, size


def decompress(data: bytes, key: str, max_size: int = DEFAULT_MAX_DECODED_BYTES) -> bytes:
    """Bounded, strict zstd decode of one whole frame with its content checksum and trailer."""
    data, size = _checked_frame(data, key, max_size)
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=max_size)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"zstd decode failed: {exc}") from None
    if len(out) != size:
        raise CorruptFileError(key, f"decoded {len(out)} bytes, header declared {size}")
    return out


def decode(data: bytes, key: str, max_size: int = DEFAULT_MAX_DECODED_BYTES) -> Record:
    """Decode and validate one file; every failure is a CorruptFileError naming `key`."""
    return decode_text(decompress(data, key, max_size), key, len(data))


def decode_text(text: bytes, key: str, stored_size: int) -> Record:
    """`decode` of a document `decompress` gave back (`stored_size`: the file's length)."""
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
    if hashlib.sha256(memoryview(text)[len(prefix) : -1]).hexdigest() != header.body_sha256:
        raise CorruptFileError(key, "body sha256 does not match")
    problem = _chain_problem(header)
    if problem is not None:
        raise CorruptFileError(key, problem)
    return Record(header=header, body=body, stored_size=stored_size)


# A header is its format fields, kinds, numbers, three hashes, the writer and the summary: a
# few hundred bytes. How far `read_header` decodes looking for it before it decodes the whole;
# then the piece of the body it decodes, hashes and drops at a time.
_HEADER_PEEK = 64 * 1024
_BODY_PIECE = 256 * 1024


def read_header(data: bytes, key: str, max_size: int = DEFAULT_MAX_DECODED_BYTES) -> RecordHeader:
    """A file's header, once every check `decode` makes but the parse of the body holds.

    For a caller that needs to know which record a file is (its hash, version, run), not its
    state: the base check of a writer resuming an idle run, whose base may be a snapshot of
    tens of megabytes, and `versions`. The body is decoded and hashed against the header's
    `body_sha256` a quarter megabyte at a time and dropped, so a file this accepts is one a load
    decodes, but neither the decoded document nor the parsed state is ever held: a full
    decode holds both. Where the header is not found in the first `_HEADER_PEEK` bytes
    decoded, or is not in the canonical layout, this is `decode` itself.
    """
    frame, size = _checked_frame(data, key, max_size)
    try:
        with zstandard.ZstdDecompressor().stream_reader(frame) as reader:
            text = b""
            while len(text) < _HEADER_PEEK and (chunk := reader.read(_HEADER_PEEK - len(text))):
                text += chunk
            header = _split_header(text)
            if header is None:
                return decode(data, key, max_size).header
            digest, decoded = hashlib.sha256(), len(text)
            pending = text[len(_prefix(header)):]  # held back: its last byte closes the document
            while chunk := reader.read(_BODY_PIECE):
                digest.update(pending)
                decoded += len(chunk)
                pending = chunk
    except zstandard.ZstdError as exc:
        raise CorruptFileError(key, f"zstd decode failed: {exc}") from None
    if decoded != size:
        raise CorruptFileError(key, f"decoded {decoded} bytes, header declared {size}")
    if not pending.endswith(b"}"):
        raise CorruptFileError(key, "document layout is not canonical")
    digest.update(pending[:-1])
    if digest.hexdigest() != header.body_sha256:
        raise CorruptFileError(key, "body sha256 does not match")
    return header


def _chain_problem(header: RecordHeader) -> str | None:
    if header.kind == "journal" and header.hash != chain_hash(
        header.base_hash, header.body_sha256, header.version
    ):
        return "journal record hash does not follow from its base"
    if header.version <= header.base and header.kind != "snapshot":
        return f"version {header.version} does not follow base {header.base}"
    return None


_BODY_KEY = b',"body":'


def split_document(text: bytes) -> tuple[RecordHeader, memoryview] | None:
    """A decompressed document's header and its body's bytes, unparsed; None if in doubt.

    Every check `decode_text` makes but the parse of the body and its sha256 (`body_ok`,
    left to the caller so that it can hash while it parses): the document must be exactly
    `_prefix(header) + body + "}"` for a valid header of this format, and the chain must
    follow. Those are the documents `decode_text` accepts, with this very header, once the
    body is JSON and hashes right: the caller parses it (the loader into fragments,
    strictly) and falls back to `decode_text` on anything unexpected, so errors, and
    documents only Python's lenient json reads (NaN, lone surrogates), stay exactly
    `decode_text`'s. Parsing only the header spares a load a second parse of a large body.
    The header ends at its first `,"body":`, or this returns None (a nested "body" key in
    the summary): inside JSON strings every quote is escaped, so it cannot end earlier.
    """
    if not text.endswith(b"}"):
        return None
    header = _split_header(text)
    if header is None:
        return None
    return header, memoryview(text)[len(_prefix(header)) : -1]


def _split_header(text: bytes) -> RecordHeader | None:
    """The header at the start of a document (`text` may be its first bytes only), checked as
    `split_document` says; None if in doubt."""
    end = text.find(_BODY_KEY)
    if end < 0:
        return None
    try:
        doc = json.loads(text[:end] + b"}")
    except (ValueError, RecursionError):
        return None
    if (not isinstance(doc, dict) or "body" in doc or doc.get("format") != FORMAT_NAME
            or doc.get("format_version") != FORMAT_VERSION):
        return None
    try:
        header = RecordHeader.model_validate(doc)
    except ValidationError:
        return None
    prefix = _prefix(header)
    if len(prefix) != end + len(_BODY_KEY) or not text.startswith(prefix):
        return None
    if _chain_problem(header) is not None:
        return None
    return header


def body_ok(header: RecordHeader, body: memoryview) -> bool:
    """Whether `body` (split_document's) hashes to the header's `body_sha256`."""
    return hashlib.sha256(body).hexdigest() == header.body_sha256
