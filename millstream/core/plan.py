"""What a runner needs to execute one computation, derived from the pipeline once.

A plan is picklable: the Spark runner ships it to Python workers inside the source and the stateful
operator, the harness uses it in-process. Both run it through the same ShardExecutor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from millstream.model.codecs import Codec
from millstream.model.computation import Computation
from millstream.model.pipeline import KeyExtractor, Pipeline, PipelineError, record_key
from millstream.model.records import Record
from millstream.model.state import ListState, MapState, StateSpec, ValueState

DEFAULT_SHARDS = 8
DEFAULT_PAGES_PER_SHARD = 32
_UNDECODED = object()


@dataclass(frozen=True)
class InputPlan:
    """One input stream of a computation, with the computation's own key extractor for it."""

    stream: str
    producers: tuple[str, ...]
    key_extractor: KeyExtractor
    codec: Codec

    def key_of(self, record: Record, computation: str) -> str:
        """The consumer's key for `record`, checked: a bad extractor is the user's error to see."""
        try:
            key = self.key_extractor(record)
        except Exception as error:
            raise PipelineError(
                f"key extractor of computation {computation!r} for stream {self.stream!r} failed on "
                f"record {record.id!r}: {type(error).__name__}: {error}"
            ) from error
        if not isinstance(key, str):
            raise PipelineError(
                f"key extractor of computation {computation!r} for stream {self.stream!r} returned "
                f"{type(key).__name__} {key!r}; keys must be str"
            )
        return key

    def key_of_encoded(self, rkey: str, value: bytes, timestamp: int, rid: str, computation: str,
                       decoded: Any = _UNDECODED) -> str:
        """key_of for a record whose value is still encoded: the value is decoded only if the
        extractor is not the default one (the record's own key), and not at all if `decoded` is given."""
        if self.key_extractor is record_key:
            return rkey
        if decoded is _UNDECODED:
            decoded = self.codec.decode(value)
        return self.key_of(Record(rkey, decoded, timestamp, rid), computation)


@dataclass(frozen=True)
class ComputationPlan:
    name: str
    computation: Computation
    inputs: tuple[InputPlan, ...]
    output_codecs: dict[str, Codec]
    state_specs: dict[str, StateSpec]
    dedup_horizon_ms: int
    shards: int = DEFAULT_SHARDS
    pages_per_shard: int = DEFAULT_PAGES_PER_SHARD

    def input(self, stream: str) -> InputPlan:
        for plan in self.inputs:
            if plan.stream == stream:
                return plan
        raise KeyError(stream)

    def sender_names(self) -> list[str]:
        """The inputs the coalescer tracks: one per (stream, producer) pair."""
        return [sender_name(i.stream, p) for i in self.inputs for p in i.producers]


def sender_name(stream: str, producer: str) -> str:
    return f"{stream}/{producer}"


def plan_computation(
    pipeline: Pipeline,
    name: str,
    shards: int = DEFAULT_SHARDS,
    pages_per_shard: int = DEFAULT_PAGES_PER_SHARD,
) -> ComputationPlan:
    pipeline.validate()
    node = pipeline.computations[name]
    inputs = tuple(
        InputPlan(stream, tuple(pipeline.producers(stream)), extractor, pipeline.codec(stream))
        for stream, extractor in sorted(node.inputs.items())
    )
    return ComputationPlan(
        name=name,
        computation=node.computation,
        inputs=inputs,
        output_codecs={stream: pipeline.codec(stream) for stream in node.outputs},
        state_specs=declared_state(node.computation),
        dedup_horizon_ms=node.dedup_horizon_ms,
        shards=shards,
        pages_per_shard=pages_per_shard,
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


def key_hash(key: str) -> int:
    """Stable 64-bit hash of a key (Python's hash() is salted per process, so unusable here)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def route(key: str, shards: int, pages_per_shard: int) -> tuple[int, int]:
    """(shard, page) of a key. Shards are MillWheel's key intervals: the unit Spark groups by."""
    h = key_hash(key)
    return h % shards, (h // shards) % pages_per_shard
