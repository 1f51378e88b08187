"""A JDBC sink (Derby, embedded in Spark's JVM) stays exactly once per batch when Spark runs a task
again after it committed (its executor lost before it reported, or a speculative copy), and a
redelivery whose write fails leaves the batch's earlier rows whole. Spark's JDBC writer commits per
task, so both are what a write straight into the table would get wrong. A job run twice over the
same frame is every task run again after its commit: new task attempts, the same partitions and rows.
The expected windows are counted apart (bucket_counter.counted_windows)."""

import json
import os
import subprocess
import sys
import time

import pytest
from bucket_counter import BucketCounter, counted_windows
from pyspark.sql.readwriter import DataFrameWriter

import millstream.spark.sinks as sinks
from millstream import GeneratorInjector, Pipeline, Record
from millstream.spark.publog import BATCH, PublicationLog
from millstream.spark.runner import SparkRunner
from millstream.spark import faults
from millstream.spark.sinks import StagedAttempt, complete_attempts, sink_deliverers

EVENTS = 2_000
KEYS = 40  # enough for a batch's records to span two files, so two partitions per Spark job


def jdbc_pipeline(options):
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=250)
    return (Pipeline("jdbcsink").add_injector("src", injector, "in")
            .add_computation("windower", BucketCounter(), ["in"], ["windows"])
            .add_sink("db", "windows", format="jdbc", options=options))


def table_windows(spark, options):
    rows = spark.read.format("jdbc").options(**options).load().collect()
    return sorted((row["key"], *json.loads(row["value"])) for row in rows)


def expected_windows():
    return counted_windows((f"k{i % KEYS}", 7 * i) for i in range(EVENTS))


def published_batches(root):
    return [entry for _, entry in PublicationLog(root, "windower").entries_after(-1, 1 << 30)
            if entry["type"] == BATCH]


def redeliver(spark, root, pipeline, entries):
    """Deliver batches again, as after a driver that died before their progress was recorded."""
    for _node, _producers, deliver in sink_deliverers(spark, root, pipeline, {"windower"}).values():
        for entry in entries:
            deliver("windower", entry["batch"], entry)


def recorded_attempts(monkeypatch):
    """The staged attempts of each delivery from now on, as `complete_attempts` is handed them."""
    staged = []

    def kept(counts):
        staged.append(counts)
        return complete_attempts(counts)

    monkeypatch.setattr(sinks, "complete_attempts", kept)
    return staged


def run_to_the_end(spark, tmp_path, options):
    """(the pipeline, its root) after running it to its end on the tests' session."""
    pipeline = jdbc_pipeline(options)
    root = str(tmp_path / "root")
    SparkRunner(pipeline, root=root, spark=spark, max_records_per_batch=250).run(progress_interval=0.2, timeout=300)
    return pipeline, root


