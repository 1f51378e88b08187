"""WindowAggregate: a computation that aggregates each key's records per event-time window and
produces one record per key and window once the window is complete.

How it runs, per key (the paper's Windower, generalised):

- a record that is not late is added to the accumulator of every window containing its timestamp
  (state: one MapState entry per open window, by window start), and a low-watermark timer is set at
  each such window's end;
- the timer at a window's end fires once the input low watermark reaches the end (every record
  stamped before it is in; a record stamped exactly at the end belongs to the next window); the
  window's result is produced, stamped with the window's end, and its state entry removed;
- a late record (`ctx.is_late`: stamped behind the input low watermark, i.e. the injector broke its
  promise) is never added: with `late="drop"` it is dropped and counted in the computation's `late`
  metric (which the progress display and `PipelineHarness.metrics` show); with `late="side"` it is
  also produced unchanged to `late_stream`, for the user to reconcile.

A record that is not late can only fall in windows still open (its timestamp is at or past the low
watermark, so every window containing it ends after the watermark): no window is ever produced
twice, and the output does not depend on how the runner batches one sender's input. With several
senders (two injectors, say), how their watermark advances interleave is the inputs' own timing
(docs/design.md, "Input points"): a record that breaks its sender's promise may be judged late in
one interleaving and not in another; records that keep their senders' promises give the same
windows in every one.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Literal, TypeVar, cast

from millstream.model.codecs import JsonCodec, PickleCodec
from millstream.model.computation import Computation, Context
from millstream.model.records import END_OF_TIME, Record, Timer
from millstream.model.state import MapState
from millstream.windows.aggregators import Aggregator
from millstream.windows.assigners import SlidingWindows, TumblingWindows, Window, WindowAssigner

In = TypeVar("In")
Acc = TypeVar("Acc")
Out = TypeVar("Out")

LatePolicy = Literal["drop", "side"]
_TIMER_PREFIX = "window@"


def _record_value(record: Record[Any]) -> Any:
    return record.value


def window_value(window: Window, result: Any) -> dict[str, Any]:
    """The default value of a produced window: {"start", "end", "value"}.

    >>> window_value(Window(0, 1000), 3)
    {'start': 0, 'end': 1000, 'value': 3}
    """
    return {"start": window.start, "end": window.end, "value": result}


class WindowAggregate(Computation, Generic[In, Acc, Out]):
    """Aggregate each key's records per window; produce `output_value(window, result)` on
    `output_stream`, keyed like the input and stamped with the window's end.

    `select` picks what the aggregator sees from each record (default: the record's value).
    Declare the streams this produces with `.outputs` when adding it to a pipeline.

    >>> from millstream import Pipeline, Record, ScriptedInjector
    >>> from millstream.testing import PipelineHarness
    >>> from millstream.windows import Sum, TumblingWindows
    >>> sums = WindowAggregate(TumblingWindows(1_000), Sum(), "sums")
    >>> pipeline = (Pipeline("demo")
    ...     .add_injector("in", ScriptedInjector("in", [([Record("a", 2, 100), Record("a", 3, 900),
    ...                                                   Record("a", 5, 1000)], 1500)]), "numbers")
    ...     .add_computation("sum", sums, ["numbers"], sums.outputs))
    >>> harness = PipelineHarness(pipeline)
    >>> harness.run_injectors()
    >>> [(r.key, r.timestamp, r.value["start"], r.value["value"]) for r in harness.output("sums")]
    [('a', 1000, 0, 5), ('a', 2000, 1000, 5)]
    """

    # Accumulators, by window start. Pickled: they are written and read only by this computation,
    # and pickle keeps whatever a fold returns (tuples, sets, numbers) exactly as it was.
    accumulators = MapState[int, Any]("window_accumulators", key_codec=JsonCodec(), value_codec=PickleCodec())

    def __init__(
        self,
        windows: TumblingWindows | SlidingWindows | WindowAssigner,
        aggregator: Aggregator[In, Acc, Out],
        output_stream: str,
        *,
        select: Callable[[Record[Any]], In] = _record_value,
        output_value: Callable[[Window, Out], Any] = window_value,
        late: LatePolicy = "drop",
        late_stream: str | None = None,
    ) -> None:
        for name, given in (("windows", windows), ("aggregator", aggregator)):
            if isinstance(given, type):  # a class passes the checks below, and fails at the first record
                raise TypeError(f"{name} must be an instance, e.g. {given.__name__}(...), got the class itself")
        if not isinstance(windows, WindowAssigner):
            raise TypeError(f"windows must be TumblingWindows(...) or SlidingWindows(...), got {windows!r}")
        for method in ("init", "add", "finish"):
            if not callable(getattr(aggregator, method, None)):
                raise TypeError(f"aggregator {aggregator!r} has no {method}() (see millstream.windows.Fold)")
        if not isinstance(output_stream, str) or not output_stream:
            raise ValueError("output_stream must be the name of the stream windows are produced to")
        if late not in ("drop", "side"):
            raise ValueError(f"late must be 'drop' (dropped and counted) or 'side' (produced to late_stream), "
                             f"got {late!r}")
        if (late == "side") != (late_stream is not None):
            raise ValueError("late='side' needs late_stream=<stream name>, and late_stream is only used with "
                             "late='side'")
        if late_stream == output_stream:
            raise ValueError("late_stream must differ from output_stream")
        self.windows = windows
        self.aggregator = aggregator
        self.output_stream = output_stream
        self.select = select
        self.output_value = output_value
        self.late = late
        self.late_stream = late_stream

    @property
    def outputs(self) -> list[str]:
        """The streams this computation produces: pass as add_computation's `outputs`.

        >>> from millstream.windows import Count, TumblingWindows
        >>> WindowAggregate(TumblingWindows(1_000), Count(), "counts", late="side", late_stream="late").outputs
        ['counts', 'late']
        """
        return [self.output_stream] + ([self.late_stream] if self.late_stream is not None else [])

    def process_record(self, ctx: Context, record: Record[Any]) -> None:
        if ctx.is_late:
            # Counted by the framework in this computation's `late` metric either way.
            if self.late_stream is not None:
                ctx.produce(Record(record.key, record.value, record.timestamp), self.late_stream)
            return
        accumulators = ctx.state(self.accumulators)
        value = self.select(record)
        aggregator = self.aggregator
        for window in self.windows.windows_of(record.timestamp):
            # An accumulator may itself be None (Min's before its first value): ask for the entry.
            if accumulators.contains(window.start):
                accumulator = cast(Acc, accumulators.get(window.start))
            else:
                accumulator = aggregator.init()
                # (The last windows before END_OF_TIME end after it: they close at END_OF_TIME.)
                ctx.set_timer(f"{_TIMER_PREFIX}{window.start}", min(window.end, END_OF_TIME))
            accumulators.put(window.start, aggregator.add(accumulator, value))

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        if not timer.tag.startswith(_TIMER_PREFIX):
            return
        start = int(timer.tag[len(_TIMER_PREFIX):])
        accumulators = ctx.state(self.accumulators)
        if not accumulators.contains(start):
            return
        window = self.windows.window_at(start)
        result = self.aggregator.finish(cast(Acc, accumulators.get(start)))
        ctx.produce(Record(ctx.key, self.output_value(window, result), min(window.end, END_OF_TIME)),
                    self.output_stream)
        accumulators.remove(start)

    def __repr__(self) -> str:
        return f"WindowAggregate({self.windows!r}, {self.aggregator!r}, {self.output_stream!r}, late={self.late!r})"
