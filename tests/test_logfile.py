"""RecordLog: appends, views, torn tails, flipped bytes, SIGKILL mid-append, concurrent writers."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptfs.errors import CorruptFileError
from ckptfs.storage.logfile import HEADER_SIZE, MAGIC, RecordLog, frame

ROOT = str(Path(__file__).resolve().parent.parent)

# The child imports ckptfs.storage.logfile without running ckptfs/__init__.py (which loads the whole
# library, ~0.4 s): a bare package object pointing at the source directory. That also shows the
# module needs nothing but the stdlib and ckptfs.errors.
CHILD = r"""
import hashlib, os, sys, types
pkg = types.ModuleType("ckptfs")
pkg.__path__ = [os.path.join(sys.argv[1], "ckptfs")]
sys.modules["ckptfs"] = pkg
from ckptfs.storage.logfile import RecordLog

def payload(tag, i):
    head = f"{tag}:{i}:".encode()
    return head + hashlib.sha256(head).digest() * (1 + (i * 7919) % 500) * (64 if tag == "big" else 1)

log = RecordLog(sys.argv[2], fsync=sys.argv[7] == "fsync")
tag, count = sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
if sys.argv[5] == "wait":
    sys.stdin.readline()
i = int(sys.argv[6])
while count < 0 or i < count:
    with log.locked() as lg:
        off = lg.append([payload(tag, i)])[0]
    print(off, i, flush=True)
    i += 1
