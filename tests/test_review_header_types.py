"""Hostile review of the msgspec header encoder (d53f8c4): msgspec writes types the standard
library refuses (Decimal, UUID, datetime, bytes, sets, plain Enums) as strings or lists, so a
channel version of such a type was stored as a value of another type; after a restart a put that
inherited the channel unchanged compared the two, found them different, and dropped the channel's
value from the thread. Before msgspec such a put was refused with TypeError; it still is."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from test_cli_commands import cli

from ckptfs.errors import CorruptFileError
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph import codec as fmt


class Colour(enum.Enum):
    RED = 3


ODD_VERSIONS = [decimal.Decimal("1.5"), uuid.UUID(int=9), datetime.datetime(2020, 1, 1), b"v1",
                frozenset({1}), Colour.RED]


@pytest.mark.parametrize("version", ODD_VERSIONS, ids=lambda v: type(v).__name__)
def test_a_version_json_cannot_spell_is_refused_not_stored_as_another_type(version: Any) -> None:
    with pytest.raises(TypeError):
        fmt.pack({"kind": "checkpoint", "refs": {"messages": ["c1", version]}}, b"", [])


@pytest.mark.parametrize("field", ["parent", "path"])
def test_an_id_json_cannot_spell_is_refused(field: str) -> None:
    with pytest.raises(TypeError):
        fmt.pack({"kind": "checkpoint", field: uuid.UUID(int=1), "refs": {}}, b"", [])


@pytest.mark.parametrize("version", ODD_VERSIONS, ids=lambda v: type(v).__name__)
def test_a_channel_inherited_after_a_restart_keeps_its_value(tmp_path: Path, version: Any) -> None:
    url = str(tmp_path / "store")
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    first["channel_values"] = {"a": "hello"}
    first["channel_versions"] = {"a": version}
    try:
        cfg = CkptfsSaver(url).put(cfg, first, {"step": 0}, {"a": version})
    except TypeError:
        return  # refused, as the standard library always did: nothing stored, nothing lost
    second = empty_checkpoint()
    second["channel_values"] = {}
    second["channel_versions"] = {"a": version}
    cfg = CkptfsSaver(url).put(cfg, second, {"step": 1}, {})
    got = CkptfsSaver(url).get_tuple(cfg)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"a": "hello"}


@pytest.mark.parametrize("version", [7, 2**63 + 5, -(2**63), 1.5, 1e300, -0.0, "0001.x", None])
def test_plain_versions_still_take_the_fast_encoder_and_read_back(version: Any) -> None:
    header = {"kind": "checkpoint", "parent": "p", "refs": {"m\u00e9\x01": ["c1", version]}}
    assert fmt._msgspec_writes_as_before(header)
    head = fmt.unpack(fmt.pack(header, b"", []), "k").header
    assert head["refs"]["m\u00e9\x01"] == ["c1", version]
    assert type(head["refs"]["m\u00e9\x01"][1]) is type(version)


def _deep_object() -> bytes:
    head = b"[" * 5000 + b"]" * 5000
    frame0 = fmt.compress_full(struct.pack("<I", len(head)) + head)
    return fmt.MAGIC + struct.pack("<I", len(frame0)) + frame0


def test_a_header_nested_past_the_parsers_depth_is_corruption_not_recursion_error() -> None:
    with pytest.raises(CorruptFileError, match="nests too deeply"):
        fmt.unpack(_deep_object(), "k")


def test_verify_and_show_name_a_deeply_nested_header(tmp_path: Path) -> None:
    """verify said 'unexpected RecursionError' (exit 3), as did show --thread and get_tuple."""
    url = str(tmp_path / "store")
    saver = CkptfsSaver(url, log=False)  # one object per key, as on S3
    cfg: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    c = empty_checkpoint()
    c["channel_values"] = {"a": "v"}
    c["channel_versions"] = {"a": 1}
    out = saver.put(cfg, c, {"step": 0}, {"a": 1})
    key = next(k for k in saver.storage.list("langgraph/")
               if k.endswith(out["configurable"]["checkpoint_id"]))
    saver.storage.put(key, _deep_object())
    code, stdout, stderr = cli("verify", url, "--json")
    assert code == 1, stdout + stderr
    assert any(f["code"] == "lg-corrupt" and "nests too deeply" in f["message"]
               for f in json.loads(stdout)["findings"]), stdout
    code, stdout, stderr = cli("show", url, "--thread", "t1")
    assert code in (0, 1) and "RecursionError" not in stdout + stderr, stdout + stderr
