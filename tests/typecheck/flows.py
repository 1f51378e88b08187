"""Checked by mypy (tests/test_typing.py), never run: the typed API as a user's code sees it.

Every line here must type-check. The assignments alone would also pass if the API returned Any, so
tests/typecheck/wrong.py holds the same uses with the wrong types, each of which mypy must refuse.
"""

from __future__ import annotations

from typing import Iterator

from millstream import (
    Computation, Context, Count, ListState, MapState, Pipeline, Record, Sum, Timer, TumblingWindows, ValueState,
    WindowAggregate,
)


class Typed(Computation):
    count = ValueState("count", default=0)  # inferred from the default: ValueState[int]
    last: ValueState[str | None] = ValueState("last")  # no default: get() is None until set
    first = ValueState("first", default="")  # ValueState[str]
    seen: ListState[str] = ListState("seen")
    per_page: MapState[str, float] = MapState("per_page")

    def process_record(self, ctx: Context, record: Record[dict[str, int]]) -> None:
        count: int = ctx.state(self.count).get()
        ctx.state(self.count).set(count + 1)
        ctx.state(self.last).set(record.key)
        previous: str | None = ctx.state(self.last).get()
        name: str = ctx.state(self.first).get() or record.key
        names: list[str] = ctx.state(self.seen).get()
        ctx.state(self.seen).append(record.key)
        maybe: float | None = ctx.state(self.per_page).get("home")
        surely: float = ctx.state(self.per_page).get("home", 0.0) + 1  # with a default: no None
        entries: Iterator[tuple[str, float]] = ctx.state(self.per_page).items()
        clicks: int = record.value["clicks"]
        del names, maybe, surely, entries, clicks, previous, name

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        due: int = timer.time
        ctx.produce(Record(ctx.key, {"due": due}, due), "out")


counts = WindowAggregate(TumblingWindows(1_000), Count(), "counts")
sums = WindowAggregate(TumblingWindows(1_000), Sum(), "sums")
pipeline: Pipeline = Pipeline("typed").add_computation("typed", Typed(), ["in"], ["out"])
