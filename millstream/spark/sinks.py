"""Sinks: published batches delivered out of the pipeline, in order, exactly once per batch id.

Each sink remembers how far it got per producer (`sinks/<sink>/<producer>.json`, written after a
delivery); a restart re-delivers from there, so every kind of sink must tolerate the redelivery of
its last batch:

- file sinks (jsonl, parquet): the executors wrote the batch's files under the root
  (`sinks/<sink>/staging/`); delivery moves them into `<path>/<producer>-<batch>-<root>-<part>`
  (`delivered_name`: <root> is the root's identity, so another root's files, even one made in the
  same place, never share a name with this one's; a name already there is this root's redelivery,
  skipped), so the sink directory only ever holds delivered files;
- Spark writers (`path` with any other format): the batch goes to
  `<path>/producer=<producer>/batch=<batch>`, written with mode overwrite: a redelivery replaces it;
- tables: appended with partition columns millstream_producer and millstream_batch, overwriting
  only that partition (INSERT OVERWRITE of the partition named in full);
- JDBC tables: with columns millstream_producer and millstream_batch; the executors write the batch
  to a staging table, then one transaction on the driver deletes the rows a previous delivery of the
  same batch left and copies the batch in, one task attempt per partition (`deliver_jdbc`);
- user writers: called as writer(dataframe, batch_id), like Spark's foreachBatch: make them
  idempotent per (producer, batch_id); the dataframe has a `producer` column.

The dataframe a Spark writer or user writer gets has columns key, timestamp, id, value (JSON text for
JSON streams, bytes otherwise) and producer, read by Spark from the published stream-log files: the
driver never holds the records.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple
from urllib.parse import urlsplit

import pyarrow.parquet as pq

from millstream.model.codecs import Codec, JsonCodec
from millstream.model.locations import is_local, table_place
from millstream.model.pipeline import Pipeline, SinkNode
from millstream.spark import faults
from millstream.spark.layout import read_layout
from millstream.spark.publog import BATCH, PublicationLog
from millstream.spark.rootfiles import sink_progress
from millstream.spark.source import LOG_SCHEMA
from millstream.spark.storage import Storage
from millstream.spark.writer import sink_file, sink_staging_dir

SinkFunction = Callable[[str, int, dict[str, Any]], None]


class SinkDelivery:
    """Delivers published batches to sinks, in order per (sink, producer), one thread per sink."""

    def __init__(self, root: str, deliverers: dict[str, tuple[SinkNode, list[str], SinkFunction]]) -> None:
        self.root = root
        self.storage = Storage(root)
        self.deliverers = deliverers  # sink name -> (node, producers, deliver(producer, batch, entry))
        self.queues: dict[str, "queue.Queue[tuple[str, int, dict[str, Any]] | None]"] = {
            name: queue.Queue() for name in deliverers}
        self.failure: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.idle = {name: threading.Event() for name in deliverers}

    def progress_file(self, sink: str, producer: str) -> str:
        return sink_progress(sink, producer)

    def delivered(self, sink: str, producer: str) -> tuple[int, int]:
        """(last batch delivered, its log position)."""
        data = self.storage.read_json(self.progress_file(sink, producer)) or {}
        return data.get("batch", -1), data.get("position", -1)

    def catch_up(self) -> None:
        """Queue every published batch a sink has not received yet (a crash before delivery)."""
        for sink, (_, producers, _) in self.deliverers.items():
            for producer in producers:
                batch, position = self.delivered(sink, producer)
                log = PublicationLog(self.root, producer)
                for entry_position, entry in log.entries_after(position, 1 << 30):
                    if entry["type"] == BATCH and entry["batch"] > batch:
                        self.queues[sink].put((producer, entry_position, entry))

    def published(self, producer: str, position: int, entry: dict[str, Any]) -> None:
        for sink, (_, producers, _) in self.deliverers.items():
            if producer in producers:
                self.idle[sink].clear()
                self.queues[sink].put((producer, position, entry))

    def add_producer(self, producer: str, stream: str) -> None:
        """A computation added while running: the sinks on `stream` receive its batches too."""
        for node, producers, _ in self.deliverers.values():
            if node.stream == stream and producer not in producers:
                producers.append(producer)

    def start(self) -> None:
        self._stopping.clear()
        for sink in self.deliverers:
            thread = threading.Thread(target=self._loop, args=(sink,), name=f"millstream-sink-{sink}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop after the deliveries under way: what is queued stays undelivered, for the next run's
        catch_up (delivering it from here would race the next driver, which delivers it too)."""
        self._stopping.set()
        for sink in self.deliverers:
            self.queues[sink].put(None)
        for thread in self._threads:
            thread.join(timeout=60)
        self._threads.clear()

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        for sink in self.deliverers:
            while not (self.queues[sink].empty() and self.idle[sink].is_set()):
                if time.time() > deadline or self.failure is not None:
                    return False
                time.sleep(0.05)
        return True

    def _loop(self, sink: str) -> None:
        node, _, deliver = self.deliverers[sink]
        items = self.queues[sink]
        while True:
            if items.empty():
                self.idle[sink].set()
            item = items.get()
            if item is None or self._stopping.is_set():
                return
            producer, position, entry = item
            failing = entry
            try:
                last, at = self.delivered(sink, producer)
                if entry["batch"] <= last:
                    continue
                # Published batches before this one that the sink has not received go first, in order:
                # recording this one would mark them delivered, whatever order they were queued in.
                for earlier_position, earlier in PublicationLog(self.root, producer).entries_from(at):
                    if earlier_position >= position:
                        break
                    if self._stopping.is_set():
                        return
                    if earlier["type"] == BATCH and earlier["batch"] > last:
                        failing = earlier
                        self._deliver(sink, deliver, producer, earlier_position, earlier)
                failing = entry
                self._deliver(sink, deliver, producer, position, entry)
            except BaseException as error:
                self.failure = RuntimeError(f"sink {sink!r} failed on batch {failing['batch']} of {producer!r}: "
                                            f"{failure_reason(error)}")
                self.failure.__cause__ = error
                return

    def _deliver(self, sink: str, deliver: SinkFunction, producer: str, position: int, entry: dict[str, Any]) -> None:
        deliver(producer, entry["batch"], entry)
        faults.reached("delivered", producer)
        self.storage.write_json(self.progress_file(sink, producer), {"batch": entry["batch"], "position": position})


