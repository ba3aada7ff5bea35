"""Hostile review of the maintenance commands and their read model, driven through the real
`ckptfs` executable.

Found:

* A FIFO or a symbolic link where a step's lease goes (`runs/<run>/lease/<step>.lease`) made
  `ckptfs show` of a run with open steps exit 1 ("corrupt: ... lease: not read") with nothing
  shown, while `verify` called the store clean and `runs` listed the run; and made `forget`
  refuse the run outright, `--force` and `--dry-run` included, so the run could not be
  forgotten at all. A lease is a hint for people there: its unreadable entry is named, the rest
  is shown and forgotten (a link is deleted as a link: what it points at stays).
* `show`/`export`/`diff --version V` of a version that was never stored said "corrupt: version
  V could not be loaded" (exit 1) as soon as any lower file of the run was damaged, where the
  same question on an undamaged store is "no version V" (exit 2, not-found).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

CLI = str(Path(sys.executable).parent / "ckptfs")


def _ckptfs(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def _json(*args: str) -> tuple[int, Any]:
    proc = _ckptfs(*args, "--json")
    return proc.returncode, json.loads(proc.stdout)


def _store(root: Path, versions: int = 4) -> None:
    """Run `r`: steps a (done), b and c (open), written as `versions` versions."""
    with CheckpointStore(str(root)) as store:
        run = AgentRun(run_id="r", goal="hostile leases")
        for sid in ("a", "b", "c"):
            run.add_step(Step(id=sid, title=sid))
        store.save_run(run)
        for i in range(versions - 1):
            step = run.steps["a"]
            step.attempt_count = i + 1
            if i == versions - 2:
                step.status, step.result = StepStatus.COMPLETED, "done"
            store.commit(run, [step])


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_an_unreadable_lease_does_not_hide_the_run_from_show(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "s"
    _store(root)
    outside = tmp_path / "outside.json"
    outside.write_text('{"not": "a lease"}')
    lease_dir = root / "runs" / "r" / "lease"
    lease_dir.mkdir()
    bad = lease_dir / "b.lease"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        bad.symlink_to(outside)
    assert _ckptfs("verify", str(root)).returncode == 0  # leases are no checkpoint state
    code, doc = _json("show", str(root), "r")
    assert code == 0, doc
    assert doc["version"] == 4 and [s["id"] for s in doc["steps"]] == ["a", "b", "c"]
    assert any("runs/r/lease/b.lease" in n for n in doc["notes"]), doc["notes"]
    proc = _ckptfs("show", str(root), "r")
    assert proc.returncode == 0 and "b.lease" in proc.stderr, proc.stderr
    assert _ckptfs("show", str(root), "r", "--step", "b").returncode == 0
    assert outside.read_text() == '{"not": "a lease"}'


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_an_unreadable_lease_does_not_stop_forget(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "s"
    _store(root)
    outside = tmp_path / "outside.json"
    outside.write_text("keep me")
    lease_dir = root / "runs" / "r" / "lease"
    lease_dir.mkdir()
    bad = lease_dir / "b.lease"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        bad.symlink_to(outside)
    code, doc = _json("forget", str(root), "r", "--dry-run")
    assert code == 0, doc
    assert "runs/r/lease/b.lease" in doc["deleted"] and doc["versions"] == 4
    assert any("runs/r/lease/b.lease" in u for u in doc["unread_leases"]), doc
    assert os.path.lexists(bad)  # a dry run deletes nothing
    proc = _ckptfs("forget", str(root), "r")
    assert proc.returncode == 0, proc.stderr
    assert "b.lease" in proc.stderr  # named, not passed over in silence
    assert not (root / "runs" / "r").exists()
    assert outside.read_text() == "keep me"  # the link went, not what it pointed at
    assert _json("runs", str(root))[1]["runs"] == []


def test_a_version_never_stored_is_not_found_even_beside_damage(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _store(root)
    (root / "runs" / "r" / "log" / f"{5:012d}.ckpt").write_bytes(b"")  # a torn v5
    for args in (["show", str(root), "r", "--version", "9"],
                 ["export", str(root), "r", "--version", "9"],
                 ["diff", str(root), "r", "1", "9"]):
        code, doc = _json(*args)
        assert (code, doc["error"]["code"]) == (2, "not-found"), (args, doc)
        assert "no version 9" in doc["error"]["message"]
    # the damaged version itself is damage, and the stored ones still load
    code, doc = _json("show", str(root), "r", "--version", "5")
    assert (code, doc["error"]["code"]) == (1, "corrupt"), doc
    code, doc = _json("show", str(root), "r", "--version", "4")
    assert code == 0 and doc["version"] == 4
    code, doc = _json("show", str(root), "r")
    assert code == 0 and doc["version"] == 4 and doc["skipped"]
