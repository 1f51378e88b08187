"""KeyGroupExecutor, the semantic core: per-key invocation, timers, dedup by record id, lateness, ids.

Driven directly (no harness) so each step's input points and wall time are chosen by the test, and
compared with a plain-Python model of the documented semantics.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import xxhash

from millstream import (Computation, JsonCodec, ListState, MapState, PickleCodec, Pipeline, Record, ScriptedInjector,
                        StrCodec, TimeDomain, ValueState)
from millstream.core.executor import (ComputationError, ComputationFailed, Delivery, KeyGroupExecutor, StepMetrics,
                                      inspect_key, record_cause, timer_cause, timer_setter)
from millstream.core.plan import plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, derive_record_id
from millstream.testing import PipelineHarness

LW = TimeDomain.LOW_WATERMARK
WALL = TimeDomain.WALL_TIME


def make_executor(computation: Computation, outputs=("out",), dedup_horizon_ms: int | None = None,
                  name: str = "comp", **options) -> KeyGroupExecutor:
    pipeline = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
    kwargs = {} if dedup_horizon_ms is None else {"dedup_horizon_ms": dedup_horizon_ms}
    pipeline.add_computation(name, computation, ["in"], list(outputs), **kwargs, **options)
    return KeyGroupExecutor(plan_computation(pipeline, name, key_groups=1), MemoryKeyStore())


def deliver(key: str, value, ts: int = 0, rid: str | None = None) -> Delivery:
    return Delivery(key, "in", Record(key, value, ts, rid or f"id-{key}-{value}-{ts}"), 0, True)


def pending(ex: KeyGroupExecutor) -> tuple[int | None, int | None]:
    """The earliest pending low-watermark and wall-time user timers over all keys."""
    timers = [t for key in ex.store.keys() for t in inspect_key(ex.plan, ex.store.load([key])[key])[1]]
    lw = [t.time for t in timers if t.domain is LW]
    wall = [t.time for t in timers if t.domain is WALL]
    return (min(lw) if lw else None), (min(wall) if wall else None)


def step(ex: KeyGroupExecutor, deliveries, low_watermark: int, wall_time: int, advanced_watermark: int | None = None):
    """One step with one input point: records judged by `low_watermark`, timers fired by
    `advanced_watermark` (default: the same)."""
    advanced = low_watermark if advanced_watermark is None else max(low_watermark, advanced_watermark)
    return ex.step(list(deliveries), [Segment(low_watermark, advanced)], wall_time)


# -- a scriptable computation: record values are timer operations -----------------------------------
class TimerScript(Computation):
    """value = list of ops: ["set", tag, time, domain] | ["del", tag]. A fired timer whose tag is
    "cN" (N > 0) chains: it sets "c{N-1}" in the same domain 7 ms later. Every firing is logged."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, str, str, int, int]] = []

    def process_record(self, ctx, record):
        for op in record.value:
            if op[0] == "set":
                ctx.set_timer(op[1], op[2], TimeDomain(op[3]))
            else:
                ctx.delete_timer(op[1])

    def process_timer(self, ctx, timer):
        assert ctx.input_stream is None and not ctx.is_late
        self.log.append((ctx.key, timer.time, timer.tag, timer.domain.value, ctx.low_watermark, ctx.wall_time))
        if timer.tag.startswith("c") and int(timer.tag[1:]) > 0:
            ctx.set_timer(f"c{int(timer.tag[1:]) - 1}", timer.time + 7, timer.domain)


class TimerModel:
    """Plain-Python ground truth: pending[key][tag] = (time, domain); fire the minimum due (time, tag)
    until none is due, chaining like TimerScript."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, tuple[int, str]]] = defaultdict(dict)
        self.log: list[tuple[str, int, str, str, int, int]] = []

    def apply(self, key, ops):
        for op in ops:
            if op[0] == "set":
                self.pending[key][op[1]] = (op[2], op[3])
            else:
                self.pending[key].pop(op[1], None)

    def fire(self, keys, lw, wall):
        for key in keys:
            timers = self.pending[key]
            while True:
                due = [(t, tag) for tag, (t, d) in timers.items()
                       if (t <= lw if d == LW.value else t <= wall)]
                if not due:
                    break
                time, tag = min(due)
                domain = timers.pop(tag)[1]
                self.log.append((key, time, tag, domain, lw, wall))
                if tag.startswith("c") and int(tag[1:]) > 0:
                    timers[f"c{int(tag[1:]) - 1}"] = (time + 7, domain)


def per_key(log):
    grouped = defaultdict(list)
    for entry in log:
        grouped[entry[0]].append(entry)
    return dict(grouped)


# -- timers ------------------------------------------------------------------------------------------
def test_timers_fire_in_time_then_tag_order_within_a_key():
    comp = TimerScript()
    ex = make_executor(comp)
    ops = [["set", "b", 20, "low_watermark"], ["set", "z", 10, "low_watermark"],
           ["set", "a", 20, "low_watermark"], ["set", "m", 10, "low_watermark"],
           ["set", "later", 31, "low_watermark"]]
    step(ex, [deliver("k", ops)], low_watermark=0, wall_time=0)
    assert comp.log == []
    result = step(ex, [], low_watermark=30, wall_time=0)
    assert [(t, tag) for _, t, tag, *_ in comp.log] == [(10, "m"), (10, "z"), (20, "a"), (20, "b")]
    assert result.metrics.timers_fired == 4
    assert pending(ex)[0] == 31


def test_low_watermark_timer_never_fires_before_the_input_low_watermark_reaches_it():
    comp = TimerScript()
    ex = make_executor(comp)
    step(ex, [deliver("k", [["set", "t", 100, "low_watermark"]])], 0, 0)
    for lw in (1, 50, 99):
        step(ex, [], lw, wall_time=10**9)  # wall time far ahead must not matter
        assert comp.log == []
    step(ex, [], 100, 0)
    assert comp.log == [("k", 100, "t", "low_watermark", 100, 0)]


def test_wall_time_timers_follow_the_wall_clock_not_the_low_watermark():
    comp = TimerScript()
    ex = make_executor(comp)
    step(ex, [deliver("k", [["set", "w", 1_000, "wall_time"]])], 0, 0)
    result = step(ex, [], END_OF_TIME, 999)  # low watermark at the end of time: irrelevant
    assert comp.log == [] and pending(ex)[1] == 1_000 and pending(ex)[0] is None
    result = step(ex, [], END_OF_TIME, 1_000)
    assert comp.log == [("k", 1_000, "w", "wall_time", END_OF_TIME, 1_000)]
    assert pending(ex)[1] is None


def test_timer_set_behind_the_low_watermark_fires_in_the_same_step():
    comp = TimerScript()
    ex = make_executor(comp)
    result = step(ex, [deliver("k", [["set", "behind", 40, "low_watermark"],
                                    ["set", "at", 50, "low_watermark"],
                                    ["set", "ahead", 51, "low_watermark"]])], 50, 0)
    assert [(t, tag) for _, t, tag, *_ in comp.log] == [(40, "behind"), (50, "at")]
    assert pending(ex)[0] == 51


def test_timer_set_from_process_timer_behind_watermark_fires_in_the_same_step():
    comp = TimerScript()
    ex = make_executor(comp)
    step(ex, [deliver("k", [["set", "c3", 10, "low_watermark"]])], 0, 0)
    step(ex, [], 100, 0)  # c3@10 -> c2@17 -> c1@24 -> c0@31, all due at 100
    assert [(t, tag) for _, t, tag, *_ in comp.log] == [(10, "c3"), (17, "c2"), (24, "c1"), (31, "c0")]


def test_a_timer_set_at_a_later_input_point_fires_there_not_at_an_earlier_one():
    # Four input points in one step; point j fires timers by 100 j + 99. Key "a" sets timers behind
    # every watermark at points 1, 2 and 3 (one tag twice); key "b" sets one at point 0. As if the
    # points came one at a time, each fires at the point it was set in, seeing that point's watermark.
    comp = TimerScript()
    ex = make_executor(comp)
    segments = [Segment(100 * j, 100 * j + 99) for j in range(4)]
    deliveries = [Delivery("b", "in", Record("b", [["set", "early", 5, "low_watermark"]], 10, "b0"), 0, True),
                  Delivery("a", "in", Record("a", [["set", "x", 50, "low_watermark"]], 150, "a1"), 1, True),
                  Delivery("a", "in", Record("a", [["set", "y", 40, "low_watermark"],
                                                   ["set", "z", 60, "low_watermark"]], 250, "a2"), 2, True),
                  Delivery("a", "in", Record("a", [["set", "z", 30, "low_watermark"]], 350, "a3"), 3, True)]
    ex.step(deliveries, segments, 0)
    # (key, time, tag, the low watermark the firing saw): "z" fires at point 2 as set there, then again
    # at point 3 as set again there.
    assert sorted((key, time, tag, low_watermark) for key, time, tag, _, low_watermark, _ in comp.log) == [
        ("a", 30, "z", 399), ("a", 40, "y", 299), ("a", 50, "x", 199), ("a", 60, "z", 299), ("b", 5, "early", 99)]


class _OrderLog(Computation):
    """Logs (tag, time, the low watermark seen) per firing. "A" sets X far ahead; "B" sets X behind
    every watermark."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, int]] = []

    def process_record(self, ctx, record):
        for tag, time, domain, watermark in record.value:
            ctx.set_timer(tag, time, TimeDomain(domain), watermark=watermark)

    def process_timer(self, ctx, timer):
        self.log.append((timer.tag, timer.time, ctx.low_watermark))
        if timer.tag == "A":
            ctx.set_timer("X", 10**6)
        if timer.tag == "B":
            ctx.set_timer("X", 5)


