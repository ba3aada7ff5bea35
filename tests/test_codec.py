"""The snapshot file format: standard zstd + JSON, bounded and strict on decode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.errors import CorruptFileError, DecodeLimitError, UnsupportedFormatError
from ckptfs.format import codec


def _record(body: object = None, **over: object) -> bytes:
    body_json = codec.dumps(body if body is not None else {"run": {"goal": "g"}, "steps": {}})
    fields: dict[str, object] = dict(
        format="ckptfs", format_version=1, kind="journal", run_id="r", version=1, base=0,
        base_hash="", body_sha256=codec.sha256_hex(body_json), writer="w", time=time.time())
    fields["hash"] = codec.chain_hash("", str(fields["body_sha256"]), 1)
    fields.update(over)
    return codec.encode(codec.RecordHeader.model_validate(fields), body_json)


def test_roundtrip_and_header_fields() -> None:
    data = _record({"x": [1, 2, "ü"]})
    rec = codec.decode(data, "k")
    assert rec.body == {"x": [1, 2, "ü"]}
    assert rec.header.format == "ckptfs" and rec.header.format_version == 1
    assert rec.stored_size == len(data)


def test_standard_zstd_cli_opens_a_file(tmp_path: Path) -> None:
    zstd = shutil.which("zstd")
    assert zstd, "the zstd command ships with this machine image (Debian package zstd)"
    f = tmp_path / "x.ckpt"
    f.write_bytes(_record({"hello": "world"}))
    out = subprocess.run([zstd, "-dc", str(f)], check=True, capture_output=True).stdout
    assert json.loads(out)["body"] == {"hello": "world"}  # what `jq .body` would print
    subprocess.run([zstd, "-t", str(f)], check=True, capture_output=True)


def test_python_zstd_decodes_standard_frame_with_checksum() -> None:
    data = _record()
    params = zstandard.get_frame_parameters(data)
    assert params.has_checksum and params.content_size > 0
    doc = json.loads(zstandard.ZstdDecompressor().decompress(data))
    assert doc["format"] == "ckptfs" and "body" in doc
    assert codec.file_digest(data) is not None


def test_every_single_byte_flip_is_detected() -> None:
    data = bytearray(_record({"payload": "x" * 300}))
    for i in range(len(data)):
        for bit in (1, 2, 4, 8, 16, 32, 64, 128):
            mutated = bytearray(data)
            mutated[i] ^= bit
            with pytest.raises(CorruptFileError):
                codec.decode(bytes(mutated), "k")


def test_truncation_and_trailing_bytes_are_detected() -> None:
    data = _record()
    for cut in (1, 4, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptFileError):
            codec.decode(data[:cut], "k")
    with pytest.raises(CorruptFileError, match="trailer"):
        codec.decode(data + b"junk", "k")


def test_random_bytes_are_refused_clearly() -> None:
    for _ in range(50):
        with pytest.raises(CorruptFileError):
            codec.decode(os.urandom(200), "rand.ckpt")


def _with_trailer(frame: bytes) -> bytes:
    """A hostile file that passes the trailer check, so the frame checks themselves are tested."""
    import hashlib

    return frame + (0x184D2A5C).to_bytes(4, "little") + (32).to_bytes(4, "little") + \
        hashlib.sha256(frame).digest()


def test_zstd_bomb_refused_before_allocation() -> None:
    # 200 MB of zeros compresses to a few KB; the default limit is lowered to 1 MB here.
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    bomb = _with_trailer(cctx.compress(b"\0" * (200 * 1024 * 1024)))
    assert len(bomb) < 100_000
    with pytest.raises(DecodeLimitError, match="over the limit"):
        codec.decode(bomb, "bomb.ckpt", max_size=1024 * 1024)


def test_bomb_without_declared_size_is_refused() -> None:
    cobj = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False).compressobj()
    bomb = _with_trailer(cobj.compress(b"\0" * (50 * 1024 * 1024)) + cobj.flush())
    with pytest.raises(CorruptFileError, match="does not declare"):
        codec.decode(bomb, "bomb2.ckpt")


def test_unknown_format_version_is_a_clear_error() -> None:
    with pytest.raises(UnsupportedFormatError, match="format version 99 is not supported"):
        codec.decode(_record(format_version=99), "future.ckpt")


def test_foreign_json_in_zstd_is_refused() -> None:
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    with pytest.raises(CorruptFileError, match=r"not a ckptfs record|format is"):
        codec.decode(_with_trailer(cctx.compress(b'{"format":"other","body":1}')), "k")
    with pytest.raises(CorruptFileError, match="not JSON"):
        codec.decode(_with_trailer(cctx.compress(b"\xff\xfe not json")), "k")
    with pytest.raises(CorruptFileError, match="trailer"):
        codec.decode(cctx.compress(b'{"format":"ckptfs","body":1}'), "no-trailer")


def test_trailing_junk_inside_trailer_check_is_refused() -> None:
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(b"{}")
    with pytest.raises(CorruptFileError, match="file has"):
        codec.decode(_with_trailer(frame + b"junk"), "k")


def test_journal_hash_must_follow_from_base() -> None:
    with pytest.raises(CorruptFileError, match="does not follow"):
        codec.decode(_record(hash="0" * 64), "k")


def test_nan_is_refused_at_encode() -> None:
    with pytest.raises(ValueError):
        codec.dumps({"x": float("nan")})


# The header as the reader insists on it (a canonical layout) is defined by json.dumps; the
# writer spells the usual headers out field by field, which must give the very same bytes.
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(run_id=st.text(), writer=st.text(), kind=st.sampled_from(["journal", "delta", "snapshot"]),
       version=st.integers(min_value=0, max_value=10**15), base=st.integers(min_value=0),
       t=st.floats(allow_nan=True, allow_infinity=True),
       summary=st.dictionaries(st.text(), _json_values, max_size=5),
       digest=st.text(alphabet="0123456789abcdef\"\\\u2028é\x00\x1f", max_size=64))
def test_header_prefix_is_exactly_what_json_dumps_writes(
        run_id: str, writer: str, kind: str, version: int, base: int, t: float,
        summary: dict[str, object], digest: str) -> None:
    header = codec.RecordHeader(
        format="ckptfs", format_version=1, kind=kind, run_id=run_id, version=version,  # type: ignore[arg-type]
        base=base, base_hash=digest, hash=digest[::-1], body_sha256=digest, writer=writer,
        time=t, summary=summary)
    try:
        expected: bytes | type[Exception] = codec._prefix_by_dumps(header)
    except (UnicodeEncodeError, ValueError) as exc:  # a lone surrogate; an int over the digit limit
        expected = type(exc)
    if isinstance(expected, bytes):
        assert codec._prefix(header) == expected
    else:
        with pytest.raises(expected):
            codec._prefix(header)
