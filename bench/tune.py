"""Tunables: Windower throughput through millstream at 1e4 keys as SparkRunner settings vary
(shards, pages_per_shard, max_records_per_batch), one Spark session, one setting changed at a time."""

from __future__ import annotations

from bench.common import ProgressCollector, cli, spark_session
from bench.throughput import run_millstream


def main(quick: bool) -> dict:
    keys, total = 10_000, (60_000 if quick else 150_000)
    settings = [
        {"shards": 8, "pages_per_shard": 32, "max_records_per_batch": 50_000},  # defaults (+ injector cap)
        {"shards": 2, "pages_per_shard": 32, "max_records_per_batch": 50_000},
        {"shards": 32, "pages_per_shard": 32, "max_records_per_batch": 50_000},
        {"shards": 8, "pages_per_shard": 32, "max_records_per_batch": 20_000},
        {"shards": 8, "pages_per_shard": 32, "max_records_per_batch": 100_000},
    ]
    if quick:
        settings = settings[:2]
    spark = spark_session(log_name="tune")
    collector = ProgressCollector(spark)
    rows = []
    for s in settings:
        r = run_millstream(spark, collector, keys, total, timeout=900, **s)
        r.pop("_output")
        rows.append({**s, **r})
        print(f"[tune] {s} -> {r['records_per_s']} rec/s", flush=True)
    return {"keys": keys, "records": total, "results": rows}


if __name__ == "__main__":
    cli("tune", main)
