"""Exactly-once on Spark, finding by finding: lateness that does not depend on how Spark batches (a
lagging consumer gives the harness's output, ids included), bad records that do not stop a pipeline
(dead letters) or stop it with one clear message (fail), wall-time timers at the end of input, and key
extractors that see the same value on both runners."""

import json
import os
import time

import pytest

from millstream import (
    DEAD_LETTERS,
    Computation,
    FileInjector,
    GeneratorInjector,
    MapState,
    Pipeline,
    Record,
    ScriptedInjector,
    TimeDomain,
    ValueState,
)
from millstream.spark.runner import MillstreamRunError, SparkRunner
from millstream.testing import PipelineHarness


def canonical(records):
    return sorted((r.key, json.dumps(r.value, sort_keys=True), r.timestamp, r.id) for r in records)


# -- lateness judged where a record arrived, not by Spark's batching -----------------------------------
class Forward(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "mid")


class Slow(Computation):
    """Lags behind its input (so Spark merges several upstream publications into one batch) and
    reports what it saw: lateness and the watermark each record arrived under; counts per window."""

    counts = MapState[int, int]("counts")

    def process_record(self, ctx, record):
        if record.value == "pause":
            time.sleep(0.6)
            return
        ctx.produce(Record(ctx.key, {"late": ctx.is_late, "lw": ctx.low_watermark, "v": record.value},
                           record.timestamp), "seen")
        window = record.timestamp - record.timestamp % 100
        ctx.state(self.counts).put(window, ctx.state(self.counts).get(window, 0) + 1)
        ctx.set_timer(f"w{window}", window + 100)

    def process_timer(self, ctx, timer):
        window = timer.time - 100
        ctx.produce(Record(ctx.key, {"window": window, "n": ctx.state(self.counts).get(window)}, timer.time), "windows")
        ctx.state(self.counts).remove(window)


def lagging_pipeline():
    steps = []
    for step in range(14):
        base = step * 100
        records = [Record("p", "pause", base)]  # one slow record per step
        records += [Record(f"k{i % 3}", step * 10 + i, base + 7 * i) for i in range(8)]
        records += [Record("k0", f"late{step}", base - 150)]  # behind the watermark of the step before
        steps.append((records, base))
    return (Pipeline("lag")
            .add_injector("src", ScriptedInjector("src", steps), "in")
            .add_computation("up", Forward(), ["in"], ["mid"])
            .add_computation("slow", Slow(), ["mid"], ["seen", "windows"]))


def test_a_lagging_consumer_gives_the_harness_output_ids_included(spark, tmp_path):
    harness = PipelineHarness(lagging_pipeline(), key_groups=4)
    harness.run_injectors()
    runner = SparkRunner(lagging_pipeline(), root=str(tmp_path / "root"), spark=spark, key_groups=4, trigger_ms=100)
    progress = runner.run(timeout=300)
    up, slow = progress.computations["up"], progress.computations["slow"]
    assert slow.batches < up.batches, "the consumer never lagged: the test would prove nothing"
    for stream in ("seen", "windows"):
        expected = canonical(harness.output(stream))
        assert expected and canonical(runner.read_stream(stream)) == expected, stream
    assert harness.metrics("slow").late > 0 and slow.late == harness.metrics("slow").late


# -- bad records ---------------------------------------------------------------------------------------
class Tally(Computation):
    """Sums values per key; raises on the value "boom" (a user bug on one record)."""

    total = ValueState[int]("total", default=0)

    def __init__(self, fixed: bool = False) -> None:
        self.fixed = fixed

    def process_record(self, ctx, record):
        total = ctx.state(self.total)
        total.set(total.get() + (record.value if isinstance(record.value, int) else 0))
        if record.value == "boom" and not self.fixed:
            raise ValueError("cannot tally boom")
        ctx.produce(Record(ctx.key, total.get(), record.timestamp), "totals")


def write_log(directory, name, lines):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as out:
        out.write("".join(line + "\n" for line in lines))
    os.rename(path + ".tmp", path)


def tally_pipeline(logs, sink, on_error, fixed=False):
    return (Pipeline("tally")
            .add_injector("logs", FileInjector(str(logs), creation="name"), "in")
            .add_computation("tally", Tally(fixed), {"in": lambda r: r.value if r.key == "by-value" else r.key},
                             ["totals"], on_error=on_error)
            .add_sink("dead", DEAD_LETTERS, str(sink), format="jsonl")
            .add_sink("totals_out", "totals", str(sink) + "-totals", format="jsonl"))


def rec(key, value, ts, rid):
    return json.dumps({"key": key, "value": value, "timestamp": ts, "id": rid})


def sink_rows(directory):
    return [json.loads(line) for name in sorted(os.listdir(directory)) if name.endswith(".jsonl")
            for line in open(os.path.join(directory, name))]