def delivered_name(producer: str, batch: int, identity: str | None, part: str) -> str:
    """The name of a file sink's file in its directory: by producer, batch and the root's identity
    (layout.py), which a root made again in the same place does not share, so it never finds its
    files there already; a root made before identities were kept has none in its names.

    >>> delivered_name("count", 7, "4be1c0de", "part-00001-42.jsonl")
    'count-000000000007-4be1c0de-part-00001-42.jsonl'
    >>> delivered_name("count", 7, None, "part-00001-42.jsonl")
    'count-000000000007-part-00001-42.jsonl'
    """
    return f"{producer}-{batch:012d}-{identity}-{part}" if identity else f"{producer}-{batch:012d}-{part}"


def deliver_file_sink(root: str, node: SinkNode, producer: str, batch: int, entry: dict[str, Any],
                      codec: Codec, identity: str | None) -> None:
    """Move the batch's staged sink files into the sink directory (a re-delivery finds them there).
    A batch published before the sink was added staged none: its files are written from the batch's
    stream log instead, as a Spark-writer sink reads it, so a sink added later receives what is
    retained either way. `identity`: the root's (`delivered_name`)."""
    staging = Storage(root)
    target = Storage(node.path)  # type: ignore[arg-type]
    if node.name not in entry.get("sinks", {}):
        for number, (path, rows) in enumerate(entry.get("streams", {}).get(node.stream, [])):
            final = delivered_name(producer, batch, identity, f"log-{number:05d}.{node.format}")
            if rows and not target.exists(final):
                table = pq.read_table(path, filesystem=staging.fs, schema=LOG_SCHEMA)
                target.write(final, sink_file(table, node.format, codec))
        return
    for path, _rows in entry.get("sinks", {}).get(node.name, []):
        final = delivered_name(producer, batch, identity, path.rsplit("/", 1)[-1])
        if not target.exists(final):
            staging.move_to(path, target, final)
    # Other attempts of the batch were never committed: their files go.
    prefix = sink_staging_dir(node.name, producer, batch, "")
    folder, _, stem = prefix.rpartition("/")
    for directory in staging.list(folder):
        if directory.startswith(stem):
            staging.delete(f"{folder}/{directory}")


