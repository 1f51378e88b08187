"""The skew limit on Spark: the fast injector never runs more than the limit (plus one read) ahead of
the computation behind it, and the output is the same as without the limit."""

import sys
import os

from millstream.spark.runner import SparkRunner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bucket_counter import BucketCounter  # noqa: E402
from test_skew_limit import FAST  # noqa: E402

from millstream import GeneratorInjector, Pipeline, Record  # noqa: E402


def pipeline(max_skew_ms):
    fast = GeneratorInjector(lambda i: Record(f"k{i % 5}", i, i * 10), FAST, lambda n: n * 10,
                             max_records_per_read=300, name="fast")
    # The slow input's watermark moves 400 ms of event time per wall second, far slower than the fast
    # one's 3 s per read on any machine, so without a limit the fast one runs ahead.
    slow = GeneratorInjector(lambda i: Record("s", i, i * 100), 60, lambda n: n * 100,
                             records_per_second=4, name="slow")
    return (Pipeline("skew")
            .add_injector("fast", fast, "in", max_skew_ms=max_skew_ms)
            .add_injector("slow", slow, "in")
            .add_computation("windows", BucketCounter(100), ["in"], ["windows"]))


def lead(runner):
    """How far the fast injector ran ahead of the windows computation, at worst, over the run."""
    found = [0]
    for entry in runner.watermark_history("windows"):
        fast = min(w for s, w in entry["senders"].items() if "/fast#" in s)
        if entry["low_watermark"] > -(2**47) and fast < 2**47 - 1:
            found.append(fast - entry["low_watermark"])
    return max(found)


def test_the_skew_limit_on_spark(spark, tmp_path):
    limited = SparkRunner(pipeline(2_000), root=str(tmp_path / "limited"), spark=spark)
    limited.run(timeout=300)
    unlimited = SparkRunner(pipeline(None), root=str(tmp_path / "unlimited"), spark=spark)
    unlimited.run(timeout=300)
    assert 0 < lead(limited) <= 2_000 + 300 * 10 < lead(unlimited) / 3, (lead(limited), lead(unlimited))
    assert sorted((r.key, tuple(r.value)) for r in limited.read_stream("windows")) == sorted(
        (r.key, tuple(r.value)) for r in unlimited.read_stream("windows"))


def test_a_hold_further_behind_than_the_limit_does_not_stall_spark(spark, tmp_path):
    """A session held at its first record for 30 s of input, under a 2 s skew limit: the source
    compares with how far the stages behind have processed (their unheld watermark), so it reads on
    to the end, the session closes once, and the judge downstream finds it on time."""
    from test_skew_limit import GAP_MS, expected_sessions, session_pipeline

    times = [1_000 * i for i in range(1, 31)]
    pipeline = session_pipeline(2_000, [([Record("k", t, t)], t) for t in times])  # a step per read
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=240)
    assert [r.value for r in runner.read_stream("sessions")] == expected_sessions(times) == [[1_000, 30_000 + GAP_MS]]
    assert [r.value["late"] for r in runner.read_stream("judged")] == [False]
    history = runner.watermark_history("session")
    # held at the session's start while the input went on further than the limit past it
    assert any(h["hold"] == 1_000 and h["low_watermark"] == 1_000 and h["input_watermark"] > 1_000 + 2_000
               for h in history), history
