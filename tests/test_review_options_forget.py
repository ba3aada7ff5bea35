"""Hostile review of storage options nested deep and of `forget` on a store it cannot delete
from, through the real `ckptfs` executable.

Found:

* Options nested thousands deep ended in a RecursionError: from $CKPTFS_STORAGE_OPTIONS a raw
  traceback, exit 1, and no JSON document under --json (the log scrubber parsed the variable
  before the CLI's error handling); from `-o a.a.(...).b=1` or a TOML file "internal", exit 3.
  They are bad settings: exit 2, code "config", naming where they came from and the limit.
* `forget` on a read-only mount said exit 1 with its report ({ok: false, errors: [...]}, one
  error and one WARNING line per file) where `restore` and `mirror` into the same mount say
  "not-writable", exit 2, in the standard error document. A read-only folder of the run (which
  no look at the root tells) went on past it: a read-only `log/` left the journal records with
  their deltas and snapshots deleted.

Read-only folders bind even as root: the child drops CAP_DAC_OVERRIDE and friends first
(`_privileges.drop_dac`). The read-only store is a read-only bind mount where the test may
mount (root), else read-only permission bits: both are what `check_writable` sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _privileges import drop_dac
from test_review_prune_cli_hostile import DENSE, ckptfs

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.cli._logging import Scrubber
from ckptfs.errors import ConfigError
from ckptfs.replication.mirror import mirror
from ckptfs.replication.restore import restore
from ckptfs.storage.registry import open_storage

LIMIT = 32  # storage.options.MAX_OPTIONS_DEPTH, spelled out: the test pins the documented limit
DEEP = f"storage options nested deeper than {LIMIT} levels"
ERROR_SHAPE = {"command", "ok", "error", "exit_code"}
RUN = "papers"


def config_error(proc: subprocess.CompletedProcess[str], where: str) -> str:
    """The standard --json error document of a bad setting (exit 2, code config): its message."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    doc = json.loads(proc.stdout)
    assert set(doc) == ERROR_SHAPE and doc["ok"] is False and doc["exit_code"] == 2, doc
    assert doc["error"]["code"] == "config", doc
    message: str = doc["error"]["message"]
    assert f"nested deeper than {LIMIT} levels" in message and message.startswith(where), message
    return message