def test_timers_of_a_multi_point_step_fire_point_by_point_not_by_time_alone():
    # Three input points: the low watermark reaches 10, 20, 300; the keyed watermark "ship" reaches
    # 1000 at the first. B@500 follows "ship" (due at point 0), A@100 the low watermark (due at point
    # 2). As if the points came one at a time: B fires at point 0 and sets X@5, which fires there too;
    # A fires at point 2 and sets X far ahead, where it stays pending. By time alone A would fire first
    # and B's X@5 would replace the X that A set.
    comp = _OrderLog()
    pipeline = Pipeline("p").add_injector("src", ScriptedInjector("src", [], watermark_keys=("ship",)), "in")
    pipeline.add_computation("comp", comp, ["in"], ["out"])
    ex = KeyGroupExecutor(plan_computation(pipeline, "comp", key_groups=1), MemoryKeyStore())
    ops = [("A", 100, "low_watermark", None), ("B", 500, "low_watermark", "ship")]
    ex.step([Delivery("k", "in", Record("k", ops, 0, "r0"), 0, True)], [Segment(0, 0, (), False, (("ship", 0, 0),))], 0)
    ex.step([], [Segment(0, 10, (), False, (("ship", 0, 1000),)), Segment(10, 20, (), False, (("ship", 1000, 1000),)),
                 Segment(20, 300, (), False, (("ship", 1000, 1000),))], 0)
    assert comp.log == [("B", 500, 10), ("X", 5, 10), ("A", 100, 300)]
    assert pending(ex) == (10**6, None)


def test_in_a_multi_point_step_low_watermark_timers_of_earlier_points_fire_before_wall_timers():
    # Wall-time firings belong to the step's last point: a low-watermark timer due at an earlier point
    # fires first, whatever the two times (they are on different clocks).
    comp = TimerScript()
    ex = make_executor(comp)
    step(ex, [deliver("k", [["set", "w", 0, "wall_time"], ["set", "l", 150, "low_watermark"]])], 0, -1)
    ex.step([], [Segment(0, 99), Segment(99, 199), Segment(199, 299)], 10)
    assert [(tag, low_watermark) for _, _, tag, _, low_watermark, _ in comp.log] == [("l", 199), ("w", 299)]


def test_delete_timer_cancels_in_the_same_step_and_across_steps():
    comp = TimerScript()
    ex = make_executor(comp)
    step(ex, [deliver("k", [["set", "x", 10, "low_watermark"], ["del", "x"],
                           ["set", "y", 10, "low_watermark"], ["set", "w", 5, "wall_time"]])], 0, 0)
    result = step(ex, [deliver("k", [["del", "y"], ["del", "w"], ["del", "never-set"]], ts=1)], 0, 0)
    assert pending(ex)[0] is None and pending(ex)[1] is None
    step(ex, [], END_OF_TIME, 10**12)
    assert comp.log == []


def test_resetting_a_tag_moves_the_timer_later_earlier_and_across_domains():
    comp = TimerScript()
    ex = make_executor(comp)
    step(ex, [deliver("k", [["set", "t", 10, "low_watermark"], ["set", "t", 30, "low_watermark"]])], 0, 0)
    step(ex, [], 20, 0)
    assert comp.log == []  # moved from 10 to 30: nothing at 20
    step(ex, [deliver("k", [["set", "t", 25, "low_watermark"]], ts=21)], 20, 0)
    step(ex, [], 25, 0)
    assert [(t, tag) for _, t, tag, *_ in comp.log] == [(25, "t")]  # fired once, at its new time
    step(ex, [], 100, 0)
    assert len(comp.log) == 1
    # Same tag re-set in the other domain: one timer, now following the wall clock.
    step(ex, [deliver("k", [["set", "u", 200, "low_watermark"], ["set", "u", 50, "wall_time"]], ts=101)], 100, 0)
    step(ex, [], 300, 49)
    assert len(comp.log) == 1
    step(ex, [], 300, 50)
    assert comp.log[-1][1:4] == (50, "u", "wall_time")


def _random_ops(rng, key_tags, lw, wall, future_only):
    ops = []
    for _ in range(rng.randint(1, 4)):
        tag = rng.choice(key_tags)
        if rng.random() < 0.2:
            ops.append(["del", tag])
            continue
        domain = rng.choice(["low_watermark", "low_watermark", "wall_time"])
        clock = lw if domain == "low_watermark" else wall
        if future_only:
            time = clock + rng.randint(1, 120)
        else:
            time = clock + rng.randint(-60, 120)
        ops.append(["set", tag, time, domain])
    return ops


