"""A LangGraph saver's local logs ride along with `ckptfs mirror` and come back with `ckptfs
restore` after machine loss: over the moto server, through the CLI, never over existing files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import START, StateGraph
from test_cli_commands import cli, cli_json

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step
from ckptfs.cli import main
from ckptfs.errors import ConfigError, CorruptFileError
from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.maintenance.verify import verify
from ckptfs.replication.mirror import mirror
from ckptfs.replication.report import LANGGRAPH_ENTRY
from tests.test_langgraph_saver import _put_chain


def _entry(doc: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in doc["runs"] if r["run_id"] == LANGGRAPH_ENTRY)


def _history(url: str, thread: str) -> list[Any]:
    saver = CkptfsSaver(url)
    return [(t.config["configurable"]["checkpoint_id"], t.checkpoint["channel_values"]["messages"])
            for t in saver.list({"configurable": {"thread_id": thread}})]


def test_logs_are_mirrored_incrementally_and_restored(tmp_path: Path, s3: EmbeddedS3, s3_url: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    src = str(tmp_path / "machine-a")
    store = CheckpointStore(src)
    run = AgentRun(run_id="r1", goal="beside a LangGraph saver")
    run.add_step(Step(id="a", title="a"))
    store.save_run(run)
    store.close()
    saver = CkptfsSaver(src, full_every=4)
    chain = _put_chain(saver, "t1", 6)
    _put_chain(saver, "t2", 3, ns="child:1")
    ep = ["--mirror-option", f"client_kwargs.endpoint_url={s3.endpoint}"]

    assert main(["mirror", src, s3_url, "--once", "--json", *ep]) == 0
    first = _entry(json.loads(capsys.readouterr().out))
    assert first["status"] == "mirrored" and first["copied"] >= 3  # two logs and the run markers
    # the mirror's logs are objects now; verify checks them as the logs they are
    checked = verify(s3_url, level="data", storage_options=s3.storage_options)
    assert checked.ok, [f.to_dict() for f in checked.findings]

    assert main(["mirror", src, s3_url, "--once", "--json", *ep]) == 0
    again = _entry(json.loads(capsys.readouterr().out))
    assert again["status"] == "up-to-date" and again["copied"] == 0

    saver.put(chain[-1][0], {"v": 4, "id": str(uuid6(clock_seq=99)), "ts": "2026-01-01",
                              "channel_values": {"messages": [*chain[-1][1], "one more"]},
                              "channel_versions": {"messages": 99}, "versions_seen": {}},
              {"source": "loop", "step": 99}, {"messages": 99})
    report = mirror(src, s3_url, dst_options=s3.storage_options)
    grown = next(r for r in report.runs if r.run_id == LANGGRAPH_ENTRY)
    assert grown.status == "mirrored" and grown.copied == 1  # only t1's log changed

    # machine A is gone: restore everything into machine B and carry on there
    dst = str(tmp_path / "machine-b")
    assert main(["restore", s3_url, dst, "--json", *ep]) == 0
    restored = json.loads(capsys.readouterr().out)
    assert restored["ok"] and _entry(restored)["status"] == "restored"
    assert _history(dst, "t1") == _history(src, "t1")
    assert _history(dst, "t2") == _history(src, "t2")
    assert CheckpointStore(dst).load_run("r1") is not None
    latest = CkptfsSaver(dst).get_tuple({"configurable": {"thread_id": "t1"}})
    assert latest is not None and latest.checkpoint["channel_values"]["messages"][-1] == "one more"
    _put_chain(CkptfsSaver(dst), "t1", 2, run_id="r2")  # the thread goes on on machine B

    # a second restore into B never overwrites what B has written since
    assert main(["restore", s3_url, dst, "--json", *ep]) == 1
    conflict = _entry(json.loads(capsys.readouterr().out))
    assert conflict["status"] == "conflict" and conflict["missing"]
    assert len(_history(dst, "t1")) == len(chain) + 1 + 2


def test_a_log_copied_mid_append_restores_as_an_earlier_state(tmp_path: Path, s3: EmbeddedS3,
                                                               s3_url: str) -> None:
    from ckptfs.storage.registry import open_storage

    src = str(tmp_path / "a")
    chain = _put_chain(CkptfsSaver(src, full_every=4), "t", 5)
    assert mirror(src, s3_url, dst_options=s3.storage_options).ok
    remote = open_storage(s3_url, s3.storage_options)
    key = "langgraph/threads/t/_/.records"
    whole = remote.get(key)
    raw = bytearray(whole)
    raw[40] ^= 0x01  # verify on the mirror finds damage inside a mirrored log
    remote.put(key, bytes(raw))
    codes = {(f.code, f.key) for f in verify(s3_url, storage_options=s3.storage_options).findings}
    assert ("lg-damaged-record", key) in codes
    remote.put(key, whole[: len(whole) - 100])  # what a copy taken in the middle of the 5th put holds
    dst = str(tmp_path / "b")
    from ckptfs.replication.restore import restore

    assert restore(s3_url, dst, src_options=s3.storage_options).ok
    history = _history(dst, "t")
    assert [cid for cid, _ in history] == [c["configurable"]["checkpoint_id"] for c, _ in chain[:4]][::-1]
    assert history[0][1] == chain[3][1]
    more = _put_chain(CkptfsSaver(dst), "t", 1)  # the next writer cuts the torn tail and appends
    assert [cid for cid, _ in _history(dst, "t")][:2] == [
        more[0][0]["configurable"]["checkpoint_id"], chain[3][0]["configurable"]["checkpoint_id"]]


def test_a_deleted_thread_leaves_the_mirror_and_restore_to_s3_expands_the_logs(
        tmp_path: Path, s3: EmbeddedS3, s3_url: str) -> None:
    from ckptfs.replication.restore import restore
    from ckptfs.storage.registry import open_storage

    src = str(tmp_path / "a")
    saver = CkptfsSaver(src, full_every=4)
    kept = _put_chain(saver, "kept", 3)
    _put_chain(saver, "secret", 3)
    # a namespace written before the log existed, then continued with it: plain files + log
    _put_chain(CkptfsSaver(src, log=False), "mixed", 2)
    _put_chain(saver, "mixed", 1)
    opts = s3.storage_options
    assert mirror(src, s3_url, dst_options=opts).ok
    assert verify(s3_url, level="data", storage_options=opts).ok  # plain files beside a log: one namespace
    saver.delete_thread("secret")
    report = mirror(src, s3_url, dst_options=opts)
    entry = next(r for r in report.runs if r.run_id == LANGGRAPH_ENTRY)
    assert entry.deleted >= 1 and entry.status == "mirrored"
    assert not open_storage(s3_url, opts).list("langgraph/threads/secret/")
    # a saver on S3 reads an object per key: the restore writes each log's live records out
    dst = s3.url("restored-elsewhere")
    assert restore(s3_url, dst, src_options=opts, dst_options=opts).ok
    on_s3 = CkptfsSaver(dst, opts)
    assert on_s3.get_tuple({"configurable": {"thread_id": "secret"}}) is None
    latest = on_s3.get_tuple({"configurable": {"thread_id": "kept"}})
    assert latest is not None and latest.checkpoint["channel_values"]["messages"] == kept[-1][1]
    assert len(list(on_s3.list({"configurable": {"thread_id": "mixed"}}))) == 3


def test_a_prune_during_the_pass_leaves_a_readable_mirror(tmp_path: Path) -> None:
    """An object-per-key source (memory, S3): the prune moves versions to held/ and deletes
    checkpoints while the pass reads; the pass lists again and sends what replaced them."""
    import uuid

    from ckptfs.storage.registry import open_storage

    src_url = f"memory://lg-src-{uuid.uuid4().hex[:8]}"
    saver = CkptfsSaver(src_url, full_every=8)
    chain = _put_chain(saver, "t", 6)
    src = open_storage(src_url)
    real_get = src.get
    pruned: list[bool] = []

    def get_then_prune(key: str) -> bytes:
        if not pruned and "/ckpt/" in key:
            pruned.append(True)
            saver.prune(["t"], keep_last=1)  # between the pass's listing and its reads
        return real_get(key)

    src.get = get_then_prune  # type: ignore[method-assign]
    dst = str(tmp_path / "mirror")
    assert mirror(src, dst).ok and pruned
    assert verify(dst, level="data").ok
    latest = CkptfsSaver(dst, log=False).get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None and latest.checkpoint["channel_values"]["messages"] == chain[-1][1]


def test_thread_leases_stay_behind_so_a_restored_thread_is_writable_at_once(tmp_path: Path) -> None:
    """The saver holds a lease per thread it writes (one writer per thread). A lease is
    coordination, not state: mirrored and restored, it would make the first writer after a
    machine loss wait a whole ttl for the dead machine's lease to expire."""
    from ckptfs.replication.restore import restore

    src, mir, dst = (str(tmp_path / n) for n in ("src", "mirror", "restored"))
    saver = CkptfsSaver(src, lease_ttl=600)  # a writer that will never give its lease back
    chain = _put_chain(saver, "t1", 3)
    assert any("/leases/" in str(p) for p in Path(src).rglob("*.lease"))
    assert mirror(src, mir).ok and restore(mir, dst).ok
    for root in (mir, dst):
        assert not list(Path(root).rglob("*.lease")), root
    after = CkptfsSaver(dst, busy_timeout=0)  # would be ThreadBusyError if the lease came along
    after.put(chain[-1][0], {"v": 4, "id": str(uuid6(clock_seq=7)), "ts": "2026-01-01",
                             "channel_values": {"messages": [*chain[-1][1], "after restore"]},
                             "channel_versions": {"messages": 7}, "versions_seen": {}},
              {"source": "loop", "step": 7}, {"messages": 7})
    assert _history(dst, "t1")[0][1][-1] == "after restore"
    saver.close()
    after.close()


