"""What a JDBC sink's exactly-once delivery costs: `deliver_jdbc` (the executors stage the batch, one
driver transaction replaces it in the table) against Spark's plain JDBC append of the same rows (the
delivery before staging, which a task run twice could duplicate), side by side in alternating rounds
on local[2]. Each batch is read from Parquet files, as a sink reads a published batch.

Databases: Derby, embedded in Spark's JVM (it ships with Spark), and PostgreSQL 15 on 127.0.0.1,
started by the benchmark, when Debian's JDBC driver is installed (`apt-get install
libpostgresql-jdbc-java`: /usr/share/java/postgresql.jar; Maven, where Spark would fetch it, is not
reachable here). Every round checks the table: each batch's rows are there once.

Reported per database: seconds per delivery of each way (median over rounds) and their ratio.

`python -m bench.jdbcsink [--quick]` (results in bench/results/jdbcsink.json).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

from bench.common import cli
from millstream import Pipeline, ScriptedInjector
from millstream.spark.session import create_session
from millstream.spark.sinks import deliver_jdbc

POSTGRES_JAR = "/usr/share/java/postgresql.jar"


def batch_frame(spark: Any, scratch: str, rows: int) -> Any:
    """A batch as a sink gets it: columns key, timestamp, id, value (JSON text), producer, read from
    two Parquet files."""
    path = f"{scratch}/batch"
    (spark.range(rows, numPartitions=2)
     .selectExpr("concat('k', id % 10000) AS key", "id * 7 AS timestamp", "concat('r-', id) AS id",
                 "concat('[', id % 1000, ', ', id % 97, ']') AS value", "'bench' AS producer")
     .write.mode("overwrite").parquet(path))
    return spark.read.parquet(path)


def count_rows(spark: Any, options: dict[str, str], where: str) -> int:
    query = f"(SELECT COUNT(*) AS n FROM {options['dbtable']} WHERE {where}) counted"
    return spark.read.format("jdbc").options(**{**options, "dbtable": query}).load().collect()[0][0]


def compare(spark: Any, name: str, options: dict[str, str], frame: Any, rounds: int, scratch: str) -> dict:
    from pyspark.sql import functions as F

    rows = frame.count()
    staged_options = {**options, "dbtable": "staged_batches"}
    node = (Pipeline("jdbcsink").add_injector("src", ScriptedInjector("src", []), "in")
            .add_sink("db", "in", format="jdbc", options=staged_options).sinks["db"])
    plain_options = {**options, "dbtable": "plain_batches"}
    seconds: dict[str, list[float]] = {"staged": [], "plain": []}
    for batch in range(rounds + 1):  # the first round creates the tables, and is not counted
        for way in ("staged", "plain") if batch % 2 else ("plain", "staged"):
            started = time.perf_counter()
            if way == "staged":
                deliver_jdbc(spark, frame, node, "bench", batch, f"{scratch}/root")
            else:
                (frame.withColumn("millstream_producer", F.lit("bench"))
                 .withColumn("millstream_batch", F.lit(batch).cast("long"))
                 .write.format("jdbc").options(**plain_options,
                                               createTableColumnTypes="millstream_producer VARCHAR(64)")
                 .mode("append").save())
            if batch:
                seconds[way].append(time.perf_counter() - started)
            table = staged_options if way == "staged" else plain_options
            found = count_rows(spark, table, f'"millstream_batch" = {batch}')
            assert found == rows, f"{name} {way}: batch {batch} has {found} rows, not {rows}"
    median = {way: round(statistics.median(values), 3) for way, values in seconds.items()}
    ratio = round(median["staged"] / median["plain"], 2)
    print(f"{name}: {rows:,} rows per batch, {rounds} rounds: staged delivery {median['staged']:.2f} s, "
          f"plain append {median['plain']:.2f} s (staged / plain {ratio}x)")
    return {"rows_per_batch": rows, "rounds": rounds, "median_s": median, "staged_over_plain": ratio,
            "seconds": {way: [round(value, 3) for value in values] for way, values in seconds.items()}}


def main(quick: bool) -> dict:
    rows, rounds = (20_000, 3) if quick else (200_000, 5)
    scratch = tempfile.mkdtemp(prefix="millstream-jdbcsink-")
    postgres = os.path.exists(POSTGRES_JAR)
    conf = {"spark.jars": POSTGRES_JAR} if postgres else {}
    spark = create_session("local[2]", "bench-jdbcsink", log_path=f"{scratch}/spark.log", conf=conf)
    spark._jvm.java.lang.System.setProperty("derby.stream.error.file", f"{scratch}/derby.log")
    result: dict[str, Any] = {}
    server = None
    try:
        frame = batch_frame(spark, scratch, rows)
        result["derby"] = compare(spark, "Derby", {"url": f"jdbc:derby:{scratch}/db;create=true"}, frame, rounds,
                                  scratch)
        if postgres:
            from millstream.photon.localpg import LocalPostgres

            server = LocalPostgres().start()
            result["postgres"] = compare(spark, "PostgreSQL", {
                "url": f"jdbc:postgresql://127.0.0.1:{server.port}/postgres", "user": "postgres",
                "password": server.password, "driver": "org.postgresql.Driver"}, frame, rounds, scratch)
        else:
            print(f"PostgreSQL skipped: no JDBC driver at {POSTGRES_JAR} (apt-get install libpostgresql-jdbc-java)")
            result["postgres"] = None
    finally:
        spark.stop()
        if server is not None:
            server.stop()
    return result


if __name__ == "__main__":
    cli("jdbcsink", main)
