"""Keyed watermarks (seed 001): a stream carries watermarks besides its low watermark, each named by a
watermark key and coalesced on its own over the senders that carry it; timers can follow one; a
computation forwards them; the interval join can run on a second time column by them. Expected
values come from plain-Python models written here, apart from the code under test."""

from __future__ import annotations

import random

import pytest

from millstream import Computation, GeneratorInjector, Pipeline, Record, ScriptedInjector, TimeDomain
from millstream.core.executor import ComputationFailed
from millstream.core.watermarks import WatermarkCoalescer
from millstream.joins import IntervalJoin
from millstream.model.pipeline import PipelineError
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME
from millstream.testing import PipelineHarness


# -- the coalescing rule ----------------------------------------------------------------------------

def test_each_watermark_key_is_coalesced_on_its_own_over_the_senders_that_carry_it():
    c = WatermarkCoalescer(["a", "b", "c"], keyed={"ship": ["a", "b"], "pay": ["c"]})
    c.advance("a", 100, keyed={"ship": 40})
    c.advance("b", 90, keyed={"ship": 70})
    point = c.advance("c", 10, keyed={"pay": 5})
    # The low watermark waits for all three; "ship" for a and b only; "pay" is c's alone.
    assert point.advanced_to == 10
    assert point.keyed_after() == {"pay": 5, "ship": 40}
    # A sender publishing its low watermark alone keeps its keyed ones.
    assert c.advance("a", 120).keyed_after() == {"pay": 5, "ship": 40}
    # Idleness is the sender's: an idle sender leaves every key's minimum.
    assert c.advance("a", 120, idle=True).keyed_after()["ship"] == 70
    # Waking up behind: the coalesced keyed watermark holds (never goes back).
    assert c.advance("a", 130, keyed={"ship": 50}).keyed_after()["ship"] == 70


def test_a_keyed_watermark_survives_restore():
    c = WatermarkCoalescer(["a", "b"], keyed={"ship": ["a", "b"]})
    c.advance("a", 1, keyed={"ship": 30})
    c.advance("b", 2, keyed={"ship": 20}, idle=True)
    again = WatermarkCoalescer.restore(c.inputs(), c.coalesced, c.idle(), keyed={"ship": ["a", "b"]},
                                       keyed_marks=c.keyed_inputs(), keyed_coalesced=c.keyed_watermarks())
    assert again.keyed_watermarks() == c.keyed_watermarks() == {"ship": 30}
    assert again.advance("a", 3, keyed={"ship": 35}).keyed_after() == c.advance("a", 3, keyed={"ship": 35}).keyed_after()


# -- timers on a keyed watermark, on the harness -------------------------------------------------------

class ShipTimer(Computation):
    """Per record, a timer at the record's ship time on the "ship" watermark; the firing reports
    what the two watermarks were."""

    def process_record(self, ctx, record):
        ctx.set_timer(f"t{record.id}", record.value["ship"], watermark="ship")

    def process_timer(self, ctx, timer):
        assert timer.watermark == "ship"
        ctx.produce(Record(ctx.key, {"time": timer.time, "ship_wm": ctx.watermark("ship"),
                                     "low_wm": ctx.low_watermark}, max(ctx.low_watermark, 0)), "fired")


class Forward(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, {**record.value, "seen_ship_wm": ctx.watermark("ship")}, record.timestamp), "seen")


def _script(rng, partitions, steps):
    """Per step and partition: records with ship times ahead of an honest ship watermark."""
    script = []
    ship_marks = {p: BEGINNING_OF_TIME for p in range(partitions)}
    for step in range(steps):
        partition = rng.randrange(partitions)
        base = step * 100 + partition * 7
        records = [Record(f"k{rng.randrange(3)}", {"ship": base + rng.randrange(300)}, step, f"r{step}-{i}")
                   for i in range(rng.randrange(4))]
        ship_marks[partition] = max(ship_marks[partition], base - 50 + rng.randrange(40))
        script.append((partition, records, ship_marks[partition]))
    return script


def _ship_after(script, partitions):
    """Plain model: the "ship" watermark after each feed is the minimum over partitions (a partition
    that never published holds it at the beginning of time)."""
    marks = {p: BEGINNING_OF_TIME for p in range(partitions)}
    after = []
    for partition, _, mark in script:
        marks[partition] = mark
        after.append(min(marks.values()))
    return after


def _ends(partitions):
    """After the script, each partition reaches the end of time, in turn."""
    return [(p, [], END_OF_TIME) for p in range(partitions)]


