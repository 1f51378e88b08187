"""A pipeline: injectors, computations and sinks wired together by named streams.

Validated when built, with errors that name the user's own objects (never a Spark stack trace):
duplicate names, unknown streams, streams nobody produces, malformed key extractors.

Errors at run time follow a policy per node (users know them from Kafka Streams' exception handlers
and Flink's side outputs):

- `fail`: the pipeline stops with one message naming the computation, input stream, key, record id
  and the user's own traceback. Nothing of the failed step is kept: after a fix, a restart processes
  the record again. The default for user code, because an exception is usually a bug that would
  otherwise drop records silently.
- `dead_letter`: the record (or timer), the error and the traceback go to the `dead_letters` stream
  and the pipeline goes on; the failed invocation leaves no trace in state or output. The default for
  malformed external input, which no code change can fix.

`dead_letters` is a stream like any other: give it a sink, or a computation that reads it.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Sequence

from millstream.model.codecs import DEFAULT_CODEC, Codec, is_codec
from millstream.model.computation import Computation
from millstream.model.injector import Injector
from millstream.model.locations import place, table_place
from millstream.model.records import Record

KeyExtractor = Callable[[Record[Any]], str]
SinkWriter = Callable[[Any, int], None]
"""A user sink: called as writer(dataframe, batch_id) once per committed producer batch (again
after a crash before its delivery was recorded). Batch ids are counted per producer: make it
idempotent per (producer, batch_id), the dataframe's `producer` column naming the producer (as
Spark's foreachBatch, per batch id, when the stream has one producer)."""

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

# How long, in low-watermark milliseconds after a record arrives, its id is kept to discard
# duplicates from injectors. A duplicate arriving later than this is processed again.
DEFAULT_DEDUP_HORIZON_MS = 10 * 60 * 1000

DEAD_LETTERS = "dead_letters"
"""The stream every computation produces dead letters to (reserved name)."""

# The keyed watermark every injector carries, as its own low watermark, when any injector has a skew
# limit: computations forward it as keyed watermarks are forwarded, never held by a timer's hold, so
# it tells how far each computation has processed its input; the skew limit compares with it
# (core/watermarks.py: skew_watermark). Not a valid user key name (_NAME), so it meets none.
UNHELD_WATERMARK_KEY = "~unheld"

FILE_SINK_FORMATS = ("jsonl", "parquet")

# A run to the end of its input also waits for the wall-time timers due within this long (later
# ones stay pending): SparkRunner.run's default, and the command line's harness runs.
WALL_TIMER_DRAIN_S = 30.0


class PipelineError(ValueError):
    """The pipeline is wired wrong; the message says what and where."""


class Production(str, Enum):
    """How a computation's productions reach its consumers (MillWheel section 5.4)."""

    STRONG = "strong"
    """Published to a durable stream log once Spark has committed the batch that made them, and read
    by consumers from there: exactly-once output, one durable hop per edge."""
    WEAK = "weak"
    """The computation runs fused in its consumer's Spark query, with no durable hop in between:
    lower latency, but the pair restarts together and intermediate records are not kept."""


class ErrorPolicy(str, Enum):
    """What happens when user code raises, a key extractor fails, or input is malformed."""

    FAIL = "fail"
    DEAD_LETTER = "dead_letter"


def record_key(record: Record[Any]) -> str:
    """The default key extractor: the key the producer gave the record."""
    return record.key


@dataclass(frozen=True)
class InjectorNode:
    name: str
    injector: Injector
    stream: str
    on_malformed: ErrorPolicy = ErrorPolicy.DEAD_LETTER
    idle_after_ms: int | None = None
    max_skew_ms: int | None = None


@dataclass(frozen=True)
class ComputationNode:
    name: str
    computation: Computation
    inputs: Mapping[str, KeyExtractor]
    outputs: tuple[str, ...]
    production: Production = Production.STRONG
    dedup_horizon_ms: int = DEFAULT_DEDUP_HORIZON_MS
    on_error: ErrorPolicy = ErrorPolicy.FAIL
    exactly_once: bool = True


