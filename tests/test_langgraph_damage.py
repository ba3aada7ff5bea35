"""CkptfsSaver over a damaged local log: a read that damage may make wrong raises, naming the log
and the byte, instead of answering with older state. Bytes are flipped in the log of a thread
the real saver wrote (30 checkpoints, each with its pending writes, as a graph run leaves them)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base.id import uuid6
from test_cli_commands import cli, cli_json

from ckptfs.cli import main as cli_main
from ckptfs.errors import CorruptFileError, UnreadableFileError
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.maintenance.verify import verify
from ckptfs.storage.logfile import HEADER_SIZE, RecordLog
from ckptfs.storage.logstore import _parse

STEPS = 30
LOG = Path("langgraph/threads/T/_/.records")
CFG: Any = {"configurable": {"thread_id": "T", "checkpoint_ns": ""}}


def _checkpoint(step: int) -> Any:
    return {"v": 4, "id": str(uuid6(clock_seq=step)), "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"msgs": [f"m{i}-" + "x" * 200 for i in range(step + 1)], "n": step},
            "channel_versions": {"msgs": step + 1, "n": step + 1}, "versions_seen": {},
            "updated_channels": None}


def _write(url: str, thread: str = "T", steps: int = STEPS) -> list[Any]:
    """`steps` checkpoints, each followed by its pending writes; their configs."""
    saver = CkptfsSaver(url)
    try:
        cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        configs = []
        for step in range(steps):
            cfg = saver.put(cfg, _checkpoint(step), {"step": step, "source": "loop"},
                            {"msgs": step + 1, "n": step + 1})
            saver.put_writes(cfg, [("msgs", f"w{step}"), ("n", step)], task_id=f"task{step}")
            configs.append(cfg)
        return configs
    finally:
        saver.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    root = tmp_path_factory.mktemp("lgdamage") / "s"
    return root, _write(str(root))


@pytest.fixture
def store(written: tuple[Path, list[Any]], tmp_path: Path) -> tuple[Path, list[Any]]:
    """A copy of the written store, to damage."""
    shutil.copytree(written[0], tmp_path / "s")
    return tmp_path / "s", written[1]


def _records(root: Path) -> list[tuple[int, str]]:
    """(offset, key) of every record of the thread's log, in file order."""
    log = RecordLog(str(root / LOG))
    try:
        return [(off, _parse(payload, "")[1]) for off, payload in log.refresh()[1]]
    finally:
        log.close()


