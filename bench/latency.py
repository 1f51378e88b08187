"""Benchmark 2 (paper fig. 13): per-record latency, single stage, strong productions.

A paced WallClockInjector (record i becomes available at started_ms + i / rate) feeds a pass-through
computation that produces every record. Latency of record i = mtime of the stream-log commit file of
the batch that holds its production - the wall time record i became available to the source.
Also two stages, the first with strong or with weak productions (fused into the second's query), and
Spark's own floor: the same shape of query written by hand, with nothing of millstream in it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

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


class _PassThroughPerKey:
    """The smallest useful hand-written stateful operator: per key, count rows in a ValueState and
    pass every row on. Built lazily: pyspark is only imported where Spark runs."""

    def __new__(cls) -> Any:
        from pyspark.sql import Row
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        class PassThroughPerKey(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.seen = handle.getValueState("seen", "n long")

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
                current = self.seen.get()
                n = current[0] if current else 0
                for row in rows:
                    n += 1
                    yield Row(k=key[0], ts=row.ts)
                self.seen.update((n,))

            def close(self) -> None:
                pass

        return PassThroughPerKey()


def measure_floor(spark: Any, rate: int, seconds: float, trigger_ms: int) -> dict:
    """Spark's own floor: the same shape of query written by hand, with nothing of millstream's runner
    in it. The hand-written baseline's plain Python data source (bench/baseline.py) over the same paced
    injector, row-based transformWithState grouped by key passing rows through (one ValueState per
    key), foreachBatch writing each batch as one parquet file. Latency of a record = the end of its
    batch's write - the time it became available (its timestamp)."""
    from bench import baseline

    spark.dataSource.register(baseline.GeneratorSource)
    root = fresh_dir("latency-floor")
    injector = WallClockInjector(keys=100, rate=rate, total=int(rate * (seconds + 20)))
    latencies: list[float] = []
    started = time.time()

    def write(frame: Any, batch_id: int) -> None:
        table = frame.toArrow()
        pq.write_table(table, os.path.join(root, f"{batch_id:012d}.parquet"))
        now_ms = time.time() * 1000
        if time.time() - started > 20:  # past start-up and the backlog it leaves
            latencies.extend(now_ms - ts for ts in table["ts"].to_pylist())

    rows = (spark.readStream.format(baseline.FORMAT).option("injector", baseline.encode_injector(injector, 10_000))
            .load().select("key", "ts"))
    query = (rows.groupBy("key").transformWithState(_PassThroughPerKey(), "k string, ts long", "Update", "None")
             .writeStream.queryName("latency-floor").foreachBatch(write)
             .option("checkpointLocation", os.path.join(root, "checkpoint"))
             .trigger(processingTime=f"{trigger_ms} milliseconds").start())
    try:
        time.sleep(seconds + 20)
    finally:
        query.stop()
    return {"rate": rate, "seconds": seconds, "trigger_ms": trigger_ms, "what": "hand-written floor",
            "measured": len(latencies), "p50_ms": round(percentile(latencies, 0.5)),
            "p95_ms": round(percentile(latencies, 0.95)), "p99_ms": round(percentile(latencies, 0.99))}


def main(quick: bool) -> dict:
    seconds = 45 if quick else 90
    spark = spark_session(log_name="latency")
    floor = measure_floor(spark, 100, 45, 200)
    print(f"[latency] {floor}", flush=True)
    runs = [measure(spark, 100, seconds, 200, 8, "default")]
    if not quick:
        runs.append(measure(spark, 100, 45, 0, 8, "trigger0"))
        runs.append(measure(spark, 100, 45, 200, 2, "shards2"))
    two = [measure(spark, 100, seconds if quick else 60, 200, 8, "two-strong", first_stage="strong"),
           measure(spark, 100, seconds if quick else 60, 200, 8, "two-weak", first_stage="weak")]
    for r in runs + two:
        print(f"[latency] {r}", flush=True)
    return {"floor": floor, "strong": runs, "two_stage": two}


if __name__ == "__main__":
    cli("latency", main)