@dataclass(frozen=True)
class SinkNode:
    """Where a stream leaves the pipeline. Exactly one of: a file sink (`path` with format jsonl or
    parquet, written by the executors), a Spark writer (`path` with any other Spark format, or
    `table`), a JDBC table (format jdbc, no path), or a user `writer` function."""

    name: str
    stream: str
    path: str | None = None
    format: str = "jsonl"
    writer: SinkWriter | None = None
    table: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_file_sink(self) -> bool:
        return self.writer is None and self.table is None and self.format in FILE_SINK_FORMATS

    @property
    def place(self) -> tuple[str, str] | None:
        """Where it writes, as (what is there, a phrase naming it), for sinks that replace their own
        (producer, batch) there; None for a user writer. Two sinks of one place and producer would
        replace each other's batches. Files of another format sit beside each other (the format is
        in their names), and a Spark writer's directories beside a file sink's files."""
        if self.path is not None:
            kind = f"{self.format} files" if self.is_file_sink else "Spark writer directories"
            return kind, f"path {place(self.path)!r}"
        if self.table is not None:
            return "table rows", f"table {table_place(self.table)!r}"
        if self.format == "jdbc":
            given = {option.lower(): value for option, value in self.options.items()}
            return "JDBC rows", f"JDBC table {str(given.get('dbtable')).lower()!r} at {given.get('url')!r}"
        return None

    @property
    def is_jdbc(self) -> bool:
        return self.path is None and self.format == "jdbc"


