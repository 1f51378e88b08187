"""Key group labels in Spark itself: the task Spark gives each key group, and a root's labels kept
across restarts.

Ground truth for the spreading is Spark's own grouping (the partition each group's task reports);
for the output, a run on a fresh root that never stopped."""

import json
import time
from collections import Counter

import pandas as pd
import pytest

from millstream import GeneratorInjector, Pipeline, Record
from millstream.spark import statestore
from millstream.spark.partitioning import GroupLabels, alignment
from millstream.spark.runner import SparkRunner
from millstream.windows import Count, TumblingWindows, WindowAggregate

KEYS, EVENTS, KEY_GROUPS = 40, 3_000, 8


def _tasks_of(spark, labels, partitions):
    """How many labels each of Spark's tasks receives when grouping by them, as a groupBy does."""
    from pyspark import TaskContext

    def where(frame: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"task": [TaskContext.get().partitionId()]})

    # As in a streaming query: that many shuffle partitions, none coalesced by adaptive execution.
    settings = {"spark.sql.shuffle.partitions": str(partitions), "spark.sql.adaptive.enabled": "false"}
    before = {name: spark.conf.get(name) for name in settings}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        frame = spark.createDataFrame([(label,) for label in labels], "key_group int")
        rows = frame.groupBy("key_group").applyInPandas(where, "task int").collect()
    finally:
        for name, value in before.items():
            spark.conf.set(name, value)
    return sorted(Counter(row.task for row in rows).values())


def test_spark_gives_every_task_an_even_share_of_the_key_groups(spark):
    assert _tasks_of(spark, range(32), 2) == [12, 20]  # key group indexes: 5/8 of the work in one task
    assert _tasks_of(spark, GroupLabels.aligned(32).labels, 2) == [16, 16]
    assert _tasks_of(spark, GroupLabels.aligned(32).labels, 8) == [4] * 8
    assert _tasks_of(spark, GroupLabels.aligned(32, alignment(32, 6)).labels, 6) == [5, 5, 5, 5, 6, 6]


def bucket_and_count(window, count):
    return [window.start, count]


def pipeline():
    injector = GeneratorInjector(lambda i: Record(f"k{(i * 7) % KEYS}", i, 10 * i + (i * 13) % 40), EVENTS,
                                 lambda n: 10 * n, records_per_second=200, max_records_per_read=300)
    windower = WindowAggregate(TumblingWindows(500), Count(), "windows", output_value=bucket_and_count)
    return Pipeline("labelled").add_injector("src", injector, "in").add_computation(
        "windower", windower, ["in"], ["windows"])


def expected_windows():
    """The windows, computed directly from the generator."""
    counts = Counter()
    for i in range(EVENTS):
        ts = 10 * i + (i * 13) % 40
        counts[(f"k{(i * 7) % KEYS}", ts - ts % 500)] += 1
    return sorted((key, bucket, n) for (key, bucket), n in counts.items())


def windows(runner):
    return sorted((r.key, r.value[0], r.value[1]) for r in runner.read_stream("windows"))


def labels_of(root):
    with open(f"{root}/pipeline.json") as f:
        return json.load(f)["group_labels"]


def stop_halfway(runner):
    runner.start()
    deadline = time.time() + 180
    while runner.progress().computations["windower"].low_watermark < 10 * EVENTS // 3:
        runner.raise_if_failed()
        assert time.time() < deadline, "no progress"
        time.sleep(0.3)
    runner.stop()
    assert runner.progress().computations["windower"].low_watermark < 10 * EVENTS, "stopped too late"


def test_a_root_keeps_the_labels_its_state_was_written_under(spark, tmp_path):
    # A fresh root chooses labels at its first start and keeps them when it resumes on more cores.
    root = str(tmp_path / "fresh")
    stop_halfway(SparkRunner(pipeline(), root=root, spark=spark, key_groups=KEY_GROUPS, parallelism=2))
    # The stopped query's caches are to leave the workers (statestore.drop_stopped), until a query
    # starts on its root again: the resumed run below no longer lists it for others to drop.
    stopped = [ns for ns in statestore.stopped_namespaces() if ns.startswith(root + "/")]
    assert len(stopped) == 1 and stopped[0].endswith("#windower")
    chosen = labels_of(root)
    assert chosen == list(GroupLabels.aligned(KEY_GROUPS).labels) != list(range(KEY_GROUPS))
    resumed = SparkRunner(pipeline(), root=root, spark=spark, key_groups=KEY_GROUPS, parallelism=3)
    with pytest.warns(UserWarning, match=r"'windower' keeps its state in 2 partitions .* parallelism=3 does not "
                                         r"apply to it: .*millstream rescale .* --parallelism 3"):
        resumed.start()  # the root's 2, said so
    assert stopped[0] not in statestore.stopped_namespaces()
    resumed.run(timeout=300)
    assert labels_of(root) == chosen
    assert windows(resumed) == expected_windows()

    # A root written before labels existed: its state sits under the key group indexes. Made here by
    # a first run under index labels whose layout then loses the field, as such a root's has none.
    old = str(tmp_path / "old")
    first = SparkRunner(pipeline(), root=old, spark=spark, key_groups=KEY_GROUPS, parallelism=2)
    with open(f"{old}/pipeline.json") as f:
        layout = json.load(f)
    layout["group_labels"] = list(range(KEY_GROUPS))
    with open(f"{old}/pipeline.json", "w") as f:
        json.dump(layout, f)
    first = SparkRunner(pipeline(), root=old, spark=spark, key_groups=KEY_GROUPS, parallelism=2)
    stop_halfway(first)
    del layout["group_labels"]
    with open(f"{old}/pipeline.json", "w") as f:
        json.dump(layout, f)
    resumed = SparkRunner(pipeline(), root=old, spark=spark, key_groups=KEY_GROUPS, parallelism=2)
    resumed.run(timeout=300)
    assert windows(resumed) == expected_windows()
    assert labels_of(old) == list(range(KEY_GROUPS))
