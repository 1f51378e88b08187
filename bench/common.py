"""Shared pieces of the benchmark suite: workloads, the Windower job, Spark session, measurement.

Every benchmark module is runnable on its own (`python -m bench.<name> [--quick] --out FILE`) and
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
from millstream.model.records import END_OF_TIME

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
SCRATCH = os.environ.get("MILLSTREAM_BENCH_SCRATCH", "/tmp/millstream-bench")

# Event time of record 0 (a fixed epoch keeps runs reproducible and positive for Spark timestamps).
T0 = 1_700_000_000_000
EVENTS_PER_SECOND = 10_000  # event-time density of the throughput workload
DISORDER_MS = 250  # bounded out-of-order: a record is at most this much older than its base time


# -- workload ------------------------------------------------------------------------------------
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
    """Honest low watermark after n records: every later record is at least base(n) - disorder."""

    def __init__(self, rate: int = EVENTS_PER_SECOND, disorder_ms: int = DISORDER_MS) -> None:
        self.rate, self.disorder_ms = rate, disorder_ms

    def __call__(self, n: int) -> int:
        return T0 + (n * 1000) // self.rate - self.disorder_ms


FIRST_BATCH = 1_000  # records admitted into batch 0, which also pays the Python worker start-up


class KeyedInjector(GeneratorInjector):
    """GeneratorInjector whose first read is capped at FIRST_BATCH records, so batch 0 (excluded
    from steady-state rates, it starts the Python workers) carries little of the input."""

    def latest_offset(self, start: Offset, max_records: int | None) -> Offset:
        if start["next"] == 0:
            max_records = min(max_records or FIRST_BATCH, FIRST_BATCH)
        return super().latest_offset(start, max_records)


def keyed_injector(keys: int, total: int) -> GeneratorInjector:
    return KeyedInjector(KeyedRecords(keys), total, KeyedWatermark())


def expected_windows(keys: int, total: int) -> Counter:
    """The Windower's exact output multiset {(key, bucket, count)}, computed directly."""
    make = KeyedRecords(keys)
    per = Counter((make.key(i), make.timestamp(i) // 1000 * 1000) for i in range(total))
    return Counter((k, b, c) for (k, b), c in per.items())


class WallClockInjector(GeneratorInjector):
    """A paced generator whose record i has event time = the wall time it becomes available
    (started_ms + i / rate), and whose low watermark is the next record's time: event time tracks
    wall time, so watermark lag and latency are measured against the clock. Deterministic given
    offsets (started_ms is part of the offset Spark stores)."""

    def __init__(self, keys: int, rate: float, total: int) -> None:
        super().__init__(self._make, total, lambda n: 0, records_per_second=rate, max_records_per_read=100_000)
        self.keys = keys

    def _make(self, i: int) -> Record:  # pragma: no cover - replaced in read()
        raise NotImplementedError

    def at(self, started_ms: int, i: int) -> int:
        return started_ms + int(i * 1000 / self.records_per_second)

    def read(self, start: Offset, end: Offset) -> Iterator[Record]:
        started = end["started_ms"]
        for i in range(start["next"], end["next"]):
            yield Record(f"k{i % self.keys}", i, self.at(started, i), f"w{i}")

    def low_watermark(self, offset: Offset) -> int:
        if offset["next"] >= self.total:
            return END_OF_TIME
        if offset["started_ms"] is None:
            return 0
        return self.at(offset["started_ms"], offset["next"])


# -- computations --------------------------------------------------------------------------------
class Windower(Computation):
    """Per-key 1-second buckets; an event-time timer at each bucket's end emits (key, bucket, count)."""

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


class PassThrough(Computation):
    """Produces every record unchanged on its one output stream."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(Record(record.key, record.value, record.timestamp), self.output)


# -- Spark ---------------------------------------------------------------------------------------
def spark_session(conf: dict[str, str] | None = None, log_name: str = "spark") -> Any:
    """The same session millstream's SparkRunner creates (millstream's DEFAULT_CONF), local[2]."""
    from millstream.spark.session import create_session

    os.makedirs(SCRATCH, exist_ok=True)
    return create_session("local[2]", "millstream-bench", conf, log_path=os.path.join(SCRATCH, f"{log_name}.log"))


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
                item = {"batch": p.batchId, "rows": p.numInputRows, "durationMs": dict(p.durationMs),
                        "timestamp": p.timestamp, "watermark": (p.eventTime or {}).get("watermark")}
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

    def breakdown(self, name: str, skip_first: bool = True) -> dict[str, float]:
        """Mean durationMs per phase over batches that read rows (batch 0 excluded)."""
        items = [p for p in self.progress(name) if p["rows"] > 0 and (p["batch"] > 0 or not skip_first)]
        phases: dict[str, list[int]] = {}
        for p in items:
            for phase, ms in p["durationMs"].items():
                phases.setdefault(phase, []).append(ms)
        return {phase: round(sum(v) / len(v), 1) for phase, v in sorted(phases.items())} | {"batches": len(items)}

    def close(self, spark: Any) -> None:
        spark.streams.removeListener(self.listener)


def offsets_next(checkpoint: str, batch: int) -> int | None:
    """Records read by a GeneratorInjector up to the end of `batch`, from Spark's offset log
    (works for millstream's source and the baseline source alike: both store the injector offset)."""
    try:
        with open(os.path.join(checkpoint, "offsets", str(batch))) as f:
            end = json.loads(f.read().splitlines()[-1])
    except FileNotFoundError:
        return None
    if "senders" in end:
        return sum(s["offset"]["next"] for s in end["senders"].values() if "offset" in s)
    return end["next"]


def steady_rate(commits: list[tuple[int, float]], checkpoint: str, total: int) -> dict[str, float]:
    """Steady-state records/s: records read after batch 0 over wall time from batch 0's commit to
    the commit of the batch that emitted the last output. `commits` = [(batch, wall_s)]."""
    commits = sorted(commits)
    first_batch, first_t = commits[0]
    last_t = commits[-1][1]
    first_n = offsets_next(checkpoint, first_batch) or 0
    span = last_t - first_t
    measured = total - first_n
    return {"records_measured": measured, "steady_s": round(span, 3),
            "records_per_s": round(measured / span, 1) if span > 0 else float("nan"),
            "first_batch_records": first_n, "batches": len(commits)}


# -- memory --------------------------------------------------------------------------------------
class TreeMemory:
    """Samples the RSS of this process and all its descendants (JVM, Python daemon and workers)
    every `interval` s; keeps the peak of the sum and per role."""

    def __init__(self, interval: float = 0.5) -> None:
        import psutil

        self.psutil = psutil
        self.interval = interval
        self.peak: dict[str, int] = {"total": 0, "driver": 0, "jvm": 0, "python_workers": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        me = self.psutil.Process()
        roles = {"driver": me.memory_info().rss, "jvm": 0, "python_workers": 0}
        for child in me.children(recursive=True):
            try:
                name = child.name()
                rss = child.memory_info().rss
            except self.psutil.Error:
                continue
            roles["jvm" if name == "java" else "python_workers"] += rss
        roles["total"] = sum(roles.values())
        return roles

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for role, value in self.sample().items():
                    self.peak[role] = max(self.peak[role], value)
            except Exception:
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def peak_mb(self) -> dict[str, float]:
        return {role: round(v / 2**20, 1) for role, v in self.peak.items()}


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
            "pyspark": pyspark.__version__, "platform": platform.platform()}


def cli(name: str, main: Callable[[bool], dict]) -> None:
    """Entry point of one benchmark module."""
    parser = argparse.ArgumentParser(f"bench.{name}")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, f"{name}.json"))
    args = parser.parse_args()
    started = time.time()
    result = {"benchmark": name, "quick": args.quick, "machine": machine()}
    result.update(main(args.quick))
    result["elapsed_s"] = round(time.time() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(json.dumps(result, indent=2, default=str))
