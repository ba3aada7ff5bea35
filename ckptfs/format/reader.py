"""Which files a load of a run follows: the one chain walk that the store and the mirror share.

A run's files are indexed once; a load starts from the newest snapshot that decodes (or from
version 0 while that chain is complete) and then, at each version, takes the largest delta
whose base hash matches, else the next journal record that continues the hash chain. Reading
and decoding are the caller's (`read` returns None for a file that fails), so the store can
apply bodies as it goes and the mirror can collect the files to copy: both follow exactly the
same chain, which is what lets a mirrored restore point load as the source did.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ckptfs.format import codec
from ckptfs.format.keys import RunFile

logger = logging.getLogger(__name__)

Reader = Callable[[RunFile], "codec.Record | None"]


@dataclass
class RunIndex:
    """A run's files up to `limit`, arranged for the walk."""

    limit: int
    snaps: list[RunFile]  # newest first
    deltas: dict[int, list[RunFile]]  # by base, longest first
    logs: list[RunFile]  # oldest first
    log_versions: list[int]

    @classmethod
    def build(cls, files: list[RunFile], limit: int | None = None) -> RunIndex:
        top = max((f.version for f in files), default=0) if limit is None else limit
        deltas: dict[int, list[RunFile]] = {}
        for f in files:
            if f.kind == "delta" and f.version <= top:
                deltas.setdefault(f.base, []).append(f)
        for lst in deltas.values():
            lst.sort(reverse=True)
        logs = sorted(f for f in files if f.kind == "log" and f.version <= top)
        return cls(top, sorted((f for f in files if f.kind == "snap" and f.version <= top),
                               reverse=True), deltas, logs, [f.version for f in logs])

    def starts(self) -> list[RunFile | None]:
        """Snapshots newest first, then None (version 0) if the chain from 0 is still there."""
        out: list[RunFile | None] = [*self.snaps]
        if any(f.base == 0 for f in self.logs) or 0 in self.deltas:
            out.append(None)
        return out

    def follow(self, cursor: int, chash: str, read: Reader, ceiling: int | None = None,
               run_id: str = "") -> Iterator[tuple[RunFile, codec.Record]]:
        """Yield each next record from (`cursor`, `chash`) up to `ceiling` (default: limit)."""
        top = self.limit if ceiling is None else ceiling
        while cursor < top:
            nxt: tuple[RunFile, codec.Record] | None = None
            for d in self.deltas.get(cursor, []):
                if d.version > top:
                    continue
                rec = read(d)
                if rec is not None and rec.header.base_hash == chash:
                    nxt = (d, rec)
                    break
            if nxt is None:
                for rf in self.logs[bisect.bisect_right(self.log_versions, cursor):]:
                    if rf.version > top:
                        break
                    rec = read(rf)
                    if rec is None:
                        continue
                    if rec.header.base == cursor and rec.header.base_hash == chash:
                        nxt = (rf, rec)
                        break
                    if rec.header.base == cursor:
                        logger.warning("run %s: %s: hash chain broken (base hash mismatch)",
                                       run_id, rf.key)
            if nxt is None:
                return
            yield nxt
            cursor, chash = nxt[1].header.version, nxt[1].header.hash
