"""The transformWithState processor that runs a computation's KeyGroupExecutor inside Spark.

Spark groups rows by key group (MillWheel's key interval), not by user key: the Python stateful
operator pays a fixed cost per grouping key per batch and a JVM round trip per state call, so each
key group keeps its keys in a few state variables (statestore.py) and runs all of them in one call.

Every key group receives at least one row per batch (the source's heartbeat), so every group runs the
batch's input points: delivers its records, then fires the timers the points made due. No Spark
timers are used. All state writes of a batch land in Spark's state store together when Spark
commits the batch: per-key atomicity, by construction.

The operator emits, per key group, its productions (bundled) and its step's counters; the writer
stage (writer.py) turns them into files on the executors.

Weak productions fuse a computation A into its consumer B's query, with no durable hop: A's operator
(FusedProducerProcessor) keys its productions with B's extractors and emits them as B's input rows,
bundled per B key group, in input order; B's operator runs exactly as if it read A's log. A publishes
its output watermark after each input point as the watermark there (all due work done), so B's input
points are A's, with the same watermarks: the batch plan passes through unchanged (so A cannot hold
its watermark: a step of A in which a timer holds fails, saying so). Key group g of A
also sends key group g of B its heartbeat, carrying A's counters for the driver.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Sequence

from millstream.core.executor import ComputationFailed, KeyGroupExecutor, StepResult, key_or_dead_letter
from millstream.core.garbage import bulk_work
from millstream.core.plan import ComputationPlan, key_group
from millstream.core.production import Produced
from millstream.core.store import KeyStore
from millstream.core.watermarks import Segment, weak_hold_refused
from millstream.model.computation import ComputationInfo
from millstream.model.pipeline import DEAD_LETTERS
from millstream.model.records import Record
from millstream.spark.bundles import (BUNDLE_RECORDS, FeedItem, deliveries_by_key, pack, pack_deliveries,
                                      pack_production_columns, pack_productions, unpack, unpack_deliveries,
                                      unpack_productions)
from millstream.spark.errors import report_failure
from millstream.spark.partitioning import GroupLabels
from millstream.spark.source import BatchPlan
from millstream.spark.statestore import SparkKeyStore, drop_stopped
from millstream.spark.worker_garbage import WORKER_GARBAGE

try:
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
except ImportError:  # pragma: no cover
    StatefulProcessor = object  # type: ignore
    StatefulProcessorHandle = Any  # type: ignore

METRICS = ("records", "duplicates", "late", "timers_fired", "productions", "dead_letters", "state_bytes",
           "pending_timers")
OUTPUT_SCHEMA = ("key_group int, productions binary, computation string, records long, duplicates long, "
                 "late long, timers_fired long, productions_count long, dead_letters long, state_bytes long, "
                 "pending_timers long, wake_wall long, bytes_written long, upstream_reports binary, "
                 "holds array<long>")
# A fused (weak) computation's output: its consumer's input rows, plus its own counters.
# `rejected`: the consumer's own dead letters (its key extractors'); `forwarded`: the fused computation's.
FUSED_SCHEMA = "key_group int, bundle binary, rejected binary, forwarded binary, plan binary, reports binary"

# The computation instances set up in this worker process, by plan instance (set up once per process,
# not per task).
_SET_UP: dict[str, Any] = {}


def _set_up(plan: ComputationPlan) -> ComputationPlan:
    """`plan` with the computation instance this process set up. Every task unpickles its own copy of
    the plan, computation included; the first copy a process sees is set up and kept, and every later
    task of the same plan runs on it (a copy that was never set up would lack the clients its setup()
    opens)."""
    computation = _SET_UP.get(plan.instance)
    if computation is None:
        plan.computation.setup(ComputationInfo(plan.name, plan.pipeline))
        computation = _SET_UP[plan.instance] = plan.computation
    return plan if computation is plan.computation else dataclasses.replace(plan, computation=computation)


def group_report(plan: ComputationPlan, group: int, result: StepResult, bytes_written: int) -> dict[str, Any]:
    m = result.metrics
    return {"computation": plan.name, "key_group": group, "records": m.records, "duplicates": m.duplicates,
            "late": m.late, "timers_fired": m.timers_fired, "productions": m.productions,
            "dead_letters": m.dead_letters, "state_bytes": m.state_bytes, "pending_timers": m.pending_timers,
            "wake_wall": result.wake_wall,
            "bytes_written": bytes_written, "holds": result.holds}


def output_rows(plan: ComputationPlan, group: int, result: StepResult, bytes_written: int,
                upstream_reports: bytes | None) -> Iterator[Any]:
    """The group's productions in bundles; the first row carries the step's counters."""
    productions = result.rows
    metrics = result.metrics
    first = True
    for start in range(0, max(len(productions), 1), BUNDLE_RECORDS):
        chunk = productions[start:start + BUNDLE_RECORDS]
        yield Row(key_group=group, productions=pack_production_columns(chunk) if chunk else None, computation=plan.name,
                  records=metrics.records if first else 0, duplicates=metrics.duplicates if first else 0,
                  late=metrics.late if first else 0, timers_fired=metrics.timers_fired if first else 0,
                  productions_count=metrics.productions if first else 0,
                  dead_letters=metrics.dead_letters if first else 0, state_bytes=metrics.state_bytes if first else 0,
                  pending_timers=metrics.pending_timers if first else 0,
                  wake_wall=result.wake_wall if first else None, bytes_written=bytes_written if first else 0,
                  upstream_reports=upstream_reports if first else None, holds=result.holds if first else None)
        first = False


class _GroupStep:
    """One key group's step inside Spark, shared by both processors."""

    def __init__(self, plan: ComputationPlan, root: str, namespace: str, handle: StatefulProcessorHandle,
                 stopped: Mapping[str, float]) -> None:
        self.plan, self.root, self.namespace = _set_up(plan), root, namespace
        drop_stopped(stopped)
        self.head = handle.getValueState("head", "blob binary")
        self.chunks = handle.getMapState("chunks", "id long", "blob binary")
        self.codecs = {i.stream: i.codec for i in plan.inputs}

    def run(self, group: int, rows: Iterator[Any]) -> tuple[StepResult, int, BatchPlan, list[Any]]:
        bundles: list[bytes] = []
        rejected: list[Any] = []
        forwarded: list[Any] = []
        upstream: list[Any] = []
        batch: bytes | None = None
        for row in rows:
            batch = row.plan
            if row.bundle:
                bundles.append(row.bundle)
            if row.rejected:
                rejected.extend(unpack_productions(row.rejected))
            if getattr(row, "forwarded", None):  # rows of a fused computation (FUSED_SCHEMA) only
                forwarded.extend(unpack_productions(row.forwarded))
            reports = getattr(row, "reports", None)
            if reports:
                upstream.extend(unpack(reports))
        plan = BatchPlan.loads(batch)  # type: ignore[arg-type]
        store = SparkKeyStore(self.head, self.chunks, self.namespace, group)
        try:
            result = step_bundles(self.plan, store, bundles, self.codecs, plan.segments, plan.wall_time, rejected,
                                  forwarded)
        except ComputationFailed as failure:
            report_failure(self.root, self.plan.name, str(failure))
            raise
        return result, store.bytes_written, plan, upstream


