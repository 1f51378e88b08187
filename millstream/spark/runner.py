"""Runs a Pipeline on Spark Structured Streaming: one streaming query per computation.

    source (all inputs, coalesced low watermark stamped in `lw`)
      -> withWatermark("lw", "1 millisecond")
      -> groupBy("shard").transformWithState(ShardProcessor, EventTime)    [RocksDB state, checkpointed]
      -> foreachBatch(BatchCommitter)     [stream logs + sinks + status, idempotent by batch id]

Everything lives under one root directory: `checkpoints/<computation>` (Spark's offsets, commits and
state), `streams/` (stream logs), `status/<computation>` (watermark and counters per batch). Running
the same pipeline on the same root resumes from the checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from millstream.core.executor import Produced
from millstream.core.plan import (
    DEFAULT_PAGES_PER_SHARD,
    DEFAULT_SHARDS,
    ComputationPlan,
    plan_computation,
    sender_name,
)
from millstream.core.watermarks import output_watermark
from millstream.model.pipeline import Pipeline, PipelineError, Production
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record
from millstream.spark.operator import OUTPUT_SCHEMA, ShardProcessor
from millstream.spark.source import SOURCE_FORMAT, InputsDataSource, Sender, SourcePlan, watermark_of_offset
from millstream.spark.streamlog import StreamLog, atomic_write, productions_table


class MillstreamRunError(RuntimeError):
    """A computation's query failed; the message carries the user-level cause, not Spark's trace."""


@dataclass
class ComputationProgress:
    low_watermark: int = BEGINNING_OF_TIME
    input_watermark: int = BEGINNING_OF_TIME
    records: int = 0
    duplicates: int = 0
    late: int = 0
    timers_fired: int = 0
    productions: int = 0
    batches: int = 0
    wall_ms: int = 0


@dataclass
class InjectorProgress:
    low_watermark: int = BEGINNING_OF_TIME
    records: int = 0


@dataclass
class PipelineProgress:
    computations: dict[str, ComputationProgress] = field(default_factory=dict)
    injectors: dict[str, InjectorProgress] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return bool(self.computations) and all(
            c.low_watermark >= END_OF_TIME for c in self.computations.values()
        )


_METRICS = ("records", "duplicates", "late", "timers", "productions")


class BatchCommitter:
    """foreachBatch of one computation: turns the operator's output into committed stream-log
    batches, sink files and the computation's status, all keyed by Spark's batch id."""

    def __init__(self, pipeline: Pipeline, plan: ComputationPlan, root: str, checkpoint: str) -> None:
        self.pipeline = pipeline
        self.plan = plan
        self.log = StreamLog(root)
        self.checkpoint = checkpoint
        self.status_dir = status_directory(root, plan.name)
        self.sinks = [s for s in pipeline.sinks.values() if s.stream in plan.output_codecs]

    def __call__(self, frame: Any, batch_id: int) -> None:
        # Always run the batch: Spark commits the operator's state stores only when the whole frame
        # is consumed, also when it replays a batch after a restart.
        table = frame.toArrow()
        previous = self._load_status()
        if previous.get("batch", -1) >= batch_id:
            return  # committed before the restart: the replay must not publish it twice
        reports = table.filter(pc.is_null(table["stream"]))
        produced_rows = table.filter(pc.is_valid(table["stream"]))

        shards: dict[str, list[int | None]] = dict(previous.get("shards", {}))
        metrics = dict(previous.get("metrics", {m: 0 for m in _METRICS}))
        for row in reports.to_pylist():
            shards[str(row["shard"])] = [row["next_lw"], row["next_wall"]]
            for name in _METRICS:
                metrics[name] += row[name]
        offset = self._end_offset(batch_id)
        input_watermark = offset["watermark"]
        pending = [lw for lw, _ in shards.values() if lw is not None]
        low_watermark = max(
            previous.get("low_watermark", BEGINNING_OF_TIME),
            output_watermark(input_watermark, min(pending) if pending else None),
        )
        walls = [wall for _, wall in shards.values() if wall is not None]

        by_stream: dict[str, list[Produced]] = {s: [] for s in self.plan.output_codecs}
        for row in produced_rows.select(["stream", "key", "value", "ts", "id"]).to_pylist():
            by_stream[row["stream"]].append(Produced(row["stream"], row["key"], row["value"], row["ts"], row["id"]))
        for stream, produced in by_stream.items():
            self.log.append(stream, self.plan.name, batch_id, productions_table(produced), low_watermark)
        for sink in self.sinks:
            write_sink_file(sink.path, sink.format, f"{self.plan.name}-{batch_id:012d}",
                            by_stream[sink.stream], self.pipeline.codec(sink.stream))

        status = {
            "batch": batch_id,
            "low_watermark": low_watermark,
            "input_watermark": input_watermark,
            "senders": {name: item["watermark"] for name, item in offset["senders"].items()},
            "shards": shards,
            "next_wall_timer": min(walls) if walls else None,
            "metrics": metrics,
            "wall_ms": int(time.time() * 1000),
        }
        os.makedirs(self.status_dir, exist_ok=True)
        with open(os.path.join(self.status_dir, "history.jsonl"), "a") as history:
            history.write(json.dumps({k: status[k] for k in ("batch", "low_watermark", "input_watermark", "wall_ms")}) + "\n")
        atomic_write(os.path.join(self.status_dir, "latest.json"), json.dumps(status).encode())

    def _load_status(self) -> dict[str, Any]:
        return load_status(self.status_dir)

    def _end_offset(self, batch_id: int) -> dict[str, Any]:
        """The source's end offset for this batch, from Spark's offset log (written before the
        batch runs): it holds the coalesced input watermark the batch's rows were stamped with."""
        with open(os.path.join(self.checkpoint, "offsets", str(batch_id))) as log:
            lines = log.read().splitlines()
        return json.loads(lines[-1])


