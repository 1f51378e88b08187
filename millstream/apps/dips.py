"""The paper's Windower -> DipDetector pipeline (MillWheel section 5.2), with a ground truth.

Windower counts each key's records in 1-second buckets and produces a window once the low watermark
passes the bucket's end. DipDetector keeps each key's window counts and, once the low watermark has
passed a bucket, compares its count with the mean of the previous buckets: a dip is only certain when
no more data for the bucket can arrive. The generator makes out-of-order, delayed and dipping traffic
from a record index alone, so any runner can replay it, and `expected_output` recomputes both streams
in plain Python, independently of the framework.

Run it on local Spark:  python -m millstream.apps.dips --root ./dips-data   (--runner harness: no Spark)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from millstream.console.datadir import check_fresh_start, delete_for_fresh_start, settings_for_run
from millstream.console.options import (
    OneLineArgumentParser,
    UsageError,
    check_master,
    check_writable_directory,
    positive_float,
    positive_int,
    quiet_library_warnings,
)
from millstream.console.progress import ProgressDisplay, Snapshot
from millstream.console.running import run_command, run_on_harness, run_on_spark, snapshot_of_harness, snapshot_of_progress
from millstream.injectors.generator import GeneratorInjector
from millstream.model.computation import Computation, Context
from millstream.model.pipeline import Pipeline
from millstream.model.records import Record, Timer
from millstream.model.state import MapState
from millstream.spark.rootfiles import LAYOUT_FILE
from millstream.windows import Count, TumblingWindows, Window, WindowAggregate

HARNESS_BATCH_RECORDS = 100_000  # records per harness step when --batch-records is not given

BUCKET_MS = 1000
HISTORY_BUCKETS = 5  # buckets of history a dip is judged against
DIP_RATIO = 0.35  # a bucket below this fraction of the recent mean is a dip
MIN_MEAN = 4.0  # too little traffic to call anything a dip


def bucket_window(window: Window, count: int) -> dict[str, int]:
    """A window as the DipDetector reads it: the bucket's start and its count."""
    return {"bucket": window.start, "count": count}


class Windower(WindowAggregate[Any, int, int]):
    """The paper's Windower: each key's records counted per 1-second bucket, a window produced
    once the low watermark passes the bucket's end (stamped with the end). Late records (behind the
    low watermark) are dropped and counted in the `late` metric, not folded into a window that may
    be out already."""

    def __init__(self) -> None:
        super().__init__(TumblingWindows(BUCKET_MS), Count(), "windows", output_value=bucket_window, late="drop")


