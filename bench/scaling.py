"""Scaling: the throughput benchmark's millstream job (Windower, 1e4 keys, exactly-once on, 2 injector
partitions) on one core and on two, run one after the other, each in a fresh driver process, in
ROUNDS rounds of all four configurations (3, or SCALING_ROUNDS; one with --quick); the speed-up
reported is the median of the rounds' ratios:

- local[1] vs local[2] (parallelism 1 vs 2, as SparkRunner chooses by default for local[N]);
- a Spark standalone cluster started here on 127.0.0.1 (a master, workers of one core each) with one
  worker vs two (parallelism 1 vs 2: one state partition per executor core).

Each configuration: full-size warm-up runs to steady state (bench/throughput.py: warm_up), then
TIMED_RUNS timed runs, of which the median is reported; records/s end to end as in
bench/throughput.py (first record read -> last output published), every timed run's output checked
against the exact answer. Meanwhile this process samples the CPU time of every process in its tree
(psutil, every 0.25 s) and splits it by role over the median run's window: the driver (its Python
process, the Python planners its JVM starts, and on a cluster its JVM), the executors (JVMs and
Python workers) and the cluster's daemons. In local mode one JVM is the driver and the executors: its
threads are split by name (see common.jvm_thread_role), GC/JIT/VM threads belong to both and are
reported apart (the share is then a range). Two more figures per configuration say where a speed-up
short of the core count comes from: the cores kept busy over the window (all CPU time but this
process's, divided by the window) and the CPU time per record.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import (
    PROJECT_DIR,
    SCRATCH,
    ProcessTree,
    cli,
    cpu_shares,
    expected_windows,
    fresh_dir,
    spark_session,
)

KEYS = 10_000
# Timed runs per configuration, after the warm-up; the median one is reported. Rates of one
# configuration still spread by several percent between runs at steady state (docs/performance.md).
TIMED_RUNS = 3
# Rounds of the four configurations, one after the other: the speed-up reported is the median of the
# rounds' ratios, so one slow stretch of the machine does not decide it. SCALING_ROUNDS sets more.
ROUNDS = int(os.environ.get("SCALING_ROUNDS", "3"))


def one(master: str, parallelism: int, total: int, out: str) -> None:
    """The driver process of one configuration (run as `python -m bench.scaling --one ...`)."""
    from bench.throughput import run_millstream, warm_up

    conf = None
    if master.startswith("spark://"):
        conf = {"spark.executor.cores": "1", "spark.cores.max": str(parallelism), "spark.executor.memory": "1g",
                "spark.pyspark.python": sys.executable}
    tag = master.replace("[", "").replace("]", "").replace(":", "").replace("/", "")[:12]
    spark = spark_session(master, conf, log_name=f"scaling-{tag}")
    warmup = warm_up(spark, KEYS, total, tag=f"scale{parallelism}", parallelism=parallelism)
    runs = [run_millstream(spark, False, KEYS, total, timeout=3600, tag=f"scale{parallelism}run{n}",
                           parallelism=parallelism) for n in range(TIMED_RUNS)]
    expected = expected_windows(KEYS, total)
    matches = all(run.pop("_output") == expected for run in runs)
    result = sorted(runs, key=lambda run: run["records_per_s"])[TIMED_RUNS // 2]  # the median run
    result["matches_expected"] = matches
    result["timed_records_per_s"] = [run["records_per_s"] for run in runs]
    result["default_parallelism"] = spark.sparkContext.defaultParallelism
    result["warmup_records_per_s"] = warmup
    spark.stop()
    with open(out, "w") as f:
        json.dump(result, f)


# -- a standalone cluster on 127.0.0.1 ------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_log(path: str, text: str, process: subprocess.Popen, limit_s: float = 90) -> None:
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        if process.poll() is not None:
            raise RuntimeError(f"{path}: process ended\n" + open(path, errors="replace").read()[-3000:])
        time.sleep(0.3)
    raise RuntimeError(f"{text!r} not in {path}:\n" + open(path, errors="replace").read()[-3000:])


class Cluster:
    """A standalone master and `workers` workers of one core each, on 127.0.0.1."""

    def __init__(self, workers: int, directory: str) -> None:
        import pyspark

        self.spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
        self.workers, self.directory = workers, directory
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": os.path.join(directory, "work"),
                    "PYTHONPATH": PROJECT_DIR}
        self.processes: list[subprocess.Popen] = []
        self.url = ""

    def _start(self, args: list[str], log: str) -> subprocess.Popen:
        process = subprocess.Popen([self.spark_class, *args], env=self.env, stdout=open(log, "w"),
                                   stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def __enter__(self) -> "Cluster":
        try:
            return self._start_all()
        except BaseException:
            self.__exit__()  # a master or worker already up must not run on into the next round
            raise

    def _start_all(self) -> "Cluster":
        port = _free_port()
        self.url = f"spark://127.0.0.1:{port}"
        log = os.path.join(self.directory, "master.log")
        master = self._start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                              "--webui-port", str(_free_port())], log)
        _wait_for_log(log, "I have been elected leader", master)
        for n in range(self.workers):
            log = os.path.join(self.directory, f"worker{n}.log")
            worker = self._start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                                  "--memory", "2g", "--webui-port", str(_free_port()), self.url], log)
            _wait_for_log(log, "Successfully registered with master", worker)
        return self

    def __exit__(self, *exc: Any) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure(name: str, master: str, parallelism: int, total: int) -> dict:
    directory = fresh_dir(f"scaling-{name}")
    out = os.path.join(directory, "result.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (PROJECT_DIR, os.environ.get("PYTHONPATH")) if p))
    with open(os.path.join(directory, "driver.log"), "w") as log:
        child = subprocess.Popen([sys.executable, "-m", "bench.scaling", "--one", master, str(parallelism),
                                  str(total), out], cwd=PROJECT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
    tree = ProcessTree(interval=0.25, driver_pid=child.pid).start()
    try:
        code: int | str = child.wait(timeout=3600)
    except subprocess.TimeoutExpired:
        child.kill()  # a hung configuration is reported as failed; the next one gets the machine
        child.wait()
        code = "a timeout (killed after an hour)"
    finally:
        tree.stop()
    if code != 0 or not os.path.exists(out):
        tail = open(os.path.join(directory, "driver.log"), errors="replace").read()[-3000:]
        return {"config": name, "error": f"driver exited with {code}:\n{tail}"}
    with open(out) as f:
        result = json.load(f)
    first, end = result.pop("window")
    shares = cpu_shares(tree.cpu_by_role(first, end))
    # Where a speed-up short of the core count comes from: cores left idle (cores_busy below the
    # parallelism) or more CPU per record when tasks run side by side (cpu_us_per_record).
    busy = {"cores_busy": round(shares["total_cpu_s"] / (end - first), 2) if end > first else None,
            "cpu_us_per_record": round(shares["total_cpu_s"] / total * 1e6, 2)}
    row = {"config": name, "master": master, "parallelism": parallelism, **result, **shares, **busy,
           "peak_rss_mb": tree.peak_mb()}
    print(f"[scaling] {name}: {result['records_per_s']} rec/s (timed runs {result['timed_records_per_s']}), "
          f"driver CPU share {shares['driver_share']}-{shares['driver_share_max']}, "
          f"cores busy {busy['cores_busy']}, CPU {busy['cpu_us_per_record']} us/record, "
          f"output ok {result['matches_expected']}", flush=True)
    return row


def run_round(number: int, total: int) -> list[dict]:
    """The four configurations once, one after the other, each row tagged with the round."""
    rows = [measure("local1", "local[1]", 1, total), measure("local2", "local[2]", 2, total)]
    for workers in (1, 2):
        directory = fresh_dir(f"scaling-cluster{workers}-daemons")
        try:
            with Cluster(workers, directory) as cluster:
                rows.append(measure(f"cluster{workers}", cluster.url, workers, total))
        except RuntimeError as error:
            rows.append({"config": f"cluster{workers}", "error": str(error)})
    for row in rows:
        row["round"] = number
    return rows


def speedups(rows: list[dict]) -> dict[str, float | None]:
    """Two cores over one, local and on the cluster, from one round's rows."""
    by = {r["config"]: r for r in rows}

    def ratio(a: str, b: str) -> float | None:
        if "records_per_s" in by.get(a, {}) and "records_per_s" in by.get(b, {}):
            return round(by[b]["records_per_s"] / by[a]["records_per_s"], 2)
        return None

    return {"local": ratio("local1", "local2"), "cluster": ratio("cluster1", "cluster2")}


