"""The offline core on one core: the Windower through the executor exactly as the Spark operator
drives it (bundled deliveries in, sorted into input order, one step per key group and batch against
the in-memory key store, through the operator's own `step_bundles` and so with its garbage-collector
handling), next to a plain-CPython Windower with a timer heap written for this workload alone: the
interpreter's own speed, what the core's overhead is measured against.

The dedup horizon is 10 seconds of event time (bench.common.STEADY_DEDUP_HORIZON_MS), so most of
the run is past it, expiring ids as fast as it adds them (the 50k-record batches below keep three
batches' ids). Batches are the size the Spark runner's batch pacing starts at (spark/pacing.py:
FIRST_BATCH_RECORDS), the end-to-end job's first batches: at 1e4 keys and 200k-record batches a key
group's step holds ~20 records per key. The work paid once per key and step (loading and storing
the key's state) weighs more in smaller batches: a fourth run, interleaved too, takes 50k-record
batches (~5 records per key per step; the figure earlier measurements reported).

A third run, interleaved with them, gives the same workload to the core through the per-key batch
hook (bench.common.BatchWindower: `process_records` instead of `process_record`): what a user who
can vectorize gets.

A fifth run calls the Windower's own `process_record` and `process_timer`, per record and per timer,
with a thin context organized as the core is (per key a dict of its timers and one heap entry for
the earliest; a dict for its map state; productions encoded by the JSON codec) and no ids, dedup,
persistence or input points: what the user's code costs with little around it. Core / that ratio
shows the framework's share. Every run must give the plain Windower's windows, each in the same
batch (the 50k-record run: the same windows).

All run in this one process, interleaved (core, plain, batch hook, small batches, user code alone,
core, ...), each timed by the process's CPU time (time.process_time: what another process on the
machine takes from this one's core is not charged) and by wall time; the best of the repeats counts.
The ratio core / plain is the figure to trust on a busy machine.

`python -m bench.core [--quick]`; PROFILE=1 also prints a cProfile of the core (CPU time, top 15 by
cumulative and by own time) and writes it to bench/results/core-profile.txt.
"""

from __future__ import annotations

import cProfile
import heapq
import io
import os
import pstats
import time
from collections import Counter
from functools import partial
from typing import Protocol

from bench.common import (RESULTS_DIR, STEADY_DEDUP_HORIZON_MS, BatchWindower, KeyedRecords, KeyedWatermark, Windower,
                          cli)
from millstream import Pipeline, ScriptedInjector
from millstream.core.garbage import bulk_work
from millstream.core.plan import key_group, plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment
from millstream.model.codecs import DEFAULT_CODEC
from millstream.model.records import END_OF_TIME, Record, TimeDomain, Timer
from millstream.spark.bundles import (BUNDLE_RECORDS, FeedItem, pack_deliveries, pack_production_columns,
                                      unpack_production_columns)
from millstream.spark.operator import step_bundles
from millstream.spark.pacing import FIRST_BATCH_RECORDS

KEY_GROUPS = 32
SENDER_PARTITIONS = 2  # the throughput job's injector partitions
SMALL_BATCH = 50_000


