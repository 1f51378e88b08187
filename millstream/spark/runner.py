"""Runs a Pipeline on Spark Structured Streaming: one streaming query per computation.

    source (the computation's senders: injector partitions, upstream publication logs)
      -> groupBy("key_group").transformWithState(KeyGroupProcessor)   [state in Spark's state store]
      -> foreachBatch(BatchStager): executors write the batch's files, the driver stages a manifest
    Spark commits the batch -> Publisher appends it to the computation's publication log -> sinks

Everything lives under one root (a local directory or a remote location, see storage.py):
`checkpoints/<computation>/<generation>` (Spark's offsets, commits and state; `checkpoint_root` moves
them), `streams/` (the files of stream logs), `log/<computation>` (publication logs), `staged/`,
`status/<computation>` (status hints and history), `sinks/` (sink progress), `lease.json`. Running
the same pipeline on the same root resumes from where it stopped.

This module is the lifecycle: layout, claiming the root, starting and watching queries, progress.
The commit protocol is commit.py, sinks sinks.py, the user-facing errors errors.py.
"""

from __future__ import annotations

import os
import sys
import time
import types
import uuid
import warnings
from itertools import islice
from typing import Any, Callable, Mapping

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from millstream.core.plan import DEFAULT_KEY_GROUPS, ComputationPlan, declared_state, plan_computation
from millstream.core.watermarks import declared_keyed
from millstream.model.locations import is_local, local_path, temporary_log_dir
from millstream.model.pipeline import (DEAD_LETTERS, WALL_TIMER_DRAIN_S, ErrorPolicy, Pipeline, PipelineError,
                                      Production)
from millstream.model.records import Record
from millstream.spark import statestore
from millstream.spark.commit import BatchStager, Checkpoint, ComputationCommit, Publisher, repair_statuses
from millstream.spark.errors import MillstreamRunError, reported_failure, restart_after, user_error_message
from millstream.spark.feeds import Feeds
from millstream.spark.fencing import Lease, RootInUse, driver_info
from millstream.spark.layout import RootLayout, stored_form
from millstream.spark.operator import FUSED_SCHEMA, OUTPUT_SCHEMA, FusedProducerProcessor, KeyGroupProcessor
from millstream.spark.options import check_root, check_runner_options, check_sink_directory
from millstream.spark.pacing import BatchPacing
from millstream.spark.partitioning import GroupLabels, alignment
from millstream.spark.progress import ComputationProgress, PipelineProgress, read_progress
from millstream.spark.publog import CLAIM, Fenced, FencedWriter, PublicationLog
from millstream.spark.resume import computation_refusals, parallelism_kept, sink_refusals
from millstream.spark.retention import DEFAULT_RETAIN_LOGS_S, LogRetention
from millstream.spark.rescale import check_no_unfinished_rescale
from millstream.spark.rootfiles import LAYOUT_FILE, read_status_history, wake_file
from millstream.spark.sinks import SinkDelivery, SinkError, check_sink_formats, sink_deliverers
from millstream.spark.session import cluster_parallelism, hide_pandas_3_warning
from millstream.spark.shipping import check_picklable
from millstream.spark.source import LOG_SCHEMA, Sender, SourcePlan, source_for
from millstream.spark.storage import Storage, check_no_credentials
from millstream.spark.writer import FileSink

__all__ = ["BatchPacing", "ComputationProgress", "MillstreamRunError", "PipelineProgress", "RootInUse", "SparkRunner",
           "read_progress"]

# A take-over's claim retries while the driver it takes over publishes its last batches (see _claim).
TAKEOVER_ATTEMPTS = 20
# Copies of a running driver's checkpoint tried before a take-over gives up (files vanish mid-copy).
CHECKPOINT_COPY_ATTEMPTS = 10


