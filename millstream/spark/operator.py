"""The transformWithState processor that runs a computation's ShardExecutor inside Spark.

Spark groups rows by shard (MillWheel's key interval), not by user key: the Python stateful operator
pays a fixed cost per grouping key per batch and ~50-65 us per state call, so per-user-key grouping
would cost a state call per key and a Spark timer per user timer. Per shard we keep:

- MapState `pages`: page id -> blob of that page's keys (state, timers, seen ids); only pages touched
  in a step are read and rewritten, so a step's cost follows the keys it touches, not the shard size.
- ValueState `index`: each page's earliest timers (ShardIndex).
- ValueState `armed`: the one Spark event-time timer armed for the shard, at its earliest pending
  low-watermark timer. Spark fires it once its watermark (= our coalesced input low watermark) passes;
  the executor then fires every due user timer of the shard, in order per key.

All writes of a batch land in RocksDB together when Spark commits the batch, with the productions it
emitted: per-key atomicity, by construction.

Each invocation emits its productions and one report row (stream = NULL) carrying the shard's next
pending timers and step metrics; the driver-side commit aggregates reports into the output watermark.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from millstream.core.executor import Delivery, ShardExecutor, StepResult
from millstream.core.plan import ComputationPlan
from millstream.model.records import Record

try:
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
except ImportError:  # pragma: no cover
    StatefulProcessor = object  # type: ignore
    StatefulProcessorHandle = Any  # type: ignore

OUTPUT_SCHEMA = (
    "stream string, key string, value binary, ts long, id string, "
    "shard int, wm long, next_lw long, next_wall long, "
    "records long, duplicates long, late long, timers long, productions long"
)


class _SparkShardStore:
    """ShardStore over transformWithState state variables of the current grouping key."""

    def __init__(self, pages: Any, index: Any) -> None:
        self._pages, self._index = pages, index

    def load_index(self) -> bytes | None:
        value = self._index.get()
        return bytes(value[0]) if value else None

    def save_index(self, blob: bytes) -> None:
        self._index.update((blob,))

    def load_page(self, page: int) -> bytes | None:
        value = self._pages.getValue((page,))
        return bytes(value[0]) if value else None

    def save_page(self, page: int, blob: bytes | None) -> None:
        if blob is None:
            self._pages.removeKey((page,))
        else:
            self._pages.updateValue((page,), (blob,))


class ShardProcessor(StatefulProcessor):
    def __init__(self, plan: ComputationPlan) -> None:
        self.plan = plan

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.armed = handle.getValueState("armed", "time long")
        store = _SparkShardStore(
            handle.getMapState("pages", "page int", "blob binary"),
            handle.getValueState("index", "blob binary"),
        )
        self.executor = ShardExecutor(self.plan, store)
        self.codecs = {i.stream: i.codec for i in self.plan.inputs}

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        codecs = self.codecs
        deliveries = [
            Delivery(row.key, row.stream, Record(row.rkey, codecs[row.stream].decode(row.value), row.ts, row.id))
            for row in rows
            if row.key is not None  # heartbeat and tick rows only wake the shard
        ]
        return self._step(key[0], deliveries, timerValues)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        # Spark has already removed the expired timer: forget it so _step re-arms if needed.
        self.armed.clear()
        return self._step(key[0], [], timerValues)

    def _step(self, shard: int, deliveries: list[Delivery], timer_values: Any) -> Iterator[Any]:
        low_watermark = timer_values.getCurrentWatermarkInMs()
        batch_time = timer_values.getCurrentProcessingTimeInMs()
        wall_time = batch_time if batch_time > 0 else int(time.time() * 1000)
        result = self.executor.step(deliveries, low_watermark, wall_time)
        self._arm(result)
        for p in result.productions:
            yield Row(stream=p.stream, key=p.key, value=p.value, ts=p.timestamp, id=p.id, shard=None, wm=None,
                      next_lw=None, next_wall=None, records=None, duplicates=None, late=None, timers=None,
                      productions=None)
        m = result.metrics
        yield Row(stream=None, key=None, value=None, ts=None, id=None, shard=shard, wm=low_watermark,
                  next_lw=result.next_lw_timer, next_wall=result.next_wall_timer, records=m.records,
                  duplicates=m.duplicates, late=m.late, timers=m.timers_fired, productions=m.productions)

    def _arm(self, result: StepResult) -> None:
        current = self.armed.get()
        armed = current[0] if current else None
        wanted = result.next_lw_timer
        if armed == wanted:
            return
        if armed is not None:
            self.handle.deleteTimer(armed)
        if wanted is None:
            self.armed.clear()
        else:
            self.handle.registerTimer(wanted)
            self.armed.update((wanted,))

    def close(self) -> None:
        pass
