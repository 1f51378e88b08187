"""Shared pieces of the benchmark suite: workloads, injectors, computations, Spark sessions, measurement.

Every benchmark module is runnable on its own (`python -m bench.<name> [--quick] [--out FILE]`) and
writes one JSON document; `bench/run.py` runs them in fresh processes and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterator

from millstream import Computation, GeneratorInjector, MapState, Record
from millstream.model.injector import Offset
from millstream.model.pipeline import DEFAULT_DEDUP_HORIZON_MS
from millstream.model.records import END_OF_TIME

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
PROJECT_DIR = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
SCRATCH = os.environ.get("MILLSTREAM_BENCH_SCRATCH", "/tmp/millstream-bench")

# Event time of record 0 (a fixed epoch keeps runs reproducible and positive for Spark timestamps).
T0 = 1_700_000_000_000
EVENTS_PER_SECOND = 10_000  # event-time density of the throughput workload
DISORDER_MS = 250  # bounded out-of-order: a record is at most this much older than its base time
# 1e6 records of the Windower workload span 100 s of event time, short of the default 10-minute dedup
# horizon: with it no id would expire before the end. With 10 seconds, batches of over ~102,500
# records (10.25 s: the horizon and the workload's disorder) expire the ids of the batch before, so
# the runs expire ids at the rate they add them, as a long run does. The index stays smaller than a
# long run's at the default horizon (6e6 ids at this rate); bench/state.py measures a large index.
STEADY_DEDUP_HORIZON_MS = 10_000


# -- the Windower workload -----------------------------------------------------------------------
class KeyedRecords:
    """Record i: key k{(i * 2654435761) mod K} (cycles through all K keys every K records),
    timestamp T0 + i/rate seconds minus a deterministic jitter in [0, DISORDER_MS)."""

    def __init__(self, keys: int, rate: int = EVENTS_PER_SECOND, disorder_ms: int = DISORDER_MS) -> None:
        self.keys, self.rate, self.disorder_ms = keys, rate, disorder_ms

    def key(self, i: int) -> str:
        return f"k{(i * 2654435761) % self.keys}"

    def timestamp(self, i: int) -> int:
        return T0 + (i * 1000) // self.rate - (i * 7919) % self.disorder_ms

    def __call__(self, i: int) -> Record:
        return Record(self.key(i), 1, self.timestamp(i), f"r{i}")


class KeyedWatermark:
    """Honest low watermark before record n: every record >= n is at least base(n) - disorder."""

    def __init__(self, rate: int = EVENTS_PER_SECOND, disorder_ms: int = DISORDER_MS) -> None:
        self.rate, self.disorder_ms = rate, disorder_ms

    def __call__(self, n: int) -> int:
        return T0 + (n * 1000) // self.rate - self.disorder_ms


class FirstRead:
    """Notes the wall time an injector first hands out a record, in a file (first writer wins).
    Injectors run in Spark's Python workers, which may be other processes (or machines: the file
    must be on a disk every reader shares; here, always the local disk)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def note(self) -> None:
        if self.path is None:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(repr(time.time()))

    def read(self) -> float | None:
        try:
            with open(self.path) as f:  # type: ignore[arg-type]
                return float(f.read())
        except (OSError, TypeError, ValueError):
            return None


class KeyedInjector(GeneratorInjector):
    """The Windower's input: a GeneratorInjector over KeyedRecords, split into `partitions` (so as
    many Spark tasks read it), noting the wall time of its first read."""

    def __init__(self, keys: int, total: int, partitions: int = 2, max_records_per_read: int = 100_000,
                 first_read: str | None = None) -> None:
        super().__init__(KeyedRecords(keys), total, KeyedWatermark(), max_records_per_read=max_records_per_read,
                         name="keyed", partitions=partitions)
        self.first_read = FirstRead(first_read)

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record]:
        if end["next"] > start["next"]:
            self.first_read.note()
        return super().read(partition, start, end)


