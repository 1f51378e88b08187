"""A FileInjector with partitions on Spark: each partition's files are read by a Spark task of their
own, and the windows are those counted directly from the files (plain Python), whatever partition
each file fell in."""

import json
import os
import urllib.request

from bucket_counter import counted_windows

from millstream import FileInjector, Pipeline
from millstream.apps.dips import Windower
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

FILES, RECORDS, PARTITIONS = 9, 40, 3


def write_logs(directory):
    """Files part-000 ... each holding two seconds of event time; the (key, timestamp) they hold."""
    points = []
    for n in range(FILES):
        start = 10_000 + n * 2_000
        path = os.path.join(directory, f"part-{n:03d}.jsonl")
        with open(path, "w") as out:
            for i in range(RECORDS):
                key, timestamp = f"q{(n + i) % 4}", start + i * 50
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


def test_a_partitioned_file_injector_is_read_by_a_task_per_partition(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    points = write_logs(logs)
    (logs / "_DONE").write_text("")
    injector = FileInjector(str(logs), partitions=PARTITIONS, max_files_per_read=FILES)
    pipeline = (Pipeline("partitioned-files").add_injector("logs", injector, "searches")
                .add_computation("windower", Windower(), ["searches"], ["windows"]))
    stages_before = set(stage_tasks(spark))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark, parallelism=2)
    progress = runner.run(timeout=240)

    windows = sorted((w.key, w.value["bucket"], w.value["count"]) for w in runner.read_stream("windows"))
    assert windows == counted_windows(points)
    assert progress.computations["windower"].records == FILES * RECORDS
    assert progress.computations["windower"].low_watermark == END_OF_TIME
    # Every other stage has at most the 2 state partitions' tasks: only a read of the three
    # partitions, each a task, plus the heartbeat's, reaches four.
    tasks = [n for stage, n in stage_tasks(spark).items() if stage not in stages_before]
    assert max(tasks) == PARTITIONS + 1, tasks
