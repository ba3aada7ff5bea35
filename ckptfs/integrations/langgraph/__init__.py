"""The LangGraph checkpointer, beside the stack: `from ckptfs.integrations.langgraph import CkptfsSaver`.

The saver needs `pip install 'ckptfs[langgraph]'`; its key names (`keys`), byte format (`codec`),
thread leases (`ownership`), version arithmetic (`versions`), read plans (`plans`), removal
(`pruning`) and the checker `verify` runs (`check`) need nothing from LangGraph, so they are
importable without it: the saver is only imported when its name is asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CkptfsSaver", "ThreadBusyError"]


def __getattr__(name: str) -> Any:
    if name == "CkptfsSaver":
        from ckptfs.integrations.langgraph.saver import CkptfsSaver

        return CkptfsSaver
    if name == "ThreadBusyError":  # one writer per thread (ownership.py): needs no LangGraph
        from ckptfs.integrations.langgraph.ownership import ThreadBusyError

        return ThreadBusyError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
