"""Tunables: Windower throughput through millstream at 1e4 keys (the throughput benchmark's job) as
SparkRunner settings vary one at a time: key_groups, parallelism, and fixed batch caps against batch
pacing (max_records_per_batch; None, the default, paces). One local[2] session, a warm-up run first;
output checked against the exact answer in every run."""

from __future__ import annotations

from bench.common import cli, expected_windows, spark_session
from bench.throughput import run_millstream


def main(quick: bool) -> dict:
    keys, total = 10_000, (60_000 if quick else 300_000)
    defaults = {"key_groups": 32, "parallelism": 2, "max_records_per_batch": None}
    settings = [defaults,
                {**defaults, "key_groups": 8}, {**defaults, "key_groups": 128},
                {**defaults, "parallelism": 1}, {**defaults, "parallelism": 8},
                {**defaults, "max_records_per_batch": 200_000}, {**defaults, "max_records_per_batch": 400_000}]
    if quick:
        settings = settings[:2]
    spark = spark_session(log_name="tune")
    run_millstream(spark, False, 1_000, 20_000, timeout=900, tag="warmup", check=False)
    expected = expected_windows(keys, total)
    rows = []
    for n, s in enumerate(settings):
        r = run_millstream(spark, True, keys, total, timeout=1800, tag=f"tune{n}", **s)
        r["matches_expected"] = r.pop("_output") == expected
        rows.append({**s, **r})
        print(f"[tune] {s} -> {r['records_per_s']} rec/s (output ok {r['matches_expected']})", flush=True)
    return {"keys": keys, "records": total, "results": rows}


if __name__ == "__main__":
    cli("tune", main)