LOG_COLUMNS = "key string, value binary, timestamp long, id string, segment int, order_key long, order_seq int"


def spark_paths(root: str, entry: dict[str, Any], stream: str) -> list[str]:
    """The batch's stream-log files of `stream` that hold records, as Spark reaches them: the log
    records a remote root's files as its filesystem names them (`Storage.full_path`: `bucket/...`),
    Spark needs the root's scheme in front; a local root's are local paths, given as they are."""
    paths = [path for path, rows in entry.get("streams", {}).get(stream, []) if rows]
    if is_local(root):
        return paths
    scheme = urlsplit(root).scheme
    return [f"{scheme}://{path}" for path in paths]


def batch_frame(spark: Any, pipeline: Pipeline, node: SinkNode, producer: str, entry: dict[str, Any],
                root: str) -> Any:
    """The batch's records of the sink's stream as a Spark DataFrame, read by the executors from the
    root's stream-log files."""
    from pyspark.sql import functions as F

    paths = spark_paths(root, entry, node.stream)
    if paths:
        frame = spark.read.schema(LOG_COLUMNS).parquet(*paths)
    else:
        frame = spark.createDataFrame([], LOG_COLUMNS)
    value = F.col("value")
    if isinstance(pipeline.codec(node.stream), JsonCodec):
        value = value.cast("string")
    return frame.select("key", "timestamp", "id", value.alias("value"), F.lit(producer).alias("producer"))


def deliver_with_spark(spark: Any, pipeline: Pipeline, node: SinkNode, producer: str, batch: int,
                       entry: dict[str, Any], root: str) -> None:
    frame = batch_frame(spark, pipeline, node, producer, entry, root)
    if node.writer is not None:
        node.writer(frame, batch)
    elif node.table is not None:
        from pyspark.sql import functions as F

        with _table_lock(node.table):  # one write at a time per table: they share its _temporary
            if not spark.catalog.tableExists(node.table):
                _register_written_table(spark, node)
            if not spark.catalog.tableExists(node.table):
                (frame.withColumn("millstream_producer", F.lit(producer))
                 .withColumn("millstream_batch", F.lit(batch))
                 .write.partitionBy("millstream_producer", "millstream_batch").options(**node.options)
                 .saveAsTable(node.table))
            else:
                _clear_dead_writes(spark, node.table)
                # The batch's own partition, named in full: only it is replaced, whatever the session's
                # partitionOverwriteMode (a setting every sink thread and the user's code share).
                view = f"millstream_delivery_{uuid.uuid4().hex}"
                frame.createOrReplaceTempView(view)
                try:
                    spark.sql(f"INSERT OVERWRITE TABLE {node.table} PARTITION (millstream_producer = "
                              f"'{producer}', millstream_batch = {batch}) SELECT key, timestamp, id, value, "
                              f"producer FROM {view}")
                finally:
                    spark.catalog.dropTempView(view)
    elif node.is_jdbc:
        deliver_jdbc(spark, frame, node, producer, batch, root)
    else:
        target = f"{node.path.rstrip('/')}/producer={producer}/batch={batch:012d}"  # type: ignore[union-attr]
        frame.write.mode("overwrite").format(node.format).options(**node.options).save(target)


