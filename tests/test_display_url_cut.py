"""A store's name, as the CLI's words and titles give it, is cut where the storage makes it
(`Storage.display_name`: `display_url` through `name_cut`).

The last change cut the names `open_storage` and the option checks print, but `threads`,
`runs`, `show`, `versions`, `diff`, `export`, `verify`, `prune`, `forget` and the mirror's
titles still printed `display_url` whole: a store under a 3,700-character path, or an S3
prefix of 5,000 characters, made each title, "not found" and summary that long (a title
wrapped over twenty lines). The JSON documents keep the redacted URL whole ("url", "src",
"dst"): a script matches it against the URL it gave; a cut one names no store.

A URL the OS refuses (a path past PATH_MAX) and one with credentials in it still make one
short error, and no credential, from the URL or the options, is ever printed.
The tests drive the real `ckptfs`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from test_review_prune_cli_hostile import CLI, ckptfs

from backends.s3.embedded import EmbeddedS3
from ckptfs import AgentRun, CheckpointStore, Step, StepStatus
from ckptfs.errors import name_cut
from ckptfs.storage.redact import redact_url
from ckptfs.storage.registry import open_storage

MAX_LINE = 600  # far above a cut name (160 and its length), far below a name of thousands
MAX_OUTPUT = 2500  # a whole command's output: a name wrapped over many lines is no cut
LOCAL_CHARS = 3700  # an existing store's path: short of PATH_MAX (4096), with room for its keys
LONG = 5000

KEY_ID = "AKIADISPLAYCUT7KEYID"
SECRET = "Display+Cut/Secret0Value"  # fake, with the '/' and '+' an AWS secret may hold
SECRETS = (KEY_ID, SECRET)


class _State(TypedDict):
    count: int


def _fill(url: str, options: dict[str, Any], stray: Any) -> None:
    """Run `r` at v1 and v2, LangGraph thread `t1`, and a stray run directory `runs/.snapshot`
    (`runs` warns naming the store, `verify` reports it: its table has a title)."""
    with CheckpointStore(url, storage_options=options) as store:
        run = AgentRun(run_id="r", goal="g")
        run.add_step(Step(id="s", title="s"))
        store.save_run(run)
        run.steps["s"].status, run.steps["s"].result = StepStatus.COMPLETED, "ok"
        store.commit(run, [run.steps["s"]])
    from langgraph.graph import START, StateGraph

    from ckptfs.integrations.langgraph import CkptfsSaver

    builder = StateGraph(_State)
    builder.add_node("inc", lambda s: {"count": s["count"] + 1})
    builder.add_edge(START, "inc")
    with CkptfsSaver(url, options) as saver:
        builder.compile(checkpointer=saver).invoke(
            {"count": 0}, {"configurable": {"thread_id": "t1"}}, durability="sync")
    stray()


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("display-cut")
    while len(str(root)) < LOCAL_CHARS:
        root /= "d" * 200  # each folder short of NAME_MAX
    root.mkdir(parents=True)

    def stray() -> None:
        (root / "runs" / ".snapshot").mkdir()
        (root / "runs" / ".snapshot" / "x").write_text("not ours")

    _fill(f"file://{root}", {}, stray)
    return root


@pytest.fixture
def s3_store(s3: EmbeddedS3) -> tuple[str, dict[str, str]]:
    """A store under a 5,000-character prefix, its credentials given as options (never in
    the URL): the URL and the env that opens it."""
    url = s3.url("p" * LONG)
    options = {**s3.storage_options, "key": KEY_ID, "secret": SECRET}

    def stray() -> None:
        storage = open_storage(url, options)
        storage.put("runs/.snapshot/x", b"not ours")
        storage.close()

    _fill(url, options, stray)
    return url, {"CKPTFS_STORAGE_OPTIONS": json.dumps(options)}


def _check(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """Exit code as expected; every line, and the whole output, short; no credential."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, (proc.returncode, text[:1000])
    for secret in SECRETS:
        assert secret not in text, text[:1000]
    longest = max((len(line) for line in text.splitlines()), default=0)
    assert longest < MAX_LINE, (longest, text[:1000])
    assert len(text) < MAX_OUTPUT, (len(text), text[:1000])
    return text


