"""A root resumed with a pipeline that cannot go on where the last run left off is refused at start
with one message (spark/resume.py), where it went on wrongly before: a computation with an input
taken away froze its low watermark for good (its timers never fired), and one left out of a run
while retention deleted what it had not read skipped those entries."""

import shutil
import time

import pytest
from bucket_counter import BucketCounter

from millstream import Computation, GeneratorInjector, Pipeline, PipelineError, Record, ScriptedInjector
from millstream.spark.publog import PublicationLog
from millstream.spark.runner import SparkRunner


class Relay(Computation):
    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(record, self.output)


def generator(total: int) -> GeneratorInjector:
    return GeneratorInjector(lambda i: Record(f"k{i % 3}", i, 7 * i), total, lambda n: 7 * n, max_records_per_read=100)


def test_a_computation_whose_input_was_taken_away_is_refused_at_start(spark, tmp_path):
    root = str(tmp_path / "root")
    mobile = ScriptedInjector("mobile", [([Record("k0", 1, 5, "m1")], 1_000)], finish=False)  # never finishes
    first = (Pipeline("inputs").add_injector("web", generator(300), "web").add_injector("mobile", mobile, "mobile")
             .add_computation("windower", BucketCounter(), ["web", "mobile"], ["windows"]))
    runner = SparkRunner(first, root=root, spark=spark, key_groups=4)
    runner.start()
    try:
        deadline = time.time() + 120
        while runner.progress().computations["windower"].low_watermark < 1_000:
            runner.raise_if_failed()
            assert time.time() < deadline, runner.progress()
            time.sleep(0.2)
    finally:
        runner.stop()
    # The mobile feed is switched off: before, the windower kept its last watermark (1,000) in the
    # coalesced one for good, and no window past it ever came out.
    second = (Pipeline("inputs").add_injector("web", generator(600), "web")
              .add_computation("windower", BucketCounter(), ["web"], ["windows"]))
    with pytest.raises(PipelineError, match=r"'windower' reads from other inputs than its checkpoint holds "
                                            r"\(no longer read: mobile/mobile#0\).*new name"):
        SparkRunner(second, root=root, spark=spark, key_groups=4).run(timeout=90)


class Upto(GeneratorInjector):
    """The first `upto` of the generator's records for now, more to come: a source that runs on."""

    def __init__(self, upto: int) -> None:
        super().__init__(lambda i: Record(f"k{i % 3}", i, 7 * i), 100_000, lambda n: 7 * n, max_records_per_read=100)
        self.upto = upto

    def latest_offset(self, partition, start, max_records):
        end = super().latest_offset(partition, start, max_records)
        return {**end, "next": max(start["next"], min(end["next"], self.upto))}


def test_a_computation_left_out_while_retention_deleted_its_input_is_refused_when_back(spark, tmp_path):
    root = str(tmp_path / "root")

    def run(upto, with_relay):
        """A run until the windows of the first `upto` records are out (it stops as Ctrl-C would),
        pruning as the run loop does, as eagerly as it gets."""
        pipeline = (Pipeline("comeback").add_injector("src", Upto(upto), "in")
                    .add_computation("windower", BucketCounter(), ["in"], ["windows"])
                    .add_computation("keeper", Relay("kept"), ["windows"], ["kept"]))  # reads throughout
        if with_relay:
            pipeline.add_computation("relay", Relay("relayed"), ["windows"], ["relayed"])
        runner = SparkRunner(pipeline, root=root, spark=spark, key_groups=4, retain_logs_s=0,
                             max_records_per_batch=100)
        runner.retention.every_s = 0
        runner.start()
        try:
            deadline = time.time() + 180
            while min(c.low_watermark for c in runner.progress().computations.values()) < 7 * upto - 1_000:
                runner.raise_if_failed()
                runner.retention.maybe_prune(runner.pipeline, runner.commits, runner.sinks)
                assert time.time() < deadline, runner.progress()
                time.sleep(0.2)
        finally:
            runner.stop()

    run(300, with_relay=True)
    relay_read_up_to = PublicationLog(root, "windower").head()
    run(1_500, with_relay=False)  # relay left out: retention deletes what keeper has read
    assert PublicationLog(root, "windower").pruned()[0] > relay_read_up_to + 1
    with pytest.raises(PipelineError, match=r"'relay' goes on reading 'windower''s log after entry \d+, but "
                                            r"retention deleted entries"):
        run(1_800, with_relay=True)
    run(1_800, with_relay=False)  # the root itself is fine: refused before anything ran


def test_a_copied_root_and_a_root_without_its_checkpoints_are_refused(spark, tmp_path):
    def pipeline():
        return (Pipeline("copied").add_injector("src", generator(300), "in")
                .add_computation("windower", BucketCounter(), ["in"], ["windows"]))

    root, copy = tmp_path / "prod", tmp_path / "test"
    SparkRunner(pipeline(), root=str(root), spark=spark, key_groups=4, max_records_per_batch=100).run(timeout=120)
    shutil.copytree(root, copy)  # its logs name prod's checkpoints: a run of it would write into them
    with pytest.raises(PipelineError, match=r"it was made at .*prod and its logs hold paths there.*cannot be copied"):
        SparkRunner(pipeline(), root=str(copy), spark=spark, key_groups=4).run(timeout=60)
    shutil.rmtree(root / "checkpoints")  # Spark would start over with empty state, silently
    with pytest.raises(PipelineError, match=r"'windower' published batches up to \d+, but its checkpoint at .* "
                                            r"holds no committed batch"):
        SparkRunner(pipeline(), root=str(root), spark=spark, key_groups=4).run(timeout=60)


def test_a_sink_added_to_an_existing_root_receives_what_is_retained_whatever_its_kind(spark, tmp_path):
    # millstream's own file sinks are written by the batch that produces: one added later staged
    # nothing for the batches before it, and got none of them (16 of 32 rows) while a Spark-writer
    # sink added with it read them from the log (32), and both marked them delivered.
    import glob
    import json

    root = str(tmp_path / "root")

    def pipeline(with_sinks):
        built = (Pipeline("late-sinks").add_injector("src", generator(300), "in")
                 .add_computation("windower", BucketCounter(), ["in"], ["windows"]))
        if with_sinks:
            built.add_sink("lines", "windows", str(tmp_path / "lines")).add_sink(
                "table", "windows", str(tmp_path / "table"), format="csv")
        return built

    SparkRunner(pipeline(False), root=root, spark=spark, key_groups=4, max_records_per_batch=100).run(timeout=120)
    runner = SparkRunner(pipeline(True), root=root, spark=spark, key_groups=4)
    runner.run(timeout=120)
    published = sorted((r.key, r.value[0], r.value[1]) for r in runner.read_stream("windows"))
    assert len(published) == 9  # 3 keys x 3 one-second windows
    lines = sorted((row["key"], *row["value"]) for path in glob.glob(str(tmp_path / "lines" / "*.jsonl"))
                   for row in map(json.loads, open(path)))
    table = [line for path in glob.glob(str(tmp_path / "table" / "**" / "*.csv"), recursive=True)
             for line in open(path) if line.strip()]
    assert lines == published and len(table) == len(published)
