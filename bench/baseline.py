"""The hand-written PySpark version of the Windower job: what a user would write without millstream.

Row-based transformWithState grouped by the user key (one grouping key per user key), a MapState
bucket -> count per key and one Spark event-time timer per (key, bucket) at the bucket's end. Rows of a
key are aggregated per bucket before touching state (one get + one update per (key, bucket) per
batch, a timer registered only for a new bucket), which is the natural way to write it.

The source wraps the very same GeneratorInjector the millstream run reads, with the same admission
limit (so the same micro-batches), and stamps rows with the injector's low watermark exactly like
millstream's source (`lw` = watermark + 1 ms, withWatermark("lw", "1 millisecond")). It does less work
than millstream's source (no shard routing, no value encoding): that difference is charged to
millstream.
"""

from __future__ import annotations

import base64
import os
import pickle
import time
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
    def __init__(self, start: dict, end: dict, stamp: int) -> None:
        self.start, self.end, self.stamp = start, end, stamp


def _batch(keys: list[str], tss: list[int], stamp: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.string()), pa.array(tss, pa.int64()),
         pa.array([stamp] * len(keys), ARROW.field("lw").type)], schema=ARROW)


class _Reader(DataSourceStreamReader):
    def __init__(self, injector: Any, max_records: int) -> None:
        self.injector, self.max_records = injector, max_records

    def initialOffset(self) -> dict:  # noqa: N802
        return self.injector.initial_offset()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:  # noqa: N802
        return self.injector.latest_offset(start or self.initialOffset(), self.max_records)

    def partitions(self, start: dict, end: dict) -> list[_Part]:
        return [_Part(start, end, _stamp(self.injector.low_watermark(end)))]

    def read(self, part: _Part) -> Iterator[pa.RecordBatch]:
        keys: list[str] = []
        tss: list[int] = []
        for record in self.injector.read(part.start, part.end):
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


class BaselineSink:
    """foreachBatch: one parquet file per non-empty batch, and the commit wall time per batch."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.commits: list[tuple[int, float]] = []
        self.rows = 0
        os.makedirs(directory, exist_ok=True)

    def __call__(self, frame: Any, batch_id: int) -> None:
        import pyarrow.parquet as pq

        table = frame.toArrow()
        if table.num_rows:
            pq.write_table(table, os.path.join(self.directory, f"{batch_id:012d}.parquet"))
        self.rows += table.num_rows
        self.commits.append((batch_id, time.time()))


def start_baseline(spark: Any, injector: Any, max_records: int, root: str, trigger_ms: int,
                   name: str = "baseline") -> tuple[Any, BaselineSink]:
    spark.dataSource.register(GeneratorSource)
    sink = BaselineSink(os.path.join(root, "out"))
    rows = (
        spark.readStream.format(FORMAT).option("injector", encode_injector(injector, max_records)).load()
        .withWatermark("lw", "1 millisecond")
        .groupBy("key")
        .transformWithState(HandWindower(), OUTPUT, "Update", "EventTime")
    )
    query = (
        rows.writeStream.queryName(name).foreachBatch(sink)
        .option("checkpointLocation", os.path.join(root, "checkpoint"))
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )
    return query, sink


def read_output(root: str) -> list[tuple[str, int, int]]:
    import pyarrow.parquet as pq

    directory = os.path.join(root, "out")
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".parquet"):
            t = pq.read_table(os.path.join(directory, name))
            out.extend(zip(t["key"].to_pylist(), t["bucket"].to_pylist(), t["count"].to_pylist()))
    return out
