"""The reading side of DataFrameInjector over staged batches written here by hand (the layout of
injectors/dataframe.py's module doc), without Spark: offsets, caps, ids, dead letters, the watermark
bound, the end of a bounded input, and retention of staged batches."""

from __future__ import annotations

import pyarrow as pa
import pytest

from millstream import END_OF_TIME, DataFrameInjector, Malformed, PipelineError
from millstream.spark.storage import Storage

KEY, TS, ID = "__millstream_key", "__millstream_ts", "__millstream_id"


def stage(storage, batch, partition_rows, max_event_time, staged_ms=0):
    """Stage one batch: {partition: [(key, ts, id, amount)]}."""
    files, rows = {}, {}
    for partition, items in partition_rows.items():
        path = f"data/{batch:012d}/{partition}/a.parquet"
        storage.write_parquet(path, pa.table({KEY: [i[0] for i in items], TS: [i[1] for i in items],
                                              ID: [i[2] for i in items], "amount": [i[3] for i in items]}))
        files[partition], rows[partition] = [path], len(items)
    storage.create_json(f"batches/{batch:012d}.json", {"batch": batch, "files": files, "rows": rows,
                                                       "max_event_time": max_event_time, "staged_ms": staged_ms})


@pytest.fixture
def injector(tmp_path):
    inj = DataFrameInjector(None, key="user", timestamp="ts", id="event", partitions=2,
                            max_out_of_orderness_ms=1_000, name="clicks")
    inj.stage_to(Storage(str(tmp_path)))
    return inj


def read_all(inj, partition, start, end):
    return [(r.key, r.timestamp, r.id, r.value["amount"]) if not isinstance(r, Malformed) else ("dead", r.error)
            for r in inj.read(partition, start, end)]


def test_offsets_cover_whole_batches_up_to_the_cap_and_replays_read_the_same(injector, tmp_path):
    staged = Storage(str(tmp_path))
    start = injector.initial_offset("0")
    assert injector.latest_offset("0", start, None) == start  # nothing staged yet
    stage(staged, 0, {"0": [("a", 5_000, "e1", 1), ("b", 5_100, "e2", 2)], "1": [("c", 4_000, "e3", 3)]}, 5_100)
    stage(staged, 1, {"0": [("a", 7_000, "e4", 4), (None, 7_100, "e5", 5)]}, 7_100)
    stage(staged, 2, {"1": [("c", 9_000, "e6", 6)]}, 9_000)
    capped = injector.latest_offset("0", start, 2)
    assert capped == {"batch": 0, "max_event_time": 5_100, "end": False}
    assert injector.low_watermark("0", capped) == 4_100  # the largest event time staged, less the bound
    end = injector.latest_offset("0", capped, None)
    assert end["batch"] == 2 and injector.low_watermark("0", end) == 8_000
    assert read_all(injector, "0", start, capped) == [("a", 5_000, "clicks:e1", 1), ("b", 5_100, "clicks:e2", 2)]
    assert read_all(injector, "0", capped, end) == [("a", 7_000, "clicks:e4", 4), ("dead", "null key column")]
    assert read_all(injector, "0", capped, end) == read_all(injector, "0", capped, end)
    assert read_all(injector, "1", start, end) == [("c", 4_000, "clicks:e3", 3), ("c", 9_000, "clicks:e6", 6)]


def test_a_bounded_input_ends_once_all_of_it_is_read(injector, tmp_path):
    staged = Storage(str(tmp_path))
    stage(staged, 0, {"0": [("a", 5_000, "e1", 1)]}, 5_000)
    first = injector.latest_offset("0", injector.initial_offset("0"), None)
    assert injector.low_watermark("0", first) == 4_000
    injector.mark_ended()
    ended = injector.latest_offset("0", first, None)
    assert ended["end"] and injector.low_watermark("0", ended) == END_OF_TIME
    assert read_all(injector, "0", first, ended) == []


def test_retention_deletes_what_every_reader_is_past_and_keeps_the_newest(injector, tmp_path):
    staged = Storage(str(tmp_path))
    for batch in range(5):
        stage(staged, batch, {"0": [("a", 1_000 * batch, f"e{batch}", batch)]}, 1_000 * batch,
              staged_ms=100 if batch < 4 else 900)
    assert injector.prune_staged(read_up_to=2, cutoff_ms=500) == 3  # 0..2: read by all, old enough
    assert staged.list("batches") == ["000000000003.json", "000000000004.json"]
    assert staged.list("data") == ["000000000003", "000000000004"]
    assert injector.prune_staged(read_up_to=4, cutoff_ms=500) == 1  # 4 is too young and the newest
    # A reader added later, from the earliest, starts at the oldest batch kept.
    late = injector.latest_offset("0", injector.initial_offset("0"), None)
    assert late["batch"] == 4
    assert read_all(injector, "0", injector.initial_offset("0"), late) == [("a", 4_000, "clicks:e4", 4)]


def test_the_harness_cannot_run_it_and_says_why():
    inj = DataFrameInjector(None, key="user", timestamp="ts")
    with pytest.raises(PipelineError, match="runs on SparkRunner only"):
        inj.latest_offset("0", inj.initial_offset("0"), None)


def test_a_timestamp_out_of_range_is_a_dead_letter_and_does_not_move_the_watermark(injector, tmp_path):
    """Epoch microseconds in a long column: each such row is Malformed, and the staging task's report
    of the largest event time leaves it out (else the watermark would jump past every later row)."""
    from millstream.injectors.dataframe import _FileWriter

    staged = Storage(str(tmp_path))
    rows = pa.RecordBatch.from_pydict({KEY: ["a", "b"], TS: [5_000, 1_732_886_400_000_000], ID: ["e1", "e2"],
                                       "amount": [1, 2], "__millstream_partition": [0, 0]})
    [report] = list(_FileWriter(staged, 0)(iter([rows])))
    assert report.to_pylist()[0]["max_ts"] == 5_000
    stage(staged, 0, {"0": [("a", 5_000, "e1", 1), ("b", 1_732_886_400_000_000, "e2", 2)]}, 5_000)
    end = injector.latest_offset("0", injector.initial_offset("0"), None)
    [record, dead] = read_all(injector, "0", injector.initial_offset("0"), end)
    assert record == ("a", 5_000, "clicks:e1", 1)
    assert dead[0] == "dead" and "timestamp is 1732886400000000, outside" in dead[1]
