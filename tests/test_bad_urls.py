"""A store URL the backend cannot open from is bad input: exit 2, one clear line, no traceback.

fsspec backends fail in their own ways when a URL alone does not give them what they need:
ftp:// raises TypeError (no host) and leaves a half-built object whose `__del__` raises too,
zip:// opens a file at once and raises IsADirectoryError. Both used to end as exit 3
("unexpected ...") with a raw destructor traceback on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_commands import _agent_store

CLI = str(Path(sys.executable).parent / "ckptfs")


@pytest.mark.parametrize(("url", "says"), [
    ("ftp://x/y", "ftp:// cannot be opened from this URL"),
    ("zip://x", "cannot open zip://"),
])
@pytest.mark.parametrize("command", [["runs"], ["verify"], ["mirror", "{local}", "--once", "--no-progress"]])
def test_an_unopenable_url_is_exit_2_with_one_clear_line(tmp_path: Path, url: str, says: str,
                                                         command: list[str]) -> None:
    argv = [command[0], url, *(a.replace("{local}", str(tmp_path / "dst")) for a in command[1:])]
    proc = subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    assert says in proc.stderr, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert "unexpected" not in proc.stderr, proc.stderr


# A URL the registry cannot serve, with what the one line must say: the scheme it names is a
# wrapper of another file system, unknown, or given no bucket, name or path it needs.
_REFUSED = [
    ("dir:///tmp/store", "dir:// wraps another file system"),  # was exit 3, AttributeError
    ("dir://", "dir:// wraps another file system"),
    ("generic://", "generic:// wraps another file system"),  # was exit 3, RecursionError
    ("simplecache:///tmp/store", "simplecache:// wraps another file system"),  # was "unknown scheme"
    ("simplecache::file:///tmp/store", "chained URLs"),
    ("://store", "no URL scheme"),  # was a local directory named '://store' under the cwd
    ("1abc://store", "no URL scheme"),
    ("foo://bar", "unknown storage scheme 'foo'"),
    ("s3://", "is not a valid S3 bucket name"),
    ("s3:///prefix", "is not a valid S3 bucket name"),
    ("memory://", "memory:// needs a name"),
    ("file://relative", "file:// URLs take no host"),
    ("local://host/x", "local:// URLs take no host"),  # was the directory host/x under the cwd
    ("LOCAL://relative", "local:// URLs take no host"),
    ("local://", "no path"),  # was the cwd itself, through fsspec
    ("arrow_hdfs://h/p", "unsupported storage scheme 'arrow_hdfs'"),  # was "no URL scheme"
    ("ARROW_HDFS://h/p", "unsupported storage scheme 'arrow_hdfs'"),
    ("a_b://h/p", "unsupported storage scheme 'a_b'"),
    ("async_wrapper:///tmp/store", "async_wrapper:// wraps another file system"),  # was "no URL scheme"
]


def _run_cli(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTFS_")}
    return subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)


@pytest.mark.parametrize(("url", "says"), _REFUSED)
@pytest.mark.parametrize("command", [["runs"], ["show", "{url}", "papers"], ["verify"]])
def test_a_url_the_registry_cannot_serve_is_exit_2_naming_the_problem(tmp_path: Path, url: str, says: str,
                                                                       command: list[str]) -> None:
    """`ckptfs runs dir:///tmp/store` was exit 3, "unexpected AttributeError" (fsspec's
    DirFileSystem built with no file system under it); generic:// recursed until RecursionError;
    simplecache:// was "unknown storage scheme" though fsspec knows it. Each is a URL no store
    can be opened from: exit 2, code config, one line naming the URL and why."""
    argv = [a.replace("{url}", url) for a in command] if "{url}" in command else [*command, url]
    proc = _run_cli(tmp_path, [*argv, "--json"])
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] == "config", (argv, doc)
    assert says in doc["error"]["message"] and url in doc["error"]["message"], (argv, doc)
    assert says in proc.stderr and "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, \
        proc.stderr[-500:]


@pytest.mark.parametrize(("url", "meant"), [("memory:", "memory://NAME"), ("memory:runs", "memory://runs"),
                                             ("s3:bucket/prefix", "s3://bucket/prefix"),
                                             ("local:relative", "local:///relative"),
                                             ("local:/abs", "local:///abs")])
@pytest.mark.parametrize("command", [["runs"], ["show", "{url}", "papers"], ["verify"]])
def test_a_scheme_without_its_slashes_is_named_as_a_local_path(tmp_path: Path, url: str, meant: str,
                                                               command: list[str]) -> None:
    """`memory:runs` has no `//`: it is a local directory of that name, as any path is. Nothing
    being stored there said only "wrong URL or prefix?"; the line says what was meant."""
    argv = [a.replace("{url}", url) for a in command] if "{url}" in command else [*command, url]
    proc = _run_cli(tmp_path, [*argv, "--json"])
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] == "empty", (argv, doc)
    message = doc["error"]["message"]
    assert f"{url} is a local path (no '//'); the URL would be {meant}" in message and "***" not in message, \
        (argv, doc)
    assert "Traceback" not in proc.stderr, proc.stderr[-500:]


def test_the_supported_forms_still_open(tmp_path: Path) -> None:
    """The same store by a plain path, file:///path and local:///path is listed, shown and
    verified; memory://name is served (an empty store: nothing is stored, not a refused URL)."""
    root = tmp_path / "store"
    _agent_store(root)
    for url in (str(root), f"file://{root}", f"local://{root}"):
        for argv in (["runs", url], ["show", url, "papers"], ["verify", url]):
            proc = _run_cli(tmp_path, [*argv, "--json"])
            assert proc.returncode == 0, (argv, proc.returncode, proc.stderr[-500:])
            assert json.loads(proc.stdout), argv
    proc = _run_cli(tmp_path, ["runs", "memory://runs", "--json"])
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "empty", proc.stdout


