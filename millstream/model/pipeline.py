"""A pipeline: injectors, computations and sinks wired together by named streams.

Validated when built, with errors that name the user's own objects (never a Spark stack trace):
duplicate names, unknown streams, streams nobody produces, malformed key extractors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Mapping, Sequence

from millstream.model.codecs import DEFAULT_CODEC, Codec
from millstream.model.computation import Computation
from millstream.model.injector import Injector
from millstream.model.records import Record

KeyExtractor = Callable[[Record], str]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

# How long, in low-watermark milliseconds after a record arrives, its id is kept to discard
# duplicates. A duplicate arriving later than this is processed again.
DEFAULT_DEDUP_HORIZON_MS = 10 * 60 * 1000


class PipelineError(ValueError):
    """The pipeline is wired wrong; the message says what and where."""


class Production(str, Enum):
    """How a computation's productions reach its consumers (MillWheel section 5.4)."""

    STRONG = "strong"
    """Committed to a durable stream log atomically with the computation's checkpoint, and read by
    consumers from there: exactly-once output, one durable hop per edge."""
    WEAK = "weak"
    """The computation runs fused in its consumer's Spark query, with no durable hop in between:
    lower latency, but the pair restarts together and intermediate records are not kept."""


def record_key(record: Record) -> str:
    """The default key extractor: the key the producer gave the record."""
    return record.key


@dataclass(frozen=True)
class InjectorNode:
    name: str
    injector: Injector
    stream: str


@dataclass(frozen=True)
class ComputationNode:
    name: str
    computation: Computation
    inputs: Mapping[str, KeyExtractor]
    outputs: tuple[str, ...]
    production: Production = Production.STRONG
    dedup_horizon_ms: int = DEFAULT_DEDUP_HORIZON_MS


@dataclass(frozen=True)
class SinkNode:
    name: str
    stream: str
    format: str  # "jsonl" or "parquet"
    path: str


