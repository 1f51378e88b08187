"""The offline core on one core: the Windower through the executor exactly as the Spark operator
drives it (bundled deliveries in, sorted into input order, one step per key group and batch against
the in-memory key store), next to a plain-CPython Windower with a timer heap written for this
workload alone: the interpreter's own speed, what the core's overhead is measured against.

`python -m bench.core [--quick]` (PROFILE=1 also prints a cProfile of the core)
"""

from __future__ import annotations

import cProfile
import heapq
import io
import os
import pickle
import pstats
import time
from operator import itemgetter

from bench.common import KeyedRecords, KeyedWatermark, Windower, cli
from millstream import Pipeline, ScriptedInjector
from millstream.core.executor import Delivery, KeyGroupExecutor
from millstream.core.plan import key_group, plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment
from millstream.model.codecs import DEFAULT_CODEC
from millstream.model.records import END_OF_TIME, Record

KEY_GROUPS = 32


def bundles(keys: int, start: int, end: int, segment: int) -> dict[int, bytes]:
    """What the source sends the operator for records start..end: bundles per key group."""
    make, codec = KeyedRecords(keys), DEFAULT_CODEC
    groups: dict[int, list[tuple]] = {}
    group_of: dict[str, int] = {}
    for i in range(start, end):
        r = make(i)
        group = group_of.get(r.key)
        if group is None:
            group = group_of[r.key] = key_group(r.key, KEY_GROUPS)
        groups.setdefault(group, []).append((r.key, "events", r.key, codec.encode(r.value), r.timestamp, r.id,
                                             segment, i, True))
    return {g: pickle.dumps(items, protocol=5) for g, items in groups.items()}


def run_core(keys: int, total: int, batch: int) -> tuple[float, int]:
    pipeline = (Pipeline("p").add_injector("gen", ScriptedInjector("gen", []), "events")
                .add_computation("win", Windower(), ["events"], ["windows"]))
    plan = plan_computation(pipeline, "win", KEY_GROUPS)
    stores = [MemoryKeyStore() for _ in range(KEY_GROUPS)]
    codec = plan.input("events").codec
    watermark = KeyedWatermark()
    inputs = [bundles(keys, s, min(total, s + batch), 0) for s in range(0, total, batch)]  # not timed: the source's work
    produced = 0
    before = watermark(0)
    started = time.perf_counter()
    for number, per_group in enumerate(inputs):
        end = min(total, (number + 1) * batch)
        after = watermark(end) if end < total else END_OF_TIME
        segments = [Segment(before, after)]
        for group in range(KEY_GROUPS):
            items = pickle.loads(per_group[group]) if group in per_group else []
            items.sort(key=itemgetter(6, 7))
            deliveries = [Delivery(k, s, Record.encoded(rk, v, codec, ts, rid), seg, dedup)
                          for k, s, rk, v, ts, rid, seg, _, dedup in items]
            result = KeyGroupExecutor(plan, stores[group]).step(deliveries, segments, 0)
            produced += len(pickle.dumps(result.productions, protocol=5)) and len(result.productions)
        before = after
    return time.perf_counter() - started, produced


def run_plain(keys: int, total: int, batch: int) -> tuple[float, int]:
    """The same windows with a dict per key and one heap of (bucket end, key): no framework."""
    make, watermark = KeyedRecords(keys), KeyedWatermark()
    records = [make(i) for i in range(total)]
    counts: dict[str, dict[int, int]] = {}
    heap: list[tuple[int, str]] = []
    out = 0
    started = time.perf_counter()
    for start in range(0, total, batch):
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
            counts[key].pop(at - 1000)
            out += 1
    return time.perf_counter() - started, out


def main(quick: bool) -> dict:
    keys, total, batch = 10_000, (200_000 if quick else 1_000_000), 50_000
    run_core(keys, 50_000, batch)  # warm-up
    if os.environ.get("PROFILE"):
        profiler = cProfile.Profile()
        profiler.enable()
        run_core(keys, 200_000, batch)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
        print(text.getvalue())
    core_s, core_out = run_core(keys, total, batch)
    plain_s, plain_out = run_plain(keys, total, batch)
    assert core_out == plain_out, (core_out, plain_out)
    return {"keys": keys, "records": total, "windows": core_out,
            "core_records_per_s": round(total / core_s), "plain_records_per_s": round(total / plain_s),
            "core_vs_plain": round(plain_s / core_s, 3)}


if __name__ == "__main__":
    cli("core", main)
