"""Scenarios run by both runners (tests/spark/test_conformance.py compares their outputs).

Built to be insensitive to how Spark groups work into micro-batches, but to exercise every semantic:
out-of-order, late and duplicated records, fan-out with different key extractors, two inputs into
one computation, list/map/value state with JSON and pickle codecs, timers set, moved and deleted,
and a multi-stage chain whose downstream timers depend on upstream watermark holds.
"""

from __future__ import annotations

import random

from millstream import (
    Computation,
    ListState,
    MapState,
    PickleCodec,
    Pipeline,
    Record,
    ScriptedInjector,
    TimeDomain,
    ValueState,
)

BUCKET = 1000


class Windower(Computation):
    counts = MapState("counts")

    def process_record(self, ctx, record):
        if ctx.is_late:
            ctx.produce(Record(ctx.key, {"late_ts": record.timestamp, "id": record.id}, record.timestamp), "late")
        bucket = record.timestamp - record.timestamp % BUCKET
        counts = ctx.state(self.counts)
        counts.put(bucket, counts.get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + BUCKET)

    def process_timer(self, ctx, timer):
        bucket = timer.time - BUCKET
        counts = ctx.state(self.counts)
        ctx.produce(Record(ctx.key, {"bucket": bucket, "count": counts.get(bucket)}, timer.time), "windows")
        counts.remove(bucket)


class MinuteTotals(Computation):
    """Second stage: sums windows per 10-second span; its timers rely on the windower's held watermark."""

    totals = MapState("totals")
    spans = ListState("spans")
    emitted = ValueState("emitted", default=0)

    def process_record(self, ctx, record):
        span = record.value["bucket"] - record.value["bucket"] % 10_000
        totals = ctx.state(self.totals)
        totals.put(span, totals.get(span, 0) + record.value["count"])
        if span not in ctx.state(self.spans).get():
            ctx.state(self.spans).append(span)
        ctx.set_timer(f"s{span}", span + 10_000 + 1)  # windows are stamped with their end

    def process_timer(self, ctx, timer):
        span = timer.time - 10_000 - 1
        emitted = ctx.state(self.emitted)
        emitted.set(emitted.get() + 1)
        total = ctx.state(self.totals).get(span)
        ctx.state(self.totals).remove(span)
        ctx.state(self.spans).set([s for s in ctx.state(self.spans).get() if s != span])
        ctx.produce(Record(ctx.key, {"until": timer.time, "total": total, "nth": emitted.get()}, timer.time), "totals")


class Counter(Computation):
    """Counts per key, reports at one fixed time; moves and deletes timers on the way."""

    count = ValueState("count", default=0)

    def process_record(self, ctx, record):
        count = ctx.state(self.count)
        count.set(count.get() + 1)
        ctx.set_timer("report", 5_000)  # re-set each time: one report per key
        ctx.set_timer("never", 4_000)
        ctx.delete_timer("never")
        ctx.set_timer("moved", 1_500)
        ctx.set_timer("moved", 6_000)

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, {"tag": timer.tag, "count": ctx.state(self.count).get()}, timer.time), "counts")


class Joiner(Computation):
    """Pairs clicks with impressions of the same ad (two inputs, pickle-coded state)."""

    impressions = MapState("impressions", value_codec=PickleCodec())
    waiting = ListState("waiting", codec=PickleCodec())

    def process_record(self, ctx, record):
        if ctx.input_stream == "impressions":
            ctx.state(self.impressions).put(record.value["imp"], (record.timestamp, record.value["user"]))
            matched = [c for c in ctx.state(self.waiting).get() if c[0] == record.value["imp"]]
            for imp, click_ts in matched:
                self._join(ctx, imp, click_ts)
        else:
            imp = record.value["imp"]
            if ctx.state(self.impressions).contains(imp):
                self._join(ctx, imp, record.timestamp)
            else:
                ctx.state(self.waiting).append((imp, record.timestamp))
                ctx.set_timer(f"give-up-{imp}", record.timestamp + 3_000)

    def _join(self, ctx, imp, click_ts):
        imp_ts, user = ctx.state(self.impressions).get(imp)
        ctx.produce(Record(ctx.key, {"imp": imp, "user": user, "click": click_ts}, max(imp_ts, click_ts)), "joined")

    def process_timer(self, ctx, timer):
        imp = timer.tag.removeprefix("give-up-")
        if not ctx.state(self.impressions).contains(imp):
            ctx.produce(Record(ctx.key, {"imp": imp, "unjoinable": True}, timer.time), "joined")


