"""Thread ids of any length, as SqliteSaver takes them: one past 200 encoded characters (23 CJK
characters are enough) was refused. Its directory is now "~" + sha256 of the id, and the id is
kept in `langgraph/names/<sha256>`, so listings name it. Tested through a real graph (interrupt,
resume), copy and delete, a fresh saver, the real `ckptfs` (threads, show, verify, mirror to
moto over HTTP, verify of the mirror, restore) and a damaged or missing name object."""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from test_cli_commands import cli, cli_json

from backends.s3.embedded import EmbeddedS3
from ckptfs.errors import InvalidIdError
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph.keys import lg_checkpoint_key, lg_ns_segment, lg_thread_segment
from ckptfs.storage.registry import open_storage
from tests.test_langgraph_saver import _put_chain

CJK = "会话" * 12  # 24 characters, 216 encoded: refused before
HUGE = "user@example.com/" + "é" * 3000
IDS = [CJK, "x" * 201, HUGE]


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def build(saver: CkptfsSaver) -> Any:
    def draft(state: State) -> dict[str, Any]:
        return {"log": ["draft"]}

    def review(state: State) -> dict[str, Any]:
        return {"log": [f"review:{interrupt('approve?')}"]}

    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("review", review)
    g.add_edge(START, "draft")
    g.add_edge("draft", "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver)


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def name_file(root: Path, thread: str) -> Path:
    return root / "langgraph" / "names" / hashlib.sha256(thread.encode()).hexdigest()


def two_threads(root: Path) -> Path:
    """A store with a long thread (CJK) and a short one, both waiting on their interrupt:
    the long one's name object."""
    saver = CkptfsSaver(str(root))
    build(saver).invoke({"log": []}, cfg(CJK))
    build(saver).invoke({"log": []}, cfg("short"))
    saver.close()
    return name_file(root, CJK)


def test_long_thread_ids_work_like_short_ones(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    saver = CkptfsSaver(url)
    graph = build(saver)
    for thread in [*IDS, "short"]:
        graph.invoke({"log": []}, cfg(thread))  # stops at the interrupt: pending writes stored
    saver.close()

    fresh = CkptfsSaver(url)  # nothing remembered: the ids come from the store
    listed = {t.config["configurable"]["thread_id"] for t in fresh.list(None)}
    assert listed == {*IDS, "short"}
    graph = build(fresh)
    for thread in IDS:
        state = graph.get_state(cfg(thread))
        assert state.values == {"log": ["draft"]} and state.next == ("review",)
        assert [i.value for t in state.tasks for i in t.interrupts] == ["approve?"]
        assert graph.invoke(Command(resume="yes"), cfg(thread)) == {"log": ["draft", "review:yes"]}
    for thread in IDS:
        assert name_file(tmp_path / "store", thread).is_file()
    assert len(list((tmp_path / "store" / "langgraph" / "names").iterdir())) == len(IDS)  # not "short"

    # copy between long and short ids, both ways, then delete the source
    fresh.copy_thread(CJK, "copy-short")
    fresh.copy_thread("copy-short", HUGE + "-copy")
    for thread in ("copy-short", HUGE + "-copy"):
        assert build(fresh).get_state(cfg(thread)).values == {"log": ["draft", "review:yes"]}
    fresh.delete_thread(CJK)
    assert fresh.get_tuple(cfg(CJK)) is None
    listed = {t.config["configurable"]["thread_id"] for t in CkptfsSaver(url).list(None)}
    assert listed == {"x" * 201, HUGE, "short", "copy-short", HUGE + "-copy"}


def test_delete_for_runs_and_prune_find_long_threads(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path))
    _put_chain(saver, CJK, 4, run_id="r1")
    _put_chain(saver, HUGE, 3, ns="child:1", run_id="r1")
    _put_chain(saver, "short", 2, run_id="r2")
    saver.prune([CJK], strategy="keep_latest")
    assert len(list(saver.list(cfg(CJK)))) == 1
    saver.delete_for_runs(["r1"])
    fresh = CkptfsSaver(str(tmp_path))
    assert {t.config["configurable"]["thread_id"] for t in fresh.list(None)} == {"short"}


def test_on_s3_too(s3: EmbeddedS3, s3_url: str) -> None:
    """Over HTTP (moto): the name object is written once, before the thread's first checkpoint."""
    saver = CkptfsSaver(s3_url, s3.storage_options)
    build(saver).invoke({"log": []}, cfg(HUGE))
    saver.close()
    reader = CkptfsSaver(s3_url, s3.storage_options)
    assert [t.config["configurable"]["thread_id"] for t in reader.list(None)] == [HUGE] * 3
    assert build(reader).invoke(Command(resume="yes"), cfg(HUGE)) == {"log": ["draft", "review:yes"]}
    reader.close()


def test_a_hash_never_meets_an_id(tmp_path: Path) -> None:
    """The id "~<sha of another id>" is encoded ("%7E..."), so it is its own thread."""
    saver = CkptfsSaver(str(tmp_path))
    graph = build(saver)
    twin = "~" + hashlib.sha256(CJK.encode()).hexdigest()
    graph.invoke({"log": []}, cfg(CJK))
    graph.invoke({"log": []}, cfg(twin))
    graph.invoke(Command(resume="no"), cfg(twin))
    assert graph.get_state(cfg(CJK)).values == {"log": ["draft"]}
    assert graph.get_state(cfg(twin)).values == {"log": ["draft", "review:no"]}
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {CJK, twin}


@pytest.mark.parametrize("bad", ["", "\ud800", "\ud800" * 300])
def test_ids_that_are_not_text_are_refused_by_name(tmp_path: Path, bad: str) -> None:
    saver = CkptfsSaver(str(tmp_path))
    with pytest.raises(InvalidIdError, match="thread_id"):
        build(saver).invoke({"log": []}, cfg(bad))
    with pytest.raises(InvalidIdError, match="checkpoint_ns"):
        saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "\udfff"}})


