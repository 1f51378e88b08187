"""Storage and stream logs on a local directory and on an S3 endpoint: the same calls, the same
results, writes visible whole or not at all, and commits idempotent by batch id."""

import pickle

import pyarrow as pa
import pytest

from millstream.core.executor import Produced
from millstream.spark.storage import Storage
from millstream.spark.streamlog import StreamLog, productions_table


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


def test_stream_log_commits_once_per_batch_and_reads_back_in_order(location):
    log = StreamLog(location)

    def batch(n):
        return productions_table([Produced("s", f"k{i}", b"1", n * 10 + i, f"id{n}-{i}") for i in range(n)])

    assert log.append("s", "p", 0, batch(2), watermark=100)
    assert log.append("s", "p", 1, batch(0), watermark=150)  # empty batches commit their watermark
    assert log.append("s", "p", 2, batch(3), watermark=200)
    assert not log.append("s", "p", 2, batch(5), watermark=999), "a replayed batch must not be written twice"
    commits = log.commits_after("s", "p", -1, limit=10)
    assert [(c.batch, c.watermark, c.rows) for c in commits] == [(0, 100, 2), (1, 150, 0), (2, 200, 3)]
    assert log.commits_after("s", "p", 0, limit=1)[0].batch == 1
    assert log.first_uncommitted("s", "p") == 3
    ids = [i for _, table in log.read_all("s", ["p"]) for i in table["id"].to_pylist()]
    assert ids == ["id2-0", "id2-1", "id3-0", "id3-1", "id3-2"]


def test_a_json_file_caught_mid_replacement_is_read_again(tmp_path, monkeypatch):
    storage = Storage(str(tmp_path))
    storage.write_json("latest.json", {"batch": 7})
    reads = iter([b'{"batch": 6, "low_wat', b'{"batch": 7}'])  # the first read sees half a replacement
    monkeypatch.setattr(storage, "read", lambda path: next(reads))
    assert storage.read_json("latest.json") == {"batch": 7}
