"""An injector over a Spark streaming DataFrame the user already has (files, tables, the rate source,
any Spark source), so anything Spark reads can feed a pipeline.

A Spark streaming DataFrame is not replayable on its own terms: re-running a micro-batch of a
non-deterministic source need not give the same rows, and an injector must (MillWheel section 6: a
record keeps its id and content across retries). So the runner *stages* the DataFrame first: one extra
streaming query per DataFrame injector, started and stopped with the pipeline, writes each of its
micro-batches under the root, and the pipeline reads the staged batches like any other partitioned,
replayable input.

Staging, per micro-batch `n` (one `foreachBatch` call, on the driver):

1. if `inputs/<name>/batches/<n>.json` (the batch's manifest) exists, the batch is staged already
   (Spark re-runs the last batch after a crash): nothing to do, so its content never changes;
2. the executors write the batch's rows as Parquet files under `inputs/<name>/data/<n>/<partition>/`,
   each row to partition `pmod(hash(key), partitions)` (Spark's own hash), and report what they wrote
   (a few numbers per task: the driver never carries the rows);
3. the driver creates the manifest (first writer wins): which files each partition has, its row count,
   and the largest event time staged so far over the whole input.

Reading (the Injector contract, on executors): partition `p` of batch `n` is the rows of the files its
manifest names, in name order; a record's id is `"<name>:<n>:<p>:<file>:<row>"`, or
`"<name>:<id column>"` with `id=` (then duplicates in the input itself are dropped too). An offset is
`{"batch": last staged batch read, "max_event_time": ..., "end": bool}`. A row whose key or timestamp is
null, or whose timestamp is outside [BEGINNING_OF_TIME, END_OF_TIME] (epoch microseconds in a long
column, say), is Malformed (a dead letter), never a failure, and does not move the watermark.

Low watermark (the policy, as for Kafka: the input promises nothing about event times to come, so the
user declares a bound): no row arrives more than `max_out_of_orderness_ms` behind the largest event time
staged before it, over the whole input. Every partition publishes that largest event time minus the
bound, BEGINNING_OF_TIME before any row; with `max_out_of_orderness_ms=None` it stays there. A row that
breaks the bound is delivered late. With `bounded=True` the DataFrame is read once to its end (Spark's
availableNow trigger) and, once all of it is staged, the watermark is END_OF_TIME: a pipeline over a
directory of files then finishes. Rows that arrive after that (a file added before the next run on the
root) are read by the next run, late, and the run warns: the watermark already published cannot go
back. For an input that grows between runs, use `bounded=False` and `max_out_of_orderness_ms`.

Timestamps: the `timestamp` column is a Spark timestamp or date (converted to epoch milliseconds) or a
whole number of epoch milliseconds. Values: the `value` column, or a dict of the columns named in
`value` (default: every column but the key, timestamp and id); timestamp, date, decimal and binary
columns arrive as strings so values suit the default JSON codec.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator, Sequence

import pyarrow as pa

from millstream.model.injector import Injector, Malformed, Offset
from millstream.model.pipeline import PipelineError
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, timestamp_problem

# Column names of the staged files; user columns keep their own names.
_KEY, _TS, _PART, _ID = "__millstream_key", "__millstream_ts", "__millstream_partition", "__millstream_id"
# Batches one latest_offset call looks at, at most: a long backlog is read over several batches.
_MAX_BATCHES_PER_READ = 1_000


class DataFrameInjector(Injector):
    """Feeds a pipeline from a streaming DataFrame: `key` and `timestamp` name its columns.

    Build the DataFrame on the session the runner uses (`SparkRunner(spark=...)`, or `runner.spark`).

    >>> from millstream import Pipeline
    >>> inj = DataFrameInjector(None, key="user", timestamp="ts", partitions=2, name="clicks")
    >>> inj.partitions(), inj.initial_offset("0")
    (('0', '1'), {'batch': -1, 'max_event_time': None, 'end': False})
    >>> inj.low_watermark("0", {"batch": 7, "max_event_time": 10_000, "end": False})  # no bound declared
    -140737488355328
    >>> DataFrameInjector(None, key="user", timestamp="ts", max_out_of_orderness_ms=2_000).low_watermark(
    ...     "0", {"batch": 7, "max_event_time": 10_000, "end": False})
    8000
    """

    values_are_data = True  # a value the stream cannot carry is malformed input (model/injector.py)

    def __init__(self, df: Any, key: str, timestamp: str, value: str | Sequence[str] | None = None,
                 id: str | None = None, partitions: int = 4, max_out_of_orderness_ms: int | None = None,
                 bounded: bool = False, name: str = "dataframe") -> None:
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        if max_out_of_orderness_ms is not None and max_out_of_orderness_ms < 0:
            raise ValueError("max_out_of_orderness_ms must be >= 0 (or None: no watermark promise)")
        self.df = df
        self.key, self.timestamp, self.value, self.id = key, timestamp, value, id
        self.partition_count = partitions
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.bounded = bounded
        self.name = name
        self.storage: Any = None  # the root's storage, once a runner stages the DataFrame
        self._manifests: dict[int, dict[str, Any]] = {}
        if df is not None:
            if not df.isStreaming:
                raise PipelineError(f"DataFrameInjector {name!r} needs a streaming DataFrame (spark.readStream...); "
                                    "for a fixed table, read it with readStream too (files, tables) and bounded=True")
            self.staged_columns()  # bad column names fail here, not inside Spark

    def __getstate__(self) -> dict[str, Any]:
        # The DataFrame lives on the driver; executors only read what was staged.
        return {**self.__dict__, "df": None, "_manifests": {}}

    def __repr__(self) -> str:
        return f"DataFrameInjector(key={self.key!r}, timestamp={self.timestamp!r}, partitions={self.partition_count})"

    # -- the Injector contract -------------------------------------------------------------------
    def partitions(self) -> Sequence[str]:
        return tuple(str(p) for p in range(self.partition_count))

    def id_namespace(self) -> tuple[str, str] | None:
        return ("dataframe", self.name)  # ids "<name>:<batch>:<partition>:<file>:<row>" or "<name>:<id column>"

    def initial_offset(self, partition: str) -> Offset:
        return {"batch": -1, "max_event_time": None, "end": False}

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        last, rows = start["batch"], 0
        manifest = None
        first = start["batch"] + 1
        if self._manifest(first) is None:
            # Deleted by retention: only a reader added later, from the earliest, can be this far back.
            first = max(first, (self._staged().read_json("PRUNED.json") or {"below": 0})["below"])
            last = first - 1
        for batch in range(first, first + _MAX_BATCHES_PER_READ):
            found = self._manifest(batch)
            if found is None:
                break
            last, manifest = batch, found
            rows += found["rows"].get(partition, 0)
            if max_records is not None and rows >= max_records:
                break
        end = self._staged().read_json("END.json")
        ended = end is not None and last >= end["last_batch"]
        if manifest is None:
            return {**start, "end": ended} if ended else start
        return {"batch": last, "max_event_time": manifest["max_event_time"], "end": ended}

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
        value_columns = self._value_columns_of_files()
        for batch in range(start["batch"] + 1, end["batch"] + 1):
            manifest = self._manifest(batch)
            if manifest is None and batch < (self._staged().read_json("PRUNED.json") or {"below": 0})["below"]:
                continue  # a reader added later, from the earliest: it starts at the oldest batch kept
            if manifest is None:
                raise PipelineError(f"input {self.name!r}: staged batch {batch} is gone from {self._staged().describe()}")
            for file_index, path in enumerate(manifest["files"].get(partition, [])):
                rows = self._staged().read_parquet(path).to_pylist()
                for row_index, row in enumerate(rows):
                    position = f"{self.name}:{batch}:{partition}:{file_index}:{row_index}"
                    key, timestamp = row.pop(_KEY), row.pop(_TS)
                    record_id = row.pop(_ID, None)
                    row.pop(_PART, None)
                    if key is None or timestamp is None:
                        yield Malformed(position, repr(row), f"null {'key' if key is None else 'timestamp'} column")
                        continue
                    if not BEGINNING_OF_TIME <= timestamp <= END_OF_TIME:  # epoch microseconds, say
                        yield Malformed(position, repr(row), f"timestamp {timestamp_problem(timestamp)}")
                        continue
                    value = row[value_columns] if isinstance(value_columns, str) else row
                    yield Record(key, value, timestamp,
                                 f"{self.name}:{record_id}" if self.id is not None else position)

    def low_watermark(self, partition: str, offset: Offset) -> int:
        if offset.get("end"):
            return END_OF_TIME
        if offset["max_event_time"] is None or self.max_out_of_orderness_ms is None:
            return BEGINNING_OF_TIME
        return max(BEGINNING_OF_TIME, int(offset["max_event_time"]) - self.max_out_of_orderness_ms)

    # -- staging (driver side) -------------------------------------------------------------------
    def staged_columns(self) -> list[Any]:
        """The staged files' columns, as Spark column expressions over the DataFrame. Raises
        PipelineError naming the column when the DataFrame lacks one or a type does not fit."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        fields = {f.name: f.dataType for f in self.df.schema.fields}
        for role, column in (("key", self.key), ("timestamp", self.timestamp), ("id", self.id)):
            if column is not None and column not in fields:
                raise PipelineError(f"DataFrameInjector {self.name!r}: no {role} column {column!r} "
                                    f"(the DataFrame has {sorted(fields)})")
        ts_type = fields[self.timestamp]
        if isinstance(ts_type, (T.TimestampType, T.TimestampNTZType)):
            timestamp = F.unix_millis(F.col(self.timestamp).cast("timestamp"))
        elif isinstance(ts_type, T.DateType):
            timestamp = F.unix_date(F.col(self.timestamp)).cast("long") * 86_400_000
        elif isinstance(ts_type, T.IntegralType):
            timestamp = F.col(self.timestamp).cast("long")
        else:
            raise PipelineError(f"DataFrameInjector {self.name!r}: timestamp column {self.timestamp!r} is "
                                f"{ts_type.simpleString()}; give a timestamp, a date or whole epoch milliseconds")
        key = F.col(self.key).cast("string")
        columns = [key.alias(_KEY), timestamp.alias(_TS),
                   F.pmod(F.hash(key), F.lit(self.partition_count)).alias(_PART)]
        if self.id is not None:
            columns.append(F.col(self.id).cast("string").alias(_ID))
        for name in self._value_columns(fields):
            kind = fields[name]
            as_text = isinstance(kind, (T.TimestampType, T.TimestampNTZType, T.DateType, T.DecimalType))
            if isinstance(kind, T.BinaryType):
                columns.append(F.base64(F.col(name)).alias(name))
            else:
                columns.append(F.col(name).cast("string").alias(name) if as_text else F.col(name))
        return columns

    def _value_columns(self, fields: dict[str, Any]) -> list[str]:
        if self.value is None:
            return [n for n in fields if n not in (self.key, self.timestamp, self.id)]
        wanted = [self.value] if isinstance(self.value, str) else list(self.value)
        missing = [n for n in wanted if n not in fields]
        if missing:
            raise PipelineError(f"DataFrameInjector {self.name!r}: no value column {missing} "
                                f"(the DataFrame has {sorted(fields)})")
        return wanted

    def _value_columns_of_files(self) -> str | None:
        """A single value column's name (the record's value is that column), else None (a dict)."""
        return self.value if isinstance(self.value, str) else None

    def stage_to(self, storage: Any) -> None:
        """Where the runner stages this DataFrame (`inputs/<injector>` under the root); the injector
        reads from there."""
        self.storage = storage

    def stage_batch(self, batch_df: Any, batch_id: int) -> None:
        """foreachBatch: stage micro-batch `batch_id` once (see the module doc)."""
        staged = self._staged()
        manifest_path = f"batches/{batch_id:012d}.json"
        if staged.exists(manifest_path):
            return  # staged before a crash: the first content stays
        previous = self._manifest(batch_id - 1) if batch_id > 0 else None
        if batch_id > 0 and previous is None:
            raise PipelineError(f"input {self.name!r}: batch {batch_id - 1} was never staged under "
                                f"{staged.describe()}; was the input's checkpoint moved?")
        rows = batch_df.select(*self.staged_columns())
        reports = rows.mapInArrow(_FileWriter(staged, batch_id), "partition string, path string, rows long, "
                                  "max_ts long").collect()
        files: dict[str, list[str]] = {}
        counts: dict[str, int] = {}
        biggest = previous["max_event_time"] if previous else None
        for report in sorted(reports, key=lambda r: r["path"]):
            files.setdefault(report["partition"], []).append(report["path"])
            counts[report["partition"]] = counts.get(report["partition"], 0) + report["rows"]
            if report["max_ts"] is not None:
                biggest = report["max_ts"] if biggest is None else max(biggest, report["max_ts"])
        staged.create_json(manifest_path, {"batch": batch_id, "files": files, "rows": counts,
                                           "max_event_time": biggest, "staged_ms": int(time.time() * 1000)})

    def prune_staged(self, read_up_to: int, cutoff_ms: int) -> int:
        """Delete staged batches up to `read_up_to` (every reader is past them) staged before
        `cutoff_ms`; the newest stays (the next batch's watermark builds on it). Returns how many went."""
        staged = self._staged()
        below = int((staged.read_json("PRUNED.json") or {"below": 0})["below"])
        newest = max((int(n.split(".")[0]) for n in staged.list("batches") if n.endswith(".json")), default=-1)
        batch = below
        while batch <= min(read_up_to, newest - 1):
            manifest = self._manifest(batch)
            if manifest is not None and manifest.get("staged_ms", 0) > cutoff_ms:
                break
            batch += 1
        if batch == below:
            return 0
        staged.write_json("PRUNED.json", {"below": batch})  # first, so no reader looks for what goes next
        for gone in range(below, batch):
            staged.delete(f"data/{gone:012d}")
            staged.delete(f"batches/{gone:012d}.json")
            self._manifests.pop(gone, None)
        return batch - below

    def mark_ended(self) -> int:
        """A bounded DataFrame was staged to its end: the watermark may reach END_OF_TIME. Returns
        how many rows were staged after the end an earlier run marked (they arrive late)."""
        staged = self._staged()
        batches = [int(n.split(".")[0]) for n in staged.list("batches") if n.endswith(".json")]
        last = max(batches, default=-1)
        earlier = staged.read_json("END.json")
        if earlier is None:
            staged.create_json("END.json", {"last_batch": last})
            return 0
        if last <= earlier["last_batch"]:
            return 0
        staged.write_json("END.json", {"last_batch": last})
        return sum(sum((self._manifest(b) or {"rows": {}})["rows"].values()) for b in batches
                   if b > earlier["last_batch"])

    def _staged(self) -> Any:
        if self.storage is None:
            raise PipelineError(f"DataFrameInjector {self.name!r} reads what the Spark runner stages; it runs on "
                                "SparkRunner only (test pipeline logic on the harness with a ScriptedInjector)")
        return self.storage

    def _manifest(self, batch: int) -> dict[str, Any] | None:
        if batch not in self._manifests:
            found = self._staged().read_json(f"batches/{batch:012d}.json")
            if found is None:
                return None
            self._manifests[batch] = found
        return self._manifests[batch]


