"""Run ids that differ only in case, on a disk that does not tell them apart (macOS's and
Windows' defaults, exFAT): one folder holds both. S3 and Linux keep `papers` and `Papers`
apart, so a bucket written by Linux workers can hold both, and a restore or mirror onto a
laptop meets them.

Linux has no case-insensitive file system here (ext4's casefold is not in this kernel), so a
bind mount of `runs/papers` at `runs/Papers` makes the second spelling reach the first's folder,
which is what such a disk does. The tests drive the real `ckptfs` executable and the library.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from test_cli_commands import cli, cli_json

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import CheckpointCorruptError
from ckptfs.integrations.langgraph import CkptfsSaver, ThreadBusyError
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.registry import open_storage

HINT = "differ only in case"


def _write_run(root: Path, run_id: str, steps: int) -> None:
    """A run at version `steps`: saved, then every step but the last completed."""
    store = CheckpointStore(str(root))
    run = AgentRun(run_id=run_id, goal=f"goal of {run_id}")
    for i in range(steps):
        run.add_step(Step(id=f"p{i}", title=f"paper {i}"))
    store.save_run(run)
    for i in range(steps - 1):
        step = run.steps[f"p{i}"]
        step.status, step.result = StepStatus.COMPLETED, f"{run_id} result {i}"
        store.commit(run, [step])
    store.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def one_folder(tmp_path: Path) -> Iterator[Path]:
    """A store root whose runs/Papers is runs/papers, as on a case-insensitive disk."""
    root = tmp_path / "dst"
    (root / "runs" / "papers").mkdir(parents=True)
    (root / "runs" / "Papers").mkdir()
    if subprocess.run(["mount", "--bind", str(root / "runs" / "papers"), str(root / "runs" / "Papers")],
                      capture_output=True).returncode:
        pytest.skip("no bind mount here (needs root and CAP_SYS_ADMIN)")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root / "runs" / "Papers")], check=True)


def test_a_second_spelling_is_refused_naming_both_ids_and_never_merged(one_folder: Path) -> None:
    """The loader compares each record's header with its file name, so `Papers` never loads
    `papers`'s state, and a save of a new `Papers` is refused before it writes; the message
    now says why the folder holds another run (it only named the two ids)."""
    _write_run(one_folder, "papers", 3)
    before = _files(one_folder)
    store = CheckpointStore(str(one_folder))
    with pytest.raises(CheckpointCorruptError, match=HINT):
        store.load_run("Papers")
    twin = AgentRun(run_id="Papers", goal="another run")
    twin.add_step(Step(id="q", title="q"))
    with pytest.raises(CheckpointCorruptError, match=HINT):
        store.save_run(twin)
    store.close()
    assert _files(one_folder) == before
    again = CheckpointStore(str(one_folder))
    run = again.load_run("papers")
    assert run is not None and run.goal == "goal of papers"
    assert [s.result for s in run.steps.values()] == ["papers result 0", "papers result 1", None]
    again.close()
    code, out, err = cli("show", str(one_folder), "Papers")
    assert code != 0 and HINT in out + err, (code, out, err)
    # said once, not once per file of the folder (three files: the sentence came three times)
    assert (out + err).count(HINT) == 1, (out, err)


def test_restore_of_twins_publishes_one_and_writes_nothing_of_the_other(tmp_path: Path,
                                                                        one_folder: Path) -> None:
    """`Papers` (v3) is restored first; `papers` (v5) then met v1-v3 of `Papers` under its own
    names. Its v4 and v5 were copied before the clash was found, into `Papers`'s folder, whose
    next commit (v4) then collided with them: the run that restored cleanly could not resume.
    Now the clash is found before anything is written, and the error says why."""
    src = tmp_path / "src"
    _write_run(src, "papers", 5)
    _write_run(src, "Papers", 3)
    code, report, err = cli_json("restore", f"file://{src}", str(one_folder))
    assert code == 1, (report, err)
    status = {r["run_id"]: r for r in report["runs"]}
    assert status["Papers"]["status"] == "restored" and status["Papers"]["version"] == 3
    assert status["papers"]["status"] == "conflict" and status["papers"]["copied"] == 0
    assert HINT in status["papers"]["error"]
    assert sorted(_files(one_folder / "runs" / "Papers")) == [f"log/{v:012d}.ckpt" for v in (1, 2, 3)]
    store = CheckpointStore(str(one_folder))
    run = store.load_run("Papers")
    assert run is not None and run.goal == "goal of Papers"
    step = run.steps["p2"]
    step.status, step.result = StepStatus.COMPLETED, "resumed here"
    assert store.commit(run, [step]) == 4  # resumes: nothing of the other run is in its way
    store.close()
    assert CheckpointStore(str(one_folder)).load_run("Papers").steps["p2"].result == "resumed here"


def test_mirror_of_twins_says_conflict_on_every_pass_never_not_due(tmp_path: Path,
                                                                  one_folder: Path) -> None:
    """The mirror read `Papers`'s three files in the shared folder as `papers`'s point v3 and,
    with `papers` at v5 and every_n above 2, said "not-due", exit 0, on every pass: a finished
    run was never mirrored and nothing said so. A twin's point must now prove it is its own."""
    src = tmp_path / "src"
    _write_run(src, "papers", 5)
    _write_run(src, "Papers", 3)
    for _ in range(2):
        code, report, err = cli_json("mirror", f"file://{src}", f"file://{one_folder}", "--every-n", "10")
        assert code == 1, (report, err)
        status = {r["run_id"]: r for r in report["runs"]}
        assert status["Papers"]["status"] in ("mirrored", "up-to-date")
        assert status["papers"]["status"] == "conflict", status["papers"]
        assert HINT in status["papers"]["error"]
    assert sorted(_files(one_folder / "runs" / "Papers")) == [f"log/{v:012d}.ckpt" for v in (1, 2, 3)]


