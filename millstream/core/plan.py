"""What a runner needs to execute one computation, derived from the pipeline once.

A plan is picklable: the Spark runner ships it to Python workers inside the source and the stateful
operator, the harness uses it in-process. Both run it through the same ShardExecutor.

Routing lives here, once: a key belongs to key group `xxh3_64(key) mod key_groups`. Key groups are
MillWheel's key intervals: fixed for the life of a pipeline root, they are the unit of state Spark
moves between tasks (Spark hashes key groups into its state partitions, whose number can change).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Collection

import xxhash

from millstream.model.codecs import DEFAULT_CODEC, Codec
from millstream.model.computation import Computation
from millstream.model.pipeline import (
    DEAD_LETTERS,
    UNHELD_WATERMARK_KEY,
    ErrorPolicy,
    KeyExtractor,
    Pipeline,
    PipelineError,
    record_key,
)
from millstream.model.records import Record
from millstream.model.state import ListState, MapState, StateSpec, ValueState

if TYPE_CHECKING:
    from millstream.core.watermarks import WatermarkCoalescer

DEFAULT_KEY_GROUPS = 32


def check_whole(name: str, value: Any, minimum: int = 1, what: str = "a whole number", none: str = "") -> None:
    """Refuse an option that is not an int (a bool is not) >= `minimum`, naming it and what it got;
    `none`: what None means, if it is allowed.

    >>> check_whole("key_groups", 8)
    >>> check_whole("key_groups", 2.5)
    Traceback (most recent call last):
    ...
    TypeError: key_groups must be a whole number >= 1, got 2.5
    """
    if value is None and none:
        return
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or value < minimum:
        raise (ValueError if whole else TypeError)(
            f"{name} must be {what} >= {minimum}{f' (or None {none})' if none else ''}, got {value!r}")


def key_group(key: str, key_groups: int) -> int:
    """The key group of a key: a fast, stable 64-bit hash (Python's hash() is salted per process)."""
    return xxhash.xxh3_64_intdigest(key.encode()) % key_groups


@dataclass(frozen=True)
class SenderPlan:
    """One sender into a computation: a computation's stream log, or one partition of an injector.
    The coalescer tracks each separately; an injector's watermark is the minimum over its partitions."""

    name: str
    stream: str
    producer: str
    partition: str | None  # injector partition; None for a computation's stream log
    dedup: bool  # only injected records can arrive twice: internal streams are exactly-once
    watermark_keys: tuple[str, ...] = ()  # the keyed watermarks this sender publishes

    @property
    def is_injector(self) -> bool:
        return self.partition is not None


def sender_name(stream: str, producer: str, partition: str | None = None) -> str:
    """How a computation names one of its senders: the stream, its producer, and for an injector the
    partition.

    >>> sender_name("clicks", "ingest", "p0"), sender_name("windows", "count")
    ('clicks/ingest#p0', 'windows/count')
    """
    return f"{stream}/{producer}" if partition is None else f"{stream}/{producer}#{partition}"


def producer_of(sender: str) -> str:
    """The producer in a sender's name (`sender_name`).

    >>> producer_of("clicks/ingest#p0"), producer_of("windows/count")
    ('ingest', 'count')
    """
    return sender.split("/", 1)[1].split("#", 1)[0]


@dataclass(frozen=True)
class InputPlan:
    """One input stream of a computation, with the computation's own key extractor for it."""

    stream: str
    senders: tuple[SenderPlan, ...]
    key_extractor: KeyExtractor
    codec: Codec

    @property
    def keyed_by_record_key(self) -> bool:
        return self.key_extractor is record_key

    def key_of(self, record: Record[Any]) -> str:
        """The consumer's key for `record`; raises KeyExtractionError naming the stream."""
        try:
            key = self.key_extractor(record)
        except Exception as error:
            raise KeyExtractionError(self.stream, error) from error
        if not isinstance(key, str):
            raise KeyExtractionError(self.stream, TypeError(f"returned {type(key).__name__} {key!r}; keys must be str"))
        return key


class KeyExtractionError(Exception):
    """A key extractor failed on a record (handled by the computation's error policy)."""

    def __init__(self, stream: str, error: BaseException) -> None:
        super().__init__(f"key extractor for stream {stream!r} failed: {type(error).__name__}: {error}")
        self.stream = stream
        self.error = error


@dataclass(frozen=True)
class ComputationPlan:
    name: str
    pipeline: str
    computation: Computation
    inputs: tuple[InputPlan, ...]
    output_codecs: dict[str, Codec]
    state_specs: dict[str, StateSpec]
    dedup_horizon_ms: int
    on_error: ErrorPolicy = ErrorPolicy.FAIL
    exactly_once: bool = True
    key_groups: int = DEFAULT_KEY_GROUPS
    # Identifies this plan's computation instance across pickling: a runner ships the plan to its
    # workers in every task, and each task unpickles a new copy of the computation; a worker process
    # sets the instance up once and runs every later copy's work on that one (spark/operator.py).
    instance: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)

    @cached_property  # asked once per key and step (a frozen dataclass's __dict__ takes it)
    def batched(self) -> bool:
        """The computation takes a key's records of an input point in one call (process_records)."""
        return type(self.computation).process_records is not Computation.process_records

    def input(self, stream: str) -> InputPlan:
        for plan in self.inputs:
            if plan.stream == stream:
                return plan
        raise KeyError(stream)

    def senders(self) -> list[SenderPlan]:
        """Every sender, in the fixed order a step's input points follow."""
        return sorted((s for i in self.inputs for s in i.senders), key=lambda s: s.name)

    def sender_names(self) -> list[str]:
        return [s.name for s in self.senders()]

    def coalescer(self) -> "WatermarkCoalescer":
        """A coalescer for this computation's senders, grouped by input stream."""
        from millstream.core.watermarks import WatermarkCoalescer

        return WatermarkCoalescer(self.sender_names(), groups=self.sender_groups(), keyed=self.keyed_senders())

    def sender_groups(self) -> dict[str, list[str]]:
        return {i.stream: [s.name for s in i.senders] for i in self.inputs}

    def keyed_senders(self) -> dict[str, list[str]]:
        """Watermark key -> the senders that carry it."""
        carriers: dict[str, list[str]] = {}
        for sender in self.senders():
            for key in sender.watermark_keys:
                carriers.setdefault(key, []).append(sender.name)
        return carriers

    @property
    def watermark_keys(self) -> tuple[str, ...]:
        """The keyed watermarks this computation's inputs carry (and it forwards) that user code may
        name: the unheld one (UNHELD_WATERMARK_KEY, for the skew limit) is the runners' own."""
        return tuple(sorted(key for key in self.keyed_senders() if key != UNHELD_WATERMARK_KEY))

    @cached_property
    def ttls(self) -> dict[str, int]:
        return {name: spec.ttl_ms for name, spec in self.state_specs.items() if spec.ttl_ms is not None}


