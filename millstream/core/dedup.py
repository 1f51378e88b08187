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
from itertools import count
from operator import itemgetter
from typing import Iterable

_MARK = itemgetter(2)


class DedupIndex:
    """The (key, record id) pairs a key group has seen, each with its mark.

    >>> index = DedupIndex()
    >>> index.add("k", "r1", 100)
    >>> index.seen("k", "r1"), index.seen("other", "r1"), "r1" in index.by_key["k"]
    (True, False, True)
    >>> index.expire(low_watermark=1_100, horizon_ms=1_000)  # 100 is not yet older than 1100 - 1000
    >>> index.seen("k", "r1")
    True
    >>> index.expire(low_watermark=1_101, horizon_ms=1_000)
    >>> index.seen("k", "r1"), index.by_key
    (False, {})

    Built so the garbage collector need not visit the ids: a worker keeps many key groups' indexes
    for a long time, and a full collection that traverses every id costs in proportion to all of
    them (docs/performance.md). The ids are kept per key (`by_key`: key -> {record id: mark}); a
    dict holding only strings and ints is not tracked by the collector, so only the outer dict (one
    entry per key) is. The expiry order is kept in tuples of strings and ints, which the collector
    stops tracking the first time it sees them. A step also tests a record with one lookup in its
    key's dict, with no (key, id) tuple built per record.
    """

    __slots__ = ("by_key", "_chunks", "_sequence")

    def __init__(self) -> None:
        self.by_key: dict[str, dict[str, int]] = {}
        # Expiry order: each add_all's entries as one chunk sorted by mark, in a heap by the mark of
        # the chunk's first unexpired entry: (that mark, sequence, marks, keys, ids, its position),
        # marks, keys and ids parallel tuples. Sorting and slicing a chunk run in C; a heap entry per
        # id would cost a Python-level push per id.
        self._chunks: list[tuple[int, int, tuple[int, ...], tuple[str, ...], tuple[str, ...], int]] = []
        self._sequence = count()

    def __len__(self) -> int:
        return sum(map(len, self.by_key.values()))

    def seen(self, key: str, record_id: str) -> bool:
        ids = self.by_key.get(key)
        return ids is not None and record_id in ids

    def add(self, key: str, record_id: str, mark: int) -> None:
        self.add_all([(key, record_id, mark)])

    def add_all(self, entries: Iterable[tuple[str, str, int]]) -> None:
        chunk = sorted(entries, key=_MARK)
        if not chunk:
            return
        by_key = self.by_key
        for key, record_id, mark in chunk:
            ids = by_key.get(key)
            if ids is None:
                by_key[key] = {record_id: mark}
            else:
                ids[record_id] = mark
        keys, record_ids, marks = zip(*chunk)
        heapq.heappush(self._chunks, (marks[0], next(self._sequence), marks, keys, record_ids, 0))

    def expire(self, low_watermark: int, horizon_ms: int) -> None:
        """Forget ids whose mark is older than low_watermark - horizon_ms.

        An id added again has a new mark (the newest counts): its old chunk entry no longer matches
        and leaves it be. A key left with no id leaves the index."""
        cutoff = low_watermark - horizon_ms
        chunks, by_key = self._chunks, self.by_key
        while chunks and chunks[0][0] < cutoff:
            _, sequence, marks, keys, record_ids, start = heapq.heappop(chunks)
            end = bisect_left(marks, cutoff, lo=start)
            for key, record_id, mark in zip(keys[start:end], record_ids[start:end], marks[start:end]):
                ids = by_key.get(key)
                if ids is not None and ids.get(record_id) == mark:
                    del ids[record_id]
                    if not ids:
                        del by_key[key]
            if end < len(marks):
                heapq.heappush(chunks, (marks[end], sequence, marks, keys, record_ids, end))

    def entries(self) -> list[tuple[str, str, int]]:
        return [(key, record_id, mark) for key, ids in self.by_key.items() for record_id, mark in ids.items()]

    def pairs(self) -> dict[tuple[str, str], int]:
        """{(key, record id): mark}, for tests and tools."""
        return {(key, record_id): mark for key, record_id, mark in self.entries()}
