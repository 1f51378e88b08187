"""The hand-written PySpark version of the Windower job: what a user would write without millstream.

Row-based transformWithState grouped by the user key (one grouping key per user key), a MapState
bucket -> count per key and one Spark event-time timer per (key, bucket) at the bucket's end. Rows of a
key are aggregated per bucket before touching state (one get + one update per (key, bucket) per
batch, a timer registered only for a new bucket), which is the natural way to write it.

The source wraps the very same partitioned injector the millstream run reads (one task per
partition), with the same admission limit per partition (so the same micro-batches), and stamps rows
with the injector's low watermark (the minimum over its partitions, as millstream's): `lw` = watermark
+ 1 ms, withWatermark("lw", "1 millisecond"). It does less work than millstream's source (no key-group
routing, no value encoding, no bundles): that difference is charged to millstream. Output goes to
Spark's parquet file sink (executors write, exactly-once through the sink's metadata log).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from typing import Any, Iterator

import pyarrow as pa

from millstream.model.records import END_OF_TIME

try:
    from pyspark.sql import Row
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = StatefulProcessor = object  # type: ignore

FORMAT = "bench_generator"
SCHEMA = "key string, ts long, lw timestamp"
ARROW = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("lw", pa.timestamp("us", tz="UTC"))])
OUTPUT = "key string, bucket long, count long"


def _stamp(watermark: int) -> int:
    return (max(min(watermark, END_OF_TIME), 0) + 1) * 1000


class _Part(InputPartition):
    def __init__(self, partition: str, start: dict, end: dict, stamp: int) -> None:
        self.partition, self.start, self.end, self.stamp = partition, start, end, stamp


def _batch(keys: list[str], tss: list[int], stamp: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.string()), pa.array(tss, pa.int64()),
         pa.array([stamp] * len(keys), ARROW.field("lw").type)], schema=ARROW)


class _Reader(DataSourceStreamReader):
    """Offsets {"parts": {partition: injector offset}}; one task per partition with new records.
    Admission as millstream's source: each partition reads at most max_records / partitions."""

    def __init__(self, injector: Any, max_records: int) -> None:
        self.injector, self.max_records = injector, max_records
        self.names = list(injector.partitions())

    def initialOffset(self) -> dict:  # noqa: N802
        return {"parts": {p: self.injector.initial_offset(p) for p in self.names}}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:  # noqa: N802
        start = start or self.initialOffset()
        cap = max(1, self.max_records // len(self.names))
        return {"parts": {p: self.injector.latest_offset(p, start["parts"][p], cap) for p in self.names}}

    def partitions(self, start: dict, end: dict) -> list[_Part]:
        # The injector's watermark once the batch is read: the minimum over its partitions.
        stamp = _stamp(min(self.injector.low_watermark(p, end["parts"][p]) for p in self.names))
        parts = [_Part(p, start["parts"][p], end["parts"][p], stamp) for p in self.names
                 if end["parts"][p] != start["parts"][p]]
        return parts or [_Part(self.names[0], end["parts"][self.names[0]], end["parts"][self.names[0]], stamp)]

    def read(self, part: _Part) -> Iterator[pa.RecordBatch]:
        keys: list[str] = []
        tss: list[int] = []
        for record in self.injector.read(part.partition, part.start, part.end):
            keys.append(record.key)
            tss.append(record.timestamp)
            if len(keys) >= 8192:
                yield _batch(keys, tss, part.stamp)
                keys, tss = [], []
        if keys:
            yield _batch(keys, tss, part.stamp)

    def commit(self, end: dict) -> None:
        pass


class GeneratorSource(DataSource):
    """Option `injector`: base64 cloudpickle of (injector, max_records_per_batch)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> _Reader:  # noqa: N802
        injector, max_records = pickle.loads(base64.b64decode(self.options["injector"]))
        return _Reader(injector, max_records)


def encode_injector(injector: Any, max_records: int) -> str:
    from pyspark import cloudpickle

    return base64.b64encode(cloudpickle.dumps((injector, max_records))).decode()


class HandWindower(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.handle = handle
        self.counts = handle.getMapState("counts", "bucket long", "count long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802
        pending: dict[int, int] = {}
        for row in rows:
            bucket = row.ts // 1000 * 1000
            pending[bucket] = pending.get(bucket, 0) + 1
        for bucket, n in pending.items():
            current = self.counts.getValue((bucket,))
            if current is None:
                self.handle.registerTimer(bucket + 1000)
                self.counts.updateValue((bucket,), (n,))
            else:
                self.counts.updateValue((bucket,), (current[0] + n,))
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:  # noqa: N802
        bucket = expiredTimerInfo.getExpiryTimeInMs() - 1000
        current = self.counts.getValue((bucket,))
        self.counts.removeKey((bucket,))
        yield Row(key=key[0], bucket=bucket, count=current[0] if current else 0)

    def close(self) -> None:
        pass


def start_baseline(spark: Any, injector: Any, max_records: int, root: str, trigger_ms: int,
                   name: str = "baseline") -> Any:
    """The hand-written job, writing its windows with Spark's own parquet file sink (written by the
    executors, exactly-once through the sink's metadata log), as a user would."""
    spark.dataSource.register(GeneratorSource)
    rows = (
        spark.readStream.format(FORMAT).option("injector", encode_injector(injector, max_records)).load()
        .withWatermark("lw", "1 millisecond")
        .groupBy("key")
        .transformWithState(HandWindower(), OUTPUT, "Append", "EventTime")
    )
    return (
        rows.writeStream.queryName(name).format("parquet").outputMode("append")
        .option("path", os.path.join(root, "out"))
        .option("checkpointLocation", os.path.join(root, "checkpoint"))
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )


def committed_files(root: str) -> dict[int, list[str]]:
    """Batch -> files the file sink committed (its metadata log; compacted entries hold the earlier
    batches' files too, so a file is attributed to the batch it first appears in)."""
    directory = os.path.join(root, "out", "_spark_metadata")
    by_batch: dict[int, list[str]] = {}
    seen: set[str] = set()
    if not os.path.isdir(directory):
        return by_batch
    names = [n for n in os.listdir(directory) if n.split(".")[0].isdigit()]
    for name in sorted(names, key=lambda n: int(n.split(".")[0])):
        with open(os.path.join(directory, name)) as f:
            lines = f.read().splitlines()[1:]
        for line in lines:
            entry = json.loads(line)
            path = entry["path"]
            if entry.get("action", "add") == "add" and path not in seen:
                seen.add(path)
                by_batch.setdefault(int(name.split(".")[0]), []).append(path)
    return by_batch


def _local(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path)


class OutputCounter:
    """Rows the file sink has committed so far (from the parquet footers of new files)."""

    def __init__(self, root: str) -> None:
        self.root, self.rows, self.counted = root, 0, set()

    def __call__(self) -> int:
        import pyarrow.parquet as pq

        for files in committed_files(self.root).values():
            for path in files:
                if path not in self.counted:
                    self.counted.add(path)
                    self.rows += pq.read_metadata(_local(path)).num_rows
        return self.rows


def last_output_commit(root: str) -> float | None:
    """When Spark committed the last batch that wrote output (mtime of its commits/N)."""
    batches = committed_files(root)
    if not batches:
        return None
    try:
        return os.stat(os.path.join(root, "checkpoint", "commits", str(max(batches)))).st_mtime
    except FileNotFoundError:
        return None


def read_output(root: str) -> list[tuple[str, int, int]]:
    import pyarrow.parquet as pq

    out = []
    for files in committed_files(root).values():
        for path in files:
            t = pq.read_table(_local(path))
            out.extend(zip(t["key"].to_pylist(), t["bucket"].to_pylist(), t["count"].to_pylist()))
    return out
