"""An injector that computes record i from its index: for demos and benchmarks.

Deterministic by construction (replay reads the same indices), optionally paced in wall time, and
partitioned: partition p of P produces the indices i with i mod P == p, so P Spark tasks read it.
The caller supplies an honest low watermark: `low_watermark(n)` must be <= the timestamp of every
record with index >= n (for data with bounded disorder, the n-th base time minus the bound). A record
made without an id gets one derived from the injector's `name` and its index (give each generator of a
pipeline its own name).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from millstream.model.injector import Injector, Offset, check_injected
from millstream.model.records import END_OF_TIME, Record, derive_record_id


class GeneratorInjector(Injector):
    """Records `make_record(0) .. make_record(total - 1)`.

    >>> gen = GeneratorInjector(lambda i: Record(f"k{i % 2}", i, 10 * i), total=4,
    ...                         low_watermark=lambda n: 10 * n, partitions=2)
    >>> gen.partitions()
    ('0', '1')
    >>> end = gen.latest_offset("1", gen.initial_offset("1"), None)
    >>> [r.value for r in gen.read("1", gen.initial_offset("1"), end)], gen.low_watermark("1", end)
    ([1, 3], 140737488355327)
    """

    def __init__(
        self,
        make_record: Callable[[int], Record[Any]],
        total: int,
        low_watermark: Callable[[int], int],
        records_per_second: float | None = None,
        max_records_per_read: int = 100_000,
        name: str = "generator",
        partitions: int = 1,
        keyed_watermarks: Mapping[str, Callable[[int], int]] | None = None,
    ) -> None:
        """`low_watermark(n)`: the watermark once every index below n is read (per partition, n is the
        next index it reads). `keyed_watermarks`: watermark key -> the same kind of function, for
        keyed watermarks (`Injector.watermark_keys`)."""
        if total < 0:
            raise ValueError("total must be >= 0")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.make_record = make_record
        self.total = total
        self.watermark_at = low_watermark
        self.records_per_second = records_per_second
        self.max_records_per_read = max_records_per_read
        self.name = name
        self.partition_count = partitions
        self.keyed_watermark_at = dict(keyed_watermarks or {})
        self.watermark_keys = tuple(sorted(self.keyed_watermark_at))

    def partitions(self) -> Sequence[str]:
        return tuple(str(p) for p in range(self.partition_count))

    def id_namespace(self) -> tuple[str, str] | None:
        # Ids derive_record_id(name, "index", i), unless make_record gives its own: asked of the first.
        try:
            first: Any = self.make_record(0) if self.total else None
            if first is None or getattr(first, "id", None):
                return None
        except Exception:  # make_record's own mistake: reported, named, when the records are read
            pass
        return ("index", self.name)

    def _count(self, partition: int, limit: int) -> int:
        """How many of the first `limit` indices belong to `partition`."""
        return max(0, (limit - partition + self.partition_count - 1) // self.partition_count)

    def initial_offset(self, partition: str) -> Offset:
        return {"next": 0, "started_ms": None}

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        p = int(partition)
        started = start["started_ms"] if start["started_ms"] is not None else int(time.time() * 1000)
        limit = self.total
        if self.records_per_second:
            elapsed = max(0.0, time.time() - started / 1000)
            limit = min(limit, int(elapsed * self.records_per_second))
        available = self._count(p, limit)
        cap = self.max_records_per_read if max_records is None else min(max_records, self.max_records_per_read)
        end = min(available, start["next"] + cap)
        if end <= start["next"] and start["started_ms"] is not None:
            return start
        return {"next": max(end, start["next"]), "started_ms": started}

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any]]:
        p, step = int(partition), self.partition_count
        for n in range(start["next"], end["next"]):
            index = p + n * step
            record = self.make_record(index)
            if not isinstance(record, Record):  # make_record's mistake, named (records are checked downstream)
                check_injected(record, self.name)
            # Every injected record needs an id: without one, exactly-once delivery would treat all
            # records of a key as duplicates of the first.
            yield record if record.id else record.with_id(derive_record_id(self.name, "index", index))

    def next_arrival_s(self, partition: str, offset: Offset) -> float | None:
        index = int(partition) + offset["next"] * self.partition_count  # the next index this partition reads
        if not self.records_per_second or offset["started_ms"] is None or index >= self.total:
            return None
        # latest_offset makes index i available once int(elapsed * rate) > i
        due = offset["started_ms"] / 1000 + (index + 1) / self.records_per_second
        return max(0.0, float(due - time.time()))

    def low_watermark(self, partition: str, offset: Offset) -> int:
        index = int(partition) + offset["next"] * self.partition_count  # the next index this partition reads
        if index >= self.total:
            return END_OF_TIME
        return self.watermark_at(index)

    def keyed_watermarks(self, partition: str, offset: Offset) -> Mapping[str, int]:
        index = int(partition) + offset["next"] * self.partition_count
        if index >= self.total:
            return {key: END_OF_TIME for key in self.keyed_watermark_at}
        return {key: at(index) for key, at in self.keyed_watermark_at.items()}
