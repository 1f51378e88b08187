"""Benchmark 4: records/s and peak memory as distinct keys and input size grow (millstream only).

Each configuration runs the Windower through SparkRunner in a fresh process (so peaks are not
inherited), with a sampler summing the RSS of the driver, the JVM and every Python worker twice a
second. Input is scaled down from 1e7 to 1e6 records to fit the suite's time budget: see the `scaled`
note in the output.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import ProgressCollector, TreeMemory, cli, spark_session


def one(keys: int, total: int) -> dict:
    from bench import throughput

    with TreeMemory() as memory:
        spark = spark_session(log_name="growth")
        collector = ProgressCollector(spark)
        result = throughput.run_millstream(spark, collector, keys, total, timeout=1200)
    result.pop("_output")
    result.pop("durationMs")
    return {"keys": keys, "records": total, **result, "peak_rss_mb": memory.peak_mb()}


def main(quick: bool) -> dict:
    if quick:
        by_keys = [(1_000, 40_000), (100_000, 40_000)]
        by_input = [(10_000, 40_000), (10_000, 100_000)]
    else:
        by_keys = [(1_000, 300_000), (10_000, 300_000), (100_000, 300_000), (1_000_000, 1_200_000)]
        by_input = [(10_000, 100_000), (10_000, 300_000), (10_000, 1_000_000)]
    runs = {}
    for keys, total in by_keys + by_input:
        if (keys, total) in runs:
            continue
        out = subprocess.run([sys.executable, "-m", "bench.growth", "--one", str(keys), str(total)],
                             capture_output=True, text=True)
        line = [l for l in out.stdout.splitlines() if l.startswith("{")]
        runs[(keys, total)] = json.loads(line[-1]) if line else {"keys": keys, "records": total,
                                                                 "error": out.stderr[-2000:]}
        print(f"[growth] {runs[(keys, total)]}", flush=True)
    return {"by_keys": [runs[c] for c in by_keys], "by_input": [runs[c] for c in by_input],
            "scaled": "input up to 1e6 records (not 1e7): at ~10-15k records/s on this 2-core machine 1e7 "
                      "records would take 11-17 min for one run"}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
    else:
        cli("growth", main)