def _expected_firings(script, partitions):
    """A timer at t set in feed s fires in the first feed f >= s whose "ship" watermark reaches t (or
    at the end of input), reporting that watermark."""
    after = _ship_after(script + _ends(partitions), partitions)
    fired = []
    for s, (_, records, _) in enumerate(script):
        for record in records:
            t = record.value["ship"]
            f = next(f for f in range(s, len(after)) if after[f] >= t)
            fired.append((record.key, t, after[f]))
    return sorted(fired)


@pytest.mark.parametrize("seed", range(3))
def test_timers_on_a_keyed_watermark_fire_when_it_passes_whatever_the_low_watermark_does(seed):
    rng = random.Random(seed)
    script = _script(rng, 2, 30)
    # Fed by hand below: the injector only declares its two partitions and its watermark key.
    orders = GeneratorInjector(lambda i: Record("k", i, i), 0, lambda n: 0, partitions=2,
                               keyed_watermarks={"ship": lambda n: 0})
    other = ScriptedInjector("other", [], finish=False)  # never publishes: holds the low watermark back
    pipeline = (Pipeline("keyed")
                .add_injector("orders", orders, "orders")
                .add_injector("other", other, "other")
                .add_computation("timers", ShipTimer(), ["orders", "other"], ["fired"])
                .add_computation("forward", Forward(), ["fired"], ["seen"]))
    h = PipelineHarness(pipeline)
    for partition, records, mark in script:
        h.feed("orders", records, partition=str(partition), keyed={"ship": mark})
        h.run()
    for partition in ("0", "1"):
        h.advance_watermark("orders", END_OF_TIME, partition=partition, keyed={"ship": END_OF_TIME})
    h.run()
    fired = sorted((r.key, r.value["time"], r.value["ship_wm"]) for r in h.output("fired"))
    assert fired == _expected_firings(script, 2)
    assert {r.value["low_wm"] for r in h.output("fired")} == {BEGINNING_OF_TIME}  # "other" holds it
    # Forwarded downstream, and published: the consumer saw its producer's keyed watermark.
    assert h.keyed_watermarks("timers") == {"ship": END_OF_TIME}
    assert h.keyed_watermarks("forward") == {"ship": END_OF_TIME}
    # The consumer judges a record by the watermark before the point that carried it: a value its
    # producer published earlier, never one ahead of what the producer saw when it fired.
    published = {BEGINNING_OF_TIME} | set(_ship_after(script + _ends(2), 2))
    seen = h.output("seen")
    assert len(seen) == len(fired)
    assert all(r.value["seen_ship_wm"] <= r.value["ship_wm"] and r.value["seen_ship_wm"] in published for r in seen)
    assert h.low_watermark("timers") == BEGINNING_OF_TIME


def test_a_keyed_timer_belongs_to_the_input_point_whose_keyed_watermark_reached_it():
    # Two points in one step: the first moves "ship" to 50, the second to 200. A timer at 100 fires
    # in the second: its production says so by the watermark it saw.
    orders = ScriptedInjector("orders", [], watermark_keys=("ship",))
    pipeline = (Pipeline("points").add_injector("orders", orders, "orders")
                .add_computation("timers", ShipTimer(), ["orders"], ["fired"]))
    h = PipelineHarness(pipeline)
    h.feed("orders", [Record("k", {"ship": 100}, 1, "a"), Record("k", {"ship": 40}, 1, "b")], 5, keyed={"ship": 50})
    h.feed("orders", [], 6, keyed={"ship": 200})
    h.run()
    assert sorted((r.value["time"], r.value["ship_wm"]) for r in h.output("fired")) == [(40, 50), (100, 200)]


# -- mistakes are explained ---------------------------------------------------------------------------

