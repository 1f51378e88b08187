"""State at scale: long-lived per-key state (a running model per key, kept forever, like Zeitgeist's
per-query models) at 1e6 keys, 1% of the keys touched per batch, for one hour of event time; and the
same job at 1e4 keys for comparison. Each configuration runs in a fresh driver process (local[2]).

Input (ModelInjector, 2 partitions): first a fill phase that touches every key once (batches of 1e5
records), then the steady phase: batches of exactly K/100 records (1e4 at 1e6 keys), each touching
that many distinct keys (record i has key (i * A) mod K, A coprime to K: every key once per K records),
event time spread evenly over one hour. The comparison run at 1e4 keys reads the same steady input
(same records per batch, same batches, same event time): only the key space differs, so there every
key is touched in every batch.

Measured over the steady phase, from the computation's status history (one file per published batch):
- `state_bytes_written` (bytes millstream gave Spark's state store) against `state_bytes_changed`
  (bytes of the changed keys' state and new dedup ids), per batch and summed (compactions amortized),
  over the steady phase after the first 15 minutes of event time (past the 10-minute dedup horizon:
  dedup ids at their steady number) and over all of it; and RocksDB's own count of bytes written
  (`rocksdbTotalBytesWritten`, Spark's state operator metrics), which also sees what millstream does
  not count (the `head` value, Spark's own timer/TTL column families);
- throughput: steady records / (publication of the last batch - publication of the last fill batch);
- memory: RSS of the process tree by role (psutil, every second): flat if the mean over the steady
  phase's last quarter is within 10% of the mean over its second quarter;
- growth of the checkpoint directory (Spark's offsets, commits, RocksDB changelogs and snapshots) and
  of the rest of the root (publication logs, staged manifests, status history, stream files).
Output (anomalies: a record whose value exceeds 4x its key's running mean) is compared with a replay
of the same model over the same records in plain Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from bench.common import (
    PROJECT_DIR,
    T0,
    ProcessTree,
    ProgressCollector,
    cli,
    dir_bytes,
    fresh_dir,
    percentile,
    spark_session,
    status_history,
    wait_done,
)
from millstream import Computation, GeneratorInjector, Record, ValueState
from millstream.model.injector import Offset

A = 2654435761  # odd and not a multiple of 5: coprime to every power-of-ten key count
HOUR_MS = 3_600_000
FILL_MS = 1_000  # the fill phase's records are stamped T0; the steady phase starts at T0 + FILL_MS
STEADY_START = T0 + FILL_MS
HORIZON_MS = 15 * 60_000  # past the default 10-minute dedup horizon
FILL_BATCH = 100_000
BINS = 12


class ModelWorkload:
    """Record i < K (fill): key i's first touch at T0. Record i >= K (steady): key (i * A) mod K,
    event time evenly over one hour from STEADY_START. Values: deterministic, with a spike every
    97th record."""

    def __init__(self, keys: int, steady: int) -> None:
        self.keys, self.steady = keys, steady

    def key(self, i: int) -> str:
        return f"q{(i * A) % self.keys}" if i >= self.keys else f"q{i}"

    def timestamp(self, i: int) -> int:
        if i < self.keys:
            return T0
        return STEADY_START + (i - self.keys) * HOUR_MS // self.steady

    def value(self, i: int) -> int:
        return (i * 7919) % 1000 + (5000 if i % 97 == 0 else 0)

    def __call__(self, i: int) -> Record:
        return Record(self.key(i), self.value(i), self.timestamp(i), f"m{i}")


class ModelInjector(GeneratorInjector):
    """ModelWorkload in 2 partitions; reads of at most FILL_BATCH records (both partitions together)
    during the fill phase, then of exactly `per_batch` (the steady batches)."""

    def __init__(self, keys: int, steady: int, per_batch: int) -> None:
        workload = ModelWorkload(keys, steady)
        super().__init__(workload, keys + steady, workload.timestamp, name="model", partitions=2)
        self.per_batch = per_batch

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        p = int(partition)
        fill = self._count(p, self.make_record.keys)  # type: ignore[attr-defined]
        done = start["next"]
        if done < fill:
            end = min(fill, done + FILL_BATCH // self.partition_count)
        else:
            end = min(self._count(p, self.total), done + self.per_batch // self.partition_count)
        return {"next": end, "started_ms": start["started_ms"] or int(time.time() * 1000)}


class RunningModel(Computation):
    """Per key, a running model kept forever: count, sum, sum of squares, last time and a profile of
    BINS five-minute bins (like Zeitgeist's per-query seasonal model, in integers). Produces an anomaly
    when a value exceeds 4x the key's running mean (after 3 values)."""

    model = ValueState("model")

    def process_record(self, ctx, record):
        handle = ctx.state(self.model)
        m = handle.get() or {"n": 0, "s": 0, "q": 0, "t": 0, "bins": [0] * BINS}
        v = record.value
        if m["n"] >= 3 and v * m["n"] > 4 * m["s"]:
            ctx.produce(Record(ctx.key, {"v": v, "n": m["n"], "s": m["s"]}, record.timestamp), "anomalies")
        m["n"] += 1
        m["s"] += v
        m["q"] += v * v
        m["t"] = record.timestamp
        m["bins"][(record.timestamp // 300_000) % BINS] += v
        handle.set(m)


def expected_anomalies(keys: int, steady: int) -> Counter:
    """The same model replayed in plain Python over the same records, in input order."""
    workload = ModelWorkload(keys, steady)
    models: dict[str, tuple[int, int]] = {}
    out: Counter = Counter()
    for i in range(keys + steady):
        key, v = workload.key(i), workload.value(i)
        n, s = models.get(key, (0, 0))
        if n >= 3 and v * n > 4 * s:
            out[(key, v, n, s, workload.timestamp(i))] += 1
        models[key] = (n + 1, s + v)
    return out


class DirSampler:
    """Sizes of the checkpoint directory and of the rest of the root, every `interval` s."""

    def __init__(self, root: str, interval: float = 10.0) -> None:
        self.root, self.interval = root, interval
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        checkpoints = dir_bytes(os.path.join(self.root, "checkpoints"))
        self.samples.append((time.time(), checkpoints, dir_bytes(self.root) - checkpoints))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "DirSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def checkpoint_by_quarter(self, start: float, end: float) -> list[float]:
        """Mean checkpoint size (MB) over each quarter of [start, end]."""
        span, means = (end - start) / 4, []
        for q in range(4):
            part = [cp for t, cp, _ in self.samples if start + q * span <= t <= start + (q + 1) * span]
            if part:
                means.append(round(sum(part) / len(part) / 2**20, 1))
        return means

    def at(self, t: float) -> tuple[int, int]:
        before = [s for s in self.samples if s[0] <= t]
        chosen = before[-1] if before else self.samples[0]
        return chosen[1], chosen[2]


def one(keys: int, per_batch: int, steady: int) -> dict:
    """One configuration, in this (fresh) process."""
    from millstream import Pipeline
    from millstream.spark.runner import SparkRunner

    name = f"state{keys}"
    directory = fresh_dir(f"state-{keys}-{per_batch}")
    root = os.path.join(directory, "root")
    pipeline = (Pipeline(name).add_injector("queries", ModelInjector(keys, steady, per_batch), "events")
                .add_computation("model", RunningModel(), ["events"], ["anomalies"]))
    with ProcessTree(interval=1.0) as tree:
        spark = spark_session(log_name=f"state-{keys}-{per_batch}")
        collector = ProgressCollector(spark)
        runner = SparkRunner(pipeline, root=root, spark=spark, max_records_per_batch=FILL_BATCH)
        with DirSampler(root) as dirs:
            try:
                wait_done(runner, 4 * 3600, f"state at {keys} keys")
            finally:
                runner.stop()
        history = status_history(root, "model")
        deadline = time.time() + 10
        while time.time() < deadline and len(collector.progress(f"{name}.model")) < len(history):
            time.sleep(0.2)
    output = Counter((r.key, r.value["v"], r.value["n"], r.value["s"], r.timestamp)
                     for r in runner.read_stream("anomalies"))
    expected = expected_anomalies(keys, steady)

    fill = [h for h in history if h["input_watermark"] <= STEADY_START]
    steady_batches = [h for h in history if h["input_watermark"] > STEADY_START]
    warm = [h for h in steady_batches if h["input_watermark"] >= STEADY_START + HORIZON_MS]
    start_s, end_s = fill[-1]["published_s"], steady_batches[-1]["published_s"]

    def ratio(items: list[dict]) -> dict[str, Any]:
        written = sum(h["state_bytes_written"] or 0 for h in items)
        changed = sum(h["state_bytes_changed"] or 0 for h in items)
        per = [h["state_bytes_written"] / h["state_bytes_changed"] for h in items if h["state_bytes_changed"]]
        return {"batches": len(items), "written_bytes": written, "changed_bytes": changed,
                "written_over_changed": round(written / changed, 3) if changed else None,
                "per_batch_p50": round(percentile(per, 0.5), 3), "per_batch_max": round(max(per), 2) if per else None,
                "compaction_batches": sum(1 for r in per if r > 3)}

    # RocksDB's own bytes written, per batch (summed over the state partitions).
    rocks = {p["batch"]: sum(int(s["custom"].get("rocksdbTotalBytesWritten", 0)) for s in p["state"])
             for p in collector.progress(f"{name}.model")}
    warm_ids = {h["batch"] for h in warm}
    # Spark's own split of a batch's time (durationMs: addBatch runs the stateful operator), mean
    # over the steady batches.
    phases: dict[str, list[int]] = {}
    steady_ids = {h["batch"] for h in steady_batches}
    for p in collector.progress(f"{name}.model"):
        if p["batch"] in steady_ids:
            for phase, ms in p["durationMs"].items():
                phases.setdefault(phase, []).append(ms)
    rocks_warm = sum(v for b, v in rocks.items() if b in warm_ids)
    changed_warm = sum(h["state_bytes_changed"] or 0 for h in warm)

    # Memory over the steady phase, by quarter.
    series = tree.rss_series(start_s, end_s)
    quarters: list[dict[str, float]] = []
    if series:
        span = (end_s - start_s) / 4
        for q in range(4):
            part = [rss for t, rss in series if start_s + q * span <= t <= start_s + (q + 1) * span]
            if part:
                roles = {role: sum(r[role] for r in part) / len(part) / 2**20 for role in part[0]}
                roles["total"] = sum(v for role, v in roles.items())
                quarters.append({role: round(v, 1) for role, v in roles.items() if v})
    growth = round(quarters[3]["total"] / quarters[1]["total"], 3) if len(quarters) == 4 else None
    (cp_start, rest_start), (cp_end, rest_end) = dirs.at(start_s), dirs.at(end_s + 1)
    steady_records = steady
    return {
        "keys": keys, "records_per_batch": per_batch, "steady_records": steady_records, "fill_batches": len(fill),
        "steady_s": round(end_s - start_s, 1),
        "records_per_s": round(steady_records / (end_s - start_s)),
        "batch_s_p50": round(percentile([b["published_s"] - a["published_s"]
                                         for a, b in zip(steady_batches, steady_batches[1:])], 0.5), 3),
        "state_after_horizon": ratio(warm), "state_all_steady": ratio(steady_batches),
        "steady_batch_ms_by_phase": {k: round(sum(v) / len(v)) for k, v in sorted(phases.items())},
        "rocksdb_bytes_written_after_horizon": rocks_warm,
        "rocksdb_over_changed_after_horizon": round(rocks_warm / changed_warm, 3) if changed_warm else None,
        "rss_mb_by_quarter": quarters, "rss_growth_q4_over_q2": growth,
        "memory_flat": growth is not None and growth <= 1.10,
        "peak_rss_mb": tree.peak_mb(),
        "checkpoint_mb": {"steady_start": round(cp_start / 2**20, 1), "steady_end": round(cp_end / 2**20, 1)},
        "root_other_mb": {"steady_start": round(rest_start / 2**20, 1), "steady_end": round(rest_end / 2**20, 1)},
        "checkpoint_growth_kb_per_batch": round((cp_end - cp_start) / 1024 / max(1, len(steady_batches)), 1),
        "checkpoint_mb_by_quarter": dirs.checkpoint_by_quarter(start_s, end_s),
        "root_other_growth_kb_per_batch": round((rest_end - rest_start) / 1024 / max(1, len(steady_batches)), 1),
        "anomalies": sum(expected.values()), "output_matches_expected": output == expected,
        "per_batch": [{k: h[k] for k in ("batch", "input_watermark", "state_bytes_written", "state_bytes_changed")}
                      | {"published_s": round(h["published_s"], 3), "rocksdb_bytes_written": rocks.get(h["batch"])}
                      for h in history],
    }


def run_one(keys: int, per_batch: int, steady: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (PROJECT_DIR, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-m", "bench.state", "--one", str(keys), str(per_batch), str(steady)],
                         cwd=PROJECT_DIR, env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"keys": keys, "error": (out.stdout + out.stderr)[-3000:]}
    result = json.loads(lines[-1])
    summary = {k: v for k, v in result.items() if k != "per_batch"}
    print(f"[state] {keys:,} keys: {result['records_per_s']} rec/s, written/changed "
          f"{result['state_after_horizon']['written_over_changed']} (RocksDB "
          f"{result['rocksdb_over_changed_after_horizon']}), RSS q4/q2 {result['rss_growth_q4_over_q2']}, "
          f"checkpoint {summary['checkpoint_mb']}, output ok {result['output_matches_expected']}", flush=True)
    return result


def main(quick: bool) -> dict:
    big, small = (100_000, 1_000) if quick else (1_000_000, 10_000)
    per_batch = big // 100  # 1% of the big key space per batch
    batches = 60 if quick else 360  # one hour of event time: one minute, or ten seconds, per batch
    steady = per_batch * batches
    large = run_one(big, per_batch, steady)
    base = run_one(small, per_batch, steady)
    ratio = None
    if "records_per_s" in large and "records_per_s" in base:
        ratio = round(large["records_per_s"] / base["records_per_s"], 3)
    print(f"[state] throughput {big:,} keys / {small:,} keys = {ratio}", flush=True)
    # Many small batches, as a low-latency pipeline runs for days: bytes written must follow the
    # changes however many batches ran since the last compaction.
    many_keys, many_per_batch, many_batches = (1_000, 10, 300) if quick else (10_000, 100, 1_500)
    many = run_one(many_keys, many_per_batch, many_per_batch * many_batches)
    return {"keys": big, "comparison_keys": small, "per_batch": per_batch, "steady_batches": batches,
            "event_time_ms": HOUR_MS, "large": large, "small": base, "throughput_ratio": ratio,
            "many_small_batches": many}


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))), flush=True)
    else:
        cli("state", main)
