"""The load reads record bodies as fragments (format/reader.py `SplitBody`) and seeds the head
from their stored bytes: it must load exactly what reading whole documents loads.

Each crafted store below is loaded twice, once as the store loads it and once with the
fragment reading switched off (every document through `codec.decode_text`, as before), and
the two loads must agree on the run, the tool log, the version, what was skipped and what
the head compares against. The head's bytes are the stored fragments; that they equal the
model JSON the commit path writes is checked here, not assumed.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import logging
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.format import codec, reader
from ckptfs.format.changes import Changes
from ckptfs.format.keys import log_key
from ckptfs.format.reader import RunIndex
from ckptfs.store.compactor import CompactionPolicy
from tests._forwarding import Forwarding

RUN = "frag-run"
INLINE = CompactionPolicy(fanout=2, max_plan=8, min_snapshot_bytes=6000, keep_last=0,
                          background=False)


def _run(n: int = 6) -> AgentRun:
    run = AgentRun(run_id=RUN, goal="fragments é ✓", metadata={"k": [1, 2.5, None]})
    for i in range(n):
        run.add_step(Step(id=f"s{i}", title=f"step {i}", description="d\n\t\"q\"",
                          dependencies=[f"s{i - 1}"] if i else []))
    return run


def _finish(run: AgentRun, sid: str, result: str = "done") -> Step:
    step = run.steps[sid]
    step.status = StepStatus.COMPLETED
    step.result = result
    step.started_at, step.completed_at = 1e-7, 1.7e16
    step.cost_usd = -0.0
    step.metadata = {"nested": {"x": [True, False, 10**30]}, "text": "ü\u2028\x01"}
    step.tool_calls = [ToolCall(tool_name="t", arguments={"a": 1}, result={"r": [0.1, 2]},
                                duration_ms=12.5)]
    return step


def _build(root: Path, *, artifacts: bool = False) -> str:
    """A run written through the commit path and compaction: snapshots, deltas, journal."""
    url = str(root / "store")
    with CheckpointStore(url, policy=INLINE, artifact_threshold=256 if artifacts else 64 * 1024
                         ) as store:
        run = _run()
        store.save_run(run)
        for i, sid in enumerate(run.steps):
            result = ("big " * 200) if artifacts and i % 2 else f"result {i}"
            store.commit(run, [_finish(run, sid, result)])
            store.log_tool_call(RUN, sid, ToolCall(tool_name="log", arguments={"i": i},
                                                   result="x" * (400 if artifacts else 4)))
        store.mark_run_complete(RUN)
    return url


_LOAD_LOGGERS = [["ckptfs", layer] for layer in ("format", "storage", "store")]


def _load(url: str, split: bool, monkeypatch: pytest.MonkeyPatch,
          caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """What a fresh store's load shows: run, tool log, version, skipped, warnings, head bytes."""
    with monkeypatch.context() as m:
        if not split:
            m.setattr(reader, "split_body", lambda body, lazy=False: None)
        caplog.clear()
        with caplog.at_level(logging.WARNING), CheckpointStore(url) as store:
            seeded: list[tuple[str, Any]] = []
            m.setattr(store._compactor, "submit", lambda kind, payload: seeded.append(payload))
            try:
                got = store.load_with_tool_log(RUN)
            except Exception as exc:  # the outcome is compared, whatever it is
                return {"raised": f"{type(exc).__name__}: {exc}"}
            info = store.last_load
            head = store._heads.get(RUN)
            assert got is not None and info is not None and head is not None
            run, tool_log = got
            return {
                "run": run.model_dump(),
                "tool_log": {k: [c.model_dump() for c in v] for k, v in tool_log.items()},
                "version": info.version, "skipped": info.skipped,
                # The load's own layers only: a lease keeper another test left running (it
                # beats for up to lease_idle seconds) may log here too.
                "warnings": [r.getMessage() for r in caplog.records
                             if r.name.split(".")[:2] in _LOAD_LOGGERS],
                "cmp": dict(head.steps_cmp), "deps": dict(head.deps),
                "status": dict(head.status), "counts": dict(head.counts),
                # What the compactor starts from: its next delta or snapshot is written from it.
                "replica": [(rc.version, rc.hash, json.loads(rc.replica.to_json()))
                            for _run_id, rc in seeded],
            }


