"""LogStorage: the Storage contract over grouped append-only logs, across processes, through
SIGKILL, compaction and plain files written before the log existed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptfs.errors import CorruptFileError
from ckptfs.storage.base import PreconditionFailed, Storage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logfile import RecordLog, frame
from ckptfs.storage.logstore import LOG_NAME, LogStorage, _record
from ckptfs.storage.registry import open_storage
from tests.storage_conformance import StorageConformance

ROOT = Path(__file__).resolve().parent.parent


def first_segment(key: str) -> str | None:
    """Group by the first path segment: every key of the conformance suite lands in a log."""
    head, sep, _ = key.partition("/")
    return head + "/" if sep and head else None


def open_log_storage(path: Path) -> LogStorage:
    inner = open_storage(str(path))
    assert isinstance(inner, LocalStorage)
    return LogStorage(inner, first_segment)


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return open_log_storage(tmp_path / "s")


class TestLogStorage(StorageConformance):
    def test_one_file_per_group_and_a_second_instance_sees_it_all(self, tmp_path: Path) -> None:
        a, b = open_log_storage(tmp_path), open_log_storage(tmp_path)
        for i in range(20):
            a.put(f"g/ckpt/{i:03d}", f"value {i}".encode())
        assert sorted(p.name for p in (tmp_path / "g").iterdir()) == [LOG_NAME]
        assert b.list("g/ckpt/") == [f"g/ckpt/{i:03d}" for i in range(20)]
        assert b.list_dirs("g/") == ["ckpt"]
        assert b.get("g/ckpt/007") == b"value 7"
        a.put("g/ckpt/007", b"replaced")
        assert b.get("g/ckpt/007") == b"replaced"
        with pytest.raises(FileExistsError):
            b.put_if_absent("g/ckpt/007", b"again")

    def test_the_log_name_is_not_a_key(self, storage: Storage) -> None:
        with pytest.raises(ValueError, match="log"):
            storage.put("g/" + LOG_NAME, b"x")

    def test_deleting_everything_removes_the_file(self, tmp_path: Path) -> None:
        s = open_log_storage(tmp_path)
        s.put("g/a", b"1")
        s.put("g/b", b"2")
        s.delete_many(["g/a", "g/b", "g/never"])
        assert not (tmp_path / "g" / LOG_NAME).exists()
        assert s.list("") == []
        s.put("g/c", b"3")  # and the group starts over
        assert open_log_storage(tmp_path).get("g/c") == b"3"

    def test_compaction_reclaims_space_and_old_views_follow(self, tmp_path: Path) -> None:
        a, b = open_log_storage(tmp_path), open_log_storage(tmp_path)
        blob = os.urandom(64 * 1024)
        for i in range(40):
            a.put(f"g/{i:03d}", blob + bytes([i]))
        assert b.get("g/039")[-1] == 39  # b indexes the uncompacted file
        before = (tmp_path / "g" / LOG_NAME).stat().st_size
        a.delete_many([f"g/{i:03d}" for i in range(35)])
        after = (tmp_path / "g" / LOG_NAME).stat().st_size
        assert after < before / 5, (before, after)
        assert [b.get(f"g/{i:03d}")[-1] for i in range(35, 40)] == list(range(35, 40))
        assert b.list("g/") == [f"g/{i:03d}" for i in range(35, 40)]
        b.put("g/new", b"after compaction")
        assert a.get("g/new") == b"after compaction"

    def test_plain_files_from_before_the_log_stay_readable(self, tmp_path: Path) -> None:
        plain = open_storage(str(tmp_path))
        plain.put("g/ckpt/old", b"written without a log")
        plain.put("g/held/old", b"also")
        s = open_log_storage(tmp_path)
        s.put("g/ckpt/new", b"in the log")
        assert s.list("g/") == ["g/ckpt/new", "g/ckpt/old", "g/held/old"]
        assert s.get("g/ckpt/old") == b"written without a log"
        with pytest.raises(FileExistsError):
            s.put_if_absent("g/ckpt/old", b"no")
        s.put("g/ckpt/old", b"now in the log")  # the record replaces the plain file
        assert open_log_storage(tmp_path).get("g/ckpt/old") == b"now in the log"
        assert not (tmp_path / "g" / "ckpt" / "old").exists()
        s.delete("g/held/old")
        assert s.list("g/") == ["g/ckpt/new", "g/ckpt/old"]

    def test_open_logs_are_bounded(self, tmp_path: Path) -> None:
        inner = open_storage(str(tmp_path))
        assert isinstance(inner, LocalStorage)
        s = LogStorage(inner, first_segment, max_open_groups=3)
        fds = len(os.listdir("/proc/self/fd"))
        for round_ in range(3):
            for g in range(12):
                s.put(f"g{g:02d}/k{round_}", f"{g}:{round_}".encode())
        assert len(os.listdir("/proc/self/fd")) <= fds + 2 * 3  # at most two fds per open log
        assert [s.get(f"g{g:02d}/k2") for g in range(12)] == [f"{g}:2".encode() for g in range(12)]
        assert s.list("g05/") == ["g05/k0", "g05/k1", "g05/k2"]

    def test_a_repeated_key_in_delete_many_deletes_only_it(self, tmp_path: Path) -> None:
        s = open_log_storage(tmp_path)
        s.put("g/a", b"1")
        s.put("g/b", b"must survive")
        s.delete_many(["g/a", "g/a"])
        assert open_log_storage(tmp_path).get("g/b") == b"must survive"

    def test_etags_are_of_content_so_a_stale_one_never_passes(self, tmp_path: Path) -> None:
        s = open_log_storage(tmp_path)
        stale = s.put("g/k", b"v1")
        s.delete("g/k")  # the log goes, and a new one starts at the same offsets
        s.put("g/k", b"v2 longer")
        with pytest.raises(PreconditionFailed):
            s.put_if_match("g/k", b"v3", stale)
        blob = os.urandom(2 * 1024 * 1024)
        s.put("g/big", blob)
        s.put("g/k", b"v4")
        stale = s.get_with_etag("g/k")[1]
        s.put("g/k", b"v5")
        s.delete("g/big")  # compaction: records move to new offsets
        with pytest.raises(PreconditionFailed):
            s.put_if_match("g/k", b"v6", stale)
        assert s.get("g/k") == b"v5"
        s.put_if_match("g/k", b"v6", s.get_with_etag("g/k")[1])
        assert open_log_storage(tmp_path).get("g/k") == b"v6"

    def test_a_damaged_newest_record_is_reported_not_replaced_by_an_older_one(self, tmp_path: Path) -> None:
        s = open_log_storage(tmp_path)
        s.put("g/v", b"version 1")
        s.put("g/other", b"x" * 100)
        s.put("g/v", b"version 2 " + b"y" * 100)
        log = tmp_path / "g" / LOG_NAME
        raw = bytearray(log.read_bytes())
        raw[-30] ^= 0x01  # inside version 2's value: its key is still legible
        log.write_bytes(bytes(raw) + bytes(frame(_record(b"P", "g/later", b"z"))))
        fresh = open_log_storage(tmp_path)
        with pytest.raises(CorruptFileError, match="damaged"):
            fresh.get("g/v")
        assert fresh.get("g/other") == b"x" * 100
        assert fresh.get("g/later") == b"z"
        fresh.delete("g/other")  # no compaction over damage: the evidence stays
        assert len(RecordLog(str(log)).refresh()[1]) >= 3
        fresh.put("g/v", b"version 3")  # written again: readable again
        assert open_log_storage(tmp_path).get("g/v") == b"version 3"

    @pytest.mark.parametrize("hit", ["value", "key", "magic"])
    def test_newest_never_answers_an_older_key_when_a_newer_record_is_damaged(
            self, tmp_path: Path, hit: str) -> None:
        """`newest` is the latest of keys named in time order: with the record of the greatest
        key damaged (its only record), answering the one before would be a wrong answer."""
        s = open_log_storage(tmp_path)
        for i in range(3):
            s.put(f"g/ckpt/{i}", f"state {i} ".encode() * 20)
            s.put(f"g/writes/{i}/a", b"w" * 50)
        log = tmp_path / "g" / LOG_NAME
        assert s.newest("g/ckpt/", lambda k: "g/writes/" + k.rsplit("/", 1)[1] + "/")[0] == "g/ckpt/2"
        offs = [o for o, _ in RecordLog(str(log)).refresh()[1]]
        raw = bytearray(log.read_bytes())
        raw[offs[4] + {"value": 40, "key": 20, "magic": 1}[hit]] ^= 0x01  # g/ckpt/2's record
        log.write_bytes(bytes(raw))
        time.sleep(0.06)  # the directory's stamp settles: the one-look path (see _scan_loose)
        fresh = open_log_storage(tmp_path)
        with pytest.raises(CorruptFileError) as err:
            fresh.newest("g/ckpt/", lambda k: "g/writes/" + k.rsplit("/", 1)[1] + "/")
        assert f"byte {offs[4]}" in str(err.value) and str(log) in str(err.value)
        if hit != "key":
            assert "g/ckpt/2" in str(err.value)
        damage = fresh.damage("g/", "g/ckpt/")
        assert [(d.offset, d.key, d.after) for d in damage] == (
            [(offs[4], None, "g/ckpt/1")] if hit == "key" else [(offs[4], "g/ckpt/2", None)])
        assert fresh.get("g/ckpt/1").startswith(b"state 1")  # what is intact reads as before
        fresh.put("g/ckpt/3", b"state 3")  # written after the damage: the newest again
        assert fresh.newest("g/ckpt/")[0] == "g/ckpt/3"
        assert open_log_storage(tmp_path).newest("g/ckpt/")[0] == "g/ckpt/3"

    @pytest.mark.parametrize("hit", ["value", "key"])
    def test_newest_refuses_when_what_is_filed_under_it_is_damaged(self, tmp_path: Path, hit: str) -> None:
        s = open_log_storage(tmp_path)
        s.put("g/ckpt/1", b"one")
        s.put("g/writes/1/a", b"a" * 80)
        s.put("g/writes/1/b", b"b" * 80)
        log = tmp_path / "g" / LOG_NAME
        last = RecordLog(str(log)).refresh()[1][-1][0]
        raw = bytearray(log.read_bytes())
        raw[last + {"value": 60, "key": 20}[hit]] ^= 0x01
        log.write_bytes(bytes(raw))
        fresh = open_log_storage(tmp_path)
        with pytest.raises(CorruptFileError, match=f"byte {last}"):
            fresh.newest("g/ckpt/", lambda k: "g/writes/1/")
        if hit == "value":  # its key legible and nothing asked under g/ckpt/1: the answer stands
            assert fresh.newest("g/ckpt/")[0] == "g/ckpt/1"
        assert fresh.list("g/writes/") == ["g/writes/1/a"]  # a listing stays a listing of what is there

    def test_a_deleted_damaged_key_hides_nothing_from_any_reader(self, tmp_path: Path) -> None:
        s = open_log_storage(tmp_path)
        s.put("g/a", b"keep")
        s.put("g/z", b"z" * 100)
        log = tmp_path / "g" / LOG_NAME
        raw = bytearray(log.read_bytes())
        raw[-20] ^= 0x01  # g/z's only record
        log.write_bytes(bytes(raw))
        fresh = open_log_storage(tmp_path)
        with pytest.raises(CorruptFileError, match="g/z"):
            fresh.newest("g/")
        fresh.delete("g/z")  # a tombstone, so other readers learn it too
        assert fresh.newest("g/")[0] == "g/a"
        assert open_log_storage(tmp_path).newest("g/")[0] == "g/a"
        assert open_log_storage(tmp_path).get("g/a") == b"keep"

    def test_the_log_file_is_no_key_and_bad_records_are_skipped(self, tmp_path: Path) -> None:
        s = open_log_storage(tmp_path)
        s.put("g/a", b"1")
        for call in (s.get, s.delete, s.size):
            with pytest.raises(ValueError, match="log"):
                call("g/" + LOG_NAME)
        log = tmp_path / "g" / LOG_NAME
        # a record whose crc is right but whose key length runs past it
        log.write_bytes(log.read_bytes() + frame(b"P\xff\x00g/b"))
        fresh = open_log_storage(tmp_path)
        assert fresh.list("g/") == ["g/a"]
        assert fresh.get("g/a") == b"1"

    def test_close_while_other_threads_work_leaves_it_usable(self, tmp_path: Path) -> None:
        import threading

        inner = open_storage(str(tmp_path), {"fsync": False})  # fast calls: many land beside a close
        assert isinstance(inner, LocalStorage)
        s = LogStorage(inner, first_segment)
        s.put("g/a", b"A")
        errors: list[str] = []
        stop = threading.Event()

        def worker() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    s.put(f"g/k{i % 50}", b"v")
                    assert s.get("g/a") == b"A"
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for _ in range(300):
            s.close()
        stop.set()
        for t in threads:
            t.join()
        assert errors == []
        assert s.get("g/a") == b"A"


_CHILD = """
import random
import sys
from ckptfs.storage.logstore import LogStorage
from ckptfs.storage.registry import open_storage
from tests.test_logstore import first_segment
s = LogStorage(open_storage(sys.argv[1]), first_segment)
mode, tag = sys.argv[2], sys.argv[3]
start = int(sys.argv[4])
print("ready", flush=True)
if mode == "race":
    sys.stdin.readline()  # the starting gun: both racers are loaded by now
