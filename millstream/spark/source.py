"""The Spark source of one computation: all of its inputs, with MillWheel's low watermark.

Spark's own watermark is max(event time) - delay over the rows of earlier batches: one global number,
driven by data, applied one batch late. MillWheel's is min(senders' low watermarks), published by the
senders. So millstream does not use Spark's watermark: the source coalesces its senders' published
watermarks (WatermarkCoalescer) at the end offset of every batch and stamps every row with two
numbers: `before`, the coalesced input low watermark at the batch's start offset (what its records are
judged late against) and `stamp`, the one at its end offset (what its timers fire by). Both come from
the offsets Spark logs before running the batch, so a replayed batch sees the same ones.

Whenever the watermark moves, or the computation has wall-time timers due (a tick), the batch carries a
heartbeat row for every shard: each shard is invoked and fires its due timers in that same batch.
Records travel bundled per shard (bundles.py).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa

from millstream.core.plan import ComputationPlan, InputPlan, route
from millstream.core.watermarks import WatermarkCoalescer
from millstream.model.injector import Injector
from millstream.model.records import BEGINNING_OF_TIME
from millstream.spark.bundles import BUNDLE_RECORDS, DeliveryItem, pack
from millstream.spark.storage import Storage
from millstream.spark.streamlog import StreamLog

try:  # Spark's DataSource API; only needed where Spark runs
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore

SOURCE_FORMAT = "millstream_inputs"
# One row carries a bundle of the shard's deliveries (see bundles.py); heartbeat rows none.
SOURCE_SCHEMA = "shard int, bundle binary, before long, stamp long"
ARROW_SCHEMA = pa.schema([
    ("shard", pa.int32()), ("bundle", pa.binary()), ("before", pa.int64()), ("stamp", pa.int64()),
])
_BUNDLES_PER_ARROW_BATCH = 16


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
    status_dirs: tuple[str, ...]  # locations of the query's computations' status: wall-time timers due
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


@dataclass(frozen=True)
class Marks:
    """The coalesced input low watermark at a batch's start and end offsets."""

    before: int
    stamp: int


class _Partition(InputPartition):
    def __init__(self, kind: str, sender: str | None, start: Any, end: Any, marks: Marks) -> None:
        self.kind, self.sender, self.start, self.end, self.marks = kind, sender, start, end, marks


class InputsReader(DataSourceStreamReader):
    def __init__(self, plan: SourcePlan) -> None:
        self.plan = plan
        self.log = StreamLog(plan.root)
        self.statuses = [Storage(location) for location in plan.status_dirs]
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
        for status in self.statuses:
            due = (status.read_json("latest.json") or {}).get("next_wall_timer")
            if due is not None and due <= now:
                return True
        return False

    def partitions(self, start: dict, end: dict) -> Sequence[_Partition]:
        marks = Marks(start["watermark"], end["watermark"])
        parts: list[_Partition] = []
        for name, item in end["senders"].items():
            before = start["senders"][name]
            if self.senders[name].injector is not None:
                if item["offset"] != before["offset"]:
                    parts.append(_Partition("injector", name, before["offset"], item["offset"], marks))
            elif item["batch"] > before["batch"]:
                parts.append(_Partition("log", name, before["batch"] + 1, item["batch"], marks))
        if end["watermark"] != start["watermark"] or end["tick"] != start["tick"]:
            parts.append(_Partition("heartbeat", None, None, None, marks))
        return parts

    def commit(self, end: dict) -> None:
        pass

    # -- executor side -------------------------------------------------------------------------
    def read(self, partition: _Partition) -> Iterator[pa.RecordBatch]:
        plan = self.plan.computation
        if partition.kind == "heartbeat":
            yield _batch([(shard, None) for shard in range(plan.shards)], partition.marks)
            return
        sender = self.senders[partition.sender]
        input_plan = plan.input(sender.stream)
        feed = (self._injector_records if sender.injector else self._log_records)(sender, partition, input_plan)
        yield from self._keyed_batches(plan, input_plan, feed, partition.marks)

    def _injector_records(self, sender: Sender, partition: _Partition,
                          input_plan: InputPlan) -> Iterator[tuple[str, str, bytes, int, str]]:
        name = self.plan.computation.name
        for record in sender.injector.read(partition.start, partition.end):  # type: ignore[union-attr]
            value = input_plan.codec.encode(record.value)
            key = input_plan.key_of_encoded(record.key, value, record.timestamp, record.id, name, record.value)
            yield key, record.key, value, record.timestamp, record.id

    def _log_records(self, sender: Sender, partition: _Partition,
                     input_plan: InputPlan) -> Iterator[tuple[str, str, bytes, int, str]]:
        name = self.plan.computation.name
        for table in self.log.read_batches(sender.stream, sender.producer, partition.start, partition.end):
            columns = table.to_pydict()
            for rkey, value, ts, rid in zip(columns["key"], columns["value"], columns["timestamp"], columns["id"]):
                yield input_plan.key_of_encoded(rkey, value, ts, rid, name), rkey, value, ts, rid

    def _keyed_batches(self, plan: ComputationPlan, input_plan: InputPlan,
                       feed: Iterator[tuple[str, str, bytes, int, str]], marks: Marks) -> Iterator[pa.RecordBatch]:
        """The keyed deliveries of `feed`, bundled per shard."""
        stream = input_plan.stream
        pending: dict[int, list[DeliveryItem]] = {}
        bundles: list[tuple[int, bytes]] = []
        shard_of: dict[str, int] = {}  # keys repeat: hash each once per partition
        for key, rkey, value, ts, rid in feed:
            shard = shard_of.get(key)
            if shard is None:
                shard = shard_of[key] = route(key, plan.shards, plan.pages_per_shard)[0]
            items = pending.setdefault(shard, [])
            items.append((key, rkey, stream, value, ts, rid))
            if len(items) >= BUNDLE_RECORDS:
                bundles.append((shard, pack(items)))
                del pending[shard]
                if len(bundles) >= _BUNDLES_PER_ARROW_BATCH:
                    yield _batch(bundles, marks)
                    bundles = []
        bundles.extend((shard, pack(items)) for shard, items in sorted(pending.items()))
        if bundles:
            yield _batch(bundles, marks)


def _batch(bundles: list[tuple[int, bytes | None]], marks: Marks) -> pa.RecordBatch:
    n = len(bundles)
    return pa.RecordBatch.from_arrays([
        pa.array([shard for shard, _ in bundles], type=pa.int32()),
        pa.array([bundle for _, bundle in bundles], type=pa.binary()),
        pa.array([marks.before] * n, type=pa.int64()),
        pa.array([marks.stamp] * n, type=pa.int64()),
    ], schema=ARROW_SCHEMA)


class InputsDataSource(DataSource):
    """Registered with Spark under SOURCE_FORMAT; option `plan` carries the encoded SourcePlan."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_FORMAT

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> InputsReader:
        return InputsReader(SourcePlan.decode(self.options["plan"]))