def test_an_unknown_watermark_key_is_a_clear_error():
    class Wrong(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("t", 5, watermark="shipped")

    class Reads(Computation):
        def process_record(self, ctx, record):
            ctx.watermark("shipped")

    class WallKeyed(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("t", 5, TimeDomain.WALL_TIME, watermark="ship")

    for computation, words in ((Wrong(), "no input carries"), (Reads(), "no input carries"),
                               (WallKeyed(), "not wall time")):
        h = PipelineHarness(Pipeline("p").add_injector("in", ScriptedInjector(
            "in", [([Record("k", 1, 1)], 2)], watermark_keys=("ship",)), "in")
            .add_computation("c", computation, ["in"], []))
        with pytest.raises(ComputationFailed, match=words) as failure:
            h.run_injectors()
        assert "'ship'" in str(failure.value)
    with pytest.raises(PipelineError, match="watermark key"):
        Pipeline("p").add_injector("in", ScriptedInjector("in", [], watermark_keys=("bad key",)), "in")
    with pytest.raises(ValueError, match="not in watermark_keys"):
        ScriptedInjector("in", [([], 1, {"ship": 1})])


# -- the interval join on a second time column -----------------------------------------------------------

LOWER, UPPER = -30, 50
KEYS = ["a", "b"]


def join_side(rng, name, count, quiet=None):
    """Records whose join time ("t", in the value) jitters up to 40 behind the step's start; the
    event timestamp is unrelated to it. The keyed watermark on "t" is honest."""
    steps, records = [], []
    for step in range(count):
        base = step * 20
        batch = [] if quiet and quiet[0] <= step < quiet[1] else [
            Record(rng.choice(KEYS), {"t": base + rng.randrange(40), "v": f"{name}{step}-{i}"}, 10_000 - step,
                   f"{name}-{step}-{i}") for i in range(rng.randrange(3))]
        records.extend(batch)
        steps.append((batch, 0, {f"{name}_t": base - 20}))
    return steps, records


def join_oracle(lefts, rights, how):
    pairs = []
    for left in lefts:
        lt = left.value["t"]
        matches = [r for r in rights if r.key == left.key and lt + LOWER <= r.value["t"] <= lt + UPPER]
        pairs.extend((left.key, left.value["v"], r.value["v"]) for r in matches)
        if not matches and how == "left":
            pairs.append((left.key, left.value["v"], None))
    return sorted(pairs, key=repr)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("how", ["inner", "left"])
def test_interval_join_on_keyed_watermarks_equals_the_oracle_with_one_side_idle(seed, how):
    rng = random.Random(seed)
    left_steps, lefts = join_side(rng, "l", 40)
    right_steps, rights = join_side(rng, "r", 40, quiet=(10, 25))
    # The right side is quiet for a stretch: its keyed watermark stays put, then it is declared idle.
    right_steps = [(r, w, k if not 10 <= i < 25 else right_steps[9][2]) for i, (r, w, k) in enumerate(right_steps)]
    join = IntervalJoin("L", "R", LOWER, UPPER, how=how, late_stream="late",
                        left_time=lambda r: r.value["t"], right_time=lambda r: r.value["t"],
                        left_watermark="l_t", right_watermark="r_t")
    pipeline = (Pipeline("join")
                .add_injector("left", ScriptedInjector("left", left_steps, watermark_keys=("l_t",)), "L")
                .add_injector("right", ScriptedInjector("right", right_steps, watermark_keys=("r_t",)), "R",
                              idle_after_ms=100)
                .add_computation("join", join, ["L", "R"], join.outputs))
    h = PipelineHarness(pipeline)
    for step in range(41):
        if 12 <= step < 25:
            h.advance_wall_time(h.wall_time + 150)
        h.pull_injectors()
        h.step()
    h.run_injectors()
    joined = sorted(((r.key, r.value["left"]["v"], r.value["right"] and r.value["right"]["v"])
                     for r in h.output("joined")), key=repr)
    assert joined == join_oracle(lefts, rights, how)
    assert h.output("late") == []
    assert h.keys("join") == []  # every row let go once the other side's keyed watermark passed it
    # The event-time low watermark never moved (both sides publish 0): the keyed ones did the work.
    assert h.input_watermark("join") <= 0 or h.input_watermark("join") == END_OF_TIME


def test_join_time_and_its_watermark_go_together():
    with pytest.raises(ValueError, match="go together"):
        IntervalJoin("L", "R", 0, 1, left_time=lambda r: 1)


def test_heuristic_watermark_passes_keyed_watermarks_through_strict():
    from millstream import HeuristicWatermark

    inner = GeneratorInjector(lambda i: Record("k", {"ship": 10 * i}, i), 100, lambda n: n,
                              keyed_watermarks={"ship": lambda n: 10 * n}, max_records_per_read=30)
    wrapped = HeuristicWatermark(inner, quantile=0.9)
    assert wrapped.watermark_keys == ("ship",)
    offset = wrapped.latest_offset("0", wrapped.initial_offset("0"), None)
    assert wrapped.keyed_watermarks("0", offset) == {"ship": 300}
