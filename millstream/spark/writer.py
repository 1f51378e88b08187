"""The executors write a batch's output: stream-log files and file-sink files, one per task.

Runs as `mapInArrow` over the stateful operator's output, in the same Spark tasks, so the records
never travel to the driver. Each task writes, under a directory unique to the batch attempt, one
Parquet file per output stream (the stream log, read by consumers) and one staged file per file sink,
and returns only their names, row counts and the key groups' counters. Nothing written here is
visible to anyone until the driver publishes it after Spark has committed the batch (commit.py); files
of attempts that are never committed are simply never published.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import from_arrow_schema

from millstream.core.garbage import bulk_work
from millstream.core.production import OUTPUT_ORDER, Produced
from millstream.model.codecs import Codec
from millstream.spark.bundles import unpack, unpack_production_columns
from millstream.spark.operator import METRICS
from millstream.spark.source import LOG_SCHEMA
from millstream.spark.storage import Storage
from millstream.spark.worker_garbage import WORKER_GARBAGE

_ARROW_SCHEMA = pa.schema([
    ("files", pa.list_(pa.struct([("stream", pa.string()), ("path", pa.string()), ("rows", pa.int64())]))),
    ("sink_files", pa.list_(pa.struct([("sink", pa.string()), ("path", pa.string()), ("rows", pa.int64())]))),
    ("reports", pa.list_(pa.struct([
        ("computation", pa.string()), ("key_group", pa.int32()), *[(m, pa.int64()) for m in METRICS],
        ("wake_wall", pa.int64()), ("bytes_written", pa.int64()), ("holds", pa.list_(pa.int64()))]))),
])
# The same schema for Spark, as a StructType: a DDL string would be parsed in the JVM on every batch's
# mapInArrow, a round trip on the driver's path between batches.
WRITER_SCHEMA = from_arrow_schema(_ARROW_SCHEMA)


@dataclass(frozen=True)
class FileSink:
    name: str
    stream: str
    path: str
    format: str  # "jsonl" or "parquet"
    codec: Codec


def staging_dir(computation: str, batch: int, attempt: str) -> str:
    return f"streams/{computation}/{batch:012d}/{attempt}"


def sink_staging_dir(sink: str, computation: str, batch: int, attempt: str) -> str:
    """Under the root, not in the user's sink directory: users see only delivered files there."""
    return f"sinks/{sink}/staging/{computation}-{batch:012d}-{attempt}"


