"""A FileInjector with partitions on Spark: each partition's files are read by a Spark task of their
own, and the windows are those counted directly from the files (plain Python), whatever partition
each file fell in."""

from bucket_counter import counted_windows
from partitioned_logs import read_stage_tasks, write_search_logs

from millstream import FileInjector, Pipeline
from millstream.apps.dips import Windower
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

FILES, RECORDS, PARTITIONS = 9, 40, 3


def test_a_partitioned_file_injector_is_read_by_a_task_per_partition(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    points = write_search_logs(logs, FILES, RECORDS, 4, 2_000)
    (logs / "_DONE").write_text("")
    injector = FileInjector(str(logs), partitions=PARTITIONS, max_files_per_read=FILES)
    pipeline = (Pipeline("partitioned-files").add_injector("logs", injector, "searches")
                .add_computation("windower", Windower(), ["searches"], ["windows"]))
    stages_before = set(read_stage_tasks(spark))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark, parallelism=2)
    progress = runner.run(timeout=240)

    windows = sorted((w.key, w.value["bucket"], w.value["count"]) for w in runner.read_stream("windows"))
    assert windows == counted_windows(points)
    assert progress.computations["windower"].records == FILES * RECORDS
    assert progress.computations["windower"].low_watermark == END_OF_TIME
    # A read runs a task per partition with records and no other: the heartbeat every key group
    # gets rides in one of them.
    tasks = [n for stage, n in read_stage_tasks(spark).items() if stage not in stages_before]
    assert max(tasks) == PARTITIONS, tasks
