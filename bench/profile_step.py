"""Profile of the Python worker's hot path, offline: the Windower's ShardExecutor.step on the
throughput workload, batch by batch, against an in-memory store (no Spark), with cProfile.

Mirrors what ShardProcessor does per batch and shard: decode input rows into Deliveries, step with
the batch's low watermark, then step again once the watermark has advanced (Spark's timer batch).
The per-row cost of the Spark operator's own row conversion is measured separately.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

from bench.common import KeyedRecords, KeyedWatermark, Windower, cli
from millstream import Pipeline
from millstream.core.executor import Delivery, MemoryShardStore, ShardExecutor
from millstream.core.plan import plan_computation, route
from millstream.model.codecs import DEFAULT_CODEC
from millstream.model.records import Record


def simulate(keys: int, total: int, batch: int, shards: int, pages: int) -> dict:
    from bench.common import keyed_injector

    pipeline = (Pipeline("p").add_injector("gen", keyed_injector(keys, total), "events")
                .add_computation("win", Windower(), ["events"], ["windows"]))
    plan = plan_computation(pipeline, "win", shards, pages)
    executors = [ShardExecutor(plan, MemoryShardStore()) for _ in range(shards)]
    make, wm = KeyedRecords(keys), KeyedWatermark()
    codec = DEFAULT_CODEC
    produced = 0
    source_s = step_s = 0.0
    watermark = wm(0)
    for start in range(0, total, batch):
        end = min(total, start + batch)
        t = time.perf_counter()
        per_shard: list[list[Delivery]] = [[] for _ in range(shards)]
        for i in range(start, end):
            r = make(i)
            value = codec.encode(r.value)  # source: encode; operator: decode
            per_shard[route(r.key, shards, pages)[0]].append(
                Delivery(r.key, "events", Record(r.key, codec.decode(value), r.timestamp, r.id)))
        source_s += time.perf_counter() - t
        t = time.perf_counter()
        for shard, executor in enumerate(executors):
            produced += len(executor.step(per_shard[shard], watermark, 0).productions)
        watermark = wm(end) if end < total else 2**47 - 1
        for executor in executors:  # the watermark advance: Spark's timer batch
            produced += len(executor.step([], watermark, 0).productions)
        step_s += time.perf_counter() - t
    return {"records": total, "keys": keys, "windows": produced, "source_like_s": round(source_s, 2),
            "step_s": round(step_s, 2), "step_records_per_s": round(total / step_s)}


def main(quick: bool) -> dict:
    keys, total, batch = 10_000, (50_000 if quick else 150_000), 50_000
    simulate(keys, 20_000, batch, 8, 32)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    result = simulate(keys, total, batch, 8, 32)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    plain = simulate(keys, total, batch, 8, 32)
    return {"profiled": result, "unprofiled": plain, "top_tottime": text.getvalue().splitlines()[:45]}


if __name__ == "__main__":
    cli("profile_step", main)
