"""Every storage key ckptfs writes is named here and parsed here, nowhere else.

Numbers are zero-padded to 12 digits so a plain listing sorts by version.

    runs/<run_id>/log/<version>.ckpt            journal record: one commit's change
    runs/<run_id>/delta/<base>-<version>.ckpt   merged journal records base+1..version
    runs/<run_id>/snap/<version>.ckpt           full state at version
    runs/<run_id>/lease/<step_id>.lease         which worker may work on a step (leases.py)
    artifacts/sha256/<aa>/<sha256>              large value, named by its content
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import NamedTuple

from ckptfs.errors import InvalidIdError
from ckptfs.format.models import STEP_ID_EXTRA_BYTES, validate_id

RUNS = "runs"
ARTIFACTS = "artifacts/sha256"
TEMP_MARKER = ".tmp-"  # in the name of a file being written: never a finished key
# The temp names ckptfs itself makes, `.<name>.tmp-<hex>` (storage/local.py, storage/logfile.py):
# what forget deletes and verify calls a temp file. Another name with the marker in it (a
# user's `notes.tmp-old`) is not ours: a stray, reported, never deleted.
_OUR_TEMP = re.compile(r"\..+\.tmp-[0-9a-f]+")
LEASE_DIR = "lease"  # runs/<run>/lease/: workers' claims, not checkpoint state

# Namespaces other writers keep beside runs/ (root folder -> the module that checks and copies
# them). Maintenance and replication resolve these by name, so the core never imports an
# integration, and a store holding none of its data never loads it.
NAMESPACE_PLUGINS: dict[str, str] = {"langgraph": "ckptfs.integrations.langgraph.check"}


def namespace_plugin(root: str) -> ModuleType:
    """The plug-in of a namespace ('langgraph' or 'langgraph/'), imported by its name.

    A plug-in module offers `check(storage, keys, level, max_decoded)` (verify's findings as
    (severity, code, message, key) tuples), `group_of(key)` (which keys share one record log on
    local disk, so mirror and restore copy a log whole) and `is_transient(key)` (coordination
    objects, such as leases, that mirror and restore leave behind). It needs no framework.
    """
    return importlib.import_module(NAMESPACE_PLUGINS[root.strip("/")])
_WIDTH = 12
# The largest version a key can name: `parse_run_key` reads exactly 12 digits, so a 13-digit
# name is not a run file. The store refuses to commit past it (VersionLimitError) rather than
# acknowledge a version no load would ever find.
MAX_VERSION = 10**_WIDTH - 1
_FILE = re.compile(r"^(?:(?P<base>\d{12})-)?(?P<version>\d{12})\.ckpt$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def folded_id(run_id: str) -> str:
    """What a case-insensitive file system (macOS's and Windows' defaults, exFAT) compares a
    folder name by: letters without case, Unicode in one normal form. Two run ids with the same
    fold share one folder there, though S3 and Linux keep them apart."""
    return unicodedata.normalize("NFD", run_id).casefold()


def case_twins_hint(run_id: str, others: Iterable[str]) -> str:
    """The sentence that says why run `run_id`'s folder holds another run's files, when an id
    among `others` differs from it only in case or normal form; "" when none does."""
    fold = folded_id(run_id)
    twins = sorted({o for o in others if o != run_id and folded_id(o) == fold})
    if not twins:
        return ""
    names = ", ".join(repr(t) for t in twins)
    return (f" (run {run_id!r} and {names} differ only in case or Unicode form: a case-insensitive "
            "file system, as macOS's and Windows' are by default, gives them one folder)")


def run_prefix(run_id: str) -> str:
    return f"{RUNS}/{validate_id(run_id, 'run id')}/"


def log_key(run_id: str, version: int) -> str:
    return f"{run_prefix(run_id)}log/{version:0{_WIDTH}d}.ckpt"


def delta_key(run_id: str, base: int, version: int) -> str:
    return f"{run_prefix(run_id)}delta/{base:0{_WIDTH}d}-{version:0{_WIDTH}d}.ckpt"


def snap_key(run_id: str, version: int) -> str:
    return f"{run_prefix(run_id)}snap/{version:0{_WIDTH}d}.ckpt"


def lease_key(run_id: str, step_id: str) -> str:
    return f"{run_prefix(run_id)}lease/{validate_id(step_id, 'step id', STEP_ID_EXTRA_BYTES)}.lease"


def artifact_key(sha256: str) -> str:
    if not _SHA.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{ARTIFACTS}/{sha256[:2]}/{sha256}"


class RunFile(NamedTuple):
    """A parsed run file key: what kind of record, which versions it spans.

    A tuple (ordered by version, then kind, base and key): a load of a long run parses tens
    of thousands of keys, and a frozen dataclass cost 0.7 us a key to build, a tuple 0.2."""

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
    b, v = m.groups()
    version = int(v)
    if (kind == "delta") != (b is not None):
        return None
    return RunFile(version, kind, int(b) if b is not None else (version - 1 if kind == "log" else version),
                   key)


RUN_FOLDERS = ("log", "delta", "snap")  # a run's own folders: where its run files live


def blocked_run_dirs(keys: Iterable[str]) -> list[str]:
    """The keys among a listing that stand where a run's own folders belong (`runs/<run>/log`,
    `delta`, `snap`) and are no directory: a symlink (never followed: it could lead out of the
    store) or a file. A listing shows such an entry as a key (storage `list` reports every entry
    that is not a directory), and whatever versions it holds or leads to are read by no load,
    mirror or prune. A key with others listed below it (an object store's stray object named
    like the folder, beside the folder's own objects) blocks nothing, and is left to verify."""
    keys = keys if isinstance(keys, list) else list(keys)
    # every load lists its run's keys through here: one cheap test per key (4 ms at 100,000),
    # every run file's name ending in .ckpt, before any is split
    folders = [k for k in keys if k[-5:] != ".ckpt" and len(p := k.split("/")) == 3
               and p[0] == RUNS and p[2] in RUN_FOLDERS]
    if not folders:
        return []
    below = {"/".join(p[:3]) for k in keys if len(p := k.split("/")) > 3}
    return sorted(k for k in folders if k not in below)


def not_a_directory(blocked: Iterable[str]) -> str:
    """The one wording of `blocked_run_dirs`'s finds, naming each path."""
    return f"{' and '.join(blocked)}: not a directory (a symlink, never followed, or a file)"


def parse_artifact_key(key: str) -> str | None:
    """The sha256 an artifact key names, or None if the key is not a well-formed artifact."""
    parts = key.split("/")
    if len(parts) != 4 or "/".join(parts[:2]) != ARTIFACTS:
        return None
    sha = parts[3]
    return sha if _SHA.match(sha) and parts[2] == sha[:2] else None




@dataclass
class StoreListing:
    """A store's keys sorted into what they are: the one reading of a listing every command uses.

    Anything not ours (a temp file, `runs/.snapshot` from a filer, a 255-character name, a key
    in an unknown folder) is a stray with the reason, never an exception: one odd entry must
    not stop a command over the whole store.
    """

    runs: dict[str, list[RunFile]] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)  # sha256 digests
    namespaces: dict[str, list[str]] = field(default_factory=dict)  # plug-in root -> its keys
    temp: list[str] = field(default_factory=list)
    strays: list[tuple[str, str, str | None]] = field(default_factory=list)  # key, why, run id
    leases: list[str] = field(default_factory=list)