_TABLE_LOCKS: dict[str, threading.Lock] = {}
_TABLE_LOCKS_GUARD = threading.Lock()


def _table_lock(table: str) -> threading.Lock:
    """The lock of a table for this process's deliveries (two sinks may name one table)."""
    return _lock_of(table_place(table))


def _lock_of(place: str) -> threading.Lock:
    with _TABLE_LOCKS_GUARD:
        return _TABLE_LOCKS.setdefault(place, threading.Lock())


def _clear_dead_writes(spark: Any, table: str) -> None:
    """Remove `_temporary` from the table's location. Spark's file committer keeps a write's
    committed tasks there until the write commits, in a directory every write to the table uses:
    a delivery killed in between leaves files the next write would commit as its own, into the
    batch they came from, delivered again since. Under the table's lock no write of this process
    is in flight, and the root's lease keeps other drivers out."""
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").where("col_name = 'Location'").collect()
    if not rows:  # not a table with a location of its own (a view, a JDBC-backed table...)
        return
    fs, path = _hadoop_path(spark, f"{rows[0][1].rstrip('/')}/_temporary")
    if fs.exists(path):
        fs.delete(path, True)


def _hadoop_path(spark: Any, location: str) -> tuple[Any, Any]:
    """(its filesystem, the path) for a location, as Spark's own writers reach it."""
    path = spark._jvm.org.apache.hadoop.fs.Path(location)
    return path.getFileSystem(spark._jsc.hadoopConfiguration()), path


def _register_written_table(spark: Any, node: SinkNode) -> None:
    """A catalog that forgot the table (Spark's in-memory one, after a restart) while its files
    are still there: the table is registered again over them, so delivery goes on appending
    instead of failing to create it over a non-empty location."""
    table = node.table or ""
    database, _, name = table.rpartition(".")
    location = node.options.get("path") or (
        f"{spark.catalog.getDatabase(database or spark.catalog.currentDatabase()).locationUri.rstrip('/')}/"
        f"{name.lower()}")
    fs, path = _hadoop_path(spark, location)
    if not fs.exists(path):
        return
    names = [status.getPath().getName() for status in fs.listStatus(path)]
    if any(name.startswith("millstream_producer=") for name in names):
        # Registered as an external table: dropping it no longer deletes its files.
        spark.catalog.createTable(table, path=location, source=spark.conf.get("spark.sql.sources.default"))
        spark.sql(f"ALTER TABLE {table} RECOVER PARTITIONS")
    elif all(name.startswith(("_", ".")) for name in names):
        fs.delete(path, True)  # what a first delivery that died left (_temporary): no batch in it yet


class SinkError(RuntimeError):
    """A sink's target cannot take millstream's batches as it is (the message says why)."""


def check_sink_formats(spark: Any, pipeline: Pipeline) -> None:
    """Refuse, before any batch runs, a sink whose format Spark cannot write (no data source by that
    name, or one not enabled: a typo, a package not on the classpath): Spark itself would fail only
    at the first delivery, in a Py4J error that does not name the format."""
    for node in pipeline.sinks.values():
        if node.path is None or node.is_file_sink or node.writer is not None:
            continue
        try:
            spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                node.format, spark._jsparkSession.sessionState().conf())
        except Exception as error:
            raise SinkError(f"sink {node.name!r}: Spark cannot write format {node.format!r}: {_java_reason(error)} "
                            "(millstream's own file sinks are 'jsonl' and 'parquet'; Spark's include 'json', "
                            "'csv', 'orc' and 'text')") from None


