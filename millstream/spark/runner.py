"""Runs a Pipeline on Spark Structured Streaming: one streaming query per computation.

    source (all inputs bundled per shard, coalesced low watermarks before and after the batch)
      -> groupBy("shard").transformWithState(ShardProcessor)    [RocksDB state, checkpointed]
      -> foreachBatch(BatchCommitter)     [stream logs + sinks + status, idempotent by batch id]

Everything lives under one root (a local directory or a remote location, see storage.py):
`checkpoints/<computation>` (Spark's offsets, commits and state; `checkpoint_root` moves them),
`streams/` (stream logs), `status/<computation>` (watermark and counters per batch, `history/` one
file per batch). Running the same pipeline on the same root resumes from the checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

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
from millstream.spark.bundles import unpack
from millstream.spark.operator import OUTPUT_SCHEMA, FusedConsumerProcessor, ShardProcessor
from millstream.spark.source import SOURCE_FORMAT, InputsDataSource, Sender, SourcePlan
from millstream.spark.storage import Storage, is_local
from millstream.spark.streamlog import StreamLog, productions_table


# Failures that say nothing about the pipeline: the query is restarted from its checkpoint.
_TRANSIENT = ("Python worker failed to connect back", "Timed out while waiting for the Python worker")
MAX_RESTARTS = 10
# Version of the state and stream layout under a root; a root written by another version is refused.
LAYOUT_FORMAT = 2


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
    """An injector's published low watermark. Records are counted where they are delivered: see
    ComputationProgress.records of its consumers."""

    low_watermark: int = BEGINNING_OF_TIME


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
    """foreachBatch of one query: turns the operators' output into committed stream-log batches, sink
    files and each computation's status, all keyed by Spark's batch id.

    `chain` is the query's computations in order: weak computations fused ahead of the last one, whose
    productions are logged. The input watermark of each is the output watermark of the one before."""

    def __init__(self, pipeline: Pipeline, chain: list[ComputationPlan], root: str, checkpoint: str) -> None:
        self.pipeline = pipeline
        self.chain = chain
        self.plan = chain[-1]
        self.log = StreamLog(root)
        self.checkpoint = Storage(checkpoint)
        self.root = root
        self.sinks = [s for s in pipeline.sinks.values() if s.stream in self.plan.output_codecs]

    def __call__(self, frame: Any, batch_id: int) -> None:
        # Always run the batch: Spark commits the operators' state stores only when the whole frame
        # is consumed, also when it replays a batch after a restart.
        table = frame.toArrow()
        previous = {plan.name: load_status(status_storage(self.root, plan.name)) for plan in self.chain}
        if previous[self.plan.name].get("batch", -1) >= batch_id:
            return  # committed before the restart: the replay must not publish it twice
        reports = table.filter(pc.equal(table["kind"], "report")).to_pylist()
        offset = self._end_offset(batch_id)
        watermark = offset["watermark"]
        senders = {name: item["watermark"] for name, item in offset["senders"].items()}
        statuses = []
        for plan in self.chain:
            status = _next_status(previous[plan.name], [r for r in reports if r["computation"] == plan.name], batch_id,
                                  watermark, senders)
            statuses.append((plan, status))
            watermark, senders = status["low_watermark"], {}

        by_stream: dict[str, list[Produced]] = {s: [] for s in self.plan.output_codecs}
        for bundle in table.filter(pc.equal(table["kind"], "records"))["bundle"].to_pylist():
            for stream, key, value, ts, rid in unpack(bundle):
                by_stream[stream].append(Produced(stream, key, value, ts, rid))
        for stream, produced in by_stream.items():
            self.log.append(stream, self.plan.name, batch_id, productions_table(produced), watermark)
        for sink in self.sinks:
            write_sink_file(sink.path, sink.format, f"{self.plan.name}-{batch_id:012d}",
                            by_stream[sink.stream], self.pipeline.codec(sink.stream))
        for plan, status in statuses:  # the last computation's status last: it marks the batch done
            _write_status(status_storage(self.root, plan.name), status)

    def _end_offset(self, batch_id: int) -> dict[str, Any]:
        """The source's end offset for this batch, from Spark's offset log (written before the
        batch runs): it holds the coalesced input watermark the batch's rows were stamped with."""
        log = self.checkpoint.read(f"offsets/{batch_id}")
        if log is None:
            raise RuntimeError(f"Spark's offset log has no batch {batch_id} in {self.checkpoint.describe()}")
        return json.loads(log.decode().splitlines()[-1])


