"""Per-record latency (paper fig. 13), exactly-once on vs off side by side, and Spark's own floor.

A paced WallClockInjector (100 records/s; record i becomes available, and has event time,
started_ms + i * 10 ms) feeds a pass-through computation that produces every record. Latency of record
i = the time its production was published (mtime of the publication-log entry that lists its file;
with exactly_once=True that is after Spark committed the batch, with exactly_once=False the stager
publishes as soon as the batch has run: no dedup, no wait for the commit) - the time record i became
available. Only records that became available after the computation's third published batch count
(the first batches carry the query's start-up and the backlog it leaves).

Spark's floor: the same shape of query written by hand, with nothing of millstream in it (the
hand-written baseline's Python data source over the same paced injector, row-based transformWithState
grouped by key passing rows through with one ValueState per key, foreachBatch writing one parquet file
per batch); latency = the end of that write - the record's time. That write happens before Spark's
commit, as exactly_once=False's publication does.

Full run only: two stages (a pass-through `pre` ahead of `pass`), `pre` with strong productions (its
own query, a durable hop) or weak ones (fused into `pass`'s query); latency still measured at `pass`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow.parquet as pq

from bench.common import PassThrough, WallClockInjector, cli, fresh_dir, percentile, published, spark_session, started_ms

RATE = 100


def measure(spark: Any, seconds: float, trigger_ms: int, tag: str, exactly_once: bool = True,
            first_stage: str | None = None) -> dict:
    """Single stage `pass`; with `first_stage` ("strong" or "weak") a stage `pre` with that
    production runs before it."""
    from millstream import Pipeline
    from millstream.spark.runner import SparkRunner

    total = int(RATE * seconds)
    injector = WallClockInjector(keys=100, rate=RATE, total=total)
    pipeline = Pipeline(f"lat{tag}").add_injector("gen", injector, "events")
    reader = "pass"
    if first_stage:
        pipeline.add_computation("pre", PassThrough("mid"), ["events"], ["mid"], production=first_stage)
        pipeline.add_computation("pass", PassThrough("out"), ["mid"], ["out"], exactly_once=exactly_once)
        reader = "pre" if first_stage == "strong" else "pass"
    else:
        pipeline.add_computation("pass", PassThrough("out"), ["events"], ["out"], exactly_once=exactly_once)
    root = os.path.join(fresh_dir(f"latency-{tag}"), "root")
    runner = SparkRunner(pipeline, root=root, spark=spark, trigger_ms=trigger_ms)
    runner.run(timeout=seconds + 300, progress_interval=0.5)
    started = started_ms(runner.root, reader)
    codec = pipeline.codec("out")
    batches = published(runner.root, "pass")
    latencies: list[tuple[int, float]] = []
    for batch in batches:
        for path, rows in batch["files"].get("out", []):
            if rows:
                for value in pq.read_table(path, columns=["value"])["value"].to_pylist():
                    i = codec.decode(value)
                    latencies.append((i, batch["published_s"] * 1000 - injector.at(started, i)))
    warm_from = batches[2]["published_s"] * 1000 if len(batches) > 3 else batches[-1]["published_s"] * 1000
    warm = [ms for i, ms in sorted(latencies) if injector.at(started, i) >= warm_from]
    gaps = [b["published_s"] - a["published_s"] for a, b in zip(batches[2:], batches[3:])]
    return {"tag": tag, "rate": RATE, "seconds": seconds, "trigger_ms": trigger_ms, "exactly_once": exactly_once,
            "stages": 2 if first_stage else 1, "first_stage": first_stage,
            "records": len(latencies), "records_once": len({i for i, _ in latencies}) == len(latencies) == total,
            "measured": len(warm), "p50_ms": round(percentile(warm, 0.5)), "p95_ms": round(percentile(warm, 0.95)),
            "p99_ms": round(percentile(warm, 0.99)), "max_ms": round(max(warm)) if warm else None,
            "batches": len(batches), "batch_interval_p50_ms": round(percentile(gaps, 0.5) * 1000) if gaps else None}


class _PassThroughPerKey:
    """The smallest useful hand-written stateful operator: per key, count rows in a ValueState and
    pass every row on. Built lazily: pyspark is only imported where Spark runs."""

    def __new__(cls) -> Any:
        from pyspark.sql import Row
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        class PassThroughPerKey(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.seen = handle.getValueState("seen", "n long")

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802
                current = self.seen.get()
                n = current[0] if current else 0
                for row in rows:
                    n += 1
                    yield Row(k=key[0], ts=row.ts)
                self.seen.update((n,))

            def close(self) -> None:
                pass

        return PassThroughPerKey()


def measure_floor(spark: Any, seconds: float, warm_s: float, trigger_ms: int) -> dict:
    from bench import baseline

    spark.dataSource.register(baseline.GeneratorSource)
    root = fresh_dir("latency-floor")
    injector = WallClockInjector(keys=100, rate=RATE, total=int(RATE * (seconds + warm_s)))
    latencies: list[float] = []
    started = time.time()

    def write(frame: Any, batch_id: int) -> None:
        table = frame.toArrow()
        pq.write_table(table, os.path.join(root, f"{batch_id:012d}.parquet"))
        now_ms = time.time() * 1000
        if time.time() - started > warm_s:  # past start-up and the backlog it leaves
            latencies.extend(now_ms - ts for ts in table["ts"].to_pylist())

    rows = (spark.readStream.format(baseline.FORMAT).option("injector", baseline.encode_injector(injector, 10_000))
            .load().select("key", "ts"))
    query = (rows.groupBy("key").transformWithState(_PassThroughPerKey(), "k string, ts long", "Update", "None")
             .writeStream.queryName("latency-floor").foreachBatch(write)
             .option("checkpointLocation", os.path.join(root, "checkpoint"))
             .trigger(processingTime=f"{trigger_ms} milliseconds").start())
    try:
        time.sleep(seconds + warm_s)
    finally:
        query.stop()
    return {"tag": "floor", "rate": RATE, "seconds": seconds, "trigger_ms": trigger_ms, "what": "hand-written floor",
            "measured": len(latencies), "p50_ms": round(percentile(latencies, 0.5)),
            "p95_ms": round(percentile(latencies, 0.95)), "p99_ms": round(percentile(latencies, 0.99))}


def main(quick: bool) -> dict:
    seconds = 20 if quick else 90
    spark = spark_session(log_name="latency")
    floor = measure_floor(spark, seconds, 15 if quick else 20, 200)
    print(f"[latency] floor: p50 {floor['p50_ms']} ms, p95 {floor['p95_ms']} ms", flush=True)
    runs = []
    # Alternate the two settings (on, off, then off, on in the full run): a session's later queries
    # run faster, whatever they run.
    order = [True, False] if quick else [True, False, False, True]
    for n, exactly_once in enumerate(order):
        runs.append(measure(spark, seconds, 200, f"eo{'on' if exactly_once else 'off'}{n}", exactly_once))
        print(f"[latency] exactly_once={exactly_once}: p50 {runs[-1]['p50_ms']} ms, p95 {runs[-1]['p95_ms']} ms",
              flush=True)
    two = []
    if not quick:
        two = [measure(spark, 60, 200, "two-strong", first_stage="strong"),
               measure(spark, 60, 200, "two-weak", first_stage="weak")]
        for r in two:
            print(f"[latency] two stages, first {r['first_stage']}: p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms",
                  flush=True)

    def pooled(flag: bool) -> dict[str, Any]:
        mine = [r for r in runs if r["exactly_once"] is flag]
        return {"p50_ms": round(sum(r["p50_ms"] for r in mine) / len(mine)),
                "p95_ms": round(sum(r["p95_ms"] for r in mine) / len(mine)), "runs": len(mine)}

    return {"floor": floor, "runs": runs, "exactly_once_on": pooled(True), "exactly_once_off": pooled(False),
            "two_stage": two, "paper_ms": {"exactly_once_on_p50": 33.7, "exactly_once_off_p50": 3.6}}


if __name__ == "__main__":
    cli("latency", main)
