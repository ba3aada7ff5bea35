"""What a mirror or restore pass did, per run: the reports the CLI renders and --json prints."""


from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)

LANGGRAPH_ENTRY = "langgraph/"  # the report's row for a LangGraph saver's files



class Progress(Protocol):
    """What the CLI's progress bars need; library code never renders anything itself."""

    def planned(self, objects: int, nbytes: int) -> None: ...

    def done(self, key: str, nbytes: int, skipped: bool) -> None: ...


class NoProgress:
    def planned(self, objects: int, nbytes: int) -> None:
        return None

    def done(self, key: str, nbytes: int, skipped: bool) -> None:
        return None




@dataclass
class RunResult:
    """What one pass did to one run.

    status: mirrored / restored (a new point is complete), up-to-date, not-due (advanced
    fewer than every_n versions), empty (no files), incomplete (something could not be
    copied: see `missing`), conflict (the destination holds different bytes at a key).
    """

    run_id: str
    status: str
    version: int | None = None  # the destination's point after this pass
    snapshot: int | None = None  # the snapshot that point starts from (None: from version 0)
    previous: int = 0  # the destination's point before the pass
    source_version: int = 0  # newest version the source holds
    copied: int = 0
    skipped: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)
    deleted: int = 0  # removed by the destination's retention
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status not in ("incomplete", "conflict", "failed")

    def not_whole(self, reasons: list[str]) -> None:
        """What the pass could not read of the run (a folder that is no directory), first among
        what is missing and in the error: the run is incomplete, unless a conflict says more."""
        self.missing = reasons + self.missing
        if self.status != "conflict":
            self.status = "incomplete"
        self.error = "; ".join(reasons) + (f"; {self.error}" if self.error else "")


@dataclass
class TransferReport:
    src: str
    dst: str
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0
    retries: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.ok for r in self.runs)

    @property
    def copied(self) -> int:
        return sum(r.copied for r in self.runs)

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.runs)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.runs)

    @property
    def missing(self) -> list[str]:
        return [k for r in self.runs for k in r.missing]

    def to_dict(self) -> dict[str, Any]:
        return {"operation": self.operation, "ok": self.ok, "src": self.src, "dst": self.dst,
                "seconds": round(self.seconds, 3), "copied": self.copied, "skipped": self.skipped,
                "bytes": self.bytes, "retries": self.retries, "missing": self.missing,
                "errors": self.errors,
                "runs": [asdict(r) for r in self.runs]}

    operation = "transfer"


@dataclass
class MirrorReport(TransferReport):
    """One mirror pass: per run what was copied, skipped, missing; `ok` False means exit 1."""

    operation = "mirror"


@dataclass
class RestoreReport(TransferReport):
    """One restore: per run the version now loadable at the destination."""

    operation = "restore"