def step_bundles(plan: ComputationPlan, store: KeyStore, bundles: list[bytes], codecs: dict[str, Any],
                 segments: Sequence[Segment], wall_time: int, rejected: Sequence[Produced] = (),
                 forwarded: Sequence[Produced] = ()) -> StepResult:
    """A key group's step from its bundles, as every operator runs it (bench/core.py times this):
    the bundles are unpacked and stepped with the collector held back (core/garbage.py), and what
    is alive afterwards is frozen, so the daemon's collection after the task skips the caches."""
    with bulk_work():
        by_key = deliveries_by_key([unpack_deliveries(bundle) for bundle in bundles], codecs)
        result = KeyGroupExecutor(plan, store).step_keys(by_key, segments, wall_time, rejected, forwarded)
        WORKER_GARBAGE.settle()
    return result


class KeyGroupProcessor(StatefulProcessor):
    """A computation on Spark: one grouping key per key group (its label, partitioning.py).
    `stopped`: namespace -> stop time of the operators of queries the driver stopped before this one
    started (and not started again), whose caches the workers drop (statestore.drop_stopped)."""

    def __init__(self, plan: ComputationPlan, root: str, namespace: str, labels: GroupLabels,
                 stopped: Mapping[str, float] | None = None) -> None:
        self.plan = plan
        self.root = root
        self.namespace = namespace
        self.labels = labels
        self.stopped = dict(stopped or {})

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.step = _GroupStep(self.plan, self.root, self.namespace, handle, self.stopped)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        group = self.labels.group(key[0])
        result, bytes_written, _, upstream = self.step.run(group, rows)
        yield from output_rows(self.plan, group, result, bytes_written, pack(upstream) if upstream else None)

    def close(self) -> None:
        pass


