"""Rescaling a stopped pipeline (Spark's checkpoint repartition) changes how many tasks run each
computation, not what they produce: a run stopped halfway, rescaled from 2 to 4 state partitions and
resumed gives the output of a run that never stopped, ids included, even for a consumer whose output
depends on the order in which many producer keys' records reach it."""

import json
import time

from millstream import Computation, GeneratorInjector, ListState, MapState, Pipeline, Record
from millstream.spark.commit import Checkpoint, staged_path
from millstream.spark.publog import PublicationLog
from millstream.spark.rescale import checkpoint_of, rescale, state_partitions
from millstream.spark.storage import Storage
from millstream.spark.runner import SparkRunner

KEYS, EVENTS = 50, 6_000


class Windower(Computation):
    counts = MapState[int, int]("counts")

    def process_record(self, ctx, record):
        bucket = record.timestamp - record.timestamp % 500
        ctx.state(self.counts).put(bucket, ctx.state(self.counts).get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + 500)

    def process_timer(self, ctx, timer):
        bucket = timer.time - 500
        ctx.produce(Record(str(bucket), [ctx.key, ctx.state(self.counts).get(bucket)], timer.time), "windows")
        ctx.state(self.counts).remove(bucket)


class Arrivals(Computation):
    """Order-sensitive: each window's counts, numbered in the order they reach it."""

    seen = ListState[str]("seen")

    def process_record(self, ctx, record):
        seen = ctx.state(self.seen)
        seen.append(record.value[0])
        ctx.produce(Record(ctx.key, [len(seen.get()), record.value[0], record.value[1]], record.timestamp), "order")


def pipeline():
    injector = GeneratorInjector(lambda i: Record(f"k{(i * 7) % KEYS}", i, 10 * i + (i * 13) % 40), EVENTS,
                                 lambda n: 10 * n, records_per_second=300, max_records_per_read=400)
    return (Pipeline("rescaled").add_injector("src", injector, "in")
            .add_computation("windower", Windower(), ["in"], ["windows"])
            .add_computation("arrivals", Arrivals(), ["windows"], ["order"]))


def output(runner):
    return sorted((r.key, json.dumps(r.value), r.timestamp, r.id) for r in runner.read_stream("order"))


def test_rescaling_halfway_gives_the_output_of_a_run_that_never_rescaled(spark, tmp_path):
    whole = SparkRunner(pipeline(), root=str(tmp_path / "whole"), spark=spark, key_groups=8, parallelism=2)
    whole.run(timeout=300)
    expected = output(whole)

    root = str(tmp_path / "rescaled")
    first = SparkRunner(pipeline(), root=root, spark=spark, key_groups=8, parallelism=2)
    first.start()
    deadline = time.time() + 180
    # Stop once the consumer has state, or once the producer is halfway (should the consumer's query be
    # slow to start): either way more than half of the input is still to come.
    while True:
        progress = first.progress().computations
        if progress["arrivals"].records >= 40 or progress["windower"].low_watermark >= 10 * EVENTS // 2:
            break
        first.raise_if_failed()
        assert time.time() < deadline, "no progress"
        time.sleep(0.5)
    first.stop()
    assert first.progress().computations["windower"].low_watermark < 10 * EVENTS, "stopped too late"
    assert {n: state_partitions(checkpoint_of(root, n)) for n in ("windower", "arrivals")} == {
        "windower": 2, "arrivals": 2}
    # The stop can interrupt a batch after its output was staged, before Spark committed it. The
    # repartition then commits a batch of its own under that id: the interrupted attempt's output
    # (here: the last batch's files again, so a mistake shows as duplicates) must not be published.
    interrupted = Checkpoint(checkpoint_of(root, "windower")).last_committed() + 1
    _, last = PublicationLog(root, "windower").last_batch()
    Storage(root).write_json(staged_path("windower", 1, interrupted),
                             {**last, "batch": interrupted, "offsets": "of the interrupted attempt"})
    assert rescale(spark, root, 4) == {"windower": (2, 4), "arrivals": (2, 4)}
    resumed = SparkRunner(pipeline(), root=root, spark=spark, key_groups=8)
    resumed.run(timeout=300)
    assert output(resumed) == expected and len(expected) > 100