def bundles(keys: int, start: int, end: int, segment: int) -> dict[int, list[bytes]]:
    """What the source sends the operator for records start..end: bundles per key group, as two
    sender partitions (record i in partition i mod 2, at its position there) bundle them, the first
    partition's bundles first. A key group's records of the two interleave: the operator sorts
    them into input order, as it does in Spark."""
    make, codec = KeyedRecords(keys), DEFAULT_CODEC
    groups: dict[tuple[int, int], list[FeedItem]] = {}  # by (partition, key group)
    group_of: dict[str, int] = {}
    for i in range(start, end):
        r = make(i)
        group = group_of.get(r.key)
        if group is None:
            group = group_of[r.key] = key_group(r.key, KEY_GROUPS)
        partition = i % SENDER_PARTITIONS
        groups.setdefault((partition, group), []).append(
            (r.key, r.key, codec.encode(r.value), r.timestamp, r.id, segment, (i - start) // SENDER_PARTITIONS))
    per_group: dict[int, list[bytes]] = {}
    for (_, group), items in sorted(groups.items()):
        per_group.setdefault(group, []).extend(pack_deliveries("events", True, items[at:at + BUNDLE_RECORDS])
                                               for at in range(0, len(items), BUNDLE_RECORDS))
    return per_group


class Meter(Protocol):
    """What measures a run's timed part: a cProfile.Profile, or bench/instructions.py's counter."""

    def enable(self) -> None: ...

    def disable(self) -> None: ...


def run_core(keys: int, total: int, batch: int, profiler: Meter | None = None,
             computation: type[Windower] = Windower) -> tuple[float, float, Counter]:
    """(CPU seconds, wall seconds, the windows as a multiset of (key, bucket, count, the batch it
    came out in)). With `profiler`, it profiles the timed part only."""
    pipeline = (Pipeline("p").add_injector("gen", ScriptedInjector("gen", []), "events")
                .add_computation("win", computation(), ["events"], ["windows"],
                                 dedup_horizon_ms=STEADY_DEDUP_HORIZON_MS))
    plan = plan_computation(pipeline, "win", KEY_GROUPS)
    stores = [MemoryKeyStore() for _ in range(KEY_GROUPS)]
    codecs = {"events": plan.input("events").codec}
    watermark = KeyedWatermark()
    inputs = [bundles(keys, s, min(total, s + batch), 0) for s in range(0, total, batch)]  # not timed: the source's work
    produced: list[tuple[int, bytes]] = []  # (batch, a key group's productions)
    before = watermark(0)
    if profiler is not None:
        profiler.enable()
    started, started_wall = time.process_time(), time.perf_counter()
    for number, per_group in enumerate(inputs):
        end = min(total, (number + 1) * batch)
        after = watermark(end) if end < total else END_OF_TIME
        segments = [Segment(before, after)]
        for group in range(KEY_GROUPS):
            result = step_bundles(plan, stores[group], per_group.get(group, []), codecs, segments, 0)
            produced.append((number, pack_production_columns(result.rows)))  # as the operator ships them
        before = after
    cpu, wall = time.process_time() - started, time.perf_counter() - started_wall
    if profiler is not None:
        profiler.disable()
    out_codec = plan.output_codecs["windows"]
    windows = Counter()
    for number, chunk in produced:
        for _, key, encoded, *_ in zip(*unpack_production_columns(chunk)):
            value = out_codec.decode(encoded)
            windows[(key, value["bucket"], value["count"], number)] += 1
    return cpu, wall, windows


def run_plain(keys: int, total: int, batch: int, profiler: Meter | None = None) -> tuple[float, float, Counter]:
    """The same windows (and the batch each comes out in) with a dict per key and one heap of
    (bucket end, key): no framework. With `profiler`, it measures the timed part only."""
    make, watermark = KeyedRecords(keys), KeyedWatermark()
    records = [make(i) for i in range(total)]
    counts: dict[str, dict[int, int]] = {}
    heap: list[tuple[int, str]] = []
    out: list[tuple[str, int, int, int]] = []
    if profiler is not None:
        profiler.enable()
    started, started_wall = time.process_time(), time.perf_counter()
    for number, start in enumerate(range(0, total, batch)):
        end = min(total, start + batch)
        for record in records[start:end]:
            bucket = record.timestamp - record.timestamp % 1000
            buckets = counts.setdefault(record.key, {})
            if bucket not in buckets:
                buckets[bucket] = 0
                heapq.heappush(heap, (bucket + 1000, record.key))
            buckets[bucket] += 1
        limit = watermark(end) if end < total else END_OF_TIME
        while heap and heap[0][0] <= limit:
            at, key = heapq.heappop(heap)
            out.append((key, at - 1000, counts[key].pop(at - 1000), number))
    cpu, wall = time.process_time() - started, time.perf_counter() - started_wall
    if profiler is not None:
        profiler.disable()
    return cpu, wall, Counter(out)


class _ThinMap(dict):
    """A map state as a bare dict (`get` is dict's own): what `ctx.state` gives user code in
    `run_user_code_alone`."""

    put = dict.__setitem__
    remove = dict.__delitem__  # the Windower removes only buckets it holds


class _ThinContext:
    """The context the Windower's code runs against in `run_user_code_alone`: one key's map, its
    pending timers (tag -> time) and the earliest of them, its productions encoded by the JSON codec
    into one list. No ids, no dedup, no persistence, no input points."""

    __slots__ = ("key", "map", "timers", "wake", "heap", "out")

    def __init__(self, key: str, heap: list[tuple[int, str]], out: list[tuple[str, bytes]]) -> None:
        self.key, self.map, self.timers, self.wake, self.heap, self.out = key, _ThinMap(), {}, None, heap, out

    def state(self, spec: object) -> _ThinMap:
        return self.map

    def set_timer(self, tag: str, time: int) -> None:
        self.timers[tag] = time
        if self.wake is None or time < self.wake:  # the key's heap entry moves earlier
            self.wake = time
            heapq.heappush(self.heap, (time, self.key))

    def produce(self, record: Record, stream: str) -> None:
        self.out.append((record.key, DEFAULT_CODEC.encode(record.value)))


def run_user_code_alone(keys: int, total: int, batch: int,
                        profiler: Meter | None = None) -> tuple[float, float, Counter]:
    """The Windower's own process_record and process_timer, called per record and per timer on
    records built beforehand, with a thin context (`_ThinContext`) organized as the core is: per key
    a dict of its timers and one heap entry for its earliest (stale entries skipped), a due key's
    timers fired in (time, tag) order. What the user's code costs with little around it; as the
    core's steps, it runs with the collector held back (core/garbage.py). With `profiler`, it
    measures the timed part only."""
    make, watermark = KeyedRecords(keys), KeyedWatermark()
    records = [make(i) for i in range(total)]
    windower = Windower()
    process_record, process_timer = windower.process_record, windower.process_timer
    heap: list[tuple[int, str]] = []  # (a key's earliest timer, the key)
    out: list[tuple[str, bytes]] = []
    batch_of_output: list[int] = []  # per production, the batch it came out in
    contexts: dict[str, _ThinContext] = {}
    # Timers built as the executor builds them: a tuple of Timer's fields, past NamedTuple's __new__.
    new_timer, low_watermark_domain = tuple.__new__, TimeDomain.LOW_WATERMARK
    if profiler is not None:
        profiler.enable()
    started, started_wall = time.process_time(), time.perf_counter()
    with bulk_work():
        for number, start in enumerate(range(0, total, batch)):
            end = min(total, start + batch)
            for record in records[start:end]:
                ctx = contexts.get(record.key)
                if ctx is None:
                    ctx = contexts[record.key] = _ThinContext(record.key, heap, out)
                process_record(ctx, record)
            limit = watermark(end) if end < total else END_OF_TIME
            while heap and heap[0][0] <= limit:
                wake, key = heapq.heappop(heap)
                ctx = contexts[key]
                if ctx.wake != wake:
                    continue  # the key's entry moved earlier, and fired then
                timers = ctx.timers
                for at, tag in sorted([(at, tag) for tag, at in timers.items() if at <= limit]):
                    del timers[tag]
                    process_timer(ctx, new_timer(Timer, (at, tag, low_watermark_domain, None)))
                ctx.wake = min(timers.values()) if timers else None
                if ctx.wake is not None:
                    heapq.heappush(heap, (ctx.wake, key))
            batch_of_output.extend([number] * (len(out) - len(batch_of_output)))
    cpu, wall = time.process_time() - started, time.perf_counter() - started_wall
    if profiler is not None:
        profiler.disable()
    assert not any(ctx.timers for ctx in contexts.values()), "timers still pending at the end of the input"
    windows = Counter()
    for (key, encoded), number in zip(out, batch_of_output):
        value = DEFAULT_CODEC.decode(encoded)
        windows[(key, value["bucket"], value["count"], number)] += 1
    return cpu, wall, windows


def without_batches(windows: Counter) -> Counter:
    """(key, bucket, count) of each window, whichever batch it came out in: runs in batches of
    different sizes give the same windows in other batches."""
    return Counter((key, bucket, count) for key, bucket, count, _ in windows.elements())


def profile(keys: int, total: int, batch: int) -> str:
    """A cProfile of the core (CPU time): top 15 by cumulative time, then by own time."""
    profiler = cProfile.Profile(time.process_time)
    run_core(keys, total, batch, profiler)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(15)
    stats.sort_stats("tottime").print_stats(15)
    return text.getvalue()


def main(quick: bool) -> dict:
    keys, total, batch = 10_000, (400_000 if quick else 1_000_000), FIRST_BATCH_RECORDS
    repeats = 2 if quick else 3
    run_core(keys, 50_000, batch)  # warm-up
    if os.environ.get("PROFILE"):
        text = profile(keys, 200_000, batch)
        print(text)
        os.makedirs(RESULTS_DIR, exist_ok=True)
        with open(os.path.join(RESULTS_DIR, "core-profile.txt"), "w") as f:
            f.write(text)
    run_batched = partial(run_core, computation=BatchWindower)
    core_cpu, core_wall, plain_cpu, plain_wall, batched_cpu, batched_wall = [], [], [], [], [], []
    small_cpu: list[float] = []
    alone_cpu: list[float] = []
    for _ in range(repeats):
        outputs = []
        for runner, size, cpu, wall in ((run_core, batch, core_cpu, core_wall), (run_plain, batch, plain_cpu, plain_wall),
                                        (run_batched, batch, batched_cpu, batched_wall),
                                        (run_core, SMALL_BATCH, small_cpu, []),
                                        (run_user_code_alone, batch, alone_cpu, [])):
            seconds, wall_seconds, out = runner(keys, total, size)
            wall.append(wall_seconds)
            cpu.append(seconds)
            outputs.append(out)
        core_out, plain_out, batched_out, small_out, alone_out = outputs
        assert core_out == plain_out, "the core's windows differ from plain Python's"
        assert batched_out == plain_out, "the batch hook's windows differ from plain Python's"
        assert without_batches(small_out) == without_batches(plain_out), \
            "the core's windows in small batches differ from plain Python's"
        assert alone_out == plain_out, "the user code alone gives other windows than plain Python's"
    core_s, plain_s, batched_s, small_s = min(core_cpu), min(plain_cpu), min(batched_cpu), min(small_cpu)
    alone_s = min(alone_cpu)
    result = {"keys": keys, "records": total, "batch": batch, "windows": sum(core_out.values()), "identical_output": core_out == plain_out, "repeats": repeats,
              "core_records_per_s": round(total / core_s), "plain_records_per_s": round(total / plain_s),
              "core_vs_plain": round(plain_s / core_s, 3),
              "batch_hook_records_per_s": round(total / batched_s), "batch_hook_vs_plain": round(plain_s / batched_s, 3),
              "user_code_alone_records_per_s": round(total / alone_s), "user_code_alone_vs_plain": round(plain_s / alone_s, 3),
              "core_vs_user_code_alone": round(alone_s / core_s, 3),
              "small_batch": SMALL_BATCH, "small_batch_core_records_per_s": round(total / small_s),
              "clock": "CPU time of this process (best of the repeats)",
              "core_cpu_s": [round(x, 3) for x in core_cpu], "plain_cpu_s": [round(x, 3) for x in plain_cpu],
              "user_code_alone_cpu_s": [round(x, 3) for x in alone_cpu],
              "core_wall_s": [round(x, 3) for x in core_wall], "plain_wall_s": [round(x, 3) for x in plain_wall]}
    print(f"[core] {keys:,} keys, {total:,} records in {batch:,}-record batches: core {result['core_records_per_s']:,} rec/s, plain CPython "
          f"{result['plain_records_per_s']:,} rec/s, core/plain = {result['core_vs_plain']}; the user code alone "
          f"{result['user_code_alone_records_per_s']:,} rec/s (core/that = {result['core_vs_user_code_alone']}); with the batch hook "
          f"{result['batch_hook_records_per_s']:,} rec/s = {result['batch_hook_vs_plain']}; core in {SMALL_BATCH:,}-record "
          f"batches {result['small_batch_core_records_per_s']:,} rec/s (CPU time)", flush=True)
    return result


if __name__ == "__main__":
    cli("core", main)