def status_directory(root: str, computation: str) -> str:
    return os.path.join(root, "status", computation)


def load_status(status_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(status_dir, "latest.json"), "rb") as data:
            return json.loads(data.read())
    except FileNotFoundError:
        return {}


def write_sink_file(directory: str, fmt: str, name: str, produced: list[Produced], codec: Any) -> None:
    """One file per producer batch, written atomically and never rewritten (exactly-once)."""
    suffix = ".jsonl" if fmt == "jsonl" else ".parquet"
    path = os.path.join(directory, name + suffix)
    if not produced or os.path.exists(path):
        return
    os.makedirs(directory, exist_ok=True)
    rows = [{"key": p.key, "timestamp": p.timestamp, "id": p.id, "value": codec.decode(p.value)} for p in produced]
    if fmt == "jsonl":
        atomic_write(path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode())
    else:
        flat = [
            {"key": r["key"], "timestamp": r["timestamp"], "id": r["id"], **r["value"]}
            if isinstance(r["value"], dict) else r
            for r in rows
        ]
        tmp = f"{path}.tmp-{os.getpid()}"
        pq.write_table(pa.Table.from_pylist(flat), tmp)
        os.replace(tmp, path)


class SparkRunner:
    """Run `pipeline` on Spark. `root` holds checkpoints, stream logs and status; reuse it to resume."""

    def __init__(
        self,
        pipeline: Pipeline,
        root: str = "./millstream-data",
        master: str = "local[*]",
        shards: int = DEFAULT_SHARDS,
        pages_per_shard: int = DEFAULT_PAGES_PER_SHARD,
        trigger_ms: int = 200,
        max_records_per_batch: int = 100_000,
        spark_conf: Mapping[str, str] | None = None,
        spark: Any = None,
    ) -> None:
        pipeline.validate()
        for node in pipeline.computations.values():
            if node.production is Production.WEAK:
                raise PipelineError(
                    f"computation {node.name!r} asks for weak productions, which the Spark runner does "
                    "not support yet; use production='strong'"
                )
        for sink in pipeline.sinks.values():
            if any(p in pipeline.injectors for p in pipeline.producers(sink.stream)):
                raise PipelineError(
                    f"sink {sink.name!r} reads stream {sink.stream!r}, which an injector produces; the Spark "
                    "runner materializes computation outputs only (add a pass-through computation)"
                )
        if shards < 1 or pages_per_shard < 1:
            raise ValueError("shards and pages_per_shard must be >= 1")
        self.pipeline = pipeline
        self.root = os.path.abspath(str(root))
        self.master = master
        self.trigger_ms = trigger_ms
        self.max_records_per_batch = max_records_per_batch
        self._spark_conf = dict(spark_conf or {})
        self._spark = spark
        self._queries: dict[str, Any] = {}
        self.shards, self.pages_per_shard = self._layout(shards, pages_per_shard)
        self.plans = {
            name: plan_computation(pipeline, name, self.shards, self.pages_per_shard)
            for name in pipeline.topological_order()
        }

    def _layout(self, shards: int, pages_per_shard: int) -> tuple[int, int]:
        """State is partitioned by shard and page: a resumed run must keep the stored layout."""
        path = os.path.join(self.root, "pipeline.json")
        wanted = {"pipeline": self.pipeline.name, "shards": shards, "pages_per_shard": pages_per_shard,
                  "computations": sorted(self.pipeline.computations)}
        if os.path.exists(path):
            with open(path) as data:
                stored = json.load(data)
            if stored != wanted:
                raise PipelineError(
                    f"{self.root} holds a run of a different pipeline layout ({stored}); this one is "
                    f"{wanted}. Use another root directory or delete this one to start over"
                )
        else:
            os.makedirs(self.root, exist_ok=True)
            atomic_write(path, json.dumps(wanted).encode())
        return shards, pages_per_shard

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def spark(self) -> Any:
        if self._spark is None:
            from millstream.spark.session import create_session

            self._spark = create_session(self.master, f"millstream-{self.pipeline.name}", self._spark_conf,
                                         log_path=os.path.join(self.root, "spark.log"))
        return self._spark

    def start(self) -> None:
        """Start one streaming query per computation (resuming from checkpoints)."""
        if self._queries:
            return
        _pickle_user_code_by_value(self.pipeline)
        spark = self.spark
        spark.dataSource.register(InputsDataSource)
        for name, plan in self.plans.items():
            self._queries[name] = self._start_query(spark, plan)

    def _start_query(self, spark: Any, plan: ComputationPlan) -> Any:
        senders = tuple(
            Sender(sender_name(i.stream, p), i.stream, p,
                   self.pipeline.injectors[p].injector if p in self.pipeline.injectors else None)
            for i in plan.inputs for p in i.producers
        )
        source_plan = SourcePlan(plan, self.root, senders, status_directory(self.root, plan.name),
                                 max_records_per_batch=self.max_records_per_batch)
        checkpoint = os.path.join(self.root, "checkpoints", plan.name)
        rows = (
            spark.readStream.format(SOURCE_FORMAT).option("plan", source_plan.encode()).load()
            .withWatermark("lw", "1 millisecond")
            .groupBy("shard")
            .transformWithState(ShardProcessor(plan), OUTPUT_SCHEMA, "Update", "EventTime")
        )
        return (
            rows.writeStream.queryName(f"{self.pipeline.name}.{plan.name}")
            .foreachBatch(BatchCommitter(self.pipeline, plan, self.root, checkpoint))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{self.trigger_ms} milliseconds")
            .start()
        )

    def run(self, on_progress: Callable[[PipelineProgress], None] | None = None,
            progress_interval: float = 1.0, timeout: float | None = None) -> PipelineProgress:
        """Run until every injector has finished and every computation's low watermark reached
        END_OF_TIME. Ctrl-C stops the queries cleanly (the next run resumes)."""
        self.start()
        deadline = None if timeout is None else time.time() + timeout
        try:
            while True:
                self.raise_if_failed()
                progress = self.progress()
                if on_progress is not None:
                    on_progress(progress)
                if progress.done:
                    return progress
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(f"pipeline not finished after {timeout} s: {progress}")
                time.sleep(progress_interval)
        finally:
            self.stop()

    def raise_if_failed(self) -> None:
        for name, query in self._queries.items():
            error = query.exception()
            if error is not None:
                self.stop()
                details = f"{error}\n{getattr(error, 'getStackTrace', lambda: '')()}"
                with open(os.path.join(self.root, "errors.log"), "a") as log:
                    log.write(f"--- computation {name!r} failed at {time.ctime()}\n{details}\n")
                raise MillstreamRunError(
                    f"computation {name!r} failed: {user_error_message(str(error))} "
                    f"(full trace in {os.path.join(self.root, 'errors.log')})"
                ) from None

    def stop(self) -> None:
        for query in self._queries.values():
            try:
                query.stop()
            except Exception:  # stopping a failed query can raise again; it is stopped either way
                pass
        self._queries.clear()

    # -- inspection ----------------------------------------------------------------------------
    def progress(self) -> PipelineProgress:
        result = PipelineProgress()
        for name in self.plans:
            status = load_status(status_directory(self.root, name))
            metrics = status.get("metrics", {})
            result.computations[name] = ComputationProgress(
                low_watermark=status.get("low_watermark", BEGINNING_OF_TIME),
                input_watermark=status.get("input_watermark", BEGINNING_OF_TIME),
                records=metrics.get("records", 0),
                duplicates=metrics.get("duplicates", 0),
                late=metrics.get("late", 0),
                timers_fired=metrics.get("timers", 0),
                productions=metrics.get("productions", 0),
                batches=status.get("batch", -1) + 1,
                wall_ms=status.get("wall_ms", 0),
            )
            for sender, watermark in status.get("senders", {}).items():
                stream, producer = sender.split("/", 1)
                if producer in self.pipeline.injectors:
                    injector = result.injectors.setdefault(producer, InjectorProgress())
                    injector.low_watermark = max(injector.low_watermark, watermark)
                    injector.records = max(injector.records, result.computations[name].records)
        return result

    def watermark_history(self, computation: str) -> list[dict[str, int]]:
        """(batch, low_watermark, input_watermark, wall_ms) per committed batch, oldest first."""
        path = os.path.join(status_directory(self.root, computation), "history.jsonl")
        try:
            with open(path) as lines:
                return [json.loads(line) for line in lines if line.strip()]
        except FileNotFoundError:
            return []

    def read_stream(self, stream: str) -> list[Record]:
        """Every committed record of a stream produced by computations, decoded."""
        producers = self.pipeline.producers(stream)
        if not producers:
            raise KeyError(f"unknown stream {stream!r}")
        if any(p in self.pipeline.injectors for p in producers):
            raise PipelineError(f"stream {stream!r} comes from an injector and is not logged; read its source")
        codec = self.pipeline.codec(stream)
        records = []
        for _, table in StreamLog(self.root).read_all(stream, producers):
            for row in table.to_pylist():
                records.append(Record(row["key"], codec.decode(row["value"]), row["timestamp"], row["id"]))
        return records


