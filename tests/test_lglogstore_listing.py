"""LogStorage listings from the log's index (no directory walk) and `newest`: the same answers
as a walk, plain files appearing later included."""

from __future__ import annotations

import random
import time
from pathlib import Path

from ckptfs.integrations.langgraph.keys import lg_group_of
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logstore import LogStorage

G = "langgraph/threads/t/_/"


def _stores(tmp_path: Path) -> tuple[LocalStorage, LogStorage]:
    inner = LocalStorage(str(tmp_path), str(tmp_path))
    return inner, LogStorage(inner, lg_group_of)


def test_listings_match_a_model_through_puts_and_deletes(tmp_path: Path) -> None:
    _inner, log = _stores(tmp_path)
    rnd = random.Random(3)
    model: dict[str, bytes] = {}
    names = [f"{G}ckpt/{i:04d}" for i in range(60)] + [f"{G}writes/{i:04d}/task/r000000" for i in range(60)]
    for step in range(400):
        key = rnd.choice(names)
        if rnd.random() < 0.3:
            log.delete(key)
            model.pop(key, None)
        else:
            data = f"{step}".encode()
            log.put(key, data)
            model[key] = data
        for prefix in (G, f"{G}ckpt/", f"{G}writes/", f"{G}writes/{rnd.randrange(60):04d}/", f"{G}nothing/"):
            want = sorted(k for k in model if k.startswith(prefix))
            assert log.list(prefix) == want
            after = rnd.choice(names)
            assert log.list(prefix, start_after=after) == [k for k in want if k > after]
        newest = log.newest(f"{G}ckpt/", lambda k: f"{G}writes/{k.rsplit('/', 1)[1]}/")
        ckpts = sorted(k for k in model if k.startswith(f"{G}ckpt/"))
        if not ckpts:
            assert newest is None
        else:
            assert newest is not None and newest[:2] == (ckpts[-1], model[ckpts[-1]])
            wp = f"{G}writes/{ckpts[-1].rsplit('/', 1)[1]}/"
            assert newest[2] == sorted(k for k in model if k.startswith(wp))


def test_a_plain_file_made_after_the_log_is_still_listed(tmp_path: Path) -> None:
    inner, log = _stores(tmp_path)
    log.put(f"{G}ckpt/0001", b"in the log")
    assert log.list(f"{G}ckpt/") == [f"{G}ckpt/0001"]  # from the index: nothing else is there
    # written beside the log by something that does not use it (an older ckptfs, log=False)
    inner.put(f"{G}ckpt/0002", b"a plain file")
    assert log.list(f"{G}ckpt/") == [f"{G}ckpt/0001", f"{G}ckpt/0002"]
    newest = log.newest(f"{G}ckpt/")
    assert newest is not None and newest[:2] == (f"{G}ckpt/0002", b"a plain file")
    # one right in the group's directory (no new subdirectory): its mtime says so
    time.sleep(0.05)
    inner.put(f"{G}loose", b"x")
    assert f"{G}loose" in log.list(G)


def test_a_new_process_lists_plain_files_from_before_the_log(tmp_path: Path) -> None:
    inner, _ = _stores(tmp_path)
    inner.put(f"{G}ckpt/0001", b"old plain file")
    _, log = _stores(tmp_path)
    log.put(f"{G}ckpt/0002", b"in the log")
    assert log.list(f"{G}ckpt/") == [f"{G}ckpt/0001", f"{G}ckpt/0002"]
    log.delete(f"{G}ckpt/0001")
    assert log.list(f"{G}ckpt/") == [f"{G}ckpt/0002"]
