"""THE reader of run files: decode one against its key, collect its references, walk the chain.

Every command that reads runs goes through these few functions: the store's load, verify,
mirror, restore, prune, `runs` and `show`. Before they existed each command had its own idea
of a valid store (verify rejected every mirror that mirror wrote), so the rule is now one
place: a file counts only if it decodes *and* its header names the run, kind, version and base
its key names; the chain a load follows is chosen by `plan_load` alone; the artifacts a record
needs are found by `collect_refs` alone.

Reading bytes is the caller's (`fetch`), so this module stays below storage: the store hands in
`storage.get`, the mirror a parallel prefetcher, verify a reader that records findings.
"""

from __future__ import annotations

import bisect
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from ckptfs.errors import BrokenChainError, CorruptFileError, MisplacedFileError, UnsupportedFormatError
from ckptfs.format import codec
from ckptfs.format.keys import RunFile, case_twins_hint, parse_artifact_key
from ckptfs.format.models import ArtifactRef

logger = logging.getLogger(__name__)

RECORD_KIND = {"log": "journal", "delta": "delta", "snap": "snapshot"}  # key folder -> header kind
REFS_FIELD = "$refs"  # where a step or tool call lists the artifacts its large values moved to

Read = Callable[[RunFile], "codec.Record | None"]


class _BodyParts(msgspec.Struct, forbid_unknown_fields=True):
    """A record body cut at its fragments (changes.py's layout); nothing else may be in it."""

    run: msgspec.Raw = msgspec.Raw(b"null")
    steps: dict[str, msgspec.Raw] = {}
    removed: list[str] = []
    tool_log: dict[str, list[msgspec.Raw]] = {}


_PARTS = msgspec.json.Decoder(_BodyParts)
_OBJECT = msgspec.json.Decoder(dict[str, Any])
_VALUE = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class SplitBody:
    """A record body as a load reads it: every step's and tool call's stored bytes beside the
    object they parse to, which is what `json.loads` of the whole document gives for it.

    `steps` is None when the steps were left unparsed (`split_body(lazy=True)`): a load
    parses only the fragments that survive into its state (`parse_step`), and checks that
    those a later record replaces are ones parsing would have accepted (`skippable`)."""

    run: dict[str, Any] | None
    steps: dict[str, dict[str, Any]] | None
    step_json: dict[str, msgspec.Raw]
    removed: list[str]
    tool_log: dict[str, list[dict[str, Any]]]
    call_json: dict[str, list[msgspec.Raw]]

    def as_dict(self) -> dict[str, Any]:
        """The body as `codec.decode` gives it."""
        steps = self.steps
        if steps is None:
            steps = {sid: parse_step(raw) for sid, raw in self.step_json.items()}
        return {"run": self.run, "steps": steps, "removed": self.removed,
                "tool_log": self.tool_log}


def parse_step(raw: msgspec.Raw) -> dict[str, Any]:
    """A step's fragment, parsed as `split_body` parses it (msgspec errors for what it
    refuses: the caller reads the record the lenient way then)."""
    return _OBJECT.decode(raw)


_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (codec.MAX_INT_DIGITS + 1))


