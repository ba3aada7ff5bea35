"""The few domain errors ckptfs raises, in one place, each naming what it is about.

Storage-level absence and exclusivity use the builtins (`FileNotFoundError`,
`FileExistsError`) as fsspec does; these classes are for what a caller must act on.
"""

from __future__ import annotations

import re
from typing import Any, Literal

SHOWN_CHARS = 40  # what a message quotes of a value someone gave


def quote_value(text: str, limit: int = SHOWN_CHARS) -> str:
    """A value a caller gave, quoted for an error message or a log line: whole up to `limit`
    characters, else its first `limit` and its length.

    A message that echoes a bad value whole is as long as the value: a 5,000-character cron
    expression or duration made a 5,000-character error (and log) line, which buries the one
    useful word and tells nothing the first characters do not. Here, the lowest layer, so the
    library's messages and the CLI's (`cli._common.quoted`) cut values the same way.
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


NAMED_CHARS = 160  # what a message shows of a name (a URL, a settings key) before cutting it


def name_cut(text: str) -> str:
    """A name a caller gave (a settings key, a store URL) as a message shows it: bare, as
    messages have always named it, up to NAMED_CHARS characters (an ordinary bucket and prefix
    is shown whole, so an operator can tell which store it was); past that `quote_value`, so
    the cut is visibly a cut and says the length (a 5,000-character URL, repeated by a message,
    made it 15,000 characters long)."""
    return text if len(text) <= NAMED_CHARS else quote_value(text, NAMED_CHARS)


_LONG_WORD = re.compile(rf"\S{{{SHOWN_CHARS + 1},}}")
_LONG_RUN = re.compile(rf"[^'\"()]{{{SHOWN_CHARS + 1},}}")


def cut_long_words(text: str) -> str:
    """Another library's message (APScheduler's reason, an fsspec backend's error) with each
    word longer than SHOWN_CHARS cut to its start and its length.

    Such a message repeats the value it refused, and parts of it, whole ("Error validating
    expression '1-555…': the last value (555…) is higher ..."): a 5,000-character value made a
    message three times as long. The quotes and parentheses around a value are kept, so the
    sentence still reads; a word that is long for its quotes alone (5,000 of them) is cut whole.
    Secrets must be scrubbed before: a cut secret is no longer found whole to hide.
    """
    def cut(run: str) -> str:
        return f"{run[:SHOWN_CHARS]}… ({len(run)} characters)"

    def word(m: re.Match[str]) -> str:
        inner = _LONG_RUN.sub(lambda r: cut(r[0]), m[0])
        return inner if len(inner) <= 3 * SHOWN_CHARS else cut(m[0])

    return _LONG_WORD.sub(word, text)


class CkptfsError(Exception):
    """Base of every ckptfs error, so callers can catch the family at once.

    Picklable whatever a subclass's constructor takes, so an error crosses a process boundary
    (multiprocessing pools, a worker's result) intact instead of failing to unpickle.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[CkptfsError], args: tuple[Any, ...], state: dict[str, Any]) -> CkptfsError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class InvalidIdError(CkptfsError, ValueError):
    """A run or step id that cannot safely become part of a storage key."""


class ConfigError(CkptfsError, ValueError):
    """A setting, URL or argument that is wrong; the message names it."""


class StorageUnavailableError(CkptfsError, OSError):
    """The store cannot be reached or used: bad URL, missing bucket, refused credentials.

    The message names the URL with any credentials redacted.
    """


class StoreNotWritableError(StorageUnavailableError, PermissionError):
    """A write the store cannot make: the directory or filesystem is read-only to this user, or
    the key's directory is a symbolic link (never written through) or something else than a
    directory. The message names the store (redacted) and the key.

    A `PermissionError` too, so retry layers treat it as permanent (no retry loop against a
    read-only store), and a `StorageUnavailableError`, so the CLI prints one line and exits 2.
    Reading the same store still works: reading needs no write permission.
    """


class RunNotFoundError(CkptfsError, KeyError):
    """A write to a run that has no saved state (save_run it first), or a step it does not have.

    A KeyError too, for callers of the seed's API; its message is not quoted as a KeyError's is.
    """

    def __str__(self) -> str:
        return Exception.__str__(self)


class InvalidGraphError(CkptfsError, ValueError):
    """A commit refused because the step graph would not be runnable: a cycle, an unknown or
    removed dependency, a COMPLETED step without a result. Nothing was written."""


class ConflictError(CkptfsError):
    """Another writer already committed this version of the run; nothing was overwritten."""

    def __init__(self, run_id: str, version: int, detail: str = "") -> None:
        self.run_id = run_id
        self.version = version
        msg = f"run {run_id!r}: version {version} was already committed by another writer"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class BaseRemovedError(ConflictError):
    """A commit built on a version that is gone: retention removed it (another writer moved
    the run on and pruned) or `forget` removed the run while this one held an old head. Its
    record was withdrawn; reload the run (a load then says which: a newer version, or none)."""

    def __init__(self, run_id: str, version: int, base: int) -> None:
        self.run_id = run_id
        self.version = version
        self.base = base
        CkptfsError.__init__(self, f"run {run_id!r}: version {version} not written: the version "
                             f"it builds on, v{base}, is no longer stored (removed by retention after "
                             "another writer moved the run on, or by a forget of the run); reload "
                             "the run: it continues from the newest version, or is gone if forgotten")


class StaleStepsError(ConflictError):
    """A commit of steps another writer changed after this process last loaded (or refreshed)
    the run: this process's copy of them is older than the store's. Nothing was written;
    reload the run to continue from the newest version."""

    def __init__(self, run_id: str, version: int, step_ids: list[str]) -> None:
        self.run_id = run_id
        self.version = version
        self.step_ids = step_ids
        shown = ", ".join(repr(name_cut(s)) for s in step_ids[:5])
        more = f" and {len(step_ids) - 5} more" if len(step_ids) > 5 else ""
        CkptfsError.__init__(self, f"run {run_id!r}: version {version} not written: step(s) "
                             f"{shown}{more} were changed by another writer after this copy of "
                             "the run was loaded; reload the run to continue from the newest "
                             "version")


class RunBusyError(ConflictError):
    """The run is being executed by another agent of this process on the same store: one
    execution per run at a time (a `Worker` is how several share one run)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.version = 0
        CkptfsError.__init__(self, f"run {run_id!r} is being executed by another agent on this "
                             "store; one execution per run at a time (Worker shares a run among "
                             "several)")


class UnstorableValueError(CkptfsError, ValueError):
    """A commit refused because a load could not give back what it was asked to store.

    Whatever a commit acknowledges, a fresh load must return. JSON has no NaN or infinity
    (pydantic writes them as null, which a float field then refuses), Python's JSON reader
    refuses ints over 4,300 digits, a set or a tuple would come back as a list, and a record
    over the store's `max_decoded_bytes` is refused whole. Acknowledging one of these leaves a
    record every later load skips, and each later, innocent commit is lost with it; so the
    commit is refused before anything is written and the writer's state is as it was.

    `run_id` and `step_id` (None for run-level fields and whole records) say whose value it is,
    `field` where (a dotted path: `cost_usd`, `metadata.scores[3]`), `reason` what is wrong.
    A ValueError too: the caller passed a value the store cannot keep.
    """

    def __init__(self, run_id: str | None, step_id: str | None, field: str, reason: str) -> None:
        self.run_id = run_id
        self.step_id = step_id
        self.field = field
        self.reason = reason
        where = [f"run {run_id!r}"] if run_id is not None else []
        if step_id is not None:
            where.append(f"step {step_id!r}")
        where.append(field)
        super().__init__(f"{': '.join(where)}: {reason}; refused, nothing was written")


def error_text(exc: BaseException) -> str:
    """`Type: message` of an exception, as a record keeps it (a step's error, a failed tool
    call's): JSON cannot hold a lone surrogate, which an OS error names a file with when its
    name is not UTF-8 (surrogateescape), so those are written as `\\udcff`. Kept raw, the
    record of a tool's own failure was refused as an unstorable *result* (the run stopped, the
    tool's error lost) and a step's error made its commit fail."""
    try:
        msg = str(exc)
    except Exception:  # a __str__ that raises: the type still says something
        msg = f"<{type(exc).__name__} whose message cannot be read>"
    return f"{type(exc).__name__}: {msg}".encode("utf-8", "backslashreplace").decode("utf-8")


class UnstorableResultError(UnstorableValueError, TypeError):
    """A tool's result JSON cannot hold at all (an arbitrary object, bytes that are not UTF-8,
    a lone surrogate), found as the paid call is logged: the run stops at its step, as for NaN,
    rather than failing it. A TypeError too, as this was before it was a refusal."""


class NonFiniteValueError(UnstorableValueError):
    """NaN or an infinity: JSON cannot hold it (a load would read null, or refuse the record)."""


class RecordTooLargeError(UnstorableValueError):
    """The record would decode to more than the store's `max_decoded_bytes`, which a load refuses."""


class VersionLimitError(CkptfsError):
    """The run's next version would be past the largest one a key can name (12 digits).

    No run gets there by committing (10**12 commits); a file planted at the top of the journal
    does. A version whose key the loader does not parse would be acknowledged and never loaded,
    so the commit is refused; the message names the file that pushed the version up.
    """

    def __init__(self, run_id: str, version: int, detail: str) -> None:
        self.run_id = run_id
        self.version = version
        super().__init__(f"run {run_id!r}: cannot commit version {version}: {detail}")


class KeyOccupiedError(CkptfsError):
    """The key of the next version holds something no load can see (on a filesystem: a
    directory), so it is neither a lost race nor a damaged record to branch past: every commit
    would fail there forever. Nothing was written; the message names the path to move away."""

    def __init__(self, run_id: str, version: int, key: str, detail: str) -> None:
        self.run_id = run_id
        self.version = version
        self.key = key
        super().__init__(f"run {run_id!r}: cannot commit version {version}: {key} {detail}")


class LeaseLostError(CkptfsError):
    """This worker no longer holds the step's lease: another took it over (its generation is
    newer) or the step is already done. Nothing was written; stop working on the step."""

    def __init__(self, run_id: str, step_id: str, generation: int, detail: str) -> None:
        self.step_id = step_id
        self.generation = generation
        self.run_id = run_id
        super().__init__(f"run {run_id!r}: lost the lease of step {step_id!r} "
                         f"(generation {generation}): {detail}")


class StepCompletedError(LeaseLostError):
    """The step finished (completed, failed for good, skipped) under another lease meanwhile:
    its outcome stands; do not run it again."""


class CorruptFileError(CkptfsError):
    """One stored file failed to decode or validate (checksum, hash, schema, chain)."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}")


class MisplacedFileError(CorruptFileError):
    """A file that decodes but is not the file its key names (copied from another run or version)."""


class UnreadableFileError(CorruptFileError):
    """A stored name that cannot be read as one of our files: not a regular file (a symbolic
    link, even a dangling one; a FIFO, socket or device), reached through a link below the store
    root, or refused by the system (permission denied).

    A `CorruptFileError` on purpose: every reader already skips a damaged file with a warning
    naming its key and falls back to the previous valid state (load, run summaries, verify's
    "unreadable" finding, prune's "cannot be read"), and a file we must not or cannot read is,
    to those readers, exactly that. Links are never followed, so what such a name points at is
    never served as ours.
    """


class BrokenChainError(CorruptFileError):
    """A file whose hashes contradict themselves or the chain they claim to continue."""


class DecodeLimitError(CorruptFileError):
    """A file would decompress past the configured maximum (a zstd bomb, or a limit too low)."""


class UnsupportedFormatError(CorruptFileError):
    """A file written in a format version this ckptfs does not know (likely a newer ckptfs)."""


def first_of(reasons: list[str], most: int = 5) -> str:
    """The first `most` reasons joined, and how many more were left out: one wording wherever a
    list is cut for a message (this error, the CLI's corrupt run, the loader's warning).

    A closing note in parentheses that every shown reason ends with is said once, at the end:
    the case-twins sentence (~170 characters) came three times in one line, once per file."""
    shown = reasons[:most]
    note = _shared_note(shown)
    if note:
        shown = [r[: len(r) - len(note)] for r in shown]
    more = f"; (+{len(reasons) - most} more)" if len(reasons) > most else ""
    return "; ".join(shown) + (f" (each: {note[2:-1]})" if note else "") + more


def _shared_note(reasons: list[str]) -> str:
    """The " (...)" that ends every one of two or more reasons, else ""."""
    if len(reasons) < 2 or not reasons[0].endswith(")"):
        return ""
    first = reasons[0]
    n = min(len(r) for r in reasons)
    common = 0
    while common < n and all(r[-1 - common] == first[-1 - common] for r in reasons):
        common += 1
    tail = first[len(first) - common:]
    start = tail.find(" (")
    while start >= 0:
        note = tail[start:]
        if _closes_at_end(note[1:]) and all(len(r) > len(note) for r in reasons):
            return note
        start = tail.find(" (", start + 1)
    return ""


def _closes_at_end(text: str) -> bool:
    """Whether the parenthesis `text` opens with is closed by its last character."""
    depth = 0
    for pos, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return pos == len(text) - 1
    return False


class CheckpointCorruptError(CkptfsError):
    """Files exist for a run but none of them yields a valid state: never start from scratch."""

    def __init__(self, run_id: str, problems: list[str]) -> None:
        self.run_id = run_id
        self.problems = problems
        super().__init__(f"run {run_id!r}: no stored version could be loaded: {first_of(problems)}")


class VersionNotFoundError(CkptfsError, LookupError):
    """The asked-for version is not stored (never written, or removed by retention)."""

    def __init__(self, run_id: str, version: int) -> None:
        self.run_id = run_id
        self.version = version
        super().__init__(f"run {run_id!r}: version {version} is not available")


class RunStoppedError(CkptfsError):
    """The run stopped at a step it could not get past; its checkpoint is intact for a resume.

    `resume` says where the checkpoint leaves that step, so the message tells the truth about
    a resume: "at_step" (it is to run, the usual stop), "past_step" (it is finished there: a
    step removed or replaced after it finished) or "without_step" (the checkpoint never had
    it: an added step no commit could hold). It only words the message."""

    def __init__(self, run_id: str, step_id: str, attempts: int, cause: BaseException,
                 why: str = "", *,
                 resume: Literal["at_step", "past_step", "without_step"] = "at_step") -> None:
        self.run_id = run_id
        self.step_id = step_id
        self.attempts = attempts
        self.cause = cause
        why = why or f"failed {attempts} time(s), last with {error_text(cause)}"  # a __str__ may raise
        then = {
            "at_step": f"resume_run({run_id!r}) continues at this step",
            "past_step": f"the step is finished there, so resume_run({run_id!r}) goes on past it "
                         "without running it again",
            "without_step": f"the step is not in it, so resume_run({run_id!r}) goes on without it",
        }[resume]
        super().__init__(
            f"run {run_id!r}: step {step_id!r} {why}. The run is stopped with its checkpoint "
            f"intact; {then}")


class RetriesExhaustedError(RunStoppedError):
    """A step failed on every attempt this process had (RetryPolicy.on_exhausted="stop")."""