"""


def payload(tag: str, i: int) -> bytes:
    """Up to 16 KB (1 MB for tag "big", so that a kill often lands inside the write)."""
    head = f"{tag}:{i}:".encode()
    return head + hashlib.sha256(head).digest() * (1 + (i * 7919) % 500) * (64 if tag == "big" else 1)


def spawn(path: Path, tag: str, count: int, wait: bool = False, first: int = 0,
          fsync: bool = True) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, ROOT, str(path), tag, str(count), "wait" if wait else "go", str(first),
         "fsync" if fsync else "nosync"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    return child


def acked_lines(out: bytes) -> list[tuple[int, int]]:
    """(offset, i) of every append the child saw return; a line cut by the kill does not count."""
    lines = out.split(b"\n")[:-1]  # the last element is "" or an unterminated line
    return [(int(a), int(b)) for a, b in (ln.split() for ln in lines)]


def append(log: RecordLog, *payloads: bytes) -> list[int]:
    with log.locked() as lg:
        return lg.append(list(payloads))


def five(path: Path) -> tuple[RecordLog, list[int]]:
    log = RecordLog(str(path))
    offs = append(log, *(f"record {i} ".encode() * (i + 3) for i in range(1, 6)))
    return log, offs


# -- basics ----------------------------------------------------------------------------------------


def test_round_trip_offsets_and_views(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "group.log"
    a = RecordLog(str(path))
    assert a.refresh() == (False, [])
    assert not path.exists()  # neither the constructor nor a refresh creates anything
    with pytest.raises(FileNotFoundError):
        a.read(0)

    first = [b"alpha", b"", b"\x00" * 5000]
    offs = append(a, *first)
    expected, pos = [], 0
    for p in first:
        expected.append(pos)
        pos += HEADER_SIZE + len(p)
    assert offs == expected
    assert path.stat().st_size == pos
    assert [a.read(o) for o in offs] == first
    assert a.refresh() == (False, [])  # its own appends: the caller has their offsets already

    b = RecordLog(str(path))
    assert b.refresh() == (False, list(zip(offs, first, strict=True)))
    assert b.refresh() == (False, [])
    more = append(b, b"delta")
    assert more == [pos]
    assert a.refresh() == (False, [(pos, b"delta")])  # only what it has not returned before
    assert a.refresh() == (False, [])
    assert a.read(pos) == b"delta"
    assert b.damaged == [] and a.damaged == []


def test_frame_layout_is_documented_one(tmp_path: Path) -> None:
    log = RecordLog(str(tmp_path / "l"))
    append(log, b"xyz")
    raw = (tmp_path / "l").read_bytes()
    assert raw == frame(b"xyz")
    assert raw[:4] == MAGIC and int.from_bytes(raw[4:8], "little") == 3
    assert int.from_bytes(raw[8:12], "little") == zlib.crc32(raw[4:8] + b"xyz")


def test_other_object_sees_rewrite_and_remove_as_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    a, b = RecordLog(path), RecordLog(path)
    append(a, b"1", b"2", b"3")
    assert len(b.refresh()[1]) == 3
    new = a.rewrite([b"only", b"these"])
    assert new == [0, HEADER_SIZE + 4]
    assert a.refresh() == (False, [])  # its view is the new file
    assert b.refresh() == (True, [(new[0], b"only"), (new[1], b"these")])
    assert b.read(new[1]) == b"these"
    assert b.refresh() == (False, [])
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]  # the temp file was renamed

    a.remove()
    assert not os.path.exists(path)
    assert a.refresh() == (False, [])
    assert b.refresh() == (True, [])
    assert b.refresh() == (False, [])
    with pytest.raises(FileNotFoundError):
        b.read(0)
    a.remove()  # a missing log is fine

    append(b, b"again")  # recreated: a had seen the file go, so a fresh start, not "replaced"
    assert a.refresh() == (False, [(0, b"again")])
    assert a.rewrite([]) == [] and not os.path.exists(path)  # no payloads: removed
    assert b.refresh() == (True, [])


def test_rewrite_under_old_view_gives_full_new_list(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    a, b = RecordLog(path), RecordLog(path)
    append(a, *(bytes([i]) * 100 for i in range(10)))
    assert len(b.refresh()[1]) == 10
    append(a, b"tail")  # b has not seen this one either
    keep = [b"k1" * 50, b"k2" * 70, b"k3"]
    with a.locked() as lg:
        _, recs = lg.new_records()  # compaction: read and rewrite under one lock
        assert recs == []  # a appended everything itself
        new = a.rewrite(keep)
    replaced, recs = b.refresh()
    assert replaced and recs == list(zip(new, keep, strict=True))
    assert [b.read(o) for o in new] == keep
    append(a, b"after")
    assert b.refresh() == (False, [(new[-1] + HEADER_SIZE + 2, b"after")])


def test_append_catches_up_and_next_refresh_returns_what_it_found(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    a, b = RecordLog(path), RecordLog(path)
    append(a, b"a1")
    assert b.refresh()[1] == [(0, b"a1")]
    append(a, b"a2")
    off = append(b, b"b1")  # b did not call new_records: append does it, never writing over a2
    assert off == [2 * (HEADER_SIZE + 2)]
    # what the append found, then b's own record after it: applied in order, b1 stays the newest
    assert b.refresh() == (False, [(HEADER_SIZE + 2, b"a2"), (off[0], b"b1")])
    assert b.refresh() == (False, [])
    with b.locked() as lg:
        assert lg.new_records() == (False, [])
    assert append(b, b"b2") and b.refresh() == (False, [])  # nothing to catch up: own appends stay out


def test_append_over_a_replaced_file_completes_the_rebuild_list(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    a, b = RecordLog(path), RecordLog(path)
    append(a, b"x1", b"x2")
    b.refresh()
    new = a.rewrite([b"n1", b"n2", b"n3"])
    mine = append(b, b"b1")  # b's view was the old file; its append lands in the new one
    assert mine == [new[-1] + HEADER_SIZE + 2]
    assert b.refresh() == (True, [*zip(new, [b"n1", b"n2", b"n3"], strict=True), (mine[0], b"b1")])
    assert a.refresh() == (False, [(mine[0], b"b1")])


def test_one_write_and_one_fdatasync_per_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "l")
    append(RecordLog(path), b"first")  # the file exists: what follows is the steady state
    log = RecordLog(path)
    log.refresh()
    calls: list[str] = []
    real_pwrite, real_write, real_fdatasync, real_fsync = os.pwrite, os.write, os.fdatasync, os.fsync

    me = threading.get_ident()

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # this thread's calls only: the patch is process-wide, and under pytest-xdist a thread
        # an earlier test left running (a lease release, a compactor) may fsync meanwhile
        def wrapper(*a: Any) -> Any:
            if threading.get_ident() == me:
                calls.append(name)
            return fn(*a)
        return wrapper

    monkeypatch.setattr(os, "pwrite", spy("write", real_pwrite))
    monkeypatch.setattr(os, "write", spy("write", real_write))
    monkeypatch.setattr(os, "fdatasync", spy("sync", real_fdatasync))
    monkeypatch.setattr(os, "fsync", spy("sync", real_fsync))
    append(log, b"x" * 4096, b"y" * 10, b"z")
    assert calls == ["write", "sync"]

    calls.clear()
    quiet = RecordLog(path, fsync=False)
    offs = append(quiet, b"no", b"sync")
    assert calls == ["write"]
    assert quiet.rewrite([b"r"]) == [0] and calls == ["write", "write"]
    assert RecordLog(path, fsync=False).refresh() == (False, [(0, b"r")])
    assert offs  # the appends before the rewrite were real
    quiet.remove()
    assert calls == ["write", "write"] and not os.path.exists(path)


def test_threads_share_one_object(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    log = RecordLog(path, fsync=False)
    got: list[int] = []
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(50):
                got.extend(append(log, f"{t}:{i}".encode()))
                log.refresh()
                log.read(got[-1])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    recs = RecordLog(path).refresh()[1]
    assert sorted(got) == [o for o, _ in recs] and len(recs) == 200
    assert sorted(p for _, p in recs) == sorted(f"{t}:{i}".encode() for t in range(4) for i in range(50))


def test_locked_waiter_follows_a_rewrite_to_the_new_file(tmp_path: Path) -> None:
    """A writer blocked on the old file's lock must not append to the file a rewrite replaced."""
    path = str(tmp_path / "l")
    a, b = RecordLog(path), RecordLog(path)
    append(a, b"old")
    waiting = threading.Event()
    b_offsets: list[int] = []

    def b_appends() -> None:
        waiting.set()
        b_offsets.extend(append(b, b"from b"))

    with a.locked() as lg:
        t = threading.Thread(target=b_appends)
        t.start()
        waiting.wait()
        time.sleep(0.1)  # b now sits in flock() on the old inode
        a.rewrite([b"new1", b"new2"])
        time.sleep(0.05)  # b's lock on the old inode is free now; it must find the new file locked
        lg.append([b"from a"])
    t.join(timeout=10)
    recs = RecordLog(path).refresh()[1]
    assert [p for _, p in recs] == [b"new1", b"new2", b"from a", b"from b"]
    assert b_offsets == [recs[3][0]]


