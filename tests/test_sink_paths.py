"""The stream-log files a Spark-writer, table, JDBC or user-writer sink's dataframe is read from, as
Spark is given them: a remote root's with its scheme (the publication log records them as the root's
filesystem names them, without it), a local root's as recorded."""

from millstream.spark.sinks import spark_paths
from millstream.spark.storage import Storage


def entry_of(files):
    return {"streams": {"windows": files, "other": [("elsewhere/x.parquet", 4)]}}


def test_a_remote_root_s_files_reach_spark_with_the_root_s_scheme():
    for root, scheme in (("s3://bucket/roots/clicks?endpoint_override=127.0.0.1:9000&scheme=http", "s3"),
                         ("s3a://bucket/roots/clicks", "s3a"), ("gs://bucket/roots/clicks", "gs")):
        recorded = [f"bucket/roots/clicks/streams/count/000000000003/at/windows-0000{n}-1.parquet" for n in range(3)]
        entry = entry_of([(recorded[0], 5), (recorded[1], 0), (recorded[2], 2)])
        assert spark_paths(root, entry, "windows") == [f"{scheme}://{recorded[0]}", f"{scheme}://{recorded[2]}"]


def test_a_local_root_s_files_reach_spark_as_recorded(tmp_path):
    storage = Storage(str(tmp_path / "root"))
    recorded = [storage.full_path(f"streams/count/000000000003/at/windows-0000{n}-1.parquet") for n in range(2)]
    entry = entry_of([(recorded[0], 3), (recorded[1], 1)])
    assert spark_paths(str(tmp_path / "root"), entry, "windows") == recorded
    assert spark_paths(f"file://{tmp_path}/root", entry, "windows") == recorded
    assert spark_paths(str(tmp_path / "root"), entry, "absent") == []
