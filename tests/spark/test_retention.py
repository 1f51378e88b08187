"""Retention of publication logs: what every reader is past goes, nothing a reader still needs does,
and a run resumes on a pruned root."""

import json
import os
import subprocess
import sys

from bucket_counter import BucketCounter, counted_windows

from millstream import DEAD_LETTERS, Computation, GeneratorInjector, Pipeline, Record
from millstream.spark.publog import PublicationLog
from millstream.spark.runner import SparkRunner

EVENTS = 3_000
KEYS = 3


class Relay(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "relayed")


def pipeline(out):
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=150)
    return (Pipeline("retained").add_injector("src", injector, "in")
            .add_computation("windower", BucketCounter(), ["in"], ["windows"])
            .add_computation("relay", Relay(), ["windows"], ["relayed"])
            .add_sink("out", "relayed", str(out)))


def expected_windows():
    return counted_windows((f"k{i % KEYS}", 7 * i) for i in range(EVENTS))


def sink_windows(out):
    found = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as lines:
            found.extend(json.loads(line) for line in lines if line.strip())
    return sorted((r["key"], r["value"][0], r["value"][1]) for r in found)


def batch_dirs(root, computation):
    path = os.path.join(root, "streams", computation)
    return len(os.listdir(path)) if os.path.isdir(path) else 0


def test_logs_every_reader_is_past_are_pruned_and_the_output_is_whole(spark, tmp_path):
    root = tmp_path / "root"
    runner = SparkRunner(pipeline(tmp_path / "out"), root=str(root), spark=spark, retain_logs_s=0,
                         max_records_per_batch=150)
    runner.retention.every_s = 0
    runner.run(progress_interval=0.2, timeout=300)
    assert sink_windows(tmp_path / "out") == expected_windows()

    windower, relay = PublicationLog(str(root), "windower"), PublicationLog(str(root), "relay")
    first_retained, claims = windower.pruned()
    assert first_retained > 5 and claims == [0], "the windower's log read by relay was pruned, its claim kept"
    assert relay.pruned()[0] > 5, "relay's log, delivered to the sink, was pruned"
    assert batch_dirs(root, "windower") < windower.head() / 2
    assert len(os.listdir(root / "status" / "windower" / "history")) < windower.head() / 2

    # A run resumes on the pruned root: the newest claim is found, a new epoch claimed, nothing redone.
    before = sink_windows(tmp_path / "out")
    again = SparkRunner(pipeline(tmp_path / "out"), root=str(root), spark=spark, retain_logs_s=0)
    again.run(timeout=120)
    assert again.epoch == 2 and windower.last_claim()["epoch"] == 2
    assert sink_windows(tmp_path / "out") == before


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(os.path.dirname(HERE))


