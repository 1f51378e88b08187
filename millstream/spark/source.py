"""The Spark source of one computation: all of its senders, and the input points of each batch.

Spark's own watermark is max(event time) - delay over the rows of earlier batches: one global number,
driven by data, applied one batch late. MillWheel's is min(senders' low watermarks), published by the
senders. So millstream does not use Spark's watermark. When Spark asks for the latest offset, the
source plans the next batch: sender by sender (in name order) it takes what each published since the
last batch (an injector partition's new range, a producer's new log entries) and turns every advance
into an *input point* with the coalesced watermark before and after it (core/watermarks.py). The plan
(points and the wall clock the batch will see) is part of the end offset, which Spark logs before it
runs the batch, so a replay runs exactly the same points at the same wall time.

Reading is partitioned: one Spark task per injector partition range and per file of an upstream
log. One of them (or a task of its own when no partition has records) also sends an empty row to
every key group, the heartbeat, so each group steps every batch and runs its due timers. Rows
carry records bundled per key group (bundles.py); a producer's records keep their input point and
their position in its output, so the operator delivers them in input order whatever order Spark's
shuffle delivered the rows in.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from millstream.core.deadletters import dead_letter
from millstream.core.executor import ComputationFailed, key_or_dead_letter
from millstream.core.garbage import bulk_work
from millstream.core.plan import ComputationPlan, InputPlan, SenderPlan, key_group
from millstream.core.production import Produced
from millstream.core.watermarks import Segment, WatermarkCoalescer, published_keyed, skew_watermark, too_far_ahead
from millstream.model.codecs import CodecError
from millstream.model.injector import Injector, InjectorError, Malformed, check_injected, refused_value
from millstream.model.pipeline import UNHELD_WATERMARK_KEY, ErrorPolicy
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record
from millstream.spark.bundles import BUNDLE_RECORDS, FeedItem, pack_deliveries, pack_productions
from millstream.spark.errors import report_failure
from millstream.spark.pacing import BatchPacing, LastBatch
from millstream.spark.partitioning import GroupLabels
from millstream.spark.publog import BATCH, PublicationLog
from millstream.spark.rootfiles import latest_status
from millstream.spark.storage import Storage
from millstream.spark.worker_garbage import WORKER_GARBAGE

try:  # Spark's DataSource API; only needed where Spark runs
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore

SOURCE_FORMAT = "millstream_inputs"
# One row per bundle of a key group's deliveries; `plan` is the batch's BatchPlan, the same in every
# row (a key group learns the batch's input points from any of its rows).
SOURCE_SCHEMA = "key_group int, bundle binary, rejected binary, plan binary"
ARROW_SCHEMA = pa.schema([
    ("key_group", pa.int32()), ("bundle", pa.binary()), ("rejected", pa.binary()), ("plan", pa.binary()),
])
LOG_SCHEMA = pa.schema([
    ("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string()),
    ("segment", pa.int32()), ("order_key", pa.uint64()), ("order_seq", pa.uint32()),
])
_BUNDLES_PER_ARROW_BATCH = 16


@dataclass(frozen=True)
class Sender:
    """One sender as the source reads it: the plan's sender, and the injector for injector partitions."""

    plan: SenderPlan
    injector: Injector | None
    owns_malformed: bool  # this computation turns the injector's malformed input into dead letters
    on_malformed: ErrorPolicy = ErrorPolicy.DEAD_LETTER
    idle_after_ms: int | None = None  # an injector partition quiet this long declares itself idle
    max_skew_ms: int | None = None  # the skew limit (core/watermarks.py: too_far_ahead)
    downstream: tuple[str, ...] = ()  # computations downstream of the injector, for the skew limit