order = range(start, start + 1_000_000) if mode == "seq" else range(1000)
if mode == "race":
    order = random.Random(tag).sample(order, len(order))  # each racer its own order: they collide
for i in order:
    key = f"g/{i:06d}" if mode == "seq" else f"race/{i:04d}"
    try:
        (s.put if mode == "seq" else s.put_if_absent)(key, f"{tag}:{i}".encode() * (1 + i % 50))
    except FileExistsError:
        continue
    print(key, flush=True)
"""


def _child(root: Path, mode: str, tag: str, start: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(root), mode, tag, str(start)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_put_if_absent_across_processes_has_one_winner_per_key(tmp_path: Path) -> None:
    kids = [_child(tmp_path, "race", tag) for tag in ("a", "b")]
    for kid in kids:
        assert kid.stdout is not None and kid.stdout.readline() == "ready\n"
    for kid in kids:
        assert kid.stdin is not None
        kid.stdin.write("go\n")
        kid.stdin.flush()
    won = {tag: set(kid.communicate(timeout=120)[0].split()) for tag, kid in zip("ab", kids, strict=True)}
    assert won["a"] | won["b"] == {f"race/{i:04d}" for i in range(1000)}
    assert not won["a"] & won["b"]
    assert won["a"] and won["b"], "the racers did not overlap: the test proved nothing"
    s = open_log_storage(tmp_path)
    for tag, keys in won.items():
        for key in keys:
            assert s.get(key).startswith(f"{tag}:".encode())


def test_sigkill_never_loses_an_acknowledged_put(tmp_path: Path) -> None:
    rnd = random.Random(5)
    acked: dict[str, int] = {}
    start = 0
    for _ in range(12):
        kid = _child(tmp_path, "seq", "k", start)
        assert kid.stdout is not None
        assert kid.stdout.readline() == "ready\n"
        time.sleep(rnd.uniform(0.02, 0.3))
        os.kill(kid.pid, signal.SIGKILL)
        out, _ = kid.communicate(timeout=30)
        for line in out.splitlines(keepends=True):
            if line.endswith("\n"):  # a line the kill cut short was never acknowledged
                acked[line.strip()] = int(line.strip().split("/")[1])
        start = max(acked.values(), default=-1) + 1
        s = open_log_storage(tmp_path)  # a fresh process's view: only what reached the disk
        listed = set(s.list("g/"))
        missing = [k for k in acked if k not in listed]
        assert not missing, f"acknowledged but lost: {missing[:5]}"
        for key, i in rnd.sample(sorted(acked.items()), min(20, len(acked))):
            assert s.get(key) == f"k:{i}".encode() * (1 + i % 50)
    assert len(acked) > 100, json.dumps(len(acked))
