"""A deterministic in-process runner for unit-testing computations and whole pipelines, no Spark.

Like Kafka Streams' TopologyTestDriver: feed records, advance injector watermarks and the wall clock,
then inspect productions, state, pending timers and low watermarks. It runs the very ShardExecutor the
Spark runner runs, with the same sharding and serialization, and steps the way Spark micro-batches do:

    step: for each computation, in topological order
      1. coalesce its senders' published watermarks into its new input low watermark
      2. deliver its queued records, judged late against the input low watermark from before (the
         one they were sent under), then fire the timers due by the new one (Spark: one micro-batch,
         whose rows carry both watermarks)
      3. publish its output watermark: min(new input watermark, earliest pending low-watermark timer)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from millstream.core.executor import (
    Delivery,
    MemoryShardStore,
    Produced,
    ShardExecutor,
    StepMetrics,
)
from millstream.core.keystate import KeyState, Page
from millstream.core.plan import ComputationPlan, plan_computation, route
from millstream.core.watermarks import WatermarkCoalescer, output_watermark
from millstream.model.injector import Offset
from millstream.model.pipeline import Pipeline, PipelineError
from millstream.model.records import BEGINNING_OF_TIME, Record, Timer, derive_record_id


@dataclass
class _ComputationRun:
    plan: ComputationPlan
    executors: list[ShardExecutor]
    coalescer: WatermarkCoalescer
    queue: list[Delivery] = field(default_factory=list)
    output_watermark: int = BEGINNING_OF_TIME
    next_lw_timer: dict[int, int | None] = field(default_factory=dict)
    next_wall_timer: dict[int, int | None] = field(default_factory=dict)
    metrics: StepMetrics = field(default_factory=StepMetrics)
    watermark_history: list[int] = field(default_factory=list)


class PipelineHarness:
    def __init__(self, pipeline: Pipeline, shards: int = 4, pages_per_shard: int = 4,
                 wall_time: int = 0) -> None:
        pipeline.validate()
        self.pipeline = pipeline
        self.wall_time = wall_time
        self._order = pipeline.topological_order()
        self._runs: dict[str, _ComputationRun] = {}
        for name in self._order:
            plan = plan_computation(pipeline, name, shards, pages_per_shard)
            self._runs[name] = _ComputationRun(
                plan,
                [ShardExecutor(plan, MemoryShardStore()) for _ in range(shards)],
                WatermarkCoalescer(plan.sender_names()),
            )
        self._injector_watermarks = {name: BEGINNING_OF_TIME for name in pipeline.injectors}
        self._injector_offsets: dict[str, Offset] = {
            name: node.injector.initial_offset() for name, node in pipeline.injectors.items()
        }
        self._fed = {name: 0 for name in pipeline.injectors}
        self._outputs: dict[str, list[Produced]] = {s: [] for s in pipeline.streams()}

    # -- driving -------------------------------------------------------------------------------
    def feed(self, injector: str, records: Iterable[Record], watermark: int | None = None) -> None:
        """Inject records as if injector `injector` had read them (ids assigned when missing), then
        optionally publish its new low watermark. Nothing is processed until `step`/`run`."""
        node = self._injector(injector)
        produced = []
        for record in records:
            record_id = record.id or derive_record_id(injector, "feed", self._fed[injector])
            self._fed[injector] += 1
            produced.append(Produced(node.stream, record.key, self.pipeline.codec(node.stream).encode(record.value),
                                     record.timestamp, record_id))
        self._publish(injector, produced)
        if watermark is not None:
            self.advance_watermark(injector, watermark)

    def advance_watermark(self, injector: str, watermark: int) -> None:
        self._injector(injector)
        if watermark < self._injector_watermarks[injector]:
            raise ValueError(
                f"injector {injector!r} watermark cannot go back from "
                f"{self._injector_watermarks[injector]} to {watermark}"
            )
        self._injector_watermarks[injector] = watermark

    def advance_wall_time(self, wall_time: int) -> None:
        if wall_time < self.wall_time:
            raise ValueError("the wall clock does not go back")
        self.wall_time = wall_time

    def pull_injectors(self, max_records: int | None = None) -> bool:
        """Read what each injector has available (at most `max_records` each) through the Injector
        contract, as the Spark runner does. Returns True if anything moved."""
        moved = False
        for name, node in self.pipeline.injectors.items():
            start = self._injector_offsets[name]
            end = node.injector.latest_offset(start, max_records)
            if end != start:
                produced = [
                    Produced(node.stream, r.key, self.pipeline.codec(node.stream).encode(r.value), r.timestamp, r.id)
                    for r in node.injector.read(start, end)
                ]
                self._publish(name, produced)
                self._injector_offsets[name] = end
                moved = True
            watermark = node.injector.low_watermark(end)
            if watermark > self._injector_watermarks[name]:
                self._injector_watermarks[name] = watermark
                moved = True
        return moved

    def step(self) -> bool:
        """One round over all computations (see the module doc). Returns True if anything happened."""
        busy = False
        for name in self._order:
            run = self._runs[name]
            deliveries, run.queue = run.queue, []
            before = run.coalescer.coalesced
            for sender in run.plan.sender_names():
                stream, producer = sender.split("/", 1)
                run.coalescer.observe(sender, self._published_watermark(producer))
            busy |= self._run_shards(run, deliveries, before, run.coalescer.coalesced)
            busy |= run.coalescer.coalesced != before
            pending = [t for t in run.next_lw_timer.values() if t is not None]
            new_output = output_watermark(run.coalescer.coalesced, min(pending) if pending else None)
            run.output_watermark = max(run.output_watermark, new_output)
            run.watermark_history.append(run.output_watermark)
        return busy

    def run(self, max_steps: int = 10_000) -> None:
        """Step until nothing changes (all queues empty, watermarks settled)."""
        for _ in range(max_steps):
            if not self.step():
                return
        raise RuntimeError(f"pipeline did not settle within {max_steps} steps")

    def run_injectors(self, max_records_per_step: int | None = None, max_steps: int = 100_000) -> None:
        """Pull from the real injectors step by step until they finish and the pipeline settles."""
        for _ in range(max_steps):
            moved = self.pull_injectors(max_records_per_step)
            busy = self.step()
            if not moved and not busy:
                return
        raise RuntimeError(f"pipeline did not finish within {max_steps} steps")

    # -- inspecting ----------------------------------------------------------------------------
    def output(self, stream: str) -> list[Record]:
        """Every record produced on `stream` so far, decoded, in production order."""
        if stream not in self._outputs:
            raise KeyError(f"unknown stream {stream!r}")
        codec = self.pipeline.codec(stream)
        return [Record(p.key, codec.decode(p.value), p.timestamp, p.id) for p in self._outputs[stream]]

    def low_watermark(self, computation: str) -> int:
        """The computation's published (output) low watermark."""
        return self._run(computation).output_watermark

    def input_watermark(self, computation: str) -> int:
        return self._run(computation).coalescer.coalesced

    def watermark_history(self, computation: str) -> list[int]:
        return list(self._run(computation).watermark_history)

    def metrics(self, computation: str) -> StepMetrics:
        return self._run(computation).metrics

    def state(self, computation: str, key: str) -> dict[str, Any]:
        """Decoded persistent state of one key, by state name (absent states omitted)."""
        run = self._run(computation)
        key_state = self._key_state(run, key)
        values = {}
        for name, spec in run.plan.state_specs.items():
            if name in key_state.encoded:
                values[name] = key_state.value(spec)
        return values

    def pending_timers(self, computation: str, key: str) -> list[Timer]:
        return sorted(self._key_state(self._run(computation), key).timers.values())

    # -- internals -----------------------------------------------------------------------------
    def _run_shards(self, run: _ComputationRun, deliveries: list[Delivery], low_watermark: int,
                    advanced_watermark: int) -> bool:
        plan = run.plan
        by_shard: dict[int, list[Delivery]] = {}
        for delivery in deliveries:
            by_shard.setdefault(route(delivery.key, plan.shards, plan.pages_per_shard)[0], []).append(delivery)
        busy = False
        for shard, executor in enumerate(run.executors):
            due_lw = run.next_lw_timer.get(shard)
            due_wall = run.next_wall_timer.get(shard)
            has_due = (due_lw is not None and due_lw <= advanced_watermark) or (
                due_wall is not None and due_wall <= self.wall_time
            )
            if shard not in by_shard and not has_due:
                continue
            result = executor.step(by_shard.get(shard, []), low_watermark, self.wall_time, advanced_watermark)
            run.next_lw_timer[shard] = result.next_lw_timer
            run.next_wall_timer[shard] = result.next_wall_timer
            run.metrics.add(result.metrics)
            self._publish(plan.name, result.productions)
            busy = True
        return busy

    def _publish(self, producer: str, produced: list[Produced]) -> None:
        for item in produced:
            self._outputs[item.stream].append(item)
            codec = self.pipeline.codec(item.stream)
            for consumer in self.pipeline.consumers(item.stream):
                run = self._runs[consumer]
                record = Record(item.key, codec.decode(item.value), item.timestamp, item.id)
                key = run.plan.input(item.stream).key_of(record, consumer)
                run.queue.append(Delivery(key, item.stream, record))

    def _published_watermark(self, producer: str) -> int:
        if producer in self._injector_watermarks:
            return self._injector_watermarks[producer]
        return self._runs[producer].output_watermark

    def _key_state(self, run: _ComputationRun, key: str) -> KeyState:
        shard, page_id = route(key, run.plan.shards, run.plan.pages_per_shard)
        blob = run.executors[shard].store.load_page(page_id)
        return (Page.loads(blob) if blob else Page()).key_state(key)

    def _run(self, computation: str) -> _ComputationRun:
        if computation not in self._runs:
            raise KeyError(f"unknown computation {computation!r}; known: {sorted(self._runs)}")
        return self._runs[computation]

    def _injector(self, name: str) -> Any:
        if name not in self.pipeline.injectors:
            raise PipelineError(f"unknown injector {name!r}; known: {sorted(self.pipeline.injectors)}")
        return self.pipeline.injectors[name]