def test_a_saver_on_the_mirror_itself_refuses_the_threads_it_cannot_read(
        tmp_path: Path, s3: EmbeddedS3, s3_url: str) -> None:
    """A mirror of a local store holds each namespace as its log (one object): `ckptfs threads`
    on the mirror listed the thread with its 5 checkpoints, but CkptfsSaver(mirror) answered None
    for it, so a graph invoked there started the thread afresh beside its history, and the next
    mirror pass deleted that acknowledged checkpoint ('deleted': 2). Now the saver raises
    ConfigError naming the log and the way out (restore), and writes nothing; so does a local
    store written with the log opened with log=False."""
    src = str(tmp_path / "machine-a")
    saver = CkptfsSaver(src)
    _put_chain(saver, "t1", 5)
    saver.close()
    to = ["--to-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    assert cli("mirror", src, s3_url, "--once", *to)[0] == 0
    code, doc, err = cli_json("threads", s3_url, "-o", f"client_kwargs.endpoint_url={s3.endpoint}")
    assert code == 0 and [(r["thread_id"], r["checkpoints"]) for r in doc["threads"]] == [("t1", 5)], err

    class State(TypedDict):
        n: int

    builder = StateGraph(State)
    builder.add_node("inc", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "inc")
    on_mirror = CkptfsSaver(s3_url, s3.storage_options)
    with pytest.raises(ConfigError, match=r"holds LangGraph thread 't1' as a record log .*ckptfs restore"):
        builder.compile(checkpointer=on_mirror).invoke({"n": 0}, {"configurable": {"thread_id": "t1"}})
    with pytest.raises(ConfigError, match="record log"):
        on_mirror.get_tuple({"configurable": {"thread_id": "t1", "checkpoint_id": str(uuid6())}})
    assert on_mirror.get_tuple({"configurable": {"thread_id": "new"}}) is None  # a new thread is new
    on_mirror.close()
    code, doc, err = cli_json("mirror", src, s3_url, "--once", *to)
    assert code == 0 and _entry(doc)["deleted"] == 0 and _entry(doc)["copied"] == 0, (doc, err)
    with pytest.raises(ConfigError, match="log=True"):
        CkptfsSaver(src, log=False).get_tuple({"configurable": {"thread_id": "t1"}})


def test_a_damaged_log_is_not_restored_to_s3_as_an_older_state(tmp_path: Path, s3: EmbeddedS3,
                                                                 s3_url: str) -> None:
    """Restoring to S3 writes each log's live records out as objects, and a damaged record is
    not live: with one byte of t1's newest checkpoint flipped, `ckptfs restore` said 'restored'
    (exit 0), verify of the restored store was clean, and get_tuple there returned the
    checkpoint before it as the newest, silently (on local disk the same log raises
    CorruptFileError). Now that log is not written out: exit 1, 'incomplete', naming the log and
    the byte; the other threads are restored."""
    src = str(tmp_path / "machine-a")
    saver = CkptfsSaver(src)
    chain = _put_chain(saver, "t1", 6)
    _put_chain(saver, "t2", 3)
    saver.close()
    log = Path(src) / "langgraph/threads/t1/_/.records"
    data = bytearray(log.read_bytes())
    data[-20] ^= 0xFF  # inside the last record: t1's newest checkpoint
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError):
        CkptfsSaver(src).get_tuple({"configurable": {"thread_id": "t1"}})
    to = ["--to-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    assert cli("mirror", src, s3_url, "--once", *to)[0] == 0
    dst = s3.url(f"restored-{uuid6().hex[:8]}")
    code, doc, err = cli_json("restore", s3_url, dst, "--from-option",
                              f"client_kwargs.endpoint_url={s3.endpoint}", *to)
    assert code == 1 and not doc["ok"], (doc, err)
    entry = _entry(doc)
    assert entry["status"] == "incomplete" and entry["missing"] == ["langgraph/threads/t1/_/.records"]
    assert "damaged record(s) at byte" in entry["error"] and "restore to local disk" in entry["error"]
    restored = CkptfsSaver(dst, s3.storage_options)
    assert restored.get_tuple({"configurable": {"thread_id": "t1"}}) is None  # not the older state
    assert restored.get_tuple(chain[-2][0]) is None  # none of t1's objects were written

    def t2(saver: CkptfsSaver) -> list[Any]:
        return [t.checkpoint["channel_values"]["messages"]
                for t in saver.list({"configurable": {"thread_id": "t2"}})]

    assert t2(restored) == t2(CkptfsSaver(src)) != []