class FusedProducerProcessor(StatefulProcessor):
    """A weak computation, fused ahead of its consumer in the consumer's query (see the module doc)."""

    def __init__(self, plan: ComputationPlan, consumer: ComputationPlan, root: str, namespace: str,
                 labels: GroupLabels, stopped: Mapping[str, float] | None = None) -> None:
        self.plan, self.consumer, self.root, self.namespace = plan, consumer, root, namespace
        self.labels = labels  # the consumer's key groups', the same as this one's (one root)
        self.stopped = dict(stopped or {})  # as KeyGroupProcessor's

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.step = _GroupStep(self.plan, self.root, self.namespace, handle, self.stopped)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        group = self.labels.group(key[0])
        result, bytes_written, batch, _ = self.step.run(group, rows)
        if result.holds is not None:  # B's input points carry A's input watermarks (the module doc)
            message = weak_hold_refused(self.plan.name)
            report_failure(self.root, self.plan.name, message)
            raise ComputationFailed(message)
        plan_blob = batch.dumps()
        by_group: dict[tuple[int, str], list[FeedItem]] = {}  # by the consumer's key group and the stream
        passthrough: list[Produced] = []
        forwarded: list[Produced] = []
        for item in result.productions:
            if item.stream == DEAD_LETTERS:
                forwarded.append(item)
                continue
            handed = self._hand_over(item)
            if isinstance(handed, Produced):
                passthrough.append(handed)
            else:
                by_group.setdefault((key_group(handed[0], self.consumer.key_groups), item.stream), []).append(handed)
        for (target, stream), items in sorted(by_group.items()):
            for start in range(0, len(items), BUNDLE_RECORDS):
                yield Row(key_group=self.labels.label(target),
                          bundle=pack_deliveries(stream, False, items[start:start + BUNDLE_RECORDS]),
                          rejected=None, forwarded=None, plan=plan_blob, reports=None)
        report = group_report(self.plan, group, result, bytes_written)
        yield Row(key_group=self.labels.label(group % self.consumer.key_groups), bundle=None,
                  rejected=pack_productions(passthrough) if passthrough else None,
                  forwarded=pack_productions(forwarded) if forwarded else None, plan=plan_blob, reports=pack([report]))

    def _hand_over(self, item: Produced) -> FeedItem | Produced:
        """A production as the consumer's delivery (keyed by its extractor for the stream)."""
        consumer = self.consumer
        input_plan = consumer.input(item.stream)
        key = item.key
        if not input_plan.keyed_by_record_key:
            record = Record.encoded(item.key, item.value, input_plan.codec, item.timestamp, item.id)
            try:
                found = key_or_dead_letter(consumer, input_plan, record, self.plan.name, item.segment)
            except ComputationFailed as failure:
                report_failure(self.root, consumer.name, str(failure))
                raise
            if isinstance(found, Produced):
                return found
            key = found
        return (key, item.key, item.value, item.timestamp, item.id, item.segment, item.order)

    def close(self) -> None:
        pass