_FORMS = "a path, file:///path, s3://bucket/prefix or memory://name"


@pytest.mark.parametrize("url", ["arrow_hdfs://h/p", "ARROW_HDFS://KEY:SECRET@h/p", "a_b://h/p"])
def test_a_scheme_with_an_underscore_is_named_unsupported(tmp_path: Path, url: str) -> None:
    """`arrow_hdfs://h/p` (an fsspec protocol) said "no URL scheme before '://' ('arrow_hdfs' is
    none)": urlsplit reads no scheme where there is a '_'. The scheme is named as unsupported,
    with the forms that are, and fsspec's valid name for the same file system where it has one;
    nothing is opened or written."""
    proc = _run_cli(tmp_path, ["runs", url, "--json"])
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    message = json.loads(proc.stdout)["error"]["message"]
    scheme = url.split("://")[0].lower()
    assert f"unsupported storage scheme {scheme!r}" in message, message
    assert "no URL scheme" not in message and f"give {_FORMS}" in message, message
    assert ("fsspec's other name for it is hdfs://" in message) == (scheme == "arrow_hdfs"), message
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == [], proc.stderr[-500:]


def test_local_url_opens_the_local_storage_file_url_opens(tmp_path: Path) -> None:
    """fsspec's `local://` is its other name for `file://`: it opened through the generic
    backend (no exclusive create, no fsync, no LangGraph log), whatever the case of the scheme.
    Each spelling is LocalStorage on the same directory, shown back as the user gave it."""
    from ckptfs.storage.local import LocalStorage
    from ckptfs.storage.registry import open_storage

    root = tmp_path / "store"
    for url in (f"file://{root}", f"File://{root}", f"local://{root}", f"LOCAL://{root}",
                f"local://localhost{root}"):
        storage = open_storage(url)
        assert type(storage) is LocalStorage, (url, storage)
        assert storage.root == str(root) and storage.capabilities.exclusive_create, url
        assert storage.display_url == url, (url, storage.display_url)