def event_steps(seed: int = 5, steps: int = 12, per_step: int = 60):
    """Out-of-order events with late ones and duplicate ids, as injector steps."""
    rng = random.Random(seed)
    # Event time starts before the epoch: negative timestamps and watermarks are ordinary values.
    result, watermark, sent = [], -5_000, []
    for step in range(steps):
        records = []
        for i in range(per_step):
            ts = watermark + rng.randrange(0, 2_500)
            records.append(Record(f"k{rng.randrange(6)}", {"step": step, "i": i}, ts, f"s{step}-{i}"))
        if step >= 2:
            records.append(Record("k1", {"late": step}, watermark - 700, f"late-{step}"))  # behind the watermark
            records.append(sent[rng.randrange(len(sent))])  # a duplicate of an earlier record
            records.append(records[0])  # and one within the step
        sent.extend(records)
        watermark += 1_000
        result.append((records, watermark))
    return result


def click_steps(seed: int = 9, steps: int = 10):
    rng = random.Random(seed)
    impressions, clicks, watermark = [], [], 0
    for step in range(steps):
        imps, clks = [], []
        for i in range(8):
            imp = f"i{step}-{i}"
            ts = watermark + rng.randrange(1_000)
            imps.append(Record(imp, {"imp": imp, "ad": f"ad{rng.randrange(3)}", "user": f"u{rng.randrange(5)}"}, ts,
                               f"imp-{imp}"))
            if rng.random() < 0.7:
                clks.append(Record(imp, {"imp": imp, "ad": imps[-1].value["ad"], "user": imps[-1].value["user"]},
                                   ts + rng.randrange(50, 900), f"clk-{imp}"))
        clks.append(Record("x", {"imp": f"ghost{step}", "ad": "ad0", "user": "u0"}, watermark + 10, f"ghost-{step}"))
        watermark += 1_000
        impressions.append((imps, watermark))
        clicks.append((clks, watermark))
    # Clicks travel one step behind their impressions (some arrive late), so a click never races its
    # impression inside one micro-batch, where arrival order is not defined.
    delayed = [([], impressions[0][1])]
    delayed += [(clicks[step - 1][0], impressions[step][1]) for step in range(1, steps)]
    delayed.append((clicks[-1][0], impressions[-1][1]))
    return impressions, delayed


def conformance_pipeline() -> Pipeline:
    impressions, clicks = click_steps()
    return (
        Pipeline("conformance")
        .add_injector("events_in", ScriptedInjector("events_in", event_steps()), "events")
        .add_computation("windower", Windower(), ["events"], ["windows", "late"])
        .add_computation("totals", MinuteTotals(), ["windows"], ["totals"])
        .add_computation("counter", Counter(), {"events": lambda r: f"step{r.value.get('step', -1) % 3}"},
                         ["counts"])
        .add_injector("impressions_in", ScriptedInjector("impressions_in", impressions), "impressions")
        .add_injector("clicks_in", ScriptedInjector("clicks_in", clicks), "clicks")
        .add_computation("joiner", Joiner(), {"impressions": lambda r: r.value["ad"], "clicks": lambda r: r.value["ad"]},
                         ["joined"])
        .add_computation("per_user", Counter(), {"clicks": lambda r: r.value["user"]}, ["counts"])
    )


OUTPUT_STREAMS = ("windows", "late", "totals", "counts", "joined")
