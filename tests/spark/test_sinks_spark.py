"""Every kind of sink on real Spark: a Spark format under a path (csv), a Spark table, a JDBC table
(Derby, embedded in Spark's JVM) and a user writer each receive every window once, and receive each
batch once again after a redelivery (a driver that died after a sink took a batch and before its
progress was recorded) without holding anything twice. Table sinks also go on after a restart whose
catalog forgot them, or after a first delivery that died leaving only Spark's temporary files, and a
table delivery replaces its own batch alone, whatever the session's overwrite mode. A sink batches
behind its computation receives every batch after a restart that publishes what Spark committed
before the crash. The expected windows are counted apart (bucket_counter.counted_windows)."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from bucket_counter import BucketCounter, counted_windows

from millstream import Computation, GeneratorInjector, Pipeline, Record
from millstream.spark.publog import BATCH, PublicationLog
from millstream.spark.runner import SparkRunner
from millstream.spark.sinks import sink_deliverers

EVENTS = 2_000
KEYS = 3


class FilePerBatch:
    """A user writer, idempotent per (producer, batch): one JSON file per batch, replaced on a
    redelivery."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.calls = 0

    def __call__(self, frame, batch_id):
        self.calls += 1
        rows = [row.asDict() for row in frame.collect()]
        os.makedirs(self.directory, exist_ok=True)
        for producer in {row["producer"] for row in rows}:
            with open(os.path.join(self.directory, f"{producer}-{batch_id}.json"), "w") as out:
                json.dump([row for row in rows if row["producer"] == producer], out)


def expected_windows():
    return counted_windows((f"k{i % KEYS}", 7 * i) for i in range(EVENTS))


def windows(rows):
    """(key, bucket, count) of rows with a key and a JSON text value."""
    return sorted((row["key"], *json.loads(row["value"])) for row in rows)


def run_sql(spark, url, statement):
    connection = spark._jvm.java.sql.DriverManager.getConnection(url)
    try:
        connection.createStatement().executeUpdate(statement)
    finally:
        connection.close()


def test_every_kind_of_sink_holds_each_window_once_after_a_redelivery_of_every_batch(spark, tmp_path):
    jdbc = {"url": f"jdbc:derby:{tmp_path / 'db'};create=true", "dbtable": "windows"}
    # A table of the user's own, its columns named without quotes (Derby keeps them in upper case),
    # its options spelled as Spark also accepts them.
    own = {"URL": jdbc["url"], "dbTable": "own_windows"}
    run_sql(spark, jdbc["url"], 'CREATE TABLE own_windows ("key" VARCHAR(64), "timestamp" BIGINT, "id" VARCHAR(128), '
                                '"value" VARCHAR(1000), "producer" VARCHAR(64), millstream_producer VARCHAR(64), '
                                'millstream_batch BIGINT)')
    writer = FilePerBatch(str(tmp_path / "writer"))
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=250)
    pipeline = (Pipeline("sinks").add_injector("src", injector, "in")
                .add_computation("windower", BucketCounter(), ["in"], ["windows"])
                .add_sink("csv", "windows", str(tmp_path / "csv"), format="csv", options={"header": "true"})
                .add_sink("table", "windows", table="sunk_windows", options={"path": str(tmp_path / "table")})
                .add_sink("db", "windows", format="jdbc", options=jdbc)
                .add_sink("own", "windows", format="jdbc", options=own)
                .add_sink("mine", "windows", writer=writer))
    root = str(tmp_path / "root")
    SparkRunner(pipeline, root=root, spark=spark, max_records_per_batch=250).run(progress_interval=0.2, timeout=300)

    def read_all():
        csv = spark.read.option("header", "true").csv(str(tmp_path / "csv")).collect()
        table = spark.table("sunk_windows").collect()
        db = spark.read.format("jdbc").options(**jdbc).load().collect()
        mine = [row for name in sorted(os.listdir(tmp_path / "writer"))
                for row in json.load(open(tmp_path / "writer" / name))]
        own_rows = [{k.lower(): v for k, v in row.asDict().items()}
                    for row in spark.read.format("jdbc").options(url=jdbc["url"], dbtable="own_windows").load().collect()]
        return {"csv": windows(csv), "table": windows(table), "db": windows(db), "own": windows(own_rows),
                "mine": windows(mine)}

    expected = expected_windows()
    everywhere = {"csv": expected, "table": expected, "db": expected, "own": expected, "mine": expected}
    assert read_all() == everywhere
    connection = spark._jvm.java.sql.DriverManager.getConnection(jdbc["url"])
    try:  # the table millstream created has an index on the columns a redelivery deletes by
        found = connection.getMetaData().getIndexInfo(None, None, "WINDOWS", False, False)
        indexes = set()
        while found.next():
            indexes.add(found.getString("INDEX_NAME"))
    finally:
        connection.close()
    assert "MILLSTREAM_WINDOWS" in indexes, indexes
    batches = [entry for _, entry in PublicationLog(root, "windower").entries_after(-1, 1 << 30)
               if entry["type"] == BATCH]
    assert len(batches) > 3 and writer.calls == len(batches)

    for _node, _producers, deliver in sink_deliverers(spark, root, pipeline, {"windower"}).values():
        for entry in batches:  # every batch delivered again, as after a crash before its progress was kept
            deliver("windower", entry["batch"], entry)
    assert read_all() == everywhere
    spark.sql("DROP TABLE sunk_windows")