class SparkRunner:
    """Run `pipeline` on Spark. `root` holds checkpoints, logs and status; reuse it to resume.

    `root` is a local directory or a remote location (storage.py: s3://, gs://, hdfs://); on a
    cluster it must be one every node reaches. Spark's checkpoints go to `checkpoint_root` (default
    `<root>/checkpoints`): any location Spark's checkpointLocation accepts (Hadoop connectors).

    `parallelism`: Spark state partitions (tasks) per computation, chosen at a root's first start from
    the session (its default parallelism: local[N] -> N, a cluster -> its cores, once its executors
    have registered: session.cluster_parallelism) and kept in Spark's
    checkpoints; `millstream rescale` changes it later. `key_groups`: MillWheel's key intervals, fixed
    for the life of a root, the most parallelism a computation can ever use (None: the root's, or
    DEFAULT_KEY_GROUPS for a new root).

    A second driver on the same root refuses to start while the first is alive; `takeover=True`
    fences the first one instead (its later writes are never published).

    `retain_logs_s`: published batches every reader (consumers, sinks) is past are deleted once older
    than this (retention.py has the whole policy); None keeps everything.

    While input waits (a backlog, a catch-up), each batch reads about what its computation processes
    in `batch_pacing.target_ms` (3 s), measured on the batches before (pacing.py); give
    `batch_pacing=BatchPacing(target_ms=...)` to aim elsewhere, or `max_records_per_batch` to read at
    most that many records per batch instead, always.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        root: str = "./millstream-data",
        master: str = "local[*]",
        key_groups: int | None = None,
        parallelism: int | None = None,
        trigger_ms: int = 200,
        max_records_per_batch: int | None = None,
        batch_pacing: BatchPacing = BatchPacing(),
        spark_conf: Mapping[str, str] | None = None,
        spark: Any = None,
        checkpoint_root: str | None = None,
        takeover: bool = False,
        retain_logs_s: float | None = DEFAULT_RETAIN_LOGS_S,
    ) -> None:
        pipeline.validate()
        hide_pandas_3_warning()  # before anything of Spark's runs (DataFrame injectors stage from here)
        self._fused_into = pipeline.weak_fusions()
        check_runner_options(key_groups=key_groups, parallelism=parallelism, trigger_ms=trigger_ms,
                             max_records_per_batch=max_records_per_batch, retain_logs_s=retain_logs_s)
        if not isinstance(batch_pacing, BatchPacing):
            raise TypeError(f"batch_pacing takes a BatchPacing, e.g. BatchPacing(target_ms=3_000), not "
                            f"{batch_pacing!r}")
        self.pipeline = pipeline
        root = check_root(root)
        # Credentials come from the environment, never from a location: refused before anything is written.
        check_no_credentials(root, "root")
        if checkpoint_root is not None:
            checkpoint_root = check_root(checkpoint_root, "checkpoint_root", any_scheme=True)
            check_no_credentials(checkpoint_root, "checkpoint_root")
        for sink in pipeline.sinks.values():
            if sink.path is not None:
                check_no_credentials(sink.path, f"sink {sink.name!r} path")
            # millstream's own file sinks, and Spark's file formats (csv, json, orc, ...): a directory each.
            if sink.path is not None and sink.writer is None and sink.table is None and is_local(sink.path):
                check_sink_directory(local_path(sink.path), sink.name)  # where Storage will write
        self.root = os.path.abspath(root) if is_local(root) else root
        self.storage = Storage(self.root)
        given_checkpoint_root = checkpoint_root is not None
        if checkpoint_root is None:
            if "?" in self.root:
                raise PipelineError(
                    f"root {self.storage.describe()} carries filesystem options; give checkpoint_root= a location "
                    "Spark's checkpointLocation accepts (e.g. hdfs://... or s3a://...)")
            checkpoint_root = self.storage.child("checkpoints").location
        self.checkpoint_root = os.path.abspath(checkpoint_root) if is_local(checkpoint_root) else checkpoint_root
        self._checkpoint_root_given = self.checkpoint_root if given_checkpoint_root else None
        # The driver's own logs stay on local disk (the JVM's output is redirected to a local file).
        self.log_dir = self.root if self.storage.local else temporary_log_dir(pipeline.name)
        self.master = master
        self.trigger_ms = trigger_ms
        self.batch_cap: int | BatchPacing = max_records_per_batch or batch_pacing
        self.takeover = takeover
        self._spark_conf = dict(spark_conf or {})
        self._spark = spark
        self._queries: dict[str, Any] = {}
        self._namespaces: dict[str, tuple[str, ...]] = {}  # per query: its operators' cache namespaces
        self._restarts: dict[str, int] = {}
        self._start_positions: dict[str, dict[str, Any]] = {}  # new computations starting from now
        self.epoch = 0
        self._started_ms = 0
        self.group_labels: GroupLabels | None = None  # a new root's are chosen at its first start
        self.identity: str | None = None  # the root's (layout.py), read or made with its layout
        if key_groups is None:  # the root's own, kept in its layout; a new root's default
            stored = self.storage.read_json(LAYOUT_FILE)
            known = stored.get("key_groups") if isinstance(stored, dict) else None
            key_groups = known if isinstance(known, int) and not isinstance(known, bool) else DEFAULT_KEY_GROUPS
        self.key_groups = key_groups
        self._parallelism = parallelism
        self.plans: dict[str, ComputationPlan] = {
            name: plan_computation(pipeline, name, self.key_groups, self._fused_into)
            for name in pipeline.topological_order()
        }
        self._create_or_check_layout()  # the first write to the root: after every check of the pipeline
        self.lease = Lease(self.root)
        self.commits: dict[str, ComputationCommit] = {}
        self.publisher: Publisher | None = None
        self.sinks: SinkDelivery | None = None
        self.retention = LogRetention(self.root, retain_logs_s)
        self._progress_callbacks: list[Callable[[str, Any], None]] = []
        self._listener: Any = None
        # DataFrame injectors stage their input under the root first (before plans are pickled).
        self.feeds = Feeds(pipeline, self.storage, self.checkpoint_root, trigger_ms)

    def _create_or_check_layout(self) -> None:
        """Construction only checks the layout (layout.py) and creates it in a new root: it is
        rewritten by the driver that holds the root (`claim`), never by one that may yet be refused."""
        if not self._check_layout():
            self.identity = uuid.uuid4().hex[:16]  # a new root's (layout.py)
            if not self.storage.create_json(LAYOUT_FILE, self._layout().record()):
                self._check_layout()  # another runner made the root meanwhile: its layout is the root's

    def _check_layout(self) -> bool:
        """Whether the root holds a layout; refused if this pipeline cannot run on it. Its labels
        become this runner's."""
        stored = self.storage.read_json(LAYOUT_FILE)
        if stored is None:
            return False
        problems = self._layout().refusals(stored)
        if problems:
            raise PipelineError(f"{self.storage.describe()} cannot run this pipeline: {'; '.join(problems)}. "
                                "Use another root directory or delete this one to start over")
        stored_layout = RootLayout.from_record(stored)
        self.group_labels, self.identity = stored_layout.group_labels, stored_layout.identity
        return True

    def _write_layout(self) -> None:
        stored = self.storage.read_json(LAYOUT_FILE)
        layout = self._layout()
        self.storage.write_json(LAYOUT_FILE, (layout.keeping(stored) if isinstance(stored, dict) else layout).record())

    def _layout(self) -> RootLayout:
        pipeline = self.pipeline
        return RootLayout(pipeline.name, self.key_groups,
                          {name: self._fused_into.get(name) for name in pipeline.computations},
                          self.group_labels, self.root,
                          {name: {state: stored_form(spec) for state, spec in declared_state(node.computation).items()}
                           for name, node in pipeline.computations.items()},
                          {name: f"{type(node.injector).__module__}.{type(node.injector).__qualname__}"
                           for name, node in pipeline.injectors.items()},
                          identity=self.identity)

    def _choose_labels(self, parallelism: int) -> None:
        """A new root's key group labels (partitioning.py), chosen at its first start for the
        parallelism it starts with, and kept in its layout."""
        if self.group_labels is None:
            self.group_labels = GroupLabels.aligned(self.key_groups, alignment(self.key_groups, parallelism))
            self._write_layout()

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def spark(self) -> Any:
        if self._spark is None:
            from millstream.spark.session import create_session

            self._spark = create_session(self.master, f"millstream-{self.pipeline.name}", self._spark_conf,
                                         log_path=os.path.join(self.log_dir, "spark.log"))
        else:
            from millstream.spark.session import check_session

            check_session(self._spark)
        return self._spark

    def start(self) -> None:
        """Claim the root, publish what was committed but not published, and start one streaming
        query per computation (resuming from checkpoints)."""
        if self._queries:
            return
        _pickle_user_code_by_value(self.pipeline)
        check_picklable(self.pipeline)  # before Spark starts, naming what cannot be sent to its workers
        self._started_ms = int(time.time() * 1000)
        self.claim()  # before Spark starts: a root in use is refused in a moment
        refusals = [problem for commit in self.commits.values()
                    for problem in computation_refusals(self.root, commit, self._checkpoint_root_given)]
        refusals += sink_refusals(self.root, self.pipeline, self.commits)
        if refusals:
            self.lease.release()  # nothing ran: the root is free for the fixed pipeline
            raise PipelineError(f"{self.storage.describe()} cannot resume this pipeline: " + "; ".join(refusals))
        for commit in self.commits.values():
            note = parallelism_kept(self.root, commit, self._parallelism)
            if note is not None:
                warnings.warn(note, stacklevel=2)
        spark = self.spark
        try:
            check_sink_formats(spark, self.pipeline)
        except BaseException as error:
            self.lease.release()  # nothing ran: the root is free for the fixed pipeline
            if isinstance(error, SinkError):
                raise MillstreamRunError(str(error)) from None
            raise
        self.sinks = SinkDelivery(self.root, sink_deliverers(spark, self.root, self.pipeline, set(self.commits)))
        self.publisher = Publisher(self.root, self.commits, self.sinks)
        # Sinks first: a sink takes its batches in the order they are queued and skips any batch at or
        # below the last one it recorded, so what the publisher's catch-up publishes (a batch Spark
        # committed before a crash) goes after the published batches a sink has yet to receive.
        self.sinks.catch_up()
        self.publisher.catch_up()
        self.sinks.start()
        self.publisher.start()
        self._ensure_listener()
        # A root's parallelism is its first start's (kept in Spark's checkpoints): only a new one waits
        # for a cluster's executors.
        parallelism = self._parallelism or (cluster_parallelism(spark) if self.group_labels is None
                                            else int(spark.sparkContext.defaultParallelism))
        self._choose_labels(parallelism)
        spark.conf.set("spark.sql.shuffle.partitions", str(max(1, min(parallelism, self.key_groups))))
        self.feeds.start(self.pipeline.name)
        # All of them before the first query runs: its tasks would drop the others' caches otherwise.
        statestore.note_started(n for name in self.commits for n in self._cache_namespaces(name))
        for name in self.commits:
            self._queries[name] = self._start_query(name)

    def _cache_namespaces(self, name: str) -> tuple[str, ...]:
        """The namespaces of the worker caches of a computation's query: its operators' (statestore)."""
        commit = self.commits[name]
        return tuple(f"{commit.checkpoint.location}#{c.name}" for c in (*commit.fused, commit.plan))

    def on_query_progress(self, callback: Callable[[str, Any], None]) -> Callable[[], None]:
        """Call `callback(computation, progress)` after every Spark batch of this pipeline's queries,
        with Spark's own StreamingQueryProgress (batchId, durationMs, eventTime, stateOperators, ...;
        its row counts count millstream's bundles and heartbeats, not records: records are in
        `progress()`). It runs on a thread of the driver process (Spark's
        listener bus): keep it short. An exception in it is logged to errors.log and does not stop the
        run. Returns a function that unsubscribes. Subscribe before or while the pipeline runs."""
        self._progress_callbacks.append(callback)
        self._ensure_listener()

        def unsubscribe() -> None:
            if callback in self._progress_callbacks:
                self._progress_callbacks.remove(callback)
        return unsubscribe

    def _ensure_listener(self) -> None:
        if self._listener is not None or not self._progress_callbacks:
            return
        from pyspark.sql.streaming import StreamingQueryListener

        runner = self
        prefix = f"{self.pipeline.name}."

        class ProgressFeed(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress = event.progress
                name = progress.name or ""
                if not name.startswith(prefix) or name[len(prefix):] not in runner.plans:
                    return  # another pipeline's query in the same session
                for callback in list(runner._progress_callbacks):
                    try:
                        callback(name[len(prefix):], progress)
                    except Exception as error:
                        os.makedirs(runner.log_dir, exist_ok=True)
                        with open(os.path.join(runner.log_dir, "errors.log"), "a") as log:
                            log.write(f"--- on_query_progress callback failed at {time.ctime()}: {error!r}\n")

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        self._listener = ProgressFeed()
        self.spark.streams.addListener(self._listener)

    def _remove_listener(self) -> None:
        if self._listener is not None and self._spark is not None:
            try:
                self._spark.streams.removeListener(self._listener)
            except Exception:  # the session may be gone already
                pass
        self._listener = None

    def claim(self) -> None:
        """Take charge of the root: refuse if another live driver holds it (unless taking over), then
        claim a new epoch in every computation's publication log and write the root's layout."""
        holder = self.lease.holder()
        live = holder is not None and holder.heartbeat_ms > 0 and holder.is_alive()
        if live and not self.takeover:
            raise RootInUse(
                f"{self.storage.describe()} is in use by another driver ({holder.describe()}); stop it first, or "  # type: ignore[union-attr]
                "pass takeover=True to fence it and take over")
        strong = [name for name in self.plans if name not in self._fused_into]
        claims = {n: PublicationLog(self.root, n).last_claim() for n in strong}
        for name, claim in claims.items():
            if claim is not None:
                check_no_unfinished_rescale(self.root, name, str(claim["checkpoint"]))
        claimed = [c["epoch"] for c in claims.values() if c is not None]
        self.epoch = max([holder.epoch if holder else 0, *claimed]) + 1
        if not live:
            for name in strong:
                self._claim_computation(name)
            self.lease.hold(self.epoch)
        else:
            # Taking over from a driver that runs: the lease tells it first (it starts no more
            # batches), so its publications stop and the claims below stop racing them.
            self.lease.hold(self.epoch)
            try:
                for name in strong:
                    self._claim_computation(name, copy_checkpoint=True)
            except BaseException:
                self.lease.release()
                raise
        # Only the driver holding the root rewrites its layout, and it reads it again first: labels a
        # driver chose after this runner was constructed are kept, never overwritten.
        try:
            self._check_layout()
        except BaseException:
            self.lease.release()
            raise
        self._write_layout()

    def _claim_computation(self, name: str, copy_checkpoint: bool = False) -> None:
        """Claim this driver's epoch in one computation's log and set up its commit protocol. Taking
        over from a driver that may still publish, the claim retries while that driver's batches
        land where the claim wanted to go: each try copies the checkpoint cut back to the batch last
        published, so the copy holds Spark's commit of every published batch and no other."""
        plan = self.plans[name]
        log = PublicationLog(self.root, name)
        if not copy_checkpoint:  # (a driver taken over while it runs still writes them itself)
            repair_statuses(self.storage, log, name)  # a driver that died right after publishing
        for _ in range(TAKEOVER_ATTEMPTS):
            head = log.head()
            last_claim = log.last_claim()
            checkpoint = last_claim["checkpoint"] if last_claim else Storage(self.checkpoint_root).child(
                f"{name}/g0000").location
            last_published, _ = _last_published(log)
            if copy_checkpoint and last_claim is not None:
                checkpoint = _copy_checkpoint(checkpoint, last_published)
            writer = FencedWriter(log, self.epoch, head + 1)
            try:
                writer.append({"type": CLAIM, "driver": driver_info(self.epoch), "checkpoint": checkpoint})
                break
            except Fenced:
                there = log.read(head + 1) or {}
                if there.get("type") == CLAIM or int(there.get("epoch", 0)) >= self.epoch:
                    raise RootInUse(f"{self.storage.describe()}: another driver started on this root at the same "
                                    "moment; only one may run") from None
        else:
            raise RootInUse(f"{self.storage.describe()}: the driver being taken over kept publishing computation "
                            f"{name!r} while {TAKEOVER_ATTEMPTS} claims were tried; stop it, or try again")
        file_sinks = tuple(
            FileSink(s.name, s.stream, s.path, s.format, self.pipeline.codec(s.stream))  # type: ignore[arg-type]
            for s in self.pipeline.sinks.values() if s.is_file_sink and s.stream in plan.output_codecs)
        fused = tuple(self.plans[w] for w, head in self._fused_into.items() if head == name)
        self.commits[name] = ComputationCommit(plan, Checkpoint(checkpoint), writer, file_sinks, last_published,
                                               fused)

    # -- pipelines that change while running (MillWheel section 4) ------------------------------
    def add_computation(self, name: str, computation: Any, inputs: Any, outputs: Any = (), start: str = "earliest",
                        **options: Any) -> None:
        """Add a computation to the running pipeline (same arguments as Pipeline.add_computation) and
        start it, while the others keep running and keep their state. It reads the computations'
        streams from the start of their retained logs (`start="earliest"`) or from what they
        publish next (`start="latest"`); injector streams from their beginning, or, with "latest",
        from where an existing reader of the same injector has got to."""
        if start not in ("earliest", "latest"):
            raise PipelineError(f"start must be 'earliest' or 'latest', got {start!r}")
        if options.get("production", "strong") != "strong":
            raise PipelineError("a computation added to a running pipeline uses strong productions")
        changed = _copy_pipeline(self.pipeline)
        changed.add_computation(name, computation, inputs, outputs, **options)
        changed.validate()
        read = sorted({f"{stream!r} (read by {reader!r})" for stream in changed.computations[name].outputs
                       for reader in [*self.pipeline.consumers(stream),
                                      *(k.name for k in self.pipeline.sinks.values() if k.stream == stream)]})
        read += [f"{DEAD_LETTERS!r} (read by {reader!r})" for reader in self.pipeline.consumers(DEAD_LETTERS)]
        if read:  # its readers' inputs are fixed while they run (spark/resume.py)
            raise PipelineError(f"computation {name!r} would produce to {', '.join(read)}, which the running "
                                "pipeline reads already: a running reader cannot take a new producer; produce to a new "
                                "stream")
        if PublicationLog(self.root, name).head() >= 0:
            raise PipelineError(f"computation {name!r} ran on this root before: pick a new name")
        _pickle_user_code_by_value(changed)
        self.pipeline = changed
        self.plans[name] = plan_computation(changed, name, self.key_groups, changed.weak_fusions())
        self._claim_computation(name)
        self._start_positions[name] = self._positions_now(self.plans[name]) if start == "latest" else {}
        self._write_layout()
        if self.sinks is not None:  # sinks on the dead letters take its dead letters too
            self.sinks.add_producer(name, DEAD_LETTERS)
        self._queries[name] = self._start_query(name)

    def remove_computation(self, name: str) -> None:
        """Stop a computation of the running pipeline and take it out; the others keep running.
        Nothing may read its streams (a computation or a sink): remove those first. Its published
        log stays under the root (retention prunes it)."""
        if name not in self.plans or name in self._fused_into or name in self._fused_into.values():
            raise PipelineError(f"no strong computation {name!r} to remove (fused pairs are removed together "
                                "by running without them)")
        node = self.pipeline.computations[name]
        readers = sorted({c for s in node.outputs for c in self.pipeline.consumers(s)})
        sinks = sorted(k.name for k in self.pipeline.sinks.values() if k.stream in node.outputs)
        if readers:
            raise PipelineError(f"computation {name!r} is read by {readers}: remove those first")
        if sinks:  # sinks are set when the pipeline starts: none can be removed while it runs
            raise PipelineError(f"computation {name!r} feeds sink(s) {sinks}, which cannot be removed while the "
                                "pipeline runs: stop it and run the pipeline without them and without "
                                f"{name!r}")
        query = self._queries.pop(name, None)
        if query is not None:
            query.stop()
            statestore.note_stopped(self._namespaces.pop(name, ()))
        if self.publisher is not None:
            self.publisher.publish_committed(name)
        self.commits.pop(name, None)
        self.plans.pop(name)
        changed = _copy_pipeline(self.pipeline)
        del changed.computations[name]
        self.pipeline = changed
        self._write_layout()

    def _positions_now(self, plan: ComputationPlan) -> dict[str, Any]:
        """Where each sender of a new computation starts when it starts from now."""
        positions: dict[str, Any] = {}
        for sender in plan.senders():
            if sender.partition is None:
                positions[sender.name] = PublicationLog(self.root, sender.producer).head()
                continue
            for other, commit in self.commits.items():  # an existing reader of the same injector partition
                offset = commit.checkpoint.committed_offset()
                if offset and sender.name in offset["senders"]:
                    positions[sender.name] = offset["senders"][sender.name]["offset"]
                    break
        return positions

    def _start_query(self, name: str) -> Any:
        commit = self.commits[name]
        plan = commit.plan
        first = commit.source_reader
        spark = self.spark
        senders = []
        for sender in first.senders():
            node = self.pipeline.injectors.get(sender.producer)
            owner = bool(node) and self.pipeline.consumers(sender.stream)[0] == name
            senders.append(Sender(sender, node.injector if node else None, owner,
                                  node.on_malformed if node else ErrorPolicy.DEAD_LETTER,
                                  node.idle_after_ms if node else None, node.max_skew_ms if node else None,
                                  tuple(self.pipeline.downstream(sender.stream)) if node else ()))
        labels = self.group_labels
        assert labels is not None, "queries start after start() chose the key groups' labels"
        source_plan = SourcePlan(first, self.root, tuple(senders), wake_file(name), labels,
                                 batch_cap=self.batch_cap,
                                 start_positions=self._start_positions.get(name, {}))
        # The plan travels inside the registered class; options (printed in query plans) carry no plan.
        source = source_for(source_plan)
        spark.dataSource.register(source)
        rows = spark.readStream.format(source.name()).option("computation", first.name).load()
        namespaces = self._namespaces[name] = self._cache_namespaces(name)  # the fused ones', then plan's
        statestore.note_started(namespaces)
        stopped = statestore.stopped_namespaces()  # their caches go (statestore.drop_stopped)
        for weak, weak_namespace in zip(commit.fused, namespaces):
            rows = rows.groupBy("key_group").transformWithState(
                FusedProducerProcessor(weak, plan, self.root, weak_namespace, labels, stopped), FUSED_SCHEMA,
                "Update", "None")
        rows = rows.groupBy("key_group").transformWithState(
            KeyGroupProcessor(plan, self.root, namespaces[-1], labels, stopped), OUTPUT_SCHEMA, "Update", "None")
        query = (
            rows.writeStream.queryName(f"{self.pipeline.name}.{name}")
            .foreachBatch(BatchStager(self.root, commit, self.lease, self.publisher))  # type: ignore[arg-type]
            .option("checkpointLocation", commit.checkpoint.location)
            .trigger(processingTime=f"{self.trigger_ms} milliseconds")
            .start()
        )
        self._wait_until_initialized(query)
        return query

    def _wait_until_initialized(self, query: Any, limit_s: float = 60.0) -> None:
        """Spark gives a new query's Python source worker a hard-coded 10 s to connect back; several
        starting at once on a busy 2-core machine miss it. So queries start one after another."""
        deadline = time.time() + limit_s
        while time.time() < deadline and query.isActive and query.exception() is None:
            if query.status.get("message") != "Initializing sources":
                return
            time.sleep(0.1)

    def run(self, on_progress: Callable[[PipelineProgress], None] | None = None,
            progress_interval: float = 1.0, timeout: float | None = None,
            wall_timer_drain_s: float = WALL_TIMER_DRAIN_S) -> PipelineProgress:
        """Run until every injector has finished and every computation's low watermark reached
        END_OF_TIME, every published batch reached its sinks, and no wall-time timer is due within
        `wall_timer_drain_s` (later ones are left pending, listed in the returned progress's
        `pending_wall_timers`; the next run on the root fires them). Ctrl-C stops the queries cleanly
        (the next run resumes)."""
        self.start()
        deadline = None if timeout is None else time.time() + timeout
        try:
            while True:
                self.raise_if_failed()
                progress = self.progress()
                if on_progress is not None:
                    on_progress(progress)
                for note in self.feeds.take_notes():
                    warnings.warn(note, stacklevel=2)
                if progress.done and self._drained(progress, wall_timer_drain_s) and self._read_to_the_end(progress):
                    # The status files are shared with any driver that took over: done is ours to
                    # report only while our claims are still the newest.
                    self._check_still_in_charge()
                    return progress
                self.retention.maybe_prune(self.pipeline, self.commits, self.sinks)
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(f"pipeline not finished after {timeout} s: {progress}")
                time.sleep(progress_interval)
        finally:
            self.stop()

    def _check_still_in_charge(self) -> None:
        """Raise MillstreamRunError if another driver has claimed a newer epoch in any computation's
        log (the authority on who is in charge; the lease file is only a hint)."""
        for name in self.commits:
            claim = PublicationLog(self.root, name).last_claim()
            if claim is not None and claim["epoch"] != self.epoch:
                self.stop()
                raise MillstreamRunError(f"stopped: another driver took over this root (epoch {claim['epoch']} "
                                         f"claimed computation {name!r}; this driver has epoch {self.epoch})")

    def _read_to_the_end(self, progress: PipelineProgress) -> bool:
        """Every computation has read, and published, all its senders hold: each injector partition
        up to what it has now (this run's bounded DataFrames staged to their end), producers' logs
        to their last batch. Watermarks say so in a first run, not when an input that had finished
        (END_OF_TIME published) has more by the next run: such records move no watermark."""
        if not self.feeds.staged_to_the_end():
            return False
        for name, commit in self.commits.items():
            committed = commit.checkpoint.last_committed()
            if progress.computations[name].batches - 1 < committed:
                return False  # committed by Spark, not yet published
            offset = commit.checkpoint.end_offset(committed) if committed >= 0 else None
            read = offset["senders"] if offset else {}
            for sender in commit.source_reader.senders():
                at = read.get(sender.name, {})
                node = self.pipeline.injectors.get(sender.producer)
                if node is not None and sender.partition is not None:
                    start = at.get("offset") or node.injector.initial_offset(sender.partition)
                    if node.injector.latest_offset(sender.partition, start, None) != start:
                        return False
                elif node is None and sender.producer in self.commits:
                    if at.get("position", -1) < PublicationLog(self.root, sender.producer).last_read_position():
                        return False
        return True

    def _drained(self, progress: PipelineProgress, wall_timer_drain_s: float) -> bool:
        horizon = time.time() * 1000 + wall_timer_drain_s * 1000
        if any(t <= horizon for t in progress.pending_wall_timers.values()):
            return False
        return self.sinks is None or self.sinks.wait_idle(timeout=0.0)

    def raise_if_failed(self) -> None:
        """Raise the first failure as a MillstreamRunError. A transient start-up failure (a Python
        worker that did not connect back in time on a loaded machine) restarts the query from its
        checkpoint instead, a bounded number of times."""
        fenced = self.lease.fenced or (isinstance(self.publisher and self.publisher.failure, Fenced) and str(
            self.publisher.failure))  # type: ignore[union-attr]
        if fenced:
            self.stop()
            raise MillstreamRunError(f"stopped: {fenced}")
        for component in (self.publisher, self.sinks):
            if component is not None and component.failure is not None:
                self.stop()
                raise MillstreamRunError(str(component.failure)) from component.failure
        try:
            self.feeds.raise_if_failed(self.pipeline.name, self.log_dir)
        except MillstreamRunError:
            self.stop()
            raise
        for name, query in list(self._queries.items()):
            error = query.exception()
            if error is None:
                continue
            details = f"{error}\n{getattr(error, 'getStackTrace', lambda: '')()}"
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, "errors.log"), "a") as log:
                log.write(f"--- computation {name!r} failed at {time.ctime()}\n{details}\n")
            reported = reported_failure(self.root, name, self._started_ms)
            delay = restart_after(error, self._restarts.get(name, 0)) if reported is None else None
            if delay is not None:
                self._restarts[name] = self._restarts.get(name, 0) + 1
                time.sleep(delay)
                self._queries[name] = self._start_query(name)
                continue
            self.stop()
            message = reported or f"computation {name!r} failed: {user_error_message(str(error))}"
            raise MillstreamRunError(f"{message}\n(full trace in {os.path.join(self.log_dir, 'errors.log')})") from None

    def stop(self) -> None:
        self.feeds.stop()
        for query in self._queries.values():
            try:
                query.stop()
            except Exception:  # stopping a failed query can raise again; it is stopped either way
                pass
        self._queries.clear()
        statestore.note_stopped([n for names in self._namespaces.values() for n in names])
        self._namespaces.clear()
        self._remove_listener()
        if self.publisher is not None:
            try:
                self.publisher.catch_up()  # what the last batches committed before the stop
            except Exception:
                pass
            self.publisher.stop()
        if self.sinks is not None:
            self.sinks.wait_idle(timeout=60)
            self.sinks.stop()
        self.lease.release()

    # -- inspection ----------------------------------------------------------------------------
    def progress(self) -> PipelineProgress:
        return read_progress(self.storage, list(self.plans), set(self.pipeline.injectors))

    def watermark_history(self, computation: str) -> list[dict[str, int]]:
        """(batch, low_watermark, input_watermark, hold, wall_ms, ...) per published batch, oldest
        first (hold: the earliest hold of the computation's timers after the batch, or None; keyed
        watermarks: those the injectors declare)."""
        history = read_status_history(self.storage, computation)
        for entry in history:
            for field_name in ("keyed_watermarks", "keyed_input_watermarks"):
                if field_name in entry:
                    entry[field_name] = declared_keyed(entry[field_name])
        return history

    def read_stream(self, stream: str) -> list[Record[Any]]:
        """Every published record of a stream produced by computations, decoded."""
        producers = self.pipeline.producers(stream)
        if not producers:
            raise KeyError(f"unknown stream {stream!r}")
        if any(p in self.pipeline.injectors for p in producers):
            raise PipelineError(f"stream {stream!r} comes from an injector and is not logged; read its source")
        codec = self.pipeline.codec(stream)
        records = []
        for producer in producers:
            for _, entry in PublicationLog(self.root, producer).batches():
                for path, rows in entry["streams"].get(stream, []):
                    if not rows:
                        continue
                    table = pq.read_table(path, filesystem=self.storage.fs, schema=LOG_SCHEMA).to_pydict()
                    for key, value, ts, rid in zip(table["key"], table["value"], table["timestamp"], table["id"]):
                        records.append(Record(key, codec.decode(value), ts, rid))
        return records


