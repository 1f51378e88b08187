"""The chaos check reads what was published, and only that: a killed driver's temporary file beside
a log entry (written, never linked into place) is not part of the log. A chaos run on 2026-11-29
reported 24 duplicated ledger entries that were such a file's."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from millstream.chaos.verify import published, stamped_behind


def write_entry(path, batch, parquet, output):
    path.write_text(json.dumps({"type": "batch", "batch": batch, "output": output,
                                "streams": {"out": [[str(parquet), 1]]}}))


def test_published_skips_a_killed_driver_s_temporary_entry_file(tmp_path):
    log = tmp_path / "run" / "log" / "calc"
    log.mkdir(parents=True)
    for name, ts in (("a", 5), ("b", 7)):
        pq.write_table(pa.table({"key": ["k"], "value": [json.dumps({"n": name})], "timestamp": [ts],
                                 "id": [name], "segment": [0]}), tmp_path / f"{name}.parquet")
    (log / "000000000000.json").write_text(json.dumps({"type": "claim", "epoch": 1}))
    write_entry(log / "000000000001.json", 0, tmp_path / "a.parquet", [10])
    # The next driver published its own entry at the position the killed one had written a file for.
    write_entry(log / "000000000002.json.tmp-4078-64d16d6a", 1, tmp_path / "b.parquet", [6])
    write_entry(log / "000000000002.json", 1, tmp_path / "b.parquet", [20])
    assert [r["id"] for r in published(str(tmp_path / "run"), "calc", "out")] == ["a", "b"]
    assert stamped_behind(str(tmp_path / "run"), "calc", "out") == ["b"]  # 7 behind the 10 before it
