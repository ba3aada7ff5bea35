"""Every storage key ckptfs writes is named here and parsed here, nowhere else.

Numbers are zero-padded to 12 digits so a plain listing sorts by version.

    runs/<run_id>/log/<version>.ckpt            journal record: one commit's change
    runs/<run_id>/delta/<base>-<version>.ckpt   merged journal records base+1..version
    runs/<run_id>/snap/<version>.ckpt           full state at version
    runs/<run_id>/lease/<step_id>.lease         which worker may work on a step (leases.py)
    artifacts/sha256/<aa>/<sha256>              large value, named by its content
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptfs.format.models import validate_id

RUNS = "runs"
ARTIFACTS = "artifacts/sha256"
_WIDTH = 12
_FILE = re.compile(r"^(?:(?P<base>\d{12})-)?(?P<version>\d{12})\.ckpt$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def run_prefix(run_id: str) -> str:
    return f"{RUNS}/{validate_id(run_id, 'run id')}/"


def log_key(run_id: str, version: int) -> str:
    return f"{run_prefix(run_id)}log/{version:0{_WIDTH}d}.ckpt"


def delta_key(run_id: str, base: int, version: int) -> str:
    return f"{run_prefix(run_id)}delta/{base:0{_WIDTH}d}-{version:0{_WIDTH}d}.ckpt"


def snap_key(run_id: str, version: int) -> str:
    return f"{run_prefix(run_id)}snap/{version:0{_WIDTH}d}.ckpt"


def lease_key(run_id: str, step_id: str) -> str:
    return f"{run_prefix(run_id)}lease/{validate_id(step_id, 'step id')}.lease"


def artifact_key(sha256: str) -> str:
    if not _SHA.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{ARTIFACTS}/{sha256[:2]}/{sha256}"


@dataclass(frozen=True, order=True)
class RunFile:
    """A parsed run file key: what kind of record, which versions it spans."""

    version: int
    kind: str  # "log" | "delta" | "snap"
    base: int
    key: str


def parse_run_key(key: str) -> RunFile | None:
    """RunFile for a well-formed run file key, None for anything else (temp files, strays)."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != RUNS or parts[2] not in ("log", "delta", "snap"):
        return None
    m = _FILE.match(parts[3])
    if not m:
        return None
    kind = parts[2]
    version = int(m["version"])
    if (kind == "delta") != (m["base"] is not None):
        return None
    base = int(m["base"]) if m["base"] is not None else (version - 1 if kind == "log" else version)
    return RunFile(version=version, kind=kind, base=base, key=key)


def parse_artifact_key(key: str) -> str | None:
    """The sha256 an artifact key names, or None if the key is not a well-formed artifact."""
    parts = key.split("/")
    if len(parts) != 4 or "/".join(parts[:2]) != ARTIFACTS:
        return None
    sha = parts[3]
    return sha if _SHA.match(sha) and parts[2] == sha[:2] else None