def expected_windows(keys: int, total: int) -> Counter:
    """The Windower's exact output multiset {(key, bucket, count)}, computed directly."""
    make = KeyedRecords(keys)
    per = Counter((make.key(i), make.timestamp(i) // 1000 * 1000) for i in range(total))
    return Counter((k, b, c) for (k, b), c in per.items())


class WallClockInjector(GeneratorInjector):
    """A paced generator (one partition) whose record i has event time = the wall time it becomes
    available (started_ms + i / rate) and whose low watermark is the next record's time: event time
    tracks wall time, so latency and watermark lag are measured against the clock. Deterministic given
    offsets (started_ms is part of the offset Spark logs)."""

    def __init__(self, keys: int, rate: float, total: int) -> None:
        super().__init__(self._make, total, lambda n: 0, records_per_second=rate, max_records_per_read=100_000,
                         name="wall")
        self.keys = keys

    def _make(self, i: int) -> Record:  # pragma: no cover - replaced in read()
        raise NotImplementedError

    def at(self, started_ms: int, i: int) -> int:
        return started_ms + int(i * 1000 / self.records_per_second)  # type: ignore[operator]

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record]:
        started = end["started_ms"]
        for i in range(start["next"], end["next"]):
            yield Record(f"k{i % self.keys}", i, self.at(started, i), f"w{i}")

    def low_watermark(self, partition: str, offset: Offset) -> int:
        if offset["next"] >= self.total:
            return END_OF_TIME
        if offset["started_ms"] is None:
            return 0
        return self.at(offset["started_ms"], offset["next"])


def started_ms(root: str, computation: str) -> int | None:
    """started_ms of a WallClockInjector, from a computation's Spark offset log (every offset of the
    injector holds it; Spark keeps only the newest offset files)."""
    from millstream.spark.rescale import checkpoint_of

    offsets = os.path.join(checkpoint_of(root, computation), "offsets")
    last = max(int(n) for n in os.listdir(offsets) if n.isdigit())
    with open(os.path.join(offsets, str(last))) as f:
        senders = json.loads(f.read().splitlines()[-1])["senders"]
    for sender in senders.values():
        if "offset" in sender and sender["offset"].get("started_ms"):
            return int(sender["offset"]["started_ms"])
    return None


# -- computations --------------------------------------------------------------------------------
class Windower(Computation):
    """Per-key 1-second buckets; a low-watermark timer at each bucket's end emits (key, bucket, count)."""

    counts = MapState("counts")

    def process_record(self, ctx, record):
        bucket = record.timestamp // 1000 * 1000
        counts = ctx.state(self.counts)
        counts.put(bucket, counts.get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + 1000)

    def process_timer(self, ctx, timer):
        counts = ctx.state(self.counts)
        bucket = timer.time - 1000
        ctx.produce(Record(ctx.key, {"bucket": bucket, "count": counts.get(bucket)}, timer.time), "windows")
        counts.remove(bucket)


class BatchWindower(Windower):
    """The Windower taking a key's records of an input point in one call (process_records): one state
    lookup, one get/put and one timer per bucket instead of per record. (In bench/core's workload a
    key's bucket gets one record, so only the per-record call is saved.)"""

    def process_records(self, ctx, records):
        counts = ctx.state(self.counts)
        added: dict[int, int] = {}
        for record in records:
            bucket = record.timestamp // 1000 * 1000
            added[bucket] = added.get(bucket, 0) + 1
        for bucket, n in added.items():
            counts.put(bucket, counts.get(bucket, 0) + n)
            ctx.set_timer(f"w{bucket}", bucket + 1000)


class PassThrough(Computation):
    """Produces every record unchanged on its one output stream."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(Record(record.key, record.value, record.timestamp), self.output)


def windower_pipeline(name: str, injector: Any, exactly_once: bool = True,
                      dedup_horizon_ms: int = DEFAULT_DEDUP_HORIZON_MS) -> Any:
    from millstream import Pipeline

    return (Pipeline(name).add_injector("gen", injector, "events")
            .add_computation("win", Windower(), ["events"], ["windows"], exactly_once=exactly_once,
                             dedup_horizon_ms=dedup_horizon_ms))


def window_rows(records: Any) -> Counter:
    return Counter((r.key, r.value["bucket"], r.value["count"]) for r in records)


# -- Spark ---------------------------------------------------------------------------------------
def spark_session(master: str = "local[2]", conf: dict[str, str] | None = None, log_name: str = "spark") -> Any:
    """The session millstream's SparkRunner creates (millstream's DEFAULT_CONF) on `master`."""
    from millstream.spark.session import create_session

    os.makedirs(SCRATCH, exist_ok=True)
    return create_session(master, "millstream-bench", conf, log_path=os.path.join(SCRATCH, f"{log_name}.log"))


def phase_means(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Mean durationMs per phase over the batches that read rows."""
    items = [p for p in progress if p["rows"] > 0]
    phases: dict[str, list[int]] = {}
    for p in items:
        for phase, ms in p["durationMs"].items():
            phases.setdefault(phase, []).append(ms)
    return {phase: round(sum(v) / len(v), 1) for phase, v in sorted(phases.items())} | {"batches": len(items)}