def test_a_jdbc_table_without_the_batch_columns_is_refused_in_one_line(spark, tmp_path):
    url = f"jdbc:derby:{tmp_path / 'db'};create=true"
    run_sql(spark, url, 'CREATE TABLE plain ("key" VARCHAR(64))')
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), 500, lambda n: 7 * n)
    pipeline = (Pipeline("plainsink").add_injector("src", injector, "in")
                .add_computation("windower", BucketCounter(), ["in"], ["windows"])
                .add_sink("db", "windows", format="jdbc", options={"url": url, "dbtable": "plain"}))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    with pytest.raises(Exception) as failed:
        runner.run(timeout=300)
    assert ("table plain has no columns timestamp, id, value, producer, millstream_producer, millstream_batch"
            in str(failed.value))


@pytest.mark.parametrize("format, reason", [
    ("xlsx", r"\[DATA_SOURCE_NOT_FOUND\] Failed to find the data source: xlsx"),
    ("avro", r"\[AVRO_DATA_SOURCE_NOT_ENABLED\]"),  # Spark's own, its package not on the classpath
])
def test_a_sink_format_spark_cannot_write_is_refused_before_any_batch(format, reason, spark, tmp_path):
    """A format no data source answers to (a typo, a package not on the classpath) once failed only
    at the first delivery, after Spark had run and committed a batch, as a bare Py4J error."""
    from millstream.spark.runner import MillstreamRunError

    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), 500, lambda n: 7 * n)
    pipeline = (Pipeline("badformat").add_injector("src", injector, "in")
                .add_computation("windower", BucketCounter(), ["in"], ["windows"])
                .add_sink("sheet", "windows", str(tmp_path / "out"), format=format))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    with pytest.raises(MillstreamRunError, match=rf"sink 'sheet': Spark cannot write format '{format}': {reason}"):
        runner.run(timeout=300)
    published = PublicationLog(str(tmp_path / "root"), "windower").entries_after(-1, 1 << 30)
    assert not [entry for _, entry in published if entry["type"] == BATCH], "a batch ran"
    holder = runner.lease.holder()
    assert holder is None or holder.heartbeat_ms == 0  # released: the root is free for the fixed pipeline


