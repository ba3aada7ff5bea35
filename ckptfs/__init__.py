"""ckptfs: durable, versioned, zstd-compressed checkpoints for long-running agents.

One URL configures where they live (`/path`, `file:///path`, `s3://bucket/prefix`,
`memory://name`); see README.md for what is guaranteed.
"""

from ckptfs.config import Settings, load_settings
from ckptfs.errors import (
    CheckpointCorruptError,
    CkptfsError,
    ConfigError,
    ConflictError,
    CorruptFileError,
    DecodeLimitError,
    InvalidIdError,
    LeaseLostError,
    StepCompletedError,
    StorageUnavailableError,
    UnsupportedFormatError,
    VersionNotFoundError,
)
from ckptfs.format.models import AgentRun, ArtifactRef, Step, StepStatus, ToolCall
from ckptfs.maintenance.prune import PruneReport, prune
from ckptfs.maintenance.verify import Finding, Report, verify
from ckptfs.replication.mirror import (
    MirrorJob,
    MirrorReport,
    RestoreReport,
    mirror,
    restore,
    restore_points,
)
from ckptfs.runtime.agent import (
    CheckpointedAgent,
    ProgressEvent,
    RetriesExhaustedError,
    RunStoppedError,
    StepResult,
)
from ckptfs.runtime.policy import CheckpointPolicy, RetryPolicy
from ckptfs.runtime.resume import ResumeBrief
from ckptfs.runtime.tools import Done, IdempotentToolRunner, UnconfirmedActionError, cache_key
from ckptfs.runtime.worker import Worker, WorkReport
from ckptfs.storage.base import Capabilities, Storage
from ckptfs.storage.registry import open_storage
from ckptfs.storage.retry import RetryingStorage
from ckptfs.store.checkpoint_store import CheckpointStore, CompactionPolicy, RetentionResult
from ckptfs.store.leases import Lease, LeaseManager

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`ckptfs.CkptfsSaver` without importing LangGraph at `import ckptfs` (optional extra)."""
    if name == "CkptfsSaver":
        from ckptfs.integrations.langgraph.saver import CkptfsSaver

        return CkptfsSaver
    raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")


__all__ = [
    "AgentRun",
    "ArtifactRef",
    "Capabilities",
    "CheckpointCorruptError",
    "CheckpointPolicy",
    "CheckpointStore",
    "CheckpointedAgent",
    "CkptfsError",
    "CompactionPolicy",
    "ConfigError",
    "ConflictError",
    "CorruptFileError",
    "DecodeLimitError",
    "Done",
    "Finding",
    "IdempotentToolRunner",
    "InvalidIdError",
    "Lease",
    "LeaseLostError",
    "LeaseManager",
    "MirrorJob",
    "MirrorReport",
    "ProgressEvent",
    "PruneReport",
    "Report",
    "RestoreReport",
    "ResumeBrief",
    "RetentionResult",
    "RetriesExhaustedError",
    "RetryPolicy",
    "RetryingStorage",
    "RunStoppedError",
    "Settings",
    "Step",
    "StepCompletedError",
    "StepResult",
    "StepStatus",
    "Storage",
    "StorageUnavailableError",
    "ToolCall",
    "UnconfirmedActionError",
    "UnsupportedFormatError",
    "VersionNotFoundError",
    "WorkReport",
    "Worker",
    "__version__",
    "cache_key",
    "load_settings",
    "mirror",
    "open_storage",
    "prune",
    "restore",
    "restore_points",
    "verify",
]