def recent_progress(query: Any, last_batch: int = -1, limit_s: float = 10) -> list[dict[str, Any]]:
    """A running query's progress per batch (Spark keeps its last 100), read once the batch
    `last_batch` is among them (at most `limit_s`). Read from the query as JSON, after the timed part:
    a Python listener would convert every event through py4j while the run is timed, which costs
    the JVM CPU (docs/performance.md, "The JVM's Java code, sampled")."""
    deadline = time.time() + limit_s
    while True:
        items = [{"batch": p.batchId, "rows": p.numInputRows, "durationMs": dict(p.durationMs)}
                 for p in query.recentProgress]
        if max((i["batch"] for i in items), default=-1) >= last_batch or time.time() > deadline:
            return items
        time.sleep(0.2)


class ProgressCollector:
    """Collects StreamingQueryProgress of every query of a session, by query name."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        collector = self
        self.by_name: dict[str, list[dict]] = {}
        self.lock = threading.Lock()

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event):  # noqa: N802
                pass

            def onQueryProgress(self, event):  # noqa: N802
                p = event.progress
                state = [{"rows_total": s.numRowsTotal, "rows_updated": s.numRowsUpdated,
                          "memory_bytes": s.memoryUsedBytes, "custom": dict(s.customMetrics or {})}
                         for s in (p.stateOperators or [])]
                item = {"batch": p.batchId, "rows": p.numInputRows, "durationMs": dict(p.durationMs),
                        "timestamp": p.timestamp, "state": state}
                with collector.lock:
                    collector.by_name.setdefault(p.name or str(p.id), []).append(item)

            def onQueryIdle(self, event):  # noqa: N802
                pass

            def onQueryTerminated(self, event):  # noqa: N802
                pass

        self.listener = _Listener()
        spark.streams.addListener(self.listener)

    def progress(self, name: str) -> list[dict]:
        with self.lock:
            return list(self.by_name.get(name, []))

    def breakdown(self, name: str) -> dict[str, float]:
        return phase_means(self.progress(name))

    def close(self, spark: Any) -> None:
        spark.streams.removeListener(self.listener)


def published(root: str, computation: str) -> list[dict[str, Any]]:
    """A computation's published batches, oldest first: batch, when it was published (mtime of its
    publication-log entry), rows per output stream, and its status."""
    directory = os.path.join(root, "log", computation)
    out = []
    for name in sorted(os.listdir(directory)):
        if not name[:12].isdigit():
            continue
        path = os.path.join(directory, name)
        with open(path) as f:
            entry = json.load(f)
        if entry.get("type") != "batch":
            continue
        out.append({"batch": entry["batch"], "published_s": os.stat(path).st_mtime,
                    "rows": {s: sum(r for _, r in files) for s, files in entry["streams"].items()},
                    "files": entry["streams"], "status": entry["status"]})
    return out


def status_history(root: str, computation: str) -> list[dict[str, Any]]:
    """Per published batch, the status history file (batch, watermarks, wall_ms, state bytes written
    and changed) and the time it was written (its publication)."""
    directory = os.path.join(root, "status", computation, "history")
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            path = os.path.join(directory, name)
            with open(path) as f:
                out.append(json.load(f) | {"published_s": os.stat(path).st_mtime})
    return out


def wait_done(runner: Any, timeout: float, what: str) -> None:
    """Start the runner and wait until every computation's watermark reached END_OF_TIME."""
    started = time.time()
    runner.start()
    while True:
        runner.raise_if_failed()
        if runner.progress().done:
            return
        if time.time() - started > timeout:
            raise TimeoutError(f"{what} not done after {timeout} s: {runner.progress()}")
        time.sleep(0.2)


def dir_bytes(path: str) -> int:
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                pass
    return total


# -- processes: memory and CPU by role -----------------------------------------------------------
PROCESS_ROLES = ("driver", "driver_python", "driver_jvm", "jvm", "executor_jvm", "executor_python",
                 "cluster_daemons", "harness")