@pytest.mark.parametrize("future_only", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_randomized_timers_match_plain_model(seed, future_only):
    rng = random.Random(1000 * seed + future_only)
    comp = TimerScript()
    ex = make_executor(comp)
    model = TimerModel()
    keys = [f"key{i}" for i in range(40)]
    tags = ["a", "b", "x", "c2", "c3", "zz"]
    lw, wall, serial = 0, 0, 0
    for _ in range(60):
        deliveries, touched = [], []
        for _ in range(rng.randint(0, 25)):
            key = rng.choice(keys)
            ops = _random_ops(rng, tags, lw, wall, future_only)
            serial += 1
            deliveries.append(deliver(key, ops, ts=lw, rid=f"r{serial}"))
            model.apply(key, ops)
            if key not in touched:
                touched.append(key)
        before = len(comp.log)
        step(ex, deliveries, lw, wall)
        model.fire(keys, lw, wall)
        # Every batch of firings for one key within a step is in (time, tag) order per domain-clock.
        batch = per_key(comp.log[before:])
        for entries in batch.values():
            assert [(t, tag) for _, t, tag, *_ in entries] == sorted((t, tag) for _, t, tag, *_ in entries)
        lw += rng.choice([0, 0, 5, 20, 60])
        wall += rng.choice([0, 10, 40])
    step(ex, [], END_OF_TIME, 10**12)
    model.fire(keys, END_OF_TIME, 10**12)
    assert len(comp.log) > 100
    assert per_key(comp.log) == per_key(model.log)
    for _, time, _, domain, lw_at, wall_at in comp.log:
        assert time <= (lw_at if domain == "low_watermark" else wall_at), "timer fired before it was due"
    if future_only:
        # Times set only ahead of their clock: each key's whole history is ordered per domain.
        for entries in per_key(comp.log).values():
            for domain in ("low_watermark", "wall_time"):
                seq = [(t, tag) for _, t, tag, d, *_ in entries if d == domain]
                assert seq == sorted(seq)


class _Rearm(Computation):
    """Each record sets `value` timers on its key; each firing sets its own tag again, far ahead."""

    def process_record(self, ctx, record):
        for i in range(record.value):
            ctx.set_timer(f"t{i}", 10 + i)

    def process_timer(self, ctx, timer):
        ctx.set_timer(timer.tag, 10**12 + timer.time)


@pytest.mark.parametrize("points", [1, 2])
def test_firings_that_set_timers_do_not_sort_the_keys_timers_again_each_time(monkeypatch, points):
    """A key with N due timers whose firings each set a timer: the due timers are not taken and sorted
    again per firing (N firings x N timers), in one input point or several."""
    import millstream.core.executor as executor_module

    n = 600
    ex = make_executor(_Rearm())
    step(ex, [deliver("k", n, ts=1)], 0, 0)
    sorted_items = [0]

    def counting_sorted(items, **kwargs):
        items = list(items)
        sorted_items[0] += len(items)
        return sorted(items, **kwargs)

    monkeypatch.setattr(executor_module, "sorted", counting_sorted, raising=False)
    segments = [Segment(10**9, 10**9)] if points == 1 else [Segment(5, 5), Segment(10**9, 10**9)]
    ex.step([], segments, 0)
    assert [t.time for t in inspect_key(ex.plan, ex.store.load(["k"])["k"])[1]] == \
        sorted(10**12 + 10 + i for i in range(n))
    assert sorted_items[0] <= 4 * n


class _RandomFiringOps(Computation):
    """Every firing runs timer operations drawn from its own (key, tag, time): sets other tags or its
    own at later times, due now or not, in either domain, deletes tags, clears the key, or nothing.
    Every firing is logged."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, str, str]] = []

    def process_record(self, ctx, record):
        for tag, time, domain in record.value:
            ctx.set_timer(tag, time, TimeDomain(domain))

    def process_timer(self, ctx, timer):
        self.log.append((ctx.key, timer.time, timer.tag, timer.domain.value))
        for op in _firing_ops(ctx.key, timer.tag, timer.time):
            if op[0] == "del":
                ctx.delete_timer(op[1])
            elif op[0] == "clear":
                ctx.clear()
            else:
                ctx.set_timer(op[1], op[2], TimeDomain(op[3]))


_FIRING_TAGS = [f"g{i}" for i in range(12)]


def _firing_ops(key: str, tag: str, time: int) -> list[tuple]:
    rng = random.Random(f"{key}|{tag}|{time}")
    ops: list[tuple] = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        other = rng.choice(_FIRING_TAGS + [tag])
        draw = rng.random()
        if draw < 0.03:
            ops.append(("clear",))
        elif draw < 0.25:
            ops.append(("del", other))
        else:  # later than the firing: chains end
            ops.append(("set", other, time + rng.randint(1, 40), rng.choice(["low_watermark", "wall_time"])))
    return ops


def _model_firings(pending: dict[str, dict[str, tuple[int, str]]], keys, lw: int, wall: int, log: list) -> None:
    """Plain-Python ground truth for one single-point step: per key, fire the least due (time, tag)
    until none is due, applying the firing's operations."""
    for key in keys:
        timers = pending[key]
        while True:
            due = [(t, tag) for tag, (t, d) in timers.items() if t <= (lw if d == "low_watermark" else wall)]
            if not due:
                break
            time, tag = min(due)
            domain = timers.pop(tag)[1]
            log.append((key, time, tag, domain))
            for op in _firing_ops(key, tag, time):
                if op[0] == "del":
                    timers.pop(op[1], None)
                elif op[0] == "clear":
                    timers.clear()
                else:
                    timers[op[1]] = (op[2], op[3])


@pytest.mark.parametrize("seed", range(6))
def test_timers_set_and_deleted_by_firings_fire_as_a_plain_model_says(seed):
    rng = random.Random(seed)
    comp = _RandomFiringOps()
    ex = make_executor(comp)
    keys = [f"key{i}" for i in range(15)]
    pending: dict[str, dict[str, tuple[int, str]]] = defaultdict(dict)
    log: list = []
    lw, wall, serial = 0, 0, 0
    for _ in range(40):
        deliveries = []
        for _ in range(rng.randint(0, 12)):
            key = rng.choice(keys)
            sets = [(rng.choice(_FIRING_TAGS), rng.randint(lw - 20, lw + 150),
                     rng.choice(["low_watermark", "wall_time"])) for _ in range(rng.randint(1, 6))]
            serial += 1
            deliveries.append(deliver(key, sets, ts=lw, rid=f"r{serial}"))
            for tag, time, domain in sets:
                pending[key][tag] = (time, domain)
        step(ex, deliveries, lw, wall)
        _model_firings(pending, keys, lw, wall, log)
        lw += rng.choice([0, 10, 40, 90])
        wall += rng.choice([0, 10, 60])
    step(ex, [], END_OF_TIME, 10**12)
    _model_firings(pending, keys, END_OF_TIME, 10**12, log)
    assert len(comp.log) > 300
    assert per_key(comp.log) == per_key(log)


def test_timers_of_many_keys_are_all_found_via_the_store_index():
    comp = TimerScript()
    ex = make_executor(comp)
    keys = [f"k{i}" for i in range(300)]
    step(ex, [deliver(k, [["set", "t", i, "low_watermark"]]) for i, k in enumerate(keys)], -1, 0)
    step(ex, [], 149, 0)
    assert sorted(k for k, *_ in comp.log) == sorted(keys[:150])
    step(ex, [], 10_000, 0)
    assert sorted(k for k, *_ in comp.log) == sorted(keys)


# -- exactly-once delivery ---------------------------------------------------------------------------
class Counter(Computation):
    count = ValueState("count", default=0)

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []

    def process_record(self, ctx, record):
        self.seen.append((record.id, record.value, ctx.is_late))
        handle = ctx.state(self.count)
        handle.set(handle.get() + 1)


def _count(ex, key):
    return inspect_key(ex.plan, ex.store.load([key]).get(key))[0].get("count", 0)


def test_duplicates_in_one_step_and_across_steps_are_processed_once():
    comp = Counter()
    ex = make_executor(comp)
    r1 = deliver("k", "a", 1, "id1")
    r2 = deliver("k", "b", 1, "id2")
    result = step(ex, [r1, r1, r2, r1], 0, 0)
    assert (result.metrics.records, result.metrics.duplicates) == (2, 2)
    result = step(ex, [r2, r1], 0, 0)
    assert (result.metrics.records, result.metrics.duplicates) == (0, 2)
    assert [rid for rid, *_ in comp.seen] == ["id1", "id2"]
    assert _count(ex, "k") == 2


def test_dedup_is_per_key_state():
    # The same id under another key is another key's delivery (ids are unique per record, and a
    # record goes to one key of a computation): it is not a duplicate of the first key's record.
    comp = Counter()
    ex = make_executor(comp)
    step(ex, [deliver("a", "x", 1, "same")], 0, 0)
    result = step(ex, [deliver("b", "x", 1, "same")], 0, 0)
    assert result.metrics.records == 1


def test_ids_beyond_the_dedup_horizon_are_forgotten():
    comp = Counter()
    ex = make_executor(comp, dedup_horizon_ms=100)
    rec = deliver("k", "v", 1_000, "dup")
    other = deliver("k", "w", 1_000, "other")
    step(ex, [rec], 1_000, 0)  # seen at low watermark 1000
    assert step(ex, [rec], 1_100, 0).metrics.duplicates == 1  # 100 ms later: still within the horizon
    step(ex, [other], 1_101, 0)  # the key is touched after the horizon passed: "dup" is forgotten
    result = step(ex, [rec], 1_101, 0)
    assert (result.metrics.records, result.metrics.duplicates) == (1, 0)
    assert [rid for rid, *_ in comp.seen] == ["dup", "other", "dup"]


def test_zero_horizon_still_dedups_within_one_low_watermark():
    comp = Counter()
    ex = make_executor(comp, dedup_horizon_ms=0)
    rec = deliver("k", "v", 5, "dup")
    step(ex, [rec], 5, 0)
    assert step(ex, [rec], 5, 0).metrics.duplicates == 1


# -- lateness ----------------------------------------------------------------------------------------
def test_late_records_reach_user_code_flagged_and_counted():
    comp = Counter()
    ex = make_executor(comp)
    result = step(ex, [
        deliver("k", "behind", 99, "r1"),
        deliver("k", "at", 100, "r2"),
        deliver("k", "ahead", 101, "r3"),
        deliver("j", "way-behind", BEGINNING_OF_TIME, "r4"),
    ], 100, 0)
    assert sorted(comp.seen) == sorted([("r1", "behind", True), ("r2", "at", False), ("r3", "ahead", False),
                                        ("r4", "way-behind", True)])
    assert (result.metrics.records, result.metrics.late) == (4, 2)


def test_nothing_is_late_at_the_beginning_of_time():
    comp = Counter()
    ex = make_executor(comp)
    result = step(ex, [deliver("k", "v", BEGINNING_OF_TIME, "r")], BEGINNING_OF_TIME, 0)
    assert result.metrics.late == 0


class AtItsRecord(Computation):
    """Sets an event-time timer at each record's timestamp, and a wall-time timer holding the output
    watermark there; produces (timer, its time, the watermark) as each fires."""

    def process_record(self, ctx, record):
        ctx.set_timer("event", record.timestamp)
        ctx.set_timer("held", 1_000, TimeDomain.WALL_TIME, hold=record.timestamp)

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, [timer.tag, timer.time, ctx.low_watermark], timer.time), "out")


def test_a_record_stamped_at_the_beginning_of_time_can_set_timers_and_holds_at_its_timestamp():
    h = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                        .add_computation("c", AtItsRecord(), ["in"], ["out"]), wall_time=0)
    h.feed("src", [Record("k", None, BEGINNING_OF_TIME)])  # the watermark stays at the beginning of time
    h.run()
    assert [r.value for r in h.output("out")] == [["event", BEGINNING_OF_TIME, BEGINNING_OF_TIME]]
    assert [(t.tag, t.time, t.hold) for t in h.pending_timers("c", "k")] == [("held", 1_000, BEGINNING_OF_TIME)]
    h.advance_watermark("src", 500)
    h.run()
    assert h.low_watermark("c") == BEGINNING_OF_TIME  # held at the record's timestamp
    h.advance_wall_time(1_000)
    h.run()
    assert [r.value[:2] for r in h.output("out")] == [["event", BEGINNING_OF_TIME], ["held", 1_000]]
    assert h.low_watermark("c") == 500 and h.pending_timers("c", "k") == []


# -- production ids ----------------------------------------------------------------------------------
class Emitter(Computation):
    """Produces two records per input and, from a timer, two more."""

    def process_record(self, ctx, record):
        assert ctx.input_stream == "in" and ctx.key == record.key
        ctx.produce(Record(record.key, f"{record.value}-0", record.timestamp), "out")
        ctx.produce(Record(record.key, f"{record.value}-1", record.timestamp), "side")
        ctx.set_timer(f"flush-{record.value}", record.timestamp + 10)

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, f"t{timer.time}-0", timer.time), "out")
        ctx.produce(Record(ctx.key, f"t{timer.time}-1", timer.time), "out")


def _emitter_run():
    ex = make_executor(Emitter(), outputs=("out", "side"))
    ids = []
    for number, lw in enumerate((0, 15, 40, 100)):
        deliveries = [deliver(k, f"v{number}", ts=lw + 1, rid=f"{k}-{number}") for k in ("a", "b", "c")]
        ids += [(p.stream, p.key, p.value, p.id) for p in step(ex, deliveries, lw, 0).productions]
    ids += [(p.stream, p.key, p.value, p.id) for p in step(ex, [], END_OF_TIME, 0).productions]
    return ids


def test_production_ids_are_deterministic_and_unique():
    first, second = _emitter_run(), _emitter_run()
    assert first == second
    assert len(first) == 3 * 4 * 2 + 3 * 4 * 2  # 2 per record, 2 per timer
    assert len({i for *_, i in first}) == len(first), "two productions share an id"


