"""The LangGraph saver's part encodings: splice, zstd delta and whole values round-trip exactly,
and a wrong base, hostile ranges or flipped bytes are refused rather than returned."""

from __future__ import annotations

import json
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.errors import CorruptFileError, DecodeLimitError
from ckptfs.integrations.langgraph import codec as fmt


def _elements(rnd: random.Random, n: int) -> list[bytes]:
    # serialized-like elements: a shared trailer (as msgpack'd messages have) after random text
    return [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(200, 900))) + b"\x00type\xa2ai" * 4
            for _ in range(n)]


def _listlike(elements: list[bytes]) -> bytes:
    n = len(elements)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return head + b"".join(elements)


def _roundtrip(base: bytes, raw: bytes) -> fmt.Part:
    part = fmt.encode_part("messages", "msgpack", raw, base, "prev-id", 1)
    packed = fmt.pack({"kind": "checkpoint"}, b"", [part])
    back = fmt.unpack(packed, "k").parts["messages"]
    assert fmt.decode_part(back, "k", base) == raw
    return back


@pytest.mark.parametrize("n", [3, 15, 16, 40])
def test_a_grown_list_is_a_splice_of_a_few_bytes(n: int) -> None:
    rnd = random.Random(n)
    elements = _elements(rnd, n)
    base = _listlike(elements)
    raw = _listlike([*elements, *_elements(rnd, 1)])
    part = _roundtrip(base, raw)
    assert part.kind == "s"
    copied = sum(length for src, length in part.ops or [] if src >= 0)
    assert copied >= len(base) - 3  # all of the old list but its length prefix
    assert len(part.frame) < 1200


def test_a_list_trimmed_at_the_front_and_grown_is_a_splice() -> None:
    rnd = random.Random(1)
    elements = _elements(rnd, 30)
    base = _listlike(elements)
    raw = _listlike([*elements[4:], *_elements(rnd, 2)])
    assert _roundtrip(base, raw).kind == "s"


def test_an_edit_in_the_middle_falls_back_to_a_zstd_delta() -> None:
    rnd = random.Random(2)
    elements = _elements(rnd, 30)
    base = _listlike(elements)
    changed = list(elements)
    changed[10] = b"rewritten" * 50
    changed[20] = b"also rewritten" * 40
    changed[-1] = b"the last one too" * 30
    part = _roundtrip(base, _listlike(changed))
    assert part.kind == "z"
    assert len(part.frame) < len(base) // 4


def test_unrelated_values_still_round_trip() -> None:
    rnd = random.Random(3)
    base, raw = rnd.randbytes(5000), rnd.randbytes(7000)
    assert _roundtrip(base, raw).kind == "z"
    assert fmt.decode_part(fmt.encode_part("c", "t", raw), "k", None) == raw


@settings(max_examples=150, deadline=None)
@given(base=st.binary(min_size=0, max_size=3000), cut=st.integers(0, 3000), drop=st.integers(0, 200),
       head=st.binary(max_size=20), tail=st.binary(max_size=400))
def test_any_edit_round_trips(base: bytes, cut: int, drop: int, head: bytes, tail: bytes) -> None:
    raw = head + base[:cut] + base[cut + drop :] + tail
    _roundtrip(base, raw)


def _splice() -> tuple[bytes, bytes, fmt.Part]:
    rnd = random.Random(4)
    elements = _elements(rnd, 20)
    base = _listlike(elements)
    raw = _listlike([*elements, *_elements(rnd, 1)])
    part = fmt.encode_part("m", "msgpack", raw, base, "prev", 1)
    assert part.kind == "s"
    return base, raw, part