def test_forked_child_does_not_inherit_the_lock(tmp_path: Path) -> None:
    """The kept write fd is shared with a forked child, and so would be its flock."""
    log = RecordLog(str(tmp_path / "l"))
    append(log, b"first")  # the write fd is now open and cached
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.read(r, 1)  # the parent holds the lock now
            with log.locked() as lg:
                lg.append([b"child"])
            code = 0
        finally:
            os._exit(code)
    with log.locked() as lg:
        os.write(w, b"x")
        time.sleep(0.2)  # long enough for the child to write, were it let in
        lg.append([b"parent"])
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [p for _, p in RecordLog(log.path).refresh()[1]] == [b"first", b"parent", b"child"]


def test_remove_inside_locked_block_ends_writing(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    log = RecordLog(path)
    append(log, b"x")
    with log.locked() as lg:
        log.remove()
        with pytest.raises(RuntimeError, match="removed"):
            lg.append([b"y"])
    assert not os.path.exists(path)
    with pytest.raises(RuntimeError, match="outside"):
        lg.append([b"z"])
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.refresh()


# -- torn tails and flipped bytes ------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["cut_third", "garbage", "cut_header", "magic_then_junk"])
def test_torn_tail_hidden_from_readers_then_truncated(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "l"
    log = RecordLog(str(path))
    offs = append(log, b"one" * 10, b"two" * 20, b"three" * 30)
    end2 = offs[2]
    with open(path, "r+b") as f:
        if damage == "cut_third":
            f.truncate(offs[2] + HEADER_SIZE + 40)
        elif damage == "cut_header":
            f.truncate(offs[2] + 7)
        else:
            f.truncate(end2)
            f.seek(end2)
            f.write((MAGIC if damage == "magic_then_junk" else b"") + os.urandom(300))
    junk = path.stat().st_size - end2

    reader = RecordLog(str(path))
    assert reader.refresh() == (False, [(offs[0], b"one" * 10), (offs[1], b"two" * 20)])
    assert reader.damaged == []  # a tail is not damage
    assert reader.torn is not None and reader.torn[:2] == (end2, junk)  # but it is told: where, how long
    assert reader.refresh() == (False, [])
    assert path.stat().st_size == end2 + junk  # readers never write

    with caplog.at_level(logging.WARNING, logger="ckptfs.storage.logfile"):
        new = append(RecordLog(str(path)), b"four")
    assert new == [end2]
    assert f"torn tail of {junk} bytes" in caplog.text
    assert path.stat().st_size == end2 + HEADER_SIZE + 4
    assert reader.refresh() == (False, [(end2, b"four")])
    assert reader.read(end2) == b"four"
    assert reader.damaged == [] and reader.torn is None


@pytest.mark.parametrize("where", ["magic", "length", "crc", "payload", "length_huge"])
def test_flipped_byte_in_record_two_of_five(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "l"
    log, offs = five(path)
    good = {o: log.read(o) for o in offs}
    at = {"magic": 1, "length": 4, "crc": 9, "payload": HEADER_SIZE + 5, "length_huge": 7}[where]
    raw = bytearray(path.read_bytes())
    raw[offs[1] + at] ^= 0x80 if where == "length_huge" else 0x01
    path.write_bytes(bytes(raw))

    reader = RecordLog(str(path))
    with caplog.at_level(logging.WARNING, logger="ckptfs.storage.logfile"):
        replaced, recs = reader.refresh()
    assert not replaced
    assert recs == [(o, good[o]) for o in offs if o != offs[1]]
    assert [o for o, _ in reader.damaged] == [offs[1]]
    assert f"offset {offs[1]}" in caplog.text and str(path) in caplog.text
    with pytest.raises(CorruptFileError) as err:
        reader.read(offs[1])
    assert str(path) in str(err.value) and f"offset {offs[1]}" in str(err.value)
    assert reader.read(offs[2]) == good[offs[2]]

    # damage before valid records is not a tail: a writer keeps everything and appends after it
    new = append(RecordLog(str(path)), b"six")
    assert new == [offs[4] + HEADER_SIZE + len(good[offs[4]])]
    assert reader.refresh() == (False, [(new[0], b"six")])
    assert [o for o, _ in reader.damaged] == [offs[1]]  # reported once, not per refresh


def test_read_at_an_offset_that_is_no_record(tmp_path: Path) -> None:
    log, offs = five(tmp_path / "l")
    for bad in (offs[1] + 3, offs[4] + 10_000):
        with pytest.raises(CorruptFileError, match=f"offset {bad}"):
            log.read(bad)


# -- real processes --------------------------------------------------------------------------------


def test_sigkill_mid_append_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "g" / "crash.log"
    rng = random.Random(7)
    acked: dict[int, bytes] = {}
    first = 0
    for round_no in range(15):
        tag = "big" if round_no % 2 else "small"  # 1 MB writes: kills land inside write() more often
        child = spawn(path, tag, -1, first=first)
        time.sleep(rng.uniform(0.0, 0.05 if tag == "big" else 0.12))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        lines = acked_lines(out)
        for off, i in lines:
            acked[off] = payload(tag, i)
        first = (lines[-1][1] + 1) if lines else first  # payloads are per (tag, i): reuse is harmless

        reader = RecordLog(str(path))
        _, recs = reader.refresh()
        found = dict(recs)
        for off, data in acked.items():
            assert found.get(off) == data, f"round {round_no}: acknowledged record at {off} lost"
            assert reader.read(off) == data
        assert reader.damaged == []  # a crash leaves at most a tail, never damage before data

        end = recs[-1][0] + HEADER_SIZE + len(recs[-1][1]) if recs else 0
        marker = f"marker {round_no}".encode()
        assert append(RecordLog(str(path)), marker) == [end]  # after the repaired tail
        acked[end] = marker
        assert reader.refresh() == (False, [(end, marker)])
        assert reader.read(end) == marker
    assert len(acked) > 15 + 30  # the children really appended between kills


def test_two_processes_append_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "shared.log"
    children = {tag: spawn(path, tag, 200, wait=True) for tag in ("a", "b")}
    for child in children.values():
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
    reader = RecordLog(str(path))
    seen: list[tuple[int, bytes]] = []
    while any(c.poll() is None for c in children.values()):
        replaced, recs = reader.refresh()
        assert not replaced and reader.damaged == []  # a reader never sees a half-written record
        seen.extend(recs)
    outs = {tag: acked_lines(c.communicate()[0]) for tag, c in children.items()}
    assert all(c.returncode == 0 for c in children.values())
    seen.extend(reader.refresh()[1])

    assert len(seen) == 400 and reader.damaged == []
    assert [o for o, _ in seen] == sorted({o for o, _ in seen})
    by_offset = dict(seen)
    for tag, lines in outs.items():
        assert [i for _, i in lines] == list(range(200))
        for off, i in lines:
            assert by_offset[off] == payload(tag, i)
    tags = [p[:1] for _, p in seen]
    assert sum(1 for x, y in itertools.pairwise(tags) if x != y) >= 2  # truly interleaved
    assert os.path.getsize(path) == sum(HEADER_SIZE + len(p) for _, p in seen)


@pytest.mark.parametrize("state", ["being written", "torn by a crash", "payload damaged", "header damaged"])
def test_a_frame_stored_inside_a_value_is_never_taken_for_a_record(tmp_path: Path, state: str) -> None:
    """Values may contain whole valid frames (a state can hold a copy of a log). A reader that
    meets the value's record half-written, torn or damaged must not find the frame inside it."""
    path = tmp_path / "l"
    log = RecordLog(str(path))
    first = append(log, b"before")[0]
    forged = frame(b"FORGED")
    value = os.urandom(3000) + forged + os.urandom(3000)
    second = append(log, value)[0]
    full = path.read_bytes()
    inside = second + HEADER_SIZE + 3000 + len(forged) + 10  # just past the forged frame
    damaged = state.endswith("damaged")
    if damaged:
        raw = bytearray(full)
        # before the forged frame, inside the same record; or its magic: the search for the next
        # record must not start inside a record whose payload still proves where it ends
        raw[second + (HEADER_SIZE + 5 if state == "payload damaged" else 2)] ^= 0x01
        path.write_bytes(bytes(raw) + frame(b"after"))
    else:
        path.write_bytes(full[:inside])
    reader = RecordLog(str(path))
    payloads = [p for _, p in reader.refresh()[1]]
    assert b"FORGED" not in payloads
    assert payloads == ([b"before", b"after"] if damaged else [b"before"])
    if damaged:
        assert [o for o, _ in reader.damaged] == [second]
    else:
        assert first == 0 and reader.damaged == []
        new = append(RecordLog(str(path)), b"next")  # the writer cuts the torn record away whole
        assert new == [second]
        assert [p for _, p in RecordLog(str(path)).refresh()[1]] == [b"before", b"next"]


def test_a_temp_file_of_a_killed_rewrite_is_swept_by_the_next_writer(tmp_path: Path) -> None:
    path = tmp_path / "l"
    append(RecordLog(str(path)), b"one")
    leftover = tmp_path / ".l.tmp-0123456789ab"
    leftover.write_bytes(frame(b"half a rewrite"))
    reader = RecordLog(str(path))
    assert [p for _, p in reader.refresh()[1]] == [b"one"]
    assert leftover.exists()  # readers never write
    append(RecordLog(str(path)), b"two")
    assert not leftover.exists()
    assert [p for _, p in RecordLog(str(path)).refresh()[1]] == [b"one", b"two"]


def test_a_flipped_byte_in_the_last_record_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "l"
    log, offs = five(path)
    good = {o: log.read(o) for o in offs}
    raw = bytearray(path.read_bytes())
    raw[offs[4] + HEADER_SIZE + 3] ^= 0x04
    path.write_bytes(bytes(raw))
    reader = RecordLog(str(path))
    assert [o for o, _ in reader.refresh()[1]] == offs[:4]
    assert [o for o, _ in reader.damaged] == [offs[4]]
    new = append(RecordLog(str(path)), b"six")  # the writer keeps it: evidence, not junk
    assert new == [offs[4] + HEADER_SIZE + len(good[offs[4]])]
    assert reader.refresh() == (False, [(new[0], b"six")])


@pytest.mark.parametrize("where", ["magic", "length", "header crc", "payload crc field", "torn"])
def test_a_damaged_header_of_the_last_record_is_damage_when_its_payload_proves_it(
        tmp_path: Path, where: str) -> None:
    """A torn write leaves a prefix of a record, never a whole one under a wrong header: the last
    record with a flipped header byte whose payload still matches its crc (for the length stored,
    or the length up to the end of the file) is damage, kept and reported; the writer must not
    truncate it as a torn tail. Without such a proof (the crc field itself hit) it stays a tail."""
    path = tmp_path / "l"
    log, offs = five(path)
    good = {o: log.read(o) for o in offs}
    size = path.stat().st_size
    at = {"magic": 0, "length": 5, "header crc": 13, "payload crc field": 9, "torn": 9}[where]
    raw = bytearray(path.read_bytes())
    raw[offs[4] + at] ^= 0x01
    if where == "torn":  # a prefix of a record, the header damaged too: no proof, a tail
        raw = raw[: offs[4] + HEADER_SIZE + 10]
    path.write_bytes(bytes(raw))
    reader = RecordLog(str(path))
    assert [o for o, _ in reader.refresh()[1]] == offs[:4]
    new = append(RecordLog(str(path)), b"six")
    if where in ("payload crc field", "torn"):
        assert reader.damaged == []
        assert reader.torn is not None and reader.torn[:2] == (offs[4], len(raw) - offs[4])
        assert new == [offs[4]]  # truncated: nothing proves a whole record was there
        return
    assert [o for o, _ in reader.damaged] == [offs[4]] and reader.torn is None
    assert new == [size]  # kept: evidence of an acknowledged record, not junk
    assert path.read_bytes()[: size] == bytes(raw)
    assert reader.refresh() == (False, [(size, b"six")])
    assert [o for o, _ in reader.damaged] == [offs[4]]
    with pytest.raises(CorruptFileError, match=f"offset {offs[4]}"):
        reader.read(offs[4])
    assert good[offs[3]] == reader.read(offs[3])


def test_a_read_with_a_length_hint_checks_the_record_all_the_same(tmp_path: Path) -> None:
    """`read(offset, length)` reads exactly the record when the hint is right; a wrong hint
    costs a read more, never a wrong payload, and a damaged record is refused either way."""
    log = RecordLog(str(tmp_path / "l.log"))
    payloads = [b"a" * 10, b"b" * 70_000, b"c" * 3]
    with log.locked() as w:
        offs = w.append(payloads)
    for off, p in zip(offs, payloads, strict=True):
        for hint in (len(p), -1, 0, len(p) - 1, len(p) + 5, 10**6):
            assert log.read(off, hint) == p
    with open(tmp_path / "l.log", "r+b") as f:  # one payload byte of the middle record flips
        f.seek(offs[1] + HEADER_SIZE + 5)
        f.write(b"X")
    for hint in (70_000, -1, 12):
        with pytest.raises(CorruptFileError, match="crc mismatch"):
            log.read(offs[1], hint)
    assert log.read(offs[2], 3) == b"ccc"
