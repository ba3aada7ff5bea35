"""Channel versions of any monotonic type: the saver continues a thread in the type it was written.

LangGraph leaves the type of a channel version to the checkpointer (`get_next_version`): the
default is an int, InMemorySaver, SqliteSaver and PostgresSaver write strings such as
"00000000000000000000000000000002.0.2437985..." (a 32-digit counter, a dot, a random number),
and a float is allowed too. LangGraph only ever compares versions of one thread with each other
(`max()` over a checkpoint's versions, `version > seen`), so a thread must keep the type it
started with: an int next to a string would make `max()` raise. A thread migrated in from
another saver (`ckptfs import-langgraph`, or a hand copy) therefore continues with strings in the
same layout, and CkptfsSaver's own threads keep their ints.

The one call without a current version, `next_version(None)`, is LangGraph giving a channel its
first version; for a channel added to a thread that already has versions, that version must be
of the thread's type. The saver learns the type when it reads the thread (`remember_kind`) in the
calling context (a contextvar: the same thread of a sync run, the same task of an async one).
This module needs nothing from LangGraph.
"""

from __future__ import annotations

import contextvars
import random
from collections.abc import Iterable
from typing import Literal

Version = int | float | str
Kind = Literal["int", "float", "str"]

STR_DIGITS = 32  # the counter's width in LangGraph's string versions

_kind: contextvars.ContextVar[Kind | None] = contextvars.ContextVar("ckptfs_lg_version_kind", default=None)


def kind_of(versions: Iterable[object]) -> Kind | None:
    """The type of a thread's versions (the first one decides, as LangGraph's null version does)."""
    for version in versions:
        if isinstance(version, bool):
            continue
        if isinstance(version, str):
            return "str"
        if isinstance(version, float):
            return "float"
        if isinstance(version, int):
            return "int"
    return None


def remember_kind(kind: Kind | None) -> None:
    """What the thread just read in this context uses: a first version given here matches it."""
    _kind.set(kind)


def _first(kind: Kind | None) -> Version:
    if kind == "str":
        return _str_version(1)
    if kind == "float":
        return 1.0
    return 1


def _str_version(counter: int) -> str:
    # the layout of InMemorySaver / SqliteSaver / PostgresSaver: the random tail keeps two
    # branches that reach the same counter apart, and readers that split on "." find the counter
    return f"{counter:0{STR_DIGITS}}.{random.random():016}"


def next_version(current: Version | None) -> Version:
    """The version after `current`, of the same type, strictly greater than it.

    ValueError for a string whose layout cannot be continued in order (no leading counter, or
    one written with fewer digits that a 32-digit successor would sort before).
    """
    if current is None:
        return _first(_kind.get())
    if isinstance(current, bool):
        raise ValueError(f"channel version {current!r} is a bool, not a monotonic version")
    if isinstance(current, int):
        return current + 1
    if isinstance(current, float):
        return current + 1.0
    if isinstance(current, str):
        head = current.split(".", 1)[0]
        if not head.isdigit():
            raise ValueError(f"channel version {current!r} does not start with a counter: cannot continue it")
        successor = _str_version(int(head) + 1)
        if successor <= current:
            raise ValueError(f"channel version {current!r}: its successor {successor!r} would not sort "
                             "after it, so the thread cannot be continued in order")
        return successor
    raise ValueError(f"channel version {current!r} is a {type(current).__name__}, not int, float or str")
