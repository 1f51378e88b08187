"""Pipelines that change while running (MillWheel section 4): a computation added to a running
pipeline (reading an existing stream from the start of its log) and one removed, while the others
keep running and keep their state: their output is the output of a run that never changed."""

import json
import os

import pytest

from bucket_counter import BucketCounter

from millstream import Computation, GeneratorInjector, Pipeline, Record, ValueState
from millstream.spark.publog import PublicationLog
from millstream.spark.runner import SparkRunner

EVENTS = 4_000


class Total(Computation):
    """Running total per key of the windows' counts (state it must keep across the change)."""

    total = ValueState[int]("total", default=0)

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx, record):
        ctx.state(self.total).set(ctx.state(self.total).get() + record.value[1])
        ctx.produce(Record(ctx.key, ctx.state(self.total).get(), record.timestamp), self.output)


class GatedGenerator(GeneratorInjector):
    """Offers the first half of its records until the gate file exists (None: no gate), so the
    change surely lands mid-stream however slow the machine."""

    def __init__(self, gate):
        super().__init__(lambda i: Record(f"k{i % 4}", i, 5 * i), EVENTS, lambda n: 5 * n,
                         max_records_per_read=200)
        self.gate = gate

    def latest_offset(self, partition, start, max_records):
        end = super().latest_offset(partition, start, max_records)
        if self.gate is not None and not os.path.exists(self.gate) and end["next"] > EVENTS // 2:
            end = {**end, "next": max(start["next"], EVENTS // 2)}
        return end


def pipeline(with_extra=True, gate=None):
    injector = GatedGenerator(gate)
    p = (Pipeline("changing").add_injector("src", injector, "in")
         .add_computation("windower", BucketCounter(), ["in"], ["windows"])
         .add_computation("totals", Total("running"), ["windows"], ["running"]))
    if with_extra:
        p.add_computation("extra", Total("extra_out"), ["windows"], ["extra_out"])
    return p


def published_rows(root, computation):
    """Rows in a computation's publication log, read apart from the runner."""
    log = PublicationLog(str(root), computation)
    return sum(rows for _, entry in log.entries_after(-1, 1 << 20) if entry["type"] == "batch"
               for files in entry["streams"].values() for _, rows in files)


def rows(runner, stream):
    return sorted((r.key, json.dumps(r.value), r.timestamp, r.id) for r in runner.read_stream(stream))


def test_a_computation_added_and_one_removed_while_running_leave_the_others_unchanged(spark, tmp_path):
    reference = SparkRunner(pipeline(), root=str(tmp_path / "reference"), spark=spark)
    reference.run(timeout=900)

    gate = tmp_path / "gate"
    runner = SparkRunner(pipeline(gate=str(gate)), root=str(tmp_path / "changing"), spark=spark)
    changed = []

    def change(progress):
        if not changed and progress.computations["totals"].records >= 8:
            runner.add_computation("auditor", Total("audit"), ["windows"], ["audit"], start="earliest")
            runner.add_computation("newcomer", Total("fresh"), ["windows"], ["fresh"], start="latest")
            runner.remove_computation("extra")
            changed.append(progress.computations["windower"].low_watermark)
            gate.touch()

    progress = runner.run(on_progress=change, progress_interval=0.5, timeout=900)
    assert changed and changed[0] < 5 * EVENTS, "the change came after the input was over"
    for stream in ("windows", "running"):
        assert rows(runner, stream) == rows(reference, stream), stream
    # The added computation read the windows log from its start: the same totals as "totals".
    audit = sorted((r.key, r.value, r.timestamp) for r in runner.read_stream("audit"))
    assert audit == sorted((r.key, r.value, r.timestamp) for r in reference.read_stream("running"))
    # The one that started from now saw only what was published after it started.
    fresh = runner.read_stream("fresh")
    assert 0 < len(fresh) < len(audit) and min(r.timestamp for r in fresh) > min(t for _, _, t in audit)
    # The removed one stopped part way; what it published before is kept.
    assert 0 < published_rows(tmp_path / "changing", "extra") < published_rows(tmp_path / "reference", "extra")
    assert "extra" not in progress.computations and progress.computations["auditor"].records == len(audit)
    # The root now runs the changed pipeline as written.
    again = (pipeline(with_extra=False).add_computation("auditor", Total("audit"), ["windows"], ["audit"])
             .add_computation("newcomer", Total("fresh"), ["windows"], ["fresh"]))
    SparkRunner(again, root=str(tmp_path / "changing"), spark=spark).run(timeout=120)


class Picky(Computation):
    """Fails on the windows of buckets that are multiples of 3 seconds."""

    def process_record(self, ctx, record):
        bucket, count = record.value
        if bucket % 3_000 == 0:
            raise ValueError(f"picky about {bucket}")
        ctx.produce(Record(ctx.key, count, record.timestamp), "fine")


def test_dead_letters_of_a_computation_added_while_running_reach_the_dead_letter_sink(spark, tmp_path):
    """The sinks' producers were fixed at start: a computation added while running had its dead
    letters published but never delivered to the sink on dead letters, and the run ended so (0 of
    28). Ground truth: the windows' buckets in plain Python."""
    from millstream import DEAD_LETTERS

    gate, sink = tmp_path / "gate", tmp_path / "dead"
    runner = SparkRunner(pipeline(with_extra=False, gate=str(gate)).add_sink("dead", DEAD_LETTERS, str(sink),
                                                                             format="jsonl"),
                         root=str(tmp_path / "root"), spark=spark)
    added = []

    def change(progress):
        if not added and progress.computations["windower"].batches >= 2:
            runner.add_computation("picky", Picky(), ["windows"], ["fine"], on_error="dead_letter")
            added.append(True)
            gate.touch()

    runner.run(on_progress=change, progress_interval=0.5, timeout=600)
    assert added
    buckets = {(f"k{i % 4}", 5 * i - 5 * i % 1000) for i in range(EVENTS)}
    expected = sorted((key, bucket) for key, bucket in buckets if bucket % 3_000 == 0)
    delivered = sorted((row["key"], row["value"]["value"][0]) for name in os.listdir(sink) if name.endswith(".jsonl")
                       for row in map(json.loads, open(sink / name)) if row["value"]["computation"] == "picky")
    assert delivered == expected


class Letters(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, record.value["computation"], record.timestamp), "letters")


def test_a_computation_cannot_be_added_while_a_running_one_reads_dead_letters(spark, tmp_path):
    """A running reader's senders are fixed: the new computation's dead letters would never reach it."""
    from millstream import DEAD_LETTERS, PipelineError

    runner = SparkRunner(pipeline(with_extra=False).add_computation("letters", Letters(), [DEAD_LETTERS], ["letters"]),
                         root=str(tmp_path / "root"), spark=spark)
    runner.start()
    try:
        with pytest.raises(PipelineError, match=r"'dead_letters' \(read by 'letters'\)"):
            runner.add_computation("picky", Picky(), ["windows"], ["fine"], on_error="dead_letter")
        assert "picky" not in runner.plans
    finally:
        runner.stop()