# A local-mode JVM is the driver and the executors at once: its CPU is split by thread name (Linux
# shows the first 15 characters of a Java thread's name).
_EXECUTOR_THREADS = ("Executor task", "stdout reader", "stderr reader", "Worker Monitor", "Idle Worker",
                     "stateConnection", "rocksdb", "state-store", "block-manager", "shuffle-", "process reaper",
                     "executor-")
_SHARED_THREADS = ("GC Thread", "G1 ", "VM ", "C1 Compiler", "C2 Compiler", "Sweeper", "Service Thread",
                   "Monitor Deflati", "Reference Hand", "Finalizer", "Signal Dispatch", "Common-Cleaner",
                   "Notification Th", "java")


def jvm_thread_role(name: str) -> str:
    """jvm_executor (tasks, Python worker plumbing, state store), jvm_shared (GC, JIT, VM) or
    jvm_driver (stream execution, scheduler, RPC, listeners: everything else)."""
    if name.startswith(_EXECUTOR_THREADS):
        return "jvm_executor"
    if name.startswith(_SHARED_THREADS):
        return "jvm_shared"
    return "jvm_driver"


def classify(proc: Any, driver_pid: int, harness_pid: int, cache: dict[tuple[int, str], str]) -> str:
    """The role of a process.

    - driver: the driver's own Python process (millstream's driver code, foreachBatch callbacks);
    - driver_python: Python processes the driver's JVM starts to plan batches (the Python data source's
      offsets and partitions: `pyspark.sql.worker.*`, the streaming source runner);
    - driver_jvm / executor_jvm: on a cluster, the driver's JVM and the executors' JVMs;
    - jvm: a local-mode JVM, which is the driver and the executors at once (split by thread);
    - executor_python: Spark's Python workers that run tasks (`pyspark.worker`, forked by
      pyspark.daemon, and anything under an executor JVM);
    - cluster_daemons: a standalone master or worker JVM;
    - harness: the benchmark process that started the driver and the cluster (idle meanwhile)."""
    pid = proc.pid
    try:
        # Keyed by name too: Spark's launch scripts exec into java under the same pid.
        ident = (pid, proc.name())
    except Exception:
        return "executor_python"
    if ident in cache:
        return cache[ident]
    if pid == driver_pid:
        role = "driver"
    elif pid == harness_pid:
        role = "harness"
    else:
        try:
            name = proc.name()
            cmd = " ".join(proc.cmdline())
        except Exception:
            return "executor_python"
        if name == "java" or cmd.split(" ", 1)[0].endswith("/java"):
            if "CoarseGrainedExecutorBackend" in cmd:
                role = "executor_jvm"
            elif "deploy.master.Master" in cmd or "deploy.worker.Worker" in cmd:
                role = "cluster_daemons"
            elif "spark://" in cmd:  # a driver submitted to a standalone master
                role = "driver_jvm"
            else:
                role = "jvm"
        else:
            parent = proc.parent()
            parent_role = classify(parent, driver_pid, harness_pid, cache) if parent is not None else "harness"
            if parent_role in ("executor_jvm", "executor_python"):
                role = "executor_python"
            elif parent_role in ("driver_jvm", "jvm", "driver_python"):
                # Under the driver's JVM, task workers run `pyspark.worker` (in local mode the
                # executors are that JVM); the rest plans batches for the driver.
                role = "executor_python" if cmd.rstrip().endswith("pyspark.worker") else "driver_python"
            else:
                role = parent_role
    cache[ident] = role
    return role


