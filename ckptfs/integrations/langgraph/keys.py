"""Key names of the LangGraph saver's objects, and the percent-encoding of user ids in them."""

from __future__ import annotations

# ------------------------------------------------- LangGraph saver (ckptfs/integrations/langgraph.py)
#
#   langgraph/threads/<thread>/<ns>/ckpt/<checkpoint_id>     a checkpoint + the channel versions it wrote
#   langgraph/threads/<thread>/<ns>/ckpt/~/<id>.<mode>[.<id>...]   which checkpoints a read needs (S3)
#   langgraph/threads/<thread>/<ns>/held/<checkpoint_id>     a pruned checkpoint's versions still in use
#   langgraph/threads/<thread>/<ns>/writes/<checkpoint_id>/<task_id>/<slot>   one task's pending writes
#   langgraph/runs/<run_id>/<thread>/<ns>                    marker: this run wrote checkpoints there
#   langgraph/leases/<thread>.lease                           who writes the thread now (ownership.py)
#   langgraph/names/<sha256>                                  the id of a thread whose segment is a hash
#
# On local disk the keys of one <thread>/<ns> are records of one append-only log,
# langgraph/threads/<thread>/<ns>/.records (ckptfs/logstore.py), not a file each: `lg_group_of`.
#
# LangGraph ids are user-provided, so every segment is percent-encoded: only [A-Za-z0-9_-] stays as
# is; '.', '/', ':', '|', '%', space and non-ASCII become %XX (UTF-8), so no segment can be '.',
# '..' or contain a separator, and the encoding is reversible. The namespace segment is "_" + the
# encoding ("_" alone is the root namespace ""); one whose encoding passes 200 characters becomes
# "~" + sha256 (the real namespace is stored inside each object). A thread id past 200 encoded
# characters (24 CJK characters are enough; at most LG_MAX_THREAD_ID) becomes "~" + sha256 too,
# its real id kept in `names/<sha256>`, written before anything of the thread and deleted after
# everything of it (objects never name their thread, so copying one stays byte for byte). "~"
# never starts an encoding, so a hash and an id cannot meet. Other ids over 200 encoded
# characters are refused. Encoding keeps uuid6 checkpoint ids unchanged, so a listing sorts by
# time.
import functools
import hashlib
import json
import re
from collections.abc import Iterable
from urllib.parse import unquote

from ckptfs.errors import InvalidIdError

LG_ROOT = "langgraph"
LG_MAX_SEGMENT = 200
# A thread id may be long (its segment is then a hash), but not unbounded: its name object is
# read whole by every listing, so a bound on ids is a bound on what a listing reads.
LG_MAX_THREAD_ID = 1 << 20  # characters
LG_MAX_NAME_BYTES = 6 * LG_MAX_THREAD_ID + 64  # its JSON: at most 6 bytes a character (\uXXXX)
_LG_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ALL_SAFE = re.compile(r"[A-Za-z0-9_-]+")  # ASCII only: no re.UNICODE class, so 'é' or '٣' do not match


def lg_encode(value: str, what: str = "id") -> str:
    """Percent-encode one user-provided id into a safe, reversible key segment."""
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{what} must not be empty")
    if len(value) > LG_MAX_SEGMENT:  # encoding never shortens: refused without walking it
        raise InvalidIdError(f"{what} {value[:40]!r}... is too long (at least {len(value)} encoded "
                             f"characters; the limit is {LG_MAX_SEGMENT})")
    try:
        seg = _percent(value)
    except UnicodeEncodeError:
        raise InvalidIdError(f"{what} {value[:40]!r} is not valid text (a lone surrogate)") from None
    if len(seg) > LG_MAX_SEGMENT:
        raise InvalidIdError(f"{what} {value[:40]!r}... is too long ({len(seg)} encoded characters; "
                             f"the limit is {LG_MAX_SEGMENT})")
    return seg


@functools.lru_cache(maxsize=4096)
def _percent(value: str) -> str:
    """Remembered: a read or write names the same few ids several times (thread, namespace,
    checkpoint), and a byte-by-byte encoding costs more than the index lookup it leads to.
    An id that needs no escape (every uuid6 checkpoint id: each put names a new one) is
    recognised by one regex match rather than walked byte by byte."""
    if _ALL_SAFE.fullmatch(value):
        return value
    return "".join(chr(b) if b in _LG_SAFE else f"%{b:02X}" for b in value.encode("utf-8"))


