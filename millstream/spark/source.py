"""The Spark source of one computation: all of its inputs, with MillWheel's low watermark.

Spark's own watermark is max(event time) - delay over the rows of earlier batches: one global number,
driven by data. MillWheel's is min(senders' low watermarks), published by the senders. We make Spark
carry ours: the source coalesces its senders' published watermarks (WatermarkCoalescer) at the end
offset of every batch and stamps every row of that batch with it (+1 ms) in the column `lw`; the query
declares `withWatermark("lw", "1 millisecond")`. Spark's watermark is then exactly the coalesced input
low watermark of the previous batch, so Spark's event-time timers fire on MillWheel's watermark, and
no row is ever dropped by Spark's late filter (each stamp is above the previous watermark). Lateness
by a record's own timestamp is judged by the semantic core and reported to user code instead.

A batch whose offsets moved always carries one heartbeat row, so a watermark advance with no data
still reaches Spark. While the computation has wall-time timers due, the source adds a tick: one row
per shard, which makes Spark invoke every shard so it can fire them.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa

from millstream.core.plan import ComputationPlan, InputPlan, route
from millstream.core.watermarks import WatermarkCoalescer
from millstream.model.injector import Injector
from millstream.model.pipeline import record_key
from millstream.model.records import BEGINNING_OF_TIME, Record
from millstream.spark.streamlog import StreamLog

try:  # Spark's DataSource API; only needed where Spark runs
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore

SOURCE_FORMAT = "millstream_inputs"
SOURCE_SCHEMA = (
    "shard int, key string, rkey string, stream string, value binary, ts long, id string, lw timestamp, stamp long"
)
ARROW_SCHEMA = pa.schema([
    ("shard", pa.int32()), ("key", pa.string()), ("rkey", pa.string()), ("stream", pa.string()),
    ("value", pa.binary()), ("ts", pa.int64()), ("id", pa.string()), ("lw", pa.timestamp("us", tz="UTC")),
    ("stamp", pa.int64()),  # the same watermark as `lw`, in ms, for operators that pass it on
])
_CHUNK = 8192


@dataclass(frozen=True)
class Sender:
    """One input of the computation: a (stream, producer) pair."""

    name: str
    stream: str
    producer: str
    injector: Injector | None  # None: a computation, read from its stream log


@dataclass(frozen=True)
class SourcePlan:
    computation: ComputationPlan
    root: str
    senders: tuple[Sender, ...]
    status_dirs: tuple[str, ...]  # of the query's computations: whose wall-time timers need ticks
    max_records_per_batch: int = 100_000
    max_log_batches: int = 64
    wall_tick_ms: int = 1000

    def encode(self) -> str:
        from pyspark import cloudpickle

        return base64.b64encode(cloudpickle.dumps(self)).decode()

    @staticmethod
    def decode(text: str) -> "SourcePlan":
        import pickle

        return pickle.loads(base64.b64decode(text))


def stamp_micros(watermark: int) -> int:
    """The `lw` column value for rows of a batch whose coalesced input watermark is `watermark`."""
    return (max(watermark, 0) + 1) * 1000


def stamp_millis(stamp: int) -> int:
    """The watermark a `lw` value stands for (inverse of stamp_micros)."""
    return stamp // 1000 - 1


class _Partition(InputPartition):
    def __init__(self, kind: str, sender: str | None, start: Any, end: Any, stamp: int, tick: bool) -> None:
        self.kind, self.sender, self.start, self.end, self.stamp, self.tick = kind, sender, start, end, stamp, tick


class InputsReader(DataSourceStreamReader):
    def __init__(self, plan: SourcePlan) -> None:
        self.plan = plan
        self.log = StreamLog(plan.root)
        self.senders = {s.name: s for s in plan.senders}

    # -- driver side ---------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        senders = {}
        for sender in self.plan.senders:
            if sender.injector is not None:
                offset = sender.injector.initial_offset()
                senders[sender.name] = {"offset": offset, "watermark": sender.injector.low_watermark(offset)}
            else:
                senders[sender.name] = {"batch": -1, "watermark": BEGINNING_OF_TIME}
        coalescer = WatermarkCoalescer(senders)
        for name, item in senders.items():
            coalescer.observe(name, item["watermark"])
        return {"senders": senders, "watermark": coalescer.coalesced, "tick": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        start = start or self.initialOffset()
        senders = {}
        coalescer = WatermarkCoalescer(start["senders"], coalesced=start["watermark"])
        for name, item in start["senders"].items():
            sender = self.senders[name]
            if sender.injector is not None:
                end = sender.injector.latest_offset(item["offset"], self.plan.max_records_per_batch)
                new = {"offset": end, "watermark": max(item["watermark"], sender.injector.low_watermark(end))}
            else:
                commits = self.log.commits_after(sender.stream, sender.producer, item["batch"],
                                                 self.plan.max_log_batches)
                new = {"batch": commits[-1].batch, "watermark": commits[-1].watermark} if commits else item
            senders[name] = new
            coalescer.observe(name, new["watermark"])
        tick = start["tick"] + 1 if self._wall_timer_due() else start["tick"]
        end = {"senders": senders, "watermark": coalescer.coalesced, "tick": tick}
        return end

    def _wall_timer_due(self) -> bool:
        now = time.time() * 1000
        for status_dir in self.plan.status_dirs:
            try:
                with open(os.path.join(status_dir, "latest.json"), "rb") as data:
                    due = json.loads(data.read()).get("next_wall_timer")
            except (FileNotFoundError, ValueError):
                continue
            if due is not None and due <= now:
                return True
        return False

    def partitions(self, start: dict, end: dict) -> Sequence[_Partition]:
        stamp = stamp_micros(end["watermark"])
        parts: list[_Partition] = []
        for name, item in end["senders"].items():
            before = start["senders"][name]
            if self.senders[name].injector is not None:
                if item["offset"] != before["offset"]:
                    parts.append(_Partition("injector", name, before["offset"], item["offset"], stamp, False))
            elif item["batch"] > before["batch"]:
                parts.append(_Partition("log", name, before["batch"] + 1, item["batch"], stamp, False))
        parts.append(_Partition("heartbeat", None, None, None, stamp, end["tick"] != start["tick"]))
        return parts

    def commit(self, end: dict) -> None:
        pass

    # -- executor side -------------------------------------------------------------------------
    def read(self, partition: _Partition) -> Iterator[pa.RecordBatch]:
        plan = self.plan.computation
        if partition.kind == "heartbeat":
            shards = range(plan.shards) if partition.tick else [0]
            yield _batch([(s, None, None, None, None, None, None) for s in shards], partition.stamp)
            return
        sender = self.senders[partition.sender]
        feed = self._injector_records(sender, partition) if sender.injector else self._log_records(sender, partition)
        yield from self._keyed_batches(plan, plan.input(sender.stream), feed, partition.stamp)

    def _injector_records(self, sender: Sender, partition: _Partition) -> Iterator[tuple[str, bytes, int, str, Any]]:
        codec = self.plan.computation.input(sender.stream).codec
        for record in sender.injector.read(partition.start, partition.end):  # type: ignore[union-attr]
            yield record.key, codec.encode(record.value), record.timestamp, record.id, record.value

    def _log_records(self, sender: Sender, partition: _Partition) -> Iterator[tuple[str, bytes, int, str, Any]]:
        for table in self.log.read_batches(sender.stream, sender.producer, partition.start, partition.end):
            columns = table.to_pydict()
            yield from zip(columns["key"], columns["value"], columns["timestamp"], columns["id"],
                           [None] * table.num_rows)

    def _keyed_batches(self, plan: ComputationPlan, input_plan: InputPlan,
                       feed: Iterator[tuple[str, bytes, int, str, Any]], stamp: int) -> Iterator[pa.RecordBatch]:
        by_record_key = input_plan.key_extractor is record_key
        rows = []
        shard_of: dict[str, int] = {}  # keys repeat: hash each once per partition
        for rkey, value, ts, rid, decoded in feed:
            if by_record_key:
                key = rkey
            else:
                if decoded is None:
                    decoded = input_plan.codec.decode(value)
                key = input_plan.key_of(Record(rkey, decoded, ts, rid), plan.name)
            shard = shard_of.get(key)
            if shard is None:
                shard = shard_of[key] = route(key, plan.shards, plan.pages_per_shard)[0]
            rows.append((shard, key, rkey, input_plan.stream, value, ts, rid))
            if len(rows) >= _CHUNK:
                yield _batch(rows, stamp)
                rows = []
        if rows:
            yield _batch(rows, stamp)


def _batch(rows: list[tuple], stamp: int) -> pa.RecordBatch:
    columns = list(zip(*rows))
    arrays = [pa.array(list(col), type=field.type) for col, field in zip(columns, ARROW_SCHEMA)]
    arrays.append(pa.array([stamp] * len(rows), type=ARROW_SCHEMA.field("lw").type))
    arrays.append(pa.array([stamp_millis(stamp)] * len(rows), type=pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


class InputsDataSource(DataSource):
    """Registered with Spark under SOURCE_FORMAT; option `plan` carries the encoded SourcePlan."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_FORMAT

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> InputsReader:
        return InputsReader(SourcePlan.decode(self.options["plan"]))
