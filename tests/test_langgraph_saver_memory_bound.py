"""A long-lived CkptfsSaver (a server's, a thread per conversation, a run per call) keeps a
bounded memory: past `_MAX_THREADS` threads it forgets them all and reads what it needs again.
Before, every thread written and every run seen stayed in memory for the saver's life (~1 KB a
thread, ~250 bytes a run even on one thread), and forgetting must not let it write a checkpoint
that points at objects another saver removed meanwhile."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base.id import uuid6

from ckptfs.integrations.langgraph import CkptfsSaver
from ckptfs.integrations.langgraph import saver as saver_module

CAP = 20


def _checkpoint(step: int, prompt: str = "you are terse") -> tuple[Any, Any, Any]:
    """Step `step` of a thread: `turns` changes every step, `system` only at step 0, so from
    step 1 on the saver points `system` at the holder its memory (or the parent) names."""
    ck: Any = {
        "v": 4, "id": str(uuid6()), "ts": "2026-12-07T00:00:00+00:00",
        "channel_values": {"system": prompt * 20, "turns": step},
        "channel_versions": {"system": 1, "turns": step + 1},
        "versions_seen": {}, "updated_channels": ["turns"],
    }
    md: Any = {"source": "loop", "step": step, "parents": {}, "run_id": str(uuid.uuid4())}
    return ck, md, ({"system": 1, "turns": 1} if step == 0 else {"turns": step + 1})


def _put(saver: CkptfsSaver, thread: str, step: int, parent: Any = None) -> Any:
    cfg: Any = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(cfg, *_checkpoint(step))


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saver_module, "_MAX_THREADS", CAP)


def test_memory_stays_bounded_and_every_thread_reads_back(tmp_path: Path, small_cap: None) -> None:
    url = str(tmp_path / "s")
    configs: dict[str, Any] = {}
    with CkptfsSaver(url) as saver:
        for round_ in range(3):
            for i in range(5 * CAP):
                t = f"t{i}"
                configs[t] = _put(saver, t, round_, configs.get(t))
            # every call a new run: the run markers are bounded too
            sizes = {name: len(getattr(saver, name)) for name in ("_epochs", "_last", "_run_markers")}
            assert all(n <= CAP for n in sizes.values()), sizes
        for t, cfg in configs.items():  # the same saver, after forgetting most of them
            got = saver.get_tuple(cfg)
            assert got is not None and got.checkpoint["channel_values"] == {
                "system": "you are terse" * 20, "turns": 2}, t
    with CkptfsSaver(url) as fresh:  # and a new process's view
        for t in configs:
            got = fresh.get_tuple({"configurable": {"thread_id": t}})
            assert got is not None and got.checkpoint["channel_values"]["turns"] == 2, t
            assert len(list(fresh.list({"configurable": {"thread_id": t}}))) == 3


class _HoldPut:
    """The put of one thread's checkpoint waits for `go`: a put in flight while the saver
    starts over."""

    def __init__(self, saver: CkptfsSaver, marker: str) -> None:
        self.inner, self.marker = saver.storage.put_if_absent, marker
        self.entered, self.go = threading.Event(), threading.Event()
        saver.storage.put_if_absent = self  # type: ignore[method-assign]

    def __call__(self, key: str, data: bytes) -> None:
        if self.marker in key and "/ckpt/" in key and not self.go.is_set():
            self.entered.set()
            assert self.go.wait(30)
        self.inner(key, data)


def test_a_put_in_flight_while_the_saver_starts_over_is_forgotten_after_a_removal(
        tmp_path: Path, small_cap: None) -> None:
    """A put of thread T in flight when the saver starts over writes T's memory after the
    forgetting, under no epoch. Another saver then deletes T, and a caller holding T's old
    config puts again: that checkpoint must not point `system` at the deleted holder."""
    url = str(tmp_path / "s")
    with CkptfsSaver(url) as a, CkptfsSaver(url) as b:
        first = _put(a, "victim", 0)
        held = _HoldPut(a, "victim")
        out: list[Any] = []
        worker = threading.Thread(target=lambda: out.append(_put(a, "victim", 1, first)))
        worker.start()
        assert held.entered.wait(30)
        for i in range(CAP + 1):  # the saver starts over while the put is held
            _put(a, f"other{i}", 0)
        held.go.set()
        worker.join(30)
        assert out, "the held put did not finish"
        b.delete_thread("victim")
        again = _put(a, "victim", 2, out[0])  # a stale config, as a caller may hold
    with CkptfsSaver(url) as reader:
        got = reader.get_tuple(again)
        assert got is not None
        assert got.checkpoint["channel_values"] == {"system": "you are terse" * 20, "turns": 2}