def plan_computation(pipeline: Pipeline, name: str, key_groups: int = DEFAULT_KEY_GROUPS,
                     fused: Collection[str] = ()) -> ComputationPlan:
    """`name`'s plan. `fused`: computations run inside their consumer's Spark query (weak
    productions, Pipeline.weak_fusions), which publish no log of their own: their dead letters
    travel in their consumer's, so a reader of dead letters has no sender for them."""
    pipeline.validate()
    node = pipeline.computations[name]
    inputs = []
    for stream, extractor in sorted(node.inputs.items()):
        senders = []
        for producer in pipeline.producers(stream):
            if stream == DEAD_LETTERS and (producer == name or producer in fused):
                continue  # a computation reading dead letters does not receive its own
            if producer in pipeline.injectors:
                for partition in pipeline.injectors[producer].injector.partitions():
                    senders.append(SenderPlan(sender_name(stream, producer, partition), stream, producer, partition,
                                              dedup=node.exactly_once,
                                              watermark_keys=pipeline.watermark_keys(producer)))
            else:
                keys = () if stream == DEAD_LETTERS else pipeline.watermark_keys(producer)
                senders.append(SenderPlan(sender_name(stream, producer), stream, producer, None, dedup=False,
                                          watermark_keys=keys))
        inputs.append(InputPlan(stream, tuple(senders), extractor, pipeline.codec(stream)))
    outputs = {stream: pipeline.codec(stream) for stream in node.outputs}
    outputs[DEAD_LETTERS] = DEFAULT_CODEC
    return ComputationPlan(
        name=name,
        pipeline=pipeline.name,
        computation=node.computation,
        inputs=tuple(inputs),
        output_codecs=outputs,
        state_specs=declared_state(node.computation),
        dedup_horizon_ms=node.dedup_horizon_ms,
        on_error=node.on_error,
        exactly_once=node.exactly_once,
        key_groups=key_groups,
    )


def declared_state(computation: Computation) -> dict[str, StateSpec]:
    """State declarations found on the computation's class (and its bases)."""
    found: dict[str, StateSpec] = {}
    for klass in reversed(type(computation).__mro__):
        for attr, value in vars(klass).items():
            if isinstance(value, (ValueState, ListState, MapState)):
                previous = found.get(value.name)
                if previous is not None and previous is not value:
                    raise PipelineError(
                        f"{type(computation).__name__} declares two states named {value.name!r} ({attr})"
                    )
                found[value.name] = value
    return found
