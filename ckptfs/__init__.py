"""ckptfs: durable, versioned, zstd-compressed checkpoints for long-running agents.

One URL configures where they live (`/path`, `file:///path`, `s3://bucket/prefix`,
`memory://name`); see README.md for what is guaranteed.

The names below are imported when first used, not at `import ckptfs`: the `ckptfs` command
imports this package too, and the agent runtime, the mirror and the scheduler cost a quarter
of a second it should not pay to print its help. `from ckptfs import X` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptfs.config import (
        Settings,
        load_settings,
    )
    from ckptfs.errors import (
        CheckpointCorruptError,
        CkptfsError,
        ConfigError,
        ConflictError,
        CorruptFileError,
        DecodeLimitError,
        InvalidIdError,
        LeaseLostError,
        RetriesExhaustedError,
        RunStoppedError,
        StepCompletedError,
        StorageUnavailableError,
        UnsupportedFormatError,
        VersionNotFoundError,
    )
    from ckptfs.format.models import (
        AgentRun,
        ArtifactRef,
        Step,
        StepStatus,
        ToolCall,
    )
    from ckptfs.maintenance.prune import (
        PruneReport,
        prune,
    )
    from ckptfs.maintenance.verify import (
        Finding,
        Report,
        verify,
    )
    from ckptfs.replication.job import MirrorJob
    from ckptfs.replication.mirror import mirror
    from ckptfs.replication.report import MirrorReport, RestoreReport
    from ckptfs.replication.restore import restore, restore_points
    from ckptfs.runtime.agent import CheckpointedAgent
    from ckptfs.runtime.execution import ProgressEvent, StepResult
    from ckptfs.runtime.policy import (
        CheckpointPolicy,
        RetryPolicy,
    )
    from ckptfs.runtime.resume import (
        ResumeBrief,
    )
    from ckptfs.runtime.tools import (
        Done,
        IdempotentToolRunner,
        UnconfirmedActionError,
        cache_key,
    )
    from ckptfs.runtime.worker import (
        Worker,
        WorkReport,
    )
    from ckptfs.storage.base import (
        Capabilities,
        Storage,
    )
    from ckptfs.storage.registry import (
        open_storage,
    )
    from ckptfs.storage.retry import (
        RetryingStorage,
    )
    from ckptfs.store.checkpoint_store import CheckpointStore
    from ckptfs.store.compactor import CompactionPolicy
    from ckptfs.store.leases import (
        Lease,
        LeaseManager,
    )
    from ckptfs.store.retention import RetentionResult

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY: dict[str, str] = {
    "AgentRun": "ckptfs.format.models",
    "ArtifactRef": "ckptfs.format.models",
    "Capabilities": "ckptfs.storage.base",
    "CheckpointCorruptError": "ckptfs.errors",
    "CheckpointPolicy": "ckptfs.runtime.policy",
    "CheckpointStore": "ckptfs.store.checkpoint_store",
    "CheckpointedAgent": "ckptfs.runtime.agent",
    "CkptfsError": "ckptfs.errors",
    "CompactionPolicy": "ckptfs.store.compactor",
    "ConfigError": "ckptfs.errors",
    "ConflictError": "ckptfs.errors",
    "CorruptFileError": "ckptfs.errors",
    "DecodeLimitError": "ckptfs.errors",
    "Done": "ckptfs.runtime.tools",
    "Finding": "ckptfs.maintenance.verify",
    "IdempotentToolRunner": "ckptfs.runtime.tools",
    "InvalidIdError": "ckptfs.errors",
    "Lease": "ckptfs.store.leases",
    "LeaseLostError": "ckptfs.errors",
    "LeaseManager": "ckptfs.store.leases",
    "MirrorJob": "ckptfs.replication.job",
    "MirrorReport": "ckptfs.replication.report",
    "ProgressEvent": "ckptfs.runtime.execution",
    "PruneReport": "ckptfs.maintenance.prune",
    "Report": "ckptfs.maintenance.verify",
    "RestoreReport": "ckptfs.replication.report",
    "ResumeBrief": "ckptfs.runtime.resume",
    "RetentionResult": "ckptfs.store.retention",
    "RetriesExhaustedError": "ckptfs.errors",
    "RetryPolicy": "ckptfs.runtime.policy",
    "RetryingStorage": "ckptfs.storage.retry",
    "RunStoppedError": "ckptfs.errors",
    "Settings": "ckptfs.config",
    "Step": "ckptfs.format.models",
    "StepCompletedError": "ckptfs.errors",
    "StepResult": "ckptfs.runtime.execution",
    "StepStatus": "ckptfs.format.models",
    "Storage": "ckptfs.storage.base",
    "StorageUnavailableError": "ckptfs.errors",
    "ToolCall": "ckptfs.format.models",
    "UnconfirmedActionError": "ckptfs.runtime.tools",
    "UnsupportedFormatError": "ckptfs.errors",
    "VersionNotFoundError": "ckptfs.errors",
    "WorkReport": "ckptfs.runtime.worker",
    "Worker": "ckptfs.runtime.worker",
    "cache_key": "ckptfs.runtime.tools",
    "load_settings": "ckptfs.config",
    "mirror": "ckptfs.replication.mirror",
    "open_storage": "ckptfs.storage.registry",
    "prune": "ckptfs.maintenance.prune",
    "restore": "ckptfs.replication.restore",
    "restore_points": "ckptfs.replication.restore",
    "verify": "ckptfs.maintenance.verify",
    "CkptfsSaver": "ckptfs.integrations.langgraph.saver",  # needs the langgraph extra
}


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` on first use, and keep the name here after that."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