class _FileWriter:
    """mapInArrow, on the executors: writes a task's rows of one staged batch, one file per
    partition, and reports each file (a retried task writes new files; only the reported ones count)."""

    def __init__(self, staged: Any, batch_id: int) -> None:
        self.staged, self.batch_id = staged, batch_id

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        by_partition: dict[int, list[pa.Table]] = {}
        for batch in batches:
            table = pa.Table.from_batches([batch])
            for partition in pc.unique(table[_PART]).to_pylist():
                by_partition.setdefault(partition, []).append(table.filter(pc.equal(table[_PART], partition)))
        attempt = uuid.uuid4().hex[:12]
        reports = []
        for partition, tables in sorted(by_partition.items()):
            table = pa.concat_tables(tables).drop_columns([_PART])
            path = f"data/{self.batch_id:012d}/{partition}/{attempt}.parquet"
            self.staged.write_parquet(path, table)
            # Rows read as Malformed (a timestamp out of range) do not move the watermark.
            times = table[_TS]
            valid = pc.and_(pc.greater_equal(times, BEGINNING_OF_TIME), pc.less_equal(times, END_OF_TIME))
            reports.append({"partition": str(partition), "path": path,
                            "rows": table.num_rows, "max_ts": pc.max(pc.filter(times, valid)).as_py()})
        if reports:
            yield pa.RecordBatch.from_pylist(reports, schema=pa.schema(
                [("partition", pa.string()), ("path", pa.string()), ("rows", pa.int64()), ("max_ts", pa.int64())]))


__all__ = ["DataFrameInjector"]