def skippable(raw: msgspec.Raw) -> bool:
    """Whether a step fragment may be left unparsed, because a later record replaces it: it
    is one that parsing, strict or lenient, would not have refused.

    `split_body` has already scanned it as JSON (msgspec checks the syntax, nesting and
    escapes of what it skips over); what that scan lets through and `json.loads` refuses is
    invalid UTF-8 and an int of more than MAX_INT_DIGITS digits, and a fragment must be an
    object. Anything in doubt says False: the load then parses every fragment, as it did."""
    mv = memoryview(raw)
    if not mv or mv[0] != 0x7B:  # "{"
        return False
    if len(mv) > codec.MAX_INT_DIGITS and _LONG_DIGITS.search(mv):
        return False
    try:
        str(mv, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def split_body(body: memoryview, lazy: bool = False) -> SplitBody | None:
    """The body's fragments, each parsed strictly; None for anything but the plain layout.

    msgspec is strict JSON (RFC 8259): whatever it accepts, it parses to the very values
    `json.loads` gives (the same ints, floats, strings, last duplicate key winning), and every
    byte is parsed, since unknown keys are refused rather than skipped. What only the
    lenient stdlib reader takes (NaN, lone surrogates, ints over its digit limit, which it
    refuses), a run value that is not an object, a step or tool call that is not an object:
    None, and the caller reads the document as `codec.decode` does, so such a record loads,
    or fails, exactly as before.
    """
    try:
        parts = _PARTS.decode(body)
        run = _VALUE.decode(parts.run)
        if run is not None and type(run) is not dict:
            return None
        decode = _OBJECT.decode
        steps = None if lazy else {sid: decode(raw) for sid, raw in parts.steps.items()}
        tool_log = {sid: [decode(raw) for raw in calls] for sid, calls in parts.tool_log.items()}
    except (msgspec.MsgspecError, RecursionError, ValueError):
        return None
    return SplitBody(run, steps, parts.steps, parts.removed, tool_log, parts.tool_log)


def read_document(text: bytes, key: str, stored_size: int,
                  document: tuple[codec.RecordHeader, memoryview] | None = None,
                  hashed: Callable[[], bool] | None = None, lazy: bool = False) -> codec.Record:
    """`codec.decode_text`, with the body as a `SplitBody` where it has the plain layout.

    `document` is `codec.split_document(text)` if the caller has it already, and `hashed`
    a wait for `codec.body_ok` of it running elsewhere (the body is parsed meanwhile).
    """
    if document is None:
        document, hashed = codec.split_document(text), None
    if document is not None:
        if hashed is None:
            body = split_body(document[1], lazy) if codec.body_ok(*document) else None
        else:
            body = split_body(document[1], lazy)
            if not hashed():
                body = None
        if body is not None:
            return codec.Record(header=document[0], body=body, stored_size=stored_size)
    return codec.decode_text(text, key, stored_size)


def decode_run_file(data: bytes, rf: RunFile, run_id: str,
                    max_decoded: int = codec.DEFAULT_MAX_DECODED_BYTES, *,
                    split: bool = False) -> codec.Record:
    """Decode a run file and check that its header is the file its key says it is.

    A record copied under another run's or version's name decodes perfectly; only this check
    tells it is not ours. Raises CorruptFileError (MisplacedFileError for a header/key mismatch,
    UnsupportedFormatError for a newer format). With `split`, the body may be a `SplitBody`.
    """
    if split:
        return check_placed(read_document(codec.decompress(data, rf.key, max_decoded), rf.key,
                                          len(data)), rf, run_id)
    return check_placed(codec.decode(data, rf.key, max_decoded), rf, run_id)


def read_run_header(data: bytes, rf: RunFile, run_id: str,
                    max_decoded: int = codec.DEFAULT_MAX_DECODED_BYTES) -> codec.RecordHeader:
    """`decode_run_file`'s header, without decoding the body (`codec.read_header`): which
    record a file is, for a caller that does not need its state."""
    header = codec.read_header(data, rf.key, max_decoded)
    check_placed_header(header, rf, run_id)
    return header


def loadable_versions(headers: Mapping[RunFile, codec.RecordHeader | None]) -> set[int]:
    """The versions a load of exactly that version reaches (`plan_load` with `exact`), from the
    run's files' headers (None: a file that does not read): what a restore can target.

    By names alone (`RunIndex.name_path`), only the chain from the newest snapshot counted:
    `versions` offered a point whose snapshot was damaged (the restore failed) and hid older
    ones that load. Here a version counts when a chain of readable files joins it to a readable
    snapshot or to version 0, each record's base and base hash matching what precedes it: the
    rule `follow` walks. One pass in version order (a record's base is always below it).
    """
    reach = {(0, "")}
    reach.update((h.version, h.hash) for rf, h in headers.items() if h is not None and rf.kind == "snap")
    records = [h for rf, h in headers.items() if h is not None and rf.kind != "snap"]
    for h in sorted(records, key=lambda rec: rec.version):
        if (h.base, h.base_hash) in reach:
            reach.add((h.version, h.hash))
    return {version for version, _hash in reach if version > 0}


def check_placed(rec: codec.Record, rf: RunFile, run_id: str) -> codec.Record:
    """`rec` if its header names the run, kind, version and base its key `rf` names."""
    check_placed_header(rec.header, rf, run_id)
    return rec


def check_placed_header(h: codec.RecordHeader, rf: RunFile, run_id: str) -> None:
    """Raise unless the header names the run, kind, version and base its key `rf` names."""
    expected = RECORD_KIND[rf.kind]
    if h.kind != expected or h.run_id != run_id or h.version != rf.version or (
            rf.kind != "log" and h.base != rf.base):
        raise MisplacedFileError(rf.key, f"header says {h.kind} of run {h.run_id!r} v{h.version} "
                                         f"(base {h.base}); the file name says {expected} of run "
                                         f"{run_id!r} v{rf.version}"
                                         + case_twins_hint(run_id, [str(h.run_id)]))
    if rf.kind == "snap" and h.base_hash != h.hash:
        raise BrokenChainError(rf.key, "snapshot base_hash differs from its own hash")


def collect_refs(body: Any, out: dict[str, ArtifactRef]) -> None:
    """Add every artifact a record body points at to `out` (by sha256).

    Both the `$refs` entries the store writes and ArtifactRefs kept in user data count: prune
    must not collect, nor mirror forget, bytes a user put in a step's metadata. A snapshot of a
    long run is tens of thousands of small dicts, so the walk stays lean: exact type checks,
    and the key test only on dicts that have a "sha256" key.
    """
    stack = [body]
    pop, push = stack.pop, stack.append
    while stack:
        o = pop()
        if type(o) is dict:
            if "sha256" in o:
                uri, sha, size = o.get("uri"), o["sha256"], o.get("size")
                if (isinstance(uri, str) and isinstance(sha, str) and isinstance(size, int)
                        and parse_artifact_key(uri) == sha):
                    if sha not in out:
                        out[sha] = ArtifactRef.model_validate(
                            {k: o[k] for k in ("uri", "sha256", "size", "media_type", "summary")
                             if k in o})
                    continue
            for v in o.values():
                t = type(v)
                if t is dict or t is list:
                    push(v)
        elif type(o) is list:
            for v in o:
                t = type(v)
                if t is dict or t is list:
                    push(v)


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

    def name_path(self) -> list[RunFile] | None:
        """The files a load would read judged by their names alone, [start?, records...]; no reads.

        Advisory: cheap enough to decide whether a mirror is up to date and what to prefetch in
        parallel, but only `plan_load` (which reads headers and checks hashes) decides.
        """
        snaps = self.snaps
        logs = {f.version: f for f in self.logs}
        out: list[RunFile] = []
        if snaps:
            out.append(snaps[0])
            cursor = snaps[0].version
        elif 0 in self.deltas or 1 in logs:
            cursor = 0
        else:
            return None
        while cursor < self.limit:
            ds = [d for d in self.deltas.get(cursor, []) if d.version <= self.limit]
            nxt = ds[0] if ds else logs.get(cursor + 1)
            if nxt is None:
                break
            out.append(nxt)
            cursor = nxt.version
        return out

    def follow(self, cursor: int, chash: str, read: Read, ceiling: int | None = None,
               run_id: str = "", *, deltas: bool = True) -> Iterator[tuple[RunFile, codec.Record]]:
        """Yield each next record from (`cursor`, `chash`) up to `ceiling` (default: limit).

        At each version the largest delta whose base hash matches wins, else the next journal
        record that continues the hash chain (a branch written after a fallback names an older
        base, so records are matched by their header's base, not by the next number).
        `deltas=False` walks the journal alone: verify replays it against deltas and snapshots.
        """
        top = self.limit if ceiling is None else ceiling
        while cursor < top:
            nxt: tuple[RunFile, codec.Record] | None = None
            for d in self.deltas.get(cursor, []) if deltas else []:
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


@dataclass
class LoadPath:
    """What a load of a run reads: a start (a snapshot, or None for version 0) and the records
    applied on top of it, in order. A restore point is exactly these files."""

    run_id: str
    start: RunFile | None
    start_record: codec.Record | None
    records: list[tuple[RunFile, codec.Record]]
    version: int
    hash: str

    @property
    def files(self) -> list[RunFile]:
        """Copy order (restic's: what is referenced first): records in chain order, the start last."""
        return [rf for rf, _ in self.records] + ([self.start] if self.start else [])

    def bodies(self) -> Iterator[Any]:
        """Record bodies in the order a load applies them: the start's first."""
        if self.start_record is not None:
            yield self.start_record.body
        for _rf, rec in self.records:
            yield rec.body

    def refs(self) -> dict[str, ArtifactRef]:
        """Every artifact this load needs, by sha256."""
        out: dict[str, ArtifactRef] = {}
        for body in self.bodies():
            collect_refs(body.as_dict() if isinstance(body, SplitBody) else body, out)
        return out


Accept = Callable[[LoadPath], bool]


def plan_load(index: RunIndex, read: Read, *, run_id: str = "", ceiling: int | None = None,
              exact: bool = False, accept: Accept | None = None) -> LoadPath | None:
    """The chain a load follows: the load rule, stated once.

    Newest snapshot that decodes, else version 0 while its chain is there; then `follow` to
    `ceiling` (default: the newest version listed). With `exact`, only a chain that ends at the
    ceiling counts (a load of one stored version). `accept` lets the store refuse a state that
    does not validate (a bad step graph): the walk is then retried one record shorter from the
    same start, exactly as the store's load has always done. None when nothing loads.
    """
    top = index.limit if ceiling is None else ceiling
    for start in index.starts():
        if start is not None and start.version > top:
            continue
        start_rec: codec.Record | None = None
        cursor0, hash0 = 0, ""
        if start is not None:
            start_rec = read(start)
            if start_rec is None:
                continue
            cursor0, hash0 = start.version, start_rec.header.hash
        limit = top
        while True:
            records = list(index.follow(cursor0, hash0, read, limit, run_id))
            version = records[-1][1].header.version if records else cursor0
            vhash = records[-1][1].header.hash if records else hash0
            path = LoadPath(run_id, start, start_rec, records, version, vhash)
            usable = (start is not None or records) and (not exact or version == top)
            if usable and (accept is None or accept(path)):
                return path
            if usable and accept is not None and records:
                limit = version - 1  # the newest state is invalid: one record short
                continue
            break
    return None


class _Read(NamedTuple):
    """A file read and decompressed: the part of decoding that runs on another thread."""

    data: bytes
    text: bytes | None
    document: tuple[codec.RecordHeader, memoryview] | None  # split_document's, not yet hashed
    error: CorruptFileError | None  # what decompress raised
    seconds: tuple[float, float]  # fetch, decompress


@dataclass
class _Ahead:
    """A prefetched file: its read, there before its body is hashed, and that hash's check."""

    rf: RunFile
    read: Future[_Read] = field(default_factory=Future)
    hashed: Future[bool] | None = None  # the pool's task: read, then codec.body_ok


@dataclass
class RecordCache:
    """Reads and decodes a run's files once each; a file that fails is remembered as failed.

    `fetch` returns a file's bytes (FileNotFoundError propagates: a file vanished during the
    read, e.g. under another writer's retention, and the caller decides whether to re-plan).
    What failed is in `problems`, one line each, as the load's warnings name it.
    """

    run_id: str
    fetch: Callable[[str], bytes]
    max_decoded: int = codec.DEFAULT_MAX_DECODED_BYTES
    keep_raw: bool = False
    strict_format: bool = False  # a newer format stops the load instead of being skipped
    split: bool = False  # bodies as SplitBody where they have the plain layout (the load's)
    lazy_steps: bool = False  # ... with their steps left unparsed (SplitBody.steps None)
    # How a skipped file is logged. The loader reads a run's files again for each attempt and
    # names what it skipped in one warning of its own, so its caches log each file at INFO (-v);
    # other readers (mirror, restore) keep the warning.
    skip_level: int = logging.WARNING
    records: dict[str, codec.Record | None] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    errors: dict[str, CorruptFileError] = field(default_factory=dict)
    # Seconds spent, summed over files (prefetching overlaps them): fetch, decompress (with
    # the trailer's sha256), parse (JSON; the body's sha256 too where it is not prefetched).
    timings: dict[str, float] = field(default_factory=dict)
    pending: dict[str, _Ahead] = field(default_factory=dict)
    early: dict[str, tuple[codec.Record | Exception, bytes]] = field(default_factory=dict)

    def prefetch(self, files: list[RunFile], pool: Executor) -> None:
        """Start reading, decompressing and hashing `files` on `pool`; `read` finishes each.

        Reads overlap their round trips, and zstd and hashlib let go of the GIL: a file
        decompresses, and its body hashes while it is parsed, beside the reading thread
        parsing (the parsing stays on that thread: two threads parsing only take turns);
        while it waits for one file it parses those already there. A file's outcome, what it
        raises included, is only reported when it is read, in the order files are read, as
        without prefetching; a file prefetched but never read is never reported.
        """
        for rf in files:
            if rf.key not in self.records and rf.key not in self.pending:
                ahead = _Ahead(rf)
                ahead.hashed = pool.submit(self._read_ahead, ahead)
                self.pending[rf.key] = ahead

    def _read_ahead(self, ahead: _Ahead) -> bool:
        try:
            got = self._read(ahead.rf)
        except BaseException as exc:
            ahead.read.set_exception(exc)
            raise
        ahead.read.set_result(got)  # the reading thread may parse it now
        return got.document is None or codec.body_ok(*got.document)

    def _read(self, rf: RunFile) -> _Read:
        t0 = time.perf_counter()
        data = self.fetch(rf.key)  # UnreadableFileError (a link, a FIFO, no permission): skipped
        t1 = time.perf_counter()
        text = document = error = None
        try:
            text = codec.decompress(data, rf.key, self.max_decoded)
        except CorruptFileError as exc:
            error = exc
        if text is not None and self.split:
            document = codec.split_document(text)
        return _Read(data, text, document, error, (t1 - t0, time.perf_counter() - t1))

    def _outcome(self, rf: RunFile) -> tuple[codec.Record | Exception, bytes]:
        if rf.key in self.early:
            return self.early.pop(rf.key)
        ahead = self.pending.pop(rf.key, None)
        if ahead is None:
            got = self._read(rf)
            return self._decoded(rf, got, None)
        while not ahead.read.done():  # parse what is there while this one is on its way
            if not self._finish_ready():
                wait([ahead.read, *(a.read for a in self.pending.values())],
                     return_when=FIRST_COMPLETED)
        assert ahead.hashed is not None
        return self._decoded(rf, ahead.read.result(), ahead.hashed.result)

    def _decoded(self, rf: RunFile, got: _Read, hashed: Callable[[], bool] | None
                 ) -> tuple[codec.Record | Exception, bytes]:
        """Decode what `_read` got (`hashed`: the wait for its body's hash check, if one runs
        elsewhere): the record, or the CorruptFileError `decode_run_file` would raise."""
        t0 = time.perf_counter()
        try:
            if got.error is not None:
                raise got.error
            assert got.text is not None
            rec = check_placed(read_document(got.text, rf.key, len(got.data), got.document,
                                             hashed, self.lazy_steps)
                               if self.split else
                               codec.decode_text(got.text, rf.key, len(got.data)),
                               rf, self.run_id)
        except CorruptFileError as exc:
            return exc, got.data
        for what, spent in zip(("fetch", "decompress", "parse"),
                               (*got.seconds, time.perf_counter() - t0), strict=True):
            self.timings[what] = self.timings.get(what, 0.0) + spent
        return rec, got.data

    def _finish_ready(self) -> bool:
        """Decode one prefetched file that is there, for its read to report; False if none."""
        for key, ahead in self.pending.items():
            if ahead.read.done() and ahead.hashed is not None:
                del self.pending[key]
                try:
                    self.early[key] = self._decoded(ahead.rf, ahead.read.result(),
                                                    ahead.hashed.result)
                except Exception as exc:  # what its read raised: raised when it is read
                    self.early[key] = (exc, b"")
                return True
        return False

    def load(self, rf: RunFile) -> None:
        if rf.key in self.records:
            return
        try:
            outcome, data = self._outcome(rf)
            if isinstance(outcome, Exception):
                raise outcome
        except CorruptFileError as exc:
            if self.strict_format and isinstance(exc, UnsupportedFormatError):
                raise
            self.fail(rf, exc)
            return
        if self.keep_raw:
            self.raw[rf.key] = data
        self.records[rf.key] = outcome

    def fail(self, rf: RunFile, exc: CorruptFileError) -> None:
        """Remember a file as unusable (also for a reason found above the codec)."""
        logger.log(self.skip_level, "run %s: skipping %s", self.run_id, exc)
        self.problems.append(str(exc))
        self.errors[rf.key] = exc
        self.records[rf.key] = None

    def read(self, rf: RunFile) -> codec.Record | None:
        self.load(rf)
        return self.records[rf.key]