def _copy_pipeline(pipeline: Pipeline) -> Pipeline:
    return Pipeline(pipeline.name, dict(pipeline.injectors), dict(pipeline.computations), dict(pipeline.sinks),
                    dict(pipeline.codecs))


def _last_published(log: PublicationLog) -> tuple[int, int]:
    """(batch, position) of the newest batch in a publication log; (-1, -1) if none."""
    position, entry = log.last_batch()
    return (entry["batch"], position) if entry is not None else (-1, -1)


def _copy_checkpoint(location: str, last_published: int) -> str:
    """A copy of a checkpoint for a driver taking over from one that may still run: cut back to the
    last published batch, in a new generation directory the old driver does not know."""
    source = Storage(location)
    parent, _, generation = location.rstrip("/").rpartition("/")
    number = int(generation[1:]) + 1 if generation.startswith("g") and generation[1:].isdigit() else 1
    target_location = f"{parent}/g{number:04d}"
    target = Storage(target_location)
    for attempt in range(CHECKPOINT_COPY_ATTEMPTS):
        target.delete("")
        try:
            pafs.copy_files(source.full_path(), target.full_path(), source_filesystem=source.fs,
                            destination_filesystem=target.fs)
            break
        except FileNotFoundError:
            # The running driver's Spark renamed or removed a file between the listing and its copy
            # (a state store's temporary file): list and copy again.
            if attempt == CHECKPOINT_COPY_ATTEMPTS - 1:
                raise
            time.sleep(0.2)
    for log_dir in ("offsets", "commits"):
        for name in target.list(log_dir):
            batch = name.lstrip(".").split(".")[0]
            if batch.isdigit() and int(batch) > last_published:
                target.delete(f"{log_dir}/{name}")
    return target_location


