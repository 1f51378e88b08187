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

Ids are per key (the same id under two keys is two records), as in MillWheel. A step hands over its
ids as `SeenIds`: per key, the step's own dict of id -> mark. The index keeps one dict per key, so a
step's test of a record is one lookup in its key's dict, and adding a key's ids is one dict update.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import count
from operator import itemgetter
from typing import Collection, Iterable, Mapping

SeenIds = Mapping[str, Mapping[str, int]]  # key -> {record id: mark}: the ids one step (or chunk) saw
_NONE: Mapping[str, int] = {}
_FIRST = itemgetter(0)


class DedupIndex:
    """The (key, record id) pairs a key group has seen, each with its mark.

    >>> index = DedupIndex()
    >>> index.add({"k": {"r1": 100}})
    >>> "r1" in index.ids_of("k"), "r1" in index.ids_of("other")
    (True, False)
    >>> index.expire(low_watermark=1_100, horizon_ms=1_000)  # 100 is not yet older than 1100 - 1000
    >>> "r1" in index.ids_of("k")
    True
    >>> index.expire(low_watermark=1_101, horizon_ms=1_000)
    >>> "r1" in index.ids_of("k"), len(index)
    (False, 0)
    """

    __slots__ = ("_by_key", "_chunks", "_sequence", "_size", "_overwritten", "_highest")

    def __init__(self) -> None:
        self._by_key: dict[str, dict[str, int]] = {}
        # Expiry order: each add's ids of one key as a chunk, in a heap by the chunk's lowest mark:
        # (lowest mark, sequence, highest mark, key, {id: mark}). A chunk whose highest mark is past
        # the cutoff leaves whole; one key's ids span a step's marks (the watermark, or a record's
        # time ahead of it), so most chunks leave whole. A chunk across the cutoff is split.
        self._chunks: list[tuple[int, int, int, str, dict[str, int]]] = []
        self._sequence = count()
        self._size = 0
        # Whether an add ever brought an id the index held already: until then every held id is in one
        # chunk with its mark, and a chunk leaving whole needs no match against its key's dict.
        self._overwritten = False
        self._highest: int | None = None  # the highest mark added: past it, every id goes at once

    def __len__(self) -> int:
        return self._size

    def ids_of(self, key: str) -> Mapping[str, int]:
        """The key's ids (with their marks), for `in` tests: one lookup per record. Live: read it
        before the next add or expiry."""
        return self._by_key.get(key, _NONE)

    def add(self, seen: SeenIds) -> None:
        """Add ids with their marks; an id added again takes its new mark (the newest counts). The
        index keeps the given per-key dicts (a step's own, or a chunk's just read): not to be changed
        afterwards."""
        by_key, chunks, sequence = self._by_key, self._chunks, self._sequence
        added = 0
        for key, ids in seen.items():
            if not ids:
                continue
            chunk = ids if type(ids) is dict else dict(ids)
            known = by_key.get(key)
            if known is None:
                by_key[key] = dict(chunk)
                added += len(chunk)
            else:
                before = len(known)
                known.update(chunk)
                grew = len(known) - before
                if grew != len(chunk):
                    self._overwritten = True
                added += grew
            marks = chunk.values()
            highest = max(marks)
            heapq.heappush(chunks, (min(marks), next(sequence), highest, key, chunk))
            if self._highest is None or highest > self._highest:
                self._highest = highest
        self._size += added

    def expire(self, low_watermark: int, horizon_ms: int) -> None:
        """Forget ids whose mark is older than low_watermark - horizon_ms.

        An id added again has a new mark: its old chunk's entry no longer matches and leaves it be."""
        cutoff = low_watermark - horizon_ms
        chunks, by_key = self._chunks, self._by_key
        if chunks and self._highest is not None and self._highest < cutoff:  # the end of the input, say
            by_key.clear()
            chunks.clear()
            self._size, self._highest = 0, None
            return
        forgotten = 0
        while chunks and chunks[0][0] < cutoff:
            _, sequence, highest, key, chunk = heapq.heappop(chunks)
            known = by_key.get(key)
            remaining: dict[str, int] = {}
            if known is None:
                gone: Collection[str] = ()
            elif highest < cutoff:  # the whole chunk: the ids still holding its marks go
                gone = list(map(_FIRST, chunk.items() & known.items())) if self._overwritten else chunk.keys()
            else:
                gone = [rid for rid, mark in chunk.items() if mark < cutoff and known.get(rid) == mark]
                remaining = {rid: mark for rid, mark in chunk.items() if mark >= cutoff}
            if gone:
                if len(gone) == len(known):  # type: ignore[arg-type]
                    del by_key[key]
                else:
                    deque(map(known.__delitem__, gone), maxlen=0)  # type: ignore[union-attr]
                forgotten += len(gone)
            if remaining:
                marks = remaining.values()
                heapq.heappush(chunks, (min(marks), sequence, highest, key, remaining))
        self._size -= forgotten

    def entries(self) -> list[tuple[str, str, int]]:
        """Every (key, id, mark), by key."""
        return [(key, record_id, mark) for key, ids in self._by_key.items() for record_id, mark in ids.items()]

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Every key's ids with their marks (a copy), in the layout `add` takes."""
        return {key: dict(ids) for key, ids in self._by_key.items()}


def seen_of(entries: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    """(key, id, mark) triples, the layout of chunks written by earlier versions, as SeenIds.

    >>> seen_of([("k", "r1", 5), ("j", "r2", 6), ("k", "r3", 7)])
    {'k': {'r1': 5, 'r3': 7}, 'j': {'r2': 6}}
    """
    seen: dict[str, dict[str, int]] = {}
    for key, record_id, mark in entries:
        seen.setdefault(key, {})[record_id] = mark
    return seen
