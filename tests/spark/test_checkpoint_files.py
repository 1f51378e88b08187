"""What millstream's exactly-once relies on in Spark's checkpoint files, through the checkpoint file
manager the session gives Spark's queries (millstream's own, spark/jvm, where a JDK compiled it): a
state store file of a re-run attempt replaces the first attempt's, and a batch's offsets or commit
file is never replaced by a second writer.

Spark's FileSystem-based manager (`spark.sql.streaming.checkpointFileManagerClass`) starts fewer
processes per file on a local disk, but there it keeps the first attempt's file when asked to replace
it: a batch re-run after a kill then restores the killed attempt's state (docs/performance.md, ninth
session). The first test fails with it."""

import os

import pytest
from py4j.protocol import Py4JJavaError

from millstream.spark import jvm


def file_manager(spark, directory):
    """The CheckpointFileManager Spark's queries of this session get for `directory`."""
    java = spark._jvm
    managers = java.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return managers.create(java.org.apache.hadoop.fs.Path(str(directory)),
                           spark._jsparkSession.sessionState().newHadoopConf())


def write_atomically(spark, manager, path, content: bytes, replace: bool) -> None:
    """As Spark writes a checkpoint file: to a temporary file, renamed into place on close. The
    state store's changelog of version N replaces an earlier attempt's (`replace`); the offset and
    commit logs' batch N never does. Each makes its directory first."""
    manager.mkdirs(spark._jvm.org.apache.hadoop.fs.Path(str(path.parent)))
    stream = manager.createAtomic(spark._jvm.org.apache.hadoop.fs.Path(str(path)), replace)
    stream.write(bytearray(content))
    stream.close()


def visible(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if not name.startswith("."))


def millstream_manager(spark, directory):
    """The session's manager for `directory`, which must be millstream's (skips without a JDK)."""
    if jvm.jar() is None:
        pytest.skip("no JDK (javac) here: sessions keep Spark's default checkpoint file manager")
    manager = file_manager(spark, directory)
    assert manager.getClass().getName() == jvm.CHECKPOINT_FILE_MANAGER
    return manager


def test_a_rerun_attempts_state_file_replaces_the_first_attempts(spark, tmp_path):
    manager = file_manager(spark, tmp_path)
    changelog = tmp_path / "state" / "0" / "1" / "4.changelog"
    write_atomically(spark, manager, changelog, b"the killed attempt's changes", replace=True)
    write_atomically(spark, manager, changelog, b"the re-run's changes", replace=True)
    assert changelog.read_bytes() == b"the re-run's changes"
    # No temporary file left, nor its checksum (Spark's default manager keeps one beside the file).
    assert [name for name in os.listdir(changelog.parent) if name != ".4.changelog.crc"] == ["4.changelog"]


def test_a_replaced_file_keeps_no_checksum_of_the_file_it_replaced(spark, tmp_path):
    """A root written before by Spark's default manager has a checksum beside each file: once the
    file is replaced, a checksum left behind would fail any reader that checks it."""
    manager = millstream_manager(spark, tmp_path)
    changelog = tmp_path / "state" / "0" / "1" / "5.changelog"
    write_atomically(spark, manager, changelog, b"the killed attempt's changes", replace=True)
    checksum = changelog.parent / ".5.changelog.crc"
    checksum.write_bytes(b"Spark's default manager's checksum of the killed attempt's changes")
    write_atomically(spark, manager, changelog, b"the re-run's changes", replace=True)
    assert changelog.read_bytes() == b"the re-run's changes"
    assert not checksum.exists()


def test_a_batch_file_is_never_replaced_by_a_second_writer(spark, tmp_path):
    manager = file_manager(spark, tmp_path)
    batch = tmp_path / "offsets" / "7"
    write_atomically(spark, manager, batch, b"the first attempt", replace=False)
    with pytest.raises(Py4JJavaError) as refused:
        write_atomically(spark, manager, batch, b"a zombie's attempt", replace=False)
    # Spark's metadata logs tell a second writer by this exception's type.
    assert refused.value.java_exception.getClass().getName() == "org.apache.hadoop.fs.FileAlreadyExistsException"
    assert batch.read_bytes() == b"the first attempt"
    # The refused attempt's temporary file is gone (Spark leaves its hidden checksum file; the
    # offset log lists no hidden file).
    assert visible(batch.parent) == ["7"]