def test_a_table_delivery_replaces_only_its_own_batch_whatever_the_sessions_overwrite_mode(spark, tmp_path):
    """Sink threads deliver side by side in one session: one that set partitionOverwriteMode for its
    write and put it back could leave another's overwrite static, which empties the whole table.
    A delivery must not depend on that setting: here it is static throughout."""
    from millstream.spark.sinks import deliver_with_spark

    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=250)
    pipeline = (Pipeline("modes").add_injector("src", injector, "in")
                .add_computation("windower", BucketCounter(), ["in"], ["windows"])
                .add_sink("table", "windows", table="mode_windows", options={"path": str(tmp_path / "table")}))
    root = str(tmp_path / "root")
    SparkRunner(pipeline, root=root, spark=spark, max_records_per_batch=250).run(progress_interval=0.2, timeout=300)
    expected = windows(spark.table("mode_windows").collect())
    assert expected == expected_windows()
    batches = [entry for _, entry in PublicationLog(root, "windower").entries_after(-1, 1 << 30)
               if entry["type"] == BATCH]
    previous = spark.conf.get("spark.sql.sources.partitionOverwriteMode")
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "static")
    set_conf = type(spark.conf).set
    try:  # as if another sink thread put the setting back at once, whatever this delivery sets
        type(spark.conf).set = lambda self, key, value: None
        entry = batches[len(batches) // 2]
        deliver_with_spark(spark, pipeline, pipeline.sinks["table"], "windower", entry["batch"], entry, root)
    finally:
        type(spark.conf).set = set_conf
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", previous)
    assert windows(spark.table("mode_windows").collect()) == expected
    spark.sql("DROP TABLE mode_windows")


def test_a_table_delivery_takes_nothing_from_what_a_dead_delivery_left(spark, tmp_path):
    """A first delivery that died before its table was registered leaves only Spark's `_temporary` at
    the managed table's location; creating the table over a non-empty location fails at every retry.
    Delivery clears such a location (no batch in it) and creates the table. A later delivery that
    died leaves committed task output there, which must not reach the table."""
    from millstream.spark.sinks import deliver_with_spark

    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=500)
    pipeline = (Pipeline("deadfirst").add_injector("src", injector, "in")
                .add_computation("windower", BucketCounter(), ["in"], ["windows"])
                .add_sink("table", "windows", table="dead_first_windows"))
    # The session's warehouse outlives the test: what an earlier, failed run left there goes first.
    location = f"{spark.catalog.getDatabase('default').locationUri.removeprefix('file:')}/dead_first_windows"
    spark.sql("DROP TABLE IF EXISTS dead_first_windows")
    shutil.rmtree(location, ignore_errors=True)
    root = str(tmp_path / "root")
    SparkRunner(pipeline, root=root, spark=spark, max_records_per_batch=500).run(timeout=300)
    assert windows(spark.table("dead_first_windows").collect()) == expected_windows()
    batches = [entry for _, entry in PublicationLog(root, "windower").entries_after(-1, 1 << 30)
               if entry["type"] == BATCH]
    spark.sql("DROP TABLE dead_first_windows")  # a managed table: its files go too
    assert not os.path.exists(location)
    leftover = os.path.join(location, "_temporary", "0", "_temporary", "attempt_0")
    os.makedirs(leftover)
    with open(os.path.join(leftover, "part-00000.parquet"), "wb") as f:
        f.write(b"half a file")
    for entry in batches:
        deliver_with_spark(spark, pipeline, pipeline.sinks["table"], "windower", entry["batch"], entry, root)
    assert windows(spark.table("dead_first_windows").collect()) == expected_windows()

    # A delivery killed after one of its tasks committed, before the job did, leaves that task's files
    # under _temporary/0, where the committer of the table's next write takes them as its own: the
    # batch they belong to, delivered already, would hold its windows twice.
    first = os.path.join(location, "millstream_producer=windower", f"millstream_batch={batches[0]['batch']}")
    task = os.path.join(location, "_temporary", "0", "task_202611260000_0001_m_000000",
                        "millstream_producer=windower", f"millstream_batch={batches[0]['batch']}")
    os.makedirs(task)
    for name in os.listdir(first):
        if name.endswith(".parquet"):
            shutil.copy(os.path.join(first, name), os.path.join(task, f"dead-{name}"))
    last = batches[-1]
    deliver_with_spark(spark, pipeline, pipeline.sinks["table"], "windower", last["batch"], last, root)
    assert windows(spark.table("dead_first_windows").collect()) == expected_windows()
    spark.sql("DROP TABLE dead_first_windows")


class Described(Computation):
    """Each record's value as a dict: its number, a field named id, and a note on every fifth only;
    a number that is 6 modulo 7 fails (a dead letter, its input value an int or a string)."""

    def process_record(self, ctx, record):
        n = int(record.value)
        if n % 7 == 6:
            raise ValueError(f"no description for {n}")
        note = {"note": f"note {n}"} if n % 5 == 3 else {}
        ctx.produce(Record(ctx.key, {"n": n, "id": f"user-{n}", **note}, record.timestamp), "described")


def parquet_rows(directory):
    import pyarrow.parquet as pq

    return [row for name in sorted(os.listdir(directory)) if name.endswith(".parquet")
            for row in pq.read_table(os.path.join(directory, name)).to_pylist()]