def test_production_ids_follow_documented_derivation():
    ex = make_executor(Emitter(), outputs=("out", "side"), name="emit")
    result = step(ex, [deliver("a", "v", 1, "cause-1")], 0, 0)
    assert [p.id for p in result.productions] == [
        derive_record_id("emit", "r", "in", "cause-1", 0), derive_record_id("emit", "r", "in", "cause-1", 1)]
    # Different cause or different producer -> different id.
    assert derive_record_id("emit", "r", "in", "cause-1", 0) != derive_record_id("emit", "r", "in", "cause-2", 0)
    assert derive_record_id("emit", "r", "in", "cause-1", 0) != derive_record_id("other", "r", "in", "cause-1", 0)


@pytest.mark.parametrize("kept", [1, 2, 4096])
def test_timer_production_ids_do_not_depend_on_the_time_texts_a_step_keeps(monkeypatch, kept):
    """Firings format their timer's time once per step and time (_KeyStep.time_text), forgetting them
    past executor.TIME_TEXTS: the ids are timer_cause()'s however many are kept."""
    from millstream.core import executor as executor_module

    class Windows(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer(f"w{record.timestamp // 10}", record.timestamp // 10 * 10 + 10)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, timer.tag, timer.time), "out")
            ctx.produce(Record(ctx.key, timer.tag, timer.time), "out")

    monkeypatch.setattr(executor_module, "TIME_TEXTS", kept)
    ex = make_executor(Windows(), name="win")
    deliveries = [deliver(f"k{i % 7}", i, ts=i * 3) for i in range(60)]
    step(ex, deliveries, 0, 0)
    produced = step(ex, [], 1_000, 0).productions
    setters = {(f"k{i % 7}", i * 3 // 10 * 10 + 10): f"id-k{i % 7}-{i}-{i * 3}" for i in range(60)}  # the last sets
    assert len(produced) == 2 * len(setters)
    for n, p in enumerate(produced):
        tag, setter = f"w{p.timestamp // 10 - 1}", setters[p.key, p.timestamp]
        assert p.id == derive_record_id("win", "t", p.key, tag, p.timestamp, "r", "in", setter, n % 2)


@pytest.mark.parametrize("kept", [1, 4096])
def test_timers_of_one_tag_fire_with_their_own_fields_across_keys(monkeypatch, kept):
    """Firings of plain timers share the Timer of their tag and time (_KeyStep.fire_timers), forgetting
    them past executor.TIMER_OBJECTS: a tag fired at other times, as a wall-time timer or with a hold by
    other keys still gives each firing its own time, domain and hold."""
    from millstream.core import executor as executor_module

    monkeypatch.setattr(executor_module, "TIMER_OBJECTS", kept)

    class OneTag(Computation):
        def process_record(self, ctx, record):
            kind = record.value
            if kind == "wall":
                ctx.set_timer("t", record.timestamp, TimeDomain.WALL_TIME)
            else:
                ctx.set_timer("t", record.timestamp, hold=record.timestamp if kind == "held" else None)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, [timer.time, timer.tag, timer.domain.value, timer.hold], timer.time), "out")

    ex = make_executor(OneTag())
    kinds = ["plain", "held", "wall", "plain", "plain"]
    deliveries = [deliver(f"k{i}", kinds[i % 5], ts=10 + i % 3) for i in range(15)]
    produced = step(ex, deliveries, 0, 100, advanced_watermark=100).productions
    expected = {(f"k{i}", 10 + i % 3, "t", "wall_time" if kinds[i % 5] == "wall" else "low_watermark",
                 10 + i % 3 if kinds[i % 5] == "held" else None) for i in range(15)}
    assert len(produced) == 15
    assert {(p.key, *JsonCodec().decode(p.value)) for p in produced} == expected


class TimerChain(Computation):
    """A record sets timer "first"; "first" sets "second" 5 ms later; "second" produces twice."""

    def process_record(self, ctx, record):
        ctx.set_timer("first", record.timestamp + 10)

    def process_timer(self, ctx, timer):
        if timer.tag == "first":
            ctx.set_timer("second", timer.time + 5)
        else:
            ctx.produce(Record(ctx.key, "x", timer.time), "out")
            ctx.produce(Record(ctx.key, "y", timer.time), "out")


def test_timer_production_ids_follow_documented_derivation():
    """A firing's productions derive their ids from its identity (key, tag, time, and its setter: the
    record that set it, or the hash of the firing that set it), as stable as a record's: a replay
    after a restart must give the same ids, whatever version of the executor runs it."""
    ex = make_executor(TimerChain(), name="chain")
    assert step(ex, [deliver("a", "v", 1, "cause-1")], 0, 0).productions == []
    ids = [p.id for p in step(ex, [], 100, 0).productions]
    first = timer_cause("a", "first", 11, record_cause("in", "cause-1"))
    setter = timer_setter(first)
    assert setter == xxhash.xxh3_64_hexdigest(f"t\x1fa\x1ffirst\x1f11\x1fr\x1fin\x1fcause-1".encode())
    assert ids == [derive_record_id("chain", "t", "a", "second", 16, setter, 0),
                   derive_record_id("chain", "t", "a", "second", 16, setter, 1)]


def test_timer_production_ids_stay_unique_after_key_state_is_garbage_collected():
    """A key whose state, timers and dedup ids are all gone is dropped from its store. The timers it
    fires later must still produce fresh ids, or a consumer that still remembers the earlier ids would
    discard the new records as duplicates (window after window of a per-key aggregation)."""

    class Window(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("end", record.timestamp)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, timer.time, timer.time), "out")

    ex = make_executor(Window(), dedup_horizon_ms=10)
    ids = []
    for n in range(5):
        t = 1_000 * (n + 1)
        step(ex, [deliver("k", n, ts=t, rid=f"r{n}")], t - 900, 0)
        # Fires at t; the record id (seen at t - 900) is past the horizon and forgotten, so the key
        # has no state, no timers and no ids left.
        ids += [p.id for p in step(ex, [], t, 0).productions]
    assert len(ids) == 5
    assert len(set(ids)) == 5, "a timer production reused the id of an earlier one"


class Derived(Record):
    """A user's record type whose value is computed from its fields."""

    __slots__ = ()

    @property
    def value(self):
        return {"derived": self.key}


def test_what_produce_encodes_is_the_value_user_code_would_read():
    """A Record made by user code, one delivered and passed on (its bytes arrived under the same
    codec: kept as they came), one of a subclass whose `value` is computed: each production holds
    the encoding of what `record.value` reads. The context's fields read as the invocation's and
    cannot be assigned."""
    seen = []

    class Forward(Computation):
        def process_record(self, ctx, record):
            seen.append((ctx.key, ctx.low_watermark, ctx.wall_time, ctx.is_late, ctx.input_stream))
            for name in ("key", "low_watermark", "wall_time", "is_late", "input_stream"):
                with pytest.raises(AttributeError):
                    setattr(ctx, name, None)
            ctx.produce(record, "out")
            ctx.produce(Record(record.key, [record.value, 1], record.timestamp), "out")
            ctx.produce(Derived(record.key, "ignored", record.timestamp), "out")

    ex = make_executor(Forward())
    # Bytes the codec would not write (a space): kept, they show the record's own bytes were passed on.
    arrived = Record.encoded("k", b'{"a": 1}', ex.plan.output_codecs["out"], 5, "r1")
    result = ex.step([Delivery("k", "in", arrived, 0, True)], [Segment(7, 7)], 42)
    assert seen == [("k", 7, 42, True, "in")]
    assert [(p.key, JsonCodec().decode(p.value), p.timestamp) for p in result.productions] == [
        ("k", {"a": 1}, 5), ("k", [{"a": 1}, 1], 5), ("k", {"derived": "k"}, 5)]
    assert [row[2] for row in result.rows] == [b'{"a": 1}', b'[{"a":1},1]', b'{"derived":"k"}']


# -- context misuse ----------------------------------------------------------------------------------
class Misuse(Computation):
    declared = ValueState("declared")

    def __init__(self, action) -> None:
        self.action = action

    def process_record(self, ctx, record):
        self.action(ctx)


@pytest.mark.parametrize("action, message", [
    (lambda ctx: ctx.state(ListState("declared")), r"'comp'.*not declared"),  # same name, other kind
    (lambda ctx: ctx.state(ValueState("nowhere")), r"'comp'.*not declared"),
    (lambda ctx: ctx.state("declared"), r"'comp'.*not declared"),
    (lambda ctx: ctx.state(None), r"'comp'.*not declared"),
    (lambda ctx: ctx.produce(Record("k", 1, 1), "undeclared"), r"'comp'.*'undeclared'.*\['out'\]"),
    (lambda ctx: ctx.produce(("k", 1, 1), "out"), r"comp.*Record"),
    (lambda ctx: ctx.produce(Record(5, 1, 1), "out"), r"comp.*key must be str"),
    (lambda ctx: ctx.produce(Record("k", 1, 1.5), "out"), r"comp.*timestamp"),
    (lambda ctx: ctx.produce(Record("k", 1, True), "out"), r"comp.*timestamp"),
    (lambda ctx: ctx.set_timer(3, 10), r"comp.*tag must be str"),
    (lambda ctx: ctx.set_timer("t", 10.0), r"comp.*'t'.*int milliseconds"),
    (lambda ctx: ctx.set_timer("t", END_OF_TIME + 1), r"comp.*'t'.*out of range"),
    (lambda ctx: ctx.set_timer("t", BEGINNING_OF_TIME - 1), r"comp.*'t'.*out of range"),
])
def test_context_misuse_raises_a_clear_computation_error(action, message):
    ex = make_executor(Misuse(action))
    with pytest.raises(ComputationFailed, match=message):
        step(ex, [deliver("k", 1)], 0, 0)


def test_timers_may_be_set_at_either_end_of_time():
    class BothEnds(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("first", BEGINNING_OF_TIME)  # due at once
            ctx.set_timer("last", END_OF_TIME, hold=BEGINNING_OF_TIME)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, timer.tag, timer.time), "out")

    ex = make_executor(BothEnds())
    result = step(ex, [deliver("k", 1)], 0, 0)
    assert [(p.value, p.timestamp) for p in result.productions] == [(b'"first"', BEGINNING_OF_TIME)]
    assert [(t.tag, t.time, t.hold) for t in inspect_key(ex.plan, ex.store.blobs["k"].blob)[1]] == [
        ("last", END_OF_TIME, BEGINNING_OF_TIME)]


