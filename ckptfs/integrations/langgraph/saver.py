"""CkptfsSaver: a LangGraph checkpointer that stores each step's change, not the whole state.

One object per checkpoint (`ckpt/<id>`, created exclusively, one PUT on S3, one fsync'd file
on disk) holds LangGraph's serialized checkpoint and metadata plus a frame for each channel in
`new_versions`, and nothing else: unchanged channels are references to the checkpoint that
holds their version. A channel whose value changes every step (a message list) is stored as a
zstd delta against its previous version, with a whole copy every `full_every` versions, so a
read rebuilds any version from at most `full_every` objects. Values go through LangGraph's own
serializer (`self.serde`); ckptfs only frames and compresses the bytes.

Key names live in `keys.py`, the byte format in `codec.py`; thread, namespace, checkpoint,
task and run ids are percent-encoded into key segments (a long thread id is hashed). Beside
this file: read plans for remote readers (`plans.py`), removal that keeps what survivors read
(`pruning.py`), thread leases (`ownership.py`), the count of savers per local store behind
lease-backed reads (`local_savers.py`), and the gate that keeps one saver's delete or prune from
the writes of the process's other savers of the thread (`erasures.py`).

Guarantees: `put` / `put_writes` are durable on return (the Storage contract); a checkpoint is
visible only once its object is whole; prune, delete_for_runs and delete_thread never leave a
surviving checkpoint unreadable (versions still referenced move to `held/<id>` before the
pruned checkpoint is deleted, and deletes go newest first).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import json
import logging
import operator
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar, cast

import langgraph.checkpoint.base as _lg_base
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

if TYPE_CHECKING:  # langgraph-checkpoint 4.1+; older releases have no delta channels to serve
    from langgraph.checkpoint.base import DeltaChannelHistory

from ckptfs.errors import ConfigError, CorruptFileError, UnreadableFileError
from ckptfs.integrations.langgraph import codec as fmt
from ckptfs.integrations.langgraph import erasures, local_savers
from ckptfs.integrations.langgraph.keys import (
    LG_ROOT,
    lg_checkpoint_key,
    lg_decode,
    lg_encode,
    lg_group_of,
    lg_hashed,
    lg_held_key,
    lg_is_plan,
    lg_name_body,
    lg_name_key,
    lg_ns_prefix,
    lg_run_marker_key,
    lg_run_prefix,
    lg_thread_prefix,
    lg_thread_segment,
    lg_threads_prefix,
    lg_write_key,
    lg_write_slot,
    lg_writes_prefix,
)
from ckptfs.integrations.langgraph.memory import Loaded, ParsedCache, ValueCache
from ckptfs.integrations.langgraph.names import read_name
from ckptfs.integrations.langgraph.ownership import (
    DEFAULT_IDLE,
    DEFAULT_TTL,
    ThreadBusyError,
    ThreadLeases,
    leases_for,
    shown,
)
from ckptfs.integrations.langgraph.plans import PLAN_BODY, ReadPlans, checkpoint_keys
from ckptfs.integrations.langgraph.pruning import (
    CKPT,
    Choose,
    all_but_newest,
    of_run,
    remove_checkpoints,
    writes_by_checkpoint,
)
from ckptfs.integrations.langgraph.versions import kind_of, next_version, remember_kind
from ckptfs.storage.base import Storage
from ckptfs.storage.local import LocalStorage
from ckptfs.storage.logstore import LOG_NAME, Damage, LogStorage
from ckptfs.storage.registry import open_storage
from ckptfs.store.pools import StorePool

logger = logging.getLogger(__name__)

__all__ = ["CkptfsSaver", "ThreadBusyError"]


def _path_task_idx(task_path: str, task_id: str = "", idx: int = 0) -> tuple[str, str, int]:
    return (task_path, task_id, idx)


# langgraph-checkpoint 4.3 names the order a super-step's writes replay in; older releases have
# no name for it (their savers sort by task id), and the saver keeps that same finer order
writes_sort_key: Callable[[str, str, int], tuple[str, str, int]] = getattr(
    _lg_base, "writes_sort_key", _path_task_idx)

T = TypeVar("T")
Ref = list[Any]  # [holder checkpoint id or None (no value), channel version]
# spelled here once: inside the class, `list` is the LangGraph method
_SerializedWrites = list[tuple[int, str, str, bytes]]  # (idx, channel, serde type, bytes)
_Strs = list[str]
DEFAULT_FULL_EVERY = 16
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
_MAX_WROTE = 10_000
# Threads a saver keeps memory of (refs of its last checkpoint, values deltas start from, run
# markers, names, removal epochs); past it, it starts over (`_start_over`). A server saver
# holding a new thread per conversation otherwise grew without bound: ~1 KB a thread, and
# ~250 bytes a run (its run marker) even on one thread.
_MAX_THREADS = 10_000


def _bounded(memory: dict[tuple[str, str], Any], key: tuple[str, str]) -> None:
    """Make room for `key` in a per-namespace memory (`_last`, `_newest`): past `_MAX_THREADS`
    entries it is forgotten whole, as `_start_over` forgets threads. Keyed by namespace, it
    outgrew that bound on one thread: a subgraph's namespace is new at each call
    ("node:<task id>"), so a long conversation calling one kept an entry per call for the
    saver's life, the thread count never reaching the bound. Forgetting is always safe: each
    entry is a shortcut a put or a read rebuilds from the store."""
    if key not in memory and len(memory) >= _MAX_THREADS:
        memory.clear()


def _writes_of(ns_prefix: str, checkpoint_key: str) -> str:
    """`lg_writes_prefix` of the checkpoint a key names, from the key (no decode, no encode)."""
    return f"{ns_prefix}writes/{checkpoint_key.rsplit('/', 1)[1]}/"


def _damage_point(prefix: str, damage: Damage) -> str | None:
    """The checkpoint key from which on a namespace's history is in doubt because of one damaged
    record of its log (`LogStorage.damage(prefix, prefix + "ckpt/")`): a reader must not pass it
    without saying so. A checkpoint's own record: that checkpoint. A pending write's: the
    checkpoint it is filed under. One whose key is unreadable: the checkpoint written last
    before it (checkpoint ids are named in time order, so it may have been the next checkpoint
    or one of that one's pending writes); "" when none was (it may have been any). None for
    other keys (a held version: every read of it raises by itself)."""
    if damage.key is None:
        return damage.after or ""
    rest = damage.key[len(prefix):]
    if rest.startswith(CKPT):
        return damage.key
    if rest.startswith("writes/"):
        return f"{prefix}{CKPT}{rest.split('/', 2)[1]}"
    return None


class CkptfsSaver(BaseCheckpointSaver[Any]):
    """LangGraph checkpointer on ckptfs storage: local disk, S3 or memory, by URL.

    Parameters
    ----------
    url, storage_options
        Where to store (`/path`, `file:///path`, `s3://bucket/prefix`, `memory://name`).
    storage, store
        A ready `ckptfs.Storage`, or a `ckptfs.CheckpointStore` whose storage is shared.
    serde
        LangGraph serializer (default: LangGraph's JsonPlusSerializer).
    full_every
        A channel version is stored whole at least every this many versions; a read of any
        version touches at most this many objects.
    cache_bytes
        Memory for recent serialized channel values (deltas compress against them).
    log
        On local disk, keep each thread namespace's objects as records of one append-only file
        (one fdatasync per put, as SQLite's WAL, instead of a file each: fsync + rename + fsync
        of the directory). Other backends store an object per put either way.
    exclusive
        One writer per thread (on by default): a thread another process is writing raises
        `ThreadBusyError` instead of forking its history (see `ownership.py`). A lease per
        thread, by conditional writes, on any backend shared between processes (local disk,
        S3); memory needs none.
    lease_ttl, lease_idle
        A holder that stops renewing (crashed, stalled) loses the thread after `lease_ttl`
        seconds; a thread not written for `lease_idle` seconds is given back.
    busy_timeout
        Seconds a write waits for another process to let its thread go before
        `ThreadBusyError` (0: fail as soon as the other holder is seen renewing).
    """

    def __init__(
        self,
        url: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        storage: Storage | None = None,
        store: Any = None,
        serde: SerializerProtocol | None = None,
        full_every: int = DEFAULT_FULL_EVERY,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_decoded_bytes: int = fmt.DEFAULT_MAX_DECODED,
        log: bool = True,
        exclusive: bool = True,
        lease_ttl: float = DEFAULT_TTL,
        lease_idle: float = DEFAULT_IDLE,
        busy_timeout: float = 0.0,
    ) -> None:
        super().__init__(serde=serde)
        given = [x for x in (url, storage, store) if x is not None]
        if len(given) != 1:
            raise ConfigError("CkptfsSaver needs exactly one of url, storage= or store=")
        if store is not None:
            storage = cast(Storage, getattr(store, "storage", None))
            if not isinstance(storage, Storage):
                raise ConfigError("store= must be a ckptfs CheckpointStore (it has no .storage)")
        if storage is None:
            assert url is not None
            storage = open_storage(url, storage_options)
        if log and isinstance(storage, LocalStorage):
            storage = LogStorage(storage, lg_group_of)
        self._root = local_savers.local_root(storage)
        local_savers.register(self._root)
        self._unregister = weakref.finalize(self, local_savers.unregister, self._root)  # or collected
        # (thread, ns) -> (lease tenure, savers made on the store) when this saver last read the
        # namespace looking for others' writes, alone on its store: `_sole_tenure`
        self._current: dict[tuple[str, str], tuple[object, int]] = {}
        if not isinstance(full_every, int) or full_every < 1:
            raise ConfigError(f"full_every must be an integer >= 1, got {full_every!r}")
        self.storage: Storage = storage
        self.full_every = full_every
        self.max_decoded_bytes = max_decoded_bytes
        self._values = ValueCache(cache_bytes)
        self._parsed = ParsedCache()
        # A request's latency, not local CPU, is the cost of a read: get_tuple sends the GET of
        # the checkpoint and the listing of its writes together (one round trip, not two).
        self._remote = storage.capabilities.remote
        self._pool: StorePool | None = None
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[str, dict[str, Ref]]] = {}
        # (thread, ns) -> the greatest checkpoint key this saver wrote or read there: where a
        # remote get_tuple looks first (`_newest_remote`)
        self._newest: dict[tuple[str, str], str] = {}
        # (thread, ns) -> (the id of the namespace's newest checkpoint as this saver last saw it,
        # read or written; "": read empty), and the lease tenure that view is known true under
        # (None: none yet): what the next write extends, checked before it (`_check_view`)
        self._views: dict[tuple[str, str], tuple[str, object]] = {}
        self._run_markers: set[tuple[str, str, str]] = set()
        # hashed thread segment -> the lease tenure it was last seen named under (None: no leases)
        self._named: dict[str, object] = {}
        self._plans = ReadPlans(full_every)  # remote storage only
        if not (isinstance(busy_timeout, int | float) and busy_timeout >= 0):
            raise ConfigError(f"busy_timeout must be a number of seconds >= 0, got {busy_timeout!r}")
        self.busy_timeout = float(busy_timeout)
        self.leases: ThreadLeases | None = None
        self._wrote: set[str] = set()
        # the thread's removal epoch (`erasures.py`) this saver last wrote it in, and the
        # removal sequence when it last forgot every thread (`_start_over`)
        self._epochs: dict[str, int] = {}
        self._started_over = -1
        self._store_key = self._root or storage.url
        caps = storage.capabilities
        if exclusive and caps.shared and caps.exclusive_create and caps.conditional_put:
            self.leases = leases_for(storage, lease_ttl, lease_idle)
        elif exclusive:
            logger.debug("%s: not shared between processes, so no thread leases", storage.display_name)

    def __repr__(self) -> str:
        return f"CkptfsSaver({self.storage.display_url!r})"

    # ----------------------------------------------------------------------------- helpers

    @staticmethod
    def _ids(config: RunnableConfig) -> tuple[str, str, str | None]:
        conf = config.get("configurable") or {}
        if conf.get("thread_id") is None:
            raise ValueError("config['configurable']['thread_id'] is required by CkptfsSaver")
        ns = conf.get("checkpoint_ns") or ""
        return str(conf["thread_id"]), str(ns), get_checkpoint_id(config)

    @staticmethod
    def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

    def _read(self, key: str) -> Loaded:
        return Loaded(key, self._parsed.parse(key, self.storage.get(key), self.max_decoded_bytes))

    def _get_optional(self, key: str) -> bytes | None:
        try:
            return self.storage.get(key)
        except FileNotFoundError:
            return None

    def _get_all(self, keys: Sequence[str]) -> list[bytes | None]:
        """The bytes of each key (None: gone); on remote storage fetched together, one round trip."""
        if len(keys) > 1 and self._remote:
            futures = [self._beside(functools.partial(self._get_optional, k)) for k in keys]
            return [f.result() if f is not None else None for f in futures]
        return [self._get_optional(k) for k in keys]

    def _beside(self, fn: Callable[[], T]) -> Future[T] | None:
        """Run `fn` on a helper thread while the caller sends its own request (remote storage
        only: on local disk a thread hop costs more than the call)."""
        if not self._remote:
            return None
        with self._lock:
            if self._pool is None:
                # a read plan's objects (up to `full_every`) and the writes' listing at once. What
                # runs here only overlaps the caller's own request and takes nothing it holds, so
                # at interpreter exit it runs first on the caller's thread, the same outcome
                # (refused, a graph in a non-daemon thread could not read its checkpoints)
                self._pool = StorePool(max_workers=32, thread_name_prefix="ckptfs-lg-read")
            pool = self._pool
        return pool.submit(fn)

    def _read_holder(self, thread_id: str, ns: str, checkpoint_id: str,
                     seen: dict[str, Loaded]) -> Loaded:
        """The object holding a checkpoint's channel versions: `ckpt/` or, once pruned, `held/`."""
        if checkpoint_id in seen:
            return seen[checkpoint_id]
        try:
            loaded = self._read(lg_checkpoint_key(thread_id, ns, checkpoint_id))
        except FileNotFoundError:
            try:
                loaded = self._read(lg_held_key(thread_id, ns, checkpoint_id))
            except FileNotFoundError:
                raise CorruptFileError(
                    lg_checkpoint_key(thread_id, ns, checkpoint_id),
                    "a stored checkpoint refers to channel versions in this object, which is gone",
                ) from None
        seen[checkpoint_id] = loaded
        return loaded

    def _channel(self, thread_id: str, ns: str, holder: str, channel: str,
                 seen: dict[str, Loaded], depth_limit: int | None = None) -> tuple[str, bytes, int]:
        """(serde type, serialized bytes, depth) of one channel version, rebuilding its delta chain."""
        ck = (thread_id, ns, holder, channel)
        hit = self._values.get(ck)
        if hit is not None:
            return hit
        loaded = self._read_holder(thread_id, ns, holder, seen)
        part = loaded.obj.parts.get(channel)
        if part is None:
            raise CorruptFileError(loaded.key, f"channel {channel!r} is referenced here but not stored")
        if depth_limit is not None and part.depth >= depth_limit:
            raise CorruptFileError(loaded.key, f"channel {channel!r}: delta chain does not shorten")
        base = None
        if part.base is not None:
            if part.depth < 1:
                raise CorruptFileError(loaded.key, f"channel {channel!r}: delta without depth")
            _, base, _ = self._channel(thread_id, ns, part.base, channel, seen, part.depth)
        raw = fmt.decode_part(part, f"{loaded.key}#{channel}", base, self.max_decoded_bytes)
        item = (part.type, raw, part.depth)
        self._values.put(ck, item)
        if self._remote:
            self._plans.note_needs(ck, part.base)
        return item

    def _writes(self, thread_id: str, ns: str, checkpoint_id: str, keys: list[str] | None = None,
                channels: set[str] | None = None) -> list[PendingWrite]:
        """A checkpoint's pending writes in `writes_sort_key` order (only `channels`', if given:
        the others are not deserialized)."""
        if keys is None:
            keys = self.storage.list(lg_writes_prefix(thread_id, ns, checkpoint_id))
        if not keys:
            return []  # most checkpoints read back have none
        found: dict[tuple[str, int], tuple[str, str, str, int, Any]] = {}
        for key, data in zip(keys, self._get_all(keys), strict=True):
            if data is None:
                continue
            obj = fmt.unpack(data, key, self.max_decoded_bytes)
            head = obj.header
            task_id, task_path = str(head["task"]), str(head.get("path", ""))
            offset = 0
            for idx, channel, typ, n in head["items"]:
                value = obj.raw[offset : offset + n]
                offset += n
                if channels is not None and channel not in channels:
                    continue
                found.setdefault((task_id, idx), (task_path, task_id, channel, idx, (typ, value)))
        ordered = sorted(found.values(), key=lambda w: writes_sort_key(w[0], w[1], w[3]))
        return [(tid, ch, self.serde.loads_typed(val)) for _, tid, ch, _, val in ordered]

    def _tuple(self, thread_id: str, loaded: Loaded, writes_keys: list[str] | None = None,
               metadata: CheckpointMetadata | None = None, listing: Sequence[str] = (),
               pre: Mapping[str, Loaded] | None = None) -> CheckpointTuple:
        head = loaded.header
        ns, checkpoint_id = str(head["ns"]), str(head["id"])
        seen = {**(pre or {}), checkpoint_id: loaded}
        if self._remote:
            self._prefetch(thread_id, ns, loaded, seen, listing)
        checkpoint = cast(Checkpoint, self.serde.loads_typed((head["ct"], loaded.obj.section("co", "cn"))))
        if metadata is None:
            metadata = self._metadata(loaded)
        values: dict[str, Any] = {}
        for channel, (holder, _version) in head["refs"].items():
            if holder is None:
                continue
            typ, raw, _ = self._channel(thread_id, ns, holder, channel, seen)
            values[channel] = self.serde.loads_typed((typ, raw))
        parent = head.get("parent")
        checkpoint["channel_values"] = values  # a dict just deserialized: nobody else holds it
        return CheckpointTuple(
            config=self._config(thread_id, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=self._config(thread_id, ns, parent) if parent else None,
            pending_writes=self._writes(thread_id, ns, checkpoint_id, writes_keys),
        )

    def _prefetch(self, thread_id: str, ns: str, loaded: Loaded, seen: dict[str, Loaded],
                  listing: Sequence[str]) -> None:
        """Remote storage: fetch together the objects the checkpoint's channel values are read
        from when they are not in the cache, rather than one round trip per link of a delta
        chain. Which they are is known for a channel another checkpoint holds (its ref names
        it); for a delta, its chain's bases are, for a channel that changes every step (a
        message list), the checkpoints just before in `listing` (the namespace's sorted
        checkpoint keys), else its base alone. A guess that misses costs a request, not a
        wrong answer: the chain walk reads what it needs and checks every link."""
        if not self._remote:
            return
        want: set[str] = set()
        pos = bisect.bisect_left(listing, loaded.key)
        for channel, (holder, _version) in loaded.header["refs"].items():
            if holder is None or self._values.get((thread_id, ns, str(holder), channel)) is not None:
                continue
            if str(holder) not in seen:
                want.add(str(holder))
                continue
            part = loaded.obj.parts.get(channel)
            if part is None or part.base is None:
                continue
            if pos < len(listing) and listing[pos] == loaded.key and part.depth > 0:
                want.update(lg_decode(k.rsplit("/", 1)[1]) for k in listing[max(0, pos - part.depth) : pos])
            else:
                want.add(part.base)
        ids = sorted(want - seen.keys())
        keys = [lg_checkpoint_key(thread_id, ns, cid) for cid in ids]
        for cid, key, data in zip(ids, keys, self._get_all(keys), strict=True):
            if data is not None:
                with contextlib.suppress(CorruptFileError):  # the walk reads it again and says why
                    seen[cid] = Loaded(key, self._parsed.parse(key, data, self.max_decoded_bytes))

    def _metadata(self, loaded: Loaded) -> CheckpointMetadata:
        return cast(CheckpointMetadata,
                    self.serde.loads_typed((loaded.header["mt"], loaded.obj.section("mo", "mn"))))

    def _parent_refs(self, thread_id: str, ns: str, parent: str | None) -> dict[str, Ref]:
        if parent is None:
            return {}
        with self._lock:
            last = self._last.get((thread_id, ns))
        if last is not None and last[0] == parent:
            return last[1]
        try:
            loaded = self._read_holder(thread_id, ns, parent, {})
        except CorruptFileError:
            return {}  # no parent stored: every channel value is taken from the checkpoint itself
        return cast(dict[str, Ref], loaded.header.get("refs") or {})

    # ------------------------------------------------------------------------------ reads

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        before = self._tenure_of(config)
        found = self._get_tuple(config)
        self._after_read(config, found, before)
        return found

    def _tenure_of(self, config: RunnableConfig) -> object:
        """The lease this process holds, trusted, on the config's thread (None: none), taken
        before a read: a read under it, still held after, saw what nobody else could change."""
        if self.leases is None:
            return None
        thread_id = (config.get("configurable") or {}).get("thread_id")
        return None if thread_id is None else self.leases.trusted(str(thread_id))

    def _after_read(self, config: RunnableConfig, found: CheckpointTuple | None, before: object) -> None:
        """A run starts from what it read: the version type its new channels get, and (root
        namespace) this process may write the thread again after another did, if what it read
        is still the newest once it holds the thread (`_check_view`)."""
        remember_kind(kind_of(found.checkpoint["channel_versions"].values()) if found else None)
        if self.leases is None:
            return
        conf = config["configurable"]  # there: the read needed it
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns") or "")
        if not ns:
            self.leases.reread(thread_id)
        at = (thread_id, ns)
        if get_checkpoint_id(config) is not None:
            # a given checkpoint (time travel): a run from it forks on purpose, whatever is newer
            with self._lock:
                self._views.pop(at, None)
            return
        view = (str(found.config["configurable"]["checkpoint_id"]) if found is not None else "",
                before if before is not None and self.leases.trusted(thread_id) is before else None)
        if self._views.get(at) != view:  # a holder reading its own newest again: as it was
            self._note_view(at, view)

    def _note_view(self, at: tuple[str, str], view: tuple[str, object]) -> None:
        """Remember a namespace's view, last in line: past `_MAX_THREADS` namespaces the least
        recently seen go first. Not all at once (`_bounded`), nor with the rest of a thread's
        memory (`_start_over`): a view forgotten between a read and the write after it would
        let that write through unchecked."""
        with self._lock:
            self._views.pop(at, None)
            while len(self._views) >= _MAX_THREADS:
                del self._views[next(iter(self._views))]
            self._views[at] = view

    def _sole_tenure(self, thread_id: str) -> tuple[object, int] | None:
        """(tenure of this process's trusted lease on the thread, savers made on the store so
        far) when this saver is the only live one on its local store, else None. While the
        lease is trusted nobody else can write the thread (other processes need it;
        `exclusive=False` anywhere turns the rule off, and this with it), and while no other
        saver is made here nobody in this process can either; so a namespace this saver read,
        looking, under the same pair (`_current`) is read without the stats that look for
        others' appends."""
        if self.leases is None or self._root is None:
            return None
        made = local_savers.alone(self._root)
        if made is None:
            return None
        tenure = self.leases.trusted(thread_id)
        return None if tenure is None else (tenure, made)

    def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Requests, newest checkpoint: on local disk one look at the log's index (key, bytes
        and pending-write keys together); on S3, by a saver that has seen the thread's newest
        checkpoint (it wrote or read it), one round trip: the listing of anything newer, the
        object and the listing of its writes, sent together. Otherwise two: the listing, then
        the object, its writes' listing and the objects its read plan names (a delta chain's
        bases, filed beside the checkpoints: `lg_plan_key`) together. Without a plan (a layout
        written before them) the chain's bases take a round trip more; pending writes, their
        objects."""
        thread_id, ns, checkpoint_id = self._ids(config)
        prefix = lg_ns_prefix(thread_id, ns)
        for _ in range(3):  # a concurrent prune can remove the newest between list and get
            if checkpoint_id is None and isinstance(self.storage, LogStorage):
                sole = self._sole_tenure(thread_id)
                seen = self._current.get((thread_id, ns))
                current = sole is not None and seen is not None and seen[0] is sole[0] and seen[1] == sole[1]
                try:
                    newest = self.storage.newest(prefix + CKPT, functools.partial(_writes_of, prefix),
                                                 current=current)
                    if newest is not None and lg_is_plan(newest[0]):
                        # read plans copied from S3 (a mirror) sort last: the newest checkpoint is below
                        keys = checkpoint_keys(self.storage.list(prefix + CKPT))
                        last = keys[-1] if keys else None
                        self._refuse_doubt(prefix, operator.ge, last or "")
                        newest = None if last is None else (
                            last, self.storage.get(last), self.storage.list(_writes_of(prefix, last)))
                except FileNotFoundError:
                    continue
                if sole is not None and not current:
                    if len(self._current) >= _MAX_WROTE:  # a long-lived saver: start over
                        self._current.clear()
                    self._current[(thread_id, ns)] = sole  # it looked, alone and under the lease
                if newest is None:
                    return None
                key, data, wkeys = newest
                loaded = Loaded(key, self._parsed.parse(key, data, self.max_decoded_bytes))
                got = self._tuple_unless_removed(thread_id, loaded, wkeys)
                if got is None:
                    continue
                return got
            if checkpoint_id is None:
                try:
                    found = self._newest_remote(thread_id, ns, prefix)
                except FileNotFoundError:
                    continue
                if found is None:
                    self._refuse_log_layout(thread_id, prefix)
                    return None
                loaded, wkeys_r, listing, pre = found
                got = self._tuple_unless_removed(thread_id, loaded, wkeys_r, listing=listing, pre=pre)
                if got is None:
                    continue
                return got
            key = lg_checkpoint_key(thread_id, ns, checkpoint_id)
            try:
                by_id = self._read_with_writes(prefix, key)
            except FileNotFoundError:
                # absent, or lost to a damaged record written after an older checkpoint's?
                self._refuse_doubt(prefix, operator.lt, key)
                self._refuse_log_layout(thread_id, prefix)
                return None
            self._refuse_doubt(prefix, operator.eq, key)  # its pending writes
            got = self._tuple_unless_removed(thread_id, *by_id)
            if got is None:
                continue  # removed while read: the next pass finds it gone (None)
            return got
        return None

    def _tuple_unless_removed(self, thread_id: str, loaded: Loaded, writes_keys: list[str] | None = None,
                              metadata: CheckpointMetadata | None = None, listing: Sequence[str] = (),
                              pre: Mapping[str, Loaded] | None = None) -> CheckpointTuple | None:
        """`_tuple`, or None when an object it reads went because the checkpoint itself was
        removed meanwhile (a delete_thread, delete_for_runs or prune by another saver: reads
        pass no gate, and removals go newest first), for the caller to look again.

        Met as CorruptFileError ("refers to channel versions in this object, which is gone"):
        a graph reading a thread another saver of the process was deleting failed as if the
        store were damaged. Likelier once a saver starts over (`_start_over`): the values it
        held are read from the store again. A checkpoint still there is damage: raised."""
        try:
            return self._tuple(thread_id, loaded, writes_keys, metadata, listing, pre)
        except CorruptFileError:
            if self.storage.exists(loaded.key):
                raise
            logger.debug("checkpoint %s removed while it was read: looking again", loaded.key)
            return None

    def _refuse_log_layout(self, thread_id: str, prefix: str) -> None:
        """A namespace this saver finds no checkpoint of, off a record log, whose log file is
        there: a mirror's copy of a local store (`ckptfs mirror` copies each log as it is), or a
        local store opened with log=False. Answering None would start the thread afresh beside
        the history it holds, and the next mirror pass deletes what this saver writes there."""
        if isinstance(self.storage, LogStorage) or not self.storage.exists(prefix + LOG_NAME):
            return
        raise ConfigError(f"{self.storage.display_name} holds LangGraph thread {shown(thread_id)} as a "
                          f"record log ({prefix}{LOG_NAME}), which this saver does not read (off local "
                          "disk, or log=False): a mirror's copy is restored first (ckptfs restore "
                          "MIRROR DST, then CkptfsSaver(DST)); on local disk, open it with log=True")

    def _doubts(self, prefix: str) -> list[tuple[str, CorruptFileError]]:
        """(`_damage_point`, the error to raise) of each damaged record of the namespace's log,
        as the read or listing just made saw it; none off local disk or in a log without damage
        (one look at its index, not at the file again: get_tuple by id pays ~1 us for this)."""
        if not isinstance(self.storage, LogStorage):
            return []
        out = []
        for damage in self.storage.damage(prefix, prefix + CKPT, sync=False):  # as just read
            point = _damage_point(prefix, damage)
            if point is not None:
                out.append((point, damage.error("; what it may hide in this thread's history is not "
                                                "known, so it is not skipped in silence")))
        return out

    def _refuse_doubt(self, prefix: str, test: Callable[[str, str], bool], key: str) -> None:
        """Raise the error of the first damaged record of the namespace whose point passes
        `test(point, key)`."""
        for point, error in self._doubts(prefix):
            if test(point, key):
                raise error

    def _read_with_writes(self, prefix: str, key: str) -> tuple[Loaded, list[str] | None]:
        """A checkpoint object and (remote storage) the keys of its pending writes, listed while
        the object is fetched. FileNotFoundError if the object is not there."""
        writes = self._beside(functools.partial(self.storage.list, _writes_of(prefix, key)))
        try:
            loaded = self._read(key)
        except FileNotFoundError:
            if writes is not None:
                writes.cancel()
            raise
        return loaded, writes.result() if writes is not None else None

    def _newest_remote(self, thread_id: str, ns: str, prefix: str
                       ) -> tuple[Loaded, list[str] | None, list[str], dict[str, Loaded]] | None:
        """The newest checkpoint of a namespace and its writes' keys, by listing; FileNotFoundError
        when it went before it was read (the caller starts over)."""
        with self._lock:
            hint = self._newest.get((thread_id, ns))
        if hint is not None and self._remote:
            # what this saver last saw as newest: is anything newer? (asked while reading it)
            newer = self._beside(functools.partial(self.storage.list, prefix + CKPT, hint))
            assert newer is not None
            try:
                found: tuple[Loaded, list[str] | None] | None = self._read_with_writes(prefix, hint)
            except FileNotFoundError:
                found = None  # pruned or deleted meanwhile
            later = checkpoint_keys(newer.result())
            if found is not None and not later:
                return (*found, [], {})
            key = later[-1] if later else None
        else:
            key, later = None, []
        keys = later  # what a delta chain's bases are guessed from (`_prefetch`)
        planned: list[tuple[str, str, Future[bytes | None] | None]] = []
        if key is None:
            listed = self.storage.list(prefix + CKPT)
            keys = checkpoint_keys(listed)
            if not keys:
                return None
            key = keys[-1]
            # the objects its read plan names go out with the object itself: one round trip
            plan = self._plans.adopt(thread_id, ns, listed, keys)
            if plan is not None:
                planned = [(cid, k, self._beside(functools.partial(self._get_optional, k)))
                           for cid, k in plan]
                keys = []  # the plan names what is needed: no guess from the listing on top
        found = self._read_with_writes(prefix, key)
        seen: dict[str, Loaded] = {}
        for cid, pkey, fut in planned:
            data = fut.result() if fut is not None else None
            if data is not None:
                with contextlib.suppress(CorruptFileError):  # the walk reads it again and says why
                    seen[cid] = Loaded(pkey, self._parsed.parse(pkey, data, self.max_decoded_bytes))
        if self._remote:
            with self._lock:  # what the listing says now, even below an older hint (pruned)
                _bounded(self._newest, (thread_id, ns))
                self._newest[(thread_id, ns)] = key
        return (*found, keys, seen)

    def _saw_newest(self, thread_id: str, ns: str, key: str) -> None:
        with self._lock:
            old = self._newest.get((thread_id, ns))
            if old is None or key > old:
                _bounded(self._newest, (thread_id, ns))
                self._newest[(thread_id, ns)] = key

    def _thread_ids(self) -> list[str]:
        ids: list[str] = []
        for seg in self.storage.list_dirs(lg_threads_prefix()):
            if not lg_hashed(seg):
                ids.append(lg_decode(seg))
                continue
            name = self._name_of(seg)
            if name is None and not self.storage.list(f"{lg_threads_prefix()}{seg}/"):
                continue  # the empty directory a deleted thread leaves on local disk
            if name is None:
                logger.warning("thread %s skipped: its id is not in %s (see `ckptfs verify`)",
                               seg, lg_name_key(seg))
            else:
                ids.append(name)
        return ids

    def _name_of(self, segment: str) -> str | None:
        """The id of a thread whose segment is a hash, from its name object (None: missing or bad)."""
        return read_name(self.storage, segment)

    def name_thread(self, thread_id: str) -> None:
        """Store a long thread's id in `langgraph/names/` again if it is missing or wrong there
        (`ckptfs verify`: lg-missing-name, lg-bad-name), under the thread's lease, without
        writing a checkpoint: what `import-langgraph` does for a thread it finds complete."""
        with self._writing(str(thread_id)) as tenure:
            self._name_thread(str(thread_id), tenure)

    def _name_thread(self, thread_id: str, tenure: object) -> None:
        """Before a thread's first object, when its segment is a hash: store the id the hash
        stands for, so listings can name the thread (content first, what points at it after).
        Once per lease tenure (`_writing`; once per process without leases): a name object
        damaged or lost meanwhile is replaced by the first write after the lease was given back
        and taken again, not only by another process's."""
        seg = lg_thread_segment(thread_id)
        if not lg_hashed(seg):
            return
        with self._lock:
            if seg in self._named and self._named[seg] is tenure:
                return
        key, body = lg_name_key(seg), lg_name_body(thread_id)
        try:
            self.storage.put_if_absent(key, body)
        except FileExistsError:
            if self._name_of(seg) != thread_id:
                self.storage.put(key, body)
        with self._lock:
            self._named[seg] = tenure

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Newest first. Only keys are listed up front; objects are read until `limit` matches.

        Damage is not skipped in silence: what is intact and newer than a damaged record of a
        namespace's log is yielded, then, where that record's checkpoint (or the one its
        pending write is filed under; for a record whose key is unreadable, the one written
        before it) would come, CorruptFileError names the log and the byte, as at the end of
        the history when the damage lies below everything listed. A history that goes on past
        a missing checkpoint (whose successor's `parent_config` still names it) would tell
        its reader something false; what came before the damage was true and stays so. A
        listing of every thread (`config=None`) skips a namespace whose log is a symbolic
        link or a FIFO, with a warning naming it: nothing ckptfs wrote can be there (it never
        writes through a link), as a linked thread directory is none of its threads."""
        if config is not None:
            thread_ids = [self._ids(config)[0]]
            ns_filter = (config.get("configurable") or {}).get("checkpoint_ns")
            id_filter = get_checkpoint_id(config)
        else:
            thread_ids, ns_filter, id_filter = self._thread_ids(), None, None
        before_id = get_checkpoint_id(before) if before else None
        if limit is not None and limit <= 0:
            return
        found: list[tuple[str, str, str, str]] = []  # (checkpoint id, thread, ns prefix, key)
        # per namespace, the greatest point its damage puts in doubt (`_damage_point`)
        frontier: dict[str, tuple[str, CorruptFileError]] = {}
        for thread_id in thread_ids:
            if ns_filter is not None:
                prefixes = [lg_ns_prefix(thread_id, str(ns_filter))]
            else:
                tp = lg_thread_prefix(thread_id)
                prefixes = [f"{tp}{seg}/" for seg in self.storage.list_dirs(tp)]
            for prefix in prefixes:
                try:
                    keys = checkpoint_keys(self.storage.list(prefix + CKPT))
                    doubts = self._doubts(prefix)
                except UnreadableFileError as exc:
                    if config is not None:
                        raise
                    logger.warning("namespace %s skipped: %s", prefix, exc)
                    continue
                if id_filter is not None:
                    wanted = prefix + CKPT + lg_encode(id_filter)
                    present = wanted in keys
                    for point, error in doubts:  # as get_tuple by id (`_get_tuple`)
                        if point == wanted or (not present and point < wanted):
                            raise error
                    doubts = []
                for key in keys:
                    cid = lg_decode(key.rsplit("/", 1)[1])
                    if id_filter is not None and cid != id_filter:
                        continue
                    if before_id is not None and cid >= before_id:
                        continue
                    found.append((cid, thread_id, prefix, key))
                bound = None if before_id is None else prefix + CKPT + lg_encode(before_id)
                for point, error in doubts:
                    if (bound is None or point < bound) and (
                            prefix not in frontier or point > frontier[prefix][0]):
                        frontier[prefix] = (point, error)
        found.sort(reverse=True)
        writes_index: dict[str, dict[str, list[str]]] = {}
        remaining = limit
        for cid, thread_id, prefix, key in found:
            doubt = frontier.get(prefix) if frontier else None
            if doubt is not None and key <= doubt[0]:
                raise doubt[1]  # this one is intact, but what the damage hid came before it
            try:
                loaded = self._read(key)
            except FileNotFoundError:
                continue
            metadata = self._metadata(loaded)
            if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                continue
            if prefix not in writes_index:
                writes_index[prefix] = writes_by_checkpoint(self.storage, prefix)
            got = self._tuple_unless_removed(thread_id, loaded,
                                             writes_index[prefix].get(lg_encode(cid), []), metadata)
            if got is None:
                continue  # removed while read, as a checkpoint gone before its read (above)
            yield got
            if remaining is not None:
                remaining -= 1
                if remaining <= 0:
                    return
        for _point, error in frontier.values():
            raise error  # below every checkpoint listed: the history may have gone further back

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """DeltaChannel's history (langgraph-checkpoint 4.1+): per channel, the writes of the
        target's ancestors, oldest first, back to the nearest ancestor that stores the channel
        (its value is the `seed`, its own writes included, as InMemorySaver does).

        One walk up the parent chain for all channels, reading each ancestor's object once:
        only its header (parent, which channels it stores) unless it is a seed, and only the
        requested channels' writes, found through one listing of the namespace's writes;
        LangGraph's default walk calls `get_tuple` per ancestor instead (every channel value
        rebuilt and a listing each).
        """
        if not channels:
            return {}
        thread_id, ns, checkpoint_id = self._ids(config)
        prefix = lg_ns_prefix(thread_id, ns)
        wanted = {str(c) for c in channels}
        collected: dict[str, list[PendingWrite]] = {c: [] for c in wanted}
        seeds: dict[str, Any] = {}
        cursor: str | None = None
        if checkpoint_id is None:
            keys = checkpoint_keys(self.storage.list(prefix + CKPT))
            checkpoint_id = lg_decode(keys[-1].rsplit("/", 1)[1]) if keys else None
        if checkpoint_id is not None:
            try:
                cursor = self._read(lg_checkpoint_key(thread_id, ns, checkpoint_id)).header.get("parent")
            except FileNotFoundError:
                cursor = None
        writes_of = writes_by_checkpoint(self.storage, prefix) if cursor is not None else {}
        seen: dict[str, Loaded] = {}
        remaining = set(wanted)
        while cursor is not None and remaining:
            try:
                loaded = self._read(lg_checkpoint_key(thread_id, ns, cursor))
            except FileNotFoundError:
                break  # the chain ends here (pruned, or a fork's missing parent), as get_tuple's would
            seen[cursor] = loaded
            refs = loaded.header.get("refs") or {}
            found: dict[str, Any] = {}
            for ch in remaining:
                holder = (refs.get(ch) or [None])[0]
                if holder is not None:
                    typ, raw, _ = self._channel(thread_id, ns, str(holder), ch, seen)
                    found[ch] = self.serde.loads_typed((typ, raw))
            wkeys = writes_of.get(lg_encode(cursor))
            if wkeys:
                for write in reversed(self._writes(thread_id, ns, cursor, wkeys, remaining)):
                    collected[write[1]].append(write)
            seeds.update(found)
            remaining -= found.keys()
            parent = loaded.header.get("parent")
            cursor = str(parent) if parent is not None else None
        result: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry = cast("DeltaChannelHistory", {"writes": list(reversed(collected[str(ch)]))})
            if str(ch) in seeds:
                entry["seed"] = seeds[str(ch)]
            result[ch] = entry
        return result

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await asyncio.to_thread(
            lambda: self.get_delta_channel_history(config=config, channels=channels))

    # ----------------------------------------------------------------------------- writes

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns, parent = self._ids(config)
        checkpoint_id = str(checkpoint["id"])
        key = lg_checkpoint_key(thread_id, ns, checkpoint_id)
        with self._writing(thread_id, ns=ns) as tenure:
            c: dict[str, Any] = dict(checkpoint)
            values: dict[str, Any] = c.pop("channel_values", None) or {}
            versions: ChannelVersions = c.get("channel_versions") or {}
            parent_refs = self._parent_refs(thread_id, ns, parent)
            refs: dict[str, Ref] = {}
            parts: list[fmt.Part] = []
            fresh: list[tuple[str, tuple[str, bytes, int]]] = []
            for channel, version in versions.items():
                prev = parent_refs.get(channel)
                if channel not in new_versions:
                    if prev is not None and prev[1] == version:
                        refs[channel] = prev
                        continue
                    if channel not in values:
                        continue  # nothing known for it: LangGraph treats the channel as empty
                if channel not in values:
                    refs[channel] = [None, version]
                    continue
                typ, raw = self.serde.dumps_typed(values[channel])
                part = self._encode_part(thread_id, ns, channel, typ, raw, prev)
                parts.append(part)
                refs[channel] = [checkpoint_id, version]
                fresh.append((channel, (typ, raw, part.depth)))
            ct, cbytes = self.serde.dumps_typed(c)
            md = get_checkpoint_metadata(config, metadata)
            mt, mbytes = self.serde.dumps_typed(md)
            run_id = md.get("run_id")
            header = {
                "kind": "checkpoint", "id": checkpoint_id, "ns": ns, "parent": parent,
                "run_id": str(run_id) if run_id is not None else None,
                "delta_channels": "counters_since_delta_snapshot" in md,
                "ct": ct, "co": 0, "cn": len(cbytes), "mt": mt, "mo": len(cbytes), "mn": len(mbytes),
                "refs": refs,
            }
            data = fmt.pack(header, cbytes + mbytes, parts)
            self._name_thread(thread_id, tenure)
            if run_id is not None:
                self._mark_run(str(run_id), thread_id, ns)
            plan = self._plans.plan_for(thread_id, ns, checkpoint_id, refs, parts,
                                        (item[1] for _, item in fresh)) if self._remote else None
            filed = self._beside(functools.partial(self._file_plan, thread_id, ns, plan)) if plan else None
            try:
                self.storage.put_if_absent(key, data)
            except FileExistsError:
                logger.debug("checkpoint %s stored again: replacing it", checkpoint_id)
                self.storage.put(key, data)
            finally:
                if filed is not None:
                    filed.result()
            # Noted inside the gate, not after it: a removal by another saver of the process
            # landing between the write and the note, then this saver starting over (which
            # forgets the epoch the note would be checked against), left the note trusted:
            # the graph run's next put pointed at the removed objects (acknowledged, and
            # CorruptFileError on every read). If the lease turns out lost, `_writing` forgets.
            for channel, item in fresh:
                self._values.put((thread_id, ns, checkpoint_id, channel), item)
            with self._lock:
                _bounded(self._last, (thread_id, ns))
                self._last[(thread_id, ns)] = (checkpoint_id, refs)
            view = self._views.get((thread_id, ns))
            if view is not None:  # checked in `_writing`: the newest now is this or newer
                newest = checkpoint_id if view[0] in (parent, "") or key > lg_checkpoint_key(
                    thread_id, ns, view[0]) else view[0]
                self._note_view((thread_id, ns), (newest, tenure))
            if self._remote:
                self._saw_newest(thread_id, ns, key)
        return self._config(thread_id, ns, checkpoint_id)

    def _file_plan(self, thread_id: str, ns: str, key: str) -> None:
        """Store a read plan. Only a hint: a failure is logged, not raised (the checkpoint beside
        it is what `put` promises), and the next put files a plan again."""
        try:
            self.storage.put(key, PLAN_BODY)
        except Exception as exc:  # a hint's failure must not fail the put
            logger.warning("read plan %s not stored (%s): readers walk the chain instead", key, exc)
            self._plans.not_filed(thread_id, ns)

    def _encode_part(self, thread_id: str, ns: str, channel: str, typ: str, raw: bytes,
                     prev: Ref | None) -> fmt.Part:
        """A delta against the channel's previous version when that is in memory, else whole."""
        if prev is not None and prev[0] is not None and len(raw) >= fmt.MIN_DELTA_BYTES:
            hit = self._values.get((thread_id, ns, str(prev[0]), channel))
            if (hit is not None and hit[2] + 1 < self.full_every
                    and len(hit[1]) <= fmt.MAX_DELTA_BASE and len(raw) <= fmt.MAX_DELTA_BASE):
                return fmt.encode_part(channel, typ, raw, hit[1], str(prev[0]), hit[2] + 1)
        return fmt.encode_part(channel, typ, raw)

    def _mark_run(self, run_id: str, thread_id: str, ns: str) -> None:
        """Once per (run, thread, namespace): lets delete_for_runs find the run without a full scan."""
        mark = (run_id, thread_id, ns)
        if mark in self._run_markers:
            return
        if len(self._run_markers) >= _MAX_THREADS:  # a run per call: forgotten, stored again at most once
            self._run_markers.clear()
        body = json.dumps({"thread_id": thread_id, "checkpoint_ns": ns}).encode()
        with contextlib.suppress(FileExistsError):
            self.storage.put_if_absent(lg_run_marker_key(run_id, thread_id, ns), body)
        self._run_markers.add(mark)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Regular writes of one call go in one object (first call per task wins, as in LangGraph's
        savers); special writes (error, interrupt, resume, scheduled) replace earlier ones."""
        items: _SerializedWrites = []
        for idx, (channel, value) in enumerate(writes):
            typ, raw = self.serde.dumps_typed(value)
            items.append((WRITES_IDX_MAP.get(channel, idx), channel, typ, raw))
        self.put_serialized_writes(config, str(task_id), task_path, items)

    def put_serialized_writes(self, config: RunnableConfig, task_id: str, task_path: str,
                              items: Sequence[tuple[int, str, str, bytes]]) -> None:
        """`put_writes` of values already serialized by LangGraph's serde, with their slots:
        (idx, channel, serde type, bytes), idx < 0 for the special channels (WRITES_IDX_MAP).

        For importers (`ckptfs import-langgraph`): a source saver's rows keep their exact idx,
        task path and bytes, so the replay order of a super-step's writes is the source's.
        """
        thread_id, ns, checkpoint_id = self._ids(config)
        if checkpoint_id is None:
            raise ValueError("put_writes needs config['configurable']['checkpoint_id']")
        with self._writing(thread_id, ns=ns) as tenure:
            self._name_thread(thread_id, tenure)
            regular = sorted((i for i in items if i[0] >= 0), key=lambda i: i[0])
            special = [i for i in items if i[0] < 0]
            if regular:
                key = lg_write_key(thread_id, ns, checkpoint_id, task_id, lg_write_slot(regular[0][0]))
                with contextlib.suppress(FileExistsError):
                    self.storage.put_if_absent(key, self._pack_writes(task_id, task_path, regular))
            for item in special:
                key = lg_write_key(thread_id, ns, checkpoint_id, task_id, lg_write_slot(item[0]))
                self.storage.put(key, self._pack_writes(task_id, task_path, [item]))

    @staticmethod
    def _pack_writes(task_id: str, task_path: str, items: Sequence[tuple[int, str, str, bytes]]) -> bytes:
        meta: Any = [[idx, channel, typ, len(raw)] for idx, channel, typ, raw in items]
        return fmt.pack({"kind": "writes", "task": task_id, "path": task_path, "items": meta},
                        b"".join(raw for *_, raw in items), [])

    # --------------------------------------------------------------------------- deletion

    def delete_thread(self, thread_id: str) -> None:
        thread_id = str(thread_id)
        with self._writing(thread_id, fresh=True, confirm=False, erase=True):
            keys = self.storage.list(lg_thread_prefix(thread_id))
            # newest checkpoints first: whatever survives a crash midway still reads back whole
            ckpts = sorted((k for k in keys if f"/{CKPT}" in k), key=lambda k: k.rsplit("/", 1)[1],
                           reverse=True)
            self.storage.delete_many(ckpts)
            ckpt_set = set(ckpts)
            self.storage.delete_many([key for key in keys if key not in ckpt_set])
            self._drop_traces(thread_id)
        self._forget(thread_id)

    def _drop_traces(self, thread_id: str) -> None:
        """What names a thread gone from `langgraph/threads/`: its run markers (each holds the
        id, for delete_for_runs) and then, last, its name object, so a thread half deleted by a
        crash is still named. Kept, they kept a deleted thread's id (often a user's address) in
        the store and in every mirror, and a marker sent delete_for_runs back to it."""
        seg = lg_thread_segment(thread_id)
        runs = f"{LG_ROOT}/runs/"
        try:
            markers = [k for k in self.storage.list(runs) if k[len(runs):].split("/")[1:2] == [seg]]
        except FileNotFoundError:
            markers = []
        self.storage.delete_many(markers)
        with self._lock:
            self._run_markers = {m for m in self._run_markers if m[1] != thread_id}
        if lg_hashed(seg):
            with contextlib.suppress(FileNotFoundError):
                self.storage.delete(lg_name_key(seg))
            with self._lock:
                self._named.pop(seg, None)

    def _forget(self, thread_id: str, ns: str | None = None) -> None:
        self._values.forget_thread(thread_id)
        with self._lock:
            for k in [k for k in self._last if k[0] == thread_id and (ns is None or k[1] == ns)]:
                del self._last[k]
            for k in [k for k in self._newest if k[0] == thread_id and (ns is None or k[1] == ns)]:
                del self._newest[k]
            for k in [k for k in self._current if k[0] == thread_id and (ns is None or k[1] == ns)]:
                del self._current[k]
            for k in [k for k in self._views if k[0] == thread_id and (ns is None or k[1] == ns)]:
                del self._views[k]
        self._plans.forget(thread_id, ns)

    def _namespaces(self, thread_id: str) -> _Strs:
        """The ns prefixes of a thread (their segments may be hashes, so never decoded)."""
        tp = lg_thread_prefix(thread_id)
        return [f"{tp}{seg}/" for seg in self.storage.list_dirs(tp)]

    def _remove(self, thread_id: str, prefix: str, choose: Choose) -> None:
        ns = remove_checkpoints(self.storage, thread_id, prefix, choose, self._read, self._metadata)
        if ns is not None:
            self._forget(thread_id, ns)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            rp = lg_run_prefix(str(run_id))
            for marker in self.storage.list(rp):
                try:
                    info = json.loads(self.storage.get(marker))
                except FileNotFoundError:
                    continue
                thread_id, ns = str(info["thread_id"]), str(info["checkpoint_ns"])
                with self._writing(thread_id, fresh=True, confirm=False, erase=True):
                    self._remove(thread_id, lg_ns_prefix(thread_id, ns), of_run(str(run_id)))
                    with contextlib.suppress(FileNotFoundError):
                        self.storage.delete(marker)
                    if not self.storage.list(lg_thread_prefix(thread_id)):
                        # the run was all the thread held: nothing is left to name
                        self._drop_traces(thread_id)
                        self._forget(thread_id)
            with self._lock:
                self._run_markers = {m for m in self._run_markers if m[0] != str(run_id)}

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        keep_last: int | None = None,
    ) -> None:
        """`keep_latest` keeps the newest `keep_last` (default 1) checkpoints per namespace, with
        their pending writes (interrupts, resumes) and every stored version they read;
        `delete` removes the threads."""
        if strategy == "delete":
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        if strategy != "keep_latest":
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        n = 1 if keep_last is None else keep_last
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"keep_last must be an integer >= 1 (use strategy='delete'), got {keep_last!r}")
        for thread_id in thread_ids:
            with self._writing(str(thread_id), fresh=True, confirm=False, erase=True):
                for prefix in self._namespaces(str(thread_id)):
                    self._remove(str(thread_id), prefix, all_but_newest(n))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every object byte for byte (they never name their thread); existing ones stay."""
        src, dst = lg_thread_prefix(str(source_thread_id)), lg_thread_prefix(str(target_thread_id))
        with self._writing(str(target_thread_id), fresh=True) as tenure:
            keys = self.storage.list(src)
            if keys:
                self._name_thread(str(target_thread_id), tenure)

            def order(key: str) -> tuple[int, str]:
                # holders and writes before the checkpoints that point at them, oldest first
                return (1 if f"/{CKPT}" in key else 0, key.rsplit("/", 1)[1])

            for key in sorted(keys, key=order):
                try:
                    data = self.storage.get(key)
                except FileNotFoundError:
                    continue
                if f"/{CKPT}" in key and not lg_is_plan(key):
                    head = fmt.unpack(data, key, self.max_decoded_bytes).header
                    if head.get("run_id") is not None:
                        self._mark_run(str(head["run_id"]), str(target_thread_id), str(head["ns"]))
                with contextlib.suppress(FileExistsError):
                    self.storage.put_if_absent(dst + key[len(src):], data)

    # ------------------------------------------------------------------------------ async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        before = self._tenure_of(config)
        found = await asyncio.to_thread(self._get_tuple, config)
        self._after_read(config, found, before)  # here: the caller's context, not the worker thread's
        return found

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        it = self.list(config, filter=filter, before=before, limit=limit)
        done = object()
        while True:
            item = await asyncio.to_thread(next, it, done)
            if item is done:
                return
            yield cast(CheckpointTuple, item)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        keep_last: int | None = None,
    ) -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy, keep_last=keep_last)

    # ------------------------------------------------------------- versions and ownership

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The next version of a channel, in the type its thread uses (`versions.py`): ints for
        threads this saver started, strings for threads InMemorySaver, SqliteSaver or
        PostgresSaver started (migrated in), floats for floats."""
        return next_version(current)

    @contextlib.contextmanager
    def _writing(self, thread_id: str, *, fresh: bool = False, confirm: bool = True,
                 erase: bool = False, ns: str | None = None) -> Iterator[object]:
        """Hold the thread for one write (`ThreadLeases.begin`/`end`): the keeper does not give
        it back as idle while the write is in flight, however long it takes, and with `confirm`
        the write is acknowledged only if the lease held, in the generation it began under,
        all through it (a write slower than the lease may have forked the thread); otherwise
        ThreadBusyError, and what this saver noted of the thread is forgotten. Yields the tenure
        (None without leases): a new object each time the lease is taken again.

        Inside the lease, the thread's gate in this process (`erasures.py`): `erase` (delete,
        prune) waits for the other savers' writes in flight and removes alone; a write after a
        removal by any saver of the process first forgets what this saver knew of the thread,
        which may name removed objects (a checkpoint referring to them was acknowledged and
        unreadable elsewhere).

        `ns`: the write extends what this saver last saw of that namespace (a put, put_writes):
        refused, nothing written, if another process wrote it since (`_check_view`)."""
        if self.leases is None:
            gate = self._enter_gate(thread_id, erase)
            try:
                yield None
            finally:
                self._leave_gate(thread_id, gate)
            return
        tenure = self.leases.begin(thread_id, wait=self.busy_timeout, fresh=fresh)
        with self._lock:
            self._wrote.add(thread_id)
            if len(self._wrote) > _MAX_WROTE:  # a long-lived saver: keep only what is still held
                self._wrote &= set(self.leases.holding())
        done = refused = False
        try:
            gate = self._enter_gate(thread_id, erase)
            try:
                # inside the gate: a removal by another saver of this process, which forgets
                # what this one saw, is no other process's write
                view = None if ns is None else self._views.get((thread_id, ns))  # one dict read
                if view is not None and view[1] is not tenure:
                    try:
                        self._check_view(thread_id, str(ns), tenure)
                    except ThreadBusyError:
                        refused = True
                        raise
                yield tenure
            finally:
                self._leave_gate(thread_id, gate)
            done = True
        finally:
            try:
                self.leases.end(thread_id, tenure, confirm=done and confirm)
            except ThreadBusyError:
                # the write is not acknowledged: nothing it noted (inside the gate) is trusted
                self._forget_removed(thread_id)
                raise
            if refused:  # nothing written: the thread goes back now, not after lease_idle
                self.leases.release(thread_id)

    def _check_view(self, thread_id: str, ns: str, tenure: object) -> None:
        """Under the thread's lease, before a write that extends what this saver last saw of the
        namespace (`_views`: its newest checkpoint when last read or written here; "": it was
        empty): ThreadBusyError unless that is the newest still. The lease alone did not say: a
        process that waited for it (busy_timeout), or came back after its holder let go, wrote
        on the state it had read before the holder's writes, and the thread's newest checkpoint
        no longer had them in its history (or, read empty, the thread got a second root).
        Needed once per tenure (the view then holds while the lease does): one listing, beside
        the requests that took the lease.

        A write of this saver in flight beside this one (LangGraph's put_writes beside its put)
        may have checked the view under this tenure and stored a checkpoint since: the view is
        looked at again after the listing, and a check of it under this tenure stands."""
        at = (thread_id, ns)
        ckpts = lg_ns_prefix(thread_id, ns) + CKPT
        while True:
            view = self._views.get(at)
            if view is None or view[1] is tenure:
                return
            seen = lg_checkpoint_key(thread_id, ns, view[0]) if view[0] else ""
            if seen:
                # from just below the key seen: it and anything newer, in one request
                found = [k for k in checkpoint_keys(self.storage.list(ckpts, seen[:-1])) if k >= seen]
            else:
                found = checkpoint_keys(self.storage.list(ckpts))
            with self._lock:
                now = self._views.get(at)
                if now is None or now[1] is tenure:
                    return
                if now[0] != view[0]:
                    continue  # read again meanwhile: check what that read saw
                if found == ([seen] if seen else []):
                    self._views[at] = (view[0], tenure)
                    return
            break
        if found:
            newest = lg_decode(found[-1].rsplit("/", 1)[1])
            what = (f"checkpoint {newest} is newer than the one read" if seen
                    else f"it was empty then and now holds checkpoint {newest}")
        else:
            what = "the checkpoint read is gone (deleted or pruned)"
        where = f" (namespace {ns!r})" if ns else ""
        raise ThreadBusyError(thread_id, None, f"it wrote the thread{where} since this process read "
                              f"it ({what}); nothing was written: read the thread again (a new "
                              "invoke) before writing, or its history would fork")

    def _enter_gate(self, thread_id: str, erase: bool) -> threading.Event | None:
        """Pass the thread's gate (`erasures.py`): a removal's event, or None for a write, which
        first forgets what this saver knew of the thread if a removal came since its last write.
        Plain calls, not a context manager: every put passes here (see erasures.py)."""
        if erase:
            return erasures.enter_erase(self._store_key, thread_id)
        epoch = erasures.enter_write(self._store_key, thread_id)
        try:
            last = self._epochs.get(thread_id)  # one dict read and write: atomic, no lock needed
            if last != epoch:
                if last is None and len(self._epochs) >= _MAX_THREADS:
                    self._start_over()
                self._epochs[thread_id] = epoch
                # A thread unknown since the saver started over may still have memory a put in
                # flight then wrote: forgotten if a removal came after (rare: O(memory) scans).
                if last is not None or epoch > self._started_over >= 0:
                    logger.debug("thread %s: removed by another saver of this process since this "
                                 "one wrote it; what this saver knew of it is forgotten",
                                 shown(thread_id))
                    self._forget_removed(thread_id)
        except BaseException:
            erasures.leave_write(self._store_key, thread_id)
            raise
        return None

    def _leave_gate(self, thread_id: str, gate: threading.Event | None) -> None:
        if gate is None:
            erasures.leave_write(self._store_key, thread_id)
        else:
            erasures.leave_erase(self._store_key, thread_id, gate)

    def _start_over(self) -> None:
        """Forget every thread (`_MAX_THREADS`): what this saver knew is only a shortcut, read
        again from the store at each thread's next put. The removal sequence is noted first, so
        a thread written after it knows whether a removal came since (`_enter_gate`)."""
        self._started_over = erasures.sequence()
        logger.debug("saver on %s: memory of %d threads forgotten (more than %d)",
                     self.storage.display_name, len(self._epochs), _MAX_THREADS)
        self._values.clear()
        self._plans.clear()
        with self._lock:
            self._epochs.clear()
            self._last.clear()
            self._newest.clear()
            self._current.clear()
            self._named.clear()
            self._run_markers.clear()

    def _forget_removed(self, thread_id: str) -> None:
        """All this saver remembers of a thread whose objects may have been removed."""
        self._forget(thread_id)
        seg = lg_thread_segment(thread_id)
        with self._lock:
            self._named.pop(seg, None)
            self._run_markers = {m for m in self._run_markers if m[1] != thread_id}

    def release(self, thread_id: str | None = None) -> None:
        """Give a thread (default: every thread this saver wrote) back now, so another process
        may write it at once rather than after `lease_idle` seconds. Savers of one process share
        their leases: another saver of this process still writing the thread takes it again."""
        if self.leases is None:
            return
        with self._lock:
            threads = sorted(self._wrote) if thread_id is None else [str(thread_id)]
            self._wrote.difference_update(threads)
        for tid in threads:
            self.leases.release(tid)

    def __enter__(self) -> CkptfsSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release this process's threads on the store and close cached handles."""
        self.release()
        self._unregister()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.storage.close()