def _flat(text: str) -> str:
    """Text with no whitespace: a title or a line the terminal's width wrapped, as one."""
    return "".join(text.split())


def _check_json_error(proc: subprocess.CompletedProcess[str], code: int, kind: str) -> str:
    """With --json an error is a document: its message is as short as the line's."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[:500], proc.stderr[:500])
    doc = json.loads(proc.stdout)
    message: str = doc["error"]["message"]
    assert doc["error"]["code"] == kind and doc["exit_code"] == code, doc["error"]
    assert len(message) < MAX_LINE, (len(message), message[:1000])
    for secret in SECRETS:
        assert secret not in proc.stdout + proc.stderr
    assert all(len(line) < MAX_LINE for line in proc.stderr.splitlines()), proc.stderr[:1000]
    return message


# (argv after the URL, exit code): each prints the store's name, in a title or a message
SUCCESS = [
    (["runs"], 0),  # the title, the stray's warning, the "ckptfs threads" hint
    (["threads"], 0),
    (["show", "--thread", "t1"], 0),
    (["versions", "r"], 0),
    (["verify"], 1),  # the stray is a warning: the findings table's title
    (["prune", "--keep-last", "1", "--dry-run"], 1),  # the stray is a problem: skipped
    (["forget", "r", "--dry-run", "--force"], 0),  # --force: on S3, r was just written
]
# (argv after the URL, exit code, error code)
ERRORS = [
    (["show", "--thread", "nope"], 2, "not-found"),
    (["show", "nope"], 2, "not-found"),
    (["show", "r", "--version", "99"], 2, "not-found"),
    (["versions", "nope"], 2, "not-found"),
    (["diff", "r", "1", "99"], 2, "not-found"),
    (["export", "nope"], 2, "not-found"),
    (["forget", "nope"], 2, "not-found"),
    (["verify", "--run", "nope"], 2, "not-found"),
    (["prune", "--keep-last", "1", "--run", "nope"], 2, "not-found"),
]


def _refused_urls(tmp_path: Path) -> list[str]:
    """A path the OS refuses (past PATH_MAX), one folder past NAME_MAX, and an S3 URL with
    credentials in it: each refused before anything is read."""
    return [f"file://{tmp_path}" + ("/" + "e" * 200) * 25,
            f"file://{tmp_path}/" + "f" * LONG,
            f"s3://{KEY_ID}:{SECRET}@ckptfs-test/" + "p" * LONG]


@pytest.mark.parametrize(("argv", "code"), SUCCESS)
def test_a_long_local_store_is_named_cut(local_store: Path, tmp_path: Path, argv: list[str],
                                         code: int) -> None:
    url = f"file://{local_store}"
    _check(ckptfs(argv[0], url, *argv[1:], cwd=tmp_path), code)
    for refused in _refused_urls(tmp_path):  # the same command, refused: one short line
        text = _check(ckptfs(argv[0], refused, *argv[1:], cwd=tmp_path), 2)
        assert text.startswith(f"error: {name_cut(redact_url(refused))}"), text[:500]


@pytest.mark.parametrize("flags", [[], ["--json"]])
@pytest.mark.parametrize(("argv", "code", "kind"), ERRORS)
def test_a_long_local_store_is_named_cut_in_errors(local_store: Path, tmp_path: Path, argv: list[str],
                                                   code: int, kind: str, flags: list[str]) -> None:
    proc = ckptfs(argv[0], f"file://{local_store}", *argv[1:], *flags, cwd=tmp_path)
    shown = name_cut(f"file://{local_store}")
    if flags:
        assert shown in _check_json_error(proc, code, kind)
    else:
        assert shown in _check(proc, code)


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_export_into_a_long_store_is_refused_in_one_short_line(local_store: Path, tmp_path: Path,
                                                               flags: list[str]) -> None:
    """The store and the --output path inside it are each cut: both are as long as the store."""
    inside = local_store / "export.json"
    proc = ckptfs("export", f"file://{local_store}", "r", "--output", inside, *flags, cwd=tmp_path)
    message = _check_json_error(proc, 2, "usage") if flags else _check(proc, 2)
    assert "is inside the store" in message and name_cut(str(inside)) in message, message
    assert not inside.exists()


def test_no_threads_in_a_long_store_is_one_short_line(tmp_path: Path) -> None:
    root = tmp_path
    while len(str(root)) < LOCAL_CHARS:
        root /= "d" * 200
    with CheckpointStore(str(root)) as store:
        store.save_run(AgentRun(run_id="r", goal="g"))
    text = _check(ckptfs("threads", root, cwd=tmp_path), 0)
    assert _flat(text) == _flat(f"no LangGraph threads in {name_cut(str(root))}"), text


def test_json_keeps_the_redacted_url_whole_where_text_cuts_it(local_store: Path, tmp_path: Path) -> None:
    """The decision: a --json document's "url" is the store's name a script compares with the
    URL it gave, so it stays whole (redacted); the text names it cut."""
    url = f"file://{local_store}"
    for argv in (["runs"], ["threads"], ["show", "r"], ["show", "--thread", "t1"], ["versions", "r"],
                 ["diff", "r", "1", "2"], ["export", "r"]):
        proc = ckptfs(argv[0], url, *argv[1:], "--json", cwd=tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr[-500:])
        assert json.loads(proc.stdout)["url"] == url, argv
    for argv, code in (["verify"], 1), (["prune", "--keep-last", "1", "--dry-run"], 1), \
            (["forget", "r", "--dry-run"], 0):
        proc = ckptfs(argv[0], url, *argv[1:], "--json", cwd=tmp_path)
        assert proc.returncode == code and json.loads(proc.stdout)["url"] == url, (argv, proc.stderr[-500:])
    _check(ckptfs("threads", url, cwd=tmp_path), 0)  # the same store, as text: cut


# a prune that deletes, on a store of this test's own
@pytest.mark.parametrize(("argv", "code"), [*SUCCESS, (["prune", "--keep-last", "1"], 1)])
def test_a_long_s3_prefix_is_named_cut(s3_store: tuple[str, dict[str, str]], tmp_path: Path,
                                       argv: list[str], code: int) -> None:
    url, env = s3_store
    _check(ckptfs(argv[0], url, *argv[1:], cwd=tmp_path, env=env), code)


@pytest.mark.parametrize("flags", [[], ["--json"]])
@pytest.mark.parametrize(("argv", "code", "kind"), ERRORS)
def test_a_long_s3_prefix_is_named_cut_in_errors(s3_store: tuple[str, dict[str, str]], tmp_path: Path,
                                                 argv: list[str], code: int, kind: str,
                                                 flags: list[str]) -> None:
    url, env = s3_store
    proc = ckptfs(argv[0], url, *argv[1:], *flags, cwd=tmp_path, env=env)
    if flags:
        assert name_cut(url) in _check_json_error(proc, code, kind)
    else:
        assert name_cut(url) in _check(proc, code)


def test_a_mirror_pass_names_a_long_source_cut(s3_store: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, env = s3_store
    dst = tmp_path / "mirror"
    text = _check(ckptfs("mirror", url, dst, "--once", cwd=tmp_path, env=env), 0)
    assert _flat(f"mirror {name_cut(url)} -> {dst}") in _flat(text), text
    proc = ckptfs("mirror", url, dst, "--once", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["src"] == url, proc.stderr[-500:]


@pytest.fixture
def mirror_daemon(s3_store: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    url, env = s3_store
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    proc = subprocess.Popen([CLI, "mirror", url, str(tmp_path / "mirror"), "--interval", "1h"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**base, "COLUMNS": "200", **env})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def test_a_scheduled_mirror_names_a_long_source_cut(s3_store: tuple[str, dict[str, str]],
                                                    mirror_daemon: subprocess.Popen[str]) -> None:
    url, _env = s3_store
    assert mirror_daemon.stderr is not None
    first = mirror_daemon.stderr.readline()  # said once the job is scheduled
    mirror_daemon.send_signal(signal.SIGTERM)
    out, rest = mirror_daemon.communicate(timeout=60)
    text = first + rest
    assert first.startswith(f"mirroring {name_cut(url)} -> "), first[:500]
    assert all(len(line) < MAX_LINE for line in (out + text).splitlines()), text[:1000]
    for secret in SECRETS:
        assert secret not in out + text