class BatchWriter:
    """The mapInArrow function for one batch attempt (a fresh instance per attempt)."""

    def __init__(self, root: str, computation: str, batch: int, attempt: str, sinks: tuple[FileSink, ...]) -> None:
        self.root, self.computation, self.batch, self.attempt, self.sinks = root, computation, batch, attempt, sinks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with bulk_work():  # the whole batch's productions at once (core/garbage.py)
            written = self._write(batches)
        WORKER_GARBAGE.settle()  # at every task's end (spark/worker_garbage.py)
        yield written

    def _write(self, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = f"{context.partitionId():05d}-{context.taskAttemptId()}" if context else "00000-0"
        columns: list[list[Any]] = [[] for _ in Produced._fields]
        reports: list[dict[str, Any]] = []
        for record_batch in batches:
            for row in record_batch.to_pylist():
                bundle = row["productions"]
                if bundle:  # none on a key group's row that produced nothing
                    for column, part in zip(columns, unpack_production_columns(bundle), strict=True):
                        column.extend(part)
                reports.append(_report(row))
                reports.extend(unpack(row["upstream_reports"]))  # fused weak computations' counters
        by_stream = log_tables(columns)
        storage = Storage(self.root)
        files = []
        for stream, table in sorted(by_stream.items()):
            path = f"{staging_dir(self.computation, self.batch, self.attempt)}/{stream}-{task}.parquet"
            storage.write_parquet(path, table)
            files.append({"stream": stream, "path": storage.full_path(path), "rows": table.num_rows})
        sink_files = []
        for sink in self.sinks:
            table = by_stream.get(sink.stream)
            if table is None:
                continue
            path = f"{sink_staging_dir(sink.name, self.computation, self.batch, self.attempt)}/part-{task}.{sink.format}"
            storage.write(path, sink_file(table, sink.format, sink.codec))
            sink_files.append({"sink": sink.name, "path": path, "rows": table.num_rows})
        return pa.RecordBatch.from_pylist([{"files": files, "sink_files": sink_files, "reports": reports}],
                                          schema=_ARROW_SCHEMA)


# production.OUTPUT_ORDER over a log table's columns, where `order` is stored as (order_key, order_seq).
_LOG_ORDER = [(column, "ascending") for field in OUTPUT_ORDER
              for column in (("order_key", "order_seq") if field == "order" else (field,))]


def log_tables(columns: Sequence[Sequence[Any]]) -> dict[str, pa.Table]:
    """Each output stream's productions, given as columns in Produced's field order, as the table of
    its stream log, in the order its consumers take them: (segment, order), sorted in Arrow.

    >>> rows = [("s", "b", b"2", 5, "i2", 1, 1 << 32), ("t", "a", b"1", 4, "i1", 0, 7),
    ...         ("s", "a", b"0", 3, "i0", 1, 5), ("s", "c", b"3", 6, "i3", 0, 9)]
    >>> tables = log_tables(list(zip(*rows)))
    >>> sorted(tables), tables["s"].column("id").to_pylist(), tables["t"].column("order_seq").to_pylist()
    (['s', 't'], ['i3', 'i0', 'i2'], [7])
    """
    field = dict(zip(Produced._fields, columns, strict=True))
    orders = field["order"]
    table = pa.table({
        "key": field["key"],
        "value": field["value"],
        "timestamp": field["timestamp"],
        "id": field["id"],
        "segment": field["segment"],
        "order_key": [order >> 32 for order in orders],
        "order_seq": [order & 0xFFFFFFFF for order in orders],
    }, schema=LOG_SCHEMA)
    names = set(field["stream"])
    if len(names) <= 1:
        return {name: table.sort_by(_LOG_ORDER) for name in names}
    in_order = pc.sort_indices(table, sort_keys=_LOG_ORDER)  # a stable sort: ties keep their order
    table, streams = table.take(in_order), pa.array(field["stream"], pa.string()).take(in_order)
    return {name: table.filter(pc.equal(streams, name)) for name in names}


def _report(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"computation": row["computation"], "key_group": row["key_group"], "records": row["records"],
            "duplicates": row["duplicates"], "late": row["late"], "timers_fired": row["timers_fired"],
            "productions": row["productions_count"], "dead_letters": row["dead_letters"],
            "state_bytes": row["state_bytes"], "pending_timers": row["pending_timers"],
            "wake_wall": row["wake_wall"], "bytes_written": row["bytes_written"], "holds": row["holds"]}


def sink_file(table: pa.Table, fmt: str, codec: Codec) -> bytes:
    """A user-facing file of a stream log table's records, values decoded: JSON lines, or Parquet with
    dict values flattened (`parquet_table`)."""
    fields = ("key", "timestamp", "id", "value")
    rows = [{"key": key, "timestamp": timestamp, "id": record_id, "value": codec.decode(value)}
            for key, timestamp, record_id, value in zip(*(table.column(name).to_pylist() for name in fields))]
    if fmt == "jsonl":
        return "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode()
    out = io.BytesIO()
    pq.write_table(parquet_table(rows), out)
    return out.getvalue()


_RECORD_COLUMNS = ("key", "timestamp", "id")
VALUE_PREFIX = "value."


def value_column(field: Any) -> str:
    """The Parquet sink's column of a dict value's field: its own name, except that a field named
    like one of the record's columns (key, timestamp, id), or starting with "value.", is prefixed
    with "value.", and a field that is not a str (a pickled dict's 3 beside "3") is "value." and its
    repr, so no two fields share a column and none replaces the record's own.

    >>> [value_column(f) for f in ("n", "id", "value", "value.id", "3", 3, (1, "a"))]
    ['n', 'value.id', 'value', 'value.value.id', '3', 'value.3', "value.(1, 'a')"]
    """
    if type(field) is not str:
        return VALUE_PREFIX + repr(field)
    return VALUE_PREFIX + field if field in _RECORD_COLUMNS or field.startswith(VALUE_PREFIX) else field


def parquet_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """The Parquet sink's table of decoded records (key, timestamp, id, value): columns key, timestamp
    and id, then a dict value's fields in the order they first appear (`value_column`; a row without
    a field holds null there), a value that is not a dict in column "value". A column whose values do
    not make one Arrow type Parquet can hold (an int and a string, an int beyond 64 bits, an empty
    dict) holds the JSON text of each value instead (null stays null).

    >>> parquet_table([{"key": "a", "timestamp": 1, "id": "r1", "value": {"n": 1, "id": "x"}},
    ...                {"key": "b", "timestamp": 2, "id": "r2", "value": {"n": "two", "m": True}}]).to_pylist()
    [{'key': 'a', 'timestamp': 1, 'id': 'r1', 'n': '1', 'value.id': 'x', 'm': None}, \
{'key': 'b', 'timestamp': 2, 'id': 'r2', 'n': '"two"', 'value.id': None, 'm': True}]
    """
    columns: dict[str, list[Any]] = {name: [row[name] for row in rows] for name in _RECORD_COLUMNS}
    for number, row in enumerate(rows):
        value = row["value"]
        fields = {value_column(f): v for f, v in value.items()} if isinstance(value, dict) else {"value": value}
        for name, field_value in fields.items():
            column = columns.get(name)
            if column is None:
                column = columns[name] = [None] * len(rows)
            column[number] = field_value
    arrays = {"key": pa.array(columns.pop("key"), pa.string()),
              "timestamp": pa.array(columns.pop("timestamp"), pa.int64()),
              "id": pa.array(columns.pop("id"), pa.string())}
    for name, values in columns.items():
        try:
            array = pa.array(values)
            if _parquet_holds(array.type):
                arrays[name] = array
                continue
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass
        arrays[name] = pa.array([None if v is None else json.dumps(v, sort_keys=True, default=str)
                                for v in values], pa.string())
    return pa.table(arrays)


def _parquet_holds(kind: pa.DataType) -> bool:
    """Whether Parquet can hold a column of this inferred type (not a struct without fields, at any depth)."""
    if pa.types.is_struct(kind):
        return kind.num_fields > 0 and all(_parquet_holds(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _parquet_holds(kind.value_type)
    if pa.types.is_map(kind):
        return _parquet_holds(kind.key_type) and _parquet_holds(kind.item_type)
    return True
