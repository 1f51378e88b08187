"""Rescale mid-run: the Windower at 1e5 keys on a root with 32 key groups, started with parallelism 8
(8 Spark state partitions), stopped once about 40% of the input is processed, rescaled offline to 16
partitions (`millstream.spark.rescale.rescale`: Spark's checkpoint repartition) and resumed. Its
output must equal, ids included, the output of the same pipeline run once without stopping, and both
must equal the exact windows computed from the generator. Reported: the time the rescale took and
the partitions before and after; local[2].
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from bench.common import (
    KeyedInjector,
    cli,
    expected_windows,
    fresh_dir,
    spark_session,
    wait_done,
    window_rows,
    windower_pipeline,
)

KEY_GROUPS = 32
BEFORE, AFTER = 8, 16
MAX_RECORDS_PER_BATCH = 50_000  # several batches before the stop, whatever the machine's speed


def pipeline(keys: int, total: int) -> Any:
    return windower_pipeline("rescaled", KeyedInjector(keys, total, 2, max_records_per_read=MAX_RECORDS_PER_BATCH))


def records(runner: Any) -> list[tuple[str, str, int, str]]:
    return sorted((r.key, json.dumps(r.value, sort_keys=True), r.timestamp, r.id) for r in runner.read_stream("windows"))


def main(quick: bool) -> dict:
    from millstream.spark.rescale import checkpoint_of, rescale, state_partitions
    from millstream.spark.runner import SparkRunner

    keys, total = (20_000, 100_000) if quick else (100_000, 500_000)
    spark = spark_session(log_name="rescale")
    args = {"key_groups": KEY_GROUPS, "max_records_per_batch": MAX_RECORDS_PER_BATCH}

    started = time.time()
    whole = SparkRunner(pipeline(keys, total), root=os.path.join(fresh_dir("rescale-whole"), "root"), spark=spark,
                        parallelism=BEFORE, **args)
    try:
        wait_done(whole, 3600, "unrescaled run")
    finally:
        whole.stop()
    whole_s = time.time() - started
    expected = records(whole)

    root = os.path.join(fresh_dir("rescale-rescaled"), "root")
    first = SparkRunner(pipeline(keys, total), root=root, spark=spark, parallelism=BEFORE, **args)
    first.start()
    try:
        deadline = time.time() + 3600
        while first.progress().computations["win"].records < 0.4 * total:
            first.raise_if_failed()
            if time.time() > deadline:
                raise TimeoutError("no progress before the stop")
            time.sleep(0.1)
    finally:
        first.stop()
    stopped = first.progress().computations["win"]
    before = state_partitions(checkpoint_of(root, "win"))
    t = time.time()
    done = rescale(spark, root, AFTER)
    rescale_s = time.time() - t
    after = state_partitions(checkpoint_of(root, "win"))
    resumed = SparkRunner(pipeline(keys, total), root=root, spark=spark, **args)
    try:
        wait_done(resumed, 3600, "resumed run")
    finally:
        resumed.stop()
    output = records(resumed)
    truth = expected_windows(keys, total)
    result = {
        "keys": keys, "records": total, "key_groups": KEY_GROUPS, "windows": len(expected),
        "stopped_after_records": stopped.records, "stopped_mid_run": stopped.low_watermark < 2**47 - 1,
        "partitions_before": before, "partitions_after": after, "rescale_returned": done,
        "rescale_s": round(rescale_s, 2), "unrescaled_run_s": round(whole_s, 1),
        "identical_output_ids_included": output == expected,
        "matches_expected": window_rows(resumed.read_stream("windows")) == truth,
        "unrescaled_matches_expected": window_rows(whole.read_stream("windows")) == truth,
    }
    print(f"[rescale] {keys:,} keys, {BEFORE} -> {AFTER} partitions ({before} -> {after}) after "
          f"{stopped.records:,} of {total:,} records in {rescale_s:.1f} s: identical output "
          f"{result['identical_output_ids_included']}, matches expected {result['matches_expected']}", flush=True)
    return result


if __name__ == "__main__":
    cli("rescale", main)