def test_parquet_sinks_keep_every_field_and_the_records_own_columns_and_take_values_of_mixed_types(spark, tmp_path):
    """Fields only some records have, a field named like a record's column (id), and the dead
    letters' input values, ints here and strings there, all reach the Parquet files; the run ends."""
    total = 300
    values = [i if i % 2 else str(i) for i in range(total)]
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i if i % 2 else str(i), 7 * i), total,
                                 lambda n: 7 * n, max_records_per_read=100)
    pipeline = (Pipeline("described").add_injector("src", injector, "in")
                .add_computation("describe", Described(), ["in"], ["described"], on_error="dead_letter")
                .add_sink("out", "described", str(tmp_path / "out"), format="parquet")
                .add_sink("dead", "dead_letters", str(tmp_path / "dead"), format="parquet"))
    SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark, max_records_per_batch=100).run(timeout=300)

    kept = [i for i in range(total) if i % 7 != 6]
    rows = sorted(parquet_rows(tmp_path / "out"), key=lambda row: row["n"])
    assert [(row["key"], row["timestamp"], row["n"], row["value.id"], row["note"]) for row in rows] == [
        (f"k{i % KEYS}", 7 * i, i, f"user-{i}", f"note {i}" if i % 5 == 3 else None) for i in kept]
    assert all(row["id"] != row["value.id"] for row in rows)  # the record's own id
    assert len({row["id"] for row in rows}) == len(kept)
    letters = sorted(parquet_rows(tmp_path / "dead"), key=lambda row: row["timestamp"])
    failed = [i for i in range(total) if i % 7 == 6]
    assert [(row["timestamp"], row["value"]) for row in letters] == [(7 * i, json.dumps(values[i])) for i in failed]


def table_pipeline(base):
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=250)
    return (Pipeline("tables").add_injector("src", injector, "in")
            .add_computation("windower", BucketCounter(), ["in"], ["windows"])
            .add_sink("external", "windows", table="external_windows", options={"path": f"{base}/external"})
            .add_sink("managed", "windows", table="managed_windows"))