@dataclass(frozen=True)
class SourcePlan:
    computation: ComputationPlan
    root: str
    senders: tuple[Sender, ...]
    wake_file: str  # where the computation's next wall-time timer is noted (wall ticks)
    labels: GroupLabels  # each key group's value in the grouping column (partitioning.py)
    # The records a batch reads from injectors at most (split evenly over their partitions): a fixed
    # cap, or batch pacing's (pacing.py), which follows the speed of the batches before.
    batch_cap: int | BatchPacing = field(default_factory=BatchPacing)
    max_log_entries: int = 64  # a producer's publications (its batch entries; claims never count) per batch
    max_points: int = 512
    # Where senders start (a computation added to a running pipeline "from now"): log position or
    # injector offset by sender name; absent senders start at the beginning.
    start_positions: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchPlan:
    """What every key group needs to know about a batch: its input points and wall clock."""

    segments: tuple[Segment, ...]
    wall_time: int

    def dumps(self) -> bytes:
        return orjson.dumps([[list(s) for s in self.segments], self.wall_time])

    @classmethod
    def loads(cls, blob: bytes) -> "BatchPlan":
        segments, wall = orjson.loads(blob)
        return cls(tuple(Segment(low, high, tuple((stream, before, after) for stream, before, after in inputs), idle,
                                 tuple((key, before, after) for key, before, after in keyed))
                         for low, high, inputs, idle, keyed in segments), wall)

    @classmethod
    def of_offset(cls, end: dict[str, Any]) -> "BatchPlan":
        return cls(tuple(batch_segments(end)), end["wall"])


def batch_segments(end: dict[str, Any]) -> list[Segment]:
    """The input points of the batch ending at `end`. A batch with none (Spark's very first, before
    anything arrived) is a heartbeat where the watermark stands."""
    points = [Segment(p["low"], p["high"], tuple(tuple(i) for i in p["inputs"]), p["idle"],
                      tuple(tuple(k) for k in p.get("keyed", ()))) for p in end["points"]]
    if points:
        return points
    inputs = tuple((stream, mark, mark) for stream, mark in sorted(end.get("inputs", {}).items()))
    keyed = tuple((key, mark, mark) for key, mark in sorted(end.get("keyed", {}).items()))
    return [Segment(end["watermark"], end["watermark"], inputs, len(end.get("idle", [])) == len(end["senders"]),
                    keyed)]


def _point(point: Segment, sender: str | None, **where: Any) -> dict[str, Any]:
    return {"sender": sender, "low": point.low_watermark, "high": point.advanced_to,
            "inputs": [list(i) for i in point.inputs], "idle": point.idle,
            "keyed": [list(k) for k in point.keyed], **where}


def _injector_keyed(sender: Sender, offset: Any, known: dict[str, int], watermark: int) -> dict[str, int]:
    """An injector partition's keyed watermarks at `offset` (where its low watermark is `watermark`),
    never below what it published before."""
    published = sender.injector.keyed_watermarks(sender.plan.partition, offset)  # type: ignore[union-attr,arg-type]
    return published_keyed(sender.plan.watermark_keys, published, known, watermark)


def _restore_coalescer(plan: SourcePlan, start: dict[str, Any]) -> WatermarkCoalescer:
    """The computation's coalescer as the offset `start` describes it."""
    keyed_senders = plan.computation.keyed_senders()
    keyed_marks = {key: {name: start["senders"][name].get("keyed", {}).get(key, BEGINNING_OF_TIME) for name in carriers}
                   for key, carriers in keyed_senders.items()}
    return WatermarkCoalescer.restore({n: s["watermark"] for n, s in start["senders"].items()},
                                      start["watermark"], start.get("idle", []),
                                      plan.computation.sender_groups(), start.get("inputs"),
                                      keyed_senders, keyed_marks, start.get("keyed", {}))


class _Partition(InputPartition):
    """One read task: an injector partition's range ("injector"), a file of an upstream log ("log"),
    or nothing but the heartbeat ("heartbeat"). `heartbeat`: the task also sends every key group an
    empty row."""

    def __init__(self, kind: str, sender: str | None, plan: bytes, **fields: Any) -> None:
        self.kind, self.sender, self.plan, self.fields = kind, sender, plan, fields
        self.heartbeat = kind == "heartbeat"