def test_langgraph_threads_that_differ_only_in_case_keep_apart_in_one_log(tmp_path: Path) -> None:
    """LangGraph thread ids are users' names as often as not. On such a disk `alice` and
    `Alice` share `threads/Alice/_/.records`; its records are keyed by the whole key, so each
    thread reads only its own checkpoints (SqliteSaver compares ids exactly; so must we)."""
    def put(saver: CkptfsSaver, thread: str, text: str) -> None:
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": [text]}
        cp["channel_versions"] = {"messages": 1}
        saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp, {}, {"messages": 1})

    def seen(saver: CkptfsSaver, thread: str) -> object:
        got = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        return None if got is None else got.checkpoint["channel_values"]

    root = tmp_path / "lg"
    first = CkptfsSaver(str(root))
    put(first, "Alice", "Alice's secret")
    first.close()
    threads = root / "langgraph" / "threads"
    (threads / "alice").mkdir()
    if subprocess.run(["mount", "--bind", str(threads / "Alice"), str(threads / "alice")],
                      capture_output=True).returncode:
        pytest.skip("no bind mount here (needs root and CAP_SYS_ADMIN)")
    try:
        saver = CkptfsSaver(str(root))
        assert seen(saver, "alice") is None
        put(saver, "alice", "alice's own")
        saver.close()
        again = CkptfsSaver(str(root))
        assert seen(again, "Alice") == {"messages": ["Alice's secret"]}
        assert seen(again, "alice") == {"messages": ["alice's own"]}
        again.close()
    finally:
        subprocess.run(["umount", str(threads / "alice")], check=True)
    assert sorted(p.name for p in (threads / "Alice" / "_").iterdir()) == [".records"]


class _FoldedLeases(LocalStorage):
    """A local disk whose `langgraph/leases/` folder does not tell case apart, as macOS's does:
    every key there names the file of its lower-case spelling."""

    @staticmethod
    def _fold(key: str) -> str:
        return key.lower() if key.startswith("langgraph/leases/") else key

    def put(self, key: str, data: bytes) -> str:
        return super().put(self._fold(key), data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return super().put_if_absent(self._fold(key), data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return super().put_if_match(self._fold(key), data, etag)

    def get(self, key: str) -> bytes:
        return super().get(self._fold(key))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return super().get_with_etag(self._fold(key))

    def delete(self, key: str) -> None:
        super().delete(self._fold(key))

    def exists(self, key: str) -> bool:
        return super().exists(self._fold(key))


def test_a_thread_whose_lease_file_is_a_case_twins_is_refused_saying_why(tmp_path: Path) -> None:
    """`alice` and `Alice` share `leases/alice.lease` on such a disk, so while one is held the
    other is refused, even in the same process: ThreadBusyError said "written by another
    process", which sent users looking for a process that does not exist. It now says that
    the file is the twin's, and why. Nothing of `Alice` is touched."""
    storage = open_storage(f"file://{tmp_path / 'lg'}")
    assert isinstance(storage, LocalStorage)
    storage.__class__ = _FoldedLeases
    saver = CkptfsSaver(storage=storage, lease_ttl=2.0)

    def put(thread: str, text: str) -> None:
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": [text]}
        cp["channel_versions"] = {"messages": 1}
        saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp, {}, {"messages": 1})

    put("Alice", "Alice's secret")
    with pytest.raises(ThreadBusyError, match=HINT) as caught:
        put("alice", "alice's own")
    assert "'Alice'" in str(caught.value)
    # it named no holder ("written by another process", here this very one) and "generation ?"
    assert "another process" not in str(caught.value) and "generation ?" not in str(caught.value)
    assert "held by this very process" in str(caught.value) and caught.value.holder is not None
    put("Alice", "Alice goes on")
    got = saver.get_tuple({"configurable": {"thread_id": "Alice", "checkpoint_ns": ""}})
    assert got is not None and got.checkpoint["channel_values"] == {"messages": ["Alice goes on"]}
    assert saver.get_tuple({"configurable": {"thread_id": "alice", "checkpoint_ns": ""}}) is None
    saver.close()


@pytest.mark.parametrize("passes", [["--every-n"], ["--run"]], ids=["twin-ahead", "run-one-then-other"])
def test_a_twin_behind_or_mirrored_alone_is_never_not_due_over_the_others_point(
        tmp_path: Path, one_folder: Path, passes: list[str]) -> None:
    """With `Papers` ahead (v5) of `papers` (v3), the folder showed Papers's v5 as papers's
    point, a key papers's source does not hold, so no bytes were compared: "not-due", exit 0.
    With `--run Papers` after `--run papers`, only the run asked for was looked at for twins:
    the same. A twin's point whose name the source lacks must prove it is its own (header)."""
    src = tmp_path / "src"
    _write_run(src, "papers", 3)
    _write_run(src, "Papers", 5)
    if passes[0] == "--every-n":
        runs, twin = [["--every-n", "10"]], "papers"
    else:
        runs, twin = [["--run", "papers"], ["--run", "Papers", "--every-n", "10"]], "Papers"
    for args in runs:
        code, report, err = cli_json("mirror", f"file://{src}", f"file://{one_folder}", "--once", *args)
    status = {r["run_id"]: r for r in report["runs"]}
    assert code == 1, (report, err)
    assert status[twin]["status"] == "conflict", status[twin]
    assert HINT in status[twin]["error"]
