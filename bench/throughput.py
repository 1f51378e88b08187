"""Throughput: the Windower (1-second buckets, low-watermark timers, exactly-once on) through
millstream's SparkRunner and as hand-written PySpark (bench/baseline.py: row-based transformWithState
per user key), one after the other in one local[2] session, on the same partitioned input (2
partitions: both tasks read). millstream runs at SparkRunner's defaults: its batches are paced
(spark/pacing.py: they start at 200,000 records and grow while they take less than the target time);
the hand-written job reads fixed batches of BASELINE_RECORDS_PER_BATCH, the size millstream starts at.

End-to-end rate = records / (last output committed - first record read). First record read: the
wall time the injector first hands out a record (noted by the injector, in whichever process reads
it). Last output committed: millstream, the publication of the batch that emitted the last window
(its publication-log entry, written after Spark committed the batch); hand-written, Spark's commit of
the last batch that wrote windows (its commits/N). Both outputs are compared with the exact multiset
of (key, bucket, count) computed directly from the generator. millstream's dedup horizon is 10
seconds of event time (bench.common.STEADY_DEDUP_HORIZON_MS): while batches hold over ~102,500
records (pacing starts them at 200,000) each expires the ids of the batch before, so the run
expires ids as fast as it adds them, as a long-running pipeline does.

Warm-up, to time the steady state a long-running pipeline lives in: the JVM's JIT compiler is still
compiling through the first full-size runs of a session (docs/performance.md, "the JIT"). So
millstream's job first runs untimed at full size until two runs in a row agree within
WARMUP_TOLERANCE (at most MAX_WARMUP_RUNS); their rates are reported. The hand-written job, whose
timed run lasts minutes, warms up on a tenth of the records at the full key count.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import baseline
from millstream.spark.pacing import FIRST_BATCH_RECORDS
from bench.common import (
    STEADY_DEDUP_HORIZON_MS,
    FirstRead,
    KeyedInjector,
    cli,
    expected_windows,
    fresh_dir,
    phase_means,
    published,
    recent_progress,
    spark_session,
    wait_done,
    window_rows,
    windower_pipeline,
)

TRIGGER_MS = 200  # SparkRunner's default
BASELINE_RECORDS_PER_BATCH = FIRST_BATCH_RECORDS
PARTITIONS = 2
WARMUP_TOLERANCE = 0.05
MAX_WARMUP_RUNS = 4


def run_millstream(spark: Any, with_progress: bool, keys: int, total: int, timeout: float,
                   tag: str = "", check: bool = True, **runner_args: Any) -> dict:
    """One run of the Windower through SparkRunner; rates, (with `with_progress`) Spark's phase
    durations and (with `check`) output."""
    from millstream.spark.runner import SparkRunner

    name = f"tp{keys}{tag}"
    root = fresh_dir(f"throughput-ms-{keys}{tag}")
    first_read = os.path.join(root, "first-read")
    runner_args.setdefault("trigger_ms", TRIGGER_MS)
    # The injector caps no read of its own: batch sizes are the runner's (paced, or a fixed cap given).
    injector = KeyedInjector(keys, total, PARTITIONS, max_records_per_read=total, first_read=first_read)
    pipeline = windower_pipeline(name, injector, dedup_horizon_ms=STEADY_DEDUP_HORIZON_MS)
    runner = SparkRunner(pipeline, root=os.path.join(root, "root"), spark=spark,
                         **runner_args)
    started = time.time()
    progress = None
    try:
        wait_done(runner, timeout, f"millstream at {keys} keys")
        if with_progress:
            query = next(q for q in spark.streams.active if q.name == f"{name}.win")
            progress = recent_progress(query, published(runner.root, "win")[-1]["batch"])
    finally:
        runner.stop()
    batches = published(runner.root, "win")
    with_output = [b for b in batches if b["rows"].get("windows")]
    first = FirstRead(first_read).read()
    end = with_output[-1]["published_s"]
    # Steady: after the first published batch (which carries the query's start-up).
    first_batch = batches[0]
    records_first = first_batch["status"]["metrics"]["records"]
    result = {
        "records": total, "batches": len(batches), "parallelism": runner_args.get("parallelism"),
        "e2e_s": round(end - first, 3), "records_per_s": round(total / (end - first)),
        "steady_records_per_s": round((total - records_first) / (end - first_batch["published_s"]))
        if end > first_batch["published_s"] else None,
        "start_to_first_read_s": round(first - started, 2), "total_s": round(time.time() - started, 1),
        "window": [first, end],
    }
    if progress is not None:
        result["durationMs"] = phase_means(progress)
    if check:
        result["_output"] = window_rows(runner.read_stream("windows"))
    return result


def run_baseline(spark: Any, keys: int, total: int, expected_rows: int, timeout: float, tag: str = "") -> dict:
    root = fresh_dir(f"throughput-base-{keys}{tag}")
    first_read = os.path.join(root, "first-read")
    injector = KeyedInjector(keys, total, PARTITIONS, max_records_per_read=BASELINE_RECORDS_PER_BATCH,
                             first_read=first_read)
    name = f"baseline{keys}{tag}"
    started = time.time()
    query = baseline.start_baseline(spark, injector, BASELINE_RECORDS_PER_BATCH, root, TRIGGER_MS, name=name)
    rows = baseline.OutputCounter(root)
    try:
        while rows() < expected_rows:
            if query.exception() is not None:
                raise RuntimeError(f"baseline failed: {query.exception()}")
            if time.time() - started > timeout:
                raise TimeoutError(f"baseline at {keys} keys not done after {timeout} s "
                                   f"({rows.rows} of {expected_rows} rows)")
            time.sleep(0.5)
        # The file sink's rows are visible before Spark writes the batch's commit: wait for it, or
        # stopping the query now leaves no commit time to measure to.
        deadline = time.time() + 120
        while baseline.last_output_commit(root) is None and time.time() < deadline:
            time.sleep(0.2)
        progress = recent_progress(query, max(baseline.committed_files(root), default=-1))
    finally:
        query.stop()
    first = FirstRead(first_read).read()
    end = baseline.last_output_commit(root)
    assert first is not None and end is not None, "baseline: no first read or no committed output"
    return {"records": total, "e2e_s": round(end - first, 3), "records_per_s": round(total / (end - first)),
            "start_to_first_read_s": round(first - started, 2), "total_s": round(time.time() - started, 1),
            "durationMs": phase_means(progress), "_output": baseline.read_output(root)}


def warm_up(spark: Any, keys: int, total: int, tag: str = "", **runner_args: Any) -> list[int]:
    """Untimed full-size runs of millstream's job until two in a row agree within WARMUP_TOLERANCE
    (at most MAX_WARMUP_RUNS); their rates."""
    rates: list[int] = []
    while len(rates) < MAX_WARMUP_RUNS:
        run = run_millstream(spark, False, keys, total, timeout=1800, tag=f"{tag}warmup{len(rates)}", check=False,
                             **runner_args)
        rates.append(run["records_per_s"])
        print(f"[throughput] {tag or 'millstream'} warm-up run {len(rates)}: {rates[-1]} rec/s", flush=True)
        if len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= WARMUP_TOLERANCE * rates[-2]:
            break
    return rates


def main(quick: bool) -> dict:
    keys = 10_000
    total = 100_000 if quick else 1_000_000
    spark = spark_session(log_name="throughput")
    # The hand-written job's warm-up first: run between millstream's warm-up and its timed run, it
    # slowed the timed run (docs/performance.md).
    run_baseline(spark, keys, total // 10, sum(expected_windows(keys, total // 10).values()), timeout=1800,
                 tag="warmup")
    warmup_rates = warm_up(spark, keys, total)
    expected = expected_windows(keys, total)
    expected_rows = sum(expected.values())
    ms = run_millstream(spark, True, keys, total, timeout=1800)
    ms["warmup_records_per_s"] = warmup_rates
    base = run_baseline(spark, keys, total, expected_rows, timeout=3600)
    ms_out, base_out = ms.pop("_output"), base.pop("_output")
    base_out = type(expected)(base_out)
    row = {
        "keys": keys, "records": total, "windows": expected_rows, "partitions": PARTITIONS,
        "millstream": ms, "baseline": base,
        "ratio": round(ms["records_per_s"] / base["records_per_s"], 2),
        "millstream_matches_expected": ms_out == expected,
        "baseline_matches_expected": base_out == expected,
        "identical_output": ms_out == base_out == expected,
    }
    print(f"[throughput] keys={keys} records={total} millstream={ms['records_per_s']} rec/s "
          f"hand-written={base['records_per_s']} rec/s ratio={row['ratio']} identical={row['identical_output']}",
          flush=True)
    return {"events_per_second": 10_000, "trigger_ms": TRIGGER_MS,
            "baseline_records_per_batch": BASELINE_RECORDS_PER_BATCH, "result": row}


if __name__ == "__main__":
    cli("throughput", main)
