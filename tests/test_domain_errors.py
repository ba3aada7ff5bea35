"""The store raises domain errors for domain conditions, never a bare KeyError or ValueError:
callers can tell "this run was never saved" from a bug, and the seed's callers that caught
KeyError/ValueError still do."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus, ToolCall
from ckptfs.errors import CkptfsError, InvalidGraphError, RunNotFoundError


def test_writes_to_a_run_never_saved_name_it(memory_url: str) -> None:
    store = CheckpointStore(memory_url)
    with pytest.raises(RunNotFoundError) as err:
        store.log_tool_call("ghost", "s1", ToolCall(tool_name="t", arguments={}))
    assert isinstance(err.value, KeyError) and isinstance(err.value, CkptfsError)
    assert str(err.value).startswith("run 'ghost' has no saved state")  # not quoted as KeyError is
    with pytest.raises(RunNotFoundError):
        store.mark_run_complete("ghost")
    with pytest.raises(RunNotFoundError):
        store.save_step_checkpoint("ghost", Step(id="s1", title="t"))


def test_an_unrunnable_graph_is_an_invalid_graph_error(memory_url: str) -> None:
    store = CheckpointStore(memory_url)
    run = AgentRun(goal="g")
    run.add_step(Step(id="a", title="a"))
    store.save_run(run)
    done = run.steps["a"]
    done.status = StepStatus.COMPLETED  # no result
    with pytest.raises(InvalidGraphError, match="COMPLETED without a result") as err:
        store.commit(run, [done])
    assert isinstance(err.value, ValueError)
    assert store.list_versions(run.run_id) == [1]



def test_a_non_finite_optional_time_is_refused_though_it_serialises_like_none(memory_url: str) -> None:
    """NaN in `started_at` serialises as null, the same bytes as None: the diff saw no change,
    `commit` acknowledged the old version and `save_run` a new one, and a load gave back None."""
    import math

    from ckptfs.errors import NonFiniteValueError

    store = CheckpointStore(memory_url)
    run = AgentRun(goal="g")
    run.add_step(Step(id="a", title="a"))
    v1 = store.save_run(run)
    for field in ("started_at", "completed_at"):
        for bad in (math.nan, math.inf):
            setattr(run.steps["a"], field, bad)
            with pytest.raises(NonFiniteValueError, match=field):
                store.commit(run, [run.steps["a"]])
            with pytest.raises(NonFiniteValueError, match=field):
                store.save_run(run)
            setattr(run.steps["a"], field, None)
    assert store.list_versions(run.run_id) == [v1]


def test_an_unknown_run_is_not_found_for_every_command(tmp_path: Path) -> None:
    """`--run nope` is the same error everywhere: code not-found, exit 2 (verify and prune said
    `config`, while show and versions said `not-found`)."""
    import json
    import subprocess
    import sys

    url = tmp_path / "store"
    store = CheckpointStore(str(url))
    run = AgentRun(run_id="real", goal="g")
    run.add_step(Step(id="a", title="a"))
    store.save_run(run)
    store.close()
    exe = str(Path(sys.executable).parent / "ckptfs")
    for argv in (["verify", str(url), "--run", "nope"],
                 ["prune", str(url), "--keep-last", "1", "--run", "nope"],
                 ["show", str(url), "nope"], ["versions", str(url), "nope"]):
        done = subprocess.run([exe, *argv, "--json"], capture_output=True, text=True, timeout=60)
        doc = json.loads(done.stdout)
        assert (done.returncode, doc["error"]["code"]) == (2, "not-found"), (argv, doc)


def test_a_note_every_reason_ends_with_is_said_once() -> None:
    """The case-twins sentence ended each of three files' reasons: a load's error said it three
    times. Said once now, only when every shown reason ends with it, nothing else changed."""
    from ckptfs.errors import first_of

    note = " (run 'a' and 'A' differ only in case (or form))"
    got = first_of([f"f{i}: v{i} misplaced{note}" for i in range(7)], 3)
    assert got == "f0: v0 misplaced; f1: v1 misplaced; f2: v2 misplaced (each: run 'a' and 'A' " \
                  "differ only in case (or form)); (+4 more)"
    assert first_of(["x (one)", "y (two)"]) == "x (one); y (two)"
    assert first_of(["x (one)", "y"]) == "x (one); y"
    assert first_of(["only (one)"]) == "only (one)"
    assert first_of(["(z)", "(z)"]) == "(z); (z)"  # nothing would be left of either