def drive(root, out, kill_at=None):
    """This module as a driver process (below), killed with its JVM at `kill_at` if given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((ROOT_DIR, os.path.join(ROOT_DIR, "tests")))}
    env.pop("MILLSTREAM_KILL_AT", None)
    if kill_at:
        env["MILLSTREAM_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, os.path.abspath(__file__), str(root), str(out)], cwd=ROOT_DIR, env=env,
                          start_new_session=True, capture_output=True, text=True, timeout=600)


def test_a_replay_after_a_kill_never_needs_what_retention_deleted(tmp_path):
    """Pruning as eagerly as possible while the driver dies where a replay must re-read input: after
    relay's batch is staged and before Spark commits it (the replay reads the same windower entries),
    and after the commit, before the publication."""
    root, out = tmp_path / "root", tmp_path / "out"
    for kill_at in ("staged@relay:6", "committed@relay:4"):
        killed = drive(root, out, kill_at)
        assert killed.returncode == -9, killed.stderr[-2000:]
    finished = drive(root, out)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert sink_windows(out) == expected_windows()
    assert PublicationLog(str(root), "windower").pruned()[0] > 5


class PickyWindower(BucketCounter):
    """BucketCounter that refuses every record whose value is a multiple of FAILING_EVERY (a dead
    letter each) and copies every multiple of SIDE_EVERY to a side output nobody reads."""

    def process_record(self, ctx, record):
        if record.value % FAILING_EVERY == 0:
            raise ValueError(f"refused {record.value}")
        if record.value % SIDE_EVERY == 0:
            ctx.produce(Record(record.key, record.value, record.timestamp), "side")
        super().process_record(ctx, record)


FAILING_EVERY, SIDE_EVERY = 97, 50


def picky_pipeline(out, dead_letter_sink=None):
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=150)
    pipeline = (Pipeline("retained").add_injector("src", injector, "in")
                .add_computation("windower", PickyWindower(), ["in"], ["windows", "side"], on_error="dead_letter")
                .add_computation("relay", Relay(), ["windows"], ["relayed"])
                .add_sink("out", "relayed", str(out)))
    if dead_letter_sink is not None:
        pipeline.add_sink("failures", DEAD_LETTERS, str(dead_letter_sink))
    return pipeline


def test_streams_nobody_reads_outlive_the_entries_their_log_s_readers_passed(spark, tmp_path):
    """The windower's log is read by relay, and pruned as relay goes on; its dead letters and its
    side output have no reader: they are kept whole, readable with read_stream."""
    root = tmp_path / "root"
    runner = SparkRunner(picky_pipeline(tmp_path / "out"), root=str(root), spark=spark, retain_logs_s=0,
                         max_records_per_batch=150)
    runner.retention.every_s = 0
    runner.run(progress_interval=0.2, timeout=300)
    windower = PublicationLog(str(root), "windower")
    assert windower.pruned()[0] > 5, "the windower's log, read by relay, was pruned"
    refused = sorted(i for i in range(EVENTS) if i % FAILING_EVERY == 0)
    assert sorted(letter.value["value"] for letter in runner.read_stream(DEAD_LETTERS)) == refused
    assert sorted(r.value for r in runner.read_stream("side")) == \
        [i for i in range(EVENTS) if i % SIDE_EVERY == 0 and i % FAILING_EVERY != 0]
    # What relay read is gone with the entries: the windows' files of pruned batches.
    assert len(runner.read_stream("windows")) < len(expected_windows())


def test_a_dead_letter_sink_holds_back_retention_until_it_delivered(spark, tmp_path):
    root = tmp_path / "root"
    runner = SparkRunner(picky_pipeline(tmp_path / "out", tmp_path / "failures"), root=str(root), spark=spark,
                         retain_logs_s=0, max_records_per_batch=150)
    runner.retention.every_s = 0
    runner.run(progress_interval=0.2, timeout=300)
    letters = [json.loads(line) for name in sorted(os.listdir(tmp_path / "failures"))
               for line in open(tmp_path / "failures" / name) if line.strip()]
    assert sorted(letter["value"]["value"] for letter in letters) == \
        [i for i in range(EVENTS) if i % FAILING_EVERY == 0]


def test_without_retention_nothing_is_pruned(spark, tmp_path):
    root = tmp_path / "root"
    runner = SparkRunner(pipeline(tmp_path / "out"), root=str(root), spark=spark, retain_logs_s=None,
                         max_records_per_batch=150)
    runner.run(progress_interval=0.2, timeout=300)
    assert sink_windows(tmp_path / "out") == expected_windows()
    assert PublicationLog(str(root), "windower").pruned() == (0, [])
    assert len(runner.read_stream("windows")) == len(expected_windows())


if __name__ == "__main__":  # the driver process of the kill test
    driver = SparkRunner(pipeline(sys.argv[2]), root=sys.argv[1], master="local[2]", retain_logs_s=0,
                         max_records_per_batch=150)
    driver.retention.every_s = 0
    driver.run(progress_interval=0.2, timeout=500)
