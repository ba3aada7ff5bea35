"""The few domain errors ckptfs raises, in one place, each naming what it is about.

Storage-level absence and exclusivity use the builtins (`FileNotFoundError`,
`FileExistsError`) as fsspec does; these classes are for what a caller must act on.
"""

from __future__ import annotations

from typing import Any


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


class ConflictError(CkptfsError):
    """Another writer already committed this version of the run; nothing was overwritten."""

    def __init__(self, run_id: str, version: int, detail: str = "") -> None:
        self.run_id = run_id
        self.version = version
        msg = f"run {run_id!r}: version {version} was already committed by another writer"
        super().__init__(f"{msg}: {detail}" if detail else msg)


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


class DecodeLimitError(CorruptFileError):
    """A file would decompress past the configured maximum (a zstd bomb, or a limit too low)."""


class UnsupportedFormatError(CorruptFileError):
    """A file written in a format version this ckptfs does not know (likely a newer ckptfs)."""


class CheckpointCorruptError(CkptfsError):
    """Files exist for a run but none of them yields a valid state: never start from scratch."""

    def __init__(self, run_id: str, problems: list[str]) -> None:
        self.run_id = run_id
        self.problems = problems
        shown = "; ".join(problems[:5]) + (f"; (+{len(problems) - 5} more)" if len(problems) > 5 else "")
        super().__init__(f"run {run_id!r}: no stored version could be loaded: {shown}")


class VersionNotFoundError(CkptfsError, LookupError):
    """The asked-for version is not stored (never written, or removed by retention)."""

    def __init__(self, run_id: str, version: int) -> None:
        self.run_id = run_id
        self.version = version
        super().__init__(f"run {run_id!r}: version {version} is not available")
