"""A store, or an `export --output` file, under a path of over a thousand characters: every
error about it is one short line that names the problem, exit 2, and leaves nothing behind.

`Storage.display_name` cuts a store's name, but local disk's rarer errors still quoted the
root whole: a read-only or unreadable destination (`mirror`, `restore`), a parent it could not
be created in, a file or a FIFO where one of its folders belongs (the OS error's own path), a
root that is a link loop ("unexpected OSError", exit 3). `export --output` named its path, its
folder and an example path whole, and a name past NAME_MAX or a link loop was exit 3. The
tests drive the real `ckptfs`; permission bits bind its child even as root (`drop_dac`).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _privileges import drop_dac
from langgraph.checkpoint.sqlite import SqliteSaver
from test_langgraph_import import fill
from test_review_prune_cli_hostile import ckptfs

from ckptfs import AgentRun, CheckpointStore, Step, StepStatus

LONG_CHARS = 1200  # far past a cut name (160), with room below PATH_MAX for a store's keys
MAX_LINE = 600  # a line naming two cut paths fits; one naming a path whole does not
RUN = "r"


def _long_dir(base: Path) -> Path:
    path = base
    while len(str(path)) < LONG_CHARS:
        path /= "d" * 200  # each folder short of NAME_MAX
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run `r` at v1 and v2 in a store whose root is over LONG_CHARS characters long."""
    root = _long_dir(tmp_path_factory.mktemp("long-store")) / "store"
    with CheckpointStore(str(root)) as st:
        run = AgentRun(run_id=RUN, goal="g")
        run.add_step(Step(id="s", title="s"))
        st.save_run(run)
        run.steps["s"].status, run.steps["s"].result = StepStatus.COMPLETED, "ok"
        st.commit(run, [run.steps["s"]])
    return root


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """A folder of this test's own under a path over LONG_CHARS characters long; what a test
    made read-only there is writable again afterwards, so it can be removed."""
    path = _long_dir(tmp_path)
    yield path
    for dirpath, dirnames, _files in os.walk(path):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, 0o755)


def _tree(root: Path) -> list[tuple[str, int, int]]:
    """Every entry below `root`, links not followed: its path, file type and size."""
    out = []
    for dirpath, dirnames, files in os.walk(root):
        for name in dirnames + files:
            st = os.lstat(os.path.join(dirpath, name))
            out.append((os.path.relpath(os.path.join(dirpath, name), root), stat.S_IFMT(st.st_mode),
                        st.st_size if stat.S_ISREG(st.st_mode) else 0))
    return sorted(out)


def _check(proc: subprocess.CompletedProcess[str], code: int, problem: str, *paths: Path) -> str:
    """Exit code `code`; the output names `problem`; no line holds any of `paths` whole (nor
    the output with its wrapping undone), and no line is long."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, (proc.returncode, text[-1500:])
    assert problem in text, text[-1500:]
    flat = "".join(text.split())
    for path in paths:
        assert len(str(path)) > LONG_CHARS // 2
        assert str(path) not in flat, text[-1500:]
        assert all(str(path) not in line for line in text.splitlines())
    longest = max((len(line) for line in text.splitlines()), default=0)
    assert longest < MAX_LINE, (longest, text[-1500:])
    return text


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real `ckptfs`, bound by permission bits; a copy's progress bars left out."""
    quiet = ["--no-progress"] if args[0] in ("mirror", "restore") else []
    return ckptfs(*args, *quiet, cwd=cwd, preexec=drop_dac)


# ---------------------------------------------------------------------------- local storage


@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_read_only_long_destination_is_named_cut(store: Path, here: Path, tmp_path: Path,
                                                   command: str) -> None:
    """`check_writable`: "no write permission on ROOT" quoted the root whole."""
    dst = here / "ro"
    dst.mkdir()
    dst.chmod(0o555)
    argv: list[str | Path] = [command, store, dst, *(["--once"] if command == "mirror" else [])]
    _check(_run(*argv, cwd=tmp_path), 2, "no write permission", dst, here)
    assert list(dst.iterdir()) == []


def test_a_long_destination_that_cannot_be_made_is_named_cut(store: Path, here: Path,
                                                             tmp_path: Path) -> None:
    """`check`: "no write permission on PARENT to create it" quoted the parent whole."""
    parent = here / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    _check(_run("mirror", store, parent / "new", "--once", cwd=tmp_path), 2,
           "does not exist, and there is no write permission", parent, here)
    assert list(parent.iterdir()) == []


def test_an_unreadable_long_destination_is_named_cut(store: Path, here: Path, tmp_path: Path) -> None:
    """`check`: "no read permission on ROOT" quoted the root whole."""
    dst = here / "wx"
    dst.mkdir()
    dst.chmod(0o300)
    _check(_run("mirror", store, dst, "--once", cwd=tmp_path), 2, "no read permission", dst, here)
    dst.chmod(0o755)
    assert list(dst.iterdir()) == []