def nested_json(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


@pytest.fixture
def local_store(tmp_path: Path) -> Path:
    root = tmp_path / "plain"
    run = AgentRun(run_id=RUN, goal="g")
    run.add_step(Step(id="s", title="s"))
    with CheckpointStore(str(root)) as st:
        st.save_run(run)
    return root


@pytest.mark.parametrize("var", ["CKPTFS_STORAGE_OPTIONS", "CKPTFS_MIRROR_STORAGE_OPTIONS"])
@pytest.mark.parametrize("value", ["[" * 100_000, nested_json(LIMIT + 1)],
                         ids=["past-the-decoder", "one-level-too-deep"])
def test_deep_options_in_the_environment_are_a_config_error(local_store: Path, tmp_path: Path,
                                                            var: str, value: str) -> None:
    """Past what json.loads takes (a traceback before the fix, exit 1, stdout empty), or one
    level past the limit (accepted before): exit 2, code config, naming the variable."""
    proc = ckptfs("runs", local_store, "--json", cwd=tmp_path, env={var: value})
    config_error(proc, f"${var}: ")


def test_dotted_options_nest_up_to_the_limit_and_no_deeper(local_store: Path, tmp_path: Path) -> None:
    """`-o` keys of 32 parts are options; 33 parts and 1,000 parts (exit 3, "unexpected
    RecursionError", before the fix) are a config error naming the flag, for `-o` and for
    restore's --to-option alike."""
    ok = ckptfs("runs", local_store, "--json", "-o", "a." * (LIMIT - 1) + "b=1", cwd=tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["runs"][0]["run_id"] == RUN, ok.stdout
    for parts in (LIMIT + 1, 1000):
        key = "a." * (parts - 1) + "b=1"
        config_error(ckptfs("runs", local_store, "--json", "-o", key, cwd=tmp_path), "--storage-option a.a.")
        dst = tmp_path / f"copy{parts}"
        proc = ckptfs("restore", local_store, dst, "--run", RUN, "--json", "--to-option", key, cwd=tmp_path)
        config_error(proc, "--to-option a.a.")
        assert not dst.exists()


@pytest.mark.parametrize("options", ["x = " + "{a=" * 3000 + "1" + "}" * 3000,
                                     "x" + ".x" * LIMIT + " = 1"],
                         ids=["past-the-parser", "one-level-too-deep"])
def test_deep_options_in_a_config_file_are_a_config_error(local_store: Path, tmp_path: Path,
                                                          options: str) -> None:
    """Inline tables past tomllib's stack (exit 3 before the fix), or dotted keys one level past
    the limit (accepted before): exit 2, code config, naming the file."""
    conf = tmp_path / "deep.toml"
    conf.write_text(f'[store]\nurl = "{local_store}"\n[store.options]\n{options}\n')
    config_error(ckptfs("runs", "--config", conf, "--json", cwd=tmp_path), f"{conf}: ")


@pytest.mark.parametrize("url", ["LOCAL", "memory://deep-options", "s3://ckptfs-deep/p"])
def test_deep_options_from_python_are_a_config_error(tmp_path: Path, url: str) -> None:
    """`open_storage`, `CheckpointStore`, `mirror` and `restore` given options past the limit
    (or options that contain themselves) from Python code: a ConfigError naming the parameter,
    before any walk over them recursed (they were accepted, and failed as a RecursionError at
    the first redaction or scrub), and nothing created."""
    url = str(tmp_path / "store") if url == "LOCAL" else url
    deep: dict[str, Any] = {"x": 1}
    for _ in range(5000):
        deep = {"a": deep}
    loop: dict[str, Any] = {}
    loop["self"] = loop
    for options in (deep, loop):
        with pytest.raises(ConfigError, match=f"^storage_options: {DEEP}"):
            open_storage(url, options)
        with pytest.raises(ConfigError, match=DEEP):
            CheckpointStore(url, storage_options=options)
        with pytest.raises(ConfigError, match=DEEP):
            mirror("memory://deep-src", url, dst_options=options)
        with pytest.raises(ConfigError, match=DEEP):
            restore(url, str(tmp_path / "restored"), src_options=options)
    assert not (tmp_path / "store").exists() and not (tmp_path / "restored").exists()
    shallow: dict[str, Any] = {"x": 1}
    for _ in range(LIMIT - 1):
        shallow = {"a": shallow}
    open_storage(str(tmp_path / "ok"), shallow)  # the limit itself is fine


def test_the_scrubber_refuses_options_it_cannot_walk() -> None:
    """A caller that hands the scrubber options past the limit gets the config error, not a
    RecursionError (which a command reported as "internal", exit 3); the secrets of options
    within it are still learnt and hidden."""
    deep: dict[str, Any] = {"secret": "hunter2-deep"}
    for _ in range(5000):
        deep = {"a": deep}
    scrubber = Scrubber()
    with pytest.raises(ConfigError, match=DEEP):
        scrubber.add_options(deep)
    shallow: dict[str, Any] = {"secret": "hunter2-shallow"}
    for _ in range(LIMIT - 1):
        shallow = {"a": shallow}
    scrubber.add_options(shallow)
    assert scrubber.scrub("key hunter2-shallow") == "key ***"


# ------------------------------------------------------------------------------ forget


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run papers v1..v5: journal records 1-5, a delta 1-3, snapshots 1 and 4."""
    root = tmp_path_factory.mktemp("forget-ro") / "store"
    with CheckpointStore(str(root), policy=DENSE) as st:
        run = AgentRun(run_id=RUN, goal="g")
        for i in range(4):
            run.add_step(Step(id=f"s{i}", title=f"step {i}"))
        st.save_run(run)
        for i in range(4):
            step = run.steps[f"s{i}"]
            step.status, step.result = StepStatus.COMPLETED, f"r{i}"
            st.commit(run, [step])
    return root


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Iterator[Path]:
    """This test's copy; write permission given back afterwards."""
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    yield root
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def log(v: int) -> str:
    return f"runs/{RUN}/log/{v:012d}.ckpt"


@contextlib.contextmanager
def read_only(root: Path, tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None] | None]]:
    """(the store seen read-only, the children's preexec_fn): a read-only bind mount where this
    process may mount, else every folder without write permission, binding through drop_dac."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() == 0 and subprocess.run(["mount", "--bind", str(root), str(mnt)],
                                            capture_output=True).returncode == 0:
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], check=True, capture_output=True)
            yield mnt, None
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
        return
    for p in [root, *root.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    yield root, drop_dac


def test_forget_on_a_read_only_store_is_not_writable(store: Path, tmp_path: Path) -> None:
    """The same error `restore` into that store gives: exit 2, code not-writable, the standard
    document, no WARNING line per file; nothing deleted. `--dry-run` still says what it would do."""
    before = files(store)
    source = tmp_path / "source"
    shutil.copytree(store, source)
    with read_only(store, tmp_path) as (ro, preexec):
        proc = ckptfs("forget", ro, RUN, "--force", "--json", cwd=tmp_path, preexec=preexec)
        assert proc.returncode == 2, (proc.stdout[-1500:], proc.stderr[-1500:])
        doc = json.loads(proc.stdout)
        assert set(doc) == ERROR_SHAPE and doc["error"]["code"] == "not-writable", doc
        assert "no write permission" in doc["error"]["message"], doc
        assert "WARNING" not in proc.stderr, proc.stderr
        restore = ckptfs("restore", source, ro, "--run", RUN, "--json", cwd=tmp_path, preexec=preexec)
        assert restore.returncode == 2 and json.loads(restore.stdout)["error"]["code"] == "not-writable"
        dry = ckptfs("forget", ro, RUN, "--dry-run", "--json", cwd=tmp_path, preexec=preexec)
        assert dry.returncode == 0 and json.loads(dry.stdout)["files"] == len(before), dry.stdout
    assert files(store) == before


def test_forget_whose_first_delete_is_refused_deletes_nothing(store: Path, tmp_path: Path) -> None:
    """A read-only `log/` (the root is writable, so no look at it tells): the newest journal
    record is the first delete, refused. Before, the forget went on and deleted every delta and
    snapshot, leaving the journal records; now it is not-writable, exit 2, with nothing gone."""
    before = files(store)
    (store / "runs" / RUN / "log").chmod(0o555)
    proc = ckptfs("forget", store, RUN, "--json", cwd=tmp_path, preexec=drop_dac)
    assert proc.returncode == 2, (proc.stdout[-1500:], proc.stderr[-1500:])
    doc = json.loads(proc.stdout)
    assert set(doc) == ERROR_SHAPE and doc["error"]["code"] == "not-writable", doc
    assert log(5) in doc["error"]["message"], doc
    assert files(store) == before


def newest_first(root: Path) -> list[str]:
    """The run's files in the order `forget` deletes them: newest version first, at one
    version its journal record, then the deltas ending there, then its snapshot."""
    rank = {"log": 0, "delta": 1, "snap": 2}
    keys = [f for f in files(root) if f.startswith(f"runs/{RUN}/")]
    return sorted(keys, key=lambda k: (-int(k.rsplit("/", 1)[1].split(".")[0].split("-")[-1]),
                                       rank[k.split("/")[2]]))


def test_forget_refused_midway_stops_where_the_run_still_loads(store: Path, tmp_path: Path) -> None:
    """A read-only `snap/`: the files newer than the newest snapshot go, that snapshot is
    refused. Before, the forget went on past it (the delta and records 3..1 deleted, snapshot 1
    refused again: two errors, the run's history gone but for two snapshots). It stops at the
    refusal, exit 1 with its report; what is left loads at the snapshot's version, and verify
    finds it clean.

    The snapshot's version depends on the records' compressed sizes (compaction is scheduled by
    bytes, and timestamps move them by a byte): 4 most times, 3 now and then. CI once met 3 where
    this test spelled out 4; the expectation is therefore read from the fixture."""
    order = newest_first(store)
    snaps = [k for k in order if "/snap/" in k]
    assert snaps[-1] == f"runs/{RUN}/snap/{1:012d}.ckpt" and len(snaps) == 2, order
    cut = order.index(snaps[0])
    assert cut >= 2, order  # at least the newest record and one more go before the refusal
    newest_snap = int(snaps[0].rsplit("/", 1)[1].split(".")[0])
    (store / "runs" / RUN / "snap").chmod(0o555)
    proc = ckptfs("forget", store, RUN, "--json", cwd=tmp_path, preexec=drop_dac)
    assert proc.returncode == 1, (proc.stdout[-1500:], proc.stderr[-1500:])
    doc = json.loads(proc.stdout)
    assert doc["deleted"] == order[:cut] and doc["deleted"][0] == log(5), (doc, order)
    (error,) = doc["errors"]
    assert error.startswith(f"{snaps[0]}: ") and "Permission denied" in error, error
    assert files(store) == sorted(order[cut:])
    show = ckptfs("show", store, RUN, "--json", cwd=tmp_path)
    assert show.returncode == 0 and json.loads(show.stdout)["version"] == newest_snap, show.stdout[-800:]
    assert ckptfs("verify", store, "--json", cwd=tmp_path).returncode == 0
