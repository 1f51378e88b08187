"""Where a key group's keys live between steps: the contract the executor writes through.

A store keeps, per key, its KeyState blob and its wake-up times (the next low-watermark time, the
next wall time and, per watermark key, the next keyed-watermark time at which the key has work), and
answers "which keys are due" without reading every key; the earliest hold its keys' timers put on the
output watermark (watermarks.py), without reading every key either; and the key group's dedup index
(dedup.py).
The harness uses `MemoryKeyStore`; the Spark runner a store whose truth is Spark's state store.
"""

from __future__ import annotations

import heapq
from functools import partial
from typing import Any, Callable, Container, Iterable, Iterator, Mapping, NamedTuple, Protocol

from millstream.core.dedup import DedupIndex, SeenIds


class StoredKey(NamedTuple):
    blob: bytes
    wake_lw: int | None  # low-watermark time of the key's next work (timer, expiry), if any
    wake_wall: int | None  # wall time of its next wall-time timer, if any
    wake_keyed: tuple[tuple[str, int], ...] = ()  # (watermark key, time) of its next timer on each keyed watermark
    hold: int | None = None  # the earliest hold of its pending timers on the output watermark, if any

    @classmethod
    def of(cls, fields: tuple[Any, ...]) -> "StoredKey":
        """A StoredKey from its fields as a plain tuple (as stores persist it; without `hold` if
        written before holds existed)."""
        return tuple.__new__(cls, fields) if len(fields) == 5 else cls(*fields)