def _next_status(previous: dict[str, Any], reports: list[dict[str, Any]], batch_id: int,
                 input_watermark: int, senders: dict[str, int]) -> dict[str, Any]:
    """A computation's status after a batch: per-shard pending timers (shards not invoked keep
    theirs), cumulative counters, and the output watermark min(input, earliest pending timer)."""
    shards: dict[str, list[int | None]] = dict(previous.get("shards", {}))
    metrics = dict(previous.get("metrics", {m: 0 for m in _METRICS}))
    for row in reports:
        shards[str(row["shard"])] = [row["next_lw"], row["next_wall"]]
        for name in _METRICS:
            metrics[name] += row[name]
    pending = [lw for lw, _ in shards.values() if lw is not None]
    walls = [wall for _, wall in shards.values() if wall is not None]
    low_watermark = max(
        previous.get("low_watermark", BEGINNING_OF_TIME),
        output_watermark(input_watermark, min(pending) if pending else None),
    )
    return {
        "batch": batch_id,
        "low_watermark": low_watermark,
        "input_watermark": input_watermark,
        "senders": senders,
        "shards": shards,
        "next_wall_timer": min(walls) if walls else None,
        "metrics": metrics,
        "wall_ms": int(time.time() * 1000),
    }


def _write_status(status: Storage, value: dict[str, Any]) -> None:
    history = {k: value[k] for k in ("batch", "low_watermark", "input_watermark", "wall_ms")}
    status.write_json(f"history/{value['batch']:012d}.json", history)
    status.write_json("latest.json", value)


def status_location(root: str, computation: str) -> str:
    return Storage(root).child(f"status/{computation}").location


def status_storage(root: str, computation: str) -> Storage:
    return Storage(status_location(root, computation))


def load_status(status: Storage) -> dict[str, Any]:
    return status.read_json("latest.json") or {}


def write_sink_file(location: str, fmt: str, name: str, produced: list[Produced], codec: Any) -> None:
    """One file per producer batch, written atomically and never rewritten (exactly-once)."""
    path = name + (".jsonl" if fmt == "jsonl" else ".parquet")
    sink = Storage(location)
    if not produced or sink.exists(path):
        return
    rows = [{"key": p.key, "timestamp": p.timestamp, "id": p.id, "value": codec.decode(p.value)} for p in produced]
    if fmt == "jsonl":
        sink.write(path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode())
    else:
        flat = [
            {"key": r["key"], "timestamp": r["timestamp"], "id": r["id"], **r["value"]}
            if isinstance(r["value"], dict) else r
            for r in rows
        ]
        sink.write_parquet(path, pa.Table.from_pylist(flat))


