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

Each invocation emits its productions (kind 'record') and one report row (kind 'report') carrying the
shard's next pending timers and step metrics; the driver-side commit aggregates reports into the
output watermark.

Weak productions fuse a computation A into its consumer B's query as two chained operators. A's
productions leave A's operator already keyed and sharded for B (kind 'record'), and every invocation of
an A shard also sends a 'hold' row to every B shard: A's earliest pending timer on that shard and the
batch's input watermark. B's operator keeps the table of holds and computes its own input low
watermark, min(input watermark, holds of A), so records A produces from timers are never late at B.
B needs no Spark timers: any change of that watermark comes with hold rows, which invoke every B shard.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from millstream.core.executor import Delivery, ShardExecutor, StepResult
from millstream.core.plan import ComputationPlan, route
from millstream.core.watermarks import output_watermark
from millstream.model.records import BEGINNING_OF_TIME, Record

try:
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
except ImportError:  # pragma: no cover
    StatefulProcessor = object  # type: ignore
    StatefulProcessorHandle = Any  # type: ignore

OUTPUT_SCHEMA = (
    "kind string, computation string, shard int, key string, rkey string, stream string, value binary, "
    "ts long, id string, wm long, next_lw long, next_wall long, stamp long, source_shard int, "
    "records long, duplicates long, late long, timers long, productions long"
)
_EMPTY = dict.fromkeys(
    ("kind", "computation", "shard", "key", "rkey", "stream", "value", "ts", "id", "wm", "next_lw", "next_wall",
     "stamp", "source_shard", "records", "duplicates", "late", "timers", "productions")
)


def output_row(**fields: Any) -> Any:
    return Row(**{**_EMPTY, **fields})


def report_row(computation: str, shard: int, low_watermark: int, result: StepResult) -> Any:
    m = result.metrics
    return output_row(kind="report", computation=computation, shard=shard, wm=low_watermark,
                      next_lw=result.next_lw_timer, next_wall=result.next_wall_timer, records=m.records,
                      duplicates=m.duplicates, late=m.late, timers=m.timers_fired, productions=m.productions)


def _wall_time(timer_values: Any) -> int:
    batch_time = timer_values.getCurrentProcessingTimeInMs()
    return batch_time if batch_time > 0 else int(time.time() * 1000)


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
    """A computation on Spark, fed by the source (timeMode EventTime). With `downstream`, its
    productions are handed to that computation's operator in the same query (weak productions)."""

    def __init__(self, plan: ComputationPlan, downstream: ComputationPlan | None = None) -> None:
        self.plan = plan
        self.downstream = downstream

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
        deliveries = []
        stamp = timerValues.getCurrentWatermarkInMs()
        for row in rows:
            stamp = max(stamp, row.stamp)
            if row.key is not None:  # heartbeat and tick rows only wake the shard
                deliveries.append(
                    Delivery(row.key, row.stream, Record(row.rkey, codecs[row.stream].decode(row.value), row.ts, row.id))
                )
        return self._step(key[0], deliveries, timerValues, stamp)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        # Spark has already removed the expired timer: forget it so _step re-arms if needed.
        self.armed.clear()
        return self._step(key[0], [], timerValues, timerValues.getCurrentWatermarkInMs())

    def _step(self, shard: int, deliveries: list[Delivery], timer_values: Any, stamp: int) -> Iterator[Any]:
        low_watermark = timer_values.getCurrentWatermarkInMs()
        result = self.executor.step(deliveries, low_watermark, _wall_time(timer_values))
        self._arm(result)
        if self.downstream is None:
            for p in result.productions:
                yield output_row(kind="record", stream=p.stream, key=p.key, value=p.value, ts=p.timestamp, id=p.id)
        else:
            yield from self._hand_over(result, stamp, shard)
        yield report_row(self.plan.name, shard, low_watermark, result)

    def _hand_over(self, result: StepResult, stamp: int, source_shard: int) -> Iterator[Any]:
        """Productions keyed and sharded for the fused downstream computation, then this shard's hold."""
        downstream = self.downstream
        for p in result.productions:
            consumer_input = downstream.input(p.stream)
            record = Record(p.key, consumer_input.codec.decode(p.value), p.timestamp, p.id)
            key = consumer_input.key_of(record, downstream.name)
            shard = route(key, downstream.shards, downstream.pages_per_shard)[0]
            yield output_row(kind="record", shard=shard, key=key, rkey=p.key, stream=p.stream, value=p.value,
                             ts=p.timestamp, id=p.id)
        for shard in range(downstream.shards):
            yield output_row(kind="hold", computation=self.plan.name, shard=shard, next_lw=result.next_lw_timer,
                             stamp=stamp, source_shard=source_shard)

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


class FusedConsumerProcessor(StatefulProcessor):
    """The consumer of a weak computation, fed by that computation's operator (timeMode None)."""

    def __init__(self, plan: ComputationPlan) -> None:
        self.plan = plan

    def init(self, handle: StatefulProcessorHandle) -> None:
        store = _SparkShardStore(
            handle.getMapState("pages", "page int", "blob binary"),
            handle.getValueState("index", "blob binary"),
        )
        self.executor = ShardExecutor(self.plan, store)
        self.codecs = {i.stream: i.codec for i in self.plan.inputs}
        # upstream shard -> its earliest pending timer; the input watermark; our low watermark
        self.holds = handle.getMapState("holds", "source_shard int", "next_lw long")
        self.marks = handle.getValueState("marks", "input long, low long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        codecs = self.codecs
        deliveries = []
        held: dict[int, int | None] = {}
        marks = self.marks.get()
        stamp, before = (marks[0], marks[1]) if marks else (BEGINNING_OF_TIME, BEGINNING_OF_TIME)
        for row in rows:
            if row.kind == "report":
                yield row  # the upstream computation's report, for the committer
            elif row.kind == "hold":
                held[row.source_shard] = row.next_lw
                stamp = max(stamp, row.stamp)
            else:
                deliveries.append(
                    Delivery(row.key, row.stream, Record(row.rkey, codecs[row.stream].decode(row.value), row.ts, row.id))
                )
        if not deliveries and not held:
            return
        for source_shard, next_lw in held.items():
            if next_lw is None:
                self.holds.removeKey((source_shard,))
            else:
                self.holds.updateValue((source_shard,), (next_lw,))
        pending = [value[0] for value in self.holds.values()]
        after = max(before, output_watermark(stamp, min(pending) if pending else None))
        wall_time = _wall_time(timerValues)
        # Records are judged against the watermark they were sent under; timers that the new
        # watermark makes due fire right after them, in the same batch.
        result = self.executor.step(deliveries, before, wall_time)
        if after > before:
            later = self.executor.step([], after, wall_time)
            result.productions.extend(later.productions)
            result.metrics.add(later.metrics)
            result.next_lw_timer, result.next_wall_timer = later.next_lw_timer, later.next_wall_timer
        self.marks.update((stamp, after))
        for p in result.productions:
            yield output_row(kind="record", stream=p.stream, key=p.key, value=p.value, ts=p.timestamp, id=p.id)
        yield report_row(self.plan.name, key[0], after, result)

    def close(self) -> None:
        pass
