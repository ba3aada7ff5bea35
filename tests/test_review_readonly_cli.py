"""A hostile user's review of the read-only commands (show, versions, diff, export, runs) through
the real `ckptfs` executable: damaged versions, an unlistable run, ints the library stores but
whose sums no longer print, and the loader's warnings about what it finally loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import _cli_store
import pytest
from _cli_store import RUN, flip, log_file
from _privileges import drop_dac
from test_cli_commands import CLI, QUIET_CWD, cli

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import CheckpointCorruptError

pristine, store = _cli_store.pristine, _cli_store.store  # fixtures: the store, a copy per test


def test_a_damaged_version_asked_for_is_named_not_the_whole_run(store: Path) -> None:
    """`show --version 17` with v17 damaged said "no stored version could be loaded", while
    v1..v16 load: the message must name the version asked for, and the run loads without it."""
    flip(log_file(store, 17))
    for cmd in (["show", str(store), RUN, "--version", "17"], ["export", str(store), RUN, "--version", "17"],
                ["diff", str(store), RUN, "16", "17"]):
        code, out, _ = cli(*cmd, "--json")
        doc = json.loads(out)
        assert code == 1 and doc["error"]["code"] == "corrupt", (cmd, out)
        message = doc["error"]["message"]
        assert "version 17" in message and "no stored version could be loaded" not in message, message
        assert "000000000017.ckpt" in message
    code, out, _ = cli("show", str(store), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == 16


def test_an_unreadable_version_is_no_restore_point(store: Path) -> None:
    """`versions` listed a version whose every file fails to decode as one a restore can target."""
    flip(log_file(store, 17))
    code, out, _ = cli("versions", str(store), RUN, "--json")
    doc = json.loads(out)
    assert code == 0
    v17 = next(v for v in doc["versions"] if v["version"] == 17)
    assert v17["readable"] is False and v17["restore_point"] is False
    assert 17 not in doc["restore_points"]
    # the points are exactly the versions a load reaches: every one before v17 (a chain from
    # v0 and snapshots 3..15), where by names only v15 and v16 (from the newest snapshot) were
    loads = CheckpointStore(str(store))
    for v in (i["version"] for i in doc["versions"]):
        try:
            loads.load_run(RUN, version=v)
        except CheckpointCorruptError:
            assert v not in doc["restore_points"], v
        else:
            assert v in doc["restore_points"], v
    assert doc["restore_points"] == list(range(1, 17)), doc["restore_points"]
    code, out, _ = cli("versions", str(store), RUN)
    assert code == 0 and "a restore can target 16: v1" in out, out


def test_no_warning_claims_a_version_the_load_did_not_end_at(store: Path) -> None:
    """A damaged newest snapshot: the first, quick load (from that snapshot) failed and warned
    "loaded version 12 after skipping ...", then the full load gave v17, and show printed v17."""
    flip(store / "runs" / RUN / "snap" / f"{15:012d}.ckpt")
    code, out, err = cli("show", str(store), RUN)
    assert code == 0 and f"{RUN} failed v17" in out
    assert "loaded version 17 after skipping" in err
    assert "loaded version 12" not in err, err


def _damage_five(root: Path) -> None:
    """Snapshot 15 and logs 14..17 damaged: the load ends at v13, having skipped five files."""
    flip(root / "runs" / RUN / "snap" / f"{15:012d}.ckpt")
    for version in (14, 15, 16, 17):
        flip(log_file(root, version))


def test_the_load_warning_says_how_many_skips_it_leaves_out(store: Path) -> None:
    """The load's one warning names at most three skipped files: five skipped read as three,
    nothing said there were more. It says '+N more', as the corrupt-run error does."""
    _damage_five(store)
    code, out, err = cli("show", str(store), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == 13, err[-500:]
    (line,) = [ln for ln in err.splitlines() if "loaded version 13" in ln]
    assert "after skipping" in line and "; (+2 more)" in line, line
    assert line.count(".ckpt:") == 3, line


def test_the_load_warning_of_the_library_says_how_many_more(store: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The same warning, logged by `load_run` for a program that calls the library."""
    _damage_five(store)
    with caplog.at_level("WARNING", logger="ckptfs.store.loader"):
        run = CheckpointStore(str(store)).load_run(RUN)
    assert run is not None
    (message,) = [r.getMessage() for r in caplog.records if r.name == "ckptfs.store.loader"]
    assert message.startswith(f"run {RUN}: loaded version 13 after skipping: ") and \
        message.endswith("; (+2 more)"), message


