"""Watermark holds on Spark: a computation keeps records and produces them from a wall-time timer
after its input watermark has passed them; the timer's hold keeps its published watermark at the
earliest kept record meanwhile, so the consumer judges none of them late. A weak (fused) computation
that holds is refused with a clear error. Ground truth: the injected timestamps."""

import os
import sys

import pytest

from millstream import Pipeline, Record, ScriptedInjector
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_holds import Judge, Stash  # noqa: E402


def test_held_records_reach_the_consumer_on_time_on_spark(spark, tmp_path):
    records = [Record(f"k{i % 5}", None, 100 + 37 * i) for i in range(20)]
    # Then the watermark ends (finish): only the hold keeps the stash's watermark behind the records.
    injector = ScriptedInjector("src", [(records, 1_000), ([], 5_000)])
    pipeline = (Pipeline("holds").add_injector("src", injector, "in")
                .add_computation("stash", Stash(hold=True), ["in"], ["out"])
                .add_computation("judge", Judge(), ["out"], ["judged"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=300)
    judged = [r.value for r in runner.read_stream("judged")]
    assert sorted(j["ts"] for j in judged) == sorted(r.timestamp for r in records)
    assert [j for j in judged if j["late"]] == []
    history = runner.watermark_history("stash")
    earliest = min(r.timestamp for r in records)
    # held: published at the earliest kept record while the input watermark was past it
    assert any(h["hold"] == earliest and h["low_watermark"] == earliest and h["input_watermark"] > earliest
               for h in history), history
    assert history[-1]["low_watermark"] == END_OF_TIME and history[-1]["hold"] is None


def test_a_weak_computation_that_holds_is_refused_clearly(spark, tmp_path):
    injector = ScriptedInjector("src", [([Record("k", None, 100)], 1_000)])
    pipeline = (Pipeline("weakhold").add_injector("src", injector, "in")
                .add_computation("stash", Stash(hold=True), ["in"], ["out"], production="weak")
                .add_computation("judge", Judge(), ["out"], ["judged"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    with pytest.raises(Exception) as raised:
        runner.run(timeout=300)
    message = str(raised.value)
    assert "'stash' holds its output watermark" in message and "strong productions" in message, message
    assert "Traceback" not in message and "py4j" not in message.lower()