@dataclass
class Pipeline:
    """Build with add_injector / add_computation / add_sink; run with a runner."""

    name: str
    injectors: dict[str, InjectorNode] = field(default_factory=dict)
    computations: dict[str, ComputationNode] = field(default_factory=dict)
    sinks: dict[str, SinkNode] = field(default_factory=dict)
    codecs: dict[str, Codec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name("pipeline", self.name)

    # -- building -----------------------------------------------------------------------------
    def declare_stream(self, stream: str, codec: Codec) -> "Pipeline":
        """Give `stream` a codec other than the default JSON."""
        _check_name("stream", stream)
        if not (hasattr(codec, "encode") and hasattr(codec, "decode")):
            raise PipelineError(f"codec for stream {stream!r} needs encode() and decode()")
        self.codecs[stream] = codec
        return self

    def add_injector(self, name: str, injector: Injector, stream: str) -> "Pipeline":
        self._check_new_node(name)
        _check_name("stream", stream)
        if not isinstance(injector, Injector):
            raise PipelineError(f"injector {name!r} must be a millstream.Injector, got {type(injector).__name__}")
        self.injectors[name] = InjectorNode(name, injector, stream)
        return self

    def add_computation(
        self,
        name: str,
        computation: Computation,
        inputs: Mapping[str, KeyExtractor | None] | Sequence[str],
        outputs: Sequence[str] = (),
        production: Production | str = Production.STRONG,
        dedup_horizon_ms: int = DEFAULT_DEDUP_HORIZON_MS,
    ) -> "Pipeline":
        """`inputs` maps each input stream to this computation's key extractor for it (None: the
        record's own key); a plain list of stream names keys every input by record key."""
        self._check_new_node(name)
        if not isinstance(computation, Computation):
            raise PipelineError(
                f"computation {name!r} must be an instance of a millstream.Computation subclass, "
                f"got {type(computation).__name__}"
            )
        if isinstance(inputs, str):
            raise PipelineError(f"inputs of {name!r} must be a list or mapping of stream names, not a string")
        if not isinstance(inputs, Mapping):
            inputs = {stream: None for stream in inputs}
        if not inputs:
            raise PipelineError(f"computation {name!r} has no input stream")
        extractors: dict[str, KeyExtractor] = {}
        for stream, extractor in inputs.items():
            _check_name("stream", stream)
            if extractor is not None and not callable(extractor):
                raise PipelineError(f"key extractor of {name!r} for stream {stream!r} is not callable")
            extractors[stream] = extractor or record_key
        if isinstance(outputs, str):
            raise PipelineError(f"outputs of {name!r} must be a list of stream names, not a string")
        for stream in outputs:
            _check_name("stream", stream)
        if len(set(outputs)) != len(outputs):
            raise PipelineError(f"computation {name!r} lists an output stream twice")
        try:
            production = Production(production)
        except ValueError:
            raise PipelineError(f"production of {name!r} must be 'strong' or 'weak', got {production!r}") from None
        if dedup_horizon_ms < 0:
            raise PipelineError(f"dedup_horizon_ms of {name!r} must be >= 0")
        self.computations[name] = ComputationNode(
            name, computation, extractors, tuple(outputs), production, dedup_horizon_ms
        )
        return self

    def add_sink(self, name: str, stream: str, path: str, format: str = "jsonl") -> "Pipeline":
        """Materialize `stream` as files users can read: 'jsonl' (JSON lines) or 'parquet'."""
        self._check_new_node(name)
        _check_name("stream", stream)
        if format not in ("jsonl", "parquet"):
            raise PipelineError(f"sink {name!r}: format must be 'jsonl' or 'parquet', got {format!r}")
        self.sinks[name] = SinkNode(name, stream, format, str(path))
        return self

    # -- queries used by runners -------------------------------------------------------------
    def codec(self, stream: str) -> Codec:
        return self.codecs.get(stream, DEFAULT_CODEC)

    def producers(self, stream: str) -> list[str]:
        """Names of the injectors and computations that produce `stream`, in a stable order."""
        names = [n.name for n in self.injectors.values() if n.stream == stream]
        names += [n.name for n in self.computations.values() if stream in n.outputs]
        return sorted(names)

    def consumers(self, stream: str) -> list[str]:
        return sorted(n.name for n in self.computations.values() if stream in n.inputs)

    def streams(self) -> set[str]:
        found = {n.stream for n in self.injectors.values()}
        for node in self.computations.values():
            found.update(node.inputs)
            found.update(node.outputs)
        found.update(n.stream for n in self.sinks.values())
        return found

    def topological_order(self) -> list[str]:
        """Computation names, every computation after all computations it reads from."""
        self.validate()
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in order:
                return
            if name in visiting:
                raise PipelineError(f"cycle through computation {name!r}")
            visiting.add(name)
            for stream in self.computations[name].inputs:
                for producer in self.producers(stream):
                    if producer in self.computations:
                        visit(producer)
            visiting.discard(name)
            order.append(name)

        for name in sorted(self.computations):
            visit(name)
        return order

    def validate(self) -> None:
        """Raise PipelineError on the first wiring mistake found."""
        if not self.injectors:
            raise PipelineError(f"pipeline {self.name!r} has no injector: nothing would ever flow")
        for node in self.computations.values():
            for stream in node.inputs:
                if not self.producers(stream):
                    raise PipelineError(
                        f"computation {node.name!r} reads stream {stream!r}, which no injector or "
                        f"computation produces (known streams: {sorted(self._produced())})"
                    )
        for node in self.sinks.values():
            if not self.producers(node.stream):
                raise PipelineError(
                    f"sink {node.name!r} reads stream {node.stream!r}, which nothing produces "
                    f"(known streams: {sorted(self._produced())})"
                )
        for stream in self.codecs:
            if stream not in self.streams():
                raise PipelineError(f"codec declared for stream {stream!r}, which no node uses")
        for node in self.computations.values():
            if node.production is Production.WEAK:
                consumers = {c for s in node.outputs for c in self.consumers(s)}
                if len(consumers) != 1 or any(self.sinks[s].stream in node.outputs for s in self.sinks):
                    raise PipelineError(
                        f"weak productions of {node.name!r} need exactly one consuming computation and "
                        f"no sink on its outputs (found consumers {sorted(consumers)}); use strong "
                        "productions to fan out"
                    )

    def _produced(self) -> set[str]:
        found = {n.stream for n in self.injectors.values()}
        for node in self.computations.values():
            found.update(node.outputs)
        return found

    def _check_new_node(self, name: str) -> None:
        _check_name("node", name)
        if name in self.injectors or name in self.computations or name in self.sinks:
            raise PipelineError(f"name {name!r} is used twice in pipeline {self.name!r}")


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise PipelineError(
            f"{what} name {name!r} is invalid: use 1-64 letters, digits, '_' or '-', starting with a letter"
        )
