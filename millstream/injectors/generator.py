"""An injector that computes record i from its index: for demos and benchmarks.

Deterministic by construction (replay reads the same indices), optionally paced in wall time. The
caller supplies an honest low watermark: `low_watermark(n)` must be <= the timestamp of every record
with index >= n (for data with bounded disorder, the n-th base time minus the bound). A record made
without an id gets one derived from the injector's `name` and its index (give each generator of a
pipeline its own name).
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

from millstream.model.injector import Injector, Offset
from millstream.model.records import END_OF_TIME, Record, derive_record_id


class GeneratorInjector(Injector):
    def __init__(
        self,
        make_record: Callable[[int], Record],
        total: int,
        low_watermark: Callable[[int], int],
        records_per_second: float | None = None,
        max_records_per_read: int = 100_000,
        name: str = "generator",
    ) -> None:
        if total < 0:
            raise ValueError("total must be >= 0")
        self.make_record = make_record
        self.total = total
        self.watermark_at = low_watermark
        self.records_per_second = records_per_second
        self.max_records_per_read = max_records_per_read
        self.name = name

    def initial_offset(self) -> Offset:
        return {"next": 0, "started_ms": None}

    def latest_offset(self, start: Offset, max_records: int | None) -> Offset:
        started = start["started_ms"] if start["started_ms"] is not None else int(time.time() * 1000)
        limit = self.total
        if self.records_per_second:
            elapsed = max(0.0, time.time() - started / 1000)
            limit = min(limit, int(elapsed * self.records_per_second))
        cap = self.max_records_per_read if max_records is None else min(max_records, self.max_records_per_read)
        end = min(limit, start["next"] + cap)
        if end <= start["next"] and start["started_ms"] is not None:
            return start
        return {"next": max(end, start["next"]), "started_ms": started}

    def read(self, start: Offset, end: Offset) -> Iterator[Record]:
        for index in range(start["next"], end["next"]):
            record = self.make_record(index)
            # Every injected record needs an id: without one, exactly-once delivery would treat all
            # records of a key as duplicates of the first.
            yield record if record.id else record.with_id(derive_record_id(self.name, "index", index))

    def low_watermark(self, offset: Offset) -> int:
        if offset["next"] >= self.total:
            return END_OF_TIME
        return self.watermark_at(offset["next"])
