"""Storage and publication logs on a local directory and on an S3 endpoint: the same calls, the same
results, writes visible whole or not at all, create-if-absent atomic, older epochs fenced."""

import json
import pickle
import threading

import pyarrow as pa
import pytest

from millstream.spark.publog import Fenced, FencedWriter, PublicationLog
from millstream.spark.storage import Storage


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue("s3_server").location("root")


def test_storage_reads_writes_lists_and_travels_pickled(location):
    storage = Storage(location)
    assert storage.read("a/missing.json") is None and storage.list("a") == [] and not storage.exists("a/x")
    storage.write_json("a/one.json", {"n": 1})
    storage.write("a/two.bin", b"\x00\x01")
    storage.write_json("a/one.json", {"n": 2})  # replaced whole
    assert storage.list("a") == ["one.json", "two.bin"]
    assert storage.read_json("a/one.json") == {"n": 2} and storage.read("a/two.bin") == b"\x00\x01"
    child = storage.child("status/comp")
    child.write_json("latest.json", {"batch": 3})
    assert storage.read_json("status/comp/latest.json") == {"batch": 3}
    assert pickle.loads(pickle.dumps(child)).read_json("latest.json") == {"batch": 3}
    storage.write_parquet("t.parquet", pa.table({"x": [1, 2]}))
    assert storage.read_parquet("t.parquet").to_pydict() == {"x": [1, 2]}
    assert "test:test" not in storage.describe("x"), "credentials must not reach messages"


def test_create_is_atomic_and_first_writer_wins(location):
    storage = Storage(location)
    assert storage.create("c/x.json", b"first")
    assert not storage.create("c/x.json", b"second")
    assert storage.read("c/x.json") == b"first"
    # Racing writers: exactly one of them gets the name, and what is there is whole.
    winners = []

    def race(n):
        if storage.create("c/race.json", json.dumps({"writer": n, "pad": "x" * 50_000}).encode()):
            winners.append(n)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1 and storage.read_json("c/race.json")["writer"] == winners[0]


def test_publication_log_orders_entries_and_fences_an_older_epoch(location):
    log = PublicationLog(location, "comp")
    assert log.head() == -1 and log.last_batch() == (-1, None)
    old = FencedWriter(log, epoch=1, next_position=0)
    assert old.append({"type": "claim", "checkpoint": "c1"}) == 0
    assert old.append({"type": "batch", "batch": 0, "output": [5], "streams": {}, "status": {}}) == 1
    # A second driver claims the next position with a newer epoch...
    new = FencedWriter(log, epoch=2, next_position=log.head() + 1)
    assert new.append({"type": "claim", "checkpoint": "c2"}) == 2
    # ... and the first one, still running, can never publish again.
    with pytest.raises(Fenced, match="epoch 2"):
        old.append({"type": "batch", "batch": 1, "output": [9], "streams": {}, "status": {}})
    assert new.append({"type": "batch", "batch": 1, "output": [7], "streams": {}, "status": {}}) == 3
    assert [(p, e["type"], e["epoch"]) for p, e in log.entries_after(-1, 10)] == [
        (0, "claim", 1), (1, "batch", 1), (2, "claim", 2), (3, "batch", 2)]
    assert log.last_batch()[1]["output"] == [7] and log.last_claim()["checkpoint"] == "c2"
    assert log.entries_after(1, 1) == [(2, log.read(2))]


def test_a_json_file_caught_mid_replacement_is_read_again(tmp_path, monkeypatch):
    storage = Storage(str(tmp_path))
    storage.write_json("latest.json", {"batch": 7})
    reads = iter([b'{"batch": 6, "low_wat', b'{"batch": 7}'])  # the first read sees half a replacement
    monkeypatch.setattr(storage, "read", lambda path: next(reads))
    assert storage.read_json("latest.json") == {"batch": 7}


def test_a_file_moves_to_a_sink_on_another_local_filesystem(tmp_path):
    """A sink directory on another mount than the root (here a tmpfs): a rename cannot cross it, so
    the file is copied whole under a temporary name there, then renamed."""
    import os
    import uuid

    other = "/dev/shm"
    if not os.access(other, os.W_OK) or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip(f"{other} is not a writable filesystem apart from {tmp_path}")
    sink_dir = os.path.join(other, f"millstream-test-{uuid.uuid4().hex}")
    try:
        root, sink = Storage(str(tmp_path / "root")), Storage(sink_dir)
        root.write("staging/part-0.jsonl", b'{"n": 1}\n' * 1000)
        root.move_to("staging/part-0.jsonl", sink, "p-000000000001-part-0.jsonl")
        assert sink.read("p-000000000001-part-0.jsonl") == b'{"n": 1}\n' * 1000
        assert os.listdir(sink_dir) == ["p-000000000001-part-0.jsonl"]
        assert not root.exists("staging/part-0.jsonl")
    finally:
        import shutil

        shutil.rmtree(sink_dir, ignore_errors=True)


def test_a_file_moves_between_two_locations_of_one_object_store_without_passing_through_this_process(
        s3_server, monkeypatch):
    """A remote root and a file sink on the same store: the store copies the object itself, so the
    driver delivering a batch never carries its bytes."""
    root, sink = Storage(s3_server.location("root")), Storage(s3_server.location("sink"))
    root.write("staging/part-0.jsonl", b'{"n": 1}\n' * 1000)

    def no_read(self, path):
        raise AssertionError(f"read {path} through this process")

    monkeypatch.setattr(Storage, "read", no_read)
    root.move_to("staging/part-0.jsonl", sink, "p-000000000001-part-0.jsonl")
    monkeypatch.undo()
    assert sink.read("p-000000000001-part-0.jsonl") == b'{"n": 1}\n' * 1000
    assert not root.exists("staging/part-0.jsonl")


def test_a_copy_to_another_filesystem_that_fails_leaves_nothing_a_reader_of_the_sink_sees(tmp_path, monkeypatch):
    """Spark's readers skip names starting with '.' or '_': a copy in progress, or one that failed,
    must not be read as a file of the sink."""
    import errno
    import os
    import shutil

    from millstream.spark import storage

    root, sink = Storage(str(tmp_path / "root")), Storage(str(tmp_path / "sink"))
    root.write("staging/part-0.jsonl", b'{"n": 1}\n' * 100_000)
    real_replace = os.replace

    def replace(source, target):
        if "/staging/" in source:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_replace(source, target)

    def copy_half(source, target, size):
        target.write(source.read(1 << 16))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.os, "replace", replace)
    monkeypatch.setattr(storage.shutil, "copyfileobj", copy_half)
    with pytest.raises(OSError, match="No space left"):
        root.move_to("staging/part-0.jsonl", sink, "p-000000000001-part-0.jsonl")
    assert [name for name in os.listdir(tmp_path / "sink") if not name.startswith((".", "_"))] == []
    assert root.exists("staging/part-0.jsonl")
    monkeypatch.undo()
    shutil.rmtree(tmp_path / "sink")
