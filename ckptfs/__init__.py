"""ckptfs: durable, versioned, zstd-compressed checkpoints for long-running agents.

One URL configures where they live (`/path`, `file:///path`, `s3://bucket/prefix`,
`memory://name`); see README.md for what is guaranteed.
"""

from ckptfs.errors import (
    CheckpointCorruptError,
    CkptfsError,
    ConfigError,
    ConflictError,
    CorruptFileError,
    DecodeLimitError,
    InvalidIdError,
    StorageUnavailableError,
    UnsupportedFormatError,
    VersionNotFoundError,
)
from ckptfs.models import AgentRun, ArtifactRef, Step, StepStatus, ToolCall
from ckptfs.storage import Capabilities, Storage, open_storage
from ckptfs.store import CheckpointStore, CompactionPolicy, RetentionResult

__version__ = "0.1.0"

__all__ = [
    "AgentRun",
    "ArtifactRef",
    "Capabilities",
    "CheckpointCorruptError",
    "CheckpointStore",
    "CkptfsError",
    "CompactionPolicy",
    "ConfigError",
    "ConflictError",
    "CorruptFileError",
    "DecodeLimitError",
    "InvalidIdError",
    "RetentionResult",
    "Step",
    "StepStatus",
    "Storage",
    "StorageUnavailableError",
    "ToolCall",
    "UnsupportedFormatError",
    "VersionNotFoundError",
    "__version__",
    "open_storage",
]