def _pickle_user_code_by_value(pipeline: Pipeline) -> None:
    """Spark's Python workers may not be able to import the user's modules (tests, notebooks,
    scripts, a project run with `millstream run`): ship them by value. Installed packages and
    millstream itself are imported normally. The user's code may sit inside millstream's own objects
    (a GeneratorInjector's function, a window's aggregator), so the pipeline's objects are walked."""
    from pyspark import cloudpickle

    objects: list[Any] = [n.computation for n in pipeline.computations.values()]
    objects += [n.injector for n in pipeline.injectors.values()]
    objects += [f for n in pipeline.computations.values() for f in n.inputs.values()]
    objects += [n.writer for n in pipeline.sinks.values() if n.writer is not None]
    for module_name in _modules_referenced(objects):
        if module_name != "__main__" and _users_module(module_name):
            try:
                cloudpickle.register_pickle_by_value(sys.modules[module_name])
            except ValueError:
                pass


def _users_module(name: str) -> bool:
    """Whether module `name` is the user's own: a loaded .py file that is neither millstream's, nor
    installed (site-packages), nor Python's own."""
    module = sys.modules.get(name)
    if module is None or name == "millstream" or name.startswith(("millstream.", "builtins")):
        return False
    path = getattr(module, "__file__", "") or ""
    return path.endswith(".py") and "site-packages" not in path and "dist-packages" not in path and \
        not path.startswith(sys.base_prefix)


