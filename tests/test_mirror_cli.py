"""`ckptfs mirror` / `ckptfs restore` end to end over the moto server: output, JSON, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from _privileges import drop_dac
from test_cli_commands import CLI, cli
from test_mirror import POLICY, RUN, work

from backends.s3.embedded import EmbeddedS3, free_port
from ckptfs import CheckpointStore
from ckptfs.cli import main
from ckptfs.config import ENV_VARS


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in [*ENV_VARS, "CKPTFS_CONFIG"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # no config/ckptfs.toml here


def test_mirror_and_restore_commands(tmp_path: Path, s3: EmbeddedS3, s3_url: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    src = str(tmp_path / "src")
    store = CheckpointStore(src, policy=POLICY, artifact_threshold=1024)
    work(store, RUN, 20)
    ep = ["--mirror-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    assert main(["mirror", src, s3_url, "--every-n", "5", "--keep-last", "2", "--json", *ep]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["runs"][0]["status"] == "mirrored" and doc["copied"] > 0
    assert main(["mirror", src, s3_url, "--once", *ep]) == 0
    out, err = capsys.readouterr()
    assert "up-to-date" in out and "objects" in err  # table on stdout, progress on stderr
    dst = str(tmp_path / "restored")
    assert main(["restore", s3_url, dst, "--run", RUN, "--json", *ep]) == 0
    rdoc = json.loads(capsys.readouterr().out)
    assert rdoc["ok"] and rdoc["runs"][0]["status"] == "restored"
    assert CheckpointStore(dst).load_run(RUN) == store.load_run(RUN)
    # a version the mirror holds no file of: bad input, exit 2, and the restore points are named
    assert main(["restore", s3_url, str(tmp_path / "x"), "--run", RUN, "--version", "2", "--json",
                 *ep]) == 2
    bad = json.loads(capsys.readouterr().out)
    assert not bad["ok"] and bad["error"]["code"] == "not-found"
    assert "has no version 2" in bad["error"]["message"] and "a restore can target" in bad["error"]["message"]
    assert not (tmp_path / "x").exists()


def test_usage_errors_and_unreachable_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, m = str(tmp_path / "src"), str(tmp_path / "m")
    assert main(["mirror", src]) == 2
    assert "no mirror destination" in capsys.readouterr().err
    assert main(["restore", m, src, "--version", "3"]) == 2
    assert "--version needs --run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["mirror", src, m, "--every-n", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["mirror", src, m, "--interval", "5m", "--cron", "* * * * *"])
    assert exc.value.code == 2
    assert main(["mirror", src, m, "--interval", "soon"]) == 2
    # nothing stored at SRC: exit 2 before anything is sent
    assert main(["mirror", src, m, "--once", "--no-progress"]) == 2
    assert "nothing is stored at" in capsys.readouterr().err
    assert not Path(m).exists()
    work(CheckpointStore(src, policy=POLICY, artifact_threshold=1024), RUN, 3)
    port = free_port()
    code = main(["mirror", src, "s3://ckptfs-x/m", "--attempts", "1", "--no-progress",
                 "--mirror-option", f"client_kwargs.endpoint_url=http://127.0.0.1:{port}",
                 "--mirror-option", "config_kwargs.retries.max_attempts=1"])
    assert code == 2
    assert "s3://ckptfs-x/m" in capsys.readouterr().err.replace("\n", "")
    assert main(["mirror", src, "memory://m", "--mirror-option", "novalue"]) == 2
    assert "--mirror-option must be KEY=VALUE" in capsys.readouterr().err


def test_mirror_defaults_come_from_the_config_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    src = str(tmp_path / "src")
    work(CheckpointStore(src, policy=POLICY, artifact_threshold=1024), RUN, 6)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{src}"\n[mirror]\nurl = "{tmp_path / "m"}"\nevery_n = 1\n')
    assert main(["mirror", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["status"] == "mirrored"
    assert CheckpointStore(str(tmp_path / "m")).load_run(RUN) is not None


def test_a_mirror_holding_another_stores_history_of_a_run_is_a_conflict(tmp_path: Path) -> None:
    """Two stores with one run id (the run restored from the mirror and continued there, the
    original machine not lost after all), both mirrored to one URL. The pass of the store the
    mirror's newest point did not come from saw a different file at that key, then called the
    run not-due (exit 0): a restore from that mirror brings back the other store's run."""
    import subprocess
    import sys

    from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

    def history(url: str, result: str) -> None:
        with CheckpointStore(url) as store:
            run = AgentRun(run_id="shared", goal="g", created_at=0.0, updated_at=0.0)
            for i in range(3):
                run.add_step(Step(id=f"s{i}", title=f"s{i}"))
            store.save_run(run)
            for i in range(3):
                step = run.steps[f"s{i}"]
                step.status, step.result = StepStatus.COMPLETED, f"{result} {i}"
                store.commit(run, [step])

    a, b, m = (str(tmp_path / n) for n in ("a", "b", "mirror"))
    history(a, "from a")
    history(b, "from b")
    cli = str(Path(sys.executable).parent / "ckptfs")
    first = subprocess.run([cli, "mirror", b, m, "--once", "--no-progress"], capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    got = subprocess.run([cli, "mirror", a, m, "--once", "--no-progress", "--json"],
                         capture_output=True, text=True, timeout=60)
    doc = json.loads(got.stdout)
    assert got.returncode == 1, got.stdout  # was 0, status not-due
    assert doc["runs"][0]["status"] == "conflict" and "different file" in doc["runs"][0]["error"]
    assert CheckpointStore(m).load_run("shared").steps["s0"].result == "from b 0"  # untouched
    again = subprocess.run([cli, "mirror", b, m, "--once", "--no-progress"], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and "up-to-date" in again.stdout, again.stdout


def test_a_mirror_behind_with_another_stores_history_is_a_conflict_before_it_is_due(
        tmp_path: Path) -> None:
    """The store moved 3 versions past a mirror holding another store's history of the run,
    with --every-n 10: the pass called the run not-due (exit 0) without looking at the
    mirror's file, and kept saying so until the run was due, while a restore from the mirror
    brought back the other store's run. The mirror's newest file is checked on every pass."""
    import sys

    from ckptfs import AgentRun, Step, StepStatus

    def history(url: str, result: str, steps: int) -> None:
        with CheckpointStore(url) as store:
            run = AgentRun(run_id="shared", goal="g", created_at=0.0, updated_at=0.0)
            for i in range(steps):
                run.add_step(Step(id=f"s{i}", title=f"s{i}"))
            store.save_run(run)
            for i in range(steps):
                step = run.steps[f"s{i}"]
                step.status, step.result = StepStatus.COMPLETED, f"{result} {i}"
                store.commit(run, [step])

    a, b, m = (str(tmp_path / n) for n in ("a", "b", "mirror"))
    history(a, "from a", 6)
    history(b, "from b", 3)
    cli = str(Path(sys.executable).parent / "ckptfs")
    first = subprocess.run([cli, "mirror", b, m, "--once", "--no-progress"], capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    for _ in range(2):  # the second pass is a job's next tick: still a conflict, not remembered away
        got = subprocess.run([cli, "mirror", a, m, "--once", "--no-progress", "--every-n", "10",
                              "--json"], capture_output=True, text=True, timeout=60)
        doc = json.loads(got.stdout)
        assert got.returncode == 1, got.stdout  # was 0, status not-due
        assert doc["runs"][0]["status"] == "conflict", doc
        assert "different file" in doc["runs"][0]["error"]
    assert CheckpointStore(m).load_run("shared").steps["s0"].result == "from b 0"  # untouched
    with CheckpointStore(b) as store:  # the mirror's own lineage moves on: not due, no conflict
        run = store.load_run("shared")
        step = Step(id="s3", title="s3")
        run.add_step(step)
        step.status, step.result = StepStatus.COMPLETED, "from b 3"
        store.commit(run, [step])
    same = subprocess.run([cli, "mirror", b, m, "--once", "--no-progress", "--every-n", "10",
                           "--json"], capture_output=True, text=True, timeout=60)
    assert same.returncode == 0, same.stdout
    assert json.loads(same.stdout)["runs"][0]["status"] == "not-due"


def test_a_memory_destination_is_refused_by_the_executable(tmp_path: Path) -> None:
    """`ckptfs mirror SRC memory://m` printed a table of files mirrored, exit 0, and
    `ckptfs restore MIRROR memory://r` said the run was restored: each process's memory:// is its
    own and ends with it, so nothing was kept. Both are bad input now (exit 2, one line naming
    the URL and where it came from), refused before anything is read or sent."""
    src, mirror_dir = tmp_path / "src", tmp_path / "mirror"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), RUN, 3)
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    code, out, err = cli("mirror", str(src), "memory://m", "--once", "--no-progress")
    assert code == 2 and "memory://m is this process's memory" in err and "mirror" in err, (out, err)
    assert out == "", out
    config = tmp_path / "ckptfs.toml"
    config.write_text('[mirror]\nurl = "memory://from-config"\n')
    code, out, err = cli("mirror", str(src), "--once", "--no-progress", "--config", str(config))
    assert code == 2 and "memory://from-config (from" in err and "mirror.url" in err, (out, err)
    # the real chain still works beside it: mirror to a directory, restore from it
    assert cli("mirror", str(src), str(mirror_dir), "--once", "--no-progress")[0] == 0
    code, out, err = cli("restore", str(mirror_dir), "memory://r", "--no-progress", "--json")
    assert code == 2, (out, err)
    doc = json.loads(out)
    assert not doc["ok"] and "memory://r is this process's memory" in doc["error"]["message"]
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before  # SRC untouched
    code, out, err = cli("restore", str(mirror_dir), str(tmp_path / "back"), "--no-progress")
    assert code == 0, (out, err)
    assert CheckpointStore(str(tmp_path / "back")).load_run(RUN) == CheckpointStore(str(src)).load_run(RUN)


def test_a_read_only_destination_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """`ckptfs restore MIRROR DIR` into an existing directory this user cannot write printed a
    table, then one 'cannot write' line per file of the run (every artifact, every version),
    exit 1. Now, before anything is read from the mirror: one line naming the directory, exit 2,
    JSON code not-writable; the directory stays empty. `mirror` into one likewise. Permission
    bits bind the child even when the suite runs as root (drop_dac)."""
    src, mirror_dir, ro = tmp_path / "src", tmp_path / "mirror", tmp_path / "ro"
    work(CheckpointStore(str(src), policy=POLICY, artifact_threshold=1024), RUN, 3)
    assert cli("mirror", str(src), str(mirror_dir), "--once", "--no-progress")[0] == 0
    ro.mkdir()
    ro.chmod(0o555)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    try:
        for argv in (["restore", str(mirror_dir), str(ro)], ["mirror", str(src), str(ro), "--once"]):
            got = subprocess.run([CLI, *argv, "--no-progress", "--json"], capture_output=True, text=True,
                                 timeout=60, preexec_fn=drop_dac, env=env, cwd=tmp_path)
            assert got.returncode == 2, (argv, got.stdout, got.stderr)
            assert got.stderr.strip().splitlines() == [
                f"error: {ro}: no write permission on {ro} (a read-only directory or filesystem, "
                "or not this user's?)"], got.stderr
            doc = json.loads(got.stdout)
            assert doc["error"]["code"] == "not-writable" and doc["exit_code"] == 2, doc
            assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
    code, out, err = cli("restore", str(mirror_dir), str(ro), "--no-progress")  # writable again
    assert code == 0, (out, err)
    assert CheckpointStore(str(ro)).load_run(RUN) == CheckpointStore(str(src)).load_run(RUN)