class KeyStore(Protocol):
    def load(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Blobs of the given keys that exist."""
        ...

    def due(self, low_watermark: int, wall_time: int, keyed: Mapping[str, int] | None = None) -> list[str]:
        """Keys whose low-watermark wake-up is <= low_watermark, wall wake-up <= wall_time, or
        wake-up on a keyed watermark <= that key's watermark in `keyed`."""
        ...

    def seen_ids(self, key: str) -> Mapping[str, int]:
        """The ids of injected records the key group has seen under `key` (dedup index), with their
        marks, for `in` tests: a step tests each injected record, so the test is one lookup, not a
        call."""
        ...

    def save(self, changes: dict[str, StoredKey | None], seen: SeenIds, low_watermark: int,
             horizon_ms: int) -> None:
        """Write a step's changed keys (None: the key is gone) and the ids it saw (per key, id ->
        mark; the store keeps these dicts) as one unit; then forget ids past the horizon at
        `low_watermark`."""
        ...

    def next_wall_time(self) -> int | None:
        """The earliest wall wake-up over all keys."""
        ...

    def min_hold(self, excluding: Container[str] = ()) -> int | None:
        """The earliest hold over the stored keys but those in `excluding`, if any holds."""
        ...


class MemoryKeyStore:
    """A KeyStore in memory: blobs in a dict, wake-ups in heaps (stale heap entries are skipped)."""

    def __init__(self) -> None:
        self.blobs: dict[str, StoredKey] = {}
        self.dedup = DedupIndex()
        self._lw: list[tuple[int, str]] = []
        self._wall: list[tuple[int, str]] = []
        self._keyed: dict[str, list[tuple[int, str]]] = {}  # watermark key -> its wake-up heap
        self._holds: list[tuple[int, str]] = []  # (hold, key): stale entries skipped, as the wake-ups'

    def load(self, keys: Iterable[str]) -> dict[str, bytes]:
        blobs = self.blobs
        return {key: blobs[key].blob for key in keys if key in blobs}

    def due(self, low_watermark: int, wall_time: int, keyed: Mapping[str, int] | None = None) -> list[str]:
        found: set[str] = set()
        wakes: list[tuple[list[tuple[int, str]], int, Callable[[StoredKey], int | None]]] = [
            (self._lw, low_watermark, _wake_lw), (self._wall, wall_time, _wake_wall)]
        for watermark_key, limit in (keyed or {}).items():
            if watermark_key in self._keyed:
                wakes.append((self._keyed[watermark_key], limit, partial(_wake_keyed, watermark_key)))
        for heap, limit, wake in wakes:
            valid = []
            while heap and heap[0][0] <= limit:
                time, key = heapq.heappop(heap)
                stored = self.blobs.get(key)
                if stored is not None and wake(stored) == time:
                    found.add(key)
                    valid.append((time, key))
            # Still due until a save gives the key new wake-ups (a failed step saves nothing).
            for entry in valid:
                heapq.heappush(heap, entry)
        return sorted(found)

    def seen_ids(self, key: str) -> Mapping[str, int]:
        return self.dedup.ids_of(key)

    def save(self, changes: dict[str, StoredKey | None], seen: SeenIds | None = None,
             low_watermark: int | None = None, horizon_ms: int = 0) -> None:
        if seen:
            self.dedup.add(seen)
        if low_watermark is not None:
            self.dedup.expire(low_watermark, horizon_ms)
        self.apply(changes)

    def apply(self, changes: dict[str, StoredKey | None]) -> None:
        """The keys' part of save."""
        blobs = self.blobs
        for key, stored in changes.items():
            if stored is None:
                blobs.pop(key, None)
                continue
            old = blobs.get(key)
            blobs[key] = stored
            # A valid entry is never popped (due() puts it back): an unchanged wake-up is there already.
            if stored.wake_lw is not None and (old is None or old.wake_lw != stored.wake_lw):
                heapq.heappush(self._lw, (stored.wake_lw, key))
            if stored.wake_wall is not None and (old is None or old.wake_wall != stored.wake_wall):
                heapq.heappush(self._wall, (stored.wake_wall, key))
            if stored.wake_keyed and (old is None or old.wake_keyed != stored.wake_keyed):
                for watermark_key, time in stored.wake_keyed:
                    heapq.heappush(self._keyed.setdefault(watermark_key, []), (time, key))
            if stored.hold is not None and (old is None or old.hold != stored.hold):
                heapq.heappush(self._holds, (stored.hold, key))
        # Stale entries (a wake-up moved on before it came due) leave only when due: past twice the
        # keys, each heap is rebuilt from the live wake-ups, so it stays in proportion to the keys.
        limit = 2 * len(blobs) + _HEAP_SLACK
        if len(self._lw) > limit:
            self._lw = _heap((stored.wake_lw, key) for key, stored in blobs.items() if stored.wake_lw is not None)
        if len(self._wall) > limit:
            self._wall = _heap((stored.wake_wall, key) for key, stored in blobs.items()
                               if stored.wake_wall is not None)
        if len(self._holds) > limit:
            self._holds = _heap((stored.hold, key) for key, stored in blobs.items() if stored.hold is not None)
        for watermark_key, heap in self._keyed.items():
            if len(heap) > limit:
                self._keyed[watermark_key] = _heap((time, key) for key, stored in blobs.items()
                                                   for name, time in stored.wake_keyed if name == watermark_key)

    def next_wall_time(self) -> int | None:
        heap = self._wall
        while heap:
            time, key = heap[0]
            stored = self.blobs.get(key)
            if stored is not None and stored.wake_wall == time:
                return time
            heapq.heappop(heap)
        return None

    def min_hold(self, excluding: Container[str] = ()) -> int | None:
        heap, blobs = self._holds, self.blobs
        passed_over = []
        found = None
        while heap:
            hold, key = heap[0]
            stored = blobs.get(key)
            if stored is None or stored.hold != hold:  # stale: the key moved its hold or is gone
                heapq.heappop(heap)
            elif key in excluding:
                passed_over.append(heapq.heappop(heap))
            else:
                found = hold
                break
        for entry in passed_over:
            heapq.heappush(heap, entry)
        return found

    def keys(self) -> Iterator[str]:
        return iter(sorted(self.blobs))


_HEAP_SLACK = 1_024  # entries a heap may hold beyond twice the keys before it is rebuilt


def _heap(entries: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    heap = list(entries)
    heapq.heapify(heap)
    return heap


def _wake_lw(stored: StoredKey) -> int | None:
    return stored.wake_lw


def _wake_wall(stored: StoredKey) -> int | None:
    return stored.wake_wall


def _wake_keyed(watermark_key: str, stored: StoredKey) -> int | None:
    return dict(stored.wake_keyed).get(watermark_key)
