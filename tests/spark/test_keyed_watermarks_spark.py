"""Keyed watermarks on Spark: an injector with two partitions publishes a "ship" watermark besides a
low watermark that stays at the beginning of time until its input ends. Timers on the "ship"
watermark fire while the low watermark has not moved, each exactly once and never early; the keyed
watermark crosses a stream log to a downstream computation. Expected values from plain Python."""

from collections import Counter

from millstream import BEGINNING_OF_TIME, END_OF_TIME, Computation, GeneratorInjector, Pipeline, Record
from millstream.spark.runner import SparkRunner

TOTAL = 3_000


def ship_time(i):
    return 10 * i + (i * 7919) % 200  # out of order, never before 10 * i


class ShipTimer(Computation):
    def process_record(self, ctx, record):
        ctx.set_timer(record.id, record.value["ship"], watermark="ship")

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, {"time": timer.time, "ship_wm": ctx.watermark("ship"),
                                     "low_wm": ctx.low_watermark}, 0), "fired")


class Forward(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, {**record.value, "seen_ship_wm": ctx.watermark("ship")}, 0), "seen")


def test_timers_on_a_keyed_watermark_fire_on_spark_before_the_low_watermark_moves(spark, tmp_path):
    orders = GeneratorInjector(
        lambda i: Record(f"k{i % 7}", {"ship": ship_time(i)}, 0), TOTAL,
        low_watermark=lambda n: BEGINNING_OF_TIME,  # held until the end of input
        partitions=2, max_records_per_read=150,
        # After reading every index below n, a partition's later records ship at 10 * n or after.
        keyed_watermarks={"ship": lambda n: 10 * n})
    pipeline = (Pipeline("keyed")
                .add_injector("orders", orders, "orders")
                .add_computation("timers", ShipTimer(), ["orders"], ["fired"])
                .add_computation("forward", Forward(), ["fired"], ["seen"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark, trigger_ms=200)
    progress = runner.run(timeout=400)
    assert progress.done

    fired = runner.read_stream("fired")
    assert Counter((r.key, r.value["time"]) for r in fired) == Counter(
        (f"k{i % 7}", ship_time(i)) for i in range(TOTAL))  # each timer once
    assert all(r.value["ship_wm"] >= r.value["time"] for r in fired), "a keyed timer fired early"
    # Most fired while the low watermark still stood at the beginning of time: the keyed watermark
    # moved them, not the end of input.
    before_end = [r for r in fired if r.value["low_wm"] == BEGINNING_OF_TIME]
    assert len(before_end) > TOTAL // 2
    assert all(r.value["ship_wm"] < END_OF_TIME for r in before_end)

    seen = runner.read_stream("seen")
    assert len(seen) == TOTAL
    assert all(r.value["seen_ship_wm"] <= r.value["ship_wm"] for r in seen)
    # The keyed watermark crossed the stream log: downstream saw it move before the end.
    assert any(BEGINNING_OF_TIME < r.value["seen_ship_wm"] < END_OF_TIME for r in seen)
    assert progress.computations["timers"].keyed_watermarks == {"ship": END_OF_TIME}
    assert progress.computations["forward"].keyed_watermarks == {"ship": END_OF_TIME}