def test_local_url_is_served_as_file_url_by_the_cli(tmp_path: Path) -> None:
    """`ckptfs runs local:///STORE` warned "file:// has no exclusive create or compare-and-swap
    here" (the generic backend); it lists what the plain path lists, silently, naming the store
    by the URL given."""
    root = tmp_path / "store"
    _agent_store(root)
    plain = _run_cli(tmp_path, ["runs", str(root), "--json"])
    assert plain.returncode == 0, plain.stderr[-500:]
    for url in (f"local://{root}", f"LOCAL://{root}", f"File://{root}", f"local://localhost{root}"):
        for argv in (["runs", url, "--json"], ["verify", url]):
            proc = _run_cli(tmp_path, argv)
            assert proc.returncode == 0, (argv, proc.returncode, proc.stderr[-500:])
            assert "ckptfs.storage.generic" not in proc.stderr and "compare-and-swap" not in proc.stderr, \
                (argv, proc.stderr[-500:])
        doc = json.loads(_run_cli(tmp_path, ["runs", url, "--json"]).stdout)
        assert doc.pop("url") == url, doc  # display_url: the URL as given
        assert doc == {k: v for k, v in json.loads(plain.stdout).items() if k != "url"}, url


def test_a_new_store_is_written_through_a_local_url(tmp_path: Path) -> None:
    """Through fsspec, a write under local:// made no directories: the first save of a run
    raised FileNotFoundError, and `mirror SRC local:///DST` said "No such file or directory",
    exit 1, copying nothing. The same writes as through file://."""
    from ckptfs import AgentRun, CheckpointStore, Step

    run = AgentRun(run_id="r", goal="g")
    run.add_step(Step(id="a", title="a"))
    store = CheckpointStore(f"local://{tmp_path / 'lib'}")
    store.save_run(run)
    assert CheckpointStore(str(tmp_path / "lib")).load_run("r") == run
    src = tmp_path / "src"
    _agent_store(src)
    proc = _run_cli(tmp_path, ["mirror", str(src), f"local://{tmp_path / 'dst'}", "--once", "--no-progress",
                               "--json"])
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert "ckptfs.storage.generic" not in proc.stderr, proc.stderr[-500:]
    mirrored = _run_cli(tmp_path, ["runs", str(tmp_path / "dst"), "--json"])
    original = _run_cli(tmp_path, ["runs", str(src), "--json"])
    assert mirrored.returncode == 0, mirrored.stderr[-500:]
    assert json.loads(mirrored.stdout)["runs"] == json.loads(original.stdout)["runs"], mirrored.stdout


KEY_ID, SECRET = "AKIAUNDERSCORE7KEY", "Under+Score/Secret@x"


@pytest.mark.parametrize(("url", "says"), [
    (f"arrow_hdfs://{KEY_ID}:{SECRET}@h/p", "unsupported storage scheme 'arrow_hdfs'"),
    (f"ARROW_HDFS://{KEY_ID}:{SECRET}@h/p", "unsupported storage scheme 'arrow_hdfs'"),
    (f"async_wrapper://{KEY_ID}:{SECRET}@h/p", "async_wrapper:// wraps another file system"),
    (f"local://{KEY_ID}:{SECRET}@h/p", "local:// URLs take no host"),
])
@pytest.mark.parametrize("command", [["runs"], ["verify"], ["-vv", "verify"], ["show", "--thread", "t"]])
def test_a_refused_url_never_echoes_its_credentials(tmp_path: Path, url: str, says: str,
                                                    command: list[str]) -> None:
    proc = _run_cli(tmp_path, [*command, url])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and says in out, (proc.returncode, out[-500:])
    assert not [p for p in (KEY_ID, SECRET, "Under+Score", "Secret@x") if p in out], out
    assert "***@h/p" in out and "Traceback" not in out, out
    assert list(tmp_path.iterdir()) == [], "nothing is written for a refused URL"


