"""Injectors bring external data into a pipeline and seed its low watermarks.

An injector is a *replayable* source: given the same offsets it yields the same records, so a runner
can re-read after a crash and the record ids (assigned by the injector) deduplicate any overlap.
Offsets are small JSON-serializable dicts the injector defines; the runner stores them in its
checkpoint and hands them back.

Like MillWheel's distributed injectors, an injector is split into a fixed, expected set of
*partitions* read independently (by as many Spark tasks). Each partition publishes its own low
watermark, the timestamp below which it promises no more records (MillWheel section 5.3); the
injector's watermark is the minimum over all expected partitions, so it does not advance until every
partition has reported. A record behind that promise is still delivered; consumers see it as late.

An injector may publish *keyed watermarks* besides its low watermark (seed 001): one per name in
`watermark_keys`, each a promise about another time its records carry (for example a "shipped_at"
field of the value). Consumers coalesce each key on its own (`ctx.watermark(key)`) and may set timers
on it. Injectors without keyed watermarks ignore both.

A line of input the injector cannot parse is yielded as `Malformed` instead of a record: the runner
sends it to the dead-letter stream (or stops, if the injector was added with on_malformed="fail").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from millstream.model.codecs import CodecError
from millstream.model.records import END_OF_TIME, Record, timestamp_problem

Offset = dict[str, Any]


class InjectorError(ValueError):
    """An injector gave something that is not a record millstream can carry: a mistake in the
    injector (or in the function that makes its records), named with the injector."""


def check_injected(item: Any, injector: str) -> None:
    """Refuse, naming `injector`, an item read from it that is not a Record with a str key and an int
    timestamp (milliseconds) in [BEGINNING_OF_TIME, END_OF_TIME]: found here, not as a confusing
    error in whichever computation meets it first.

    >>> check_injected(Record("k", 1, 5), "src")
    >>> check_injected(Record("k", 1, "5"), "src")
    Traceback (most recent call last):
    ...
    millstream.model.injector.InjectorError: injector 'src' gave a record whose timestamp is a str ('5'); timestamps are int milliseconds since the epoch
    """
    if not isinstance(item, Record):
        raise InjectorError(f"injector {injector!r} gave a {type(item).__name__} ({item!r:.60}) where a "
                            "millstream.Record(key, value, timestamp) belongs")
    if not isinstance(item.key, str):
        raise InjectorError(f"injector {injector!r} gave a record whose key is a {type(item.key).__name__} "
                            f"({item.key!r:.40}); keys are str")
    problem = timestamp_problem(item.timestamp)
    if problem is not None:
        raise InjectorError(f"injector {injector!r} gave a record whose timestamp {problem}")


@dataclass(frozen=True)
class Malformed:
    """Input an injector read but could not turn into a record.

    `position` names where it was (file and line, partition and offset) and, like a record id, must be
    the same on every re-read: it is the dead letter's identity."""

    position: str
    raw: str
    error: str


def refused_value(injector: "Injector", record: Record[Any], error: Exception, name: str, stream: str) -> Malformed:
    """What becomes of a record whose value the stream's codec refuses (`error`): from an injector
    whose values are input data (`values_are_data`: files, DataFrame rows, messages), malformed
    input, a dead letter like any other; from one whose values a user's code builds, a mistake to
    fix, raised naming the injector and stream. Both runners go by this rule.

    >>> class Rows(Injector):
    ...     values_are_data = True
    ...     def initial_offset(self, partition): return {}
    ...     def latest_offset(self, partition, start, max_records): return start
    ...     def read(self, partition, start, end): return iter(())
    ...     def low_watermark(self, partition, offset): return 0
    >>> refused_value(Rows(), Record("k", float("nan"), 5, "rows:7"), CodecError("JSON cannot store nan"), "rows", "s")
    Malformed(position='rows:7', raw='nan', error="a value stream 's' cannot carry: JSON cannot store nan")
    """
    if not injector.values_are_data:
        raise refusal(record, error, name, stream) from None
    return Malformed(record.id or record.key, f"{record.value!r:.2000}",
                     f"a value stream {stream!r} cannot carry: {error}")


def refusal(record: Record[Any], error: Exception, name: str, stream: str) -> Exception:
    """The error to raise for a record of injector `name` whose value the codec of `stream` refuses."""
    return CodecError(f"injector {name!r}, stream {stream!r}, record {record.id or record.key!r}: {error}")


class Injector(ABC):
    """The contract every injector implements. Single-partition injectors ignore `partition`.

    >>> from millstream import GeneratorInjector, Record
    >>> gen = GeneratorInjector(lambda i: Record("k", i, i), total=3, low_watermark=lambda n: n)
    >>> part = gen.partitions()[0]
    >>> end = gen.latest_offset(part, gen.initial_offset(part), None)
    >>> [r.value for r in gen.read(part, gen.initial_offset(part), end)]
    [0, 1, 2]
    """

    #: Names of the keyed watermarks this injector publishes besides its low watermark.
    watermark_keys: tuple[str, ...] = ()
    #: Whether its values are input data (a file's lines, a DataFrame's rows, messages) rather than
    #: built by a user's code: a value the stream's codec refuses is then malformed input (a dead
    #: letter), not a mistake that stops the pipeline (`refused_value`).
    values_are_data: bool = False

    def partitions(self) -> Sequence[str]:
        """The expected set of partitions, fixed for the life of a pipeline root."""
        return ("0",)

    @abstractmethod
    def initial_offset(self, partition: str) -> Offset:
        """Offset of `partition` before anything has been read."""

    @abstractmethod
    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        """How far `partition` can be read now, starting at `start`, taking at most about
        `max_records` records (None: no limit). Returns `start` when nothing new is available."""

    @abstractmethod
    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
        """The records of `partition` between two offsets, deterministically. Every record carries
        an id; input that is not a record is yielded as Malformed."""

    @abstractmethod
    def low_watermark(self, partition: str, offset: Offset) -> int:
        """The partition's published low watermark once everything up to `offset` has been read;
        `END_OF_TIME` once it will never produce again."""

    def id_namespace(self) -> tuple[str, str] | None:
        """(how, name): what the record ids this injector makes itself derive from, a `name=`
        argument and the rule applying it; None where it makes none (its records carry ids of
        their own, or ids that name their source: a file's path, a topic's partition and offset).
        Two injectors feeding one deduplicating computation must not share one: the records of one
        would be dropped as duplicates of the other's (Pipeline.validate refuses it)."""
        return None

    def keyed_watermarks(self, partition: str, offset: Offset) -> Mapping[str, int]:
        """The partition's keyed watermarks once everything up to `offset` has been read: one value
        per name in `watermark_keys` (a name left out stays where it was), each a function of the
        offset like `low_watermark`, never going back."""
        return {}

    def is_finished(self, partition: str, offset: Offset) -> bool:
        """True when nothing will ever follow `offset` in `partition`."""
        return self.low_watermark(partition, offset) >= END_OF_TIME

    def next_arrival_s(self, partition: str, offset: Offset) -> float | None:
        """Seconds of wall time until `partition` has more to read after `offset`, for an injector
        that knows (one paced by the clock: 0.0 when more is there now); None where it cannot tell
        (a live source: more comes when it comes) or nothing more will come. A run to the end of the
        input (`PipelineHarness.run_injectors`) waits this long instead of stopping part way."""
        return None