def test_every_task_committed_twice_still_leaves_each_window_once(spark, tmp_path, monkeypatch):
    options = {"url": f"jdbc:derby:{tmp_path / 'db'};create=true", "dbtable": "windows"}
    original = DataFrameWriter.save
    saves = []

    def every_task_twice(self, *args, **kwargs):
        saves.append(1)
        original(self, *args, **kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(DataFrameWriter, "save", every_task_twice)
    staged = recorded_attempts(monkeypatch)
    pipeline, root = run_to_the_end(spark, tmp_path, options)
    batches = published_batches(root)
    assert len(batches) > 3 and len(saves) >= len(batches) and len(staged) == len(batches)
    for counts in staged:  # each partition staged by two attempts, with the same rows
        rows_by_partition: dict[int, list[int]] = {}
        for found in counts:
            rows_by_partition.setdefault(found.partition, []).append(found.rows)
        assert all(len(rows) == 2 and rows[0] == rows[1] for rows in rows_by_partition.values()), counts
    assert any(len(counts) > 2 for counts in staged)
    assert table_windows(spark, options) == expected_windows()
    redeliver(spark, root, pipeline, batches)
    assert table_windows(spark, options) == expected_windows()


def test_a_partition_s_attempt_that_died_half_way_is_not_the_one_kept(spark, tmp_path, monkeypatch):
    """On a database without transactions an attempt that died keeps the rows it wrote: each
    partition is staged first by such an attempt (a third of its rows), then by a complete one."""
    from pyspark.sql import functions as F

    options = {"url": f"jdbc:derby:{tmp_path / 'db'};create=true", "dbtable": "windows"}
    original = sinks.write_staged

    def half_way_first(marked, staging_options):
        original(marked.where(F.col("timestamp") % 3 == 0), staging_options)
        original(marked, staging_options)

    monkeypatch.setattr(sinks, "write_staged", half_way_first)
    staged = recorded_attempts(monkeypatch)
    run_to_the_end(spark, tmp_path, options)
    assert any(len({found.rows for found in counts if found.partition == partition}) == 2
               for counts in staged for partition in {found.partition for found in counts})
    assert table_windows(spark, options) == expected_windows()


@pytest.mark.parametrize("failing", ["the staging write", "the transaction"])
def test_a_redelivery_that_fails_leaves_the_batch_as_it_was(failing, spark, tmp_path, monkeypatch):
    """The executors lost during the staging write, or the delivery failing in its transaction after
    it deleted the batch's earlier rows: readers still find the batch whole."""
    options = {"url": f"jdbc:derby:{tmp_path / 'db'};create=true", "dbtable": "windows"}
    pipeline, root = run_to_the_end(spark, tmp_path, options)
    assert table_windows(spark, options) == expected_windows()

    def lost(*args, **kwargs):
        raise RuntimeError("the delivery failed")

    if failing == "the staging write":
        monkeypatch.setattr(DataFrameWriter, "save", lost)
    else:
        monkeypatch.setattr(faults, "reached", lambda point, name: point == "sink-staged" and lost())
    batches = published_batches(root)
    with pytest.raises(RuntimeError, match="the delivery failed"):
        redeliver(spark, root, pipeline, batches[1:2])
    assert table_windows(spark, options) == expected_windows()


@pytest.mark.parametrize("kill_at", ["sink-staged@windower:3", "delivered@windower:3"])
def test_a_driver_killed_in_a_jdbc_delivery_leaves_each_window_once_after_its_restart(kill_at, spark, tmp_path):
    """Killed with the batch staged and the earlier rows deleted in the open transaction, or after the
    commit and before the delivery was recorded: the restart delivers the batch again (the database
    rolled the open transaction back), and the staging table is left empty."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((os.path.dirname(os.path.dirname(here)),
                                                         os.path.dirname(here)))}
    command = [sys.executable, os.path.abspath(__file__), str(tmp_path)]
    killed, stderr = run_driver(command, {**env, "MILLSTREAM_KILL_AT": kill_at}, tmp_path)
    assert killed == -9 and "killing the driver at" in stderr, stderr[-3000:]
    env.pop("MILLSTREAM_KILL_AT", None)
    finished, stderr = run_driver(command, env, tmp_path)
    assert finished == 0, stderr[-3000:]
    options = restart_options(str(tmp_path))
    assert table_windows(spark, options) == expected_windows()
    connection = spark._jvm.java.sql.DriverManager.getConnection(options["url"])
    try:  # the sink's staging table is kept, emptied by the transaction that copied the last batch
        found = connection.getMetaData().getTables(None, None, "MILLSTREAM_STAGE%", None)
        staging = []
        while found.next():
            staging.append(found.getString("TABLE_NAME"))
        assert len(staging) == 1, staging
        counted = connection.createStatement().executeQuery(f"SELECT COUNT(*) FROM {staging[0]}")
        assert counted.next() and counted.getLong(1) == 0
    finally:
        connection.close()


def run_driver(command, env, cwd):
    """(exit code, stderr) of a driver process run to its end, once its whole process group is gone:
    its JVM outlives it for a moment, and Derby, embedded there, holds the database until it ends."""
    process = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    _, stderr = process.communicate(timeout=600)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    return process.returncode, stderr


def restart_options(base):
    return {"url": f"jdbc:derby:{base}/db;create=true", "dbtable": "windows"}


def test_the_attempt_kept_for_each_partition_is_a_complete_one():
    """Attempts of one partition write the same rows, so one that wrote fewer died half-way (a
    database without transactions keeps what it had written)."""
    assert complete_attempts([]) == []
    assert complete_attempts([StagedAttempt(0, 11, 40)]) == [11]
    assert complete_attempts([StagedAttempt(0, 11, 17), StagedAttempt(0, 12, 40), StagedAttempt(1, 13, 5)]) == [12, 13]
    assert complete_attempts([StagedAttempt(3, 20, 40), StagedAttempt(3, 12, 40), StagedAttempt(3, 30, 2)]) == [12]

if __name__ == "__main__":  # the driver process of the restart test
    SparkRunner(jdbc_pipeline(restart_options(sys.argv[1])), root=f"{sys.argv[1]}/root", master="local[2]",
                max_records_per_batch=250).run(timeout=500)
