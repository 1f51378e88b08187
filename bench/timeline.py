"""Timeline: where the throughput job's time goes, task by task, on local[1] and on local[2].

The job of bench/throughput.py (Windower, 1e4 keys, 1e6 records, exactly-once on), in one session per
configuration with Spark's event log on: full-size warm-up runs (bench.throughput.warm_up), then
TIMED_RUNS timed runs, each output checked against the exact answer. From the event log, for each
timed run's window (first record read -> last output published):

- the share of the window during which 0, 1, 2, ... tasks ran (a sweep over the tasks' launch and
  finish times): with N slots, time with fewer than N tasks running is a core left idle by Spark's
  scheduling, whatever the cause (the driver between batches, a stage's last task, a lone task);
- per stage (Spark's stage name up to " at "), the tasks' total time per 1e6 records and the tasks per
  stage: a stage whose task time grows from local[1] to local[2] does more work, or waits for a core,
  with two tasks at once.

docs/performance.md (ninth session) has what it found.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
from collections import defaultdict
from typing import Any, Iterable

from bench.common import cli, expected_windows, fresh_dir, spark_session

KEYS = 10_000
TIMED_RUNS = 3


def concurrency(intervals: Iterable[tuple[float, float]], start: float, end: float) -> dict[int, float]:
    """Seconds of [start, end] during which exactly k of `intervals` were open, by k.

    >>> concurrency([(0, 4), (1, 3), (5, 9)], 0, 6)
    {0: 1.0, 1: 3.0, 2: 2.0}
    """
    edges: list[tuple[float, int]] = []
    for opened, closed in intervals:
        opened, closed = max(opened, start), min(closed, end)
        if closed > opened:
            edges += [(opened, 1), (closed, -1)]
    edges.sort()
    seconds: dict[int, float] = defaultdict(float)
    running, at = 0, start
    for when, change in edges:
        seconds[running] += when - at
        running, at = running + change, when
    seconds[running] += end - at
    return {k: round(v, 3) for k, v in sorted(seconds.items()) if v > 0}


def read_event_log(directory: str) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """(tasks: stage, launch and finish in seconds; stages by id: name, submission, completion)."""
    tasks: list[dict[str, Any]] = []
    stages: dict[int, dict[str, Any]] = {}
    files = [f for f in glob.glob(os.path.join(directory, "**", "*"), recursive=True) if os.path.isfile(f)]
    for path in sorted(files):
        with open(path) as lines:
            for line in lines:
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerTaskEnd":
                    info = event["Task Info"]
                    tasks.append({"stage": event["Stage ID"], "launch": info["Launch Time"] / 1000,
                                  "finish": info["Finish Time"] / 1000})
                elif kind == "SparkListenerStageCompleted":
                    info = event["Stage Info"]
                    stages[info["Stage ID"]] = {"name": info["Stage Name"].split(" at ")[0],
                                                "submitted": info.get("Submission Time", 0) / 1000,
                                                "completed": info.get("Completion Time", 0) / 1000}
    return tasks, stages


def run_timeline(tasks: list[dict[str, Any]], stages: dict[int, dict[str, Any]], window: list[float],
                 records: int) -> dict[str, Any]:
    start, end = window
    seconds = concurrency(((t["launch"], t["finish"]) for t in tasks), start, end)
    inside = {sid for sid, s in stages.items() if s["submitted"] >= start and s["completed"] <= end + 0.5}
    per_stage: dict[str, dict[str, float]] = defaultdict(lambda: {"stages": 0, "tasks": 0, "task_s": 0.0})
    for sid in inside:
        per_stage[stages[sid]["name"]]["stages"] += 1
    for task in tasks:
        if task["stage"] in inside:
            row = per_stage[stages[task["stage"]]["name"]]
            row["tasks"] += 1
            row["task_s"] += task["finish"] - task["launch"]
    return {
        "window_s": round(end - start, 3),
        "share_by_tasks_running": {k: round(v / (end - start), 3) for k, v in seconds.items()},
        "stages": {name: {"stages": row["stages"], "tasks_per_stage": round(row["tasks"] / row["stages"], 1),
                          "task_s_per_1e6_records": round(row["task_s"] * 1e6 / records, 2)}
                   for name, row in sorted(per_stage.items())},
    }


def configuration(master: str, parallelism: int, total: int) -> dict[str, Any]:
    from bench.throughput import run_millstream, warm_up

    tag = master.replace("[", "").replace("]", "")
    events = fresh_dir(f"timeline-events-{tag}")
    spark = spark_session(master, {"spark.eventLog.enabled": "true", "spark.eventLog.dir": "file://" + events,
                                   "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"},
                          log_name=f"timeline-{tag}")
    try:
        warmup = warm_up(spark, KEYS, total, tag=f"tl{parallelism}", parallelism=parallelism)
        runs = [run_millstream(spark, False, KEYS, total, timeout=3600, tag=f"tl{parallelism}run{n}",
                               parallelism=parallelism) for n in range(TIMED_RUNS)]
    finally:
        spark.stop()  # writes the rest of the event log
    expected = expected_windows(KEYS, total)
    matches = all(run.pop("_output") == expected for run in runs)
    tasks, stages = read_event_log(events)
    timed = [{"records_per_s": run["records_per_s"], **run_timeline(tasks, stages, run["window"], total)}
             for run in runs]
    return {"master": master, "parallelism": parallelism, "warmup_records_per_s": warmup,
            "matches_expected": matches, "runs": timed,
            "median_records_per_s": statistics.median(run["records_per_s"] for run in runs)}


def main(quick: bool) -> dict:
    total = 100_000 if quick else 1_000_000
    results = []
    for master, parallelism in (("local[1]", 1), ("local[2]", 2)):
        result = configuration(master, parallelism, total)
        results.append(result)
        for run in result["runs"]:
            shares = ", ".join(f"{k} tasks {v:.0%}" for k, v in run["share_by_tasks_running"].items())
            stages = "; ".join(f"{name} x{row['tasks_per_stage']:g} tasks: {row['task_s_per_1e6_records']} s/1e6"
                               for name, row in run["stages"].items())
            print(f"[timeline] {master}: {run['records_per_s']:,} records/s; {shares}; {stages}", flush=True)
    return {"records": total, "keys": KEYS, "configurations": results}


if __name__ == "__main__":
    cli("timeline", main)
