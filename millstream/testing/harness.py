"""A deterministic in-process runner for unit-testing computations and whole pipelines, no Spark.

Like Kafka Streams' TopologyTestDriver: feed records, advance injector watermarks and the wall clock,
then inspect productions, state, pending timers and low watermarks. It runs the very executor the
Spark runner runs, with the same routing and serialization, and the same input points:

    step: for each computation, in topological order
      1. take what each of its senders published since the last step, sender by sender (in name
         order), each publication point becoming one input point of the step (watermarks.Segment)
      2. run the step on every key group (deliver each point's records judged against the watermark
         before it, fire the timers each point's watermark made due)
      3. publish its productions point by point, each with its output watermark

A feed (or a watermark advance) of an injector is one publication point of that injector; a
computation's step publishes one point per input point. Spark runs the same points however it
batches them, which is why the conformance test can demand record-for-record equality.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, cast

from millstream.core.deadletters import dead_letter, describe_error
from millstream.core.production import Produced, output_order
from millstream.core.executor import (ComputationFailed, Delivery, KeyGroupExecutor, StepMetrics, inspect_key,
                                      key_or_dead_letter)
from millstream.core.plan import ComputationPlan, check_whole, key_group, plan_computation, sender_name
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import (Segment, WatermarkCoalescer, declared_keyed, earliest_holds,
                                        output_keyed_watermarks, output_watermarks, published_idle, published_keyed,
                                        skew_watermark, too_far_ahead, weak_hold_refused)
from millstream.model.codecs import Codec, CodecError
from millstream.model.injector import Injector, Malformed, Offset, check_injected, refusal, refused_value
from millstream.model.pipeline import (DEAD_LETTERS, UNHELD_WATERMARK_KEY, ErrorPolicy, Pipeline, PipelineError,
                                      Production)
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, Timer, derive_record_id, timestamp_problem

# A paced input is polled at least this often while a run waits for it (its clock may be coarse).
_LONGEST_ARRIVAL_WAIT_S = 0.2


class InjectorFailed(RuntimeError):
    """An injector read input it could not parse, under on_malformed="fail"."""


@dataclass
class _Point:
    """What one sender published at one point: records and its watermark after them."""

    records: list[Produced]
    watermark: int
    rejected: list[Produced] = field(default_factory=list)  # dead letters made before the computation
    idle: bool = False  # the sender declares itself idle after this point
    keyed: dict[str, int] = field(default_factory=dict)  # its keyed watermarks after it


@dataclass
class _ComputationRun:
    plan: ComputationPlan
    executors: list[KeyGroupExecutor]
    coalescer: WatermarkCoalescer
    output_watermark: int = BEGINNING_OF_TIME
    output_keyed: dict[str, int] = field(default_factory=dict)  # published keyed watermarks
    metrics: StepMetrics = field(default_factory=StepMetrics)
    watermark_history: list[int] = field(default_factory=list)


def _encoded(codec: Codec, record: Record[Any], injector: Injector, name: str, stream: str) -> bytes | Malformed:
    try:
        return codec.encode(record.value)
    except CodecError as error:
        return refused_value(injector, record, error, name, stream)


def _check_time(what: str, value: Any) -> None:
    """Refuse a time that is not int milliseconds in range (a float would reach user code's
    ctx.low_watermark or ctx.wall_time, and fail there as if the user's code were wrong)."""
    problem = timestamp_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")


class HarnessStopped(RuntimeError):
    """The harness was asked to go on after a step failed (PipelineHarness.step)."""


class PipelineHarness:
    """Runs a pipeline in-process.

    >>> from millstream import Computation, Pipeline, Record, ScriptedInjector
    >>> class Echo(Computation):
    ...     def process_record(self, ctx, record):
    ...         ctx.produce(record, "out")
    >>> harness = PipelineHarness(Pipeline("p")
    ...     .add_injector("src", ScriptedInjector("src", []), "in")
    ...     .add_computation("echo", Echo(), ["in"], ["out"]))
    >>> harness.feed("src", [Record("k", "hello", 5)], watermark=10)
    >>> harness.run()
    >>> [(r.key, r.value) for r in harness.output("out")], harness.low_watermark("echo")
    ([('k', 'hello')], 10)
    """

    def __init__(self, pipeline: Pipeline, key_groups: int = 4, wall_time: int = 0) -> None:
        check_whole("key_groups", key_groups)
        pipeline.validate()
        self.pipeline = pipeline
        self.wall_time = wall_time
        self._order = pipeline.topological_order()
        self._runs: dict[str, _ComputationRun] = {}
        for name in self._order:
            plan = plan_computation(pipeline, name, key_groups)
            plan.computation.setup(_info(plan))
            self._runs[name] = _ComputationRun(
                plan,
                [KeyGroupExecutor(plan, MemoryKeyStore()) for _ in range(key_groups)],
                plan.coalescer(),
            )
        self._watermarks: dict[tuple[str, str], int] = {}
        self._keyed: dict[tuple[str, str], dict[str, int]] = {}  # injector partitions' keyed watermarks
        self._offsets: dict[tuple[str, str], Offset] = {}
        for name, node in pipeline.injectors.items():
            for partition in node.injector.partitions():
                self._watermarks[(name, partition)] = BEGINNING_OF_TIME
                self._keyed[(name, partition)] = {key: BEGINNING_OF_TIME for key in pipeline.watermark_keys(name)}
                self._offsets[(name, partition)] = node.injector.initial_offset(partition)
        self._fed = {name: 0 for name in pipeline.injectors}
        # Injector partitions: the wall time they last moved, and whether they declared themselves idle.
        self._active: dict[tuple[str, str], int] = {k: wall_time for k in self._watermarks}
        self._idle: set[tuple[str, str]] = set()
        # Publication points not yet consumed, per (consumer, sender name).
        self._pending: dict[tuple[str, str], list[_Point]] = {}
        self._outputs: dict[str, list[Produced]] = {s: [] for s in pipeline.streams()}
        self._stopped_by: str | None = None  # the failure a step raised: nothing more runs (step())

    # -- driving -------------------------------------------------------------------------------
    def feed(self, injector: str, records: Iterable[Record[Any]], watermark: int | None = None,
             partition: str | None = None, keyed: dict[str, int] | None = None) -> None:
        """Inject records as if injector `injector` had read them (ids assigned when missing) and
        optionally publish its new low watermark (and keyed watermarks, `keyed`): one publication
        point. Nothing is processed until `step`/`run`."""
        self._check_going()
        node = self._injector(injector)
        partition = self._partition(injector, partition)
        if isinstance(records, Record) or not hasattr(records, "__iter__"):
            raise TypeError(f"feed({injector!r}, ...) takes records (a list of them), got {records!r:.60}; "
                            "wrap one record in a list")
        produced: list[Produced] = []
        codec = self.pipeline.codec(node.stream)
        for record in records:
            check_injected(record, injector)
            record_id = record.id or derive_record_id(injector, "feed", self._fed[injector])
            self._fed[injector] += 1
            try:  # records a test feeds are built by its code: a value the codec refuses is a mistake
                value = codec.encode(record.value)
            except CodecError as error:
                raise refusal(record, error, injector, node.stream) from None
            produced.append(Produced(node.stream, record.key, value, record.timestamp, record_id, 0, len(produced)))
        if watermark is not None:
            self._set_watermark(injector, partition, watermark)
        self._set_keyed(injector, partition, keyed or {})
        self._publish_injector(injector, partition, produced, [])

    def advance_watermark(self, injector: str, watermark: int | None = None, partition: str | None = None,
                          keyed: dict[str, int] | None = None) -> None:
        """Publish a new low watermark (and keyed watermarks, `keyed`) of an injector (partition),
        without records."""
        self._check_going()
        self._injector(injector)
        partition = self._partition(injector, partition)
        if watermark is not None:
            self._set_watermark(injector, partition, watermark)
        self._set_keyed(injector, partition, keyed or {})
        self._publish_injector(injector, partition, [], [])

    def declare_idle(self, injector: str, partition: str | None = None) -> None:
        """Publish that an injector (partition) is idle, as it would after `idle_after_ms` without
        anything new: its consumers leave it out of their watermark until it publishes again."""
        self._check_going()
        self._injector(injector)
        partition = self._partition(injector, partition)
        self._idle.add((injector, partition))
        self._publish_injector(injector, partition, [], [], idle=True)

    def advance_wall_time(self, wall_time: int) -> None:
        self._check_going()
        _check_time("the wall time", wall_time)
        if wall_time < self.wall_time:
            raise ValueError("the wall clock does not go back")
        self.wall_time = wall_time

    def pull_injectors(self, max_records: int | None = None) -> bool:
        """Read what each injector partition has available (at most `max_records` each) through the
        Injector contract, as the Spark runner does: one publication point per partition that moved.
        Returns True if anything moved."""
        self._check_going()
        moved = False
        for name, node in self.pipeline.injectors.items():
            codec = self.pipeline.codec(node.stream)
            downstream = [skew_watermark(self._runs[c].output_watermark, self._runs[c].output_keyed)
                          for c in self.pipeline.downstream(node.stream)]
            for partition in node.injector.partitions():
                # The harness's injectors start at the beginning of time.
                if too_far_ahead(self._watermarks[(name, partition)], downstream, node.max_skew_ms, BEGINNING_OF_TIME):
                    continue  # the skew limit: wait for the stages behind to catch up
                start = self._offsets[(name, partition)]
                end = node.injector.latest_offset(partition, start, max_records)
                watermark = max(self._watermarks[(name, partition)], node.injector.low_watermark(partition, end))
                known = self._keyed[(name, partition)]
                keyed = published_keyed(known, node.injector.keyed_watermarks(partition, end), known)
                if end == start and watermark == self._watermarks[(name, partition)] and keyed == known:
                    quiet_for = self.wall_time - self._active[(name, partition)]
                    if node.idle_after_ms is not None and quiet_for >= node.idle_after_ms and \
                            (name, partition) not in self._idle:
                        self.declare_idle(name, partition)
                        moved = True
                    continue
                produced: list[Produced] = []
                rejected: list[Produced] = []
                if end != start:
                    for item in node.injector.read(partition, start, end):
                        if not isinstance(item, Malformed):
                            check_injected(item, name)
                            value = _encoded(codec, item, node.injector, name, node.stream)
                            if not isinstance(value, Malformed):
                                produced.append(Produced(node.stream, item.key, value, item.timestamp, item.id, 0,
                                                         len(produced)))
                                continue
                            item = value
                        rejected.append(self._malformed(name, partition, item))
                self._offsets[(name, partition)] = end
                self._watermarks[(name, partition)] = watermark
                self._keyed[(name, partition)] = keyed
                self._publish_injector(name, partition, produced, rejected)
                moved = True
        return moved

    def step(self) -> bool:
        """One round over all computations (see the module doc). Returns True if anything happened.
        A step that raises (ComputationFailed under the `fail` policy, say) stops the harness: what
        it did is partial (key groups stepped before the failing one saved, the points taken), as a
        crashed Spark batch's is, and Spark replays such a batch from its last commit; the harness
        cannot, so it refuses to go on (read what it holds; make a new one to run again)."""
        self._check_going()
        busy = False
        for name in self._order:
            try:
                busy |= self._step_computation(self._runs[name])
            except BaseException as error:
                self._stopped_by = f"computation {name!r}: {describe_error(error).splitlines()[0]:.200}"
                raise
        return busy

    def _check_going(self) -> None:
        if self._stopped_by is not None:
            raise HarnessStopped(f"the harness stopped at a failed step ({self._stopped_by}); what that step did is "
                                 "partial, so nothing more runs on it: make a new PipelineHarness to run again")

    def run(self, max_steps: int = 10_000) -> None:
        """Step until nothing changes (all published points consumed, watermarks settled)."""
        for _ in range(max_steps):
            if not self.step():
                return
        raise RuntimeError(f"pipeline did not settle within {max_steps} steps")

    def run_injectors(self, max_records_per_step: int | None = None, max_steps: int = 100_000) -> None:
        """Pull from the real injectors step by step until they finish and the pipeline settles.
        An injector paced by the clock (`Injector.next_arrival_s`) is waited for, in real time."""
        for _ in range(max_steps):
            moved = self.pull_injectors(max_records_per_step)
            busy = self.step()
            if not moved and not busy:
                wait = self._next_arrival_s()
                if wait is None:
                    return
                time.sleep(min(wait, _LONGEST_ARRIVAL_WAIT_S))
        raise RuntimeError(f"pipeline did not finish within {max_steps} steps")

    # -- inspecting ----------------------------------------------------------------------------
    def output(self, stream: str) -> list[Record[Any]]:
        """Every record produced on `stream` so far, decoded, in production order."""
        if stream not in self._outputs:
            raise KeyError(f"no stream {stream!r} in pipeline {self.pipeline.name!r}; its streams: "
                           f"{sorted(self._outputs)}")
        codec = self.pipeline.codec(stream)
        return [Record(p.key, codec.decode(p.value), p.timestamp, p.id) for p in self._outputs[stream]]

    def dead_letters(self) -> list[dict[str, Any]]:
        """The dead letters published so far (their values)."""
        return [r.value for r in self.output(DEAD_LETTERS)]

    def low_watermark(self, computation: str) -> int:
        """The computation's published (output) low watermark."""
        return self._run(computation).output_watermark

    def input_watermark(self, computation: str) -> int:
        return self._run(computation).coalescer.coalesced

    def keyed_watermarks(self, computation: str) -> dict[str, int]:
        """The computation's published (output) keyed watermarks, those the injectors declare."""
        return declared_keyed(self._run(computation).output_keyed)

    def watermark_history(self, computation: str) -> list[int]:
        return list(self._run(computation).watermark_history)

    def metrics(self, computation: str) -> StepMetrics:
        return self._run(computation).metrics

    def state(self, computation: str, key: str) -> dict[str, Any]:
        """Decoded persistent state of one key, by state name (absent states omitted)."""
        run = self._run(computation)
        return inspect_key(run.plan, self._blob(run, key))[0]

    def pending_timers(self, computation: str, key: str) -> list[Timer]:
        run = self._run(computation)
        return inspect_key(run.plan, self._blob(run, key))[1]

    def keys(self, computation: str) -> list[str]:
        """Every key the computation holds anything for."""
        run = self._run(computation)
        return sorted(k for store in _stores(run) for k in store.keys())

    def state_bytes(self, computation: str) -> int:
        """Bytes of the computation's encoded key state (values and timers; dedup ids apart)."""
        run = self._run(computation)
        return sum(len(b.blob) for store in _stores(run) for b in store.blobs.values())

    def dedup_ids(self, computation: str) -> list[tuple[str, str]]:
        """The (key, record id) pairs the computation still remembers to discard duplicates."""
        run = self._run(computation)
        return sorted((key, rid) for store in _stores(run) for key, rid, _ in store.dedup.entries())

    def next_wall_change(self) -> int | None:
        """The earliest wall time at which the pipeline would move with no new input: a wall-time
        timer falling due, or an injector partition (with `idle_after_ms`, not finished) declaring
        itself idle; None if none would. What a run that follows the real clock waits for."""
        times = [t for name in self._runs if (t := self.pending_wall_timers(name)) is not None]
        for name, node in self.pipeline.injectors.items():
            if node.idle_after_ms is None:
                continue
            for partition in node.injector.partitions():
                if (name, partition) not in self._idle and self._watermarks[(name, partition)] < END_OF_TIME:
                    times.append(self._active[(name, partition)] + node.idle_after_ms)
        return min(times) if times else None

    def _next_arrival_s(self) -> float | None:
        """The soonest any injector partition still to come says it has more (next_arrival_s)."""
        waits = [wait for name, partition in self.inputs_to_come()
                 if (wait := self.pipeline.injectors[name].injector.next_arrival_s(
                     partition, self._offsets[(name, partition)])) is not None]
        return min(waits) if waits else None

    def inputs_to_come(self) -> list[tuple[str, str]]:
        """The injector partitions that may still send: neither finished (their low watermark short of
        END_OF_TIME) nor declared idle. What a run to the end of the input waits for."""
        return [(name, partition) for name, node in self.pipeline.injectors.items()
                for partition in node.injector.partitions()
                if self._watermarks[(name, partition)] < END_OF_TIME and (name, partition) not in self._idle]

    def pending_wall_timers(self, computation: str) -> int | None:
        """The earliest wall-time timer still pending in the computation, if any."""
        times = [e.store.next_wall_time() for e in self._run(computation).executors]
        pending = [t for t in times if t is not None]
        return min(pending) if pending else None

    # -- internals -----------------------------------------------------------------------------
    def _step_computation(self, run: _ComputationRun) -> bool:
        plan = run.plan
        segments: list[Segment] = []
        deliveries: list[Delivery] = []
        rejected: list[Produced] = []
        for sender in plan.senders():
            points = self._pending.pop((plan.name, sender.name), [])
            input_plan = plan.input(sender.stream)
            for point in points:
                j = len(segments)
                segments.append(run.coalescer.advance(sender.name, point.watermark, point.idle, point.keyed))
                rejected.extend(p._replace(segment=j) for p in point.rejected)
                for item in point.records:
                    record = Record.encoded(item.key, item.value, input_plan.codec, item.timestamp, item.id)
                    key = key_or_dead_letter(plan, input_plan, record, sender.producer, j)
                    if isinstance(key, Produced):
                        rejected.append(key)
                    else:
                        deliveries.append(Delivery(key, sender.stream, record, j, sender.dedup))
        wall_due = any(e.store.next_wall_time() is not None and e.store.next_wall_time() <= self.wall_time  # type: ignore[operator]
                       for e in run.executors)
        if not segments:
            if not wall_due:
                return False
            segments.append(run.coalescer.hold())
        by_group: dict[int, list[Delivery]] = {}
        for delivery in deliveries:
            by_group.setdefault(key_group(delivery.key, plan.key_groups), []).append(delivery)
        produced: list[Produced] = []
        holds: list[int | None] | None = None
        for group, executor in enumerate(run.executors):
            result = executor.step(by_group.get(group, []), segments, self.wall_time,
                                   rejected if group == 0 else ())
            run.metrics.add(result.metrics)
            produced.extend(result.productions)
            holds = earliest_holds(holds, result.holds)
        if holds is not None and self.pipeline.computations[plan.name].production is Production.WEAK:
            raise ComputationFailed(weak_hold_refused(plan.name))  # as the Spark runner, which fuses it
        published = output_watermarks(run.output_watermark, segments, holds)
        idle = published_idle(segments, holds)
        published_keyed = output_keyed_watermarks(run.output_keyed, segments)
        run.output_watermark, run.output_keyed = published[-1], published_keyed[-1]
        run.watermark_history.append(run.output_watermark)
        produced.sort(key=output_order)
        for j, watermark in enumerate(published):
            self._publish(plan.name, [p for p in produced if p.segment == j], watermark, idle[j],
                          published_keyed[j])
        return True

    def _publish_injector(self, injector: str, partition: str, produced: list[Produced],
                          rejected: list[Produced], idle: bool = False) -> None:
        node = self.pipeline.injectors[injector]
        watermark = self._watermarks[(injector, partition)]
        known = self._keyed[(injector, partition)]
        self._keyed[(injector, partition)] = published_keyed(known, {}, known, watermark)  # its unheld one: watermark
        if not idle:
            self._active[(injector, partition)] = self.wall_time
            self._idle.discard((injector, partition))
        consumers = self.pipeline.consumers(node.stream)
        for stream_item in produced:
            self._outputs[node.stream].append(stream_item)
        for index, consumer in enumerate(consumers):
            # Malformed input becomes a dead letter once: published by the first consumer.
            point = _Point(list(produced), watermark, rejected if index == 0 else [], idle,
                           dict(self._keyed[(injector, partition)]))
            sender = sender_name(node.stream, injector, partition)
            self._pending.setdefault((consumer, sender), []).append(point)

    def _publish(self, producer: str, produced: list[Produced], watermark: int, idle: bool,
                 keyed: dict[str, int]) -> None:
        by_stream: dict[str, list[Produced]] = {}
        for item in produced:
            self._outputs[item.stream].append(item)
            by_stream.setdefault(item.stream, []).append(item)
        for stream in self.pipeline.outputs(producer):
            for consumer in self.pipeline.consumers(stream):
                point = _Point(by_stream.get(stream, []), watermark, idle=idle,
                               keyed={} if stream == DEAD_LETTERS else keyed)
                self._pending.setdefault((consumer, f"{stream}/{producer}"), []).append(point)

    def _malformed(self, injector: str, partition: str, item: Malformed) -> Produced:
        node = self.pipeline.injectors[injector]
        if node.on_malformed is ErrorPolicy.FAIL:
            raise InjectorFailed(f"injector {injector!r} (partition {partition!r}) read malformed input at "
                                 f"{item.position}: {item.error}")
        owner = self.pipeline.consumers(node.stream)[0] if self.pipeline.consumers(node.stream) else injector
        return dead_letter(owner, key=None, stream=node.stream, sender=injector, record_id=item.position,
                           timestamp=self._watermarks[(injector, partition)], value=item.raw, error=item.error,
                           segment=0, traceback_text=None)

    def _set_watermark(self, injector: str, partition: str, watermark: int) -> None:
        _check_time(f"injector {injector!r} watermark", watermark)
        current = self._watermarks[(injector, partition)]
        if watermark < current:
            raise ValueError(f"injector {injector!r} watermark cannot go back from {current} to {watermark}")
        self._watermarks[(injector, partition)] = watermark

    def _set_keyed(self, injector: str, partition: str, keyed: dict[str, int]) -> None:
        current = self._keyed[(injector, partition)]
        for key, watermark in keyed.items():
            if key not in current or key == UNHELD_WATERMARK_KEY:
                raise ValueError(f"injector {injector!r} publishes no watermark key {key!r}; its watermark_keys: "
                                 f"{sorted(declared_keyed(current))}")
            _check_time(f"injector {injector!r} keyed watermark {key!r}", watermark)
            if watermark < current[key]:
                raise ValueError(f"injector {injector!r} keyed watermark {key!r} cannot go back from "
                                 f"{current[key]} to {watermark}")
            current[key] = watermark

    def _partition(self, injector: str, partition: str | None) -> str:
        partitions = list(self.pipeline.injectors[injector].injector.partitions())
        if partition is None:
            if len(partitions) != 1:
                raise PipelineError(f"injector {injector!r} has partitions {partitions}: say which (partition=)")
            return partitions[0]
        if partition not in partitions:
            raise PipelineError(f"injector {injector!r} has no partition {partition!r}; known: {partitions}")
        return partition

    def _blob(self, run: _ComputationRun, key: str) -> bytes | None:
        if not isinstance(key, str):
            raise TypeError(f"keys are str, got {type(key).__name__} ({key!r:.40})")
        executor = run.executors[key_group(key, run.plan.key_groups)]
        return executor.store.load([key]).get(key)

    def _run(self, computation: str) -> _ComputationRun:
        if computation not in self._runs:
            raise KeyError(f"unknown computation {computation!r}; known: {sorted(self._runs)}")
        return self._runs[computation]

    def _injector(self, name: str) -> Any:
        if name not in self.pipeline.injectors:
            raise PipelineError(f"unknown injector {name!r}; known: {sorted(self.pipeline.injectors)}")
        return self.pipeline.injectors[name]


def _info(plan: ComputationPlan) -> Any:
    from millstream.model.computation import ComputationInfo

    return ComputationInfo(plan.name, plan.pipeline)


def _stores(run: Any) -> list[MemoryKeyStore]:
    """The harness's executors keep their state in memory (see __init__)."""
    return [cast(MemoryKeyStore, executor.store) for executor in run.executors]
