"""A hostile review of the superseded grace (CompactionPolicy.superseded_grace) where commands
meet: a store whose clock is not the client's, restarts that list the run again, and the values
a caller may pass.

The grace counts from the store's modified times for every snapshot a process did not write
itself (`ckptfs prune`, mirror-side retention, a restarted writer). Those times come from another
clock (an S3 server's, an NFS server's) or from whatever a copy or `touch` set. Taken as they
were, a time ahead of the client's made the snapshot look superseded "just now" for as long as it
stayed ahead: a store a year ahead kept every snapshot, with its records, through every prune of
that year. A store that says its own time (S3's Date header) is judged on that clock
(store/retention.py `store_age`), so its skew does not matter; against this machine's clock, where
the store does not say it, a time is read with a bound: ahead by at most the grace counts as now;
further ahead counts as unknown, as old, which is the behaviour before the grace (a reader that
listed the run reloads), never less.

S3's skew is made for real: moto sits behind a loopback proxy that moves every Last-Modified it
forwards by a year, and the Date with it (a store whose clock is a year ahead) or away (a store
that does not tell its time), and the writer, the reader, `ckptfs prune`, `ckptfs mirror`,
`ckptfs verify` and `ckptfs restore` all talk to the store through it. The writer is a process of
its own, SIGKILLed; the CLI is the installed executable.

Run as a script, this file is the chain's child processes (`writer`, `reader`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fractions
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _fault_proxy import Fault, FaultProxy, Headers, dates_moved

from ckptfs import (
    AgentRun,
    CheckpointedAgent,
    CheckpointStore,
    CompactionPolicy,
    Step,
    StepStatus,
)
from ckptfs.format.keys import parse_run_key

YEAR = 365 * 86400.0
RUN = "chain"
# A snapshot at every commit, keep_last=1: retention as aggressive as it gets.
AGGRESSIVE = CompactionPolicy(fanout=2, max_plan=2, snapshot_ratio=0.0001, min_snapshot_bytes=0,
                              keep_last=1, fence_seconds=0.0, background=False)


def _moved(offset: float, date: bool) -> Callable[[Headers], Headers]:
    """Reply headers from a store whose clock is `offset` seconds off the client's: its
    Last-Modified (what `Storage.modified` reads, from a HEAD) moved by `offset`, and its Date
    (the server's now, which `Storage.modified_and_now` reads with it) moved too, or, without
    `date`, dropped: a store that does not say its time (behind a gateway that strips Date),
    whose times the client can only read against its own clock, with a bound."""
    if date:
        return lambda headers: dates_moved(headers, {"last-modified": offset, "date": offset})
    return lambda headers: [(k, v) for k, v in dates_moved(headers, {"last-modified": offset})
                            if k.lower() != "date"]


@contextlib.contextmanager
def skewed(s3: Any, offset: float, *, date: bool = False) -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    """A proxy in front of moto moving every Last-Modified by `offset` and the Date with it or
    away (`_moved`), everything else as it is, and the storage options that reach moto through
    it (`counts["rewritten"]` says how many replies it moved)."""
    with FaultProxy(s3.endpoint, lambda _req: Fault(reply_headers=_moved(offset, date))) as proxy:
        opts = dict(s3.storage_options)
        opts["client_kwargs"] = {**opts["client_kwargs"], "endpoint_url": proxy.endpoint}
        yield proxy, opts


def _new_run(store: CheckpointStore, steps: int) -> AgentRun:
    run = AgentRun(run_id=RUN, goal="grace seams")
    for i in range(steps):
        run.add_step(Step(id=f"s{i:05d}", title=f"step {i}"))
    store.save_run(run)
    return run


def _complete(store: CheckpointStore, run: AgentRun, n: int) -> list[str]:
    done = []
    for step in [s for s in run.steps.values() if s.status != StepStatus.COMPLETED][:n]:
        step.status, step.result = StepStatus.COMPLETED, f"result of {step.id}"
        store.commit(run, [step])
        done.append(step.id)
    return done


def _versions(store: CheckpointStore, kind: str) -> list[int]:
    return sorted(rf.version for key in store.storage.list(f"runs/{RUN}/")
                  if (rf := parse_run_key(key)) is not None and rf.kind == kind)


def _cli(*args: str, timeout: float = 120) -> tuple[int, Any, str]:
    from test_cli_commands import cli

    code, out, err = cli(*args, timeout=timeout)
    try:
        return code, json.loads(out), err
    except json.JSONDecodeError:
        return code, out, err


def _wait_for(what: str, ready: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ------------------------------------------------------------------------------ library


def test_hostile_grace_values_are_refused_alike_by_policy_prune_and_mirror(tmp_path: Path) -> None:
    """`superseded_grace=True` was a grace of 1 s, a Decimal was kept as it was and 10**400
    raised a bare OverflowError; `--superseded-grace` refuses the like of them (usage errors)
    and `CompactionPolicy` the like for its other numbers. Now: a bool, a str, a Decimal, None
    are a TypeError naming the field, a NaN, an infinity, a negative or an int past a float a
    ValueError naming it, the same from CompactionPolicy, prune and mirror, before anything
    is read or removed; a Fraction or an int is taken, as a float."""
    from ckptfs.maintenance.prune import prune
    from ckptfs.replication.mirror import mirror

    url = str(tmp_path / "store")
    store = CheckpointStore(url, policy=dataclasses.replace(AGGRESSIVE, keep_last=0))
    _complete(store, _new_run(store, 4), 3)
    before = sorted(p.name for p in (tmp_path / "store").rglob("*"))
    wrong_type: list[Any] = [True, False, "60", b"60", Decimal("60"), None, [60], 1j]
    wrong_value: list[Any] = [-1, -0.5, float("nan"), float("inf"), 10**400, 10**5000]
    for bad in wrong_type + wrong_value:
        kind = TypeError if any(bad is t for t in wrong_type) else ValueError
        for call in (lambda b: CompactionPolicy(superseded_grace=b),
                     lambda b: prune(url, 1, superseded_grace=b),
                     lambda b: mirror(url, str(tmp_path / "m"), superseded_grace=b, keep_last=1)):
            with pytest.raises(kind, match="superseded_grace") as got:
                call(bad)
            assert len(str(got.value)) < 200, got.value  # 10**5000 is not printed whole
    assert sorted(p.name for p in (tmp_path / "store").rglob("*")) == before
    assert not (tmp_path / "m").exists()
    for fine, seconds in ((fractions.Fraction(1, 2), 0.5), (5, 5.0), (0, 0.0)):
        got_policy = CompactionPolicy(superseded_grace=fine).superseded_grace
        assert got_policy == seconds and type(got_policy) is float


def test_restarts_beside_a_store_a_year_ahead_keep_files_bounded(s3: Any, s3_url: str) -> None:
    """Writers restarting again and again (each a new store: it lists the run and adopts what
    the ones before left) beside an S3 server whose clock is a year ahead and which does not say
    its time (no Date: the client reads its times against its own clock). Each took the listed
    snapshots' times, all in the future, for "now" and kept them one more grace: 12 restarts of
    2 commits kept all 27 snapshots. A time that far ahead is unknown now, as old: each writer
    keeps its own snapshots for the grace (its own clock) and the one it superseded."""
    policy = dataclasses.replace(AGGRESSIVE, superseded_grace=30.0)
    with skewed(s3, YEAR) as (proxy, opts):
        first = CheckpointStore(s3_url, opts, policy=policy)
        run = _new_run(first, 40)
        _complete(first, run, 2)
        first.close()
        for _restart in range(12):
            store = CheckpointStore(s3_url, opts, policy=policy)
            again = store.load_run(RUN)
            assert again is not None
            _complete(store, again, 2)
            store.close()
        assert proxy.counts["rewritten"] > 0  # the writers really read times through the skew
        snaps = _versions(CheckpointStore(s3_url, s3.storage_options), "snap")
        assert len(snaps) <= 4, snaps  # its own two and the loaded one, at most one more
        loaded = CheckpointStore(s3_url, opts).load_run(RUN)
        assert loaded is not None
        assert sum(s.status == StepStatus.COMPLETED for s in loaded.steps.values()) == 26


def test_a_store_whose_clock_is_a_year_ahead_and_says_so_is_judged_on_its_clock(
        s3: Any, s3_url: str) -> None:
    """The same restarts beside a store a year ahead that says its time (Date moved with
    Last-Modified): ages are read on its clock, so the grace is the grace, neither a year nor
    none. Snapshots superseded within it stay, for a reader that listed the run (read against
    this machine's clock they were a year ahead, unknown, and went at once); once it has passed
    by the store's clock, the next writer retires them."""
    policy = dataclasses.replace(AGGRESSIVE, superseded_grace=60.0)
    with skewed(s3, YEAR, date=True) as (proxy, opts):
        first = CheckpointStore(s3_url, opts, policy=policy)
        run = _new_run(first, 40)
        _complete(first, run, 2)
        first.close()
        for _restart in range(6):
            store = CheckpointStore(s3_url, opts, policy=policy)
            again = store.load_run(RUN)
            assert again is not None
            _complete(store, again, 2)
            store.close()
        graced = _versions(CheckpointStore(s3_url, s3.storage_options), "snap")
        assert len(graced) >= 10, graced  # 14 written within the grace, by the store's clock
        time.sleep(3.5)  # a grace of 2 s passes on the store's clock too (whole seconds)
        last = CheckpointStore(s3_url, opts, policy=dataclasses.replace(policy, superseded_grace=2.0))
        again = last.load_run(RUN)
        assert again is not None
        _complete(last, again, 2)
        last.close()
        assert proxy.counts["rewritten"] > 0
        snaps = _versions(CheckpointStore(s3_url, s3.storage_options), "snap")
        assert len(snaps) <= 4, snaps  # the last writer's own two and the loaded one, at most one more
        loaded = CheckpointStore(s3_url, opts).load_run(RUN)
        assert loaded is not None
        assert sum(s.status == StepStatus.COMPLETED for s in loaded.steps.values()) == 16


# ------------------------------------------------------------------------------ CLI


def test_cli_prune_reads_store_times_with_a_bound(tmp_path: Path) -> None:
    """`ckptfs prune --keep-last 1` (the default 60 s grace) over snapshots whose times a copy
    or a clock put elsewhere. A year ahead: every one was kept, "graced", at every prune (it
    would have been for a year); now they go, as they would without the grace. Ahead by less
    than the grace: counts as now, kept. A year behind: gone at once, as before. The store then
    verifies clean and loads."""
    url = str(tmp_path / "store")
    writer = CheckpointStore(url, policy=dataclasses.replace(AGGRESSIVE, keep_last=0))
    run = _new_run(writer, 30)
    _complete(writer, run, 6)
    writer.close()
    snaps = _versions(writer, "snap")
    assert len(snaps) >= 7
    folder = tmp_path / "store" / "runs" / RUN / "snap"

    def date(versions: list[int], offset: float) -> None:
        when = time.time() + offset
        for v in versions:
            os.utime(folder / f"{v:012d}.ckpt", (when, when))

    def prune() -> dict[str, Any]:
        code, doc, err = _cli("prune", url, "--keep-last", "1", "--json")
        assert code == 0, (code, doc, err)
        assert doc["superseded_grace_seconds"] == 60.0
        [result] = doc["runs"]
        return dict(result)

    date(snaps, -3600)  # all superseded long ago but the newest two, dated a year ahead
    date(snaps[-2:], YEAR)
    result = prune()
    assert result["graced"] == [] and _versions(writer, "snap") == snaps[-1:], result
    assert not [v for v in _versions(writer, "log") if v <= snaps[-1]]
    # a store a few seconds ahead: within the grace, counted as now
    second = CheckpointStore(url, policy=dataclasses.replace(AGGRESSIVE, keep_last=0))
    run = second.load_run(RUN)
    assert run is not None
    _complete(second, run, 2)
    second.close()
    newer = _versions(writer, "snap")
    date(newer, 30)
    result = prune()
    assert result["graced"] == newer[-2::-1] and _versions(writer, "snap") == newer, result
    date(newer, -YEAR)  # a year behind: superseded long ago, gone as before the grace
    result = prune()
    assert result["graced"] == [] and _versions(writer, "snap") == newer[-1:], result
    code, doc, err = _cli("verify", url, "--json")
    assert code == 0, (doc, err)
    assert CheckpointStore(url).load_run(RUN) == run


# ------------------------------------------------------------------------------ the chain


def _child(mode: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, __file__, mode, *args], stdout=subprocess.PIPE,
                            text=True, env=env)


def _acked(side: Path) -> list[str]:
    return side.read_text().split() if side.exists() else []


def test_chain_beside_a_store_a_year_ahead(s3: Any, s3_url: str, tmp_path: Path) -> None:
    """The operator's chain over S3 whose clock is a year ahead of everyone's, and which does
    not say its time (no Date header, as behind a gateway that strips it): a writer process
    (keep_last=1, a snapshot at every commit, the default grace) and a reader process loading
    in a loop; `ckptfs prune --keep-last 1` and `ckptfs mirror --keep-last 1` twice meanwhile;
    the writer SIGKILLed; verify the source, a last mirror pass, verify the mirror, restore it
    elsewhere, verify that, and resume the run there with the library: every acknowledged step
    is there. Before: prune and the mirror's retention took every snapshot's time for "just
    now" and kept all of them (the source held every snapshot the writer wrote after a final
    prune, the mirror every one it copied); now they keep what they were told to."""
    mirror_url = s3.url(f"mirror-{tmp_path.name[-8:]}")
    side, stop, restored = tmp_path / "acked", tmp_path / "stop", tmp_path / "restored"
    limit = tmp_path / "limit"
    limit.write_text("40")
    with skewed(s3, YEAR) as (proxy, opts):
        ep = f"client_kwargs.endpoint_url={proxy.endpoint}"
        writer = _child("writer", s3_url, json.dumps(opts), str(side), str(limit))
        reader = None
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
            reader = _child("reader", s3_url, json.dumps(opts), str(stop))
            passes = []
            for round_ in range(2):  # the writer commits on while prune and mirror run
                limit.write_text(str(40 * (round_ + 1)))
                _wait_for("commits", lambda r=round_: len(_acked(side)) >= 40 * r + 10)
                code, doc, err = _cli("prune", s3_url, "--keep-last", "1", "--run", RUN, "--json", "-o", ep)
                assert code == 0, (doc, err)
                code, doc, err = _cli("mirror", s3_url, mirror_url, "--once", "--latest",
                                      "--keep-last", "1", "--no-progress", "--json",
                                      "--from-option", ep, "--to-option", ep)
                assert code == 0, (doc, err)
                passes.append(doc["runs"][0]["status"])
            assert passes == ["mirrored", "mirrored"]
            limit.write_text("120")  # killed on its way there
            _wait_for("commits", lambda: len(_acked(side)) >= 95)
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            stop.touch()
            if reader is not None:
                out, _ = reader.communicate(timeout=60)
        acked = _acked(side)
        loads = json.loads(out.strip().splitlines()[-1])
        assert loads["loads"] > 0 and loads["errors"] == [], loads
        written = _versions(CheckpointStore(s3_url, s3.storage_options), "snap")
        assert len(written) >= 2  # the writer keeps its own for the grace, by its own clock
        code, doc, err = _cli("prune", s3_url, "--keep-last", "1", "--run", RUN, "--json", "-o", ep)
        assert code == 0 and doc["runs"][0]["graced"] == [], (doc, err)
        assert len(_versions(CheckpointStore(s3_url, s3.storage_options), "snap")) == 1
        code, doc, err = _cli("verify", s3_url, "--json", "-o", ep)
        assert code == 0, (doc, err)
        code, doc, err = _cli("mirror", s3_url, mirror_url, "--once", "--latest", "--keep-last",
                              "1", "--no-progress", "--json", "--from-option", ep,
                              "--to-option", ep)
        assert code == 0 and doc["runs"][0]["status"] == "mirrored", (doc, err)
        assert len(_versions(CheckpointStore(mirror_url, s3.storage_options), "snap")) == 1
        code, doc, err = _cli("verify", mirror_url, "--json", "-o", ep)
        assert code == 0, (doc, err)
        code, doc, err = _cli("restore", mirror_url, str(restored), "--json", "--from-option", ep)
        assert code == 0 and doc["ok"], (doc, err)
        assert proxy.counts["rewritten"] > 0
    code, doc, err = _cli("verify", str(restored), "--json")
    assert code == 0, (doc, err)
    run = CheckpointedAgent(CheckpointStore(str(restored))).resume_run(RUN)
    assert run is not None
    done = {s.id for s in run.steps.values() if s.status == StepStatus.COMPLETED}
    assert len(acked) >= 20 and not [a for a in acked if a not in done]


def _writer_main(url: str, opts: str, side: str, limit: str) -> None:
    """Add and complete a step per commit until killed, appending each step's id to `side`
    once its commit returned (the run grows a step at a time: every snapshot stays small), as
    far as the number in file `limit` lets it: the test keeps the run small enough to prune
    and mirror in seconds."""
    policy = dataclasses.replace(AGGRESSIVE, background=True, superseded_grace=60.0)
    store = CheckpointStore(url, json.loads(opts), policy=policy)
    run = _new_run(store, 1)
    with open(side, "a") as out:
        print("ready", flush=True)
        for i in range(1, 100_000):
            while i > int(Path(limit).read_text() or 0):
                time.sleep(0.01)
            step = Step(id=f"s{i:05d}", title=f"step {i}")
            run.add_step(step)
            step.status, step.result = StepStatus.COMPLETED, f"result of {step.id}"
            store.commit(run, [step])
            out.write(step.id + "\n")
            out.flush()
            os.fsync(out.fileno())


def _reader_main(url: str, opts: str, stop: str) -> None:
    """Load the run until `stop` exists; say how many loads landed and which failed."""
    store = CheckpointStore(url, json.loads(opts))
    loads, errors = 0, []
    while not os.path.exists(stop):
        try:
            if store.load_run(RUN) is not None:
                loads += 1
        except Exception as exc:  # what a reader meets: reported, and the loop goes on
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        time.sleep(0.05)  # a pace, as the writer's
    print(json.dumps({"loads": loads, "errors": errors}), flush=True)


if __name__ == "__main__":
    {"writer": _writer_main, "reader": _reader_main}[sys.argv[1]](*sys.argv[2:])