def test_a_damaged_file_is_one_warning_at_default_verbosity_not_one_per_attempt(store: Path) -> None:
    """The reader logged 'skipping <file>' at WARNING each time a load attempt read the file:
    snapshot 15 and v17 damaged gave four such lines beside the load's own warning. The load's
    one warning names both; the per-file lines are -v's."""
    flip(store / "runs" / RUN / "snap" / "000000000015.ckpt")
    flip(log_file(store, 17))
    code, out, err = cli("show", str(store), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == 16, err[-500:]
    warnings = [ln for ln in err.splitlines() if ln.startswith("WARNING")]
    assert len(warnings) == 1 and "loaded version 16 after skipping" in warnings[0], err
    assert "000000000015.ckpt" in warnings[0] and "000000000017.ckpt" in warnings[0], warnings[0]
    code, _, err = cli("-v", "show", str(store), RUN, "--json")
    assert code == 0 and "skipping runs/papers/log/000000000017.ckpt" in err, err[-800:]


def test_runs_reports_an_unlistable_run_and_lists_the_others(store: Path) -> None:
    """A run directory this user cannot list made `runs` fail as a whole ("unreachable", exit 2),
    hiding every other run: it is one row with the reason, and the exit code says problems."""
    (store / "runs" / "finished").chmod(0)
    try:
        proc = subprocess.run([CLI, "runs", str(store), "--json"], capture_output=True, text=True,
                              timeout=60, cwd=QUIET_CWD, preexec_fn=drop_dac,
                              env={k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")})
    finally:
        (store / "runs" / "finished").chmod(0o755)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    rows = {r["run_id"]: r for r in doc["runs"]}
    assert rows[RUN]["status"] == "failed" and rows[RUN]["version"] == 17
    assert rows["finished"]["status"] == "unreadable" and "Permission denied" in rows["finished"]["error"]
    assert "Traceback" not in proc.stderr


def test_totals_past_python_int_digits_limit_still_print(tmp_path: Path) -> None:
    """Each step's tokens is at the 4,300-digit limit a commit accepts; their sum is one digit
    more, and `show --json` and `export` stopped with "unexpected ValueError" (exit 3)."""
    root = tmp_path / "big"
    store = CheckpointStore(str(root))
    run = AgentRun(run_id="big", goal="huge counters")
    big = int("9" * 4300)
    for i in range(2):
        run.add_step(Step(id=f"s{i}", title="t"))
    store.save_run(run)
    for sid in run.steps:
        step = run.steps[sid]
        step.status, step.result, step.tokens = StepStatus.COMPLETED, "ok", big
        store.commit(run, [step])
    store.close()
    code, out, err = cli("show", str(root), "big", "--json")
    assert code == 0, err
    assert _digits(json.loads(out, parse_int=str)["totals"]["step_tokens"])
    code, out, err = cli("export", str(root), "big")
    assert code == 0, err
    assert _digits(json.loads(out, parse_int=str)["totals"]["step_tokens"])
    target = tmp_path / "export.json"
    code, _, err = cli("export", str(root), "big", "--output", str(target))
    assert code == 0, err
    assert _digits(json.loads(target.read_text(), parse_int=str)["totals"]["step_tokens"])


def _digits(text: str) -> bool:
    """2 * (10**4300 - 1), spelled out (json.loads cannot turn it into an int by default)."""
    return text == "1" + "9" * 4299 + "8"


def test_control_characters_in_stored_text_are_shown_not_sent(tmp_path: Path) -> None:
    """A goal, title, result or error is data (an LLM's reply, often): an escape sequence in
    it reached the terminal as it was (`\\x1b]0;...` retitles the window, `\\x1b[2J` clears
    it), in show's header, table and --step view and in runs' table. Shown escaped instead."""
    root = tmp_path / "esc"
    store = CheckpointStore(str(root))
    run = AgentRun(run_id="esc", goal="evil \x1b]0;PWNED\x07 goal \x1b[31mred")
    run.add_step(Step(id="s0", title="title \x1b[2J"))
    store.save_run(run)
    step = run.steps["s0"]
    step.status, step.result, step.error = StepStatus.COMPLETED, "res \x1b[41mBG\x9b2J", "err \x1b[5m"
    store.commit(run, [step])
    store.close()
    for cmd in (["show", str(root), "esc"], ["show", str(root), "esc", "--step", "s0"], ["runs", str(root)],
                ["versions", str(root), "esc"], ["diff", str(root), "esc", "1", "2"]):
        code, out, err = cli(*cmd)
        assert code == 0, (cmd, err)
        assert "\x1b" not in out and "\x9b" not in out, (cmd, out)
    code, out, _ = cli("show", str(root), "esc", "--step", "s0")
    assert "res \\x1b[41mBG\\x9b2J" in out and "err \\x1b[5m" in out and "title \\x1b[2J" in out
    code, out, _ = cli("show", str(root), "esc", "--json")  # --json keeps the text as stored
    assert json.loads(out)["goal"] == "evil \x1b]0;PWNED\x07 goal \x1b[31mred"


def test_a_skipped_file_whose_reason_looks_like_markup_is_printed_as_it_is(store: Path) -> None:
    """A record that decodes (checksums, chain) but whose state does not validate is skipped
    with pydantic's message, which quotes the stored value: "[/oops]" in it was read as a rich
    closing tag by show's "note: skipped: ..." line, and show ended "unexpected MarkupError" (exit 3)."""
    from ckptfs.format import codec

    path = log_file(store, 17)
    rec = codec.decode(path.read_bytes(), "k")
    body = dict(rec.body)
    body["steps"]["paper-5"]["status"] = "[/oops] [bold]x"
    body_json = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    sha = codec.sha256_hex(body_json)
    header = rec.header.model_copy(update={
        "body_sha256": sha, "hash": codec.chain_hash(rec.header.base_hash, sha, rec.header.version)})
    path.write_bytes(codec.encode(header, body_json))
    code, out, err = cli("show", str(store), RUN)
    assert code == 0, err
    assert f"{RUN} running v16" in out and "[/oops] [bold]x" in err[err.index("note: skipped:"):]
    code, out, err = cli("show", str(store), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == 16


def test_times_no_calendar_holds_are_shown_not_a_crash(tmp_path: Path) -> None:
    """A step's started_at / completed_at are the caller's floats, and a commit takes -1e300:
    `show --step` ended "unexpected OverflowError: timestamp out of range" (exit 3)."""
    root = tmp_path / "ts"
    store = CheckpointStore(str(root))
    run = AgentRun(run_id="ts", goal="g")
    run.add_step(Step(id="s0", title="t"))
    store.save_run(run)
    step = run.steps["s0"]
    step.status, step.result, step.started_at, step.completed_at = StepStatus.COMPLETED, "ok", -1e300, 1e300
    store.commit(run, [step])
    store.close()
    code, out, err = cli("show", str(root), "ts", "--step", "s0")
    assert code == 0, err
    assert "started -1e+300" in out and "finished 1e+300" in out, out


def _rewrite_header(path: Path, **fields: object) -> None:
    """A record whose checksums and chain hash agree, with header fields as given (a file
    another writer, or an attacker with write access, made)."""
    from ckptfs.format import codec

    rec = codec.decode(path.read_bytes(), "k")
    body_json = json.dumps(rec.body, sort_keys=True, separators=(",", ":")).encode()
    sha = codec.sha256_hex(body_json)
    h = rec.header
    header = h.model_copy(update={"body_sha256": sha, "hash": codec.chain_hash(h.base_hash, sha, h.version),
                                  **fields})
    path.write_bytes(codec.encode(header, body_json))


def test_versions_survives_header_summaries_and_times_of_any_shape(store: Path) -> None:
    """`versions` prints each version's header summary and time as they are: a summary whose
    "failed" is a string ended it "unexpected ValueError: Cannot specify ',' with 's'" and a
    time of 1e300 "unexpected OverflowError" (exit 3); they are shown as unknown / as numbers."""
    _rewrite_header(log_file(store, 16),
                    summary={"status": ["x"], "completed": "a", "failed": "zz", "total": [1]})
    _rewrite_header(log_file(store, 14), time=1e300)
    code, out, err = cli("versions", str(store), RUN)
    assert code == 0, err
    row16 = next(line for line in out.splitlines() if line.split()[:1] == ["16"])
    assert row16.split()[1:2] == ["log"] and " - " in row16
    assert "1e+300" in next(line for line in out.splitlines() if line.split()[:1] == ["14"])
    code, out, err = cli("versions", str(store), RUN, "--json")
    assert code == 0, err
    v16 = next(v for v in json.loads(out)["versions"] if v["version"] == 16)
    assert (v16["status"], v16["completed"], v16["failed"], v16["total"]) == (None, None, None, None)


def test_export_refuses_an_output_inside_the_store_and_writes_nothing(store: Path, tmp_path: Path) -> None:
    """`export --output` naming a file of the store (a typo, a tab-completed path) replaced that
    version's journal record with JSON: v17 was gone. Refused as bad input, the store unchanged,
    through a symlink to the store too; a path outside it still gets the export."""
    record = log_file(store, 17)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    link = tmp_path / "via-link"
    link.symlink_to(store)
    for given in (record, store / "export.json", link / "runs" / RUN / "x.json"):
        code, out, _ = cli("export", str(store), RUN, "--output", str(given), "--json")
        doc = json.loads(out)
        assert code == 2 and doc["error"]["code"] == "usage", (given, out)
        assert "inside the store" in doc["error"]["message"]
    after = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    assert after == before
    outside = tmp_path / "export.json"
    code, _, _ = cli("export", str(store), RUN, "--output", str(outside))
    assert code == 0 and json.loads(outside.read_text())["version"] == 17


def test_a_run_whose_log_is_a_symlink_is_listed_and_named_not_hidden(store: Path, tmp_path: Path) -> None:
    """A run directory whose `log/` is a symlink (never followed: it could lead out of the store)
    vanished from `runs` and `show` said only "not found": the run is listed as unreadable
    (exit 1) and every command that names it says what stands there. An empty run directory
    (a forget cut short) and one holding only files that are not ckptfs's (what a forget keeps)
    are no run, and change nothing."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(store / "runs" / RUN / "log", elsewhere)
    (store / "runs" / "linked").mkdir()
    (store / "runs" / "linked" / "log").symlink_to(elsewhere)
    (store / "runs" / "empty").mkdir()
    (store / "runs" / "kept" / "log").mkdir(parents=True)
    (store / "runs" / "kept" / "log" / "notes.txt").write_text("mine")
    code, out, _ = cli("runs", str(store), "--json")
    rows = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert code == 1 and rows["linked"]["status"] == "unreadable", out
    assert "runs/linked/log: not a directory" in rows["linked"]["error"]
    assert "symlink" in rows["linked"]["error"]
    assert "empty" not in rows and "kept" not in rows and rows[RUN]["completed_steps"] > 0
    code, _, err = cli("runs", str(store))
    assert code == 1 and "linked: runs/linked/log: not a directory" in " ".join(err.split())
    for cmd in ("show", "versions", "export"):
        code, out, _ = cli(cmd, str(store), "linked", "--json")
        doc = json.loads(out)
        assert code == 2 and doc["error"]["code"] == "not-found", (cmd, out)
        assert "; runs/linked/log: not a directory" in doc["error"]["message"], (cmd, out)
    for run in ("empty", "kept"):
        code, out, _ = cli("show", str(store), run, "--json")
        assert code == 2 and json.loads(out)["error"]["message"] == f"run {run!r} not found in {store}"
    shutil.rmtree(store / "runs" / "linked")
    code, out, _ = cli("runs", str(store), "--json")
    assert code == 0 and {"empty", "kept"}.isdisjoint(r["run_id"] for r in json.loads(out)["runs"])


def test_one_damaged_artifact_is_named_once_not_once_per_version_tried(store: Path, tmp_path: Path) -> None:
    """Every version from the one that first holds an artifact on fails when its bytes are
    damaged: export's `skipped` listed the same reason 42 times and stderr held 49 warning
    lines. One reason, one warning, and the load is the version before the artifact."""
    (artifact,) = [p for p in (store / "artifacts").rglob("*") if p.is_file()]
    flip(artifact)
    key = artifact.relative_to(store).as_posix()
    target = tmp_path / "export.json"
    code, _, err = cli("export", str(store), RUN, "--output", str(target))
    doc = json.loads(target.read_text())
    assert code == 0 and len(doc["skipped"]) == 1 and key in doc["skipped"][0], doc["skipped"]
    assert err.count(key) == 1 and "loaded version" in err, err
    code, out, _ = cli("show", str(store), RUN, "--json")
    assert code == 0 and json.loads(out)["version"] == doc["version"] < 17


def test_an_output_directory_that_cannot_be_written_is_refused_before_the_load(store: Path,
                                                                                 tmp_path: Path) -> None:
    """`export --output` into a directory this user cannot write read the whole run first and
    only then failed: it is refused up front (exit 2, not-writable), which shows in that a run
    that does not exist is not even looked for, and a damaged version is never read."""
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    flip(log_file(store, 17))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    try:
        for run in (RUN, "no-such-run"):
            proc = subprocess.run([CLI, "export", str(store), run, "--output", str(readonly / "x.json"),
                                   "--json"], capture_output=True, text=True, timeout=60,
                                  cwd=QUIET_CWD, preexec_fn=drop_dac, env=env)
            doc = json.loads(proc.stdout)
            assert proc.returncode == 2 and doc["error"]["code"] == "not-writable", (run, proc.stdout)
            assert str(readonly) in doc["error"]["message"]
            assert "loaded version" not in proc.stderr and "skipping" not in proc.stderr, proc.stderr
    finally:
        readonly.chmod(0o755)
    assert list(readonly.iterdir()) == []
