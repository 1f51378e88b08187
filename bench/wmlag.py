"""Benchmark 3 (paper fig. 15): low-watermark lag of a three-stage pipeline.

injector (event time = wall time, WallClockInjector) -> s1 -> s2 -> s3, pass-through stages with
strong productions (each stage its own Spark query reading the previous stage's stream log). Once a
second: lag of each stage = wall time - that stage's published low watermark (runner.progress()).
Reported per stage after warm-up (every stage past its first batch), and the increment each stage
adds; full run: trigger 200 ms and 2,000 ms, quick: 200 ms.
"""

from __future__ import annotations

import os
import time

from bench.common import PassThrough, WallClockInjector, cli, fresh_dir, percentile, spark_session
from millstream import Pipeline
from millstream.spark.runner import SparkRunner

STAGES = ("s1", "s2", "s3")
WARM_UP_LIMIT_S = 900  # until every stage has published a watermark (slow on a loaded machine)


def measure(spark, trigger_ms: int, seconds: int) -> dict:
    rate = 100
    injector = WallClockInjector(keys=100, rate=rate, total=10**9)
    pipeline = Pipeline(f"wmlag{trigger_ms}").add_injector("gen", injector, "e0")
    for n, stage in enumerate(STAGES):
        pipeline.add_computation(stage, PassThrough(f"e{n + 1}"), [f"e{n}"], [f"e{n + 1}"])
    runner = SparkRunner(pipeline, root=os.path.join(fresh_dir(f"wmlag-{trigger_ms}"), "root"), spark=spark,
                         trigger_ms=trigger_ms)
    runner.start()
    samples: list[dict] = []
    warm_at = None
    try:
        started = time.time()
        while True:
            if warm_at is None and time.time() - started > WARM_UP_LIMIT_S:
                raise TimeoutError(f"wmlag: not every stage published a watermark within {WARM_UP_LIMIT_S} s: "
                                   f"{runner.progress()}")
            runner.raise_if_failed()
            now = time.time() * 1000
            progress = runner.progress()
            lws = {s: progress.computations[s].low_watermark for s in STAGES}
            if warm_at is None and all(lw > 0 for lw in lws.values()):
                warm_at = time.time() + 10  # let every stage settle after its first batches
            if warm_at is not None and time.time() >= warm_at:
                # The injector's own watermark is its next record's time = wall time (lag ~1/rate):
                # the lag of s1 is therefore what s1 itself adds.
                samples.append({"wall": now, "injector": 0,
                                **{s: now - lw for s, lw in lws.items()}})
                if time.time() - warm_at >= seconds:
                    break
            time.sleep(1.0)
    finally:
        runner.stop()
    stats = {}
    for s in ("injector", *STAGES):
        values = [x[s] for x in samples if x[s] is not None]
        stats[s] = {"p50_ms": round(percentile(values, 0.5)), "p95_ms": round(percentile(values, 0.95)),
                    "max_ms": round(max(values)) if values else None}
    increments = {}
    previous = "injector"
    for s in STAGES:
        increments[s] = stats[s]["p50_ms"] - stats[previous]["p50_ms"]
        previous = s
    # Micro-batch interval actually observed: median gap between commits of each stage.
    intervals = {}
    for s in STAGES:
        walls = [h["wall_ms"] for h in runner.watermark_history(s)]
        gaps = [b - a for a, b in zip(walls, walls[1:])][5:]
        intervals[s] = round(percentile(gaps, 0.5)) if gaps else None
    return {"seconds_sampled": len(samples), "rate": rate, "trigger_ms": trigger_ms, "lag": stats,
            "increment_p50_ms": increments, "batch_interval_p50_ms": intervals}


def main(quick: bool) -> dict:
    """Two triggers: the default 200 ms, shorter than a batch, so each query starts its next batch
    as soon as one ends, at a phase unrelated to its sender's commits; and 2,000 ms, longer than a
    batch here, so every query starts its batches on the same trigger instants (Spark aligns them to
    multiples of the interval) and each stage picks up its sender's commit of the previous instant."""
    seconds = 20 if quick else 120
    spark = spark_session(log_name="wmlag")
    variants = []
    for trigger_ms in (200,) if quick else (200, 2000):
        variants.append(measure(spark, trigger_ms, seconds))
        lag = variants[-1]["lag"]
        print(f"[wmlag] trigger {trigger_ms} ms: lag p50 ms " + " / ".join(
            f"{s} {lag[s]['p50_ms']}" for s in ("injector", *STAGES)), flush=True)
    return {"variants": variants}


if __name__ == "__main__":
    cli("wmlag", main)