def _flip(root: Path, offset: int) -> None:
    with open(root / LOG, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


# where in a record: its value (the key stays legible), its key (now unreadable), its magic
HITS = {"value": HEADER_SIZE + 300, "key": HEADER_SIZE + 4, "magic": 1}


def _reader(root: Path) -> CkptfsSaver:
    return CkptfsSaver(str(root), exclusive=False)


def _steps_until_error(saver: CkptfsSaver, config: Any = CFG, **kw: Any) -> tuple[list[int], str]:
    steps: list[int] = []
    try:
        for item in saver.list(config, **kw):
            steps.append(item.metadata["step"])
    except CorruptFileError as exc:
        return steps, str(exc)
    return steps, ""


@pytest.mark.parametrize("hit", list(HITS))
def test_a_damaged_newest_checkpoint_is_an_error_not_the_one_before(
        store: tuple[Path, list[Any]], hit: str) -> None:
    root, configs = store
    records = _records(root)
    assert len(records) == 2 * STEPS  # checkpoint, its writes, checkpoint, ...
    offset, key = records[-2]
    assert key.endswith(configs[-1]["configurable"]["checkpoint_id"])
    _flip(root, offset + HITS[hit])
    assert any(f.code == "lg-damaged-record" for f in verify(str(root)).findings)
    saver = _reader(root)
    with pytest.raises(CorruptFileError) as err:
        saver.get_tuple(CFG)  # was: checkpoint 28, no exception
    assert f"byte {offset}" in str(err.value) and str(root / LOG) in str(err.value)
    if hit != "key":
        assert key in str(err.value)
    steps, error = _steps_until_error(saver)  # was: 29 items, the newest 28
    assert steps == [] and f"byte {offset}" in error
    if hit == "key":  # unreadable: it may have been one of 28's pending writes as well
        with pytest.raises(CorruptFileError, match=f"byte {offset}"):
            saver.get_tuple(configs[-2])
        return
    # an older checkpoint, asked for by id, still reads: resuming from it is a deliberate choice
    older = saver.get_tuple(configs[-2])
    assert older is not None and older.metadata["step"] == STEPS - 2
    assert [w[1:] for w in older.pending_writes] == [("msgs", f"w{STEPS - 2}"), ("n", STEPS - 2)]


@pytest.mark.parametrize("hit", list(HITS))
def test_a_damaged_middle_checkpoint_is_not_skipped_by_list(store: tuple[Path, list[Any]], hit: str) -> None:
    root, configs = store
    offset, key = _records(root)[2 * 15]
    assert key.endswith(configs[15]["configurable"]["checkpoint_id"])
    _flip(root, offset + HITS[hit])
    saver = _reader(root)
    newest = saver.get_tuple(CFG)  # nothing newer is damaged: the newest stands
    assert newest is not None and newest.metadata["step"] == STEPS - 1 and len(newest.pending_writes) == 2
    steps, error = _steps_until_error(saver)
    assert steps == list(range(STEPS - 1, 15, -1))  # was: 29 items, 15 silently left out
    assert f"byte {offset}" in error
    assert len(list(saver.list(CFG, limit=5))) == 5  # what is asked for is all above the damage
    assert _steps_until_error(saver, before=configs[16])[0] == []
    # 16 still names 15 as its parent; reading the parent raises instead of "no such checkpoint"
    sixteen = saver.get_tuple(configs[16])
    assert sixteen is not None and sixteen.parent_config == configs[15]
    with pytest.raises(CorruptFileError, match=f"byte {offset}"):
        saver.get_tuple(configs[15])
    below = _steps_until_error(saver, before=configs[15])
    if hit == "key":  # unreadable: it may also have been 14's pending writes, so 14 is in doubt
        assert below[0] == [] and f"byte {offset}" in below[1]
    else:
        assert below == (list(range(14, -1, -1)), "")


def test_a_flipped_bit_in_the_last_record_s_magic_is_damage_not_a_torn_tail(
        store: tuple[Path, list[Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """The last record (checkpoint 29's pending writes, acknowledged) with one bit of its magic
    flipped: verify reports it, reads refuse, and the next writer keeps it instead of
    truncating it away as a torn write."""
    root, configs = store
    offset, key = _records(root)[-1]
    assert "/writes/" in key
    _flip(root, offset)
    damaged = (root / LOG).read_bytes()
    assert cli_main(["verify", str(root), "--json"]) == 1  # was: clean
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["code"], f["key"]) for f in findings] == [("lg-damaged-record", str(LOG))]
    assert key in findings[0]["message"] and f"byte {offset}" in findings[0]["message"]
    saver = _reader(root)
    for config in (CFG, configs[-1]):  # was: checkpoint 29 with pending_writes=[]
        with pytest.raises(CorruptFileError, match=key):
            saver.get_tuple(config)
    saver.close()
    writer = CkptfsSaver(str(root))
    nxt = writer.put(configs[-1], _checkpoint(STEPS), {"step": STEPS, "source": "loop"},
                     {"msgs": STEPS + 1, "n": STEPS + 1})
    writer.close()
    after = (root / LOG).read_bytes()
    assert after[: len(damaged)] == damaged  # kept: the writer appended after it
    fresh = _reader(root)
    got = fresh.get_tuple(CFG)  # written after the damage: the newest again
    assert got is not None and got.config == nxt
    with pytest.raises(CorruptFileError, match=key):
        fresh.get_tuple(configs[-1])


@pytest.mark.parametrize("tail", ["prefix", "junk"])
def test_a_torn_tail_is_reported_with_its_offset_and_size(store: tuple[Path, list[Any]], tail: str) -> None:
    root, _configs = store
    size = (root / LOG).stat().st_size
    first = (root / LOG).read_bytes()[:40]
    with open(root / LOG, "ab") as f:  # the start of a record a crash cut short, or junk
        f.write(first if tail == "prefix" else os.urandom(40))
    report = verify(str(root))
    found = [(f.severity, f.code) for f in report.findings]
    assert found == [("info" if tail == "prefix" else "warning", "lg-torn-tail")]
    what = "40 byte(s)" if tail == "prefix" else "40 unreadable byte(s)"
    assert f"{what} at byte {size}" in report.findings[0].message
    assert report.ok == (tail == "prefix")  # an interrupted write is no problem; junk is not as left
    got = _reader(root).get_tuple(CFG)
    assert got is not None and got.metadata["step"] == STEPS - 1 and len(got.pending_writes) == 2


def test_listing_every_thread_skips_a_linked_or_fifo_log_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "s"
    _write(str(root), "t1", 3)
    threads = root / "langgraph" / "threads"
    (threads / "zz" / "_").mkdir(parents=True)
    (threads / "zz" / "_" / ".records").symlink_to("../../t1/_/.records")
    (threads / "ff" / "_").mkdir(parents=True)
    os.mkfifo(threads / "ff" / "_" / ".records")
    saver = _reader(root)
    with caplog.at_level(logging.WARNING, logger="ckptfs.integrations.langgraph.saver"):
        listed = [t.config["configurable"]["thread_id"] for t in saver.list(None)]  # was: raised
    assert listed == ["t1"] * 3
    assert "threads/zz/_/" in caplog.text and "symbolic link" in caplog.text
    assert "threads/ff/_/" in caplog.text and "FIFO" in caplog.text
    for thread in ("zz", "ff"):  # asked for by name: an error, not an empty thread
        with pytest.raises(UnreadableFileError):
            list(saver.list({"configurable": {"thread_id": thread}}))
        with pytest.raises(UnreadableFileError):
            saver.get_tuple({"configurable": {"thread_id": thread}})


@pytest.mark.parametrize("hit", ["value", "key"])
def test_threads_and_show_name_a_damaged_log_and_exit_1(store: tuple[Path, list[Any]], hit: str) -> None:
    """`ckptfs threads` and `ckptfs show --thread` read the log without its damaged records:
    with the newest checkpoint's record damaged they showed 29 checkpoints, the one before as
    the newest, exit 0, the damage only in two logger lines naming a temporary copy of the log.
    Now a warning names the store's log and the byte, --json carries `damaged_records`, exit 1."""
    root = store[0]
    offset = _records(root)[-2][0]
    code, doc, err = cli_json("threads", str(root))
    assert code == 0 and doc["threads"][0].get("damaged_records", []) == [], err  # undamaged
    _flip(root, offset + HITS[hit])
    code, doc, err = cli_json("threads", str(root))
    assert code == 1, (doc, err)
    row = doc["threads"][0]
    assert row["checkpoints"] == STEPS - 1 and row["damaged_records"] == [offset]
    assert f"warning: {LOG}: damaged record(s) at byte {offset}" in err
    assert "may not be the newest written" in err
    code, out, err = cli("threads", str(root))
    assert code == 1 and f"{LOG}: damaged record(s) at byte {offset}" in err, (out, err)
    code, doc, err = cli_json("show", str(root), "--thread", "T")
    assert code == 1 and doc["damaged_records"] == [{"checkpoint_ns": "", "offsets": [offset]}], err
    assert len(doc["checkpoints"]) == STEPS - 1
