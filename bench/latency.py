"""Benchmark 2 (paper fig. 13): per-record latency, single stage, strong productions.

A paced WallClockInjector (record i becomes available at started_ms + i / rate) feeds a pass-through
computation that produces every record. Latency of record i = mtime of the stream-log commit file of
the batch that holds its production - the wall time record i became available to the source.
Also two stages, the first with strong or with weak productions (fused into the second's query).
"""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq

from bench.common import PassThrough, WallClockInjector, cli, fresh_dir, percentile, spark_session
from millstream import Pipeline
from millstream.spark.runner import SparkRunner


def measure(spark, rate: float, seconds: float, trigger_ms: int, shards: int, tag: str,
            first_stage: str | None = None) -> dict:
    """Single stage `pass`; with `first_stage` ("strong" or "weak") a stage `pre` with that
    production runs before it (two stages; latency still measured at `pass`'s stream log)."""
    total = int(rate * seconds)
    injector = WallClockInjector(keys=100, rate=rate, total=total)
    pipeline = Pipeline(f"lat{tag}").add_injector("gen", injector, "events")
    if first_stage:
        pipeline.add_computation("pre", PassThrough("mid"), ["events"], ["mid"], production=first_stage)
        pipeline.add_computation("pass", PassThrough("out"), ["mid"], ["out"])
    else:
        pipeline.add_computation("pass", PassThrough("out"), ["events"], ["out"])
    root = fresh_dir(f"latency-{tag}")
    runner = SparkRunner(pipeline, root=root, spark=spark, trigger_ms=trigger_ms, shards=shards)
    runner.run(timeout=seconds + 300, progress_interval=0.5)
    started = None
    for name in sorted(os.listdir(os.path.join(root, "checkpoints"))):
        # Spark keeps only the newest offset files; every offset of the injector holds started_ms.
        offsets = os.path.join(root, "checkpoints", name, "offsets")
        last = max(int(n) for n in os.listdir(offsets) if n.isdigit())
        with open(os.path.join(offsets, str(last))) as f:
            senders = json.loads(f.read().splitlines()[-1])["senders"]
        for sender in senders.values():
            if "offset" in sender and sender["offset"].get("started_ms"):
                started = sender["offset"]["started_ms"]
    directory = os.path.join(root, "streams", "out", "pass")
    latencies: list[tuple[int, float]] = []
    codec = pipeline.codec("out")
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".parquet"):
            continue
        commit = os.path.join(directory, name.replace(".parquet", ".commit.json"))
        committed_ms = os.stat(commit).st_mtime * 1000
        for value in pq.read_table(os.path.join(directory, name))["value"].to_pylist():
            i = codec.decode(value)
            latencies.append((i, committed_ms - injector.at(started, i)))
    latencies.sort()
    # Steady state only: records that became available after batch 2 committed (batch 0 starts the
    # Python workers, taking 10-30 s here, and the next batches drain the backlog it left).
    history = runner.watermark_history("pass")
    warm_from = history[2]["wall_ms"] if len(history) > 3 else history[-1]["wall_ms"]
    warm = [ms for i, ms in latencies if injector.at(started, i) >= warm_from]
    return {"rate": rate, "seconds": seconds, "trigger_ms": trigger_ms, "shards": shards,
            "stages": 2 if first_stage else 1, "first_stage": first_stage,
            "records": len(latencies), "measured": len(warm),
            "p50_ms": round(percentile(warm, 0.5)), "p95_ms": round(percentile(warm, 0.95)),
            "p99_ms": round(percentile(warm, 0.99)), "max_ms": round(max(warm)) if warm else None,
            "batches": len(history),
            "batch_interval_p50_ms": round(percentile([b["wall_ms"] - a["wall_ms"] for a, b in zip(history[2:], history[3:])], 0.5))
            if len(history) > 4 else None}


def main(quick: bool) -> dict:
    seconds = 45 if quick else 90
    spark = spark_session(log_name="latency")
    runs = [measure(spark, 100, seconds, 200, 8, "default")]
    if not quick:
        runs.append(measure(spark, 100, 45, 0, 8, "trigger0"))
        runs.append(measure(spark, 100, 45, 200, 2, "shards2"))
    two = [measure(spark, 100, seconds if quick else 60, 200, 8, "two-strong", first_stage="strong"),
           measure(spark, 100, seconds if quick else 60, 200, 8, "two-weak", first_stage="weak")]
    for r in runs + two:
        print(f"[latency] {r}", flush=True)
    return {"strong": runs, "two_stage": two}


if __name__ == "__main__":
    cli("latency", main)
