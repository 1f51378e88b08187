"""An upstream computation's stream log on Spark is read by a Spark task per file it wrote: each
state partition of the upstream writes its own file per batch, and the downstream computation reads
those files side by side, not one sender through one task. Outputs of both stages are checked
against counts made from the input files in plain Python."""

from bucket_counter import BucketCounter, counted_windows
from partitioned_logs import read_stage_tasks, write_search_logs

from millstream import FileInjector, Pipeline
from millstream.apps.dips import Windower
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

FILES, RECORDS, KEYS, PARTITIONS = 6, 60, 16, 2


def test_an_upstream_stream_log_is_read_by_a_task_per_file(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    points = write_search_logs(logs, FILES, RECORDS, KEYS, 3_000)
    (logs / "_DONE").write_text("")
    pipeline = (Pipeline("log-partitions")
                .add_injector("logs", FileInjector(str(logs), max_files_per_read=FILES), "searches")
                .add_computation("windower", Windower(), ["searches"], ["windows"])
                .add_computation("tens", BucketCounter(10_000, "totals"), ["windows"], ["totals"]))
    stages_before = set(read_stage_tasks(spark))
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
    # The injector's reads have one task (its one partition, the heartbeat riding in it); a read of
    # the upstream's log has a task per file, so two or more.
    tasks = [n for stage, n in read_stage_tasks(spark).items() if stage not in stages_before]
    assert max(tasks) >= 2, tasks
