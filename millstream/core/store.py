"""Where a key group's keys live between steps: the contract the executor writes through.

A store keeps, per key, its KeyState blob and its two wake-up times (the next low-watermark time and
the next wall time at which the key has work), and answers "which keys are due" without reading every
key; and the key group's dedup index (dedup.py). The harness uses `MemoryKeyStore`; the Spark runner a
store whose truth is Spark's state store.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator, NamedTuple, Protocol

from millstream.core.dedup import DedupIndex


class StoredKey(NamedTuple):
    blob: bytes
    wake_lw: int | None  # low-watermark time of the key's next work (timer, expiry), if any
    wake_wall: int | None  # wall time of its next wall-time timer, if any


class KeyStore(Protocol):
    def load(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Blobs of the given keys that exist."""
        ...

    def due(self, low_watermark: int, wall_time: int) -> list[str]:
        """Keys whose low-watermark wake-up is <= low_watermark or wall wake-up <= wall_time."""
        ...

    def seen(self, key: str, record_id: str) -> bool:
        """Whether the key group has seen this injected record (dedup index)."""
        ...

    def save(self, changes: dict[str, StoredKey | None], seen: list[tuple[str, str, int]], low_watermark: int,
             horizon_ms: int) -> None:
        """Write a step's changed keys (None: the key is gone) and the ids it saw, with their marks,
        as one unit; then forget ids past the horizon at `low_watermark`."""
        ...

    def next_wall_time(self) -> int | None:
        """The earliest wall wake-up over all keys."""
        ...


class MemoryKeyStore:
    """A KeyStore in memory: blobs in a dict, wake-ups in heaps (stale heap entries are skipped)."""

    def __init__(self) -> None:
        self.blobs: dict[str, StoredKey] = {}
        self.dedup = DedupIndex()
        self._lw: list[tuple[int, str]] = []
        self._wall: list[tuple[int, str]] = []

    def load(self, keys: Iterable[str]) -> dict[str, bytes]:
        blobs = self.blobs
        return {key: blobs[key].blob for key in keys if key in blobs}

    def due(self, low_watermark: int, wall_time: int) -> list[str]:
        found: set[str] = set()
        for heap, limit, field in ((self._lw, low_watermark, 1), (self._wall, wall_time, 2)):
            valid = []
            while heap and heap[0][0] <= limit:
                time, key = heapq.heappop(heap)
                stored = self.blobs.get(key)
                if stored is not None and stored[field] == time:
                    found.add(key)
                    valid.append((time, key))
            # Still due until a save gives the key new wake-ups (a failed step saves nothing).
            for entry in valid:
                heapq.heappush(heap, entry)
        return sorted(found)

    def seen(self, key: str, record_id: str) -> bool:
        return (key, record_id) in self.dedup.marks

    def save(self, changes: dict[str, StoredKey | None], seen: list[tuple[str, str, int]] = (),  # type: ignore[assignment]
             low_watermark: int | None = None, horizon_ms: int = 0) -> None:
        self.dedup.add_all(seen)
        if low_watermark is not None:
            self.dedup.expire(low_watermark, horizon_ms)
        self.apply(changes)

    def apply(self, changes: dict[str, StoredKey | None]) -> None:
        """The keys' part of save."""
        for key, stored in changes.items():
            if stored is None:
                self.blobs.pop(key, None)
                continue
            self.blobs[key] = stored
            if stored.wake_lw is not None:
                heapq.heappush(self._lw, (stored.wake_lw, key))
            if stored.wake_wall is not None:
                heapq.heappush(self._wall, (stored.wake_wall, key))

    def next_wall_time(self) -> int | None:
        heap = self._wall
        while heap:
            time, key = heap[0]
            stored = self.blobs.get(key)
            if stored is not None and stored.wake_wall == time:
                return time
            heapq.heappop(heap)
        return None

    def keys(self) -> Iterator[str]:
        return iter(sorted(self.blobs))
