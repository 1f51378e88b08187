"""Exactly-once delivery of injected records: the ids a key group has seen, until their horizon.

MillWheel keeps each record's id with its key's state and discards a record whose id is already
there. Here the ids of a key group live apart from the keys' state, in one index per key group:

- a key's blob holds only its state and timers, so touching a key does not rewrite every id it ever
  saw, and ids never keep a key alive;
- an id is kept until the low watermark has moved `horizon` past its *mark* (the later of the record's
  time and the watermark once its input point was processed), whether or not its key is seen again:
  expiry is a function of (mark, watermark) alone, so every copy of the index expires the same ids;
- the ids a step adds reach the index only when the step is saved (a failed step adds nothing), and
  are what a store must persist (spark/statestore.py writes them with the step's changed keys);
  expired ones need no record of their removal.

Ids are per key (the same id under two keys is two records), as in MillWheel.
"""

from __future__ import annotations

import heapq
from typing import Iterable


class DedupIndex:
    """The (key, record id) pairs a key group has seen, each with its mark.

    >>> index = DedupIndex()
    >>> index.add("k", "r1", 100)
    >>> index.seen("k", "r1"), index.seen("other", "r1")
    (True, False)
    >>> index.expire(low_watermark=1_100, horizon_ms=1_000)  # 100 is not yet older than 1100 - 1000
    >>> index.seen("k", "r1")
    True
    >>> index.expire(low_watermark=1_101, horizon_ms=1_000)
    >>> index.seen("k", "r1")
    False
    """

    __slots__ = ("marks", "_by_mark")

    def __init__(self) -> None:
        self.marks: dict[tuple[str, str], int] = {}
        self._by_mark: list[tuple[int, str, str]] = []

    def __len__(self) -> int:
        return len(self.marks)

    def seen(self, key: str, record_id: str) -> bool:
        return (key, record_id) in self.marks

    def add(self, key: str, record_id: str, mark: int) -> None:
        self.marks[(key, record_id)] = mark
        heapq.heappush(self._by_mark, (mark, key, record_id))

    def add_all(self, entries: Iterable[tuple[str, str, int]]) -> None:
        marks, heap, push = self.marks, self._by_mark, heapq.heappush
        for key, record_id, mark in entries:
            marks[(key, record_id)] = mark
            push(heap, (mark, key, record_id))

    def expire(self, low_watermark: int, horizon_ms: int) -> None:
        """Forget ids whose mark is older than low_watermark - horizon_ms."""
        cutoff = low_watermark - horizon_ms
        heap, marks = self._by_mark, self.marks
        while heap and heap[0][0] < cutoff:
            mark, key, record_id = heapq.heappop(heap)
            if marks.get((key, record_id)) == mark:
                del marks[(key, record_id)]

    def entries(self) -> list[tuple[str, str, int]]:
        return [(key, record_id, mark) for (key, record_id), mark in self.marks.items()]