# Items of one container the walk below looks into: a large table a computation holds (or a global its
# code names) is mostly items of the same few classes, and walking all of it would slow every start.
CONTAINER_ITEMS_WALKED = 1_000


def _modules_referenced(objects: list[Any], depth: int = 8) -> set[str]:
    """Modules of the classes, functions and modules reachable from `objects`, `depth` levels deep:
    through attributes, containers and closures; a class's bases and its methods; a function's
    globals it names (cloudpickle pickles those by reference unless their module goes by value)."""
    found: set[str] = set()
    seen: set[int] = set()
    frontier = list(objects)
    for _ in range(depth):
        following: list[Any] = []
        for obj in frontier:
            if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
                continue
            seen.add(id(obj))
            if isinstance(obj, types.ModuleType):
                found.add(obj.__name__)
                continue  # its contents travel with it, or are imported with it
            module = getattr(obj, "__module__", None) or type(obj).__module__
            if isinstance(module, str):
                found.add(module)
            if isinstance(obj, dict):
                following += islice(obj.values(), CONTAINER_ITEMS_WALKED)
            elif isinstance(obj, (list, tuple, set, frozenset)):
                following += islice(obj, CONTAINER_ITEMS_WALKED)
            elif isinstance(obj, (staticmethod, classmethod, property)):
                following += [getattr(obj, name, None) for name in ("__func__", "fget", "fset")]
            elif isinstance(obj, types.MethodType):
                following.append(obj.__func__)
            elif isinstance(obj, type):
                if isinstance(module, str) and _users_module(module):  # not millstream's classes, say
                    following += [base for base in obj.__mro__[1:] if base is not object]
                    following += list(vars(obj).values())  # methods, and what the class holds
            elif isinstance(obj, types.FunctionType):
                following += [c.cell_contents for c in (obj.__closure__ or ()) if _filled(c)]
                if isinstance(module, str) and _users_module(module):
                    names = _global_names(obj.__code__)
                    following += [value for name, value in obj.__globals__.items() if name in names]
            else:  # an instance (of millstream's classes too: they may hold the user's functions)
                following.append(type(obj))
                if hasattr(obj, "__dict__"):
                    following += list(vars(obj).values())
        frontier = following
    return found


def _global_names(code: types.CodeType) -> set[str]:
    """The names a function's code (its nested functions' and comprehensions' included) may look up
    as globals."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:  # an empty cell
        return False
