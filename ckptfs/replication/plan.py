"""Which files a restore point is: the reader's load path of a run, fetched in parallel.

A restore point of a run is a version V together with everything a load of V reads: the
start (a snapshot, or version 0), the records `format.reader.plan_load` follows to V, and the
artifacts they reference. The mirror copies exactly that set and restore stages it, so a
mirror is a sparse but clean store: its runs load, and verify finds nothing to report.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ckptfs.format import codec
from ckptfs.format.keys import RunFile, parse_run_key, run_prefix
from ckptfs.format.models import ArtifactRef
from ckptfs.format.reader import LoadPath, RecordCache, RunIndex, plan_load
from ckptfs.storage.base import Storage

logger = logging.getLogger(__name__)


@dataclass
class RestorePoint:
    """A run's load path at one version, with the artifacts it needs (by artifact key)."""

    path: LoadPath
    refs: dict[str, ArtifactRef]

    @property
    def run_id(self) -> str:
        return self.path.run_id

    @property
    def version(self) -> int:
        return self.path.version

    @property
    def snapshot(self) -> RunFile | None:
        return self.path.start

    @property
    def records(self) -> list[RunFile]:
        return [rf for rf, _ in self.path.records]

    @property
    def files(self) -> list[RunFile]:
        """Every file of the point: the records in chain order, then the start (a snapshot)."""
        return self.path.files


def run_files(storage: Storage, run_id: str,
              keys: Iterable[str] | None = None) -> tuple[list[RunFile], set[str]]:
    """A run's files (by the one key parser) and every key listed under it, from `keys` when
    the caller has listed the run already (on S3 each listing is a round trip)."""
    listed = storage.list(run_prefix(run_id)) if keys is None else list(keys)
    return [rf for k in listed if (rf := parse_run_key(k)) is not None], set(listed)


def name_path(files: list[RunFile]) -> list[RunFile] | None:
    """The advisory path by names (see `RunIndex.name_path`); None when no chain starts."""
    return RunIndex.build(files).name_path() if files else None


def chain_end(chain: list[RunFile] | None) -> int:
    return chain[-1].version if chain else 0


class RunReader:
    """The reader's record cache over one run of a storage, filled in parallel when it can."""

    def __init__(self, storage: Storage, run_id: str, pool: ThreadPoolExecutor,
                 max_size: int = codec.DEFAULT_MAX_DECODED_BYTES) -> None:
        self.run_id = run_id
        self.pool = pool
        self.cache = RecordCache(run_id, storage.get, max_size, keep_raw=True)

    @property
    def raw(self) -> dict[str, bytes]:
        return self.cache.raw

    @property
    def problems(self) -> list[str]:
        return self.cache.problems

    def prefetch(self, files: Iterable[RunFile]) -> None:
        todo = [f for f in files if f.key not in self.cache.records]
        for fut in [self.pool.submit(self.cache.load, f) for f in todo]:
            fut.result()  # FileNotFoundError: vanished (retention): the caller plans again

    def read(self, rf: RunFile) -> codec.Record | None:
        return self.cache.read(rf)


def plan(reader: RunReader, files: list[RunFile], ceiling: int | None = None) -> RestorePoint | None:
    """The restore point a load of the run (at `ceiling` exactly, or its newest) reads."""
    if not files:
        return None
    index = RunIndex.build(files, ceiling)
    hint = index.name_path()
    if hint:
        reader.prefetch(hint)
    path = plan_load(index, reader.read, run_id=reader.run_id, exact=ceiling is not None)
    if path is None:
        return None
    return RestorePoint(path, {ref.uri: ref for ref in path.refs().values()})
