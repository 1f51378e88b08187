"""The interval join on Spark gives the oracle's pairs and unmatched rows (the same scenarios as the
harness tests, smaller), with one side idle for a stretch: on event time, and on a second time
column by keyed watermarks."""

import random

from millstream import Pipeline, ScriptedInjector
from millstream.joins import IntervalJoin
from millstream.spark.runner import SparkRunner
from test_joins import LOWER, UPPER, oracle, side
from test_keyed_watermarks import join_oracle as keyed_oracle
from test_keyed_watermarks import join_side as keyed_side


def test_interval_join_on_spark_equals_the_oracle(spark, tmp_path):
    rng = random.Random(5)
    left_steps, lefts = side(rng, "l", 24)
    right_steps, rights = side(rng, "r", 24, quiet=(6, 14))
    right_steps = [(records, watermark if not 6 <= i < 14 else right_steps[5][1])
                   for i, (records, watermark) in enumerate(right_steps)]
    join = IntervalJoin("L", "R", LOWER, UPPER, how="left", late_stream="late")
    pipeline = (Pipeline("join")
                .add_injector("left", ScriptedInjector("left", left_steps), "L")
                .add_injector("right", ScriptedInjector("right", right_steps), "R", idle_after_ms=300)
                .add_computation("join", join, ["L", "R"], join.outputs))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=300)
    joined = sorted(((r.key, r.value["left"], r.value["right"]) for r in runner.read_stream("joined")), key=repr)
    assert joined == oracle(lefts, rights, "left")
    assert runner.read_stream("late") == []


def test_interval_join_on_a_second_time_column_by_keyed_watermarks_on_spark(spark, tmp_path):
    rng = random.Random(6)
    left_steps, lefts = keyed_side(rng, "l", 24)
    right_steps, rights = keyed_side(rng, "r", 24, quiet=(6, 14))
    right_steps = [(r, w, k if not 6 <= i < 14 else right_steps[5][2]) for i, (r, w, k) in enumerate(right_steps)]
    join = IntervalJoin("L", "R", LOWER, UPPER, how="left", late_stream="late",
                        left_time=lambda r: r.value["t"], right_time=lambda r: r.value["t"],
                        left_watermark="l_t", right_watermark="r_t")
    pipeline = (Pipeline("keyedjoin")
                .add_injector("left", ScriptedInjector("left", left_steps, watermark_keys=("l_t",)), "L")
                .add_injector("right", ScriptedInjector("right", right_steps, watermark_keys=("r_t",)), "R",
                              idle_after_ms=300)
                .add_computation("join", join, ["L", "R"], join.outputs))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=300)
    joined = sorted(((r.key, r.value["left"]["v"], r.value["right"] and r.value["right"]["v"])
                     for r in runner.read_stream("joined")), key=repr)
    assert joined == keyed_oracle(lefts, rights, "left")
    assert runner.read_stream("late") == []
