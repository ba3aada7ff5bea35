"""`ckptfs forget` deletes what is ckptfs's under the run, and nothing else (DESIGN.md: a name
that does not parse is not ours, reported, never deleted).

A hostile review found forget deleting `runs/r/notes/mine.txt`, a file inside a directory
planted at a journal key, and `runs/r/log/junkname`: anything under the run's prefix went.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

CLI = str(Path(sys.executable).parent / "ckptfs")


def _ckptfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60)


def test_forget_keeps_and_names_files_that_are_not_ckptfs(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(str(root)) as store:
        run = AgentRun(run_id="r", goal="g")
        for i in range(3):
            run.add_step(Step(id=f"s{i}", title=f"t{i}"))
        store.save_run(run)
        for sid in list(run.steps):
            run.steps[sid].status, run.steps[sid].result = StepStatus.COMPLETED, sid
            store.commit(run, [run.steps[sid]])
    ours = sorted(p for p in (root / "runs" / "r").rglob("*") if p.is_file())
    foreign = {
        root / "runs" / "r" / "notes" / "mine.txt": b"my notes",
        root / "runs" / "r" / "log" / "junkname": b"junk",
        root / "runs" / "r" / "log" / "000000000099.ckpt" / "foo": b"inside a dir at a key",
        # not a lease because it sits in lease/, not a temp file because its name says .tmp-
        root / "runs" / "r" / "lease" / "my-notes.txt": b"notes",
        root / "runs" / "r" / "lease" / "sub" / "deep.txt": b"deep",
        root / "runs" / "r" / "my.tmp-backup": b"a backup",
        root / "runs" / "r" / "notes" / "draft.tmp-1": b"a draft",
    }
    ours_temp = root / "runs" / "r" / "log" / ".000000000098.ckpt.tmp-1a2b"  # what a killed write leaves
    ours_temp.write_bytes(b"half")
    ours.append(ours_temp)
    ours.sort()
    for path, data in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    dry = _ckptfs("forget", str(root), "r", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert sorted(doc["deleted"]) == sorted(str(p.relative_to(root)) for p in ours)
    assert {k["key"] for k in doc["kept"]} >= {
        "runs/r/notes/mine.txt", "runs/r/log/junkname", "runs/r/lease/my-notes.txt",
        "runs/r/lease/sub/deep.txt", "runs/r/my.tmp-backup", "runs/r/notes/draft.tmp-1"}
    done = _ckptfs("forget", str(root), "r")
    assert done.returncode == 0, done.stderr
    assert f"deleted {len(ours)} file(s)" in done.stdout
    assert "kept runs/r/notes/mine.txt" in done.stderr and "never deleted" in done.stderr
    for path, data in foreign.items():  # untouched
        assert path.read_bytes() == data
    assert not any(p.exists() for p in ours)
    listed = _ckptfs("runs", str(root), "--json")
    assert "r" not in [r["run_id"] for r in json.loads(listed.stdout).get("runs", [])]
