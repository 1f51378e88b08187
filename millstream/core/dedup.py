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
from bisect import bisect_left
from collections import deque
from itertools import count
from operator import itemgetter
from typing import Iterable

_KEY, _ID, _MARK = itemgetter(0), itemgetter(1), itemgetter(2)


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

    __slots__ = ("marks", "_chunks", "_sequence")

    def __init__(self) -> None:
        self.marks: dict[tuple[str, str], int] = {}
        # Expiry order: each add_all's entries as one chunk sorted by mark, in a heap by the mark of
        # the chunk's first unexpired entry: (that mark, sequence, chunk, its position). Sorting and
        # indexing a chunk run in C; a heap entry per id would cost a Python-level push per id.
        self._chunks: list[tuple[int, int, list[tuple[str, str, int]], int]] = []
        self._sequence = count()

    def __len__(self) -> int:
        return len(self.marks)

    def seen(self, key: str, record_id: str) -> bool:
        return (key, record_id) in self.marks

    def add(self, key: str, record_id: str, mark: int) -> None:
        self.add_all([(key, record_id, mark)])

    def add_all(self, entries: Iterable[tuple[str, str, int]]) -> None:
        chunk = sorted(entries, key=_MARK)
        if not chunk:
            return
        self.marks.update(zip(zip(map(_KEY, chunk), map(_ID, chunk)), map(_MARK, chunk)))
        heapq.heappush(self._chunks, (chunk[0][2], next(self._sequence), chunk, 0))

    def expire(self, low_watermark: int, horizon_ms: int) -> None:
        """Forget ids whose mark is older than low_watermark - horizon_ms.

        An id added again has a new mark (the newest counts): its old chunk entry no longer matches
        and leaves it be."""
        cutoff = low_watermark - horizon_ms
        chunks, marks = self._chunks, self.marks
        get = marks.get
        while chunks and chunks[0][0] < cutoff:
            _, sequence, chunk, start = heapq.heappop(chunks)
            end = bisect_left(chunk, cutoff, lo=start, key=_MARK)
            expired = chunk[start:end]
            pairs = list(zip(map(_KEY, expired), map(_ID, expired)))
            deque(map(marks.__delitem__, [pair for pair, mark in zip(pairs, map(_MARK, expired))
                                          if get(pair) == mark]), maxlen=0)
            if end < len(chunk):
                heapq.heappush(chunks, (chunk[end][2], sequence, chunk, end))

    def entries(self) -> list[tuple[str, str, int]]:
        return [(key, record_id, mark) for (key, record_id), mark in self.marks.items()]