@dataclass
class Pipeline:
    """Build with add_injector / add_computation / add_sink; run with a runner.

    >>> from millstream import Computation, ScriptedInjector
    >>> class Echo(Computation):
    ...     def process_record(self, ctx, record):
    ...         ctx.produce(record, "out")
    >>> p = (Pipeline("echo")
    ...      .add_injector("src", ScriptedInjector("src", [([Record("k", 1, 5)], 10)]), "in")
    ...      .add_computation("echo", Echo(), ["in"], ["out"]))
    >>> p.producers("out"), p.consumers("in")
    (['echo'], ['echo'])
    """

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
        if stream == DEAD_LETTERS:
            raise PipelineError(f"stream {DEAD_LETTERS!r} is reserved for dead letters; its codec is JSON")
        if not is_codec(codec):
            raise PipelineError(f"stream {stream!r}: the codec must be a codec object with encode() and decode(), "
                                f"such as millstream.JsonCodec() or millstream.PickleCodec(), got {codec!r}")
        self.codecs[stream] = codec
        return self

    def add_injector(self, name: str, injector: Injector, stream: str,
                     on_malformed: ErrorPolicy | str = ErrorPolicy.DEAD_LETTER,
                     idle_after_ms: int | None = None, max_skew_ms: int | None = None) -> "Pipeline":
        """Bring `injector`'s records in as `stream`. Input it cannot parse goes to dead letters
        (or stops the pipeline with on_malformed="fail").

        `idle_after_ms`: a partition that finds nothing new (no record, no watermark move) for this
        long in wall time declares itself idle: consumers leave it out of their low watermark until it
        publishes again, so a quiet partition does not hold everything back. None: never idle
        (MillWheel's strict minimum).

        `max_skew_ms`: stop reading (nothing is lost or reordered: reading resumes where it paused)
        while a computation downstream of this injector has published a low watermark more than this
        far behind the injector's own. What waits for a watermark (windows, join buffers) then stays
        bounded when a stage or another input lags (MillWheel section 9.4's remedy for skew), unless
        a timer's hold keeps it waiting. The watermark compared leaves holds out
        (`ctx.set_timer(..., hold=)`): it is how far the computation has processed its input, so a
        hold never stops the input its timer waits for."""
        self._check_new_node(name)
        self._check_user_stream(stream, f"injector {name!r}")
        if not isinstance(injector, Injector):
            raise PipelineError(f"injector {name!r} must be a millstream.Injector, got {type(injector).__name__}")
        partitions = list(injector.partitions())
        if not partitions or len(set(partitions)) != len(partitions) or not all(isinstance(p, str) for p in partitions):
            raise PipelineError(f"injector {name!r}: partitions() must return distinct str names, got {partitions!r}")
        keys = getattr(injector, "watermark_keys", ())
        if isinstance(keys, str) or not isinstance(keys, (tuple, list)) or len(set(keys)) != len(keys):
            raise PipelineError(f"injector {name!r}: watermark_keys must be a tuple of distinct names, got {keys!r}")
        for key in keys:
            _check_name("watermark key", key)
        for option, value in (("idle_after_ms", idle_after_ms), ("max_skew_ms", max_skew_ms)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise PipelineError(f"injector {name!r}: {option} must be a positive int of milliseconds or None")
        self.injectors[name] = InjectorNode(name, injector, stream, _policy(on_malformed, f"injector {name!r}"),
                                            idle_after_ms, max_skew_ms)
        return self

    def add_computation(
        self,
        name: str,
        computation: Computation,
        inputs: Mapping[str, KeyExtractor | None] | Sequence[str],
        outputs: Sequence[str] = (),
        production: Production | str = Production.STRONG,
        dedup_horizon_ms: int = DEFAULT_DEDUP_HORIZON_MS,
        on_error: ErrorPolicy | str = ErrorPolicy.FAIL,
        exactly_once: bool = True,
    ) -> "Pipeline":
        """`inputs` maps each input stream to this computation's key extractor for it (None: the
        record's own key); a plain list of stream names keys every input by record key.

        `exactly_once=False` is MillWheel's switch for code that tolerates duplicates: no dedup of
        injector records, and productions are published as soon as a batch has run rather than once
        Spark has committed it (lower latency; a batch re-run after a crash keeps its first output)."""
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
            self._check_user_stream(stream, f"computation {name!r}")
        if len(set(outputs)) != len(outputs):
            raise PipelineError(f"computation {name!r} lists an output stream twice")
        try:
            production = Production(production)
        except ValueError:
            raise PipelineError(f"production of {name!r} must be 'strong' or 'weak', got {production!r}") from None
        if isinstance(dedup_horizon_ms, bool) or not isinstance(dedup_horizon_ms, int) or dedup_horizon_ms < 0:
            raise PipelineError(f"dedup_horizon_ms of {name!r} must be an int >= 0")
        problem = computation.check_streams(tuple(extractors), tuple(outputs))
        if problem is not None:
            raise PipelineError(f"computation {name!r}: {problem}")
        self.computations[name] = ComputationNode(
            name, computation, extractors, tuple(outputs), production, dedup_horizon_ms,
            _policy(on_error, f"computation {name!r}"), bool(exactly_once),
        )
        return self

    def add_sink(self, name: str, stream: str, path: str | None = None, format: str = "jsonl", *,
                 writer: SinkWriter | None = None, table: str | None = None,
                 options: Mapping[str, str] | None = None) -> "Pipeline":
        """Deliver `stream` out of the pipeline, exactly once per producer batch:

        - `path` with format "jsonl" or "parquet": files written by the executors, one per producer
          batch and task, made visible once the batch is committed. A JSON lines file holds one
          object per record: key, timestamp, id, value. A Parquet file has columns key, timestamp
          and id, then one column per field of dict values (every field any record has; null where a
          record lacks it; a field named key, timestamp or id, or starting with "value.", goes to
          column "value.<field>", a field that is not a str to "value.<its repr>"), and column
          "value" for values that are not dicts; a column whose values make no one Parquet type (an
          int here, a string there) holds each value's JSON text;
        - `path` with any other Spark format ("csv", "orc", "json", ...): Spark's writer, each batch
          into `path/producer=<p>/batch=<id>` (a re-delivery replaces it);
        - `table`: appended to a Spark table partitioned by `millstream_producer` and
          `millstream_batch` (a re-delivery overwrites its own partition), in the session's
          warehouse (`spark.sql.warehouse.dir`; Spark's default, `./spark-warehouse`, follows the
          directory the driver starts in);
        - format "jdbc" with `options` url= and dbtable= (and what else Spark's JDBC writer takes):
          a database table with columns `millstream_producer` and `millstream_batch`, each batch
          written by the executors to a staging table millstream makes beside it, then put in by
          one transaction that also deletes a re-delivery's own rows (on a database with
          transactions, readers never see a batch partial or twice);
        - `writer`: your function, called as writer(dataframe, batch_id).

        The dataframe has columns key, timestamp, id, value (JSON text for JSON streams, bytes
        otherwise) and producer. Two sinks that would replace each other's batches (one place, one
        producer: see SinkNode.place) are refused by `validate`.

        >>> from millstream import ScriptedInjector
        >>> p = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "events")
        >>> p = p.add_sink("db", "events", format="jdbc", options={"url": "jdbc:derby:memory:x"})
        Traceback (most recent call last):
        ...
        millstream.model.pipeline.PipelineError: sink 'db': a JDBC sink needs options url= and dbtable=
        """
        self._check_new_node(name)
        _check_name("stream", stream)
        if format == "jdbc":
            if path is not None or writer is not None or table is not None:
                raise PipelineError(f"sink {name!r}: a JDBC sink takes options url= and dbtable=, not path=, "
                                    "writer= or table=")
            given = {option.lower(): value for option, value in (options or {}).items()}  # as Spark reads them
            if not given.get("url") or not given.get("dbtable"):
                raise PipelineError(f"sink {name!r}: a JDBC sink needs options url= and dbtable=")
            if str(given["dbtable"]).lstrip().startswith("("):
                raise PipelineError(f"sink {name!r}: a JDBC sink's dbtable= names a table, not a query")
        elif len([x for x in (path, writer, table) if x is not None]) != 1:
            raise PipelineError(f"sink {name!r}: give exactly one of path=, writer= or table= "
                                "(or format='jdbc' with options url= and dbtable=)")
        if writer is not None and not callable(writer):
            raise PipelineError(f"sink {name!r}: writer must be callable as writer(dataframe, batch_id)")
        if writer is not None:
            try:  # the writer's own signature: a functools.wraps adapter takes what its wrapper takes
                inspect.signature(writer, follow_wrapped=False).bind(None, None)
            except TypeError:
                taken = inspect.signature(writer, follow_wrapped=False)
                raise PipelineError(f"sink {name!r}: writer must take two arguments, writer(dataframe, batch_id); "
                                    f"{getattr(writer, '__name__', writer)!r} takes {taken}") from None
            except ValueError:  # no signature to read (some builtins): left to the first delivery
                pass
        if path is not None and (not isinstance(format, str) or not re.match(r"^[A-Za-z][\w.-]*$", format)):
            raise PipelineError(f"sink {name!r}: format must be a format name such as 'jsonl' or 'parquet', "
                                f"got {format!r}")
        self.sinks[name] = SinkNode(name, stream, None if path is None else str(path), format, writer, table,
                                    dict(options or {}))
        return self

    # -- queries used by runners -------------------------------------------------------------
    def codec(self, stream: str) -> Codec:
        return self.codecs.get(stream, DEFAULT_CODEC)

    def producers(self, stream: str) -> list[str]:
        """Names of the injectors and computations that produce `stream`, in a stable order."""
        if stream == DEAD_LETTERS:
            return sorted(self.computations)
        names = [n.name for n in self.injectors.values() if n.stream == stream]
        names += [n.name for n in self.computations.values() if stream in n.outputs]
        return sorted(names)

    def outputs(self, computation: str) -> tuple[str, ...]:
        """Every stream a computation may produce to: its declared outputs and the dead letters."""
        return (*self.computations[computation].outputs, DEAD_LETTERS)

    def watermark_keys(self, producer: str) -> tuple[str, ...]:
        """The keyed watermarks `producer` publishes on its streams (dead letters carry none): an
        injector's own `watermark_keys`; a computation forwards every one its inputs carry.

        >>> from millstream import Computation, GeneratorInjector, Record
        >>> ships = GeneratorInjector(lambda i: Record("k", i, i), 3, lambda n: n,
        ...                           keyed_watermarks={"ship": lambda n: n - 5})
        >>> p = (Pipeline("p").add_injector("orders", ships, "orders")
        ...      .add_computation("pass", Computation(), ["orders"], ["out"]))
        >>> p.watermark_keys("orders"), p.watermark_keys("pass")
        (('ship',), ('ship',))
        """
        if producer in self.injectors:
            own = tuple(self.injectors[producer].injector.watermark_keys)
            return (*own, UNHELD_WATERMARK_KEY) if self.skew_limited() else own
        found: set[str] = set()
        for stream in self.computations[producer].inputs:
            if stream != DEAD_LETTERS:
                for upstream in self.producers(stream):
                    found.update(self.watermark_keys(upstream))
        return tuple(sorted(found))

    def consumers(self, stream: str) -> list[str]:
        return sorted(n.name for n in self.computations.values() if stream in n.inputs)

    def skew_limited(self) -> bool:
        """Whether any injector has a skew limit: then every injector carries UNHELD_WATERMARK_KEY."""
        return any(node.max_skew_ms is not None for node in self.injectors.values())

    def downstream(self, stream: str) -> list[str]:
        """Every computation that reads `stream`, directly or through other computations."""
        found: list[str] = []
        pending = [stream]
        while pending:
            for consumer in self.consumers(pending.pop()):
                if consumer not in found:
                    found.append(consumer)
                    pending.extend(self.computations[consumer].outputs)
        return sorted(found)

    def streams(self) -> set[str]:
        found = {n.stream for n in self.injectors.values()}
        for node in self.computations.values():
            found.update(node.inputs)
            found.update(node.outputs)
        found.update(n.stream for n in self.sinks.values())
        if self.computations:
            found.add(DEAD_LETTERS)
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
                    # A computation reading dead letters does not receive its own.
                    if producer in self.computations and not (stream == DEAD_LETTERS and producer == name):
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
                        f"computation produces (known streams: {self._known()})"
                    )
            if DEAD_LETTERS in node.inputs and len(node.inputs) > 1:
                raise PipelineError(f"computation {node.name!r}: a computation that reads {DEAD_LETTERS!r} "
                                    "reads nothing else")
        self._check_no_cycle()
        for node in self.computations.values():
            self._check_id_namespaces(node)
        for sink in self.sinks.values():
            if not self.producers(sink.stream):
                raise PipelineError(
                    f"sink {sink.name!r} reads stream {sink.stream!r}, which nothing produces "
                    f"(known streams: {self._known()})"
                )
            if any(p in self.injectors for p in self.producers(sink.stream)):
                # The Spark runner materializes computations' outputs only; the harness refuses it too,
                # so that a pipeline its tests pass on runs on Spark.
                raise PipelineError(
                    f"sink {sink.name!r} reads stream {sink.stream!r}, which an injector produces; sinks take "
                    "computations' outputs (add a pass-through computation)"
                )
        placed: dict[tuple[str, str, str], str] = {}  # (what, where, producer) -> the sink writing it
        for sink in self.sinks.values():
            found = sink.place
            if found is None:
                continue
            what, where = found
            for producer in self.producers(sink.stream):
                other = placed.setdefault((what, where, producer), sink.name)
                if other != sink.name:
                    raise PipelineError(
                        f"sinks {other!r} and {sink.name!r} both write {producer!r}'s batches to {where}: each "
                        "replaces its own batches there, so they would overwrite each other's (give each sink a "
                        "place of its own)")
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
        self.weak_fusions()

    def _check_no_cycle(self) -> None:
        """Refuse streams that loop back to a computation that produces them, naming the loop: each
        computation in it, the stream it produces and who reads that, from the computation where a walk
        downstream from each computation in name order first comes back. A computation reading the dead
        letters does not receive its own."""
        done: set[str] = set()
        path: list[tuple[str, str]] = []  # (computation, the stream it produces to the next)

        def visit(name: str) -> None:
            for stream in (*self.computations[name].outputs, DEAD_LETTERS):
                for consumer in self.consumers(stream):
                    if consumer in done or (stream == DEAD_LETTERS and consumer == name):
                        continue
                    on_path = [step for step, _ in path] + [name]
                    if consumer in on_path:
                        loop = [*path, (name, stream)][on_path.index(consumer):]
                        readers = [who for who, _ in loop[1:]] + [consumer]
                        links = "; ".join(f"{who!r} produces {what!r}, read by {reader!r}"
                                          for (who, what), reader in zip(loop, readers))
                        raise PipelineError(f"cycle through computation {consumer!r}: {links}; a computation "
                                            "cannot read what it produces, directly or through others")
                    path.append((name, stream))
                    visit(consumer)
                    path.pop()
            done.add(name)

        for name in sorted(self.computations):
            if name not in done:
                visit(name)

    def weak_fusions(self) -> dict[str, str]:
        """Weak computation -> the strong computation it is fused into (the Spark runner runs the two
        in one query): a weak computation's consumer reads nothing else, reads all of its outputs,
        and is strong. Refused otherwise, by validate() too, so that a pipeline that passes on the
        harness runs on Spark."""
        fused: dict[str, str] = {}
        for node in self.computations.values():
            if node.production is not Production.WEAK:
                continue
            consumer = self.consumers(node.outputs[0])[0] if node.outputs else None
            consumer_node = self.computations.get(consumer or "")
            if (consumer_node is None or any(self.producers(s) != [node.name] for s in consumer_node.inputs)
                    or any(s not in consumer_node.inputs for s in node.outputs)):
                raise PipelineError(
                    f"weak computation {node.name!r} must be the only producer of every stream its consumer "
                    f"{consumer!r} reads, and that consumer must read all of its outputs; use strong "
                    "productions for this edge"
                )
            if consumer_node.production is Production.WEAK:
                raise PipelineError(
                    f"weak computations {node.name!r} -> {consumer!r}: a weak computation is fused into a "
                    "strong consumer; make one of them strong"
                )
            fused[node.name] = consumer_node.name
        return fused

    def _check_id_namespaces(self, node: ComputationNode) -> None:
        """Injectors feeding `node` that make record ids from the same name would have the records of
        one dropped as duplicates of the other's (deduplication goes by id): refused."""
        if not node.exactly_once:
            return  # no deduplication: nothing dropped
        by_namespace: dict[tuple[str, str], str] = {}
        for stream in node.inputs:
            for producer in self.producers(stream):
                node_of = self.injectors.get(producer)
                if node_of is None:  # a computation's output: ids of its own
                    continue
                namespace = node_of.injector.id_namespace()
                if namespace is None:
                    continue
                other = by_namespace.setdefault(namespace, producer)
                if other != producer:
                    raise PipelineError(
                        f"injectors {other!r} and {producer!r} both feed computation {node.name!r} and make "
                        f"record ids from the same name {namespace[1]!r}: the records of one would be dropped as "
                        f"duplicates of the other's; give each a name of its own "
                        f"({type(node_of.injector).__name__}(..., name={producer!r}))")

    def _produced(self) -> set[str]:
        found = {n.stream for n in self.injectors.values()}
        for node in self.computations.values():
            found.update(node.outputs)
        if self.computations:
            found.add(DEAD_LETTERS)
        return found

    def _known(self) -> list[str]:
        return sorted(self._produced() - {DEAD_LETTERS})

    def _check_new_node(self, name: str) -> None:
        _check_name("node", name)
        if name in self.injectors or name in self.computations or name in self.sinks:
            raise PipelineError(f"name {name!r} is used twice in pipeline {self.name!r}")

    @staticmethod
    def _check_user_stream(stream: str, owner: str) -> None:
        _check_name("stream", stream)
        if stream == DEAD_LETTERS:
            raise PipelineError(f"{owner}: stream name {DEAD_LETTERS!r} is reserved for dead letters")


def _policy(value: ErrorPolicy | str, owner: str) -> ErrorPolicy:
    try:
        return ErrorPolicy(value)
    except ValueError:
        raise PipelineError(f"{owner}: error policy must be 'fail' or 'dead_letter', got {value!r}") from None


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise PipelineError(
            f"{what} name {name!r} is invalid: use 1-64 letters, digits, '_' or '-', starting with a letter"
        )