def test_the_cli_chain_names_a_long_thread(tmp_path: Path, s3: EmbeddedS3, s3_url: str) -> None:
    """threads, show, verify; mirror to moto, verify the mirror, restore, verify, resume."""
    src = tmp_path / "machine-a"
    saver = CkptfsSaver(str(src))
    build(saver).invoke({"log": []}, cfg(CJK))
    saver.close()
    code, doc, err = cli_json("threads", str(src))
    assert code == 0, err
    assert [(r["thread_id"], r["checkpoints"]) for r in doc["threads"]] == [(CJK, 3)]
    code, doc, err = cli_json("show", str(src), "--thread", CJK)
    assert code == 0, err
    assert len(doc["checkpoints"]) == 3 and doc["checkpoints"][0]["pending_writes"] >= 1
    code, out, err = cli("verify", str(src), "--data")
    assert code == 0, (out, err)

    ep = ["--mirror-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    code, out, err = cli("mirror", str(src), s3_url, "--once", *ep)
    assert code == 0, (out, err)
    opt = ["--storage-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    code, out, err = cli("verify", s3_url, "--data", *opt)
    assert code == 0, (out, err)
    dst = tmp_path / "machine-b"
    code, out, err = cli("restore", s3_url, str(dst), *ep)
    assert code == 0, (out, err)
    code, out, err = cli("verify", str(dst), "--data")
    assert code == 0, (out, err)
    code, doc, err = cli_json("threads", str(dst))
    assert code == 0 and [r["thread_id"] for r in doc["threads"]] == [CJK], err
    again = CkptfsSaver(str(dst))
    assert build(again).invoke(Command(resume="ok"), cfg(CJK)) == {"log": ["draft", "review:ok"]}


def test_a_damaged_name_is_reported_skipped_and_repaired(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "store"
    name = two_threads(root)
    name.write_bytes(b'{"thread_id": "someone else"}')  # valid JSON, wrong id: the hash says so

    code, out, err = cli("verify", str(root))
    assert code != 0 and "lg-bad-name" in out + err, (out, err)
    code, doc, err = cli_json("threads", str(root))
    assert code == 0 and [r["thread_id"] for r in doc["threads"]] == ["short"]
    assert "skipped" in err and "langgraph/names/" in err
    reader = CkptfsSaver(str(root))
    with caplog.at_level(logging.WARNING, logger="ckptfs"):
        assert {t.config["configurable"]["thread_id"] for t in reader.list(None)} == {"short"}
    assert "its id is not in langgraph/names/" in caplog.text
    # the checkpoints never depended on the name: reading by id works, and a write repairs it
    assert build(reader).get_state(cfg(CJK)).next == ("review",)
    build(reader).invoke(Command(resume="yes"), cfg(CJK))
    assert name.read_bytes().decode() == '{"thread_id": "' + CJK + '"}'
    code, out, err = cli("verify", str(root))
    assert code == 0, (out, err)
    name.unlink()  # lost altogether: skipped again, never listed under a made-up id
    assert {t.config["configurable"]["thread_id"] for t in CkptfsSaver(str(root)).list(None)} == {"short"}


def test_tables_clip_a_huge_id_and_json_keeps_it(tmp_path: Path) -> None:
    """A 3,017-character id took the whole table: every other column was dropped."""
    saver = CkptfsSaver(str(tmp_path))
    build(saver).invoke({"log": []}, cfg(HUGE))
    saver.close()
    code, out, err = cli("threads", str(tmp_path), env={"COLUMNS": "120"})
    assert code == 0, err
    assert "(3,017 characters)" in out and HUGE not in out and "(root)" in out and "not shown" not in out
    code, doc, err = cli_json("threads", str(tmp_path))
    assert code == 0 and doc["threads"][0]["thread_id"] == HUGE
    code, out, err = cli("show", str(tmp_path), "--thread", HUGE + "?", env={"COLUMNS": "120"})
    assert code == 2 and "not found" in err and "(3,018 characters)" in err and len(err) < 400, err


def _codes(doc: Any) -> list[tuple[str, str]]:
    return sorted((f["code"], f["key"] or "") for f in doc["findings"])


def test_verify_reports_a_hashed_thread_whose_name_is_gone(tmp_path: Path, s3: EmbeddedS3,
                                                           s3_url: str) -> None:
    """Listings skip such a thread and say "see `ckptfs verify`": verify must then name it
    (it said "clean"), on the store and on a mirror of it that lost the name."""
    root = tmp_path / "store"
    name = two_threads(root)
    name.unlink()
    code, doc, err = cli_json("verify", str(root))
    key = f"langgraph/names/{name.name}"
    assert code == 1 and _codes(doc) == [("lg-missing-name", key)], (doc, err)
    code, out, err = cli("threads", str(root))
    assert code == 0 and "skipped" in err and "ckptfs verify" in err
    name.mkdir()  # an empty directory in its place: nothing listed there either
    code, doc, err = cli_json("verify", str(root))
    assert code == 1 and _codes(doc) == [("lg-missing-name", key)], (doc, err)
    name.rmdir()
    build(CkptfsSaver(str(root))).invoke(Command(resume="yes"), cfg(CJK))  # the next write repairs it
    code, doc, err = cli_json("verify", str(root))
    assert code == 0 and doc["findings"] == [], (doc, err)

    # a mirror (its logs are objects there, checked as copies): the same finding, once
    ep = ["--mirror-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    code, out, err = cli("mirror", str(root), s3_url, "--once", *ep)
    assert code == 0, (out, err)
    open_storage(s3_url, s3.storage_options).delete(key)
    opt = ["--storage-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    code, doc, err = cli_json("verify", s3_url, *opt)
    assert code == 1 and _codes(doc) == [("lg-missing-name", key)], (doc, err)



@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_verify_reports_an_unreadable_name_or_marker_and_checks_the_rest(tmp_path: Path, kind: str) -> None:
    """A name object (or a run marker) that is a link out of the store or a FIFO is one
    finding: verify used to stop there ("corrupt: ...", nothing else checked, no report)."""
    root = tmp_path / "store"
    saver = CkptfsSaver(str(root))
    _put_chain(saver, CJK, 2, run_id="r1")
    _put_chain(saver, "short", 2, run_id="r1")
    saver.close()
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"thread_id": CJK}), encoding="utf-8")
    name = name_file(root, CJK)
    marker = next((root / "langgraph" / "runs").rglob("_"))
    for victim in (name, marker):
        victim.unlink()
        if kind == "symlink":
            victim.symlink_to(outside)
        else:
            os.mkfifo(victim)
    log = next((root / "langgraph" / "threads" / "short").rglob(".records"))
    with open(log, "r+b") as f:  # and damage elsewhere, which verify must still find
        f.seek(40)
        f.write(b"\xff" * 8)
    code, doc, err = cli_json("verify", str(root))
    assert code == 1, (doc, err)
    codes = {c for c, _ in _codes(doc)}
    rel = lambda p: str(p.relative_to(root))  # noqa: E731
    assert ("lg-bad-name", rel(name)) in _codes(doc) and ("lg-bad-marker", rel(marker)) in _codes(doc), doc
    assert "lg-damaged-record" in codes, doc
    assert outside.read_text(encoding="utf-8").startswith('{"thread_id"')  # never written through


def test_a_long_id_is_hashed_without_being_encoded_first() -> None:
    """Every key of every put names the thread: a 1 MiB id was percent-encoded byte by byte
    (some 60 MiB of small strings and 0.3 s) only for the encoding to be thrown away as too
    long, so one graph step of such a thread took seconds. The segments stay what they were."""
    import tracemalloc

    big = "é" * (1 << 19)  # 1 MiB of UTF-8
    size = 1 << 20
    tracemalloc.start()
    try:
        segs = [lg_thread_segment(big), lg_ns_segment(big)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert segs == ["~" + hashlib.sha256(big.encode()).hexdigest()] * 2
    assert peak < 2 * size, f"{peak} bytes to name a {size}-byte id"

    def sha(v: str) -> str:
        return "~" + hashlib.sha256(v.encode()).hexdigest()

    e = "é" * 33  # 198 encoded characters
    for tid, seg in [("a" * 200, "a" * 200), ("a" * 201, sha("a" * 201)), (e + "ab", "%C3%A9" * 33 + "ab"),
                     (e + "abc", sha(e + "abc")), ("~" * 66 + "ab", "%7E" * 66 + "ab")]:
        assert lg_thread_segment(tid) == seg
    for ns, seg in [("x" * 199, "_" + "x" * 199), ("x" * 200, sha("x" * 200)),
                    (e + "a", "_" + "%C3%A9" * 33 + "a"), (e + "ab", sha(e + "ab"))]:
        assert lg_ns_segment(ns) == seg
    with pytest.raises(InvalidIdError, match="checkpoint_ns"):
        lg_ns_segment("\udfff" * 300)
    with pytest.raises(InvalidIdError, match=r"checkpoint_id .* too long"):
        lg_checkpoint_key("t", "", "c" * 201)


def test_a_live_saver_repairs_a_name_once_it_takes_the_thread_again(tmp_path: Path) -> None:
    """ "The next write repairs it" held only for another process: a saver named a thread
    once per process, so a long-lived server never put back a name lost under it. Now once
    per lease: after the thread was given back (idle, or `release`), its next write checks."""
    root = tmp_path / "store"
    saver = CkptfsSaver(str(root))
    graph = build(saver)
    graph.invoke({"log": []}, cfg(CJK))
    name = name_file(root, CJK)
    for damage in (name.unlink, lambda: name.write_bytes(b"{}")):
        saver.release()
        damage()
        assert {t.config["configurable"]["thread_id"] for t in CkptfsSaver(str(root)).list(None)} == set()
        graph.invoke({"log": []}, cfg(CJK))  # the same saver, the thread taken again
        assert {t.config["configurable"]["thread_id"] for t in CkptfsSaver(str(root)).list(None)} == {CJK}
    code, doc, err = cli_json("verify", str(root))
    assert code == 0 and doc["findings"] == [], (doc, err)
    saver.close()


def test_an_import_rerun_puts_back_a_lost_name(tmp_path: Path) -> None:
    """`import-langgraph` again from the SqliteSaver file: every checkpoint is "already there",
    so nothing was written and the thread whose name was lost stayed out of every listing."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    src, root = tmp_path / "src.sqlite", tmp_path / "store"
    with sqlite3.connect(src, check_same_thread=False) as conn:
        for thread in (CJK, "short"):
            build(SqliteSaver(conn)).invoke({"log": []}, cfg(thread))  # type: ignore[arg-type]
    code, doc, err = cli_json("import-langgraph", str(src), str(root))
    assert code == 0 and doc["checkpoints"] == 6, (doc, err)
    name = name_file(root, CJK)
    name.unlink()
    assert cli_json("verify", str(root))[0] == 1
    code, doc, err = cli_json("import-langgraph", str(src), str(root))
    assert code == 0 and doc["checkpoints"] == 0 and doc["skipped"] == 6, (doc, err)
    code, doc, err = cli_json("threads", str(root))
    assert code == 0 and sorted(r["thread_id"] for r in doc["threads"]) == sorted([CJK, "short"]), (doc, err)
    assert cli_json("verify", str(root))[0] == 0


def test_mirror_goes_on_past_a_name_it_cannot_read(tmp_path: Path) -> None:
    """A name object linked out of the store stopped `ckptfs mirror` with "corrupt: ..." and no
    report, and as names/ sorts before threads/, no thread reached the mirror. Now that file
    is missing from the pass (exit 1, named), everything else is copied and readable there."""
    src, dst = tmp_path / "src", tmp_path / "mirror"
    saver = CkptfsSaver(str(src))
    for thread in (CJK, "short"):
        build(saver).invoke({"log": []}, cfg(thread))
    saver.close()
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"thread_id": CJK}), encoding="utf-8")
    name = name_file(src, CJK)
    name.unlink()
    name.symlink_to(outside)
    code, out, err = cli("mirror", str(src), str(dst), "--once")
    assert code == 1 and f"langgraph/names/{name.name}" in out + err, (out, err)
    assert "incomplete" in out, out
    code, doc, err = cli_json("threads", str(dst))
    assert code == 0 and [r["thread_id"] for r in doc["threads"]] == ["short"], (doc, err)
    assert build(CkptfsSaver(str(dst))).get_state(cfg(CJK)).next == ("review",)  # its objects came
    name.unlink()
    name.write_text(json.dumps({"thread_id": CJK}, ensure_ascii=False), encoding="utf-8")
    code, out, err = cli("mirror", str(src), str(dst), "--once")
    assert code == 0, (out, err)
    code, doc, err = cli_json("threads", str(dst))
    assert code == 0 and sorted(r["thread_id"] for r in doc["threads"]) == sorted([CJK, "short"]), (doc, err)


def test_a_busy_long_thread_is_named_by_its_start(tmp_path: Path) -> None:
    """ThreadBusyError (and the lease keeper's log lines) quoted the whole id: a 1 MiB thread
    id made a 1 MiB message in every log and in `import-langgraph`'s report of failures. The
    message shows its start and length; `thread_id` keeps it whole."""
    from ckptfs.integrations.langgraph.ownership import ThreadBusyError, ThreadLeases

    big = "user@example.com/" + "é" * (1 << 19)
    a = ThreadLeases(open_storage(str(tmp_path)), ttl=2.0, holder="A")
    b = ThreadLeases(open_storage(str(tmp_path)), ttl=2.0, holder="B")
    try:
        a.ensure(big)
        with pytest.raises(ThreadBusyError) as err:
            b.ensure(big)
        assert err.value.thread_id == big and err.value.holder == "A"
        msg = str(err.value)
        assert len(msg) < 400 and "'user@example.com/éé" in msg and f"{len(big)} characters" in msg, msg[:400]
        with pytest.raises(ThreadBusyError) as short:
            a.ensure("t")
            b.ensure("t")
        assert "thread 't' is written by A" in str(short.value)
    finally:
        a.release(big)
        a.release("t")


def test_a_huge_file_at_a_name_is_refused_by_size(tmp_path: Path) -> None:
    """A 3 GB (sparse) file planted at a thread's name: `ckptfs threads`, `list(None)` and verify
    read it whole (3.2 GB of memory, or MemoryError). Now its size is looked at first: the thread
    is skipped (and named by verify) in a process limited to 1.5 GB of address space."""
    import resource
    import subprocess
    import sys

    root = tmp_path / "store"
    saver = CkptfsSaver(str(root))
    build(saver).invoke({"log": []}, cfg(CJK))
    build(saver).invoke({"log": []}, cfg("short"))
    saver.close()
    with name_file(root, CJK).open("r+b") as f:
        f.truncate(3 << 30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))

    exe = str(Path(sys.executable).parent / "ckptfs")
    for args in (["threads", str(root), "--json"], ["verify", str(root), "--json"]):
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, preexec_fn=limit)
        doc = json.loads(proc.stdout)
        if args[0] == "threads":
            assert proc.returncode == 0 and [r["thread_id"] for r in doc["threads"]] == ["short"], proc.stderr
        else:
            bad = [f for f in doc["findings"] if f["code"] == "lg-bad-name"]
            assert proc.returncode == 1 and bad and "bytes" in bad[0]["message"], doc
    code = ("import sys; from ckptfs.integrations.langgraph import CkptfsSaver; "
            "s = CkptfsSaver(sys.argv[1]); "
            "print(sorted({t.config['configurable']['thread_id'] for t in s.list(None)}))")
    proc = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)
    assert proc.returncode == 0 and proc.stdout.strip() == "['short']", proc.stderr


def test_an_id_past_a_million_characters_is_refused_with_nothing_written(tmp_path: Path) -> None:
    saver = CkptfsSaver(str(tmp_path))
    with pytest.raises(InvalidIdError, match=r"1,048,577 characters long; the limit is 1,048,576"):
        build(saver).invoke({"log": []}, cfg("x" * ((1 << 20) + 1)))
    assert not any((tmp_path / "langgraph" / d).exists() for d in ("threads", "names"))
    build(saver).invoke({"log": []}, cfg("x" * (1 << 20)))  # the limit itself is a thread
    assert len(list(saver.list(None))) == 3


def test_deleting_a_long_thread_deletes_its_name_too(tmp_path: Path) -> None:
    """The name kept a deleted thread's id (often a user's address) in the store and its mirrors."""
    saver = CkptfsSaver(str(tmp_path))
    build(saver).invoke({"log": []}, cfg(HUGE))
    saver.delete_thread(HUGE)
    assert not name_file(tmp_path, HUGE).exists() and list(saver.list(None)) == []
    build(saver).invoke({"log": []}, cfg(HUGE))  # the same saver writes it again: named again
    assert name_file(tmp_path, HUGE).is_file()
    assert {t.config["configurable"]["thread_id"] for t in CkptfsSaver(str(tmp_path)).list(None)} == {HUGE}


def _holding(root: Path, text: str) -> list[str]:
    """Files under root (leases aside: who writes a thread, never mirrored) whose bytes hold text."""
    needles = (text.encode(), json.dumps(text).encode())
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and "leases" not in p.parts
                  and any(n in p.read_bytes() for n in needles))


def test_a_deleted_thread_leaves_no_id_and_no_warning_in_the_store_or_its_mirror(tmp_path: Path) -> None:
    """delete_thread (and prune(strategy="delete")) left each run marker, which holds the
    thread id whole, so the id (often a user's address) stayed in the store and went to every
    mirror; and the empty directory a long thread left on local disk made every listing
    (`ckptfs threads`, `list(None)`) warn "skipped: its id is not in langgraph/names/ (see
    `ckptfs verify`)", where verify said clean, in the store and in its mirror."""
    src, mir = tmp_path / "src", tmp_path / "mir"
    saver = CkptfsSaver(str(src))
    _put_chain(saver, HUGE, 3, run_id="r1")
    _put_chain(saver, CJK, 2, run_id="r1")
    _put_chain(saver, "bob@example.com", 2, run_id="r1")
    _put_chain(saver, "keep", 2, run_id="r1")
    code, out, err = cli("mirror", str(src), str(mir), "--once")
    assert code == 0, (out, err)
    saver.delete_thread(HUGE)
    saver.delete_thread("bob@example.com")
    saver.prune([CJK], strategy="delete")
    code, out, err = cli("mirror", str(src), str(mir), "--once")
    assert code == 0, (out, err)
    for root in (src, mir):
        for thread in (HUGE, CJK, "bob@example.com"):
            assert _holding(root, thread) == [], (root, thread)
        code, doc, err = cli_json("threads", str(root))
        assert code == 0 and [r["thread_id"] for r in doc["threads"]] == ["keep"], err
        assert "skipped" not in err, err
        code, out, err = cli("verify", str(root), "--data")
        assert code == 0 and "clean" in out, (out, err)
    fresh = CkptfsSaver(str(src))
    assert {t.config["configurable"]["thread_id"] for t in fresh.list(None)} == {"keep"}
    # the same saver writes a deleted thread again: marked again, so delete_for_runs finds it
    _put_chain(saver, HUGE, 2, run_id="r1")
    saver.delete_for_runs(["r1"])
    assert list(CkptfsSaver(str(src)).list(None)) == []


def test_delete_for_runs_that_empties_a_long_thread_deletes_its_name(tmp_path: Path) -> None:
    """The run's checkpoints were deleted and the thread's name object stayed: the id was kept
    in the store (and copied to each mirror) for a thread that no longer holds anything."""
    src, mir = tmp_path / "src", tmp_path / "mir"
    saver = CkptfsSaver(str(src))
    _put_chain(saver, HUGE, 3, run_id="gone")
    _put_chain(saver, HUGE, 2, ns="child:1", run_id="gone")
    _put_chain(saver, CJK, 2, run_id="gone")
    _put_chain(saver, CJK, 2, ns="child:2", run_id="stays")
    saver.delete_for_runs(["gone"])
    assert not name_file(src, HUGE).exists() and _holding(src, HUGE) == []
    assert name_file(src, CJK).is_file()  # another run's checkpoints are still in it
    code, out, err = cli("mirror", str(src), str(mir), "--once")
    assert code == 0, (out, err)
    assert _holding(mir, HUGE) == [] and name_file(mir, CJK).is_file()
    assert {t.config["configurable"]["thread_id"] for t in CkptfsSaver(str(mir)).list(None)} == {CJK}


def test_a_long_threads_lease_holds_its_hash_not_its_id(tmp_path: Path) -> None:
    """The lease record held the whole id: a 1 MiB thread id meant a 1 MiB lease object,
    rewritten by every renewal (ttl/4) for as long as the thread was written, a PUT of a
    megabyte every 5 s on S3. The record now names a hashed thread by its segment, so it stays
    a few hundred bytes; exclusion, release and takeover work as before."""
    from ckptfs.integrations.langgraph.keys import lg_lease_key
    from ckptfs.integrations.langgraph.ownership import ThreadBusyError, ThreadLeases, read_thread_lease

    big = "user@example.com/" + "é" * (1 << 19)
    storage = open_storage(str(tmp_path / "s"))
    with CkptfsSaver(str(tmp_path / "s"), lease_ttl=2.0) as saver:
        _put_chain(saver, big, 2)
        lease_file = tmp_path / "s" / lg_lease_key(big)
        assert lease_file.stat().st_size < 1024, lease_file.stat().st_size
        assert saver.leases is not None
        saver.leases.confirm(big)  # a renewal rewrites the record: still small
        time.sleep(0.6)
        assert lease_file.stat().st_size < 1024
        held = read_thread_lease(storage, big)
        assert held is not None and not held.released and held.thread_id == lg_thread_segment(big)
        other = ThreadLeases(open_storage(str(tmp_path / "s")), ttl=2.0, holder="B")
        with pytest.raises(ThreadBusyError) as err:
            other.ensure(big)
        assert err.value.thread_id == big and err.value.holder == saver.leases.holder
        saver.release(big)
        other.ensure(big)  # given back: taken at once, one generation on
        got = read_thread_lease(storage, big)
        assert got is not None and got.holder == "B" and got.generation == held.generation + 1
        other.release(big)


def test_a_lease_that_names_a_long_thread_in_full_is_still_honoured(tmp_path: Path) -> None:
    """A holder of the previous release writes the whole id into the record: a live one must
    keep the thread (no takeover while it renews) and a released one is taken at once."""
    from ckptfs.integrations.langgraph.keys import lg_lease_key
    from ckptfs.integrations.langgraph.ownership import ThreadBusyError, ThreadLeases, read_thread_lease

    big = "x" * 300
    storage = open_storage(str(tmp_path / "s"))
    key = lg_lease_key(big)

    def old_record(released: bool, renewals: int) -> bytes:
        return json.dumps({"format": "ckptfs-lg-thread-lease", "format_version": 1, "thread_id": big,
                           "holder": "old:1:abc", "generation": 4, "ttl": 1.0, "released": released,
                           "renewals": renewals, "nonce": f"n{renewals}", "time": 0.0}).encode()

    storage.put(key, old_record(False, 0))
    stop = threading.Event()

    def renew() -> None:  # the old holder at work
        n = 0
        while not stop.wait(0.2):
            n += 1
            storage.put(key, old_record(False, n))

    t = threading.Thread(target=renew)
    t.start()
    leases = ThreadLeases(open_storage(str(tmp_path / "s")), ttl=1.0, holder="new")
    try:
        with pytest.raises(ThreadBusyError) as err:
            leases.ensure(big, wait=2.0)  # twice the ttl: an unrenewed record would be taken
        assert err.value.holder == "old:1:abc"
    finally:
        stop.set()
        t.join()
    storage.put(key, old_record(True, 99))
    leases.ensure(big)
    got = read_thread_lease(storage, big)
    assert got is not None and got.holder == "new" and got.generation == 5
    leases.release(big)