def ratios_by_round(rows: list[dict]) -> dict[str, list[float | None]]:
    """Each round's speed-ups, in round order, from the rows of all rounds."""
    rounds: dict[int, list[dict]] = {}
    for row in rows:
        rounds.setdefault(row["round"], []).append(row)
    by_round: dict[str, list[float | None]] = {"local": [], "cluster": []}
    for number in sorted(rounds):
        for key, value in speedups(rounds[number]).items():
            by_round[key].append(value)
    return by_round


def summarize_rounds(by_round: dict[str, list[float | None]]) -> dict[str, float | None]:
    """The speed-up to report: the median of the rounds' ratios (a round's ratio compares runs minutes
    apart). Unknown if any round failed, so a failure is never hidden behind the other rounds."""
    medians: dict[str, float | None] = {}
    for key, values in by_round.items():
        known = [value for value in values if value is not None]
        medians[key] = round(statistics.median(known), 2) if known and len(known) == len(values) else None
    return medians


def main(quick: bool) -> dict:
    total = 100_000 if quick else 1_000_000
    expected_windows(KEYS, 10)  # import and warm the check's code path before any sampling
    rows = [row for number in range(1 if quick else ROUNDS) for row in run_round(number, total)]
    by_round = ratios_by_round(rows)
    speedup = summarize_rounds(by_round)
    print(f"[scaling] speed-up local[2]/local[1] = {speedup['local']} (rounds {by_round['local']}), "
          f"two workers / one = {speedup['cluster']} (rounds {by_round['cluster']})", flush=True)
    return {"keys": KEYS, "records": total, "runs": rows, "speedup": speedup, "speedup_by_round": by_round,
            "scratch": SCRATCH}


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--one":
        one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        cli("scaling", main)
