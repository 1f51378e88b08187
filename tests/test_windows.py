"""millstream.windows against a plain-Python oracle: random out-of-order data with late records,
several keys, tumbling and sliding windows, every built-in aggregator and a user fold.

The oracle knows only the documented semantics: a record is late when stamped behind the input low
watermark published before it; an on-time record counts in every window containing it; a window is
produced once the watermark reaches its end, stamped with the end, once. The harness is checked after
every input point (nothing early, nothing missing, open windows = state entries) and at the end.
"""

from __future__ import annotations

import random
import zlib
from collections import defaultdict
from typing import Any, Callable

import pytest

from millstream import END_OF_TIME, Pipeline, Record, ScriptedInjector
from millstream.testing import PipelineHarness
from millstream.windows import (
    Aggregator, Collect, Count, Fold, LatePolicy, Max, Min, SlidingWindows, Sum, TumblingWindows, Window,
    WindowAggregate,
)

KEYS = ("alpha", "beta", "gamma", "delta")


def make_batches(seed: int, events: int = 700) -> list[tuple[list[Record[Any]], int]]:
    """Records in arrival order, cut into input points, each with the honest watermark after it
    (the oldest on-time record still to come), plus deliberately late records it does not wait for.
    Timestamps sit on a 250 ms grid so records fall exactly on window boundaries."""
    rng = random.Random(seed)
    pending = []
    for n in range(events):
        timestamp = 250 * rng.randrange(0, 120) + rng.choice((0, 0, 0, 1, 249))
        delay = rng.expovariate(1 / 600)
        late = rng.random() < 0.04
        arrival = timestamp + delay + (8_000 if late else 0)
        pending.append((arrival, late, Record(rng.choice(KEYS), {"n": rng.randrange(-50, 100), "i": n},
                                               timestamp, f"e{n}")))
    pending.sort(key=lambda item: item[0])
    batches = []
    position = 0
    published = -1
    while position < len(pending):
        size = rng.randrange(1, 60)
        batch = pending[position:position + size]
        position += size
        rest = [record.timestamp for _, late, record in pending[position:] if not late]
        watermark = min(rest) if rest else 30_000
        published = max(published, watermark)
        batches.append(([record for _, _, record in batch], published))
    return batches


def mean_fold() -> Fold[float, tuple[int, float], float]:
    # A tuple accumulator: the helper's state must keep it a tuple.
    return Fold(init=lambda: (0, 0.0), add=lambda acc, v: (acc[0] + 1, acc[1] + v),
                finish=lambda acc: round(acc[1] / acc[0], 6))


AGGREGATORS: dict[str, tuple[Aggregator[Any, Any, Any], Callable[[list[int]], Any]]] = {
    "count": (Count(), lambda values: len(values)),
    "sum": (Sum(), lambda values: sum(values)),
    "min": (Min[int](), min),
    "max": (Max[int](), max),
    "collect": (Collect[int](), list),
    "mean": (mean_fold(), lambda values: round(sum(values) / len(values), 6)),
}


