"""Benchmark 1: Windower throughput, millstream (SparkRunner) vs hand-written row-based
transformWithState (bench/baseline.py), side by side in one Spark session, same input, same batches.

Steady state: records read after batch 0 / wall time from batch 0's commit to the commit of the batch
that emitted the last window (the ~8 s Python worker start-up of batch 0 is excluded). Output of both
is checked against the exact multiset of (key, bucket, count) computed directly from the generator.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from bench import baseline
from bench.common import (
    ProgressCollector,
    Windower,
    cli,
    expected_windows,
    fresh_dir,
    keyed_injector,
    spark_session,
    steady_rate,
)
from millstream import Pipeline
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

TRIGGER_MS = 200
MAX_RECORDS_PER_BATCH = 50_000


def windower_pipeline(name: str, keys: int, total: int, max_per_read: int = MAX_RECORDS_PER_BATCH) -> Pipeline:
    injector = keyed_injector(keys, total)
    injector.max_records_per_read = max_per_read
    return (Pipeline(name).add_injector("gen", injector, "events")
            .add_computation("win", Windower(), ["events"], ["windows"]))


def run_millstream(spark: Any, collector: ProgressCollector, keys: int, total: int, timeout: float,
                   runner_class: type[SparkRunner] = SparkRunner, tag: str = "", **runner_args: Any) -> dict:
    name = f"tp{keys}{tag}"
    root = fresh_dir(f"throughput-ms-{keys}{tag}")
    max_records = runner_args.setdefault("max_records_per_batch", MAX_RECORDS_PER_BATCH)
    runner_args.setdefault("trigger_ms", TRIGGER_MS)
    runner = runner_class(windower_pipeline(name, keys, total, max_records), root=root, spark=spark, **runner_args)
    started = time.time()
    runner.start()
    try:
        while True:
            runner.raise_if_failed()
            if runner.progress().done:
                break
            if time.time() - started > timeout:
                raise TimeoutError(f"millstream run at {keys} keys not done after {timeout} s")
            time.sleep(0.2)
    finally:
        runner.stop()
    history = runner.watermark_history("win")
    commits = []
    for item in history:
        commits.append((item["batch"], item["wall_ms"] / 1000))
        if item["low_watermark"] >= END_OF_TIME:
            break
    result = steady_rate(commits, os.path.join(root, "checkpoints", "win"), total)
    result["total_s"] = round(time.time() - started, 1)
    result["durationMs"] = collector.breakdown(f"{name}.win")
    output = Counter((r.key, r.value["bucket"], r.value["count"]) for r in runner.read_stream("windows"))
    return result | {"_output": output}


def run_baseline(spark: Any, collector: ProgressCollector, keys: int, total: int, expected_rows: int,
                 timeout: float, trigger_ms: int = TRIGGER_MS, max_records: int = MAX_RECORDS_PER_BATCH,
                 name_tag: str = "") -> dict:
    root = fresh_dir(f"throughput-base-{keys}{name_tag}")
    injector = keyed_injector(keys, total)
    injector.max_records_per_read = max_records
    name = f"baseline{keys}{name_tag}"
    started = time.time()
    query, sink = baseline.start_baseline(spark, injector, max_records, root, trigger_ms, name=name)
    try:
        while sink.rows < expected_rows:
            if query.exception() is not None:
                raise RuntimeError(f"baseline failed: {query.exception()}")
            if time.time() - started > timeout:
                raise TimeoutError(f"baseline at {keys} keys not done after {timeout} s ({sink.rows} rows)")
            time.sleep(0.2)
    finally:
        query.stop()
    commits = list(sink.commits)
    result = steady_rate(commits, os.path.join(root, "checkpoint"), total)
    result["total_s"] = round(time.time() - started, 1)
    result["durationMs"] = collector.breakdown(name)
    return result | {"_output": Counter(baseline.read_output(root))}


def main(quick: bool) -> dict:
    key_counts = [1_000, 10_000, 100_000]
    total = 60_000 if quick else 250_000
    spark = spark_session(log_name="throughput")
    collector = ProgressCollector(spark)
    # The first queries of a session run measurably slower (Python workers, JIT, caches): warm both up.
    run_millstream(spark, collector, 1_000, 20_000, timeout=600, tag="warmup")
    run_baseline(spark, collector, 1_000, 20_000, sum(expected_windows(1_000, 20_000).values()), timeout=600,
                 name_tag="warmup")
    rows = []
    for keys in key_counts:
        expected = expected_windows(keys, total)
        expected_rows = sum(expected.values())
        ms = run_millstream(spark, collector, keys, total, timeout=900)
        base = run_baseline(spark, collector, keys, total, expected_rows, timeout=1200)
        ms_out, base_out = ms.pop("_output"), base.pop("_output")
        row = {
            "keys": keys, "records": total, "windows": expected_rows,
            "millstream": ms, "baseline": base,
            "ratio": round(ms["records_per_s"] / base["records_per_s"], 2),
            "identical_output": ms_out == base_out == expected,
            "millstream_matches_expected": ms_out == expected,
            "baseline_matches_expected": base_out == expected,
        }
        print(f"[throughput] keys={keys} millstream={ms['records_per_s']} rec/s baseline={base['records_per_s']} "
              f"rec/s ratio={row['ratio']} identical={row['identical_output']}", flush=True)
        rows.append(row)
    collector.close(spark)
    return {"records_per_key_count": total, "events_per_second": 10_000, "trigger_ms": TRIGGER_MS,
            "max_records_per_batch": MAX_RECORDS_PER_BATCH, "results": rows}


if __name__ == "__main__":
    cli("throughput", main)