@pytest.mark.parametrize(("url", "line"), [
    ("s3://ckptfs-test/p?token=QUERYSECRET", "s3://ckptfs-test/p?***: no query ('?') or fragment"),
    ("memory://n?name=QUERYSECRET", "memory://n?***: no query ('?') or fragment"),
    ("gs://b/p?QUERYSECRET", "gs://b/p?***: gs:// needs an extra package"),
])
@pytest.mark.parametrize("command", [["runs"], ["verify"], ["runs", "--json"]])
def test_a_refused_url_with_a_query_keeps_the_colon_after_it(tmp_path: Path, url: str, line: str,
                                                             command: list[str]) -> None:
    """The scrubber read the ':' ending the URL as part of its query and hid it with the query:
    `error: s3://Bad_Bucket/p?*** 'Bad_Bucket' is not a valid S3 bucket name` (and since
    `error: s3://b/p?*** no query ...`, a query being refused). The query stays hidden; the
    punctuation after it is the sentence's."""
    proc = _run_cli(tmp_path, [command[0], url, *command[1:]])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and line in out, (proc.returncode, out[-500:])
    assert "QUERYSECRET" not in out, out


def test_the_scrubber_keeps_the_punctuation_a_url_ends_in() -> None:
    from ckptfs.cli._logging import Scrubber

    scrub = Scrubber().scrub
    assert scrub("see (s3://b/p?sig=QUERYSECRET), then s3://b/q?x=QUERYSECRET; done") == \
        "see (s3://b/p?***), then s3://b/q?***; done"
    assert scrub("s3://b/p?x=QUERYSECRET:tail is hidden whole") == "s3://b/p?*** is hidden whole"
    assert scrub("s3://b/p: no query, unchanged") == "s3://b/p: no query, unchanged"


@pytest.mark.parametrize("url", ["file://{d}/m?copy=2", "local://{d}/m#old", "FILE://{d}/m?", "file://{d}/m#",
                                 "local://localhost{d}/m?x", "s3://ckptfs-test/p?region=eu", "s3a://b/p#x",
                                 "memory://n?x"])
@pytest.mark.parametrize("command", [["runs", "{url}"],
                                     ["mirror", "{src}", "{url}", "--once", "--no-progress"],
                                     ["restore", "{src}", "{url}", "--no-progress"]])
def test_a_query_or_fragment_in_a_store_url_is_refused_not_dropped(tmp_path: Path, url: str,
                                                                   command: list[str]) -> None:
    """urlsplit took `?copy=2` and `#old` for a query and a fragment, and the store opened
    without them: `mirror SRC file:///d/m?copy=2` wrote into /d/m, exit 0, a directory the
    user did not name (s3:// and memory:// the same). Refused: exit 2, one line naming it,
    nothing written."""
    src = tmp_path / "src"
    _agent_store(src)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    given = url.format(d=tmp_path)
    argv = [a.format(url=given, src=src) for a in command]
    proc = _run_cli(tmp_path, argv)
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr[-500:])
    lines = proc.stderr.strip().splitlines()
    says = "is this process's memory" if given.startswith("memory") and command[0] != "runs" else \
        "no query ('?') or fragment ('#')"  # a memory:// destination is refused as that first
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_plain_path_keeps_its_question_mark_and_hash(tmp_path: Path) -> None:
    """The way to a directory whose name holds '?' or '#': the plain path, taken as it is, by the
    library and the CLI alike; the library refuses the URL spellings as the CLI does."""
    from ckptfs import AgentRun, CheckpointStore, Step
    from ckptfs.errors import ConfigError

    run = AgentRun(run_id="r", goal="g")
    run.add_step(Step(id="a", title="a"))
    odd = tmp_path / "m?copy=2#old"
    with CheckpointStore(str(odd)) as store:
        store.save_run(run)
    assert (odd / "runs" / "r").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == [odd.name]
    proc = _run_cli(tmp_path, ["runs", str(odd), "--json"])
    assert proc.returncode == 0 and [r["run_id"] for r in json.loads(proc.stdout)["runs"]] == ["r"], \
        proc.stderr[-500:]
    with pytest.raises(ConfigError, match=r"no query \('\?'\) or fragment"):
        CheckpointStore(f"file://{odd}")