def windows_containing(assigner: Any, timestamp: int) -> list[Window]:
    """By brute force from the definition, not from the assigner's arithmetic: every window
    [offset + k * slide, ... + size) that contains the timestamp."""
    size = assigner.size_ms
    slide = getattr(assigner, "slide_ms", size)
    found = []
    for k in range(-10, 40_000 // slide + 10):
        start = assigner.offset_ms + k * slide
        if start <= timestamp < start + size:
            found.append(Window(start, start + size))
    return found


def oracle(assigner: Any, batches: list[tuple[list[Record[Any]], int]]) -> tuple[list[dict], list[Record[Any]]]:
    """Per window: key, window, values in arrival order and the watermark at which it is due."""
    values: dict[tuple[str, Window], list[int]] = defaultdict(list)
    late: list[Record[Any]] = []
    watermark = -(2**47)
    for records, after in batches:
        for record in records:
            if record.timestamp < watermark:
                late.append(record)
                continue
            for window in windows_containing(assigner, record.timestamp):
                values[(record.key, window)].append(record.value["n"])
        watermark = after
    windows = [{"key": k, "window": w, "values": v} for (k, w), v in values.items()]
    return windows, late


def build(assigner: Any, late: LatePolicy) -> Pipeline:
    pipeline = Pipeline("windows").add_injector("src", ScriptedInjector("src", []), "events")
    for name, (aggregator, _) in AGGREGATORS.items():
        computation = WindowAggregate(assigner, aggregator, f"{name}_out", select=lambda r: r.value["n"],
                                      late=late, late_stream=f"{name}_late" if late == "side" else None)
        pipeline.add_computation(name, computation, ["events"], computation.outputs)
    return pipeline


def produced(harness: PipelineHarness, name: str) -> list[tuple[str, int, int, int, Any]]:
    return sorted(((r.key, r.value["start"], r.value["end"], r.timestamp, r.value["value"])
                   for r in harness.output(f"{name}_out")), key=repr)


def expected(windows: list[dict], name: str, up_to: int) -> list[tuple[str, int, int, int, Any]]:
    finish = AGGREGATORS[name][1]
    return sorted(((w["key"], w["window"].start, w["window"].end, w["window"].end, finish(w["values"]))
                   for w in windows if w["window"].end <= up_to), key=repr)


def open_counts(assigner: Any, fed: list[Record[Any]], late_ids: set[str], watermark: int,
                key: str) -> dict[int, int]:
    """The Count accumulators a key must hold: its on-time records so far, in windows not yet due."""
    held: dict[int, int] = defaultdict(int)
    for record in fed:
        if record.key == key and record.id not in late_ids:
            for window in windows_containing(assigner, record.timestamp):
                if window.end > watermark:
                    held[window.start] += 1
    return dict(held)


ASSIGNERS = {
    "tumbling-1s": TumblingWindows(1_000),
    "tumbling-700ms-offset": TumblingWindows(700, offset_ms=100),
    "sliding-1s-every-250ms": SlidingWindows(1_000, 250),
    "sliding-1s-every-300ms": SlidingWindows(1_000, 300),
}


@pytest.mark.parametrize("late_policy", ["drop", "side"])
@pytest.mark.parametrize("kind", sorted(ASSIGNERS))
def test_windows_equal_the_oracle_at_every_input_point(kind: str, late_policy: LatePolicy) -> None:
    assigner = ASSIGNERS[kind]
    batches = make_batches(seed=zlib.crc32(f"{kind}/{late_policy}".encode()))
    windows, late = oracle(assigner, batches)
    late_ids = {r.id for r in late}
    assert len(late) > 20 and len({w["key"] for w in windows}) == len(KEYS), "the data must exercise both"
    harness = PipelineHarness(build(assigner, late_policy))
    fed: list[Record[Any]] = []
    for records, watermark in batches:
        harness.feed("src", records, watermark=watermark)
        harness.run()
        # Complete windows are out, each once; open ones are not, and are exactly the state held.
        # (Every aggregator shares the timing; two of them are checked at every point, all at the end.)
        for name in ("count", "mean"):
            assert produced(harness, name) == expected(windows, name, watermark), (name, watermark)
        fed.extend(records)
        for key in KEYS:
            held = harness.state("count", key).get("window_accumulators", {})
            assert held == open_counts(assigner, fed, late_ids, watermark, key), (key, watermark)
    harness.advance_watermark("src", END_OF_TIME)
    harness.run()
    for name in AGGREGATORS:
        assert produced(harness, name) == expected(windows, name, END_OF_TIME), name
        assert harness.metrics(name).late == len(late)  # counted, whatever the policy
        assert harness.keys(name) == []  # every window's state and timer gone once it is produced
        if late_policy == "side":
            assert sorted((r.key, r.timestamp, r.value["i"]) for r in harness.output(f"{name}_late")) == \
                sorted((r.key, r.timestamp, r.value["i"]) for r in late)


def test_configuration_mistakes_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="must not exceed size_ms"):
        SlidingWindows(1_000, 2_000)  # records between windows would vanish
    with pytest.raises(ValueError, match="positive int"):
        TumblingWindows(0)
    with pytest.raises(ValueError, match="late_stream"):
        WindowAggregate(TumblingWindows(1_000), Count(), "out", late="side")
    with pytest.raises(ValueError, match="'drop'"):
        WindowAggregate(TumblingWindows(1_000), Count(), "out", late="keep")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has no init"):
        WindowAggregate(TumblingWindows(1_000), object(), "out")  # type: ignore[arg-type]


def test_travels_pickled_as_spark_ships_it() -> None:
    import pickle

    from pyspark import cloudpickle

    computation = WindowAggregate(SlidingWindows(2_000, 500), mean_fold(), "means", select=lambda r: r.value["n"])
    shipped = pickle.loads(cloudpickle.dumps(computation))
    assert shipped.windows == computation.windows and shipped.outputs == ["means"]
    acc = shipped.aggregator.add(shipped.aggregator.init(), 4.0)
    assert shipped.aggregator.finish(acc) == 4.0


@pytest.mark.parametrize("windows, aggregator", [(TumblingWindows(1_000), Count), (TumblingWindows, Count())],
                         ids=["aggregator-class", "windows-class"])
def test_a_class_instead_of_an_instance_is_refused_where_the_pipeline_is_built(windows, aggregator):
    # Both passed the checks (a class has the methods) and failed at the first record, with a traceback
    # (on Spark, a failed job). Found by an independent review.
    with pytest.raises(TypeError, match=r"must be an instance, e\.g\. (Count|TumblingWindows)\(\.\.\.\)"):
        WindowAggregate(windows, aggregator, "out")


def test_a_record_in_the_last_window_before_end_of_time_is_counted():
    # Its window ends after END_OF_TIME: setting the window's timer failed the step, on every restart.
    wa = WindowAggregate(TumblingWindows(1_000), Count(), "out")
    pipeline = (Pipeline("w").add_injector("in", ScriptedInjector("in", [([Record("a", 1, 0, "x0"),
                                                                          Record("a", 1, END_OF_TIME - 5, "x1")], 0)]),
                                           "nums")
                .add_computation("win", wa, ["nums"], wa.outputs))
    h = PipelineHarness(pipeline)
    h.run_injectors()
    assert sorted((r.value["start"], r.value["value"], r.timestamp) for r in h.output("out")) == [
        (0, 1, 1_000), (END_OF_TIME - 5 - (END_OF_TIME - 5) % 1_000, 1, END_OF_TIME)]