_PYTHON_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")


def user_error_message(spark_message: str) -> str:
    """The last Python exception line of a Spark failure (the user's own error), else its first line."""
    lines = [line.strip() for line in spark_message.splitlines()]
    for line in reversed(lines):
        match = _PYTHON_ERROR.match(line)
        if match and not match.group(1).startswith(("Py4J", "Streaming", "Spark")):
            return f"{match.group(1)}: {match.group(2)}"
    return lines[0] if lines else spark_message


def _pickle_user_code_by_value(pipeline: Pipeline) -> None:
    """Spark's Python workers may not be able to import the user's modules (tests, notebooks,
    scripts): ship them by value. Installed packages and millstream itself are imported normally."""
    from pyspark import cloudpickle

    objects: list[Any] = [n.computation for n in pipeline.computations.values()]
    objects += [n.injector for n in pipeline.injectors.values()]
    objects += [f for n in pipeline.computations.values() for f in n.inputs.values()]
    for obj in objects:
        module_name = getattr(obj, "__module__", None) or type(obj).__module__
        module = sys.modules.get(module_name)
        if module is None or module_name == "__main__" or module_name.startswith(("millstream.", "builtins")):
            continue
        path = getattr(module, "__file__", "") or ""
        if "site-packages" in path:
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            pass