class DipDetector(Computation):
    counts = MapState[int, int]("counts")  # bucket start -> window count

    def process_record(self, ctx: Context, record: Record) -> None:
        bucket = record.value["bucket"]
        ctx.state(self.counts).put(bucket, record.value["count"])
        # Judge this bucket, and the next one too: a bucket with no records produces no window.
        # A window is stamped with its bucket's end; a low-watermark timer at T only promises that
        # records stamped before T are in, so the bucket is judged at its end + 1 ms.
        for judged in (bucket, bucket + BUCKET_MS):
            ctx.set_timer(f"d{judged}", judged + BUCKET_MS + 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        bucket = timer.time - BUCKET_MS - 1
        counts = ctx.state(self.counts)
        dip = judge(bucket, {b: c for b, c in counts.items()})
        if dip is not None:
            ctx.produce(Record(ctx.key, dip, timer.time), "dips")
        for old in [b for b in counts.keys() if b < bucket - HISTORY_BUCKETS * BUCKET_MS]:
            counts.remove(old)


def judge(bucket: int, counts: dict[int, int]) -> dict | None:
    """A dip record for `bucket` given the key's window counts, or None."""
    history = [counts.get(bucket - i * BUCKET_MS, 0) for i in range(1, HISTORY_BUCKETS + 1)]
    mean = sum(history) / len(history)
    actual = counts.get(bucket, 0)
    if mean >= MIN_MEAN and actual < DIP_RATIO * mean:
        return {"bucket": bucket, "count": actual, "expected": round(mean, 3)}
    return None


@dataclass(frozen=True)
class TrafficSpec:
    """Deterministic traffic: `events` records over `keys` keys at `events_per_second` of event time,
    jittered by up to `jitter_ms`, a fraction delayed by up to `max_delay_ms` (delivered late in
    arrival order but never behind the injector's honest watermark), and dips: in some buckets a key's
    records are moved to the key `quiet`."""

    events: int = 20_000
    keys: int = 10
    events_per_second: int = 200
    jitter_ms: int = 300
    delayed_fraction: float = 0.02
    max_delay_ms: int = 4000
    dip_every: int = 17  # every n-th (key, bucket) pair is a dip
    seed: int = 7

    def base_time(self, index: int) -> int:
        return 1_000_000 + index * 1000 // self.events_per_second

    def event(self, index: int) -> Record:
        rng = random.Random(self.seed * 1_000_003 + index)
        timestamp = self.base_time(index) - rng.randrange(self.jitter_ms + 1)
        if rng.random() < self.delayed_fraction:
            timestamp = self.base_time(index) - rng.randrange(self.jitter_ms, self.max_delay_ms + 1)
        key = f"k{rng.randrange(self.keys)}"
        bucket = timestamp - timestamp % BUCKET_MS
        if (hash_pair(key, bucket) % self.dip_every) == 0:
            key = "quiet"
        return Record(key, {"n": index}, timestamp, f"e{self.seed}-{index}")

    def low_watermark(self, next_index: int) -> int:
        """Honest: no record from `next_index` on is older than this."""
        return self.base_time(next_index) - self.max_delay_ms

    def injector(self, records_per_second: float | None = None) -> GeneratorInjector:
        return GeneratorInjector(self.event, self.events, self.low_watermark, records_per_second)


def hash_pair(key: str, bucket: int) -> int:
    """Stable across processes (unlike hash())."""
    value = 0
    for char in f"{key}@{bucket}":
        value = (value * 131 + ord(char)) % 1_000_000_007
    return value


def build_pipeline(spec: TrafficSpec, records_per_second: float | None = None,
                   sink_dir: str | None = None, windower_production: str = "strong") -> Pipeline:
    """With windower_production="weak" the windower runs fused into the dip detector's query and its
    windows are not logged."""
    pipeline = (
        Pipeline("dips")
        .add_injector("traffic", spec.injector(records_per_second), "events")
        .add_computation("windower", Windower(), ["events"], ["windows"], production=windower_production)
        .add_computation("dip_detector", DipDetector(), ["windows"], ["dips"])
    )
    if sink_dir:
        pipeline.add_sink("dips_out", "dips", sink_dir, format="jsonl")
    return pipeline


def expected_output(spec: TrafficSpec) -> dict[str, list[tuple]]:
    """Ground truth in plain Python: windows as (key, bucket, count), dips as (key, bucket, count)."""
    counts: Counter = Counter()
    for index in range(spec.events):
        record = spec.event(index)
        counts[(record.key, record.timestamp - record.timestamp % BUCKET_MS)] += 1
    per_key: dict[str, dict[int, int]] = defaultdict(dict)
    for (key, bucket), count in counts.items():
        per_key[key][bucket] = count
    dips = []
    for key, buckets in per_key.items():
        judged = set(buckets) | {b + BUCKET_MS for b in buckets}
        for bucket in judged:
            dip = judge(bucket, buckets)
            if dip is not None:
                dips.append((key, bucket, dip["count"]))
    windows = [(k, b, c) for (k, b), c in counts.items()]
    return {"windows": sorted(windows), "dips": sorted(dips)}


# -- the command ------------------------------------------------------------------------------------
PROG = "python -m millstream.apps.dips"
SETTINGS_FILE = "dips.json"
TRAFFIC_OPTIONS = ("events", "keys", "seed")


def rows(records: list[Record[Any]]) -> list[tuple[str, int, int]]:
    """Windows or dips as (key, bucket, count), the shape of expected_output."""
    return sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)


