"""Read plans: what a remote reader of a namespace's newest checkpoint must fetch, filed by its writer.

On S3 a delta chain would cost a round trip per link. So the writer, which knows which objects
each channel version is rebuilt from (`needs`), files a plan key beside the checkpoints
(`lg_plan_key`: its body is only a marker). A reader that lists the namespace finds the plan
in force in the same listing and fetches the checkpoint and everything the plan names together.

A plan stays in force while it predicts correctly, so most puts file nothing: with mode "c" a
message list's chain grows by each checkpoint. The writer files a new plan only when the old one
would be wrong. A wrong or missing plan costs requests, never a wrong answer: the chain walk
reads what it needs and checks every link.

This module holds only that state and those decisions. The saver does the storage calls; the
state is per saver and guarded by one lock, because a saver serves many threads at once.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptfs.integrations.langgraph import codec as fmt
from ckptfs.integrations.langgraph.keys import lg_decode, lg_is_plan, lg_parse_plan, lg_plan_key

PLAN_BODY = b"plan\n"  # a read plan is its key; not empty: an exclusive PUT (copy_thread) refuses b""
MAX_NEEDS = 100_000  # remembered read sets; past this they are forgotten at once
# namespaces whose plan in force is remembered; past this they are forgotten at once (a
# subgraph's namespace is new at each call, so one thread alone could grow them without end);
# a forgotten plan costs its namespace's next put one plan filed again, never a wrong read
MAX_PLANS = 10_000

# (thread, namespace, holder checkpoint id, channel): one stored channel version
Version = tuple[str, str, str, str]


def checkpoint_keys(keys: Sequence[str]) -> list[str]:
    """A `ckpt/` listing without its read plans (`lg_plan_key`), which sort after every checkpoint."""
    if not keys or not lg_is_plan(keys[-1]):
        return list(keys)
    return [k for k in keys if not lg_is_plan(k)]


@dataclass
class ReadPlan:
    """The read plan in force in a namespace: set at the plan's checkpoint `start`, `since` the
    checkpoints after it, so what a reader will fetch for the next one is known to its writer."""

    start: str
    mode: str
    ids: frozenset[str]
    since: list[str]

    def predicts(self) -> frozenset[str] | None:
        if self.mode == "s":
            return self.ids
        if self.mode == "c":
            return self.ids | {self.start, *self.since}
        return None


class ReadPlans:
    """One saver's knowledge of read sets and of the plan in force in each namespace."""

    def __init__(self, full_every: int) -> None:
        self.full_every = full_every
        self._lock = threading.Lock()
        self._needs: dict[Version, frozenset[str]] = {}
        self._plans: dict[tuple[str, str], ReadPlan] = {}

    def note_needs(self, version: Version, base: str | None) -> None:
        """Remember which objects a channel version is rebuilt from (its holder, and its base's)."""
        with self._lock:
            below = frozenset() if base is None else self._needs.get((*version[:2], base, version[3]))
            if below is None:
                return
            if len(self._needs) >= MAX_NEEDS:
                self._needs.clear()
            self._needs[version] = below | {version[2]}

    def plan_for(self, thread_id: str, ns: str, checkpoint_id: str, refs: Mapping[str, list[Any]],
                 parts: Sequence[fmt.Part], fresh: Iterable[bytes]) -> str | None:
        """The plan key to file beside a new checkpoint, or None when the plan in force already
        names exactly the objects a reader of it needs (most puts). `refs` are the checkpoint's
        channel refs ([holder id or None, version]), `parts` its stored channel versions and
        `fresh` their serialized values (a long one makes a chain worth naming as such)."""
        for part in parts:
            self.note_needs((thread_id, ns, checkpoint_id, part.channel), part.base)
        with self._lock:
            got = [self._needs.get((thread_id, ns, str(holder), channel))
                   for channel, (holder, _version) in refs.items() if holder is not None]
            need = None if None in got else frozenset(i for ids in got if ids for i in ids) - {checkpoint_id}
            plan = self._plans.get((thread_id, ns))
            if plan is not None and (plan.start == checkpoint_id or checkpoint_id in plan.since):
                return None  # stored again: the plan in force was made with it
            if plan is not None and (
                    (need is not None and plan.predicts() == need and len(plan.since) < 4 * self.full_every)
                    or (need is None and plan.mode == "u")):
                plan.since.append(checkpoint_id)
                return None
            chains = any(len(raw) >= fmt.MIN_DELTA_BYTES for raw in fresh)
            mode = "u" if need is None else "c" if chains else "s"
            key = lg_plan_key(thread_id, ns, checkpoint_id, mode, need or ())
            parsed = lg_parse_plan(key)
            if parsed is not None and parsed[1] == "u":
                mode, need = "u", None  # too many to name
            self._remember((thread_id, ns), ReadPlan(checkpoint_id, mode, need or frozenset(), []))
        return key

    def _remember(self, where: tuple[str, str], plan: ReadPlan) -> None:
        """Note the plan in force in a namespace (under `_lock`), within `MAX_PLANS`."""
        if where not in self._plans and len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[where] = plan

    def not_filed(self, thread_id: str, ns: str) -> None:
        """The plan just made was not stored: the next put files one again."""
        with self._lock:
            self._plans.pop((thread_id, ns), None)

    def adopt(self, thread_id: str, ns: str, listed: Sequence[str], keys: Sequence[str]
              ) -> list[tuple[str, str]] | None:
        """(id, key) of the checkpoints the newest of `keys` is rebuilt from, by the read plan in
        force in `listed` (a namespace's `ckpt/` listing; `keys` the checkpoints in it); None
        without one (a layout before plans: the chain is walked, its bases guessed from the
        listing). Adopted as this saver's plan, so its next put knows what readers will fetch."""
        newest = keys[-1].rsplit("/", 1)[1]
        best: tuple[str, str, list[str]] | None = None
        for k in listed:
            plan = lg_parse_plan(k) if lg_is_plan(k) else None
            if plan is not None and plan[0] <= newest and (best is None or plan[0] >= best[0]):
                best = plan
        if best is None:
            return None
        start, mode, ids = best
        segs = [k.rsplit("/", 1)[1] for k in keys]
        first = bisect.bisect_left(segs, start)
        since = [lg_decode(seg) for seg in segs[first:] if seg != start]
        with self._lock:
            self._remember((thread_id, ns), ReadPlan(lg_decode(start), mode,
                                                     frozenset(map(lg_decode, ids)), since))
        if mode == "u":
            return None
        want = set(ids) | (set(segs[first:-1]) if mode == "c" else set())
        want.discard(newest)
        prefix = keys[-1][: -len(newest)]
        return [(lg_decode(seg), prefix + seg) for seg in sorted(want)]

    def clear(self) -> None:
        with self._lock:
            self._needs.clear()
            self._plans.clear()

    def forget(self, thread_id: str, ns: str | None = None) -> None:
        """Drop what is known of a thread (one namespace, or all): it was pruned or deleted."""
        with self._lock:
            for k in [k for k in self._plans if k[0] == thread_id and (ns is None or k[1] == ns)]:
                del self._plans[k]
            for n in [n for n in self._needs if n[0] == thread_id and (ns is None or n[1] == ns)]:
                del self._needs[n]
