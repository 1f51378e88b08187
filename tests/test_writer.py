"""The executors' batch writer (millstream/spark/writer.py) without Spark: what a task's stream-log
files hold for the operator rows it is given."""

import gc
import random

import pyarrow as pa
import pyarrow.parquet as pq

from millstream.core.garbage import BULK_THRESHOLD
from millstream.core.production import Produced, order_base
from millstream.spark.bundles import pack_production_columns
from millstream.spark.operator import METRICS
from millstream.spark.storage import Storage
from millstream.spark.writer import BatchWriter


def operator_rows(productions: list[Produced], groups: int, per_bundle: int) -> pa.RecordBatch:
    """The operator's output for these productions, as operator.output_rows gives it: each group's share
    in bundles, counters on rows (a group without productions: one row without a bundle)."""
    rows = []
    for group in range(groups):
        share = productions[group::groups]
        for start in range(0, max(len(share), 1), per_bundle):
            chunk = share[start:start + per_bundle]
            counters = {("productions_count" if m == "productions" else m): 1 for m in METRICS}
            rows.append({"key_group": group, "productions": pack_production_columns(chunk) if chunk else None,
                         "computation": "win", **counters, "wake_wall": None, "bytes_written": 0,
                         "upstream_reports": None, "holds": None})
    return pa.RecordBatch.from_pylist(rows)


def test_each_stream_gets_one_file_in_segment_then_order_order_and_collections_wait(tmp_path, monkeypatch):
    rng = random.Random(7)
    productions = []
    for i in range(3_000):
        key = f"k{rng.randrange(200)}"
        productions.append(Produced(rng.choice(["windows", "alerts"]), key, f"v{i}".encode(), rng.randrange(10**6),
                                    f"id{i}", rng.randrange(3), order_base(key) + i))  # (segment, order) unique
    rng.shuffle(productions)
    thresholds = []
    write_parquet = Storage.write_parquet

    def noting_the_collector(self, path, table):
        thresholds.append(gc.get_threshold())
        write_parquet(self, path, table)

    monkeypatch.setattr(Storage, "write_parquet", noting_the_collector)
    before = gc.get_threshold()
    out = list(BatchWriter(str(tmp_path), "win", 7, "attempt", ())(iter([operator_rows(productions, 5, 100),
                                                                      operator_rows([], 2, 100)])))

    assert gc.get_threshold() == before
    assert thresholds and all(t[0] >= BULK_THRESHOLD[0] for t in thresholds)
    [summary] = out[0].to_pylist()
    assert sorted(f["stream"] for f in summary["files"]) == ["alerts", "windows"]
    assert len(summary["reports"]) == len(operator_rows(productions, 5, 100)) + 2
    for written in summary["files"]:
        table = pq.read_table(written["path"]).to_pylist()
        expected = sorted((p for p in productions if p.stream == written["stream"]),
                          key=lambda p: (p.segment, p.order))
        assert written["rows"] == len(expected) == len(table)
        assert [(r["key"], r["value"], r["timestamp"], r["id"], r["segment"], r["order_key"] << 32 | r["order_seq"])
                for r in table] == [(p.key, p.value, p.timestamp, p.id, p.segment, p.order) for p in expected]


def test_a_file_sink_gets_its_stream_s_records_decoded_in_output_order(tmp_path):
    import json

    from millstream.model.codecs import JsonCodec
    from millstream.spark.writer import FileSink

    codec = JsonCodec()
    rng = random.Random(11)
    productions = [Produced(rng.choice(["windows", "alerts"]), f"k{i % 13}", codec.encode({"n": i, "tag": f"t{i}"}),
                            1_000 + i, f"id{i}", rng.randrange(3), order_base(f"k{i % 13}") + i) for i in range(400)]
    rng.shuffle(productions)
    sinks = (FileSink("lines", "alerts", str(tmp_path / "out"), "jsonl", codec),
             FileSink("table", "alerts", str(tmp_path / "out2"), "parquet", codec))
    [summary] = list(BatchWriter(str(tmp_path), "win", 3, "attempt", sinks)(iter([operator_rows(productions, 4, 30)])))[0].to_pylist()

    expected = [{"key": p.key, "timestamp": p.timestamp, "id": p.id, "value": json.loads(p.value)}
                for p in sorted((p for p in productions if p.stream == "alerts"), key=lambda p: (p.segment, p.order))]
    by_sink = {f["sink"]: f for f in summary["sink_files"]}
    assert by_sink["lines"]["rows"] == by_sink["table"]["rows"] == len(expected)
    storage = Storage(str(tmp_path))
    lines = [json.loads(line) for line in storage.read(by_sink["lines"]["path"]).decode().splitlines()]
    assert lines == expected
    table = pq.read_table(pa.BufferReader(storage.read(by_sink["table"]["path"]))).to_pylist()
    assert table == [{"key": e["key"], "timestamp": e["timestamp"], "id": e["id"], **e["value"]} for e in expected]