def test_the_rescale_command_changes_a_stopped_roots_tasks_and_refuses_what_is_not_a_root(spark, tmp_path):
    import os
    import subprocess
    import sys

    root = str(tmp_path / "root")
    SparkRunner(pipeline(), root=root, spark=spark, key_groups=8, parallelism=2).run(timeout=300)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = [sys.executable, "-m", "millstream", "rescale"]
    done = subprocess.run([*command, root, "--parallelism", "3", "--master", "local[1]"], cwd=here,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "windower: 2 -> 3 state partitions" in done.stdout and "arrivals: 2 -> 3" in done.stdout
    assert {n: state_partitions(checkpoint_of(root, n)) for n in ("windower", "arrivals")} == {
        "windower": 3, "arrivals": 3}
    refused = subprocess.run([*command, str(tmp_path), "--parallelism", "3"], cwd=here, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "is not a millstream root" in refused.stderr + refused.stdout


def test_the_rescale_command_on_a_remote_root(spark, tmp_path, s3_server):
    """A root on an S3 endpoint (Spark's checkpoints local, as this machine's Spark has no S3
    connector): the command finds each computation's checkpoint through the root, forgets what an
    interrupted attempt staged on the remote root, and a resumed run adds nothing to the output."""
    import os
    import subprocess
    import sys

    root = s3_server.location("rescaled")
    runner = SparkRunner(pipeline(), root=root, checkpoint_root=str(tmp_path / "checkpoints"), spark=spark,
                         key_groups=8, parallelism=2)
    runner.run(timeout=300)
    before = output(runner)
    assert len(before) > 100
    interrupted = Checkpoint(checkpoint_of(root, "windower")).last_committed() + 1
    _, last = PublicationLog(root, "windower").last_batch()
    staged = staged_path("windower", 1, interrupted)
    Storage(root).write_json(staged, {**last, "batch": interrupted, "offsets": "of the interrupted attempt"})

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", "millstream", "rescale", root, "--parallelism", "3",
                           "--master", "local[1]"], cwd=here, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "windower: 2 -> 3 state partitions" in done.stdout and "arrivals: 2 -> 3" in done.stdout
    assert {n: state_partitions(checkpoint_of(root, n)) for n in ("windower", "arrivals")} == {
        "windower": 3, "arrivals": 3}
    assert not Storage(root).exists(staged), "the interrupted attempt's staged output is still there"

    resumed = SparkRunner(pipeline(), root=root, checkpoint_root=str(tmp_path / "checkpoints"), spark=spark,
                          key_groups=8)
    resumed.run(timeout=300)
    assert output(resumed) == before


class Forward(Computation):
    def __init__(self, output):
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, record.value, record.timestamp), self.output)


def test_a_finished_root_rescaled_and_run_again_finishes(spark, tmp_path):
    """A rescale's batch, published with no input points, was the upstream log's last entry: the
    downstream reader never moved past it, and run() waited for it for ever."""
    def two_stages():
        injector = GeneratorInjector(lambda i: Record(f"k{i % 7}", i, 10 * i), 300, lambda n: 10 * n,
                                     max_records_per_read=100)
        return (Pipeline("finished-rescaled").add_injector("src", injector, "in")
                .add_computation("first", Forward("forwarded"), ["in"], ["forwarded"])
                .add_computation("second", Forward("out"), ["forwarded"], ["out"]))

    root = str(tmp_path / "root")
    SparkRunner(two_stages(), root=root, spark=spark, key_groups=8, parallelism=2).run(timeout=180)
    assert rescale(spark, root, 3) == {"first": (2, 3), "second": (2, 3)}
    runner = SparkRunner(two_stages(), root=root, spark=spark, key_groups=8)
    runner.run(timeout=120)
    assert sorted(r.value for r in runner.read_stream("out")) == list(range(300))
