from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs.storage.base import Storage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.registry import open_storage
from tests.storage_conformance import StorageConformance


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return open_storage(f"file://{tmp_path}/root")


class TestLocal(StorageConformance):
    def test_plain_path_and_file_url_are_local(self, tmp_path: Path) -> None:
        assert isinstance(open_storage(str(tmp_path)), LocalStorage)
        assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)

    def test_no_temp_file_left_after_writes(self, storage: Storage, tmp_path: Path) -> None:
        for i in range(20):
            storage.put_if_absent(f"runs/r/log/{i:012d}.ckpt", b"x" * 100)
            storage.put("runs/r/ptr", str(i).encode())
        leftovers = [n for _, _, files in os.walk(tmp_path) for n in files if ".tmp-" in n]
        assert leftovers == []

    def test_failed_exclusive_create_leaves_no_temp(self, storage: Storage, tmp_path: Path) -> None:
        storage.put_if_absent("k", b"1")
        with pytest.raises(FileExistsError):
            storage.put_if_absent("k", b"2")
        assert sorted(os.listdir(tmp_path / "root")) == ["k"]

    def test_link_fallback_when_renameat2_unavailable(self, tmp_path: Path) -> None:
        st = open_storage(str(tmp_path / "s"))
        assert isinstance(st, LocalStorage)
        st._use_renameat2 = False  # exercise the link+unlink path
        st.put_if_absent("a", b"1")
        with pytest.raises(FileExistsError):
            st.put_if_absent("a", b"2")
        assert st.get("a") == b"1"
        assert os.listdir(tmp_path / "s") == ["a"]

    def test_an_exclusive_write_is_never_visible_before_it_is_whole(self, tmp_path: Path) -> None:
        st = open_storage(str(tmp_path / "s"))
        st.put("r/log/old", b"0")
        seen: list[list[str]] = []

        class Src(io.BytesIO):
            chunks = [b"a" * 4096, b"b" * 4096]

            def read(self, size: int | None = -1) -> bytes:
                seen.append(sorted(os.listdir(tmp_path / "s/r/log")))
                return self.chunks.pop(0) if self.chunks else b""

        st.put_stream("r/log/new", Src(), exclusive=True)
        assert seen and all(names == ["old"] for names in seen)  # not even a temp name
        assert st.get("r/log/new") == b"a" * 4096 + b"b" * 4096

    def test_a_writer_killed_mid_write_leaves_nothing_behind(self, tmp_path: Path) -> None:
        child = subprocess.Popen([sys.executable, "-c", _HALF_WRITTEN, str(tmp_path / "s")],
                                 stdout=subprocess.PIPE, cwd=str(Path(__file__).parent.parent))
        assert child.stdout is not None
        assert child.stdout.readline() == b"writing\n"  # a MiB is written, the rest never comes
        child.kill()
        child.wait()
        assert sorted(os.listdir(tmp_path / "s/r/log")) == ["old"]
        assert open_storage(str(tmp_path / "s")).list("") == ["r/log/old"]

    @pytest.mark.parametrize("why", ["switched off", "EOPNOTSUPP"])
    def test_named_temp_files_where_o_tmpfile_is_unavailable(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
        st = open_storage(str(tmp_path / "s"))
        assert isinstance(st, LocalStorage)
        if why == "switched off":
            st._use_tmpfile = False
        else:
            real_open = os.open

            def no_tmpfile(path: str, flags: int, *args: object, **kw: object) -> int:
                if flags & os.O_TMPFILE == os.O_TMPFILE:
                    raise OSError(errno.EOPNOTSUPP, "not on this filesystem")
                return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

            monkeypatch.setattr(os, "open", no_tmpfile)
        st.put_if_absent("a", b"1")
        with pytest.raises(FileExistsError):
            st.put_if_absent("a", b"2")
        assert st._use_tmpfile is False
        assert st.get("a") == b"1" and os.listdir(tmp_path / "s") == ["a"]

    def test_proc_gone_after_start_falls_back_to_named_temps(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from ckptfs.errors import StoreNotWritableError
        from ckptfs.storage import local

        st = open_storage(str(tmp_path / "s"))
        assert isinstance(st, LocalStorage) and st._use_tmpfile
        monkeypatch.setattr(local, "_PROC_FD", str(tmp_path / "no-proc/self/fd"))
        with pytest.raises(StoreNotWritableError, match="nothing was stored, write it again"):
            st.put_stream("r/s", io.BytesIO(b"streamed"), exclusive=True)  # read once, gone
        assert st._use_tmpfile is False and os.listdir(tmp_path / "s/r") == []
        st._use_tmpfile = True
        st.put_if_absent("r/a", b"1")  # its bytes are at hand: written again as a named temp
        assert st._use_tmpfile is False
        st._use_tmpfile = True
        assert st.put_if_absent_beside("r/b", b"2", "r/a") is True
        st.put_stream("r/s", io.BytesIO(b"streamed"), exclusive=True)
        assert [st.get(k) for k in ("r/a", "r/b", "r/s")] == [b"1", b"2", b"streamed"]
        assert sorted(os.listdir(tmp_path / "s/r")) == ["a", "b", "s"]

    def test_a_write_into_a_directory_removed_meanwhile_names_the_key(self, tmp_path: Path) -> None:
        st = open_storage(str(tmp_path / "s"))
        st.put_if_absent("r/log/old", b"0")
        os.unlink(tmp_path / "s/r/log/old")

        class Src(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                if (tmp_path / "s/r/log").exists():
                    os.rmdir(tmp_path / "s/r/log")  # empty: the file being written has no name
                    return b"x"
                return b""

        with pytest.raises(FileNotFoundError) as got:
            st.put_stream("r/log/new", Src(), exclusive=True)
        assert got.value.filename == "r/log/new"
        assert not (tmp_path / "s/r/log").exists()

    @pytest.mark.parametrize("kind", ["symlink", "directory", "fifo", "dangling symlink"])
    def test_put_if_absent_beside_judges_a_strange_witness_as_exists_does(
            self, tmp_path: Path, kind: str) -> None:
        st = open_storage(str(tmp_path / "s"))
        st.put("elsewhere/real", b"outside")
        st.put_if_absent("r/log/1", b"base")
        os.unlink(tmp_path / "s/r/log/1")
        witness = tmp_path / "s/r/log/1"
        if kind == "symlink":
            witness.symlink_to(tmp_path / "s/elsewhere/real")
        elif kind == "dangling symlink":
            witness.symlink_to(tmp_path / "nowhere")
        elif kind == "directory":
            witness.mkdir()
        else:
            os.mkfifo(witness)
        try:
            expected: bool | type[Exception] = st.exists("r/log/1")
        except Exception as exc:
            expected = type(exc)
        if isinstance(expected, bool):
            assert st.put_if_absent_beside("r/log/2", b"two", "r/log/1") is expected
        else:
            with pytest.raises(expected):
                st.put_if_absent_beside("r/log/2", b"two", "r/log/1")
        assert st.get("r/log/2") == b"two"  # created either way, as put_if_absent then exists did
        assert (tmp_path / "s/elsewhere/real").read_bytes() == b"outside"

    def test_store_root_that_is_a_file_is_unavailable(self, tmp_path: Path) -> None:
        from ckptfs.errors import StorageUnavailableError

        (tmp_path / "f").write_text("x")
        with pytest.raises(StorageUnavailableError, match="not a directory"):
            open_storage(str(tmp_path / "f")).check()


_HALF_WRITTEN = """
import sys
from ckptfs.storage.local import LocalStorage
st = LocalStorage(sys.argv[1], sys.argv[1])
st.put("r/log/old", b"0")
class Src:
    sent = False
    def read(self, size=-1):
        if self.sent:
            print("writing", flush=True)
            import time; time.sleep(600)
        self.sent = True
        return b"x" * (1 << 20)
st.put_stream("r/log/new", Src(), exclusive=True)
"""
