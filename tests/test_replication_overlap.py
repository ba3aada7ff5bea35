"""`ckptfs mirror` and `ckptfs restore` refuse a DST that overlaps SRC, and reach DST as SRC is.

A DST inside SRC (or SRC inside DST, or the two one store) was accepted: `restore ST ST/runs`
wrote `ST/runs/runs/<run>/...`, later seen as a run named 'runs', and `verify ST` went from
clean to 36 stray-key warnings. Overlap is by resolved path on disk and by bucket and prefix
(at a '/' boundary) on S3; the refusal is exit 2 and nothing is written.

DST's endpoint errors were not classified as SRC's: a `user:pw@` endpoint on DST was exit 3
"internal" (botocore's HTTPClientError) where on SRC it is exit 2, and a malformed one was
retried six times as a network fault where `ckptfs runs` refuses it at once. Every CLI call
here is the installed `ckptfs`, against the embedded S3 server over real HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli_commands import cli, cli_json
from test_mirror import POLICY, RUN, work

from backends.s3.embedded import EmbeddedS3
from ckptfs import CheckpointStore
from ckptfs.storage.registry import open_storage


def _store(root: Path) -> Path:
    work(CheckpointStore(str(root), policy=POLICY, artifact_threshold=1024), RUN, 6)
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every entry below `root`: a file's bytes, None for a directory or a link."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
            for p in sorted(root.rglob("*"))}


def _refused(code: int, doc: Any, err: str) -> str:
    assert code == 2, (doc, err)
    assert doc["ok"] is False and doc["error"]["code"] == "config", doc
    message: str = doc["error"]["message"]
    return message


@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_destination_inside_the_source_is_refused_and_nothing_is_written(
        command: str, tmp_path: Path) -> None:
    src = _store(tmp_path / "store")
    before = _tree(tmp_path)
    assert cli("verify", str(src))[0] == 0
    dst = src / ("mirror" if command == "mirror" else "runs")
    extra = ["--once", "--latest"] if command == "mirror" else ["--run", RUN]
    code, doc, err = cli_json(command, str(src), str(dst), *extra, "--no-progress")
    message = _refused(code, doc, err)
    assert f"{dst} lies inside the source store {src}" in message, message
    assert _tree(tmp_path) == before
    code, out, err = cli("verify", str(src))
    assert code == 0, out + err


@pytest.mark.parametrize("relation", ["same store by another path", "source inside destination"])
@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_destination_that_is_or_holds_the_source_is_refused(
        command: str, relation: str, tmp_path: Path) -> None:
    src = _store(tmp_path / "top" / "store")
    if relation == "same store by another path":
        dst = tmp_path / "link"
        dst.symlink_to(src)
        said = "is the source store"
    else:
        dst = tmp_path / "top"
        said = "lies inside"
    before = _tree(tmp_path)
    extra = ["--once", "--latest"] if command == "mirror" else ["--run", RUN]
    code, doc, err = cli_json(command, str(src), str(dst), *extra, "--no-progress")
    assert said in _refused(code, doc, err)
    assert _tree(tmp_path) == before


def test_s3_prefixes_overlap_at_a_slash_boundary_only(s3: EmbeddedS3, s3_url: str,
                                                       tmp_path: Path) -> None:
    ep = f"client_kwargs.endpoint_url={s3.endpoint}"
    opts = ["--from-option", ep, "--to-option", ep, "--once", "--latest", "--no-progress"]
    code, doc, err = cli_json("mirror", str(_store(tmp_path / "store")), s3_url, "--to-option", ep,
                              "--once", "--latest", "--no-progress")
    assert code == 0 and doc["ok"], (doc, err)
    bucket = open_storage(s3.url(), s3.storage_options)
    before = bucket.list("")
    for dst, said in ((f"{s3_url}/x", "lies inside the source store"),
                      (f"{s3_url}/", "is the source store"),
                      (f"s3a://{s3_url[len('s3://'):]}/mirror", "lies inside the source store"),
                      (s3.url(), f"the source store {s3_url} lies inside")):
        code, doc, err = cli_json("mirror", s3_url, dst, *opts)
        assert said in _refused(code, doc, err), dst
    assert bucket.list("") == before
    # a sibling prefix that only starts with the same characters is another store
    code, doc, err = cli_json("mirror", s3_url, s3_url + "2", *opts)
    assert code == 0 and doc["ok"] and doc["copied"] > 0, (doc, err)


def _source_side(url: str, endpoint: str) -> dict[str, Any]:
    """What a command reading `url` (SRC's way: `ckptfs runs`) says of the endpoint."""
    code, doc, err = cli_json("runs", url, "-o", f"client_kwargs.endpoint_url={endpoint}")
    assert code == 2, (doc, err)
    error: dict[str, Any] = doc["error"]
    return error


def _destination_side(command: str, src: Path, url: str, endpoint: str) -> tuple[dict[str, Any], str]:
    extra = ["--once", "--latest"] if command == "mirror" else ["--run", RUN]
    code, doc, err = cli_json(command, str(src), url, "--to-option",
                              f"client_kwargs.endpoint_url={endpoint}", *extra, "--no-progress")
    assert code == 2, (doc, err)
    error: dict[str, Any] = doc["error"]
    return error, err


@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_destination_endpoint_with_userinfo_is_refused_as_on_the_source_side(
        command: str, s3: EmbeddedS3, s3_url: str, tmp_path: Path) -> None:
    src = _store(tmp_path / "store")
    endpoint = s3.endpoint.replace("http://", "http://u:s3cr3tpw@")
    expected = _source_side(s3_url, endpoint)
    got, err = _destination_side(command, src, s3_url, endpoint)
    assert got == expected
    assert got["code"] == "unreachable"
    assert "s3cr3tpw" not in str(got) + err


@pytest.mark.parametrize("command", ["mirror", "restore"])
def test_a_malformed_destination_endpoint_is_refused_at_once_as_on_the_source_side(
        command: str, s3_url: str, tmp_path: Path) -> None:
    src = _store(tmp_path / "store")
    endpoint = "http://127.0.0.1:99999"
    expected = _source_side(s3_url, endpoint)
    got, err = _destination_side(command, src, s3_url, endpoint)
    assert got == expected
    assert "retry" not in err, err  # no try of it was taken for a network fault