def lg_decode(segment: str) -> str:
    """The id a segment made by `lg_encode` stands for."""
    return unquote(segment, errors="strict")


def lg_ns_segment(checkpoint_ns: str) -> str:
    if not isinstance(checkpoint_ns, str):
        raise InvalidIdError(f"checkpoint_ns must be a string, got {type(checkpoint_ns).__name__}")
    if not checkpoint_ns:
        return "_"
    if len(checkpoint_ns) >= LG_MAX_SEGMENT:  # "_" + an encoding at least as long: too long
        return "~" + _sha256(checkpoint_ns, "checkpoint_ns")
    try:
        seg = _percent(checkpoint_ns)
    except UnicodeEncodeError:
        raise InvalidIdError(f"checkpoint_ns {checkpoint_ns[:40]!r} is not valid text "
                             "(a lone surrogate)") from None
    if len(seg) + 1 > LG_MAX_SEGMENT:
        return "~" + _sha256(checkpoint_ns, "checkpoint_ns")
    return "_" + seg


def _sha256(value: str, what: str) -> str:
    """The hex sha256 of an id's UTF-8: what stands for an id too long to be a segment. Only
    the hash walks the id (in C): a megabyte id costs a millisecond, not a byte-by-byte
    encoding thrown away (0.6 s and 60 MiB, for every key of every put)."""
    try:
        return hashlib.sha256(value.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:
        raise InvalidIdError(f"{what} {value[:40]!r} is not valid text (a lone surrogate)") from None


def lg_threads_prefix() -> str:
    return f"{LG_ROOT}/threads/"


def lg_thread_segment(thread_id: str) -> str:
    """A thread's key segment: its encoding, or "~" + sha256 of the id when that is too long
    (`lg_name_key` then holds the id). SqliteSaver takes thread ids of any length; so do we."""
    if isinstance(thread_id, str) and len(thread_id) > LG_MAX_SEGMENT:
        if len(thread_id) > LG_MAX_THREAD_ID:
            raise InvalidIdError(f"thread_id {thread_id[:40]!r}... is {len(thread_id):,} characters "
                                 f"long; the limit is {LG_MAX_THREAD_ID:,}")
        return "~" + _sha256(thread_id, "thread_id")  # its encoding is longer still
    try:
        return lg_encode(thread_id, "thread_id")
    except InvalidIdError:
        if not isinstance(thread_id, str) or not thread_id:
            raise
    return "~" + _sha256(thread_id, "thread_id")  # too long encoded; a lone surrogate raises there


def lg_hashed(segment: str) -> bool:
    """Whether a thread segment is a hash (its id is in `lg_name_key`), not an encoding."""
    return segment.startswith("~")


def lg_names_prefix() -> str:
    return f"{LG_ROOT}/names/"


def lg_name_key(segment: str) -> str:
    """Where the id of a thread whose segment is a hash is kept: outside `threads/`, so deleting
    or copying the thread never touches it (a hash names one id for ever)."""
    return f"{lg_names_prefix()}{segment[1:]}"


def lg_name_body(thread_id: str) -> bytes:
    return json.dumps({"thread_id": thread_id}, ensure_ascii=False).encode("utf-8")


def lg_parse_name(segment: str, body: bytes) -> str | None:
    """The thread id a name object holds, if it is one and hashes to `segment`; else None."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    tid = doc.get("thread_id") if isinstance(doc, dict) else None
    if not isinstance(tid, str) or not tid:
        return None
    try:
        return tid if lg_thread_segment(tid) == segment else None
    except InvalidIdError:
        return None


def lg_thread_prefix(thread_id: str) -> str:
    return f"{LG_ROOT}/threads/{lg_thread_segment(thread_id)}/"


def lg_ns_prefix(thread_id: str, checkpoint_ns: str) -> str:
    if type(thread_id) is str and type(checkpoint_ns) is str:
        return _ns_prefix(thread_id, checkpoint_ns)
    return f"{lg_thread_prefix(thread_id)}{lg_ns_segment(checkpoint_ns)}/"  # raises: not ids


@functools.lru_cache(maxsize=4096)
def _ns_prefix(thread_id: str, checkpoint_ns: str) -> str:
    """Remembered, as `_percent`: every read and write of a namespace starts with its prefix."""
    return f"{lg_thread_prefix(thread_id)}{lg_ns_segment(checkpoint_ns)}/"


def lg_checkpoint_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{lg_ns_prefix(thread_id, checkpoint_ns)}ckpt/{lg_encode(checkpoint_id, 'checkpoint_id')}"


# A read plan (S3): from checkpoint <id> on, until the next plan in the listing, a checkpoint
# C needs the objects of the ids after the mode, and, mode "c", of every checkpoint from <id>
# up to C (a delta chain that grows by one each step); mode "u": unknown. Tiny objects filed
# under ckpt/ so the one LIST that finds the newest checkpoint names them too; "~" never starts
# an encoded id, so they sort after every checkpoint, and "." never occurs in one.
LG_PLAN_DIR = "~"
LG_PLAN_MAX = 900  # characters of a plan's segment; a longer one is written as mode "u"


def lg_plan_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str, mode: str,
                ids: Iterable[str] = ()) -> str:
    seg = ".".join([lg_encode(checkpoint_id, "checkpoint_id"), mode,
                    *sorted(lg_encode(i, "checkpoint_id") for i in ids)])
    if len(seg) > LG_PLAN_MAX:
        seg = f"{lg_encode(checkpoint_id, 'checkpoint_id')}.u"
    return f"{lg_ns_prefix(thread_id, checkpoint_ns)}ckpt/{LG_PLAN_DIR}/{seg}"


def lg_parse_plan(key: str) -> tuple[str, str, list[str]] | None:
    """(encoded checkpoint id, mode, encoded ids) of a plan key, None if it is none."""
    _, sep, seg = key.rpartition(f"/ckpt/{LG_PLAN_DIR}/")
    parts = seg.split(".")
    if not sep or "/" in seg or len(parts) < 2 or parts[1] not in ("c", "s", "u") or not all(parts):
        return None
    return parts[0], parts[1], parts[2:]


def lg_is_plan(key: str) -> bool:
    return f"/ckpt/{LG_PLAN_DIR}/" in key


def lg_held_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{lg_ns_prefix(thread_id, checkpoint_ns)}held/{lg_encode(checkpoint_id, 'checkpoint_id')}"


def lg_writes_prefix(thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None) -> str:
    base = f"{lg_ns_prefix(thread_id, checkpoint_ns)}writes/"
    return base if checkpoint_id is None else f"{base}{lg_encode(checkpoint_id, 'checkpoint_id')}/"


def lg_write_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, slot: str) -> str:
    task = lg_encode(task_id, "task_id")
    return f"{lg_writes_prefix(thread_id, checkpoint_ns, checkpoint_id)}{task}/{slot}"


def lg_write_slot(idx: int) -> str:
    """The last segment of a pending-writes object: `r<first idx>` holds a task's regular writes
    of one call, `s<n>` one special write (idx -n: error, scheduled, interrupt, resume)."""
    return f"r{idx:06d}" if idx >= 0 else f"s{-idx:02d}"


def lg_run_prefix(run_id: str) -> str:
    return f"{LG_ROOT}/runs/{lg_encode(run_id, 'run_id')}/"


def lg_run_marker_key(run_id: str, thread_id: str, checkpoint_ns: str) -> str:
    return f"{lg_run_prefix(run_id)}{lg_thread_segment(thread_id)}/{lg_ns_segment(checkpoint_ns)}"


def lg_leases_prefix() -> str:
    return f"{LG_ROOT}/leases/"


def lg_lease_key(thread_id: str) -> str:
    """The lease object of a thread's one writer (`ownership.py`): not checkpoint state, and
    outside `threads/`, so deleting or copying a thread never touches who may write it."""
    return f"{lg_leases_prefix()}{lg_thread_segment(thread_id)}.lease"


@functools.lru_cache(maxsize=8192)  # every read and write asks it of the same few prefixes
def lg_group_of(key: str) -> str | None:
    """The thread-namespace prefix a key (or listing prefix) falls in, or None above that level."""
    parts = key.split("/")
    if len(parts) >= 5 and parts[0] == LG_ROOT and parts[1] == "threads" and parts[2] and parts[3]:
        return "/".join(parts[:4]) + "/"
    return None
