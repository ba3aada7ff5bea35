"""The Storage contract, written once; each backend's test module supplies a `storage` fixture."""

from __future__ import annotations

import io
import threading

import pytest

from ckptfs.storage.base import PreconditionFailed, Storage


class StorageConformance:
    def test_put_get_roundtrip_and_overwrite(self, storage: Storage) -> None:
        storage.put("a/b/c.bin", b"one")
        assert storage.get("a/b/c.bin") == b"one"
        storage.put("a/b/c.bin", b"two")
        assert storage.get("a/b/c.bin") == b"two"
        assert storage.size("a/b/c.bin") == 3

    def test_get_missing_raises_file_not_found(self, storage: Storage) -> None:
        with pytest.raises(FileNotFoundError):
            storage.get("nope/missing")
        assert not storage.exists("nope/missing")

    def test_put_if_absent_is_exclusive(self, storage: Storage) -> None:
        storage.put_if_absent("x/v1", b"first")
        with pytest.raises(FileExistsError):
            storage.put_if_absent("x/v1", b"second")
        assert storage.get("x/v1") == b"first"

    def test_put_if_absent_beside_tells_whether_the_witness_exists(self, storage: Storage) -> None:
        storage.put_if_absent("w/log/1", b"base")
        assert storage.put_if_absent_beside("w/log/2", b"two", "w/log/1") is True
        assert storage.put_if_absent_beside("w/log/3", b"three", "w/log/9") is False
        assert storage.put_if_absent_beside("w/log/4", b"four", "w/snap/1") is False  # elsewhere
        storage.put("w/snap/1", b"s")
        assert storage.put_if_absent_beside("w/log/5", b"five", "w/snap/1") is True
        storage.delete("w/log/1")
        assert storage.put_if_absent_beside("w/log/6", b"six", "w/log/1") is False
        with pytest.raises(FileExistsError):  # refused like put_if_absent, nothing replaced
            storage.put_if_absent_beside("w/log/2", b"again", "w/log/1")
        assert [storage.get(f"w/log/{i}") for i in (2, 3, 4, 5, 6)] == [
            b"two", b"three", b"four", b"five", b"six"]

    def test_put_if_absent_concurrent_threads_one_winner(self, storage: Storage) -> None:
        wins: list[int] = []
        losses: list[int] = []
        barrier = threading.Barrier(6)

        def attempt(i: int) -> None:
            barrier.wait()
            try:
                storage.put_if_absent("race/key", f"writer{i}".encode())
                wins.append(i)
            except FileExistsError:
                losses.append(i)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1 and len(losses) == 5
        assert storage.get("race/key") == f"writer{wins[0]}".encode()

    def test_touch_renews_the_modification_time(self, storage: Storage) -> None:
        import time

        with pytest.raises(FileNotFoundError):
            storage.touch("touched")
        storage.put("touched", b"keep me")
        before = storage.modified("touched")
        time.sleep(1.1)  # S3's LastModified has whole seconds
        storage.touch("touched")
        assert storage.modified("touched") > before
        assert storage.get("touched") == b"keep me"

    def test_put_if_match_is_compare_and_swap(self, storage: Storage) -> None:
        etag = storage.put_if_absent("lease/a", b"gen1")
        data, etag2 = storage.get_with_etag("lease/a")
        assert data == b"gen1" and etag2 == etag
        new = storage.put_if_match("lease/a", b"gen2", etag)
        assert storage.get("lease/a") == b"gen2"
        with pytest.raises(PreconditionFailed):
            storage.put_if_match("lease/a", b"gen3", etag)  # stale etag
        assert storage.get("lease/a") == b"gen2"
        storage.put_if_match("lease/a", b"gen3", new)
        assert storage.get("lease/a") == b"gen3"

    def test_list_sorted_recursive_with_start_after(self, storage: Storage) -> None:
        for k in ["r/log/003", "r/log/001", "r/snap/002", "other/x"]:
            storage.put(k, b"1")
        assert storage.list("r") == ["r/log/001", "r/log/003", "r/snap/002"]
        assert storage.list("r/log/") == ["r/log/001", "r/log/003"]
        assert storage.list("r", start_after="r/log/001") == ["r/log/003", "r/snap/002"]
        assert storage.list("missing") == []
        assert storage.list_dirs("r") == ["log", "snap"]
        assert set(storage.list_dirs("")) >= {"r", "other"}

    def test_delete_is_idempotent(self, storage: Storage) -> None:
        storage.put("d/k", b"1")
        storage.delete("d/k")
        storage.delete("d/k")
        assert not storage.exists("d/k")

    def test_stream_roundtrip_and_exclusive(self, storage: Storage) -> None:
        payload = bytes(range(256)) * 20_000  # 5 MB, crosses multipart/chunk boundaries
        storage.put_stream("big/blob", io.BytesIO(payload), exclusive=True)
        with storage.open_read("big/blob") as f:
            assert f.read() == payload
        with pytest.raises(FileExistsError):
            storage.put_stream("big/blob", io.BytesIO(b"other"), exclusive=True)

    def test_keys_cannot_escape_root(self, storage: Storage) -> None:
        for bad in ["../x", "a/../../x", "/abs", "a//b", "a/./b", "", "..", ".", "a/..", "a/.", "a/",
                    "a\\b", "a\x00b", "a/./", "./a"]:
            with pytest.raises(ValueError):
                storage.put(bad, b"1")
        # names that only contain dots are keys like any other
        for good in ["a/.b", "a/..b", "a/b..", "...", "a/.../b"]:
            storage.put(good, b"1")
            assert storage.get(good) == b"1"

    def test_describe_is_safe_to_print(self, storage: Storage) -> None:
        desc = storage.describe()
        assert set(desc) == {"url", "backend", "options", "capabilities"}
        text = repr(desc)
        for v in _secret_values(storage.options):
            assert v not in text


def _secret_values(opts: object) -> list[str]:
    out: list[str] = []
    if isinstance(opts, dict):
        for k, v in opts.items():
            if isinstance(v, dict):
                out += _secret_values(v)
            elif k in ("secret", "key", "token", "aws_secret_access_key") and isinstance(v, str):
                out.append(v)
    return out
