"""Stream-to-stream joins on event time: the interval join (seed 001's use for per-input watermarks).

`IntervalJoin` joins two streams by key: a left record l and a right record r of the same key match
when r's time is in [l.time + lower_ms, l.time + upper_ms]. It buffers each side in the key's state
and forgets a record once the *other* side's watermark guarantees nothing can match it any more:

- a left record l waits for right records until the right side's watermark passes l.time + upper_ms;
  then, for a left outer join (`how="left"`) it is emitted unmatched if nothing matched it;
- a right record r is kept while a left record can still reach it: until the left side's watermark
  passes r.time - lower_ms.

Both are low-watermark timers, which fire by the computation's input watermark: the minimum of both
sides, so never before the other side allows (and when one side is idle, by the other one alone).
A record stamped behind its own side's watermark (`ctx.input_watermark(side)`) is late: what it
could have matched may be gone, so it is not joined; it goes to `late_stream` if given. So is one
the framework flags late (`ctx.is_late`: behind the computation's low watermark), which a side back
from idle can be while its own watermark never moved: the rows it could have matched were forgotten
by the other side's watermark alone. Without `late_stream` a late row is dropped, and the
computation's `late` metric counts it only when it is also behind the computation's low watermark
(the earlier of the two sides'), which a side running ahead of the other need not be: give
`late_stream` to see every late row.

Pairs are stamped with the later of the two times; unmatched left rows with the time they were
decided (l.time + upper_ms + 1). Values are kept with pickle (the join's own state, never read from
outside), so any value a stream carries can be joined.

**On a second time column, by keyed watermarks** (seed 001's use of them): with `left_time` /
`right_time` (a function of the record giving its join time) and `left_watermark` /
`right_watermark` (the watermark key each side publishes for that time), the interval is taken on
those times, each side's lateness is judged by its own keyed watermark, and its rows wait on timers
that follow the *other* side's keyed watermark alone. Output records keep event-time stamps (the
later of the two records' timestamps; an unmatched left row its own, or the low watermark if later).

>>> from millstream import Pipeline, Record, ScriptedInjector
>>> from millstream.testing import PipelineHarness
>>> join = IntervalJoin("clicks", "buys", lower_ms=0, upper_ms=100, how="left")
>>> harness = PipelineHarness(Pipeline("shop")
...     .add_injector("c", ScriptedInjector("c", [([Record("u1", "ad", 10), Record("u2", "ad", 20)], 50)]), "clicks")
...     .add_injector("b", ScriptedInjector("b", [([Record("u1", "shoe", 60)], 50)]), "buys")
...     .add_computation("join", join, ["clicks", "buys"], join.outputs))
>>> harness.run_injectors()
>>> sorted((r.key, r.value["left"], r.value["right"]) for r in harness.output("joined"))
[('u1', 'ad', 'shoe'), ('u2', 'ad', None)]
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from millstream.model.codecs import PickleCodec
from millstream.model.computation import Computation, Context
from millstream.model.records import Record, Timer
from millstream.model.state import MapState

Combine = Callable[[Record[Any], "Record[Any] | None"], Any]
JoinTime = Callable[[Record[Any]], int]


def _pair(left: Record[Any], right: Record[Any] | None) -> Any:
    return {"left": left.value, "right": None if right is None else right.value}


class IntervalJoin(Computation):
    """See the module doc. Add it with `pipeline.add_computation(name, join, [left, right], join.outputs)`
    (a mapping to key extractors works too: both sides must be keyed by the join key)."""

    # id -> (time, value, matched): the left rows still waiting; id -> (time, value): right rows kept.
    left_rows = MapState[str, tuple]("left_rows", value_codec=PickleCodec())
    right_rows = MapState[str, tuple]("right_rows", value_codec=PickleCodec())

    def __init__(self, left: str, right: str, lower_ms: int, upper_ms: int, how: str = "inner",
                 output: str = "joined", late_stream: str | None = None, combine: Combine = _pair,
                 left_time: JoinTime | None = None, right_time: JoinTime | None = None,
                 left_watermark: str | None = None, right_watermark: str | None = None) -> None:
        if how not in ("inner", "left"):
            raise ValueError(f"how must be 'inner' or 'left', got {how!r}")
        for name, bound in (("lower_ms", lower_ms), ("upper_ms", upper_ms)):
            if not isinstance(bound, int) or isinstance(bound, bool):  # a float failed at the first record
                raise TypeError(f"{name} must be whole milliseconds (an int), got {bound!r}")
        if lower_ms > upper_ms:
            raise ValueError(f"lower_ms {lower_ms} is above upper_ms {upper_ms}: the interval is empty")
        if left == right:
            raise ValueError("the two sides of a join must be different streams")
        self.left, self.right = left, right
        self.lower_ms, self.upper_ms = lower_ms, upper_ms
        self.how, self.output, self.late_stream, self.combine = how, output, late_stream, combine
        for which, time_of, watermark in (("left", left_time, left_watermark), ("right", right_time, right_watermark)):
            if (time_of is None) != (watermark is None):
                raise ValueError(f"{which}_time and {which}_watermark go together: a join time needs the keyed "
                                 "watermark that promises it")
            if time_of is not None and not callable(time_of):
                raise ValueError(f"{which}_time must be a function of the record")
        self.times = {left: left_time, right: right_time}
        self.watermarks = {left: left_watermark, right: right_watermark}

    @property
    def outputs(self) -> list[str]:
        return [self.output] + ([self.late_stream] if self.late_stream else [])

    def check_streams(self, inputs: Sequence[str], outputs: Sequence[str]) -> str | None:
        if sorted(inputs) != sorted((self.left, self.right)):
            return (f"the join's sides are {self.left!r} and {self.right!r}, but it is added with inputs "
                    f"{list(inputs)}: add it with exactly its two sides")
        missing = [stream for stream in self.outputs if stream not in outputs]
        if missing:
            return f"the join produces {self.outputs}; its outputs lack {missing} (pass join.outputs)"
        return None

    def _time(self, side: str, record: Record[Any]) -> int:
        time_of = self.times[side]
        return record.timestamp if time_of is None else int(time_of(record))

    def _watermark(self, ctx: Context, side: str) -> int:
        """What `side`'s join times are promised to be at or after."""
        key = self.watermarks[side]
        return ctx.input_watermark(side) if key is None else ctx.watermark(key)

    def process_record(self, ctx: Context, record: Record[Any]) -> None:
        side: str = ctx.input_stream  # type: ignore[assignment]
        time = self._time(side, record)
        # (On keyed watermarks rows wait on those alone: the low watermark forgets nothing there.)
        if time < self._watermark(ctx, side) or (ctx.is_late and self.watermarks[side] is None):
            if self.late_stream:
                ctx.produce(Record(ctx.key, {"side": side, "value": record.value, "id": record.id}, record.timestamp),
                            self.late_stream)
            return
        lefts, rights = ctx.state(self.left_rows), ctx.state(self.right_rows)
        # Rows: left (time, value, matched, stamp), right (time, value, stamp); stamp = event time.
        if side == self.left:
            matched = False
            for rid, row in rights.items():
                if time + self.lower_ms <= row[0] <= time + self.upper_ms:
                    self._emit(ctx, record, Record(ctx.key, row[1], _stamp(row, 2), rid))
                    matched = True
            lefts.put(record.id, (time, record.value, matched, record.timestamp))
            ctx.set_timer(f"L{record.id}", time + self.upper_ms + 1, watermark=self.watermarks[self.right])
        else:
            for lid, row in lefts.items():
                if row[0] + self.lower_ms <= time <= row[0] + self.upper_ms:
                    self._emit(ctx, Record(ctx.key, row[1], _stamp(row, 3), lid), record)
                    if not row[2]:
                        lefts.put(lid, (row[0], row[1], True, _stamp(row, 3)))
            rights.put(record.id, (time, record.value, record.timestamp))
            ctx.set_timer(f"R{record.id}", time - self.lower_ms + 1, watermark=self.watermarks[self.left])

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        row_id = timer.tag[1:]
        if timer.tag[0] == "R":  # no left record can reach this right one any more
            ctx.state(self.right_rows).remove(row_id)
            return
        lefts = ctx.state(self.left_rows)
        row = lefts.get(row_id)
        assert row is not None, f"left row {row_id!r} is held until its own timer"
        lefts.remove(row_id)
        if not row[2] and self.how == "left":
            # Decided now: stamped when decided (by event time for a join on another time column).
            stamp = timer.time if timer.watermark is None else max(_stamp(row, 3), ctx.low_watermark)
            ctx.produce(Record(ctx.key, self.combine(Record(ctx.key, row[1], _stamp(row, 3), row_id), None), stamp),
                        self.output)

    def _emit(self, ctx: Context, left: Record[Any], right: Record[Any]) -> None:
        ctx.produce(Record(ctx.key, self.combine(left, right), max(left.timestamp, right.timestamp)), self.output)


def _stamp(row: tuple[int, ...], index: int) -> int:
    """A row's event-time stamp (rows kept before stamps were stored have their join time)."""
    return row[index] if len(row) > index else row[0]