def test_bad_records_go_to_dead_letters_and_the_pipeline_goes_on(spark, tmp_path):
    logs = tmp_path / "logs"
    write_log(logs, "log-1000.jsonl", [rec("a", 1, 1_000, "a1"), "{not json", rec("a", "boom", 1_001, "a2"),
                                       rec("b", 5, 1_002, "b1"), rec("by-value", 7, 1_003, "v1"),
                                       rec("a", 2, 1_004, "a3")])
    open(logs / "_DONE", "w").close()
    sink = tmp_path / "dead"
    runner = SparkRunner(tally_pipeline(logs, sink, "dead_letter"), root=str(tmp_path / "root"), spark=spark)
    progress = runner.run(timeout=240)
    letters = {row["value"]["record_id"]: row["value"] for row in sink_rows(sink)}
    assert set(letters) == {"log-1000.jsonl:2", "a2", "v1"}
    assert "not a record line" in letters["log-1000.jsonl:2"]["error"]  # malformed input
    boom = letters["a2"]  # user code raised
    assert (boom["computation"], boom["input"], boom["key"], boom["value"]) == ("tally", "in", "a", "boom")
    assert boom["error"] == "ValueError: cannot tally boom" and "process_record" in boom["traceback"]
    assert "key extractor" in letters["v1"]["error"]  # the extractor returned an int
    # The failed record left no trace in state: a's running total skipped it.
    totals = {(r["key"], r["value"]) for r in sink_rows(str(sink) + "-totals")}
    assert totals == {("a", 1), ("a", 3), ("b", 5)}
    assert progress.computations["tally"].dead_letters == 3


def test_a_failing_record_stops_the_pipeline_with_one_clear_message_and_a_fix_resumes(spark, tmp_path):
    logs = tmp_path / "logs"
    write_log(logs, "log-1000.jsonl", [rec("a", 1, 1_000, "a1"), rec("a", "boom", 1_001, "a2"),
                                       rec("b", 5, 1_002, "b1")])
    open(logs / "_DONE", "w").close()
    root, sink = str(tmp_path / "root"), tmp_path / "dead"
    with pytest.raises(MillstreamRunError) as failure:
        SparkRunner(tally_pipeline(logs, sink, "fail"), root=root, spark=spark).run(timeout=240)
    message = str(failure.value)
    for part in ("computation 'tally'", "key 'a'", "record 'a2'", "stream 'in'", "ValueError: cannot tally boom",
                 "process_record", "raise ValueError"):
        assert part in message, (part, message)
    assert not any(s in message for s in ("org.apache", "py4j", "at scala.", "java.lang")), message
    assert len(message.splitlines()) < 15, message
    # The fixed code on the same root: the failed batch runs again, nothing lost or seen twice.
    SparkRunner(tally_pipeline(logs, sink, "fail", fixed=True), root=root, spark=spark).run(timeout=240)
    totals = sorted((r["key"], r["value"], r["id"]) for r in sink_rows(str(sink) + "-totals"))
    assert [(k, v) for k, v, _ in totals] == [("a", 1), ("a", 1), ("b", 5)]  # "boom" adds nothing, once
    assert len({i for _, _, i in totals}) == 3
    assert not sink.exists() or sink_rows(sink) == []  # the fail policy makes no dead letters


# -- wall-time timers at the end of input -----------------------------------------------------------------
class Reminder(Computation):
    def process_record(self, ctx, record):
        ctx.set_timer("soon", ctx.wall_time + 1_500, TimeDomain.WALL_TIME)
        ctx.set_timer("much-later", ctx.wall_time + 3_600_000, TimeDomain.WALL_TIME)

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, timer.tag, 0), "reminders")


def test_run_fires_wall_timers_due_soon_after_the_input_ends_and_reports_the_rest(spark, tmp_path):
    pipeline = (Pipeline("remind").add_injector("src", ScriptedInjector("src", [([Record("k", 1, 5)], 10)]), "in")
                .add_computation("remind", Reminder(), ["in"], ["reminders"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    progress = runner.run(timeout=240, wall_timer_drain_s=30)
    assert [r.value for r in runner.read_stream("reminders")] == ["soon"]
    assert set(progress.pending_wall_timers) == {"remind"}
    assert progress.pending_wall_timers["remind"] > time.time() * 1000 + 3_000_000


# -- key extractors see the same value on both runners --------------------------------------------------
class ShoutingCodec:
    """Not a faithful codec on purpose: text comes back upper-cased."""

    def encode(self, value):
        return value.encode()

    def decode(self, data):
        return bytes(data).decode().upper()


class Keys(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, record.value, record.timestamp), "keys")


def test_key_extractors_see_the_decoded_value_on_both_runners(spark, tmp_path):
    def pipeline():
        return (Pipeline("keys").declare_stream("in", ShoutingCodec())
                .add_injector("src", ScriptedInjector("src", [([Record("k", "mixed Case", 5)], 10)]), "in")
                .add_computation("keys", Keys(), {"in": lambda r: r.value}, ["keys"]))

    harness = PipelineHarness(pipeline())
    harness.run_injectors()
    runner = SparkRunner(pipeline(), root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=240)
    assert [r.key for r in harness.output("keys")] == ["MIXED CASE"]
    assert [r.key for r in runner.read_stream("keys")] == ["MIXED CASE"]


def test_an_injector_giving_a_bad_timestamp_stops_the_run_with_one_line_naming_it(spark, tmp_path):
    class Forward(Computation):
        def process_record(self, ctx, record):
            ctx.produce(record, "out")

    pipeline = (Pipeline("badinput")
                .add_injector("gen", GeneratorInjector(lambda i: Record("k", i, str(i)), total=3,
                                                       low_watermark=lambda n: 0), "in")
                .add_computation("fwd", Forward(), ["in"], ["out"]))
    with pytest.raises(MillstreamRunError) as failure:
        SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark).run(timeout=240)
    message = str(failure.value)
    assert "injector 'gen' gave a record whose timestamp is a str ('0')" in message, message
    assert not any(s in message for s in ("org.apache", "py4j", "at scala.", "java.lang")), message
