"""Skew limit: what waits for the watermark, with and without `max_skew_ms`, side by side.

A fast injector (records every 10 ms of event time, 300 per read) and a deliberately slow one (one
record per read, a second of event time apart) feed one windowing computation: without a limit the
fast input runs far ahead of the slow one's watermark and its windows pile up in state; with it the
fast injector pauses. Measured in-process on the harness (the same core the Spark runner runs): peak
encoded state of the computation (what a worker holds and Spark's state store keeps), and the output
compared. tests/spark/test_skew_limit_spark.py shows the same bound on Spark.

`python -m bench.skew [--quick]`
"""

from __future__ import annotations

import argparse
import json
import time

from millstream import Count, GeneratorInjector, Pipeline, Record, TumblingWindows, WindowAggregate
from millstream.testing import PipelineHarness


def measure(fast_records: int, max_skew_ms: int | None) -> dict:
    slow_records = fast_records // 100
    fast = GeneratorInjector(lambda i: Record(f"k{i % 5}", i, i * 10), fast_records, lambda n: n * 10,
                             max_records_per_read=300, name="fast")
    slow = GeneratorInjector(lambda i: Record("s", i, i * 1_000), slow_records, lambda n: n * 1_000,
                             max_records_per_read=1, name="slow")
    windows = WindowAggregate(TumblingWindows(100), Count(), "windows")
    pipeline = (Pipeline("skew")
                .add_injector("fast", fast, "in", max_skew_ms=max_skew_ms)
                .add_injector("slow", slow, "in")
                .add_computation("windows", windows, ["in"], windows.outputs))
    harness = PipelineHarness(pipeline)
    started = time.perf_counter()
    peak_state = 0
    while True:
        moved = harness.pull_injectors()
        busy = harness.step()
        peak_state = max(peak_state, harness.state_bytes("windows"))
        if not moved and not busy:
            break
    elapsed = time.perf_counter() - started
    output = sorted((r.key, r.timestamp, json.dumps(r.value, sort_keys=True)) for r in harness.output("windows"))
    return {"max_skew_ms": max_skew_ms, "peak_state_bytes": peak_state, 
            "seconds": round(elapsed, 2), "windows": len(output), "output": output}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    fast_records = 6_000 if args.quick else 30_000
    runs = [measure(fast_records, None), measure(fast_records, 2_000)]
    same = runs[0]["output"] == runs[1]["output"]
    print(f"{'max_skew_ms':>12} {'peak state bytes':>17} {'windows':>8} {'s':>6}")
    for run in runs:
        print(f"{str(run['max_skew_ms']):>12} {run['peak_state_bytes']:>17,} {run['windows']:>8} {run['seconds']:>6}")
    ratio = runs[0]["peak_state_bytes"] / max(1, runs[1]["peak_state_bytes"])
    print(f"[skew] fast records {fast_records:,}: peak state without/with the limit {ratio:.1f}x, same output: {same}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"benchmark": "skew", "fast_records": fast_records, "same_output": same,
                       "runs": [{k: v for k, v in r.items() if k != "output"} for r in runs]}, out, indent=1)


if __name__ == "__main__":
    main()
