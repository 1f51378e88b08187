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
from typing import Any, Iterator, Mapping

from operator import attrgetter

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import from_arrow_schema

from millstream.core.garbage import WORKER_GARBAGE, bulk_work
from millstream.core.production import Produced, output_order
from millstream.model.codecs import Codec
from millstream.spark.bundles import unpack, unpack_productions
from millstream.spark.operator import METRICS
from millstream.spark.source import LOG_SCHEMA
from millstream.spark.storage import Storage

_STREAM = attrgetter("stream")
_ARROW_SCHEMA = pa.schema([
    ("files", pa.list_(pa.struct([("stream", pa.string()), ("path", pa.string()), ("rows", pa.int64())]))),
    ("sink_files", pa.list_(pa.struct([("sink", pa.string()), ("path", pa.string()), ("rows", pa.int64())]))),
    ("reports", pa.list_(pa.struct([
        ("computation", pa.string()), ("key_group", pa.int32()), *[(m, pa.int64()) for m in METRICS],
        ("wake_wall", pa.int64()), ("bytes_written", pa.int64())]))),
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
        WORKER_GARBAGE.settle()  # the daemon's collection after the task then skips the worker's modules
        yield written

    def _write(self, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = f"{context.partitionId():05d}-{context.taskAttemptId()}" if context else "00000-0"
        produced: list[Produced] = []
        reports: list[dict[str, Any]] = []
        for record_batch in batches:
            for row in record_batch.to_pylist():
                produced.extend(unpack_productions(row["productions"]))
                reports.append(_report(row))
                reports.extend(unpack(row["upstream_reports"]))  # fused weak computations' counters
        by_stream = by_output_stream(produced)
        storage = Storage(self.root)
        files = []
        for stream, items in sorted(by_stream.items()):
            items.sort(key=output_order)
            path = f"{staging_dir(self.computation, self.batch, self.attempt)}/{stream}-{task}.parquet"
            storage.write_parquet(path, log_table(items))
            files.append({"stream": stream, "path": storage.full_path(path), "rows": len(items)})
        sink_files = []
        for sink in self.sinks:
            sink_items = by_stream.get(sink.stream)
            if not sink_items:
                continue
            path = f"{sink_staging_dir(sink.name, self.computation, self.batch, self.attempt)}/part-{task}.{sink.format}"
            storage.write(path, sink_file(sink_items, sink.format, sink.codec))
            sink_files.append({"sink": sink.name, "path": path, "rows": len(sink_items)})
        return pa.RecordBatch.from_pylist([{"files": files, "sink_files": sink_files, "reports": reports}],
                                          schema=_ARROW_SCHEMA)


def by_output_stream(produced: list[Produced]) -> dict[str, list[Produced]]:
    """Productions per stream (most computations have one output stream: then the list itself).

    >>> from operator import attrgetter

from millstream.core.garbage import bulk_work
from millstream.core.production import Produced, output_order
    >>> a, b = Produced("s", "k", b"", 0, "1", 0, 0), Produced("t", "k", b"", 0, "2", 0, 1)
    >>> by_output_stream([a, b]) == {"s": [a], "t": [b]}, by_output_stream([a])["s"] == [a]
    (True, True)
    """
    streams = set(map(_STREAM, produced))
    if len(streams) <= 1:
        return {stream: produced for stream in streams}
    by_stream: dict[str, list[Produced]] = {stream: [] for stream in streams}
    for item in produced:
        by_stream[item.stream].append(item)
    return by_stream


def _report(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"computation": row["computation"], "key_group": row["key_group"], "records": row["records"],
            "duplicates": row["duplicates"], "late": row["late"], "timers_fired": row["timers_fired"],
            "productions": row["productions_count"], "dead_letters": row["dead_letters"],
            "state_bytes": row["state_bytes"], "pending_timers": row["pending_timers"],
            "wake_wall": row["wake_wall"], "bytes_written": row["bytes_written"]}


def log_table(items: list[Produced]) -> pa.Table:
    # Columns by transposing the tuples in C, named by Produced's own fields.
    columns = dict(zip(Produced._fields, zip(*items))) if items else dict.fromkeys(Produced._fields, ())
    orders = columns["order"]
    return pa.table({
        "key": columns["key"],
        "value": columns["value"],
        "timestamp": columns["timestamp"],
        "id": columns["id"],
        "segment": columns["segment"],
        "order_key": [order >> 32 for order in orders],
        "order_seq": [order & 0xFFFFFFFF for order in orders],
    }, schema=LOG_SCHEMA)


def sink_file(items: list[Produced], fmt: str, codec: Codec) -> bytes:
    """A user-facing file of decoded records: JSON lines, or Parquet with dict values flattened."""
    rows = [{"key": p.key, "timestamp": p.timestamp, "id": p.id, "value": codec.decode(p.value)} for p in items]
    if fmt == "jsonl":
        return "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode()
    flat = [{"key": r["key"], "timestamp": r["timestamp"], "id": r["id"], **r["value"]}
            if isinstance(r["value"], dict) else r for r in rows]
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(flat), out)
    return out.getvalue()