def _agree(url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
           ) -> dict[str, Any]:
    fast = _load(url, True, monkeypatch, caplog)
    whole = _load(url, False, monkeypatch, caplog)
    assert fast == whole
    return fast


@pytest.mark.parametrize("artifacts", [False, True])
def test_stored_fragments_are_the_model_json(tmp_path: Path, artifacts: bool) -> None:
    """The claim the head's seeding rests on: what the commit path and compaction store for a
    step is byte for byte its model JSON, unless values moved to artifacts (`$refs`)."""
    url = _build(tmp_path, artifacts=artifacts)
    with CheckpointStore(url) as store:
        got = store._loader.load(RUN, None, True)
        assert got is not None
        assert got.info.records_read > 1  # a snapshot or delta and records after it
        refs = 0
        for sid, step in got.run.steps.items():
            stored = bytes(got.step_json[sid])
            if sid in got.state["steps"]:  # kept: its persisted form references artifacts
                assert reader.REFS_FIELD in got.state["steps"][sid]
                refs += 1
                assert json.loads(stored) == got.state["steps"][sid]
            else:
                assert stored == step.model_dump_json().encode()
        assert (refs > 0) == artifacts
        for sid, calls in got.call_json.items():
            for raw, call in zip(calls, got.tool_log[sid], strict=True):
                assert raw is not None
                if reader.REFS_FIELD not in json.loads(bytes(raw)):
                    assert bytes(raw) == call.model_dump_json().encode()