def test_failed_step_writes_nothing():
    class FailOnBoom(Computation):
        count = ValueState("count", default=0)

        def process_record(self, ctx, record):
            ctx.state(self.count).set(ctx.state(self.count).get() + 1)
            ctx.set_timer("t", 100)
            if record.value == "boom":
                raise RuntimeError("user bug")

    ex = make_executor(FailOnBoom())
    step(ex, [deliver("k", "ok", rid="a")], 0, 0)
    snapshot = dict(ex.store.blobs)
    with pytest.raises(ComputationFailed, match="user bug"):
        step(ex, [deliver("k", "ok2", rid="b"), deliver("k", "boom", rid="c")], 0, 0)
    assert ex.store.blobs == snapshot
    # The failed records were not marked seen: a retry processes them.
    result = step(ex, [deliver("k", "ok2", rid="b")], 0, 0)
    assert result.metrics.records == 1 and _count(ex, "k") == 2


def test_a_timer_that_rearms_itself_behind_the_watermark_is_stopped_with_a_clear_error():
    import pytest

    from millstream import Computation, Pipeline, Record, ScriptedInjector
    from millstream.core.executor import ComputationError
    from millstream.testing import PipelineHarness

    class Forever(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("t", 0)

        def process_timer(self, ctx, timer):
            ctx.set_timer("t", 0)  # behind the watermark: due again at once

    pipeline = (Pipeline("loop").add_injector("src", ScriptedInjector("src", [([Record("k", 1, 5)], 10)]), "in")
                .add_computation("forever", Forever(), ["in"]))
    harness = PipelineHarness(pipeline)
    with pytest.raises(ComputationError, match="re-sets itself"):
        harness.run_injectors()


def test_set_false_is_not_confused_with_a_default_of_zero():
    from millstream import Computation, Pipeline, Record, ScriptedInjector, ValueState
    from millstream.testing import PipelineHarness

    class Flag(Computation):
        flag = ValueState("flag", default=0)

        def process_record(self, ctx, record):
            ctx.state(self.flag).set(False)

    pipeline = (Pipeline("flags").add_injector("src", ScriptedInjector("src", [([Record("k", 1, 5)], 10)]), "in")
                .add_computation("flag", Flag(), ["in"]))
    harness = PipelineHarness(pipeline)
    harness.run_injectors()
    assert harness.state("flag", "k")["flag"] is False


class _CountingStore(MemoryKeyStore):
    """Counts the keys a step reads."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    def load(self, keys):
        keys = list(keys)
        self.loaded.extend(keys)
        return super().load(keys)


def test_a_step_reads_only_the_keys_with_records_or_due_work():
    # Cost follows the touched keys, not the key group's size.
    ex = make_executor(TimerScript())
    ex.store = store = _CountingStore()
    keys = [f"k{i}" for i in range(200)]
    step(ex, [deliver(k, [["set", "t", 50 + i, "low_watermark"]], rid=f"{k}-1") for i, k in enumerate(keys)], 0, 0)
    store.loaded.clear()
    result = step(ex, [deliver(k, [], rid=f"{k}-2") for k in keys[:3]], 0, 0, advanced_watermark=59)
    assert sorted(store.loaded) == sorted(set(keys[:3]) | set(keys[:10]))
    assert result.metrics.timers_fired == 10


def test_step_metrics_add_sums_every_field():
    from dataclasses import fields

    from millstream.core.executor import StepMetrics

    names = [f.name for f in fields(StepMetrics)]
    total = StepMetrics(**{name: 1 for name in names})
    total.add(StepMetrics(**{name: n + 2 for n, name in enumerate(names)}))
    assert total.as_dict() == {name: n + 3 for n, name in enumerate(names)}


# -- the dead_letter policy ----------------------------------------------------------------------------
class Tally(Computation):
    """Appends each record's value to the key's list, then fails on values starting with "bad":
    the failing invocation's append must leave no trace."""

    seen = ListState[str]("seen")

    def process_record(self, ctx, record):
        ctx.state(self.seen).append(record.value)
        if record.value.startswith("bad"):
            raise ValueError(f"refused {record.value}")


class BatchTally(Tally):
    def process_records(self, ctx, records):
        for record in records:
            self.process_record(ctx, record)


class MapScript(Computation):
    """value = list of ops on a map whose key codec (str) refuses ints: ["put", k, v] | ["remove", k]
    | ["fail"]."""

    entries = MapState("entries", key_codec=StrCodec(), value_codec=JsonCodec())

    def process_record(self, ctx, record):
        entries = ctx.state(self.entries)
        for op in record.value:
            if op[0] == "put":
                entries.put(op[1], op[2])
            elif op[0] == "remove":
                entries.remove(op[1])
            else:
                raise ValueError("refused")


def test_failures_around_a_value_the_codec_refuses_until_later_in_the_step_leave_no_trace():
    # An entry the key codec refuses is put, then removed later in the step: the step's state is
    # encodable only at its end. Failures on either side of that removal are dead-lettered, the
    # refused entry is not (it never reaches the store), and what stands is stored.
    ops = [[["put", "a", 1], ["put", 7, "refused key"]], [["put", "b", 2], ["fail"]], [["put", "c", 3]],
           [["remove", 7]], [["put", "d", 4], ["fail"]], [["put", "e", 5]], [["fail"]]]
    deliveries = [deliver("k", value, n, f"r{n}") for n, value in enumerate(ops)]
    ex = make_executor(MapScript(), on_error="dead_letter")
    result = ex.step(deliveries, [Segment(-1, 100)], 0)
    dead = [ex.plan.output_codecs["dead_letters"].decode(p.value) for p in result.productions
            if p.stream == "dead_letters"]
    assert [(letter["record_id"], letter["error"]) for letter in dead] == [
        ("r1", "ValueError: refused"), ("r4", "ValueError: refused"), ("r6", "ValueError: refused")]
    values, _ = inspect_key(ex.plan, ex.store.load(["k"])["k"])
    assert values["entries"] == {"a": 1, "c": 3, "e": 5}


class FailsAtTwoPlaces(Computation):
    def process_record(self, ctx, record):
        if record.value == "one":
            raise ValueError(f"one {record.id}")
        raise KeyError(f"two {record.id}")


def test_each_dead_letter_has_the_traceback_of_its_own_failure():
    # Failures repeat at two places in user code: each letter names the line that raised, and ends
    # with its own message.
    deliveries = [deliver("k", "one" if n % 3 else "two", n, f"r{n}") for n in range(9)]
    ex = make_executor(FailsAtTwoPlaces(), on_error="dead_letter")
    result = ex.step(deliveries, [Segment(-1, 100)], 0)
    letters = [ex.plan.output_codecs["dead_letters"].decode(p.value) for p in result.productions]
    assert len(letters) == 9
    for n, letter in zip(range(9), letters):
        text = letter["traceback"]
        raised = 'raise ValueError(f"one {record.id}")' if n % 3 else 'raise KeyError(f"two {record.id}")'
        last = f"ValueError: one r{n}" if n % 3 else f"KeyError: 'two r{n}'"
        assert letter["record_id"] == f"r{n}" and raised in text and text.rstrip().endswith(last), text
        assert "millstream/core" not in text and text.count("File ") == 1


@pytest.mark.parametrize("computation", [Tally, BatchTally])
def test_a_rerun_without_a_failing_record_counts_only_what_reached_user_code(computation):
    # One key, one point: a late record, a failing one, a duplicate of the first, one more. The
    # key's step runs again without the failing record (per record) or without the records of the
    # point's failed call (batched: the first copy of r1 is among them, dead-lettered, so its second
    # copy is a duplicate of it): the metrics count the run that stood, not the one that failed.
    deliveries = [deliver("k", "ok-late", 50, "r1"), deliver("k", "bad", 150, "r2"),
                  deliver("k", "ok-again", 150, "r1"), deliver("k", "ok-last", 160, "r3")]
    ex = make_executor(computation(), on_error="dead_letter")
    metrics = step(ex, deliveries, 100, 0).metrics
    records, duplicates, late = (2, 1, 1) if computation is Tally else (0, 1, 0)
    dead_letters = 1 if computation is Tally else 3
    assert (metrics.records, metrics.duplicates, metrics.late, metrics.dead_letters) == (
        records, duplicates, late, dead_letters)


@pytest.mark.parametrize("computation", [Tally, BatchTally])
@pytest.mark.parametrize("same_step", [False, True])
def test_a_copy_of_a_dead_lettered_record_is_a_duplicate(computation, same_step):
    # An injected record's outcome under dead_letter is its dead letter: a copy of it arriving later
    # (an at-least-once source's retry, the same id) is dropped as any duplicate is, in a later step
    # or the same one, and does not reach user code a second time (one outcome per id).
    first, retry, other = deliver("k", "bad", 10, "r1"), deliver("k", "bad", 10, "r1"), deliver("k", "ok", 11, "r2")
    ex = make_executor(computation(), on_error="dead_letter")
    steps = [[first, other, retry]] if same_step else [[first, other], [retry]]
    results = [step(ex, deliveries, 0, 0) for deliveries in steps]
    letters = [ex.plan.output_codecs["dead_letters"].decode(p.value)["record_id"]
               for result in results for p in result.productions]
    totals = StepMetrics()
    for result in results:
        totals.add(result.metrics)
    assert letters == (["r1", "r2"] if computation is BatchTally else ["r1"])  # a batch fails together
    assert (totals.duplicates, totals.dead_letters) == (1, len(letters))
    assert totals.records == (0 if computation is BatchTally else 1)
    assert ex.store.seen_ids("k").keys() == {"r1", "r2"}


@pytest.mark.parametrize("computation", [Tally, BatchTally])
def test_dead_letters_name_the_failing_records_of_every_input_point_and_leave_no_trace(computation):
    # Four input points in one step; each key's failures sit at various positions of later points.
    rng = random.Random(5)
    segments = [Segment(100 * j, 100 * j + 99) for j in range(4)]
    deliveries, expected, expected_dead = [], defaultdict(list), defaultdict(list)
    for j in range(4):
        for n in range(12):
            key = f"k{rng.randrange(3)}"
            value = f"{'bad' if rng.random() < 0.3 else 'ok'}-{j}-{n}"
            record = Record(key, value, 100 * j + n, f"r{j}-{n}")
            deliveries.append(Delivery(key, "in", record, j, True))
            if value.startswith("bad"):
                expected_dead[key].append(record.id)
            else:
                expected[key].append(value)
    assert sum(map(len, expected_dead.values())) >= 5
    ex = make_executor(computation(), on_error="dead_letter")
    result = ex.step(deliveries, segments, 0)
    dead = defaultdict(list)
    for produced in result.productions:
        if produced.stream == "dead_letters":
            letter = ex.plan.output_codecs["dead_letters"].decode(produced.value)
            dead[letter["key"]].append(letter["record_id"])
    if computation is BatchTally:  # a failing call sends every record of its key and point
        failing_points = {(key, rid.split("-")[0]) for key, rids in expected_dead.items() for rid in rids}
        expected_dead = defaultdict(list)
        for d in deliveries:
            if (d.key, f"r{d.segment}") in failing_points:
                expected_dead[d.key].append(d.record.id)
        expected = defaultdict(list)
        for d in deliveries:
            if (d.key, f"r{d.segment}") not in failing_points:
                expected[d.key].append(d.record.value)
    assert {k: sorted(v) for k, v in dead.items()} == {k: sorted(v) for k, v in expected_dead.items()}
    for key in {d.key for d in deliveries}:  # a key whose every record failed keeps no state
        values, _ = inspect_key(ex.plan, ex.store.load([key]).get(key))
        assert values.get("seen", []) == expected[key]
    assert result.metrics.dead_letters == sum(map(len, expected_dead.values()))


# -- dead letters with checkpoints: linear cost, the same outcome ---------------------------------------
class Scripted(Computation):
    """Each record's value is a script of state operations, timers and productions; "fail" raises
    there (after the operations before it: they must leave no trace). Timers fail when their tag says
    so. Counts its invocations."""

    total = ValueState("total", default=0)
    log = ListState("log")
    entries = MapState("entries")
    strict = MapState("strict", key_codec=StrCodec())  # refuses int keys: only a flush finds out
    defaulted = ValueState("defaulted", default=[])
    recent = ListState("recent", ttl_ms=50)
    pickled = ValueState("pickled", codec=PickleCodec())  # not plain data: sets, a sentinel's identity
    shared = ValueState("shared")  # one list under two names: a copy must keep it one

    def __init__(self) -> None:
        self.invocations = 0
        self.held: tuple = (None, None)  # (context, handle): a handle kept while the context is the same

    def process_record(self, ctx, record):
        self.invocations += 1
        self.run(ctx, record.value, record.timestamp)

    def process_timer(self, ctx, timer):
        self.invocations += 1
        ctx.produce(Record(ctx.key, ["fired", timer.tag, ctx.state(self.total).get()], timer.time), "out")
        if timer.tag.startswith("bad"):
            raise ValueError(f"timer {timer.tag}")

    def run(self, ctx, script, timestamp):
        for op, arg in script:
            if op == "add":
                total = ctx.state(self.total)
                total.set(total.get() + arg)
            elif op == "log":
                ctx.state(self.log).append(arg)
            elif op == "put":
                entries = ctx.state(self.entries)
                entries.put(arg % 7, entries.get(arg % 7, 0) + arg)
            elif op == "remove":
                ctx.state(self.entries).remove(arg % 7)
            elif op == "mutate":  # in place, on a value read from state: a rollback must undo it too
                log = ctx.state(self.log)
                items = list(log.get())
                if items:
                    log.clear()
                    for item in items:
                        log.append(item + arg)
            elif op == "items":  # the map's iteration order is visible to user code
                ctx.produce(Record(ctx.key, [k for k, _ in ctx.state(self.entries).items()], timestamp), "out")
            elif op == "strict":  # an int key is refused when stored: fine if removed before the flush
                ctx.state(self.strict).put(arg if arg % 3 == 0 else str(arg), arg)
            elif op == "unstrict":
                strict = ctx.state(self.strict)
                for k in list(strict.keys()):
                    strict.remove(k)
            elif op == "default":  # a mutable default, changed and put back as it was
                defaulted = ctx.state(self.defaulted)
                value = defaulted.get()
                value.append(arg)
                value.remove(arg)
                defaulted.set(value)
            elif op == "refill":  # a TTL'd list emptied and refilled in place
                recent = ctx.state(self.recent)
                items = list(recent.get())
                recent.clear()
                for item in items + [arg]:
                    recent.append(item)
            elif op == "alias":
                shared = ctx.state(self.shared)
                value = shared.get() or {}
                if "a" not in value:
                    value["a"] = value["b"] = []  # shared within the step (JSON stores two lists)
                    shared.set(value)
                value["a"].append(arg)
                ctx.produce(Record(ctx.key, ["alias", len(value["b"])], timestamp), "out")
            elif op == "held":  # through a handle kept across invocations of the key
                if self.held[0] is not ctx:
                    self.held = (ctx, ctx.state(self.total))
                self.held[1].set(self.held[1].get() + arg)
            elif op == "pickled":  # a set grown and shrunk (its order), a sentinel kept (its identity)
                pickled = ctx.state(self.pickled)
                value = pickled.get() or {"set": set(), "mark": _PENDING}
                value["set"].update(range(arg % 20, arg % 20 + 8))
                value["set"].difference_update(range(arg % 20 + 2, arg % 20 + 6))
                pickled.set(value)
                ctx.produce(Record(ctx.key, [list(value["set"]), value["mark"] is _PENDING], timestamp), "out")
            elif op == "timer":
                ctx.set_timer(arg, timestamp + 5)
            elif op == "untimer":
                ctx.delete_timer(arg)
            elif op == "produce":
                ctx.produce(Record(ctx.key, [arg, ctx.state(self.total).get()], timestamp), "out")
            elif op == "clear":
                ctx.clear()
            elif op == "fail":
                raise ValueError(f"failed at {arg}")


_PENDING = object()


def _random_script(rng: random.Random, failing: float, pickled: bool) -> list:
    ops = []
    for _ in range(rng.randrange(1, 5)):
        op = rng.choice(["add", "log", "put", "put", "remove", "mutate", "timer", "untimer", "produce", "items",
                         "strict", "unstrict", "unstrict", "default", "refill", "held", "alias"]
                        + (["pickled"] if pickled else []) if rng.random() > 0.03 else ["clear"])
        arg = (rng.choice(["t1", "t2", "bad1"]) if op in ("timer", "untimer") else rng.randrange(100))
        ops.append([op, arg])
    if rng.random() < failing:
        ops.insert(rng.randrange(len(ops) + 1), ["fail", rng.randrange(100)])
    return ops


def _scripted_steps(seed: int, checkpoint_records: int, monkeypatch) -> list:
    """Three steps of random scripts over three keys, several input points, duplicates and late
    records: every step's output rows, metrics and each key's stored blob after it (its state and
    timers, as stored: a map's order included)."""
    from millstream.core import executor as executor_module

    monkeypatch.setattr(executor_module, "CHECKPOINT_RECORDS", checkpoint_records)
    rng = random.Random(seed)
    ex = make_executor(Scripted(), on_error="dead_letter")
    seen, outcome = [], []
    for s in range(3):
        points = rng.randrange(1, 4)
        segments = [Segment(100 * (3 * s + j), 100 * (3 * s + j) + 50) for j in range(points)]
        deliveries = []
        for j in range(points):
            for n in range(rng.randrange(0, 40)):
                key = f"k{rng.randrange(3)}"
                if seen and rng.random() < 0.05:
                    deliveries.append(rng.choice(seen))  # a duplicate (of a record of this step or before)
                    continue
                ts = 100 * (3 * s + j) + rng.randrange(-20, 50)  # some late
                d = Delivery(key, "in", Record(key, _random_script(rng, 0.25, seed % 4 == 0), ts, f"r{s}-{j}-{n}"),
                             j, True)
                deliveries.append(d)
                seen.append(d)
        deliveries = [d._replace(segment=min(d.segment, points - 1)) for d in deliveries]
        deliveries.sort(key=lambda d: d.segment)
        result = ex.step(deliveries, segments, 1_000 * s)
        outcome.append(([tuple(p) for p in result.productions], result.metrics.as_dict()))
        outcome.append({key: ex.store.load([key]).get(key) for key in ("k0", "k1", "k2")})  # state, timers: bytes
    return outcome


class DeletesThenFails(Computation):
    """Value "set": sets timers a and b; "delete and fail": deletes a, then fails; "noop": nothing."""

    def process_record(self, ctx, record):
        if record.value == "set":
            ctx.set_timer("a", 1_000)
            ctx.set_timer("b", 1_001)
        elif record.value == "delete and fail":
            ctx.delete_timer("a")
            raise ValueError("after deleting a")


@pytest.mark.parametrize("journal_from", [0, 4096])
def test_a_rollback_after_deleting_a_pending_timer_stores_the_key_as_starting_over_does(journal_from, monkeypatch):
    """The second failure of a step rolls back to a checkpoint, undoing a deleted pending timer: the
    key's blob is byte for byte the one a step that starts over stores (the timers' order included),
    with the timers' changes journaled (journal_from 0) or copied."""
    from millstream.core import executor as executor_module
    from millstream.core import keystate

    monkeypatch.setattr(keystate, "JOURNAL_TIMERS_FROM", journal_from)

    def stored(checkpoint_records: int) -> bytes:
        monkeypatch.setattr(executor_module, "CHECKPOINT_RECORDS", checkpoint_records)
        ex = make_executor(DeletesThenFails(), on_error="dead_letter")
        step(ex, [deliver("k", "set", 1, "r0")], 0, 0)
        result = step(ex, [deliver("k", "noop", 2, "r1"), deliver("k", "delete and fail", 3, "r2"),
                           deliver("k", "delete and fail", 4, "r3"), deliver("k", "noop", 5, "r4")], 0, 0)
        assert result.metrics.dead_letters == 2
        return ex.store.load(["k"])["k"]

    assert stored(16) == stored(0)


def test_checkpoints_change_no_outcome_of_failing_steps(monkeypatch):
    from millstream.core import executor as executor_module

    """The same failures with and without checkpoints (every failure rerunning the key's step from
    its start, the rule before them): the same productions, dead letters, metrics and state, map
    order included. Checkpoints encode nothing: a value only the step's end can store, a mutable
    default put back, a TTL'd list refilled in place come out as without them."""
    differing = [(seed, every) for seed in range(60) for every in (1, 3, 16)
                 if _scripted_steps(seed, 0, monkeypatch) != _scripted_steps(seed, every, monkeypatch)]
    assert not differing
    # Nor whether the timers are copied or their changes journaled (keystate.JournaledTimers).
    from millstream.core import keystate

    monkeypatch.setattr(keystate, "JOURNAL_TIMERS_FROM", 0)
    assert all(_scripted_steps(seed, 0, monkeypatch) == _scripted_steps(seed, 3, monkeypatch) for seed in range(60))
    monkeypatch.setattr(keystate, "JOURNAL_TIMERS_FROM", 4096)
    # Where checkpoints fall changes nothing either: the copy's share of the time moves them.
    monkeypatch.setattr(executor_module, "CHECKPOINT_COPY_SHARE", 1e-6)
    assert all(_scripted_steps(seed, 0, monkeypatch) == _scripted_steps(seed, 1, monkeypatch) for seed in range(20))


def test_a_key_failing_often_costs_invocations_linear_in_its_records():
    computation = Scripted()
    ex = make_executor(computation, on_error="dead_letter")
    records = 600
    deliveries = [deliver("k", [["add", 1]] + ([["fail", n]] if n % 2 else []), n, f"r{n}") for n in range(records)]
    result = step(ex, deliveries, records, 0)
    assert result.metrics.dead_letters == records // 2
    assert inspect_key(ex.plan, ex.store.load(["k"])["k"])[0]["total"] == records // 2
    assert computation.invocations <= 3 * records, computation.invocations


class FailingTimers(Computation):
    """Each record sets a timer; the firing of every timer whose number is odd fails after producing.
    Counts the firings."""

    def __init__(self) -> None:
        self.firings = 0

    def process_record(self, ctx, record):
        ctx.set_timer(f"t{record.value}", record.timestamp + 1)

    def process_timer(self, ctx, timer):
        self.firings += 1
        ctx.produce(Record(ctx.key, timer.tag, timer.time), "out")
        if int(timer.tag[1:]) % 2:
            raise ValueError(f"timer {timer.tag}")


@pytest.mark.parametrize("batched", [False, True])
def test_a_key_s_failing_timers_cost_firings_linear_in_its_timers(batched):
    """600 timers of one key due in one step, every other one failing under dead_letter: each
    failing timer is dead-lettered once and leaves no production, each other one produces once,
    and the firings stay linear (a step started over per failure fires ~90,000 times). The same
    under the per-key batch hook, whose records go to user code a point at a time."""

    class Batched(FailingTimers):
        def process_records(self, ctx, records):
            for record in records:
                self.process_record(ctx, record)

    computation = Batched() if batched else FailingTimers()
    ex = make_executor(computation, on_error="dead_letter")
    timers = 600
    step(ex, [deliver("k", n, 10 * n, f"r{n}") for n in range(timers)], 0, 0)
    result = step(ex, [], 10 * timers + 10, 0)
    letters = [ex.plan.output_codecs["dead_letters"].decode(p.value) for p in result.productions
               if p.stream == "dead_letters"]
    produced = [ex.plan.output_codecs["out"].decode(p.value) for p in result.productions if p.stream == "out"]
    assert sorted(letter["timer"]["tag"] for letter in letters) == sorted(f"t{n}" for n in range(1, timers, 2))
    assert produced == [f"t{n}" for n in range(0, timers, 2)]  # in time order, each once
    assert result.metrics.dead_letters == timers // 2 and result.metrics.timers_fired == timers // 2
    assert pending(ex) == (None, None)
    assert computation.firings <= 3 * timers, computation.firings


class TimerChains(Computation):
    """Deterministic per timer (its tag and the key's count): a firing adds to a count and a map,
    produces, may set a later timer (a chain), delete another, hold, and fails for some tags after
    doing part of it (which must leave no trace)."""

    count = ValueState("count", default=0)
    seen = MapState("seen")

    def process_record(self, ctx, record):
        for n in record.value:
            ctx.set_timer(f"t{n}", record.timestamp + n % 7, hold=record.timestamp if n % 5 == 0 else None)

    def process_timer(self, ctx, timer):
        n = int(timer.tag[1:])
        count = ctx.state(self.count)
        count.set(count.get() + 1)
        ctx.state(self.seen).put(timer.tag, count.get())
        ctx.produce(Record(ctx.key, [timer.tag, count.get()], timer.time), "out")
        if n % 4 == 1 and n < 400:
            ctx.set_timer(f"t{n * 3 + 1}", timer.time + 2)  # a chain, fired in the same step
        if n % 6 == 2:
            ctx.delete_timer(f"t{n + 1}")
        if (n * 7919) % 11 < 3:
            raise ValueError(f"timer {timer.tag}")


def _timer_chain_steps(seed: int, checkpoint_records: int, monkeypatch) -> list:
    from millstream.core import executor as executor_module

    monkeypatch.setattr(executor_module, "CHECKPOINT_RECORDS", checkpoint_records)
    rng = random.Random(seed)
    ex = make_executor(TimerChains(), on_error="dead_letter")
    outcome = []
    for s in range(3):
        points = rng.randrange(1, 3)
        segments = [Segment(100 * (2 * s + j), 100 * (2 * s + j) + 80) for j in range(points)]
        deliveries = [Delivery(f"k{n % 2}", "in", Record(f"k{n % 2}", rng.sample(range(60), rng.randrange(1, 12)),
                                                         100 * (2 * s + j) + rng.randrange(80), f"r{s}-{j}-{n}"), j, True)
                      for j in range(points) for n in range(rng.randrange(1, 8))]
        result = ex.step(deliveries, segments, 0)
        outcome.append(([tuple(p) for p in result.productions], result.metrics.as_dict(), result.holds))
        outcome.append({key: ex.store.load([key]).get(key) for key in ("k0", "k1")})
    return outcome


def test_timer_checkpoints_change_no_outcome_of_failing_steps(monkeypatch):
    """Timers that fail among timers that chain, delete others and hold: the same productions, dead
    letters, metrics, holds and stored state with checkpoints between firings as with every failure
    starting the key's step over (CHECKPOINT_RECORDS 0, the rule before them)."""
    from millstream.core import executor as executor_module

    monkeypatch.setattr(executor_module, "CHECKPOINT_COPY_SHARE", None)
    differing = [(seed, every) for seed in range(40) for every in (1, 2, 5, 16)
                 if _timer_chain_steps(seed, 0, monkeypatch) != _timer_chain_steps(seed, every, monkeypatch)]
    assert not differing
    assert any(letters for letters in (_timer_chain_steps(seed, 1, monkeypatch)[0][1]["dead_letters"]
                                       for seed in range(5)))  # failures did happen


@pytest.mark.parametrize("points", [1, 3])
def test_code_that_fails_at_random_loses_and_repeats_nothing(points, monkeypatch):
    """User code that fails differently on every run (not deterministic), over several input points,
    with timers that fail at random too: each record ends either dead-lettered once or kept once with
    its production made once, and each kept record's timer fired once or dead-lettered once."""

    class Flaky(Computation):
        seen = ListState("seen")

        def __init__(self) -> None:
            self.rng = random.Random(11)

        def process_record(self, ctx, record):
            ctx.state(self.seen).append(record.id)
            ctx.produce(Record(ctx.key, record.id, record.timestamp), "out")
            ctx.set_timer(record.id, record.timestamp + 1)
            if self.rng.random() < 0.1:
                raise ValueError("flaky")

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, "fired " + timer.tag, timer.time), "out")
            if self.rng.random() < 0.03:  # each timer failure runs the key's step again from its start
                raise ValueError("flaky timer")

    from millstream.core import executor as executor_module

    monkeypatch.setattr(executor_module, "CHECKPOINT_COPY_SHARE", None)  # the same runs each time
    ex = make_executor(Flaky(), on_error="dead_letter")
    records = 300
    segments = [Segment(1000 * j - 1, 1000 * j + 999) for j in range(points)]
    deliveries = [Delivery(f"k{n % 3}", "in", Record(f"k{n % 3}", n, 1000 * (n * points // records) + n % 500,
                                                     f"r{n}"), n * points // records, True) for n in range(records)]
    result = ex.step(deliveries, segments, 0)
    letters = [ex.plan.output_codecs["dead_letters"].decode(p.value) for p in result.productions
               if p.stream == "dead_letters"]
    dead = [letter["record_id"] for letter in letters if letter["record_id"]]
    dead_timers = [letter["timer"]["tag"] for letter in letters if not letter["record_id"]]
    produced = [ex.plan.output_codecs["out"].decode(p.value) for p in result.productions if p.stream == "out"]
    fired = [value.split()[1] for value in produced if value.startswith("fired ")]
    produced = [value for value in produced if not value.startswith("fired ")]
    kept = [rid for key in ("k0", "k1", "k2") for rid in inspect_key(ex.plan, ex.store.load([key])[key])[0]["seen"]]
    assert len(dead) == len(set(dead)) and 20 < len(dead) < records and dead_timers
    assert sorted(produced) == sorted(kept) and len(kept) == len(set(kept))
    assert sorted(dead + kept) == sorted(f"r{n}" for n in range(records))
    assert sorted(fired + dead_timers) == sorted(kept)
    assert (result.metrics.records, result.metrics.dead_letters) == (len(kept), len(dead) + len(dead_timers))
    for key in ("k0", "k1", "k2"):  # in input order
        ids = inspect_key(ex.plan, ex.store.load([key])[key])[0]["seen"]
        assert ids == sorted(ids, key=lambda rid: int(rid[1:]))


class ContextMisuse(Computation):
    """Does to the context what the record's value says."""

    items = ListState("items")
    entries = MapState("entries")

    def process_record(self, ctx, record):
        action, arg = record.value
        if action == "produce_at":
            ctx.produce(Record(ctx.key, 1, arg), "out")
        elif action == "list_set":
            ctx.state(self.items).set(arg)
        elif action == "map_put":
            ctx.state(self.entries).put({"a": arg}, 3)
        elif action == "delete_timer":
            ctx.delete_timer(arg)
        elif action == "produce_swapped":
            ctx.produce("out", Record(ctx.key, 1, 1))


@pytest.mark.parametrize("action, arg, message", [
    ("produce_at", 2**63, r"produced record's timestamp is 9223372036854775808, outside \[-140737488355328, "),
    ("produce_at", END_OF_TIME + 1, r"produced record's timestamp is 140737488355328, outside \[-140737488355328, "),
    ("produce_at", BEGINNING_OF_TIME - 1, r"produced record's timestamp is -140737488355329, outside "),
    ("produce_at", "5", r"produced record's timestamp is a str \('5'\); timestamps are int milliseconds"),
    ("produce_at", True, r"produced record's timestamp is a bool \(True\)"),
    ("list_set", "abc", r"list state 'items': set\(\) takes a list of items, got str 'abc'"),
    ("list_set", None, r"list state 'items': set\(\) takes a list of items, got NoneType"),
    ("map_put", 1, "map state 'entries': a key must be hashable"),
    ("delete_timer", 5, "timer tag must be str, got int"),
    ("produce_swapped", None, r"produce\(\) takes the record first, then the stream: produce\(record, 'out'\)"),
])
def test_misuse_of_the_context_is_named_clearly(action, arg, message):
    ex = make_executor(ContextMisuse())
    with pytest.raises(ComputationFailed, match=message):
        step(ex, [deliver("k", [action, arg], 1, "r1")], 10, 0)


def test_productions_may_be_stamped_at_either_end_of_time():
    ex = make_executor(ContextMisuse())
    result = step(ex, [deliver("k", ["produce_at", BEGINNING_OF_TIME], 1, "r1"),
                       deliver("k", ["produce_at", END_OF_TIME], 2, "r2")], 10, 0)
    assert [p.timestamp for p in result.productions] == [BEGINNING_OF_TIME, END_OF_TIME]


class Keeper(Computation):
    """value {"op": "keep", "n": 0} stores the record's own value; {"op": "bump"} adds one to it in place;
    "fail" raises after. {"op": "deep", "depth": d} stores a list nested d deep (JSON holds 900)."""

    kept = ValueState("kept")
    keys = ValueState("keys", codec=PickleCodec())

    def process_record(self, ctx, record):
        value, kept = record.value, ctx.state(self.kept)
        if value["op"] == "keep":
            kept.set(value)  # the record's decoded value itself
        elif value["op"] == "bump":
            kept.get()["n"] += 1  # changes the kept record's value too: a rerun must not see that
        elif value["op"] == "deep":
            nested: list = []
            for _ in range(value["depth"]):
                nested = [nested]
            kept.set({"n": 0, "deep": nested})
        elif value["op"] == "object_key":  # a key hashed by identity, changed in place
            keys = ctx.state(self.keys)
            table = keys.get() or {_IdentityKey(): 0}
            next(iter(table)).n += 1
            keys.set(table)
        if value.get("fail"):
            raise ValueError("refused")


class _IdentityKey:
    def __init__(self) -> None:
        self.n = 0


def _keeper_outcome(ops: list[dict], every: int, monkeypatch) -> tuple:
    from millstream.core import executor as executor_module

    monkeypatch.setattr(executor_module, "CHECKPOINT_RECORDS", every)
    monkeypatch.setattr(executor_module, "CHECKPOINT_COPY_SHARE", None)
    ex = make_executor(Keeper(), on_error="dead_letter")
    codec = JsonCodec()  # records arrive encoded, as the runners make them (decoded when read)
    deliveries = [Delivery("k", "in", Record.encoded("k", codec.encode(op), codec, n, f"r{n}"), 0, True)
                  for n, op in enumerate(ops)]
    result = step(ex, deliveries, len(ops), 0)
    values, _ = inspect_key(ex.plan, ex.store.load(["k"])["k"])
    keys = values.pop("keys", None)
    return result.metrics.dead_letters, values, keys and [k.n for k in keys]


def test_a_failed_invocation_that_changed_a_records_value_in_place_leaves_no_trace(monkeypatch):
    ops = [{"op": "keep", "n": 0}, {"op": "bump"}, {"op": "bump", "fail": True}, {"op": "bump"},
           {"op": "bump", "fail": True}, {"op": "bump"}]
    expected = (2, {"kept": {"op": "keep", "n": 3}}, None)  # three bumps stood
    for every in (0, 1, 2, 3, 16):
        assert _keeper_outcome(ops, every, monkeypatch) == expected, every


def test_state_too_deep_or_keyed_by_mutable_objects_makes_the_step_start_over(monkeypatch):
    deep = [{"op": "deep", "depth": 400}, {"op": "bump", "fail": True}, {"op": "bump"}, {"op": "bump", "fail": True}]
    assert all(_keeper_outcome(deep, every, monkeypatch)[:1] == (2,) for every in (0, 1, 3))
    keyed = [{"op": "object_key"}, {"op": "object_key", "fail": True}, {"op": "object_key"},
             {"op": "object_key", "fail": True}, {"op": "object_key"}]
    assert {every: _keeper_outcome(keyed, every, monkeypatch)[2] for every in (0, 1, 3)} == {0: [3], 1: [3], 3: [3]}


@pytest.mark.parametrize("together", [False, True])
def test_a_timer_set_twice_by_one_redelivered_record_fails_only_where_it_failed(together):
    # With exactly_once=False a record delivered twice sets the same timer twice, with the same
    # identity (tag, time, the record as setter). Its first firing succeeds, its second fails: the
    # rerun skipped both when the two points shared a step (no output, two dead letters, the first
    # firing's state change lost), where one step per point skipped the failed one alone.
    from millstream.testing import PipelineHarness

    class FailsSecond(Computation):
        fired = ValueState("fired", default=0)

        def process_record(self, ctx, record):
            ctx.set_timer("t", record.timestamp + 1)

        def process_timer(self, ctx, timer):
            n = ctx.state(self.fired)
            n.set(n.get() + 1)
            if n.get() == 2:
                raise ValueError("second firing fails")
            ctx.produce(Record(ctx.key, f"firing #{n.get()}", timer.time), "out")

    h = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                        .add_computation("c", FailsSecond(), ["in"], ["out"], on_error="dead_letter",
                                         exactly_once=False))
    h.feed("src", [Record("k", "x", 1, "r1")], watermark=10)
    if not together:
        h.run()
    h.feed("src", [Record("k", "x", 1, "r1")])
    h.run()
    assert [r.value for r in h.output("out")] == ["firing #1"]
    assert [(d["timer"]["tag"], d["timer"]["time"]) for d in h.dead_letters()] == [("t", 2)]
    assert h.state("c", "k") == {"fired": 1}