def test_table_sinks_go_on_after_a_restart_whose_catalog_forgot_them(spark, tmp_path):
    """Spark's default catalog lives in the driver: a driver killed after a table took a batch and
    restarted finds no table, only its files. Delivery registers the table again over them and goes
    on; each window is there once."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((os.path.dirname(os.path.dirname(here)),
                                                         os.path.dirname(here)))}
    command = [sys.executable, os.path.abspath(__file__), str(tmp_path)]
    killed = subprocess.run(command, env={**env, "MILLSTREAM_KILL_AT": "delivered@windower:3"},
                            start_new_session=True, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    env.pop("MILLSTREAM_KILL_AT", None)
    finished = subprocess.run(command, env=env, start_new_session=True, capture_output=True, text=True,
                              timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    for location in (tmp_path / "external", tmp_path / "warehouse" / "managed_windows"):
        assert windows(spark.read.parquet(str(location)).collect()) == expected_windows(), location


class StallingWriter(FilePerBatch):
    """FilePerBatch that, while MILLSTREAM_TEST_STALL_SINK is set, never returns from batch 1 on: a
    sink slower than its computation, which goes on committing batches."""

    def __call__(self, frame, batch_id):
        if os.environ.get("MILLSTREAM_TEST_STALL_SINK") and batch_id >= 1:
            time.sleep(600)  # the driver is killed meanwhile
        super().__call__(frame, batch_id)


def writer_pipeline(base):
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=250)
    return (Pipeline("lagging").add_injector("src", injector, "in")
            .add_computation("windower", BucketCounter(), ["in"], ["windows"])
            .add_sink("mine", "windows", writer=StallingWriter(f"{base}/writer")))


def test_a_sink_behind_its_computation_gets_every_batch_after_a_restart_that_publishes_first(tmp_path):
    """A driver killed after Spark committed a batch and before millstream published it, while a sink
    was batches behind: the restart publishes that batch, and the sink must still receive the ones
    before it, in order. Publishing first queued the newest batch ahead of the sink's catch-up: the
    sink took it, recorded it as delivered, and skipped the older ones as delivered already."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((os.path.dirname(os.path.dirname(here)),
                                                         os.path.dirname(here)))}
    command = [sys.executable, os.path.abspath(__file__), str(tmp_path), "writer"]
    # Spark's 4th commit is batch 3; the sink stalls in batch 1, so batches 1 and 2 are published, not delivered.
    killed = subprocess.run(command, env={**env, "MILLSTREAM_KILL_AT": "committed@windower:4",
                                          "MILLSTREAM_TEST_STALL_SINK": "1"},
                            start_new_session=True, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    env.pop("MILLSTREAM_KILL_AT", None)
    env.pop("MILLSTREAM_TEST_STALL_SINK", None)
    finished = subprocess.run(command, env=env, start_new_session=True, capture_output=True, text=True,
                              timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    written = tmp_path / "writer"
    rows = [row for name in sorted(os.listdir(written)) for row in json.load(open(written / name))]
    assert windows(rows) == expected_windows(), sorted(os.listdir(written))


def fresh_pipeline(base, prefix):
    injector = GeneratorInjector(lambda i: Record(f"{prefix}{i % KEYS}", i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=250)
    return (Pipeline("fresh").add_injector("src", injector, "in")
            .add_computation("windower", BucketCounter(), ["in"], ["windows"])
            .add_sink("lines", "windows", f"{base}/lines")
            .add_sink("table", "windows", f"{base}/table", format="parquet"))


def test_a_new_root_s_files_join_those_an_earlier_root_left_in_the_sink_directory(tmp_path):
    """A root deleted and made again (`millstream run --fresh`) writes into sink directories that
    still hold the first root's files. Each driver process counts Spark's tasks from 0, so both name
    their files alike: the new root's must still be delivered, next to the old ones. The new root's
    driver is killed once after a delivery, before its progress was kept: the batch delivered again
    after the restart, and every batch delivered again after the run, replace nothing twice."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((os.path.dirname(os.path.dirname(here)),
                                                         os.path.dirname(here)))}
    for prefix, kill_at in (("a", None), ("b", "delivered@windower:3"), ("b", None)):
        if kill_at or prefix == "a":
            shutil.rmtree(tmp_path / "root", ignore_errors=True)
        run = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path), "fresh", prefix],
                             env={**env, "MILLSTREAM_KILL_AT": kill_at} if kill_at else env,
                             start_new_session=True, capture_output=True, text=True, timeout=600)
        assert run.returncode == (-9 if kill_at else 0), run.stderr[-3000:]
    files = sorted(os.listdir(tmp_path / "lines")), sorted(os.listdir(tmp_path / "table"))
    pipeline = fresh_pipeline(str(tmp_path), "b")
    batches = [entry for _, entry in PublicationLog(str(tmp_path / "root"), "windower").entries_after(-1, 1 << 30)
               if entry["type"] == BATCH]
    for _node, _producers, deliver in sink_deliverers(None, str(tmp_path / "root"), pipeline, {"windower"}).values():
        for entry in batches:  # file sinks need no Spark session
            deliver("windower", entry["batch"], entry)
    assert (sorted(os.listdir(tmp_path / "lines")), sorted(os.listdir(tmp_path / "table"))) == files
    expected = sorted((f"{prefix}{key[1:]}", bucket, count) for prefix in ("a", "b")
                      for key, bucket, count in expected_windows())
    lines = [json.loads(line) for name in sorted(os.listdir(tmp_path / "lines"))
             for line in open(tmp_path / "lines" / name)]
    assert sorted((row["key"], *row["value"]) for row in lines) == expected
    assert sorted((row["key"], *row["value"]) for row in parquet_rows(tmp_path / "table")) == expected


if __name__ == "__main__":  # the driver process of the restart tests
    base = sys.argv[1]
    if sys.argv[2:3] == ["fresh"]:
        SparkRunner(fresh_pipeline(base, sys.argv[3]), root=f"{base}/root", master="local[2]",
                    max_records_per_batch=250).run(timeout=500)
    elif sys.argv[2:] == ["writer"]:
        SparkRunner(writer_pipeline(base), root=f"{base}/root", master="local[2]", max_records_per_batch=250,
                    spark_conf={"spark.sql.warehouse.dir": f"{base}/warehouse"}).run(timeout=500)
    else:
        SparkRunner(table_pipeline(base), root=f"{base}/root", master="local[2]", max_records_per_batch=250,
                    spark_conf={"spark.sql.warehouse.dir": f"{base}/warehouse"}).run(timeout=500)