def run_dirs(names: Iterable[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The run ids among the directory names under `runs/`, and the names that are not, with why.

    An empty `runs/.snapshot` (NetApp) holds no keys, so a listing of keys never shows it; a
    command walking run directories reads them through here to skip and report it instead.
    """
    ids, odd = [], []
    for name in names:
        try:
            ids.append(validate_id(name, "run id"))
        except InvalidIdError as exc:
            odd.append((f"{RUNS}/{name}/", f"not a run directory: {exc}"))
    return ids, odd


def _is_lease_name(parts: list[str]) -> bool:
    """runs/<run>/lease/<step id>.lease, as `lease_key` names them; nothing deeper, nothing else."""
    if len(parts) != 4 or not parts[3].endswith(".lease"):
        return False
    try:
        validate_id(parts[3][: -len(".lease")], "step id", STEP_ID_EXTRA_BYTES)
    except InvalidIdError:
        return False
    return True


def classify(keys: Iterable[str]) -> StoreListing:
    """Sort listed keys (relative to the store root) into a StoreListing."""
    out = StoreListing()
    bad_runs: set[str] = set()
    for key in keys:
        parts = key.split("/")
        if _OUR_TEMP.fullmatch(parts[-1]):
            out.temp.append(key)
            continue
        if parts[0] == RUNS and len(parts) >= 3:
            rid = parts[1]
            try:
                validate_id(rid, "run id")
            except InvalidIdError as exc:
                if rid not in bad_runs:
                    bad_runs.add(rid)
                    out.strays.append((f"{RUNS}/{rid}/", f"not a run directory: {exc}", None))
                continue
            if parts[2] == LEASE_DIR:
                if _is_lease_name(parts):
                    out.leases.append(key)
                else:
                    out.strays.append((key, "not a ckptfs lease (unexpected name)", rid))
                continue
            rf = parse_run_key(key)
            if rf is not None:
                out.runs.setdefault(rid, []).append(rf)
            else:
                out.strays.append((key, "not a ckptfs run file (unexpected name)", rid))
            continue
        sha = parse_artifact_key(key)
        if sha is not None:
            out.artifacts.append(sha)
            continue
        if parts[0] in NAMESPACE_PLUGINS and len(parts) > 1:
            out.namespaces.setdefault(parts[0], []).append(key)
            continue
        out.strays.append((key, "not a ckptfs file (unexpected key)", None))
    return out
