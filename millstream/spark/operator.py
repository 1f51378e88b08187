"""The transformWithState processors that run a computation's ShardExecutor inside Spark.

Spark groups rows by shard (MillWheel's key interval), not by user key: the Python stateful operator
pays a fixed cost per grouping key per batch and ~50-65 us per state call, so per-user-key grouping
would cost a state call per key and a Spark timer per user timer. Per shard we keep:

- MapState `pages`: page id -> blob of that page's keys (state, timers, seen ids); only pages touched
  in a step are read and rewritten, so a step's cost follows the keys it touches, not the shard size.
- ValueState `index`: each page's earliest timers (ShardIndex).

No Spark timers: the source's rows carry the batch's input low watermark before and after it, and a
batch that moves the watermark invokes every shard (source.py). The executor delivers the records
judged against the old watermark, then fires every user timer the new one made due, in the same batch.
All writes of a batch land in RocksDB together when Spark commits the batch, with the productions it
emitted: per-key atomicity, by construction.

Records come in and go out in bundles (bundles.py), a few rows per shard instead of one per record.
Each invocation emits its productions (kind 'records') and one report row (kind 'report') carrying the
shard's next pending timers and step metrics; the driver-side commit aggregates reports into the
output watermark.

Weak productions fuse a computation A into its consumer B's query as two chained operators. A's
productions leave A's operator already keyed and bundled per shard of B (kind 'records'), and every
invocation of an A shard also sends a 'hold' row to every B shard: A's earliest pending timer on that
shard and the batch's input watermark. B's operator keeps the table of holds and computes its own input
low watermark, min(input watermark, holds of A), so records A produces from timers are never late at B.
Any change of that watermark comes with hold rows, which invoke every B shard.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from millstream.core.executor import Delivery, ShardExecutor, StepResult
from millstream.core.plan import ComputationPlan, route
from millstream.core.watermarks import output_watermark
from millstream.model.records import BEGINNING_OF_TIME, Record
from millstream.spark.bundles import DeliveryItem, ProductionItem, chunks, unpack

try:
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
except ImportError:  # pragma: no cover
    StatefulProcessor = object  # type: ignore
    StatefulProcessorHandle = Any  # type: ignore

OUTPUT_SCHEMA = (
    "kind string, computation string, shard int, bundle binary, wm long, next_lw long, next_wall long, "
    "stamp long, source_shard int, records long, duplicates long, late long, timers long, productions long"
)
_EMPTY = dict.fromkeys(
    ("kind", "computation", "shard", "bundle", "wm", "next_lw", "next_wall", "stamp", "source_shard",
     "records", "duplicates", "late", "timers", "productions")
)


def output_row(**fields: Any) -> Any:
    return Row(**{**_EMPTY, **fields})


def report_row(computation: str, shard: int, low_watermark: int, result: StepResult) -> Any:
    m = result.metrics
    return output_row(kind="report", computation=computation, shard=shard, wm=low_watermark,
                      next_lw=result.next_lw_timer, next_wall=result.next_wall_timer, records=m.records,
                      duplicates=m.duplicates, late=m.late, timers=m.timers_fired, productions=m.productions)


def production_rows(result: StepResult) -> Iterator[Any]:
    """The step's productions for the committer, bundled."""
    items: list[ProductionItem] = [(p.stream, p.key, p.value, p.timestamp, p.id) for p in result.productions]
    for bundle in chunks(items):
        yield output_row(kind="records", bundle=bundle)


def deliveries_of(bundle: bytes | None, codecs: dict[str, Any]) -> list[Delivery]:
    return [Delivery(key, stream, Record(rkey, codecs[stream].decode(value), ts, rid))
            for key, rkey, stream, value, ts, rid in unpack(bundle)]


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


def _shard_executor(handle: StatefulProcessorHandle, plan: ComputationPlan) -> tuple[ShardExecutor, dict[str, Any]]:
    """The plan's executor over this grouping key's state, and the codec of each input stream."""
    store = _SparkShardStore(handle.getMapState("pages", "page int", "blob binary"),
                             handle.getValueState("index", "blob binary"))
    return ShardExecutor(plan, store), {i.stream: i.codec for i in plan.inputs}


class ShardProcessor(StatefulProcessor):
    """A computation on Spark, fed by the source. With `downstream`, its productions are handed to
    that computation's operator in the same query (weak productions)."""

    def __init__(self, plan: ComputationPlan, downstream: ComputationPlan | None = None) -> None:
        self.plan = plan
        self.downstream = downstream

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.executor, self.codecs = _shard_executor(handle, self.plan)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        deliveries: list[Delivery] = []
        before = after = None
        for row in rows:  # every row of a batch carries the same two watermarks
            before, after = row.before, row.stamp
            deliveries.extend(deliveries_of(row.bundle, self.codecs))  # heartbeats carry none
        shard = key[0]
        result = self.executor.step(deliveries, before, _wall_time(timerValues), after)
        if self.downstream is None:
            yield from production_rows(result)
        else:
            yield from self._hand_over(result, after, shard)
        yield report_row(self.plan.name, shard, after, result)

    def _hand_over(self, result: StepResult, stamp: int, source_shard: int) -> Iterator[Any]:
        """Productions keyed and sharded for the fused downstream computation, then this shard's hold."""
        downstream = self.downstream
        by_shard: dict[int, list[DeliveryItem]] = {}
        for p in result.productions:
            key = downstream.input(p.stream).key_of_encoded(p.key, p.value, p.timestamp, p.id, downstream.name)
            shard = route(key, downstream.shards, downstream.pages_per_shard)[0]
            by_shard.setdefault(shard, []).append((key, p.key, p.stream, p.value, p.timestamp, p.id))
        for shard, items in sorted(by_shard.items()):
            for bundle in chunks(items):
                yield output_row(kind="records", shard=shard, bundle=bundle)
        for shard in range(downstream.shards):
            yield output_row(kind="hold", computation=self.plan.name, shard=shard, next_lw=result.next_lw_timer,
                             stamp=stamp, source_shard=source_shard)

    def close(self) -> None:
        pass


class FusedConsumerProcessor(StatefulProcessor):
    """The consumer of a weak computation, fed by that computation's operator (timeMode None)."""

    def __init__(self, plan: ComputationPlan) -> None:
        self.plan = plan

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.executor, self.codecs = _shard_executor(handle, self.plan)
        # upstream shard -> its earliest pending timer; the input watermark; our low watermark
        self.holds = handle.getMapState("holds", "source_shard int", "next_lw long")
        self.marks = handle.getValueState("marks", "input long, low long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        deliveries: list[Delivery] = []
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
                deliveries.extend(deliveries_of(row.bundle, self.codecs))
        if not deliveries and not held:
            return
        for source_shard, next_lw in held.items():
            if next_lw is None:
                self.holds.removeKey((source_shard,))
            else:
                self.holds.updateValue((source_shard,), (next_lw,))
        pending = [value[0] for value in self.holds.values()]
        after = max(before, output_watermark(stamp, min(pending) if pending else None))
        result = self.executor.step(deliveries, before, _wall_time(timerValues), after)
        self.marks.update((stamp, after))
        yield from production_rows(result)
        yield report_row(self.plan.name, key[0], after, result)

    def close(self) -> None:
        pass
