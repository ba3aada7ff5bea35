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

from ckptfs.models import validate_id

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


# ------------------------------------------------- LangGraph saver (ckptfs/integrations/langgraph.py)
#
#   langgraph/threads/<thread>/<ns>/ckpt/<checkpoint_id>     a checkpoint + the channel versions it wrote
#   langgraph/threads/<thread>/<ns>/held/<checkpoint_id>     a pruned checkpoint's versions still in use
#   langgraph/threads/<thread>/<ns>/writes/<checkpoint_id>/<task_id>/<slot>   one task's pending writes
#   langgraph/runs/<run_id>/<thread>/<ns>                    marker: this run wrote checkpoints there
#
# On local disk the keys of one <thread>/<ns> are records of one append-only log,
# langgraph/threads/<thread>/<ns>/.records (ckptfs/logstore.py), not a file each: `lg_group_of`.
#
# LangGraph ids are user-provided, so every segment is percent-encoded: only [A-Za-z0-9_-] stays as
# is; '.', '/', ':', '|', '%', space and non-ASCII become %XX (UTF-8), so no segment can be '.',
# '..' or contain a separator, and the encoding is reversible. The namespace segment is "_" + the
# encoding ("_" alone is the root namespace ""); one whose encoding passes 200 characters becomes
# "~" + sha256 (the real namespace is stored inside each object). Other ids over 200 encoded
# characters are refused. Encoding keeps uuid6 checkpoint ids unchanged, so a listing sorts by time.

import hashlib  # noqa: E402  (kept with the section it serves: earlier lines stay untouched)
from urllib.parse import unquote  # noqa: E402

from ckptfs.errors import InvalidIdError  # noqa: E402

LG_ROOT = "langgraph"
LG_MAX_SEGMENT = 200
_LG_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def lg_encode(value: str, what: str = "id") -> str:
    """Percent-encode one user-provided id into a safe, reversible key segment."""
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{what} must not be empty")
    seg = "".join(chr(b) if b in _LG_SAFE else f"%{b:02X}" for b in value.encode("utf-8"))
    if len(seg) > LG_MAX_SEGMENT:
        raise InvalidIdError(f"{what} {value[:40]!r}... is too long ({len(seg)} encoded characters; "
                             f"the limit is {LG_MAX_SEGMENT})")
    return seg


def lg_decode(segment: str) -> str:
    """The id a segment made by `lg_encode` stands for."""
    return unquote(segment, errors="strict")


def lg_ns_segment(checkpoint_ns: str) -> str:
    if not isinstance(checkpoint_ns, str):
        raise InvalidIdError(f"checkpoint_ns must be a string, got {type(checkpoint_ns).__name__}")
    if not checkpoint_ns:
        return "_"
    seg = "".join(chr(b) if b in _LG_SAFE else f"%{b:02X}" for b in checkpoint_ns.encode("utf-8"))
    if len(seg) + 1 > LG_MAX_SEGMENT:
        return "~" + hashlib.sha256(checkpoint_ns.encode("utf-8")).hexdigest()
    return "_" + seg


def lg_threads_prefix() -> str:
    return f"{LG_ROOT}/threads/"


def lg_thread_prefix(thread_id: str) -> str:
    return f"{LG_ROOT}/threads/{lg_encode(thread_id, 'thread_id')}/"


def lg_ns_prefix(thread_id: str, checkpoint_ns: str) -> str:
    return f"{lg_thread_prefix(thread_id)}{lg_ns_segment(checkpoint_ns)}/"


def lg_checkpoint_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{lg_ns_prefix(thread_id, checkpoint_ns)}ckpt/{lg_encode(checkpoint_id, 'checkpoint_id')}"


def lg_held_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{lg_ns_prefix(thread_id, checkpoint_ns)}held/{lg_encode(checkpoint_id, 'checkpoint_id')}"


def lg_writes_prefix(thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None) -> str:
    base = f"{lg_ns_prefix(thread_id, checkpoint_ns)}writes/"
    return base if checkpoint_id is None else f"{base}{lg_encode(checkpoint_id, 'checkpoint_id')}/"


def lg_write_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, slot: str) -> str:
    task = lg_encode(task_id, "task_id")
    return f"{lg_writes_prefix(thread_id, checkpoint_ns, checkpoint_id)}{task}/{slot}"


def lg_run_prefix(run_id: str) -> str:
    return f"{LG_ROOT}/runs/{lg_encode(run_id, 'run_id')}/"


def lg_run_marker_key(run_id: str, thread_id: str, checkpoint_ns: str) -> str:
    return f"{lg_run_prefix(run_id)}{lg_encode(thread_id, 'thread_id')}/{lg_ns_segment(checkpoint_ns)}"


def lg_group_of(key: str) -> str | None:
    """The thread-namespace prefix a key (or listing prefix) falls in, or None above that level."""
    parts = key.split("/")
    if len(parts) >= 5 and parts[0] == LG_ROOT and parts[1] == "threads" and parts[2] and parts[3]:
        return "/".join(parts[:4]) + "/"
    return None
