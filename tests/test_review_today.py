"""A hostile user's second look at the day's read-only changes (export --output inside the
store, symlinked run folders, the loader's one named reason per skip) through the real
`ckptfs` executable and the library."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import _cli_store
import pytest
from _cli_store import RUN, flip, log_file
from test_cli_commands import cli

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import CheckpointCorruptError

pristine, store = _cli_store.pristine, _cli_store.store  # fixtures: the store, a copy per test


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_export_refuses_the_store_reached_by_another_path_than_its_own(store: Path, tmp_path: Path) -> None:
    """The inside-the-store check compared path strings (links resolved): the same directory
    by another path (a bind mount, a container's second mount of a volume, a case-insensitive
    file system's other spelling) passed, and `--output ALIAS/runs/papers/log/...17.ckpt`
    replaced v17's record with the export's JSON. The directory itself is compared."""
    alias = tmp_path / "alias"
    alias.mkdir()
    if subprocess.run(["mount", "--bind", str(store), str(alias)], capture_output=True).returncode:
        pytest.skip("no bind mount here (needs root and CAP_SYS_ADMIN)")
    try:
        before = _files(store)
        for given in (alias / "runs" / RUN / "log" / f"{17:012d}.ckpt", alias / "export.json"):
            code, out, err = cli("export", str(store), RUN, "--output", str(given), "--json")
            assert code == 2, (given, err)
            assert "inside the store" in json.loads(out)["error"]["message"], (given, out)
        assert _files(store) == before
    finally:
        subprocess.run(["umount", str(alias)], check=True)


def test_export_refuses_an_output_inside_a_store_named_by_local_url(store: Path) -> None:
    """`local:///path` opens the same directory through fsspec's local file system, whose
    storage named no local root: `export local://STORE papers --output STORE/runs/papers/log/
    ...17.ckpt` exited 0 and v17 was JSON. Refused as for a plain path or file://."""
    before = _files(store)
    for given in (log_file(store, 17), store / "export.json"):
        code, out, err = cli("export", f"local://{store}", RUN, "--output", str(given), "--json")
        assert code == 2, (given, err)
        assert "inside the store" in json.loads(out)["error"]["message"], (given, out)
    assert _files(store) == before


def test_a_run_none_of_whose_versions_loads_names_every_distinct_reason(tmp_path: Path) -> None:
    """v1 holds artifact C, v2 replaced it by artifact D; both damaged, no version loads. The
    per-attempt warnings that named each are -v's now, and show/export's error said "2
    problem(s); first: ...D...": C was named nowhere at default verbosity. The error names
    both, as the library's CheckpointCorruptError does."""
    root = tmp_path / "two-bad"
    store = CheckpointStore(str(root), artifact_threshold=1024)
    run = AgentRun(run_id="r", goal="g")
    run.add_step(Step(id="x", title="x", status=StepStatus.COMPLETED, result="C" * 5000))
    store.save_run(run)
    run.steps["x"].result = "ok"
    run.add_step(Step(id="y", title="y", status=StepStatus.COMPLETED, result="D" * 5000))
    store.save_run(run)
    store.close()
    artifacts = [p for p in (root / "artifacts").rglob("*") if p.is_file()]
    assert len(artifacts) == 2
    for p in artifacts:
        flip(p)
    names = [p.name for p in artifacts]
    with pytest.raises(CheckpointCorruptError) as caught:
        CheckpointStore(str(root)).load_run("r")
    assert all(n in str(caught.value) for n in names)
    for cmd in ("show", "export"):
        code, _, err = cli(cmd, str(root), "r")
        assert code == 1, err
        assert all(n in err for n in names), (cmd, err)