def parquet_sink_rows(values, codec=None):
    """The rows of the Parquet sink file of records k<i> (timestamp 100 + i, id r<i>) with these
    values, in the order given, as pyarrow reads them back."""
    from millstream.model.codecs import JsonCodec
    from millstream.spark.writer import log_tables, sink_file

    codec = codec or JsonCodec()
    productions = [Produced("out", f"k{i}", codec.encode(value), 100 + i, f"r{i}", 0, order_base("k") + i)
                   for i, value in enumerate(values)]
    [table] = log_tables(list(zip(*productions))).values()
    return pq.read_table(pa.BufferReader(sink_file(table, "parquet", codec))).to_pylist()


def test_a_parquet_sink_keeps_every_value_field_whichever_rows_hold_it():
    values = [{"n": i, **({"note": f"every fifth {i}"} if i % 5 == 3 else {})} for i in range(40)]
    rows = parquet_sink_rows(values)
    assert [(row["n"], row["note"]) for row in rows] == [(value["n"], value.get("note")) for value in values]
    assert sum(row["note"] is not None for row in rows) == 8


def test_a_parquet_sink_never_overwrites_a_record_s_key_timestamp_or_id_with_a_value_field():
    values = [{"id": f"user-{i}", "key": i * 2, "timestamp": "late", "n": i, "value.id": "own"} for i in range(6)]
    rows = parquet_sink_rows(values)
    assert [(row["key"], row["timestamp"], row["id"]) for row in rows] == [(f"k{i}", 100 + i, f"r{i}")
                                                                          for i in range(6)]
    assert [{name: row[name] for name in ("value.id", "value.key", "value.timestamp", "n", "value.value.id")}
            for row in rows] == [{"value.id": v["id"], "value.key": v["key"], "value.timestamp": v["timestamp"],
                                  "n": v["n"], "value.value.id": v["value.id"]} for v in values]


def test_a_parquet_sink_writes_a_field_of_mixed_types_as_json_text_and_the_others_as_they_are():
    import json

    values = [{"value": i if i % 3 else f"text {i}", "n": i, "big": 1 << 70 if i == 4 else i,
               "maybe": None if i % 2 else [i, {"deep": i}], "empty": {} if i % 2 else None} for i in range(9)]
    rows = parquet_sink_rows(values)
    assert [row["n"] for row in rows] == list(range(9))  # one type: kept as it is
    assert [row["value"] for row in rows] == [json.dumps(v["value"]) for v in values]
    assert [row["big"] for row in rows] == [json.dumps(v["big"]) for v in values]
    assert [row["maybe"] for row in rows] == [None if v["maybe"] is None else json.dumps(v["maybe"]) for v in values]
    # one type, but one Parquet cannot hold (a struct without fields)
    assert [row["empty"] for row in rows] == [None if v["empty"] is None else "{}" for v in values]


def test_a_parquet_sink_of_plain_values_keeps_them_in_the_value_column():
    values = [7, 8, 9]
    assert parquet_sink_rows(values) == [{"key": f"k{i}", "timestamp": 100 + i, "id": f"r{i}", "value": v}
                                         for i, v in enumerate(values)]


def test_a_parquet_sink_keeps_apart_dict_fields_whose_names_read_alike():
    # Under pickle a dict may hold 3 and "3" (or 3 and 3.0 apart from True): one column each, none lost.
    from millstream.model.codecs import PickleCodec

    values = [{3: "int", "3": "str", 2.5: "float", (1, 2): "tuple", "value.3": "prefixed"}]
    [row] = parquet_sink_rows(values, PickleCodec())
    fields = {name: row[name] for name in row if name not in ("key", "timestamp", "id")}
    assert sorted(fields.values()) == sorted(values[0].values())
    assert fields["3"] == "str" and fields["value.value.3"] == "prefixed"
