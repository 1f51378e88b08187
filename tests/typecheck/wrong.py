"""Checked by mypy (tests/test_typing.py), never run: each line marked `# wrong` must be refused.
If the typed API returned Any, mypy would accept them all."""

from __future__ import annotations

from millstream import Computation, Context, ListState, MapState, Record, ValueState


class Wrong(Computation):
    count = ValueState("count", default=0)
    seen: ListState[str] = ListState("seen")
    per_page: MapState[str, float] = MapState("per_page")
    bad_default: ValueState[int] = ValueState("bad", default="zero")  # wrong
    last: ValueState[str] = ValueState("last")  # wrong
    claims = ValueState[int]("claims")  # no default: mypy makes it a ValueState[int | None]
    maybe: ValueState[str | None] = ValueState("maybe")
    untyped = ValueState("untyped")  # no default, no declared type: a ValueState[None]

    def process_record(self, ctx: Context, record: Record[dict[str, int]]) -> None:
        text: str = ctx.state(self.count).get()  # wrong
        ctx.state(self.count).set("one")  # wrong
        first: int = ctx.state(self.seen).get()  # wrong
        ctx.state(self.seen).append(3)  # wrong
        rate: str = ctx.state(self.per_page).get("home")  # wrong
        plus: float = ctx.state(self.per_page).get("home") + 1  # wrong
        other: float = ctx.state(self.per_page).get("home", "none")  # wrong
        ctx.state(self.per_page).put(1, 2.0)  # wrong
        clicks: str = record.value["clicks"]  # wrong
        name: str = ctx.state(self.maybe).get()  # wrong
        number: int = ctx.state(self.claims).get()  # wrong
        ctx.state(self.untyped).set(record.key)  # wrong
        del text, first, rate, clicks, name, number
