"""The user contract: a computation is user code run per key, serialized per key.

Kept deliberately small (MillWheel's API, section 5 of the paper): two hooks called by the system,
`setup`/`teardown` around a worker's use of the computation, and a context through which the code reads
its key's state, sets timers and produces records.

User code runs as if it were idempotent: whatever fails, each record and each timer firing takes
effect exactly once, together with the state changes and productions it made. Code that is not
deterministic (random draws, clocks, calls to other systems) is fine: only one run's effects are kept.
Effects on external systems are the user's to make idempotent (MillWheel section 5.1).
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, TypeVar, overload

from millstream.model.records import Record, TimeDomain, Timer
from millstream.model.state import ListHandle, ListState, MapHandle, MapState, ValueHandle, ValueState

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class Context(Protocol):
    """What user code may do while the framework runs it for one key."""

    @property
    def key(self) -> str:
        """The key this invocation runs for."""
        ...

    @property
    def low_watermark(self) -> int:
        """The computation's input low watermark at the point in its input where the current record
        arrived (in `process_timer`: the one that made the timer due)."""
        ...

    @property
    def wall_time(self) -> int:
        """Wall-clock time of this step in ms, planned once per step (the same on a replay; a
        value the test harness controls)."""
        ...

    @property
    def is_late(self) -> bool:
        """True when the record being processed is stamped behind `low_watermark`."""
        ...

    @property
    def input_stream(self) -> str | None:
        """Name of the stream the current record came from (None in `process_timer`)."""
        ...

    def input_watermark(self, stream: str) -> int:
        """The low watermark of one input stream alone (the minimum over that stream's non-idle
        senders), at the same point as `low_watermark`: what a join needs to follow each side."""
        ...

    def watermark(self, key: str) -> int:
        """The coalesced watermark of watermark key `key` (a keyed watermark some input carries, see
        `Injector.watermark_keys`), at the same point as `low_watermark`."""
        ...

    @overload
    def state(self, spec: ValueState[T]) -> ValueHandle[T]: ...

    @overload
    def state(self, spec: ListState[T]) -> ListHandle[T]: ...

    @overload
    def state(self, spec: MapState[K, V]) -> MapHandle[K, V]: ...

    def state(self, spec: Any) -> Any:
        """The current key's handle for a state declared on the computation class."""
        ...

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.LOW_WATERMARK,
                  watermark: str | None = None, hold: int | None = None) -> None:
        """Set (or move) the key's timer `tag`. A low-watermark timer at or behind the current low
        watermark fires in the same step, after the key's records of the current input point.
        `watermark`: a watermark key; the timer then fires once that keyed watermark reaches `time`.
        `hold`: a record timestamp; while the timer is pending, the computation's output low
        watermark does not pass it, so records stamped `hold` or later that its firing produces are
        not late downstream (for records kept in state and produced later, as on a retry). Setting
        the timer again without `hold` releases it; so do firing and deleting it, and `clear()`.
        The fired `Timer` carries its hold (`timer.hold`), as do the harness's `pending_timers`.
        Keyed watermarks are not held, and an injector's skew limit (`max_skew_ms`) does not count
        holds: a hold however far behind does not stop the input its timer waits for."""
        ...

    def delete_timer(self, tag: str) -> None:
        """Cancel the key's timer `tag` if it is pending."""
        ...

    def produce(self, record: Record[Any], stream: str) -> None:
        """Emit `record` on `stream` (one of the computation's declared outputs). Its id is assigned
        deterministically by the framework."""
        ...

    def clear(self) -> None:
        """Discard everything this key holds: all its state and pending timers. A key with nothing
        left disappears from the store."""
        ...


@dataclass(frozen=True)
class ComputationInfo:
    """Handed to `Computation.setup`: where this instance runs."""

    computation: str
    pipeline: str


class Computation(ABC):
    """Subclass and override the hooks; declare state as class attributes (see millstream.state).

    >>> from millstream import Pipeline, ScriptedInjector, ValueState
    >>> from millstream.testing import PipelineHarness
    >>> class Count(Computation):
    ...     n = ValueState[int]("n", default=0)
    ...     def process_record(self, ctx, record):
    ...         ctx.state(self.n).set(ctx.state(self.n).get() + 1)
    ...         ctx.produce(Record(ctx.key, ctx.state(self.n).get(), record.timestamp), "counts")
    >>> pipeline = (Pipeline("demo")
    ...     .add_injector("in", ScriptedInjector("in", [([Record("a", 0, 1), Record("a", 0, 2)], 10)]), "words")
    ...     .add_computation("count", Count(), ["words"], ["counts"]))
    >>> harness = PipelineHarness(pipeline)
    >>> harness.run_injectors()
    >>> [r.value for r in harness.output("counts")]
    [1, 2]
    """

    def check_streams(self, inputs: Sequence[str], outputs: Sequence[str]) -> str | None:
        """What is wrong with adding this computation with these input and output streams, or None
        (the default: nothing). `Pipeline.add_computation` refuses it with the text returned: a
        computation that names its streams itself (a join's sides) checks them here, where the
        pipeline is built, not at its first record."""
        return None

    def setup(self, info: ComputationInfo) -> None:
        """Called once in each worker process before the computation's first invocation there:
        open clients of external systems here, not in `__init__` (the instance travels pickled)."""

    def teardown(self) -> None:
        """Called when the worker is done with the computation (best effort: a crash skips it)."""

    def process_record(self, ctx: Context, record: Record[Any]) -> None:
        """Called once per delivered record (duplicates by id are discarded before this)."""

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        """Called when a timer set by `ctx.set_timer` fires."""

    def process_records(self, ctx: Context, records: list[Record[Any]]) -> None:
        """Optional, for code that can work on many records at once (Bytewax's `on_batch`, Spark's
        `handleInputRows`): when a subclass overrides it, it is called instead of `process_record`
        with the key's records of one input point, in input order, duplicates removed. Late records
        are those stamped behind `ctx.low_watermark` (`ctx.is_late` is False here). Under the
        dead_letter policy, a call that raises sends all of its records to dead letters."""
        for record in records:
            self.process_record(ctx, record)
