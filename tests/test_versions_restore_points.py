"""`ckptfs versions` offers exactly the versions a restore reaches, through the real executable.

Found by a hostile review: the restore points were judged by file names, from the newest snapshot
on. With that snapshot and every path to the version below it damaged, `versions` offered v31
(`restore --version 31` failed, exit 1, and its message offered v31 again) and hid v28 and v29,
which restore. On a healthy store it hid every version below the newest snapshot that restores
(v28-v30 here). Now they are the versions a load of exactly that version reaches through files
that read: the oracle below is `load_run(version=v)` itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli_commands import cli

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import CheckpointCorruptError, VersionNotFoundError
from ckptfs.store.compactor import CompactionPolicy

RUN = "rün-é"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """31 versions; retention kept two snapshots (v28 and v31 most times: the versions depend on
    compressed sizes, so the test reads them) and the records from the older one on."""
    root = tmp_path_factory.mktemp("points") / "store"
    policy = CompactionPolicy(background=False, keep_last=2, min_snapshot_bytes=1, fanout=2,
                              superseded_grace=0)
    with CheckpointStore(str(root), policy=policy) as st:
        run = AgentRun(run_id=RUN, goal="g")
        for i in range(30):
            run.add_step(Step(id=f"s{i}", title=f"t{i}"))
        st.save_run(run)
        for i in range(30):
            step = run.steps[f"s{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"r{i}" + "é" * 200
            step.metadata = {"big": 10**40}
            st.commit(run, [step])
    return root


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    return root


def _files(root: Path, kind: str) -> list[Path]:
    return sorted((root / "runs" / RUN / kind).iterdir())


def _loads(root: Path, versions: list[int]) -> list[int]:
    """The oracle: the versions `load_run(version=v)` returns."""
    st = CheckpointStore(str(root))
    out = []
    for v in versions:
        try:
            st.load_run(RUN, version=v)
        except (CheckpointCorruptError, VersionNotFoundError):
            continue
        assert st.last_load is not None and st.last_load.version == v
        out.append(v)
    return out


def _points(root: Path) -> tuple[list[int], list[int]]:
    code, out, err = cli("versions", str(root), RUN, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [v["version"] for v in doc["versions"] if v["restore_point"]] == doc["restore_points"]
    return doc["restore_points"], [v["version"] for v in doc["versions"]]


def test_every_version_a_restore_reaches_is_offered(store: Path, tmp_path: Path) -> None:
    snaps = _files(store, "snap")
    assert len(snaps) == 2, snaps
    older = int(snaps[0].stem)
    points, versions = _points(store)
    assert points == _loads(store, versions) == versions, (points, versions)
    assert older in points and older + 1 in points  # below the newest snapshot: were hidden
    code, _out, err = cli("restore", str(store), str(tmp_path / "dst"), "--run", RUN,
                          "--version", str(older + 1), "--no-progress")
    assert code == 0, err
    assert _loads(tmp_path / "dst", [older + 1]) == [older + 1]


def test_a_version_whose_every_path_is_damaged_is_not_offered(store: Path, tmp_path: Path) -> None:
    snaps = _files(store, "snap")
    newest = int(snaps[-1].stem)
    for path in [snaps[-1], store / "runs" / RUN / "log" / f"{newest - 1:012d}.ckpt",
                 *(d for d in _files(store, "delta") if int(d.stem.split("-")[1]) == newest - 1)]:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    points, versions = _points(store)
    assert points == _loads(store, versions), (points, versions)
    assert newest not in points and newest - 1 not in points and int(snaps[0].stem) in points
    code, out, err = cli("restore", str(store), str(tmp_path / "dst"), "--run", RUN,
                         "--version", str(newest), "--no-progress")
    assert code == 1, (out, err)
    offered = ", ".join(map(str, points))
    assert f"restorable versions: {offered})" in out + err, (out, err)
