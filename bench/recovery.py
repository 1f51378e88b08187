"""Benchmark 5: recovery after a driver SIGKILL.

A child process runs a paced pass-through pipeline (bench.recovery --child ROOT). Once its output is
flowing, the whole child process group (driver, JVM, Python workers) is SIGKILLed; a new child is
started on the same root. Measured: kill -> first publication (publication-log entry) with rows of a
batch the new process ran, split into process start -> Spark session ready and the rest. Exactly-once
is checked over everything published: each record index once, no gap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq

from bench.common import PassThrough, WallClockInjector, cli, fresh_dir

RATE = 200


def pipeline():
    from millstream import Pipeline

    return (Pipeline("recovery").add_injector("gen", WallClockInjector(keys=50, rate=RATE, total=10**9), "events")
            .add_computation("pass", PassThrough("out"), ["events"], ["out"]))


def child(root: str) -> None:
    from bench.common import spark_session
    from millstream.spark.runner import SparkRunner

    t = time.time()
    spark = spark_session(log_name="recovery")
    with open(os.path.join(root, f"session-ready-{os.getpid()}"), "w") as f:
        f.write(json.dumps({"started": t, "ready": time.time()}))
    SparkRunner(pipeline(), root=root, spark=spark, trigger_ms=200).run(timeout=3600)


def commits(root: str) -> list[tuple[str, float, int]]:
    """(entry name, publication time, rows) of every batch `pass` published."""
    directory = os.path.join(root, "log", "pass")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if name[:12].isdigit() and name.endswith(".json"):
            path = os.path.join(directory, name)
            try:
                with open(path) as f:
                    entry = json.load(f)
                if entry.get("type") == "batch":
                    rows = sum(r for _, r in entry["streams"].get("out", []))
                    found.append((name, os.stat(path).st_mtime, rows))
            except (OSError, ValueError):
                pass
    return found


def spawn(root: str) -> subprocess.Popen:
    log = open(os.path.join(root, "child.log"), "a")
    return subprocess.Popen([sys.executable, "-m", "bench.recovery", "--child", root], stdout=log, stderr=log,
                            start_new_session=True)


def wait_for(predicate, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def main(quick: bool) -> dict:
    root = fresh_dir("recovery")
    rounds = 1 if quick else 2
    results = []
    proc = spawn(root)
    try:
        for _ in range(rounds):
            # Let output flow for a while with rows.
            assert wait_for(lambda: sum(1 for c in commits(root) if c[2]) >= 5, 240), "no output before kill"
            time.sleep(3)
            before = {c[0] for c in commits(root)}
            killed = time.time()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc = spawn(root)
            restarted = time.time()
            new = lambda: [c for c in commits(root) if c[0] not in before and c[2] > 0 and c[1] > killed]
            assert wait_for(lambda: bool(new()), 300), "no output after restart"
            first = min(c[1] for c in new())
            ready_file = os.path.join(root, f"session-ready-{proc.pid}")
            ready = json.load(open(ready_file))["ready"] if os.path.exists(ready_file) else None
            results.append({"kill_to_first_output_s": round(first - killed, 2),
                            "restart_to_session_ready_s": round(ready - restarted, 2) if ready else None,
                            "session_ready_to_first_output_s": round(first - ready, 2) if ready else None})
            print(f"[recovery] {results[-1]}", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Exactly-once check over everything published.
    from bench.common import published

    seen: list[int] = []
    for batch in published(root, "pass"):
        for path, rows in batch["files"].get("out", []):
            if rows:
                seen.extend(json.loads(v) for v in pq.read_table(path, columns=["value"])["value"].to_pylist())
    exact = len(seen) == len(set(seen)) and (not seen or sorted(seen) == list(range(len(seen))))
    return {"rounds": results, "records_committed": len(seen), "exactly_once_prefix": exact}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        cli("recovery", main)