class SparkRunner:
    """Run `pipeline` on Spark. `root` holds checkpoints, stream logs and status; reuse it to resume.

    `root` is a local directory or a remote location (storage.py: s3://, gs://, hdfs://); on a
    cluster it must be one every node reaches. Spark's checkpoints go to `checkpoint_root` (default
    `<root>/checkpoints`): any location Spark's checkpointLocation accepts (Hadoop connectors).
    """

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
        checkpoint_root: str | None = None,
    ) -> None:
        pipeline.validate()
        self._fused_into = _check_weak_productions(pipeline)
        for sink in pipeline.sinks.values():
            if any(p in pipeline.injectors for p in pipeline.producers(sink.stream)):
                raise PipelineError(
                    f"sink {sink.name!r} reads stream {sink.stream!r}, which an injector produces; the Spark "
                    "runner materializes computation outputs only (add a pass-through computation)"
                )
        if shards < 1 or pages_per_shard < 1:
            raise ValueError("shards and pages_per_shard must be >= 1")
        self.pipeline = pipeline
        root = str(root)
        self.root = os.path.abspath(root) if is_local(root) else root
        self.storage = Storage(self.root)
        if checkpoint_root is None:
            if "?" in self.root:
                raise PipelineError(
                    f"root {self.storage.describe()} carries filesystem options; give checkpoint_root= a location "
                    "Spark's checkpointLocation accepts (e.g. hdfs://... or s3a://...)")
            checkpoint_root = self.storage.child("checkpoints").location
        self.checkpoint_root = os.path.abspath(checkpoint_root) if is_local(checkpoint_root) else checkpoint_root
        # The driver's own logs stay on local disk (the JVM's output is redirected to a local file).
        self.log_dir = self.root if self.storage.local else os.path.join(
            tempfile.gettempdir(), "millstream", re.sub(r"[^\w.-]", "_", pipeline.name))
        self.master = master
        self.trigger_ms = trigger_ms
        self.max_records_per_batch = max_records_per_batch
        self._spark_conf = dict(spark_conf or {})
        self._spark = spark
        self._queries: dict[str, Any] = {}
        self._chains: dict[str, list[ComputationPlan]] = {}
        self._restarts: dict[str, int] = {}
        self.shards, self.pages_per_shard = self._layout(shards, pages_per_shard)
        self.plans = {
            name: plan_computation(pipeline, name, self.shards, self.pages_per_shard)
            for name in pipeline.topological_order()
        }

    def _layout(self, shards: int, pages_per_shard: int) -> tuple[int, int]:
        """State is partitioned by shard and page: a resumed run must keep the stored layout."""
        path = "pipeline.json"
        wanted = {"format": LAYOUT_FORMAT, "pipeline": self.pipeline.name, "shards": shards,
                  "pages_per_shard": pages_per_shard,
                  "computations": sorted(self.pipeline.computations), "weak": sorted(self._fused_into)}
        stored = self.storage.read_json(path)
        if stored is None:
            self.storage.write_json(path, wanted)
        elif stored != wanted:
            raise PipelineError(
                f"{self.storage.describe()} holds a run of a different pipeline layout ({stored}); this one is "
                f"{wanted}. Use another root directory or delete this one to start over"
            )
        return shards, pages_per_shard

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def spark(self) -> Any:
        if self._spark is None:
            from millstream.spark.session import create_session

            self._spark = create_session(self.master, f"millstream-{self.pipeline.name}", self._spark_conf,
                                         log_path=os.path.join(self.log_dir, "spark.log"))
        return self._spark

    def start(self) -> None:
        """Start one streaming query per strong computation, with the weak computations that feed it
        fused in front (resuming from checkpoints)."""
        if self._queries:
            return
        _pickle_user_code_by_value(self.pipeline)
        spark = self.spark
        spark.dataSource.register(InputsDataSource)
        for name, plan in self.plans.items():
            if name in self._fused_into:
                continue
            chain = [self.plans[n] for n, head in self._fused_into.items() if head == name] + [plan]
            self._chains[name] = chain
            self._queries[name] = self._start_query(spark, chain)

    def _wait_until_initialized(self, query: Any, limit_s: float = 60.0) -> None:
        """Spark gives a new query's Python source worker a hard-coded 10 s to connect back; several
        starting at once on a busy 2-core machine miss it. So queries start one after another."""
        deadline = time.time() + limit_s
        while time.time() < deadline and query.isActive and query.exception() is None:
            if query.status.get("message") != "Initializing sources":
                return
            time.sleep(0.1)

    def _stateful(self, rows: Any, processor: Any) -> Any:
        """One computation's stateful operator over rows keyed by shard. Row-based: with records
        bundled, an operator sees a few rows per shard, and the row flavour measured no slower than
        the Pandas one (bench/flavour.py)."""
        return rows.groupBy("shard").transformWithState(processor, OUTPUT_SCHEMA, "Update", "None")

    def _start_query(self, spark: Any, chain: list[ComputationPlan]) -> Any:
        first, plan = chain[0], chain[-1]
        senders = tuple(
            Sender(sender_name(i.stream, p), i.stream, p,
                   self.pipeline.injectors[p].injector if p in self.pipeline.injectors else None)
            for i in first.inputs for p in i.producers
        )
        source_plan = SourcePlan(first, self.root, senders,
                                 tuple(status_location(self.root, p.name) for p in chain),
                                 max_records_per_batch=self.max_records_per_batch)
        checkpoint = Storage(self.checkpoint_root).child(plan.name).location
        rows = spark.readStream.format(SOURCE_FORMAT).option("plan", source_plan.encode()).load()
        rows = self._stateful(rows, ShardProcessor(first, downstream=plan if len(chain) > 1 else None))
        if len(chain) > 1:
            rows = self._stateful(rows, FusedConsumerProcessor(plan))
        query = (
            rows.writeStream.queryName(f"{self.pipeline.name}.{plan.name}")
            .foreachBatch(BatchCommitter(self.pipeline, chain, self.root, checkpoint))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{self.trigger_ms} milliseconds")
            .start()
        )
        self._wait_until_initialized(query)
        return query

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
        """Raise the first query failure as a MillstreamRunError. A transient start-up failure (a
        Python worker that did not connect back in time on a loaded machine) restarts the query from
        its checkpoint instead, a bounded number of times."""
        for name, query in list(self._queries.items()):
            error = query.exception()
            if error is None:
                continue
            details = f"{error}\n{getattr(error, 'getStackTrace', lambda: '')()}"
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, "errors.log"), "a") as log:
                log.write(f"--- computation {name!r} failed at {time.ctime()}\n{details}\n")
            if any(p in str(error) for p in _TRANSIENT) and self._restarts.get(name, 0) < MAX_RESTARTS:
                self._restarts[name] = self._restarts.get(name, 0) + 1
                self._queries[name] = self._start_query(self.spark, self._chains[name])
                continue
            self.stop()
            raise MillstreamRunError(
                f"computation {name!r} failed: {user_error_message(str(error))} "
                f"(full trace in {os.path.join(self.log_dir, 'errors.log')})"
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
            status = load_status(status_storage(self.root, name))
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
        return result

    def watermark_history(self, computation: str) -> list[dict[str, int]]:
        """(batch, low_watermark, input_watermark, wall_ms) per committed batch, oldest first."""
        status = status_storage(self.root, computation)
        entries = (status.read_json(f"history/{name}") for name in status.list("history") if name.endswith(".json"))
        return [entry for entry in entries if entry is not None]

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


def _check_weak_productions(pipeline: Pipeline) -> dict[str, str]:
    """Weak computation -> the strong computation whose query it is fused into. The Spark runner
    fuses one weak computation into a consumer that reads nothing else."""
    fused: dict[str, str] = {}
    for node in pipeline.computations.values():
        if node.production is not Production.WEAK:
            continue
        consumer = pipeline.consumers(node.outputs[0])[0] if node.outputs else None
        consumer_node = pipeline.computations.get(consumer or "")
        if (consumer_node is None or any(pipeline.producers(s) != [node.name] for s in consumer_node.inputs)
                or any(s not in consumer_node.inputs for s in node.outputs)):
            raise PipelineError(
                f"weak computation {node.name!r} must be the only producer of every stream its consumer "
                f"{consumer!r} reads, and that consumer must read all of its outputs; use strong "
                "productions for this edge"
            )
        if consumer_node.production is Production.WEAK:
            raise PipelineError(
                f"weak computations {node.name!r} -> {consumer!r}: the Spark runner fuses one weak "
                "computation into a strong consumer; make one of them strong"
            )
        fused[node.name] = consumer_node.name
    return fused


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
