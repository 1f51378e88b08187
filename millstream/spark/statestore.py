"""A key group's keys in Spark's state store, written as deltas, read from a worker-side cache.

Spark's Python stateful operator costs a JVM round trip (~50-65 us) per state call, so one call per
key would dominate a batch, and rewriting whole pages of keys made every batch write all the state.
So per key group (the operator's grouping key) Spark holds:

- `chunks` (MapState id -> blob): each blob the changed keys (key -> StoredKey, or None: the key is
  gone), the dedup ids seen (key -> {id: mark}) and the token of the state it was written on (its
  parent). A batch writes ONE new chunk holding exactly what it changed: bytes written follow the
  changed state. Once the chunks add up to more than twice the live state, they are compacted into
  fresh base chunks (bounded amortized cost: at most ~1.5 bytes written per changed byte). Expired
  dedup ids need no record: expiry is a function of their mark and the watermark, which `head` keeps.
- `head` (ValueState), a few fixed fields: the chain (chunk ids `first_id` .. `next_id - 1`: ids are
  handed out in order, a compaction's base chunks included, so the chain is always one run), the
  token of the state (random, new at every save that writes a chunk), sizes, and the watermark and
  horizon the dedup ids were last expired with. Its size does not grow with the chain: a head listing
  every chunk, rewritten by every batch, made long runs of small batches write many times what they
  changed.

Everything Spark holds is the truth; Spark commits it atomically with the batch. Reads come from a
cache in the Python worker process: the key group's keys decoded into a MemoryKeyStore (blobs and
wake-up heaps), tagged with the chain and token it reflects. A batch first reads `head`: if the cache
is at its token, it is used as is; if the cache is at an earlier point of the same chain (another
worker ran the group meanwhile) and the first chunk it missed was written on the cache's token, it
reads just the chunks it missed; otherwise (a restart, a re-run batch whose first attempt was never
committed, a compaction) it rebuilds from all chunks. A cache can never be ahead of Spark's committed
state unnoticed: tokens are random per attempt, and a chunk of an attempt Spark committed in place of
the cache's own names another parent.
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Mapping

from millstream.core import flatpickle
from millstream.core.dedup import SeenIds, seen_of
from millstream.core.store import MemoryKeyStore, StoredKey

CHUNK_BYTES = 4 << 20
# Compact once the chunks written since the last compaction exceed this many times the live state.
COMPACT_RATIO = 2.0
# ... and at least this many bytes: a key group keeps at most max(2 x its live state, this) of chunks
# beyond its live state, which bounds the checkpoint and what a restart reads.
COMPACT_MIN_BYTES = 256 << 10
# Worker-side caches kept per Python worker process, least recently used evicted first.
CACHE_BYTES = int(os.environ.get("MILLSTREAM_CACHE_BYTES", 1 << 30))


_HEAD_FORMAT = 2  # the first format's head was a tuple starting with the chain's list of (id, token)


@dataclass
class Head:
    first_id: int = 0  # the chain: chunks first_id .. next_id - 1, oldest first
    next_id: int = 0
    token: str | None = None  # of the state the chain holds
    live_bytes: int = 0
    delta_bytes: int = 0  # bytes of chunks written since the last compaction
    watermark: int | None = None  # dedup ids were last expired at this watermark...
    horizon_ms: int = 0  # ... with this horizon

    def dumps(self) -> bytes:
        return pickle.dumps((_HEAD_FORMAT, self.first_id, self.next_id, self.token, self.live_bytes,
                             self.delta_bytes, self.watermark, self.horizon_ms), protocol=5)

    @classmethod
    def loads(cls, blob: bytes | None) -> "Head":
        """A head of either format (a root written before the head's size was bounded still loads).

        >>> Head.loads(Head(3, 7, "t", 10, 4, 99, 600).dumps())
        Head(first_id=3, next_id=7, token='t', live_bytes=10, delta_bytes=4, watermark=99, horizon_ms=600)
        >>> Head.loads(pickle.dumps(([(3, "a"), (4, "b")], 5, 10, 4, 99, 600)))  # the first format
        Head(first_id=3, next_id=5, token='b', live_bytes=10, delta_bytes=4, watermark=99, horizon_ms=600)
        """
        if not blob:
            return cls()
        fields = pickle.loads(blob)
        if fields[0] == _HEAD_FORMAT:
            return cls(*fields[1:])
        chain, next_id, live, delta, watermark, horizon = fields
        return cls(chain[0][0] if chain else next_id, next_id, chain[-1][1] if chain else None, live, delta,
                   watermark, horizon)


Chunk = tuple[dict[str, StoredKey | None], SeenIds, str | None]  # keys, ids seen, parent


@dataclass
class _Cache:
    keys: MemoryKeyStore = field(default_factory=MemoryKeyStore)
    first_id: int = 0  # the chain it reflects, as in Head
    next_id: int = 0
    token: str | None = None
    live_bytes: int = 0
    watermark: int | None = None  # the latest watermark its expiry forgot dedup ids at
    used_at: float = 0.0  # wall time this Python worker process last read it (drop_stopped)

    def at(self, head: Head) -> bool:
        """Whether this cache holds `head`'s state: the same chain, its ids expired no further than
        the head's watermark (an attempt Spark did not commit may have expired more). It is then
        expired as the head says: a batch of another worker that changed no key moved it."""
        if self.token != head.token or self.first_id != head.first_id or self.next_id != head.next_id:
            return False
        if self.watermark is not None and (head.watermark is None or self.watermark > head.watermark):
            return False
        self.follow(head)
        return True

    def catch_up(self, head: Head, read: Callable[[int], Chunk]) -> bool:
        """Apply the chunks of `head`'s chain written since this cache's state, if this cache's
        state is the one they were written on; False (nothing applied) otherwise."""
        if self.first_id != head.first_id or not self.first_id <= self.next_id < head.next_id:
            return False
        keys, seen, parent = read(self.next_id)
        if parent is None or parent != self.token:
            return False
        self.apply(keys, seen)
        for chunk_id in range(self.next_id + 1, head.next_id):
            self.apply(*read(chunk_id)[:2])
        self.follow(head)
        return True

    @classmethod
    def rebuilt(cls, head: Head, read: Callable[[int], Chunk]) -> "_Cache":
        cache = cls()
        for chunk_id in range(head.first_id, head.next_id):
            cache.apply(*read(chunk_id)[:2])
        cache.follow(head)
        return cache

    def follow(self, head: Head) -> None:
        """Take the head's chain as this cache's, its dedup ids expired as the head says."""
        self.expire(head.watermark, head.horizon_ms)
        self.first_id, self.next_id, self.token = head.first_id, head.next_id, head.token

    def apply(self, changes: dict[str, StoredKey | None], seen: SeenIds) -> None:
        blobs = self.keys.blobs
        for key, stored in changes.items():
            old = blobs.get(key)
            if old is not None:
                self.live_bytes -= len(old.blob) + len(key)
            if stored is not None:
                self.live_bytes += len(stored.blob) + len(key)
        self.keys.apply(changes)
        self.keys.dedup.add(seen)

    def expire(self, watermark: int | None, horizon_ms: int) -> bool:
        """Forget the dedup ids past the horizon at `watermark`; whether any was forgotten."""
        if watermark is None:
            return False
        before = len(self.keys.dedup)
        self.keys.dedup.expire(watermark, horizon_ms)
        if len(self.keys.dedup) == before:
            return False  # the ids are as the head's watermark left them, whatever this one is
        self.watermark = watermark if self.watermark is None else max(self.watermark, watermark)
        return True

    @property
    def size(self) -> int:
        """Bytes the live state takes when written: key blobs and dedup ids."""
        return self.live_bytes + _DEDUP_ENTRY_BYTES * len(self.keys.dedup)


_as_stored_key = StoredKey.of


def _chunk_blob(keys: dict[str, StoredKey | None], seen: SeenIds, parent: str | None) -> bytes:
    """A chunk: its keys as plain tuples (a NamedTuple pickles through a Python call each), its ids
    and the token of the state it was written on."""
    return flatpickle.dumps(({key: None if stored is None else tuple(stored) for key, stored in keys.items()}, seen,
                             parent))

_DEDUP_ENTRY_BYTES = 48  # a (key, id, mark) entry, roughly, once pickled
_CACHES: "OrderedDict[tuple[str, int], _Cache]" = OrderedDict()


# -- caches of stopped queries ------------------------------------------------------------------
# A stopped query's caches would stay in the worker processes until evicted by size, and each full
# collection there (spark/worker_garbage.py) would still visit them: a driver that runs query after query
# (a notebook, a test suite, the benchmarks) made its workers slower run after run
# (docs/performance.md, eleventh session). So the driver notes the namespaces (one per operator:
# `<checkpoint>#<computation>`) of the queries it stops, every query it starts afterwards carries
# them, and its operator drops their caches in the Python worker processes its tasks run in. Only
# those: a worker no later query reaches keeps them until evicted by size. Dropping a cache never
# changes a result: a cache is checked against Spark's committed head before each use, and a missing
# one is rebuilt. Stop times are the driver's wall clock and read times the worker's: on a cluster
# whose clocks disagree, a cache may be kept or rebuilt needlessly, never wrongly used.

STOPPED_KEPT = 64  # the most recent stopped namespaces a query carries (pickled into every task)
_STOPPED: "OrderedDict[str, float]" = OrderedDict()  # driver side: namespace -> wall time it stopped


def note_stopped(namespaces: Iterable[str], at: float | None = None) -> None:
    """Driver side: the queries of these namespaces stopped (now, or at `at`)."""
    stopped_at = time.time() if at is None else at
    for namespace in namespaces:
        _STOPPED.pop(namespace, None)
        _STOPPED[namespace] = stopped_at
    while len(_STOPPED) > STOPPED_KEPT:
        _STOPPED.popitem(last=False)


def note_started(namespaces: Iterable[str]) -> None:
    """Driver side: queries of these namespaces started again; later queries leave their caches be."""
    for namespace in namespaces:
        _STOPPED.pop(namespace, None)


def stopped_namespaces() -> dict[str, float]:
    """Driver side: namespace -> stop time, for the most recent namespaces whose query stopped and
    has not started again."""
    return dict(_STOPPED)


def drop_stopped(stopped: Mapping[str, float]) -> int:
    """Worker side: drop the caches of stopped queries' namespaces that no task read since the stop
    (a query restarted on the same root reads its caches again after it); how many were dropped.

    >>> saved = dict(_CACHES); _CACHES.clear()
    >>> _CACHES[("gone", 0)] = _Cache(used_at=10.0)
    >>> _CACHES[("restarted", 0)] = _Cache(used_at=30.0)
    >>> drop_stopped({"gone": 20.0, "restarted": 20.0}), sorted(_CACHES)
    (1, [('restarted', 0)])
    >>> _CACHES.clear(); _CACHES.update(saved)
    """
    dropped = [key for key, cache in _CACHES.items() if cache.used_at <= stopped.get(key[0], -1.0)]
    for key in dropped:
        del _CACHES[key]
    return len(dropped)


def _evict(keep: tuple[str, int]) -> None:
    total = sum(c.size for c in _CACHES.values())
    while total > CACHE_BYTES and len(_CACHES) > 1:
        oldest = next(iter(_CACHES))
        if oldest == keep:
            _CACHES.move_to_end(oldest)
            continue
        total -= _CACHES.pop(oldest).size


class SparkKeyStore:
    """The KeyStore of one key group for one batch (see the module doc)."""

    def __init__(self, head_state: Any, chunks_state: Any, namespace: str, group: int) -> None:
        self._head_state, self._chunks = head_state, chunks_state
        value = head_state.get()
        self.head = Head.loads(bytes(value[0]) if value else None)
        self._cache_key = (namespace, group)
        self.cache = self._current_cache()
        self.bytes_written = 0

    def _chunk(self, chunk_id: int) -> Chunk:
        value = self._chunks.getValue((chunk_id,))
        if not value:
            raise RuntimeError(f"state chunk {chunk_id} of key group {self._cache_key[1]} is missing")
        loaded = pickle.loads(bytes(value[0]))  # written by this module (_chunk_blob)
        # Keys as plain tuples; chunks written by earlier versions hold StoredKeys (the same values),
        # ids as a list of (key, id, mark), and no parent (a cache then rebuilds rather than catch up).
        keys = {key: None if stored is None else _as_stored_key(stored) for key, stored in loaded[0].items()}
        seen = loaded[1] if type(loaded[1]) is dict else seen_of(loaded[1])
        return keys, seen, loaded[2] if len(loaded) > 2 else None

    def _current_cache(self) -> _Cache:
        head = self.head
        cache = _CACHES.get(self._cache_key)
        if cache is None or not (cache.at(head) or cache.catch_up(head, self._chunk)):
            cache = _Cache.rebuilt(head, self._chunk)
        cache.used_at = time.time()
        _CACHES[self._cache_key] = cache
        _CACHES.move_to_end(self._cache_key)
        _evict(self._cache_key)
        return cache

    # -- KeyStore ------------------------------------------------------------------------------
    def load(self, keys: Iterable[str]) -> dict[str, bytes]:
        return self.cache.keys.load(keys)

    def due(self, low_watermark: int, wall_time: int, keyed: Mapping[str, int] | None = None) -> list[str]:
        return self.cache.keys.due(low_watermark, wall_time, keyed)

    def next_wall_time(self) -> int | None:
        return self.cache.keys.next_wall_time()

    def min_hold(self, excluding: Container[str] = ()) -> int | None:
        return self.cache.keys.min_hold(excluding)

    def seen_ids(self, key: str) -> Mapping[str, int]:
        return self.cache.keys.seen_ids(key)

    def save(self, changes: dict[str, StoredKey | None], seen: SeenIds, low_watermark: int,
             horizon_ms: int) -> None:
        head, cache = self.head, self.cache
        if head.watermark is not None:
            # Ids stay in the chunks once expired: a horizon raised since (a restart with another
            # dedup_horizon_ms) must not reach back past what was already forgotten.
            horizon_ms = min(horizon_ms, low_watermark - (head.watermark - head.horizon_ms))
        forgot = cache.expire(low_watermark, horizon_ms)
        if not changes and not seen:
            if forgot:  # only expiry: note the watermark it happened at
                head.watermark, head.horizon_ms = low_watermark, horizon_ms
                self._write_head()
            return
        blob = _chunk_blob(changes, seen, head.token)
        self._chunks.updateValue((head.next_id,), (blob,))
        self.bytes_written += len(blob)
        cache.apply(changes, seen)
        head.next_id += 1
        head.token = uuid.uuid4().hex
        head.delta_bytes += len(blob)
        head.live_bytes = cache.size
        head.watermark, head.horizon_ms = low_watermark, horizon_ms
        if head.delta_bytes > max(COMPACT_RATIO * head.live_bytes, COMPACT_MIN_BYTES):
            self._compact()
        self._write_head()
        cache.first_id, cache.next_id, cache.token = head.first_id, head.next_id, head.token

    def _write_head(self) -> None:
        blob = self.head.dumps()
        self._head_state.update((blob,))
        self.bytes_written += len(blob)

    def _compact(self) -> None:
        """Rewrite the live keys as fresh base chunks and drop every older chunk."""
        head = self.head
        old = range(head.first_id, head.next_id)
        first = head.next_id
        batch: dict[str, StoredKey | None] = {}
        size = 0
        for key, stored in self.cache.keys.blobs.items():
            batch[key] = stored
            size += len(stored.blob) + len(key)
            if size >= CHUNK_BYTES:
                self._write_base(batch, {})
                batch, size = {}, 0
        if batch:
            self._write_base(batch, {})
        per_chunk = max(1, CHUNK_BYTES // _DEDUP_ENTRY_BYTES)
        seen: dict[str, dict[str, int]] = {}
        held = 0
        for key, ids in self.cache.keys.dedup.snapshot().items():
            seen[key] = ids
            held += len(ids)
            if held >= per_chunk:
                self._write_base({}, seen)
                seen, held = {}, 0
        if seen:
            self._write_base({}, seen)
        for chunk_id in old:
            self._chunks.removeKey((chunk_id,))
        head.first_id = first
        head.delta_bytes = 0

    def _write_base(self, keys: dict[str, StoredKey | None], seen: SeenIds) -> None:
        # No parent: a cache from before the compaction has another first_id and rebuilds.
        blob = _chunk_blob(keys, seen, None)
        self._chunks.updateValue((self.head.next_id,), (blob,))
        self.head.next_id += 1
        self.bytes_written += len(blob)