def test_a_wrong_base_is_caught_by_the_checksum() -> None:
    base, _raw, part = _splice()
    other = bytearray(base)
    other[len(other) // 2] ^= 0x01
    with pytest.raises(CorruptFileError, match="checksum"):
        fmt.decode_part(part, "k", bytes(other))
    with pytest.raises(CorruptFileError, match="outside its base"):
        fmt.decode_part(part, "k", base[:100])
    with pytest.raises(CorruptFileError, match="without its base"):
        fmt.decode_part(part, "k", None)


def test_hostile_ranges_and_sizes_are_refused() -> None:
    base, _raw, part = _splice()
    ops = part.ops or []
    for bad in ([[-5, 3]], [[0, -1]], [[len(base) - 2, 10]], [*ops, [0, 1]], ops[:-1]):
        hostile = fmt.Part(part.channel, part.type, part.frame, part.base, 1, "s", bad, part.size,
                           part.digest)
        with pytest.raises(CorruptFileError):
            fmt.decode_part(hostile, "k", base)
    huge = fmt.Part(part.channel, part.type, part.frame, part.base, 1, "s", ops, 10**12, part.digest)
    with pytest.raises(DecodeLimitError):
        fmt.decode_part(huge, "k", base)
    unknown = fmt.Part(part.channel, part.type, part.frame, part.base, 1, "q")
    with pytest.raises(CorruptFileError, match="unknown part kind"):
        fmt.decode_part(unknown, "k", base)


def test_every_flipped_byte_of_a_splice_object_is_refused() -> None:
    base, raw, part = _splice()
    packed = fmt.pack({"kind": "checkpoint"}, b"", [part])
    for i in range(len(packed)):
        damaged = bytearray(packed)
        damaged[i] ^= 0x40
        try:
            back = fmt.unpack(bytes(damaged), "k").parts["m"]
            value = fmt.decode_part(back, "k", base)
        except (CorruptFileError, DecodeLimitError):
            continue
        assert value == raw, f"flip at byte {i} returned a different value"


def test_version_1_objects_still_read() -> None:
    # written before part kinds existed: no "k" in the part list, and a base means a zstd delta
    base = b"previous value " * 100
    raw = base + b"and one more line"
    frame = fmt.compress_delta(raw, base)
    parts = [{"c": "c", "t": "bytes", "z": len(frame), "b": "prev", "d": 1}]
    head = json.dumps({"kind": "checkpoint", "v": 1, "parts": parts}).encode()
    frame0 = fmt.compress_full(struct.pack("<I", len(head)) + head)
    legacy = fmt.MAGIC + struct.pack("<I", len(frame0)) + frame0 + frame
    back = fmt.unpack(legacy, "k").parts["c"]
    assert back.kind == "z"
    assert fmt.decode_part(back, "k", base) == raw


@pytest.mark.parametrize("field,value", [("d", "Infinity"), ("z", "1e999"), ("n", "-1e999")])
def test_non_finite_numbers_in_a_header_are_corruption(field: str, value: str) -> None:
    base, _raw, part = _splice()
    meta = dict(part.meta(), c="m")
    head = json.dumps({"kind": "checkpoint", "v": 2, "parts": [meta]})
    head = head.replace(f'"{field}": {json.dumps(meta[field])}', f'"{field}": {value}')
    assert value in head
    frame0 = fmt.compress_full(struct.pack("<I", len(head)) + head.encode())
    data = fmt.MAGIC + struct.pack("<I", len(frame0)) + frame0 + part.frame
    with pytest.raises(CorruptFileError):
        fmt.decode_part(fmt.unpack(data, "k").parts["m"], "k", base)


_HEADER_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=12), _HEADER_VALUES, max_size=6))
def test_a_header_reads_back_as_the_standard_library_reads_it(header: dict[str, object]) -> None:
    # msgspec writes headers now; readers of every version parse them with the standard library too
    data = fmt.encode_header(header)
    assert json.loads(data) == header == fmt.decode_header(data)
    assert fmt.decode_header(json.dumps(header, ensure_ascii=False).encode()) == header


@pytest.mark.parametrize("version", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_channel_version_is_refused_not_stored_as_null(version: float) -> None:
    # msgspec would write null, and the checkpoint would read back with a version it never had
    with pytest.raises(ValueError, match="JSON compliant"):
        fmt.pack({"kind": "checkpoint", "refs": {"messages": ["c1", version]}}, b"", [])


def test_a_header_only_the_standard_library_reads_still_reads() -> None:
    # a lone surrogate's escape, a NaN literal: msgspec refuses both, json.loads (as before) reads them
    assert fmt.decode_header(b'{"a":"\\ud800","b":NaN}')["a"] == "\ud800"
    with pytest.raises(ValueError):
        fmt.decode_header(b"\xff{")


def test_a_value_of_an_unusual_type_is_written_by_the_standard_encoder() -> None:
    class Version(int):
        pass

    head = fmt.unpack(fmt.pack({"kind": "checkpoint", "refs": {"m": ["c", Version(7)]}}, b"", []), "k").header
    assert head["refs"] == {"m": ["c", 7]}