class ProcessTree:
    """Samples, every `interval` s, the RSS and CPU time (user + system) of every process under
    `harness_pid` (default: this process), by role (see classify); a local-mode JVM's CPU per thread
    (see jvm_thread_role). `driver_pid` is the driver's Python process (default: the harness itself).
    CPU time of a process or thread that ends between two samples counts up to its last sample:
    sampling often keeps that loss small."""

    def __init__(self, interval: float = 0.5, harness_pid: int | None = None, driver_pid: int | None = None) -> None:
        try:
            import psutil
        except ImportError:
            raise SystemExit("this benchmark samples memory and CPU with psutil: pip install -e '.[bench]'") from None

        self.psutil = psutil
        self.interval = interval
        self.root = psutil.Process(harness_pid or os.getpid())
        self.driver_pid = driver_pid or self.root.pid
        self.samples: list[tuple[float, dict[str, int], dict[Any, tuple[str, float]]]] = []
        self._roles: dict[tuple[int, str], str] = {}
        self._procs: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-process-tree")

    def sample(self) -> tuple[float, dict[str, int], dict[Any, tuple[str, float]]]:
        rss = {role: 0 for role in PROCESS_ROLES}
        cpu: dict[Any, tuple[str, float]] = {}
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except self.psutil.Error:
            procs = []
        for proc in procs:
            proc = self._procs.setdefault(proc.pid, proc)  # the same object keeps psutil's caches
            try:
                role = classify(proc, self.driver_pid, self.root.pid, self._roles)
                with proc.oneshot():
                    memory = proc.memory_info().rss
                    if role == "jvm":
                        for thread in proc.threads():
                            cpu[(proc.pid, thread.id)] = (jvm_thread_role(_thread_name(proc.pid, thread.id)),
                                                          thread.user_time + thread.system_time)
                    else:
                        times = proc.cpu_times()
                        cpu[proc.pid] = (role, times.user + times.system)
            except self.psutil.Error:
                continue
            rss[role] += memory
        return time.time(), rss, cpu

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception:
                pass
            self._stop.wait(self.interval)

    def start(self) -> "ProcessTree":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "ProcessTree":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- summaries -----------------------------------------------------------------------------
    def cpu_by_role(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds spent by each role between two wall times (each process's or thread's last
        sample at or before each bound; one not yet alive at `start` counts from zero)."""
        before: dict[Any, tuple[str, float]] = {}
        after: dict[Any, tuple[str, float]] = {}
        for t, _, cpu in self.samples:
            if t <= start:
                before.update(cpu)
            if t <= end:
                after.update(cpu)
        spent: dict[str, float] = {}
        for ident, (role, total) in after.items():
            spent[role] = spent.get(role, 0.0) + max(0.0, total - before.get(ident, (role, 0.0))[1])
        return {role: round(v, 2) for role, v in sorted(spent.items()) if v > 0}

    def rss_series(self, start: float | None = None, end: float | None = None) -> list[tuple[float, dict[str, int]]]:
        return [(t, rss) for t, rss, _ in self.samples
                if (start is None or t >= start) and (end is None or t <= end)]

    def peak_mb(self) -> dict[str, float]:
        peak: dict[str, int] = {}
        for _, rss, _ in self.samples:
            for role, value in rss.items():
                peak[role] = max(peak.get(role, 0), value)
            peak["total"] = max(peak.get("total", 0), sum(rss.values()))
        return {role: round(v / 2**20, 1) for role, v in peak.items() if v}


def _thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def cpu_shares(cpu: dict[str, float]) -> dict[str, Any]:
    """The driver's share of all CPU spent (the harness excluded). On a cluster the driver is its
    Python process, its JVM and the planners its JVM starts. In local mode the JVM's threads are split
    by name; its shared threads (GC, JIT, VM) belong to both, so the share is given as a range:
    without them (`driver_share`) and with all of them counted as the driver's (`driver_share_max`)."""
    total = sum(v for role, v in cpu.items() if role != "harness")
    driver = cpu.get("driver", 0) + cpu.get("driver_python", 0) + cpu.get("driver_jvm", 0) + cpu.get("jvm_driver", 0)
    shared = cpu.get("jvm_shared", 0)
    executors = (cpu.get("executor_python", 0) + cpu.get("executor_jvm", 0) + cpu.get("jvm_executor", 0))
    return {"cpu_s": cpu, "total_cpu_s": round(total, 2),
            "driver_share": round(driver / total, 3) if total else None,
            "driver_share_max": round((driver + shared) / total, 3) if total else None,
            "executor_share": round(executors / total, 3) if total else None}


# -- misc ----------------------------------------------------------------------------------------
def fresh_dir(name: str) -> str:
    path = os.path.join(SCRATCH, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def machine() -> dict[str, Any]:
    import pyspark

    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count(), "python": platform.python_version(),
            "pyspark": pyspark.__version__, "platform": platform.platform(), "loadavg": os.getloadavg()}


def cli(name: str, main: Callable[[bool], dict]) -> None:
    """Entry point of one benchmark module."""
    parser = argparse.ArgumentParser(f"bench.{name}")
    parser.add_argument("--quick", action="store_true", help="small sizes: a sanity run of a minute or two")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, f"{name}.json"))
    args = parser.parse_args()
    started = time.time()
    result = {"benchmark": name, "quick": args.quick, "machine": machine()}
    result.update(main(args.quick))
    result["elapsed_s"] = round(time.time() - started, 1)
    result["loadavg_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(json.dumps(result, indent=2, default=str))