def _java_reason(error: BaseException) -> str:
    """The Java exception's own message in a Py4J error ("[ERROR_CLASS] text"), else the first line;
    where that message only points further down (a JDBC driver's "see the next exception"), the
    deepest cause's.

    >>> _java_reason(RuntimeError("An error occurred while calling o450.save.\\n: org.apache.hadoop.fs."
    ...     "ParentNotDirectoryException: Parent path is not a directory: /out\\n\\tat org.apache...(X.java:1)"))
    'Parent path is not a directory: /out'
    >>> _java_reason(RuntimeError("o1.save.\\n: java.sql.SQLException: see the next exception\\n\\tat x\\n"
    ...     "Caused by: java.sql.SQLException: Directory /proc/nope/db cannot be created."))
    'Directory /proc/nope/db cannot be created.'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        found = re.match(r"^:?\s*[\w.$]+(?:Exception|Error): (.+)$", line)
        if found:
            if "next exception" not in found.group(1):
                return found.group(1)
            causes = [cause.group(1) for line in lines
                      if (cause := re.match(r"^Caused by: [\w.$]+(?:Exception|Error): (.+)$", line))]
            return causes[-1] if causes else found.group(1)
    return lines[0] if lines else type(error).__name__


def failure_reason(error: BaseException) -> str:
    """A delivery's failure in one line: a Java error's own reason (its whole trace stays chained to
    the error raised), a Python one's type and text.

    >>> failure_reason(ConnectionError("warehouse unreachable"))
    'ConnectionError: warehouse unreachable'
    >>> Py4JJavaError = type("Py4JJavaError", (Exception,), {"__module__": "py4j.protocol"})
    >>> failure_reason(Py4JJavaError("An error occurred while calling o450.save.\\n: org.apache.hadoop.fs."
    ...     "ParentNotDirectoryException: Parent path is not a directory: /out\\n\\tat org.apache...(X.java:1)"))
    'Py4JJavaError: Parent path is not a directory: /out'
    """
    if type(error).__module__.startswith(("py4j", "pyspark.errors")):
        return f"{type(error).__name__}: {_java_reason(error)}"
    return f"{type(error).__name__}: {error}"


class StagedAttempt(NamedTuple):
    """A task attempt's rows in a JDBC sink's staging table."""

    partition: int  # the Spark partition it wrote
    attempt: int  # Spark's task attempt id, unique in the application
    rows: int  # how many rows it staged


@dataclass(frozen=True)
class _JdbcTables:
    """A JDBC sink's table and its staging table, with their columns as the database spells them,
    by lower-case name."""

    table: str
    columns: dict[str, str]
    staging: str
    staging_columns: dict[str, str]


def deliver_jdbc(spark: Any, frame: Any, node: SinkNode, producer: str, batch: int, root: str) -> None:
    """Replace the batch's rows in the database table, all at once. Spark's JDBC writer commits per
    task: written straight into the table, a batch would show partial to readers, and a task run again
    after it committed (its executor lost before it reported, a speculative copy) would write its rows
    twice. So the executors write the batch into a staging table of this sink and producer, each row
    marked with this delivery and its Spark partition and task attempt (`_mark_attempt`); then the
    driver, in one transaction, deletes what an earlier delivery of the batch left, copies one
    complete attempt per partition (`complete_attempts`) from staging and empties staging. A delivery
    that fails before its commit leaves the table as it was, on a database with transactions. The
    staging table is made once (in the table's schema: the sink needs the right to create it)."""
    from pyspark.sql import functions as F

    options = {name.lower(): value for name, value in node.options.items()}  # Spark's are case-blind
    url, table = options["url"], options["dbtable"]
    batch_rows = (frame.withColumn("millstream_producer", F.lit(producer))
                  .withColumn("millstream_batch", F.lit(batch).cast("long")))
    delivery = uuid.uuid4().hex
    of_delivery = batch_rows.withColumn("millstream_delivery", F.lit(delivery))
    marked = of_delivery.mapInArrow(_mark_attempt, _with_attempt_columns(of_delivery.schema))
    staging = staging_table(table, root, node.name, producer)
    dialect, connection = _jdbc_connection(spark, node.options, url)
    try:
        with _lock_of(f"jdbc {url} {table.lower()}"):  # two sinks may name one table: one creates it
            columns = _jdbc_columns(connection, table)
            if columns is None:
                (batch_rows.limit(0).write.format("jdbc")  # with Spark's types
                 .options(**_jdbc_write_options(node.options, ("millstream_producer",)), dbtable=table)
                 .mode("append").save())
                _index_batches(connection, dialect, table)
                columns = _read_columns(connection, table, node.name)
        missing = [name for name in batch_rows.columns if name not in columns]
        if missing:
            raise SinkError(f"sink {node.name!r}: table {table} has no columns {', '.join(missing)}, which millstream "
                            "writes; let millstream create the table, or add them (key, id, producer and "
                            "millstream_producer strings, timestamp and millstream_batch bigints, value the "
                            "stream's values: text for JSON streams, bytes otherwise)")
        staging_columns = _jdbc_columns(connection, staging)
        if staging_columns is not None and any(name not in staging_columns for name in marked.columns):
            _drop_table(connection, staging)  # made for other columns (the sink's options changed)
        write_staged(marked, {**_jdbc_write_options(node.options, ("millstream_producer", "millstream_delivery")),
                              "dbtable": staging})
        tables = _JdbcTables(table, columns, staging, _read_columns(connection, staging, node.name))
        staged = _staged_attempts(connection, dialect, tables, delivery)
        kept = set(complete_attempts(staged))
        discarded = [found.attempt for found in staged if found.attempt not in kept]
        _replace_batch(connection, dialect, tables, batch_rows.columns, (producer, batch), delivery, discarded)
    finally:
        connection.close()


def write_staged(marked: Any, options: dict[str, str]) -> None:
    """Spark's executors append a batch's marked rows to the staging table (made on first use)."""
    marked.write.format("jdbc").options(**options).mode("append").save()


def _jdbc_connection(spark: Any, given: Mapping[str, str], url: str) -> tuple[Any, Any]:
    """(Spark's dialect for the URL, a connection on the driver made as Spark's JDBC writer makes
    its own, with the sink's options)."""
    jvm = spark._jvm
    options = jvm.java.util.HashMap()
    for name, value in given.items():
        options.put(name, value)
    jdbc = jvm.org.apache.spark.sql.execution.datasources.jdbc.JDBCOptions(
        jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(options))
    dialect = jvm.org.apache.spark.sql.jdbc.JdbcDialects.get(url)
    return dialect, dialect.createConnectionFactory(jdbc).apply(-1)


def _staged_attempts(connection: Any, dialect: Any, tables: _JdbcTables, delivery: str) -> list[StagedAttempt]:
    """Each task attempt of this delivery that staged rows (a task of an earlier delivery, a
    speculative copy or a driver's that died, may still be writing there)."""
    quote, staged = dialect.quoteIdentifier, tables.staging_columns
    marks = f"{quote(staged['millstream_partition'])}, {quote(staged['millstream_attempt'])}"
    query = connection.prepareStatement(f"SELECT {marks}, COUNT(*) FROM {tables.staging} WHERE "
                                        f"{quote(staged['millstream_delivery'])} = ? GROUP BY {marks}")
    query.setString(1, delivery)
    found = query.executeQuery()
    attempts = []
    try:
        while found.next():
            attempts.append(StagedAttempt(found.getInt(1), found.getLong(2), found.getLong(3)))
    finally:
        found.close()
    return attempts


def _replace_batch(connection: Any, dialect: Any, tables: _JdbcTables, copied: list[str], batch: tuple[str, int],
                   delivery: str, discarded: list[int]) -> None:
    """In one transaction: delete the rows of the batch (producer, batch id) from the table and the
    `discarded` attempts' rows from staging, copy the `copied` columns of this delivery's rows left
    in staging into the table, empty staging. The statements' text is the same in every delivery
    (a database may compile each one it has not seen)."""
    quote = dialect.quoteIdentifier
    producer, batch_id = batch
    delivery_column = quote(tables.staging_columns["millstream_delivery"])
    into = ", ".join(quote(tables.columns[name]) for name in copied)
    select = ", ".join(quote(tables.staging_columns[name]) for name in copied)
    autocommit = connection.getAutoCommit()
    connection.setAutoCommit(False)
    try:
        delete = connection.prepareStatement(
            f"DELETE FROM {tables.table} WHERE {quote(tables.columns['millstream_producer'])} = ? "
            f"AND {quote(tables.columns['millstream_batch'])} = ?")
        delete.setString(1, producer)
        delete.setLong(2, batch_id)
        delete.executeUpdate()
        faults.reached("sink-staged", producer)
        if discarded:  # a task's second commit, or an attempt that died half-way
            discard = connection.prepareStatement(
                f"DELETE FROM {tables.staging} WHERE {delivery_column} = ? AND "
                f"{quote(tables.staging_columns['millstream_attempt'])} = ?")
            for attempt in discarded:
                discard.setString(1, delivery)
                discard.setLong(2, attempt)
                discard.executeUpdate()
        insert = connection.prepareStatement(
            f"INSERT INTO {tables.table} ({into}) SELECT {select} FROM {tables.staging} WHERE {delivery_column} = ?")
        insert.setString(1, delivery)
        insert.executeUpdate()
        connection.prepareStatement(f"DELETE FROM {tables.staging}").executeUpdate()  # and what dead ones left
        connection.commit()
    except BaseException:
        try:
            connection.rollback()
        except Exception:
            pass  # the connection is gone; the error being raised says why
        raise
    finally:
        try:
            connection.setAutoCommit(autocommit)
        except Exception:
            pass


def complete_attempts(staged: list[StagedAttempt]) -> list[int]:
    """The task attempts whose staged rows make the batch: per partition, the attempt that wrote the
    most rows, the first of those that tie. Every attempt of a partition writes the same rows (read
    from the batch's published files); one that wrote fewer died half-way, on a database without
    transactions.

    >>> complete_attempts([StagedAttempt(0, 7, 300), StagedAttempt(1, 8, 120), StagedAttempt(0, 9, 300),
    ...                    StagedAttempt(1, 10, 50)])
    [7, 8]
    """
    best: dict[int, StagedAttempt] = {}
    for found in staged:
        kept = best.get(found.partition)
        if kept is None or (-found.rows, found.attempt) < (-kept.rows, kept.attempt):
            best[found.partition] = found
    return sorted(found.attempt for found in best.values())


def staging_table(table: str, root: str, sink: str, producer: str) -> str:
    """The staging table of a JDBC sink's deliveries from one producer: in the table's schema, named
    by the root, sink and producer (short enough for any database's limit on names).

    >>> staging_table("reports.windows", "/data/root", "db", "count")
    'reports.millstream_stage_06e0706c5d34'
    >>> staging_table('"my.db"."all.windows"', "/data/root", "db", "count")
    '"my.db".millstream_stage_06e0706c5d34'
    >>> staging_table("windows", "/data/root", "db", "count")
    'millstream_stage_06e0706c5d34'
    """
    closing = {'"': '"', "`": "`", "[": "]"}
    quote, last_dot = "", -1
    for at, char in enumerate(table):  # the last dot outside quotes ends the schema
        if quote:
            quote = "" if char == quote else quote
        elif char in closing:
            quote = closing[char]
        elif char == ".":
            last_dot = at
    digest = hashlib.blake2b(f"{root}\0{sink}\0{producer}".encode(), digest_size=6).hexdigest()
    return f"{table[:last_dot + 1]}millstream_stage_{digest}"


def _mark_attempt(batches: Any) -> Any:
    """Each staged row's Spark partition and task attempt: what tells a task's second commit apart
    from its first."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("_mark_attempt runs in Spark's tasks only")
    partition, attempt = context.partitionId(), context.taskAttemptId()
    for rows in batches:
        yield pa.RecordBatch.from_arrays(
            [*rows.columns, pa.array([partition] * rows.num_rows, pa.int32()),
             pa.array([attempt] * rows.num_rows, pa.int64())],
            names=[*rows.schema.names, "millstream_partition", "millstream_attempt"])


def _with_attempt_columns(schema: Any) -> Any:
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    return StructType([*schema.fields, StructField("millstream_partition", IntegerType(), False),
                       StructField("millstream_attempt", LongType(), False)])


def _jdbc_write_options(given: Mapping[str, str], compared: tuple[str, ...]) -> dict[str, str]:
    """The sink's options for Spark's JDBC writer, with comparable types for the `compared` string
    columns millstream finds rows by: Spark's default for a string column is a text type some
    databases cannot compare (Derby's CLOB)."""
    types = next((value for name, value in given.items() if name.lower() == "createtablecolumntypes"), "")
    write = {name: value for name, value in given.items()
             if name.lower() not in ("createtablecolumntypes", "dbtable")}
    for column in compared:
        if column not in types:
            types = ", ".join(filter(None, (types, f"{column} VARCHAR(64)")))
    write["createTableColumnTypes"] = types
    return write


def _drop_table(connection: Any, table: str) -> None:
    connection.prepareStatement(f"DROP TABLE {table}").executeUpdate()
    if not connection.getAutoCommit():
        connection.commit()


def _index_batches(connection: Any, dialect: Any, table: str) -> None:
    """An index on the batch columns of a table this delivery created, so the next deliveries'
    deletes do not scan it; best effort (a database may refuse the name, or the right to create it)."""
    index = "millstream_" + re.sub(r"\W", "_", table)[:19]
    try:
        connection.prepareStatement(
            f"CREATE INDEX {index} ON {table} ({dialect.quoteIdentifier('millstream_producer')}, "
            f"{dialect.quoteIdentifier('millstream_batch')})").executeUpdate()
        if not connection.getAutoCommit():
            connection.commit()
    except Exception:
        if not connection.getAutoCommit():
            connection.rollback()


def _jdbc_columns(connection: Any, table: str) -> dict[str, str] | None:
    """The table's column names as the database spells them, by their lower-case name; None when
    there is no such table."""
    try:
        return _read_columns(connection, table, "")
    except SinkError:
        return None


def _read_columns(connection: Any, table: str, sink: str) -> dict[str, str]:
    """`_jdbc_columns` of a table that must be there (Spark's own test for a table: a query that
    reads no row); the database's reason in one line where it cannot be read."""
    try:
        rows = connection.prepareStatement(f"SELECT * FROM {table} WHERE 1 = 0").executeQuery()
    except Exception as error:
        raise SinkError(f"sink {sink!r}: table {table} cannot be read: {_java_reason(error)}") from None
    try:
        meta = rows.getMetaData()
        return {meta.getColumnName(i).lower(): meta.getColumnName(i) for i in range(1, meta.getColumnCount() + 1)}
    finally:
        rows.close()


def sink_deliverers(spark: Any, root: str, pipeline: Pipeline,
                    strong: set[str]) -> dict[str, tuple[SinkNode, list[str], SinkFunction]]:
    """Each sink with the computations it receives from and how it is delivered."""
    found: dict[str, tuple[SinkNode, list[str], SinkFunction]] = {}
    layout = read_layout(Storage(root))
    identity = layout.identity if layout is not None else None
    for node in pipeline.sinks.values():
        producers = [p for p in pipeline.producers(node.stream) if p in strong]
        if node.is_file_sink:
            def deliver(producer: str, batch: int, entry: dict[str, Any], node: SinkNode = node) -> None:
                deliver_file_sink(root, node, producer, batch, entry, pipeline.codec(node.stream), identity)
        else:
            def deliver(producer: str, batch: int, entry: dict[str, Any], node: SinkNode = node) -> None:
                deliver_with_spark(spark, pipeline, node, producer, batch, entry, root)
        found[node.name] = (node, producers, deliver)
    return found