@pytest.mark.parametrize("below", [False, True])
def test_a_long_destination_that_is_a_link_loop_is_unreachable(store: Path, here: Path, tmp_path: Path,
                                                               below: bool) -> None:
    """Opening the root failed with the OS's error, its path whole: "unexpected OSError", exit 3."""
    loop = here / "loop"
    loop.symlink_to(loop)
    dst = loop / "sub" if below else loop
    before = _tree(here)
    proc = _run("mirror", store, dst, "--once", "--json", cwd=tmp_path)
    _check(proc, 2, "Too many levels of symbolic links", dst, here)
    assert json.loads(proc.stdout)["error"]["code"] == "unreachable"
    assert _tree(here) == before


@pytest.fixture(scope="module")
def sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("long-import") / "agent.sqlite"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        fill(saver)
    return path


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_an_import_below_a_file_names_the_long_path_cut(sqlite_file: Path, here: Path, tmp_path: Path,
                                                        kind: str) -> None:
    """A file or a FIFO where a folder of the store belongs: `_write_error` quoted the OS
    error's path (the folder it tried to make) whole after the store's cut name."""
    blocker = here / kind
    if kind == "file":
        blocker.write_text("not a folder")
        blocker.chmod(0o777)  # searchable bits: `check` lets it by, and the write meets it
    else:
        os.mkfifo(blocker, 0o777)
    dst = blocker / "store"
    before = _tree(here)
    _check(_run("import-langgraph", f"sqlite:///{sqlite_file}", dst, cwd=tmp_path), 2,
           "Not a directory", dst, here)
    assert _tree(here) == before
    assert stat.S_ISFIFO(blocker.lstat().st_mode) if kind == "fifo" else \
        blocker.read_text() == "not a folder"


# ------------------------------------------------------------------------------ export --output


# the --output each case names, what the message says of it, and its error code
BLOCKED = {
    "a directory": ("", "is a directory", "usage"),
    "in a missing folder": ("missing/x.json", "does not exist", "usage"),
    "below a file": ("file/x.json", "is not a directory", "usage"),
    "below a FIFO": ("fifo/x.json", "is not a directory", "usage"),
    "in a read-only folder": ("ro/x.json", "cannot write in", "not-writable"),
    "a link to a full device": ("full", "No space left on device", "usage"),
    "a name past NAME_MAX": ("n" * 300, "File name too long", "usage"),
    "a link loop": ("loop", "Too many levels of symbolic links", "usage"),
}


@pytest.mark.parametrize("case", BLOCKED)
@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_an_export_to_a_long_output_that_cannot_be_written_is_one_short_line(
        store: Path, here: Path, tmp_path: Path, case: str, flags: list[str]) -> None:
    """Each refused before the run is read (the full device when written): exit 2, one short
    line, nothing left behind."""
    (here / "file").write_text("x")
    os.mkfifo(here / "fifo")
    (here / "ro").mkdir()
    (here / "ro").chmod(0o555)
    (here / "full").symlink_to("/dev/full")
    (here / "loop").symlink_to(here / "loop")
    name, problem, code = BLOCKED[case]
    output = here / name if name else here
    before = _tree(here)
    proc = _run("export", store, RUN, "--output", output, *flags, cwd=tmp_path)
    text = _check(proc, 2, problem, output, here)
    if flags:
        doc = json.loads(proc.stdout)
        assert doc["error"]["code"] == code and problem in doc["error"]["message"], doc
    else:
        assert text.startswith("error: --output '"), text[:300]  # the path, cut and quoted
    assert _tree(here) == before  # no file, no temporary one beside it


def test_an_export_to_a_long_output_names_it_cut(store: Path, here: Path, tmp_path: Path) -> None:
    output = here / "export.json"
    text = _check(_run("export", store, RUN, "--output", output, cwd=tmp_path), 0,
                  f"exported {RUN} v2 to", output, here)
    assert json.loads(output.read_text())["run_id"] == RUN, text
    assert [p.name for p in here.iterdir()] == ["export.json"]


def test_an_export_to_a_name_near_the_limit_is_written(store: Path, here: Path, tmp_path: Path) -> None:
    """A name a plain write takes (250 characters): its temporary file's name, the target's with
    a dot, the pid and `.tmp` around it, was past NAME_MAX: "File name too long", exit 2."""
    output = here / ("n" * 250)
    _check(_run("export", store, RUN, "--output", output, cwd=tmp_path), 0, "exported", output, here)
    assert json.loads(output.read_text())["run_id"] == RUN
    assert [p.name for p in here.iterdir()] == [output.name]