def verdict(windows: list[tuple[str, int, int]], dips: list[tuple[str, int, int]],
            truth: dict[str, list[tuple[str, int, int]]]) -> tuple[bool, str]:
    """(matches, the line saying so) for the produced windows and dips against the ground truth.

    >>> truth = {"windows": [("a", 0, 5), ("a", 1000, 1)], "dips": [("a", 1000, 1)]}
    >>> verdict(truth["windows"], truth["dips"], truth)
    (True, '2 windows, 1 dips: matches ground truth')
    >>> verdict([("a", 0, 5), ("a", 1000, 2)], [], truth)[1]
    '2 windows, 0 dips: differs from ground truth (windows: 1 missing, 1 unexpected; dips: 1 missing)'
    """
    head = f"{len(windows):,} windows, {len(dips):,} dips"
    problems = []
    for name, got in (("windows", windows), ("dips", dips)):
        expected = Counter(truth[name])
        produced = Counter(got)
        missing, unexpected = sum((expected - produced).values()), sum((produced - expected).values())
        if missing or unexpected:
            parts = ([f"{missing:,} missing"] if missing else []) + ([f"{unexpected:,} unexpected"] if unexpected else [])
            problems.append(f"{name}: {', '.join(parts)}")
    if not problems:
        return True, f"{head}: matches ground truth"
    return False, f"{head}: differs from ground truth ({'; '.join(problems)})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = TrafficSpec()
    parser = OneLineArgumentParser(prog=PROG, description="The paper's Windower -> DipDetector on Spark, checked "
                                                          "against its ground truth")
    parser.add_argument("--root", default="./dips-data", help="checkpoints and stream logs (default %(default)s)")
    parser.add_argument("--events", type=positive_int, help=f"records to generate (default {defaults.events:,})")
    parser.add_argument("--keys", type=positive_int, help=f"distinct keys (default {defaults.keys})")
    parser.add_argument("--seed", type=int, help=f"random seed of the traffic (default {defaults.seed})")
    parser.add_argument("--rate", type=positive_float, default=None, help="records per second (default: unpaced)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    parser.add_argument("--runner", choices=("spark", "harness"), default="spark",
                        help="spark (default) or harness: the in-process test harness, no Spark")
    parser.add_argument("--fresh", action="store_true", help="delete the root first and start over")
    parser.add_argument("--timeout", type=positive_float, default=None, help="give up after this many seconds")
    parser.add_argument("--batch-records", type=positive_int, default=None,
                        help=f"max records per micro-batch (default: SparkRunner's; harness: {HARNESS_BATCH_RECORDS:,})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    quiet_library_warnings()
    return run_command(lambda: _main(argv), PROG)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    # Everything checked before anything is deleted, created or started.
    args.root = check_writable_directory(args.root, "--root")
    if args.fresh:
        check_fresh_start(args.root, (SETTINGS_FILE, LAYOUT_FILE), "a dips root")
    if args.runner == "spark":
        check_master(args.master)
        try:
            from millstream.spark.runner import SparkRunner
        except ImportError as error:
            raise UsageError(f"the Spark runner is not available ({error}); try --runner harness") from None
    if args.fresh:
        delete_for_fresh_start(args.root, (SETTINGS_FILE, LAYOUT_FILE), "a dips root")
    asked = {name: getattr(args, name) for name in TRAFFIC_OPTIONS if getattr(args, name) is not None}
    defaults = TrafficSpec()
    settings, resumed = settings_for_run(args.root, SETTINGS_FILE, "traffic", asked,
                                         {name: getattr(defaults, name) for name in TRAFFIC_OPTIONS}, "a dips root",
                                         options=TRAFFIC_OPTIONS)
    spec = TrafficSpec(**settings)
    pipeline = build_pipeline(spec, args.rate)
    print(f"dips: {spec.events:,} events over {spec.keys} keys (seed {spec.seed}), 1-s windows, dips below "
          f"{DIP_RATIO:.0%} of the last {HISTORY_BUCKETS} s; root {args.root}"
          + (" (resuming)" if resumed and args.runner == "spark" else ""), flush=True)

    def events_read(records_of: Callable[[str], int]) -> int:
        return records_of("windower")

    def newest_event(records: int) -> int | None:
        return spec.base_time(records - 1) if records else None

    display = ProgressDisplay(unit="events", waiting="starting Spark" if args.runner == "spark" else "starting")
    if args.runner == "spark":
        batching = {"max_records_per_batch": args.batch_records} if args.batch_records else {}
        runner = SparkRunner(pipeline, root=args.root, master=args.master, **batching)

        def count(progress: Any) -> int:
            return events_read(lambda name: progress.computations[name].records if name in progress.computations else 0)

        def spark_snapshot(progress: Any, at_start: int) -> Snapshot:
            records = count(progress)
            return snapshot_of_progress(progress, list(pipeline.computations), records=records, total=spec.events,
                                        records_at_start=at_start, newest_event=newest_event(records))

        run_on_spark(runner, display, spark_snapshot, count, timeout=args.timeout)
        windows, dips = runner.read_stream("windows"), runner.read_stream("dips")
    else:
        from millstream.testing import PipelineHarness

        harness = PipelineHarness(pipeline, wall_time=int(time.time() * 1000))  # run_on_harness follows the clock

        def harness_snapshot(harness: Any) -> Snapshot:
            records = events_read(lambda name: harness.metrics(name).records)
            return snapshot_of_harness(harness, records=records, total=spec.events, newest_event=newest_event(records))

        run_on_harness(harness, display, harness_snapshot, records_per_step=args.batch_records or HARNESS_BATCH_RECORDS,
                       timeout=args.timeout)
        windows, dips = harness.output("windows"), harness.output("dips")
    matches, line = verdict(rows(windows), rows(dips), expected_output(spec))
    print(line, flush=True)
    return 0 if matches else 1


if __name__ == "__main__":
    sys.exit(main())