@pytest.mark.parametrize("artifacts", [False, True])
def test_head_compares_against_model_json_after_a_load(tmp_path: Path, artifacts: bool,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    url = _build(tmp_path, artifacts=artifacts)
    seen = _agree(url, monkeypatch, caplog)
    run = AgentRun.model_validate(seen["run"])
    assert seen["cmp"] == {sid: s.model_dump_json().encode() for sid, s in run.steps.items()}
    with CheckpointStore(url) as store:
        loaded = store.load_run(RUN)
        assert loaded is not None
        version = store.last_load.version if store.last_load else 0
        # Nothing changed: nothing written (a commit of every step compares every step).
        assert store.commit(loaded, list(loaded.steps.values())) == version
        loaded.steps["s0"].result = "changed"
        assert store.save_run(loaded) == version + 1
    with CheckpointStore(url) as store:
        again = store.load_run(RUN)
        assert again is not None and again.steps["s0"].result == "changed"
        assert again.model_dump(exclude={"steps": {"s0"}}) == loaded.model_dump(
            exclude={"steps": {"s0"}})


def test_a_store_from_another_serialiser_seeds_the_head_from_the_models(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Stored bytes that are not the model JSON (an older field set, other float spelling) are
    never taken for it: the head gets the model JSON, and nothing is written for nothing."""
    url = _build(tmp_path)
    run = AgentRun.model_validate(_load(url, True, monkeypatch, caplog)["run"])
    with CheckpointStore(url) as store:
        head = store._head(RUN)
        body = Changes(steps={sid: codec.dumps(json.loads(s.model_dump_json()) | {"old": 1e-05})
                              for sid, s in run.steps.items()}).to_json()
        _write_record(url, head.version + 1, head.version, head.hash, body)
    seen = _agree(url, monkeypatch, caplog)
    assert seen["cmp"] == {sid: s.model_dump_json().encode() for sid, s in run.steps.items()}
    with CheckpointStore(url) as store:
        loaded = store.load_run(RUN)
        assert loaded is not None and store.last_load is not None
        assert store.commit(loaded, list(loaded.steps.values())) == store.last_load.version


def _write_record(url: str, version: int, base: int, base_hash: str, body: bytes) -> None:
    """A journal record with `body` exactly, its header and hashes as the writer makes them."""
    sha = codec.sha256_hex(body)
    header = codec.RecordHeader(
        format=codec.FORMAT_NAME, format_version=codec.FORMAT_VERSION, kind="journal",
        run_id=RUN, version=version, base=base, base_hash=base_hash,
        hash=codec.chain_hash(base_hash, sha, version), body_sha256=sha, writer="test",
        time=1.0)
    path = Path(url) / log_key(RUN, version)
    path.write_bytes(codec.encode(header, body))


def _step_json(sid: str, **fields: Any) -> str:
    doc = Step(id=sid, title="t", status=StepStatus.COMPLETED, result="r").model_dump(mode="json")
    doc.update(fields)
    return json.dumps(doc)


def _steps(sid: str, frag: str, tail: str = "") -> str:
    return '{"steps":{' + json.dumps(sid) + ":" + frag + "}" + tail + "}"


def _with(sid: str, old: str, new: str) -> str:
    return _steps(sid, _step_json(sid).replace(old, new))


# Bodies that only Python's lenient json reads, or that are not the plain layout: each must
# load (or be refused, falling back one record) exactly as reading the whole document does.
HOSTILE_BODIES: dict[str, Callable[[str], str]] = {
    "nan in a float": lambda sid: _with(sid, '"cost_usd": 0.0', '"cost_usd": NaN'),
    "infinity in metadata": lambda sid: _with(sid, '"metadata": {}',
                                              '"metadata": {"x": -Infinity, "y": 1e400}'),
    "lone surrogate": lambda sid: _with(sid, '"result": "r"', '"result": "\\ud800"'),
    "giant int": lambda sid: _with(sid, '"metadata": {}', '"metadata": {"n": ' + "7" * 5000 + "}"),
    "int at the digit limit": lambda sid: _with(sid, '"metadata": {}',
                                                '"metadata": {"n": ' + "7" * 4300 + "}"),
    "unknown body key": lambda sid: _steps(sid, _step_json(sid), ',"extra":"\\u00e9"'),
    "step not an object": lambda sid: _steps(sid, "[1]"),
    "tool call not an object": lambda sid: '{"tool_log":{' + json.dumps(sid) + ":[1]}}",
    "run not an object": lambda sid: '{"run":"x"}',
    "removed not ids": lambda sid: '{"removed":[1]}',
    "duplicate step keys": lambda sid: _steps(sid, _step_json(sid, result="first") + ","
                                              + json.dumps(sid) + ":"
                                              + _step_json(sid, result="second")),
    "whitespace": lambda sid: ' {\n"steps" : { ' + json.dumps(sid) + " : " + _step_json(sid)
                              + ' } , "removed" : [ ] } ',
    "step field of the wrong type": lambda sid: _steps(sid, _step_json(sid, attempt_count="many")),
    "not json": lambda sid: _steps(sid, _step_json(sid))[:-1],
    "encoded surrogate": lambda sid: _with(sid, '"result": "r"', '"result": "\udcff"'),
    "bad utf-8": lambda sid: _with(sid, '"result": "r"', '"result": "<xff>"'),
    "nested body key in a step": lambda sid: _steps(sid, _step_json(
        sid, metadata={"body": {"body": 1}})),
}


def _hostile_record(url: str, name: str, sid: str) -> tuple[int, str, bytes]:
    """Append the hostile body `name` for step `sid` as the newest journal record; returns the
    version it builds on, that version's hash and the body written."""
    with CheckpointStore(url) as store:
        head = store._head(RUN)
        version, chash = head.version, head.hash
    body = HOSTILE_BODIES[name](sid).encode("utf-8", "surrogatepass").replace(b"<xff>", b"\xff")
    _write_record(url, version + 1, version, chash, body)
    return version, chash, body


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_hostile_newest_record_loads_as_reading_whole_documents_does(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    url = _build(tmp_path)
    _hostile_record(url, name, "s2")
    _agree(url, monkeypatch, caplog)


@pytest.mark.parametrize("then", ["replaced", "removed"])
@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_a_hostile_step_a_later_record_replaces_loads_as_reading_whole_documents_does(
        name: str, then: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The load leaves a step's fragment unparsed when a later record replaces it: a
    hostile one must still make the record read (or be refused) as the whole document is."""
    url = _build(tmp_path)
    version, chash, body = _hostile_record(url, name, "s5")
    later = (_steps("s5", _step_json("s5", result="replaced")) if then == "replaced"
             else '{"removed":["s5"]}').encode()
    _write_record(url, version + 2, version + 1,
                  codec.chain_hash(chash, codec.sha256_hex(body), version + 1), later)
    seen = _agree(url, monkeypatch, caplog)
    assert "raised" in seen or seen["version"] in (version, version + 2)


def test_lazy_parsing_leaves_replaced_fragments_unparsed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the lazy reading is for: a step a later record replaces is never parsed."""
    url = _build(tmp_path)
    parsed: list[bytes] = []
    real = reader.parse_step
    monkeypatch.setattr("ckptfs.store.loader.parse_step",
                        lambda raw: parsed.append(bytes(raw)) or real(raw))
    with CheckpointStore(url) as store:
        got = store._loader.load(RUN, None, True)
        assert got is not None and got.info.records_read > 1
    assert len(parsed) == len(got.run.steps)  # each surviving fragment once, no replaced one
    assert sorted(parsed) == sorted(bytes(got.step_json[sid]) for sid in got.run.steps)


def test_hostile_record_under_later_ones_loads_as_reading_whole_documents_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A record only the lenient reader takes, with valid records after it (and a delta over
    them): the chain and what it yields are the same either way."""
    url = _build(tmp_path)
    with CheckpointStore(url) as store:
        head = store._head(RUN)
        version, chash = head.version, head.hash
    body = HOSTILE_BODIES["nan in a float"]("s3").encode()
    _write_record(url, version + 1, version, chash, body)
    with CheckpointStore(url, policy=INLINE) as store:
        run = store.load_run(RUN)
        assert run is not None
        for sid in ("s4", "s5"):
            run.steps[sid].result = f"later {sid}"
            store.commit(run, [run.steps[sid]])
    seen = _agree(url, monkeypatch, caplog)
    assert seen["run"]["steps"]["s5"]["result"] == "later s5"


def test_corrupt_files_are_reported_in_read_order_with_prefetching(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Prefetching decodes files ahead, in any order; what a load skips and warns about is
    still reported in the order it reads them, and equals a load reading one file at a time."""
    url = _build(tmp_path)
    with CheckpointStore(url) as store:
        names = RunIndex.build(store._loader.run_files(RUN)).name_path()
    assert names is not None and len(names) >= 3
    for rf in (names[1], names[-1]):  # a delta or record after the start, and the newest
        p = Path(url) / rf.key
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    sequential = _agree(url, monkeypatch, caplog)
    assert len(sequential["skipped"]) >= 2

    real = CheckpointStore.__init__

    def remote(self: CheckpointStore, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self.storage.capabilities = dataclasses.replace(  # type: ignore[misc]
            self.storage.capabilities, remote=True)

    monkeypatch.setattr(CheckpointStore, "__init__", remote)
    assert _load(url, True, monkeypatch, caplog) == sequential


def test_a_load_leaves_the_collector_as_it_was(tmp_path: Path) -> None:
    url = _build(tmp_path)
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            with CheckpointStore(url) as store:
                run = store.load_run(RUN)
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
        assert run is not None
        # What a load built is promoted, not frozen: a cycle through it is still collected.
        run.metadata["self"] = run
        ref = weakref.ref(run)
        del run
        gc.collect()
        assert ref() is None


def test_records_below_the_newest_snapshot_are_used_when_it_does_not_load(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A load of the newest version leaves journal records below the newest snapshot unread;
    when that snapshot is damaged it loads again with them: from the older snapshot and the
    records between, and with every snapshot damaged from version 0 (no delta starts there:
    fanout 64, so the journal is the only way)."""
    url = str(tmp_path / "store")
    policy = dataclasses.replace(INLINE, min_snapshot_bytes=1500, fanout=64, max_plan=100)
    store = CheckpointStore(url, policy=policy)
    run = _run(12)
    store.save_run(run)
    for sid in list(run.steps):
        store.commit(run, [_finish(run, sid, "x" * 400)])
    store.close()
    snaps = sorted((tmp_path / "store" / "runs" / RUN / "snap").iterdir())
    # records below the oldest (it is at v3 most times, at v2 where compressed timestamps
    # come out a few bytes larger: compaction is scheduled by bytes)
    assert snaps and int(snaps[0].stem) >= 2, snaps
    assert (tmp_path / "store" / "runs" / RUN / "log" / "000000000001.ckpt").exists()
    fresh = CheckpointStore(url)
    assert fresh.load_run(RUN) == run

    def damage(snap: Path) -> None:
        data = bytearray(snap.read_bytes())
        data[len(data) // 2] ^= 0xFF
        snap.write_bytes(bytes(data))

    assert len(snaps) >= 2, snaps
    damage(snaps[-1])  # the newest: the older one and the records between give the same state
    older = CheckpointStore(url)
    assert older.load_run(RUN) == run
    assert older.last_load is not None and older.last_load.version == len(run.steps) + 1
    assert older.last_load.snapshot_version == int(snaps[-2].name.split(".")[0])
    for snap in snaps[:-1]:  # every snapshot damaged: only the journal from v0 is left to load
        damage(snap)
    again = CheckpointStore(url)
    with caplog.at_level(logging.INFO, logger="ckptfs.store.loader"):
        loaded = again.load_run(RUN)
    assert loaded == run
    assert again.last_load is not None and again.last_load.snapshot_version == 0
    assert "loading again with the records below its newest snapshot" in caplog.text


class _Reads(Forwarding):
    """Counts the reads of each key; `list` of `snap/` fails when asked to."""

    def __init__(self, inner: Any, fail_snap_listing: bool = False) -> None:
        super().__init__(inner)
        self.reads: collections.Counter[str] = collections.Counter()
        self.fail_snap_listing = fail_snap_listing

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        self.reads[key] += 1
        return self.inner.get_with_etag(key)

    def get(self, key: str) -> bytes:
        self.reads[key] += 1
        return self.inner.get(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        if self.fail_snap_listing and prefix.endswith("/snap/"):
            raise OSError("listing refused")
        return self.inner.list(prefix, start_after)


@pytest.mark.parametrize("logs_below", [True, False])
@pytest.mark.parametrize("fail_snap_listing", [False, True])
def test_the_newest_snapshot_is_read_once_while_the_run_is_listed(
        tmp_path: Path, logs_below: bool, fail_snap_listing: bool) -> None:
    """A load starts reading the newest snapshot before its listing of the whole run is done;
    the plan then uses that read: every file is read once, with or without journal records
    below the snapshot, and a failed early listing only loses the head start."""
    url = str(tmp_path / "store")
    with CheckpointStore(url, policy=CompactionPolicy(fanout=2, max_plan=4, min_snapshot_bytes=1,
                                                      keep_last=2, background=False)) as w:
        run = _run(12)
        w.save_run(run)
        for sid in run.steps:
            w.commit(run, [_finish(run, sid, f"result of {sid}")])
    root = Path(url) / "runs" / RUN
    assert any(int(p.stem) < max(int(q.stem) for q in (root / "snap").iterdir())
               for p in (root / "log").iterdir())  # records below the newest snapshot
    if not logs_below:
        newest = max(int(p.stem) for p in (root / "snap").iterdir())
        for p in (root / "log").iterdir():
            if int(p.stem) < newest:
                p.unlink()
    expected = CheckpointStore(url).load_run(RUN)
    with CheckpointStore(url) as plain:
        counting = _Reads(plain.storage, fail_snap_listing)
        with CheckpointStore(url, storage=counting) as store:
            got = store.load_run(RUN)
            info = store.last_load
    assert got is not None and expected is not None and info is not None
    assert got.model_dump() == expected.model_dump()
    assert info.snapshot_version > 0
    runs = {k: n for k, n in counting.reads.items() if k.startswith("runs/")}
    assert runs and max(runs.values()) == 1, runs
    assert any("/snap/" in k for k in runs)
