"""An upstream computation's stream log on Spark is read by a Spark task per file it wrote: each
state partition of the upstream writes its own file per batch, and the downstream computation reads
those files side by side, not one sender through one task. Outputs of both stages are checked
against counts made from the input files in plain Python."""

import json
import os
import urllib.request

from bucket_counter import BucketCounter, counted_windows

from millstream import FileInjector, Pipeline
from millstream.apps.dips import Windower
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

FILES, RECORDS, KEYS, PARTITIONS = 6, 60, 16, 2


def write_logs(directory):
    """Files part-000 ... each holding three seconds of event time; the (key, timestamp) they hold."""
    points = []
    for n in range(FILES):
        start = 10_000 + n * 3_000
        path = os.path.join(directory, f"part-{n:03d}.jsonl")
        with open(path, "w") as out:
            for i in range(RECORDS):
                key, timestamp = f"q{(n + i) % KEYS}", start + i * 50
                out.write(json.dumps({"key": key, "value": {"i": i}, "timestamp": timestamp}) + "\n")
                points.append((key, timestamp))
        os.utime(path, ns=(start * 1_000_000, start * 1_000_000))  # created at its first record
    return points


def stage_tasks(spark):
    """{stage id: its number of tasks} of every stage the session ran (its UI's REST API)."""
    context = spark.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages"
    with urllib.request.urlopen(url, timeout=30) as response:
        return {stage["stageId"]: stage["numTasks"] for stage in json.load(response)}


def test_an_upstream_stream_log_is_read_by_a_task_per_file(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    points = write_logs(logs)
    (logs / "_DONE").write_text("")
    pipeline = (Pipeline("log-partitions")
                .add_injector("logs", FileInjector(str(logs), max_files_per_read=FILES), "searches")
                .add_computation("windower", Windower(), ["searches"], ["windows"])
                .add_computation("tens", BucketCounter(10_000, "totals"), ["windows"], ["totals"]))
    stages_before = set(stage_tasks(spark))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark, parallelism=PARTITIONS)
    progress = runner.run(timeout=300)

    windows = counted_windows(points)
    assert sorted((w.key, w.value["bucket"], w.value["count"]) for w in runner.read_stream("windows")) == windows
    # Each window is stamped with its bucket's end; the second stage counts windows per 10 seconds.
    expected_totals = counted_windows([(key, bucket + 1_000) for key, bucket, _ in windows], 10_000)
    assert sorted((t.key, *t.value) for t in runner.read_stream("totals")) == expected_totals
    assert progress.computations["tens"].records == len(windows)
    assert progress.computations["tens"].low_watermark == END_OF_TIME

    # The upstream's keys span both state partitions, so a batch of its log has a file from each.
    # Every stage but a log read has at most PARTITIONS tasks (the injector's read: its one partition
    # plus the heartbeat); a read of two or more files, a task each, plus the heartbeat, has more.
    tasks = [n for stage, n in stage_tasks(spark).items() if stage not in stages_before]
    assert max(tasks) >= PARTITIONS + 1, tasks