def initial_offset(plan: SourcePlan) -> dict[str, Any]:
    senders: dict[str, Any] = {}
    for sender in plan.senders:
        if sender.injector is not None:
            partition = sender.plan.partition
            offset = plan.start_positions.get(sender.plan.name) or sender.injector.initial_offset(partition)  # type: ignore[arg-type]
            watermark = sender.injector.low_watermark(partition, offset)  # type: ignore[arg-type]
            senders[sender.plan.name] = {"offset": offset, "watermark": watermark, "started_at": watermark,
                                         "active_ms": int(time.time() * 1000),
                                         "keyed": _injector_keyed(sender, offset, {}, watermark)}
        else:
            senders[sender.plan.name] = {"position": plan.start_positions.get(sender.plan.name, -1),
                                         "watermark": BEGINNING_OF_TIME, "keyed": {}}
    coalescer = plan.computation.coalescer()
    for name, item in senders.items():
        coalescer.advance(name, item["watermark"], keyed=item["keyed"])
    return {"senders": senders, "watermark": coalescer.coalesced, "wall": 0, "tick": 0, "points": [],
            "inputs": coalescer.group_marks(), "idle": [], "keyed": coalescer.keyed_watermarks()}


def plan_next_batch(plan: SourcePlan, start: dict[str, Any], wall_timer_due: bool,
                    now_ms: int | None = None, last: LastBatch | None = None) -> dict[str, Any]:
    """The end offset of the next batch (`start` itself when there is nothing to do). `last`: what
    the stager measured of the batch before (batch pacing)."""
    coalescer = _restore_coalescer(plan, start)
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    senders = dict(start["senders"])
    points: list[dict[str, Any]] = []
    injector_partitions = sum(1 for s in plan.senders if s.injector is not None) or 1
    batch_cap = plan.batch_cap
    records_cap = batch_cap if isinstance(batch_cap, int) else batch_cap.next_cap(start.get("cap"), last)
    cap = max(1, records_cap // injector_partitions)
    published: dict[str, int | None] = {}  # downstream computations' unheld watermarks (skew_watermark), read once

    def downstream_watermarks(names: tuple[str, ...]) -> list[int | None]:
        for name in names:
            if name not in published:
                status = Storage(plan.root).read_json(latest_status(name)) or {}
                published[name] = skew_watermark(status.get("low_watermark", BEGINNING_OF_TIME),
                                                 status.get("keyed_watermarks", {}), published=bool(status))
        return [published[n] for n in names]

    for sender in sorted(plan.senders, key=lambda s: s.plan.name):
        name = sender.plan.name
        item = senders[name]
        if sender.injector is not None:
            partition = sender.plan.partition
            if sender.max_skew_ms is not None and too_far_ahead(item["watermark"], downstream_watermarks(
                    sender.downstream), sender.max_skew_ms, item.get("started_at", BEGINNING_OF_TIME)):
                continue  # the skew limit: wait for the stages behind to catch up
            end = sender.injector.latest_offset(partition, item["offset"], cap)  # type: ignore[arg-type]
            watermark = max(item["watermark"], sender.injector.low_watermark(partition, end))  # type: ignore[arg-type]
            stored = item.get("keyed")
            known = dict(stored or {})
            if UNHELD_WATERMARK_KEY in sender.plan.watermark_keys and UNHELD_WATERMARK_KEY not in known:
                known[UNHELD_WATERMARK_KEY] = item["watermark"]  # an offset written before the key: not a move
            keyed = _injector_keyed(sender, end, known, watermark)
            if end == item["offset"] and watermark == item["watermark"] and (stored is None or keyed == known):
                active = item.get("active_ms", now)
                if sender.idle_after_ms is not None and not coalescer.is_idle(name) and \
                        now - active >= sender.idle_after_ms:
                    points.append(_point(coalescer.advance(name, watermark, idle=True), name))
                    senders[name] = {**item, "active_ms": active}
                continue
            points.append(_point(coalescer.advance(name, watermark, keyed=keyed), name, start=item["offset"], end=end))
            senders[name] = {**item, "offset": end, "watermark": watermark, "active_ms": now, "keyed": keyed}
            continue
        log = PublicationLog(plan.root, sender.plan.producer)
        position = item["position"]
        batches = 0  # claims carry no records: they never count, or a run of them would stall the reader
        for entry_position, entry in log.entries_from(position):
            if entry["type"] == BATCH:
                if len(points) + len(entry["output"]) > plan.max_points and points:
                    break  # whole entries only; the rest goes to the next batch
                idle = entry.get("idle") or [False] * len(entry["output"])
                keyed_output = entry.get("keyed") or [{}] * len(entry["output"])
                for index, watermark in enumerate(entry["output"]):
                    segment = coalescer.advance(name, max(watermark, coalescer.input_watermark(name)), idle[index],
                                                keyed_output[index])
                    points.append(_point(segment, name, position=entry_position, segment=index))
                batches += 1
            position = entry_position
            if batches >= max(1, plan.max_log_entries):
                break  # before reading the next entry (a request each, on object stores)
        if position != item["position"]:
            senders[name] = {"position": position, "watermark": coalescer.input_watermark(name),
                             "keyed": coalescer.sender_keyed(name)}
    tick = start["tick"] + 1 if wall_timer_due else start["tick"]
    if not points and tick == start["tick"]:
        return start  # nothing to deliver (log entries that were only claims are read again later)
    if not points:  # a wall tick alone: one point where the watermark stands
        points.append(_point(coalescer.hold(), None))
    return {"senders": senders, "watermark": coalescer.coalesced, "wall": max(now, start["wall"]), "tick": tick,
            "points": points, "inputs": coalescer.group_marks(), "idle": coalescer.idle(),
            "keyed": coalescer.keyed_watermarks(), "cap": records_cap}


class InputsReader(DataSourceStreamReader):
    def __init__(self, plan: SourcePlan) -> None:
        self.plan = plan
        self.senders = {s.plan.name: s for s in plan.senders}

    # -- driver side ---------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return initial_offset(self.plan)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        start = start or self.initialOffset()
        wake = Storage(self.plan.root).read_json(self.plan.wake_file) or {}  # the stager's notes (commit.py)
        due = wake.get("next_wall_timer")
        return plan_next_batch(self.plan, start, due is not None and due <= time.time() * 1000,
                               last=LastBatch.from_json(wake.get("last_batch")))

    def partitions(self, start: dict, end: dict) -> Sequence[_Partition]:
        batch = BatchPlan.of_offset(end).dumps()
        parts: list[_Partition] = []
        by_entry: dict[tuple[str, int], dict[int, int]] = {}
        for index, point in enumerate(end["points"]):
            sender = point["sender"]
            if sender is None or ("start" not in point and "position" not in point):
                continue  # a heartbeat, or an injector partition declaring itself idle: no records
            if "start" in point:
                parts.append(_Partition("injector", sender, batch, start=point["start"], end=point["end"],
                                        segment=index))
            else:
                by_entry.setdefault((sender, point["position"]), {})[point["segment"]] = index
        for (sender, position), segments in by_entry.items():
            entry = PublicationLog(self.plan.root, self.senders[sender].plan.producer).read(position) or {}
            for path, rows in entry.get("streams", {}).get(self.senders[sender].plan.stream, []):
                if rows:
                    parts.append(_Partition("log", sender, batch, path=path, segments=segments))
        if not parts:
            return [_Partition("heartbeat", None, batch)]
        # The heartbeat rides at the end of a data partition's read: a task of its own would run
        # alone after the data tasks took every slot (docs/performance.md, "ninth session").
        parts[0].heartbeat = True
        return parts

    def commit(self, end: dict) -> None:
        pass

    # -- executor side -------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Partition), partition
        if partition.kind != "heartbeat":
            sender = self.senders[partition.sender]  # type: ignore[index]
            input_plan = self.plan.computation.input(sender.plan.stream)
            if partition.kind == "injector":
                feed = self._injector_items(sender, input_plan, partition)
            else:
                feed = self._log_items(sender, input_plan, partition)
            with bulk_work():  # the partition's deliveries pile up in bundles (core/garbage.py)
                yield from _bundled(self.plan.computation, self.plan.labels, feed, partition.plan,
                                    input_plan.stream, sender.plan.dedup)
        if partition.heartbeat:
            yield _batch([(label, None, None) for label in self.plan.labels.labels], partition.plan)
        WORKER_GARBAGE.settle()  # at every task's end (spark/worker_garbage.py)

    def _injector_items(self, sender: Sender, input_plan: InputPlan,
                        partition: _Partition) -> Iterator[FeedItem | Produced]:
        """_read_injector, a value its stream's codec refuses (from a user's code) reported."""
        try:
            yield from self._read_injector(sender, input_plan, partition)
        except CodecError as error:
            report_failure(self.plan.root, self.plan.computation.name, str(error))
            raise

    def _read_injector(self, sender: Sender, input_plan: InputPlan,
                       partition: _Partition) -> Iterator[FeedItem | Produced]:
        segment = partition.fields["segment"]
        encode = input_plan.codec.encode
        by_record_key = input_plan.keyed_by_record_key
        injector, name = sender.injector, sender.plan.partition
        for position, item in enumerate(injector.read(name, partition.fields["start"], partition.fields["end"])):  # type: ignore[union-attr, arg-type]
            if isinstance(item, Malformed):
                if sender.owns_malformed:
                    yield self._malformed(sender, item, segment)
                continue
            if type(item) is not Record or type(item.key) is not str or type(item.timestamp) is not int or \
                    not BEGINNING_OF_TIME <= item.timestamp <= END_OF_TIME:
                self._check_injected(sender, item)
            key = item.key
            try:
                value = encode(item.value)
            except CodecError as error:
                refused = refused_value(injector, item, error,  # type: ignore[arg-type]
                                        sender.plan.producer, sender.plan.stream)
                if sender.owns_malformed:
                    yield self._malformed(sender, refused, segment)
                continue
            if by_record_key:  # _keyed(), inlined: the per-record path
                yield (key, key, value, item.timestamp, item.id, segment, position)
            else:
                yield self._keyed(input_plan, sender, key, value, item.timestamp, item.id, segment, position)

    def _log_items(self, sender: Sender, input_plan: InputPlan,
                   partition: _Partition) -> Iterator[FeedItem | Produced]:
        segments: dict[int, int] = partition.fields["segments"]
        table = pq.read_table(partition.fields["path"], filesystem=Storage(self.plan.root).fs, schema=LOG_SCHEMA)
        columns = table.to_pydict()
        for key, value, ts, rid, segment, order_key, order_seq in zip(
                columns["key"], columns["value"], columns["timestamp"], columns["id"], columns["segment"],
                columns["order_key"], columns["order_seq"]):
            yield self._keyed(input_plan, sender, key, value, ts, rid, segments[segment], order_key << 32 | order_seq)

    def _keyed(self, input_plan: InputPlan, sender: Sender, rkey: str, value: bytes, ts: int, rid: str,
               segment: int, order: int) -> FeedItem | Produced:
        key = rkey
        if not input_plan.keyed_by_record_key:
            record = Record.encoded(rkey, value, input_plan.codec, ts, rid)
            try:
                found = key_or_dead_letter(self.plan.computation, input_plan, record, sender.plan.producer, segment)
            except ComputationFailed as failure:
                report_failure(self.plan.root, self.plan.computation.name, str(failure))
                raise
            if isinstance(found, Produced):
                return found
            key = found
        return (key, rkey, value, ts, rid, segment, order)

    def _check_injected(self, sender: Sender, item: Any) -> None:
        """check_injected, its refusal reported to the driver (the worker's error is not what the user sees)."""
        try:
            check_injected(item, sender.plan.producer)
        except InjectorError as error:
            report_failure(self.plan.root, self.plan.computation.name, str(error))
            raise

    def _malformed(self, sender: Sender, item: Malformed, segment: int) -> Produced:
        plan = self.plan.computation
        if sender.on_malformed is ErrorPolicy.FAIL:
            message = (f"injector {sender.plan.producer!r} (partition {sender.plan.partition!r}) read malformed "
                       f"input at {item.position}: {item.error}")
            report_failure(self.plan.root, plan.name, message)
            raise ValueError(message)
        return dead_letter(plan.name, key=None, stream=sender.plan.stream, sender=sender.plan.producer,
                           record_id=item.position, timestamp=BEGINNING_OF_TIME, value=item.raw,
                           error=item.error, segment=segment)


def _bundled(plan: ComputationPlan, labels: GroupLabels, feed: Iterable[FeedItem | Produced],
             batch: bytes, stream: str, dedup: bool) -> Iterator[pa.RecordBatch]:
    """The feed's records of `stream` bundled per key group (each row under its group's label), dead
    letters alongside."""
    pending: dict[int, list[FeedItem]] = {}  # by label
    rows: list[tuple[int, bytes | None, bytes | None]] = []
    rejected: list[Produced] = []
    label_of: dict[str, int] = {}  # keys repeat: hash each once per partition
    groups, label = plan.key_groups, labels.label
    for item in feed:
        if isinstance(item, Produced):
            rejected.append(item)
            continue
        key = item[0]
        target = label_of.get(key)
        if target is None:
            target = label_of[key] = label(key_group(key, groups))
        items = pending.get(target)
        if items is None:
            items = pending[target] = []
        items.append(item)
        if len(items) >= BUNDLE_RECORDS:
            rows.append((target, pack_deliveries(stream, dedup, items), None))
            del pending[target]
            if len(rows) >= _BUNDLES_PER_ARROW_BATCH:
                yield _batch(rows, batch)
                rows = []
    rows.extend((target, pack_deliveries(stream, dedup, items), None) for target, items in sorted(pending.items()))
    if rejected:
        rows.append((label(0), None, pack_productions(rejected)))
    if rows:
        yield _batch(rows, batch)


def _batch(rows: list[tuple[int, bytes | None, bytes | None]], plan: bytes) -> pa.RecordBatch:
    n = len(rows)
    return pa.RecordBatch.from_arrays([
        pa.array([group for group, _, _ in rows], type=pa.int32()),
        pa.array([bundle for _, bundle, _ in rows], type=pa.binary()),
        pa.array([rejected for _, _, rejected in rows], type=pa.binary()),
        pa.array([plan] * n, type=pa.binary()),
    ], schema=ARROW_SCHEMA)


class InputsDataSource(DataSource):
    """The inputs of one computation; `source_for` makes a subclass per SourcePlan.

    The plan (injectors, the computation's plan, the root) is a class attribute of that subclass, so it
    travels inside the class Spark itself pickles when the source is registered, never as a data source
    option: options are printed in query plans and progress descriptions. The one option, `computation`,
    is plain text and only checks that the query reads the source it was built for."""

    plan: SourcePlan
    format_name: str = SOURCE_FORMAT

    @classmethod
    def name(cls) -> str:
        return cls.format_name

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> InputsReader:
        wanted = self.options.get("computation")
        if wanted != self.plan.computation.name:
            raise ValueError(f"source {self.format_name!r} reads for computation {self.plan.computation.name!r}, "
                             f"not {wanted!r}")
        return InputsReader(self.plan)


def source_format(computation: str) -> str:
    """The format name a computation's source is registered under (distinct per computation name)."""
    tag = re.sub(r"[^0-9A-Za-z_]", "_", computation)[:40]
    return f"{SOURCE_FORMAT}_{tag}_{zlib.crc32(computation.encode()):08x}"


def source_for(plan: SourcePlan) -> type[InputsDataSource]:
    """A DataSource class carrying `plan`, to register with `spark.dataSource.register` and read with
    `.format(cls.name()).option("computation", plan.computation.name)`."""
    name = source_format(plan.computation.name)
    return type(f"InputsDataSource_{name}", (InputsDataSource,), {"plan": plan, "format_name": name})
