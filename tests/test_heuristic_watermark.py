"""Heuristic watermarks (MillWheel section 8.2's "99%" low watermark): HeuristicWatermark against
truth computed here, independently of it.

The data: record i is read i-th, its base time is i ms, half of the records are stamped at their base
time and the other half `D` earlier, D exponential with mean `mean_ms`. A record's lateness behind the
newest time read before it is therefore D (give or take a millisecond), and its q-quantile is known in
closed form: P(lateness > x) = 0.5 * exp(-x / mean)  =>  x_q = mean * ln(0.5 / (1 - q)). The wrapped
injector's strict watermark is honest: the smallest timestamp still to come.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Iterator

import pytest

from millstream import (
    END_OF_TIME,
    Computation,
    GeneratorInjector,
    HeuristicWatermark,
    Injector,
    Malformed,
    Pipeline,
    Record,
)
from millstream.injectors.heuristic import BUCKETS_PER_OCTAVE, LatenessSummary
from millstream.model.injector import Offset
from millstream.testing import PipelineHarness


def stamps_with_lateness(count: int, mean_ms: float | list[tuple[int, float]], seed: int = 1) -> list[int]:
    """Timestamps in read order (see the module doc). `mean_ms` may change along the log:
    [(first index, mean), ...]."""
    regimes = [(0, mean_ms)] if isinstance(mean_ms, (int, float)) else list(mean_ms)
    rng = random.Random(seed)
    stamps = []
    for i in range(count):
        mean = [m for first, m in regimes if first <= i][-1]
        stamps.append(i if rng.random() < 0.5 else i - int(rng.expovariate(1.0 / mean)))
    return stamps


def honest_injector(stamps: list[int], per_read: int, partitions: int = 1) -> GeneratorInjector:
    """The strict injector over `stamps`: its watermark is the smallest timestamp not yet read."""
    suffix_min = stamps[:] + [END_OF_TIME]
    for i in range(len(stamps) - 2, -1, -1):
        suffix_min[i] = min(suffix_min[i], suffix_min[i + 1])
    return GeneratorInjector(lambda i: Record(f"k{i % 7}", i, stamps[i]), len(stamps),
                             low_watermark=lambda n: suffix_min[n], max_records_per_read=per_read,
                             partitions=partitions)


def analytic_quantile(mean_ms: float, quantile: float) -> float:
    return mean_ms * math.log(0.5 / (1.0 - quantile))


def walk(injector: Injector, partition: str = "0", max_records: int | None = None) -> list[Offset]:
    """Every offset a runner would reach, one read at a time, from the initial one to the end."""
    offsets = [injector.initial_offset(partition)]
    while True:
        end = injector.latest_offset(partition, offsets[-1], max_records)
        if end == offsets[-1]:
            return offsets
        offsets.append(end)


def late_records(injector: Injector, offsets: list[Offset], partition: str = "0") -> tuple[list[Any], int]:
    """The records behind the watermark published before their read (what a consumer flags as late),
    and how many records were read in all."""
    late, total = [], 0
    for start, end in zip(offsets, offsets[1:]):
        before = injector.low_watermark(partition, start)
        for record in injector.read(partition, start, end):
            total += 1
            if record.timestamp < before:
                late.append(record)
    return late, total


# -- what it learns ---------------------------------------------------------------------------------
@pytest.mark.parametrize("quantile", [0.9, 0.99, 0.999])
def test_learned_bound_is_the_quantile_of_lateness(quantile):
    mean = 2_000.0
    stamps = stamps_with_lateness(200_000, mean)
    # A half-life far longer than the log: every record counts, so the closed form applies.
    heuristic = HeuristicWatermark(honest_injector(stamps, 5_000), quantile, half_life_ms=10**9)
    offsets = walk(heuristic)
    bound = heuristic.learned_bound_ms(offsets[-1])
    assert bound == pytest.approx(analytic_quantile(mean, quantile), rel=0.08)


def test_bound_matches_a_brute_force_weighted_quantile_with_decay():
    """The summary against the exact decayed quantile computed over every record it saw."""
    rng = random.Random(5)
    stamps = [10 * i - int(rng.lognormvariate(6.0, 1.5)) for i in range(30_000)]
    half_life = 40_000
    quantile = 0.97
    summary = LatenessSummary()
    for start in range(0, len(stamps), 700):
        summary.observe(stamps[start:start + 700], half_life)
        summary.compact(quantile)
    lateness, running = [], None  # (lateness, newest time once the record was read) per record
    for t in stamps:
        late = 0 if running is None or t >= running else running - t
        running = t if running is None else max(running, t)
        lateness.append((late, running))
    newest = running
    weighted = [(late, 2.0 ** (-(newest - seen_at) / half_life)) for late, seen_at in lateness]
    total = sum(w for _, w in weighted)
    tail, exact = 0.0, 0
    for late, weight in sorted(weighted, reverse=True):
        if tail + weight > (1 - quantile) * total:
            exact = late
            break
        tail += weight
    assert summary.total == pytest.approx(total, rel=1e-4)
    bucket_width = 2 ** (1 / BUCKETS_PER_OCTAVE)
    assert exact / bucket_width <= summary.bound(quantile, warmup=0) <= exact * bucket_width + 1


def test_bound_follows_a_change_of_lateness_within_a_few_half_lives():
    slow, fast = 5_000.0, 200.0
    half_life = 10_000
    stamps = stamps_with_lateness(300_000, [(0, slow), (150_000, fast)])
    heuristic = HeuristicWatermark(honest_injector(stamps, 2_000), 0.99, half_life_ms=half_life)
    offsets = walk(heuristic)
    by_newest = {heuristic.newest_event_time(o): heuristic.learned_bound_ms(o) for o in offsets[1:]}
    before = [b for t, b in by_newest.items() if 100_000 <= t < 150_000]
    long_after = [b for t, b in by_newest.items() if t >= 150_000 + 10 * half_life]
    assert max(before) == pytest.approx(analytic_quantile(slow, 0.99), rel=0.15)
    assert min(before) == pytest.approx(analytic_quantile(slow, 0.99), rel=0.15)
    # Ten half-lives on, the slow records weigh 1/1024 of what they did: forgotten.
    assert max(long_after) == pytest.approx(analytic_quantile(fast, 0.99), rel=0.15)


def test_partitions_learn_their_own_lateness():
    """Partition p of 2 reads the records i with i % 2 == p: odd ones are late by more."""
    rng = random.Random(3)
    stamps = [i - (int(rng.expovariate(1 / 300)) if i % 2 == 0 else int(rng.expovariate(1 / 3000)))
              for i in range(100_000)]
    heuristic = HeuristicWatermark(honest_injector(stamps, 1_000, partitions=2), 0.9, half_life_ms=10**9)
    even = heuristic.learned_bound_ms(walk(heuristic, "0")[-1])
    odd = heuristic.learned_bound_ms(walk(heuristic, "1")[-1])
    # Lateness of an exponential behind the running max of its own partition: quantile ~ mean ln 10.
    assert even == pytest.approx(300 * math.log(10), rel=0.15)
    assert odd == pytest.approx(3000 * math.log(10), rel=0.15)


# -- what it publishes --------------------------------------------------------------------------------
def test_watermark_never_goes_back_and_never_below_the_strict_one():
    # Lateness grows tenfold halfway: the learned bound jumps and newest - bound falls back.
    stamps = stamps_with_lateness(120_000, [(0, 300.0), (60_000, 3_000.0)])
    strict = honest_injector(stamps, 500)
    heuristic = HeuristicWatermark(strict, 0.99, half_life_ms=30_000)
    offsets = walk(heuristic)
    published = [heuristic.low_watermark("0", o) for o in offsets]
    strict_marks = [strict.low_watermark("0", o["inner"]) for o in offsets]
    assert all(b >= a for a, b in zip(published, published[1:]))
    assert all(h >= s for h, s in zip(published, strict_marks))
    assert published[-1] == END_OF_TIME and heuristic.is_finished("0", offsets[-1])
    # It runs ahead of the strict watermark (which waits for the slowest record still to come) ...
    ahead = [h - s for h, s in zip(published[1:-1], strict_marks[1:-1])]
    assert sum(a > 0 for a in ahead) > 0.9 * len(ahead)
    # ... and the hold was needed: after the jump, newest - bound fell behind what was published.
    fell_back = [o for previous, o in zip(offsets[1:], offsets[2:-1])
                 if heuristic.learned_bound_ms(o) is not None
                 and heuristic.newest_event_time(o) - heuristic.learned_bound_ms(o) < heuristic.low_watermark("0", previous)]
    assert fell_back


def test_strict_watermark_until_warmed_up():
    stamps = stamps_with_lateness(3_000, 500.0)
    strict = honest_injector(stamps, 100)
    heuristic = HeuristicWatermark(strict, 0.99)  # warm-up: 10 / 0.01 = 1,000 records
    offsets = walk(heuristic)
    for offset in offsets[:10]:  # 1,000 records read
        assert heuristic.learned_bound_ms(offset) is None
        assert heuristic.low_watermark("0", offset) == strict.low_watermark("0", offset["inner"])
    assert heuristic.learned_bound_ms(offsets[11]) is not None
    assert heuristic.low_watermark("0", offsets[11]) > strict.low_watermark("0", offsets[11]["inner"])


def test_warm_up_ends_after_warmup_records_records_at_a_low_rate():
    # One record a second: at q = 0.99 the decayed weight settles near rate x half-life / ln 2 = 433,
    # below the 1,000 records of warm-up. Warm-up counts records read, so it ends at the 1,000th.
    # Records are up to 3 s out of order, and every 200th is 10 minutes late: the strict watermark
    # waits for those, the heuristic one not.
    stamps = [1_000 * i - (600_000 if i % 200 == 0 else i * 7_919 % 3_001) for i in range(12_000)]
    strict = honest_injector(stamps, 100)
    heuristic = HeuristicWatermark(strict, 0.99)  # warm-up 1,000 records, half-life 300 s
    offsets = walk(heuristic)
    assert len(offsets) == 121
    for read, offset in enumerate(offsets):  # 100 records per read
        warm = 100 * read >= 1_000
        assert (heuristic.learned_bound_ms(offset) is not None) == warm, read
        if 20 <= read <= 110:  # past warm-up, a straggler still to come: ahead of the strict watermark
            assert heuristic.low_watermark("0", offset) > strict.low_watermark("0", offset["inner"]), read
    assert LatenessSummary.from_json(offsets[-1]["lateness"]).total < 1_000  # what warm-up waited for


def test_an_offset_from_before_the_record_count_loads_and_counts_its_weight_as_records():
    stamps = stamps_with_lateness(3_000, 500.0)
    heuristic = HeuristicWatermark(honest_injector(stamps, 100), 0.99)
    offsets = walk(heuristic)
    for read in (5, 15):  # in warm-up, and past it
        old = json.loads(json.dumps(offsets[read]))
        del old["lateness"]["seen"]  # as written before warm-up counted records
        assert heuristic.learned_bound_ms(old) == heuristic.learned_bound_ms(offsets[read])
        following = heuristic.latest_offset("0", old, None)
        assert following["inner"] == offsets[read + 1]["inner"]
        assert following["lateness"]["seen"] == math.ceil(LatenessSummary.from_json(old["lateness"]).total) + 100


@pytest.mark.parametrize("quantile", [0.9, 0.99, 0.999])
def test_late_fraction_is_close_to_one_minus_quantile(quantile):
    # Reads of 20 records span 20 ms of event time, little against lateness of 2 s: the late
    # fraction should then be 1 - q (docs: fewer when one read spans much event time).
    count = {0.9: 40_000, 0.99: 100_000, 0.999: 400_000}[quantile]
    stamps = stamps_with_lateness(count, 2_000.0, seed=11)
    heuristic = HeuristicWatermark(honest_injector(stamps, 20), quantile)
    late, total = late_records(heuristic, walk(heuristic))
    assert total == count
    assert len(late) / total == pytest.approx(1 - quantile, rel=0.2)


def test_fewer_records_are_late_when_a_read_spans_more_event_time():
    stamps = stamps_with_lateness(100_000, 2_000.0, seed=11)
    fractions = []
    for per_read in (20, 2_000, 20_000):
        heuristic = HeuristicWatermark(honest_injector(stamps, per_read), 0.99)
        late, total = late_records(heuristic, walk(heuristic))
        fractions.append(len(late) / total)
    assert fractions[0] > fractions[1] > fractions[2]


# -- replay and size ----------------------------------------------------------------------------------
def test_replaying_an_offset_range_gives_the_same_watermark():
    stamps = stamps_with_lateness(50_000, 1_000.0)
    heuristic = HeuristicWatermark(honest_injector(stamps, 700), 0.99, half_life_ms=10_000)
    offsets = walk(heuristic)
    # As Spark does: every offset goes through its JSON offset log, and a restart plans the next
    # batches again from a logged one. Same ends, same watermarks, same records.
    logged = [json.loads(json.dumps(o)) for o in offsets]
    middle = len(logged) // 2
    replayed = [logged[middle]]
    for _ in range(len(offsets) - 1 - middle):
        replayed.append(json.loads(json.dumps(heuristic.latest_offset("0", replayed[-1], None))))
    assert [o["lateness"] for o in replayed] == [o["lateness"] for o in offsets[middle:]]
    assert [heuristic.low_watermark("0", o) for o in replayed] == [heuristic.low_watermark("0", o)
                                                                   for o in offsets[middle:]]
    again = list(heuristic.read("0", logged[middle], logged[middle + 1]))
    assert [(r.id, r.timestamp) for r in again] == [(r.id, r.timestamp)
                                                    for r in heuristic.read("0", offsets[middle], offsets[middle + 1])]


def test_offset_stays_small_however_long_the_run():
    # Lateness spread over every scale from 1 ms to a day, so the histogram fills all its buckets.
    rng = random.Random(2)
    count = 400_000
    stamps = [10 * i - int(math.exp(rng.uniform(0, math.log(86_400_000)))) for i in range(count)]
    heuristic = HeuristicWatermark(honest_injector(stamps, 2_000), 0.999, half_life_ms=600_000)
    sizes = [len(json.dumps(o)) for o in walk(heuristic)]
    quarter = len(sizes) // 4
    assert max(sizes) < 4_096
    # Past the first quarter (every bucket filled) the size no longer grows with the run.
    assert max(sizes[3 * quarter:]) <= max(sizes[quarter:2 * quarter]) + 64


def test_malformed_input_is_skipped_by_learning_and_dead_lettered_once():
    class WithBadLines(Injector):
        def initial_offset(self, partition: str) -> Offset:
            return {"n": 0}

        def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
            return {"n": min(start["n"] + 100, 2_000)}

        def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
            for i in range(start["n"], end["n"]):
                yield Malformed(f"line {i}", "?", "bad") if i % 50 == 0 else Record("k", i, i - i % 7 * 10, f"r{i}")

        def low_watermark(self, partition: str, offset: Offset) -> int:
            return -(2**47)

    pipeline = (Pipeline("bad").add_injector("src", HeuristicWatermark(WithBadLines(), 0.9), "in")
                .add_computation("flags", Flags(), ["in"], ["flags"]))
    harness = PipelineHarness(pipeline)
    harness.run_injectors()
    assert len(harness.dead_letters()) == 40
    assert len(harness.output("flags")) == 2_000 - 40


# -- through the harness -------------------------------------------------------------------------------
class Flags(Computation):
    """Passes every record on with whether it arrived late."""

    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, {"id": record.id, "index": record.value, "late": ctx.is_late}, record.timestamp),
                   "flags")


def test_late_records_reach_user_code_flagged_and_counted():
    stamps = stamps_with_lateness(6_000, 800.0, seed=4)
    per_read = 40
    heuristic = HeuristicWatermark(honest_injector(stamps, 10_000), 0.95)
    pipeline = (Pipeline("heuristic").add_injector("src", heuristic, "in")
                .add_computation("flags", Flags(), ["in"], ["flags"]))
    harness = PipelineHarness(pipeline, key_groups=2)
    harness.run_injectors(max_records_per_step=per_read)
    expected_late, total = late_records(heuristic, walk(heuristic, max_records=per_read))
    flags = {r.value["id"]: r.value["late"] for r in harness.output("flags")}
    assert len(flags) == total == len(stamps)  # every record delivered, late ones too
    assert {i for i, late in flags.items() if late} == {r.id for r in expected_late}
    assert harness.metrics("flags").late == len(expected_late) > 0.02 * total
    # The strict watermark alone leaves nothing behind on the same data.
    strict_pipeline = (Pipeline("strict").add_injector("src", honest_injector(stamps, 10_000), "in")
                       .add_computation("flags", Flags(), ["in"], ["flags"]))
    strict = PipelineHarness(strict_pipeline, key_groups=2)
    strict.run_injectors(max_records_per_step=per_read)
    assert strict.metrics("flags").late == 0


# -- arguments ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arguments", [{"quantile": 1.0}, {"quantile": 0.3}, {"quantile": True},
                                       {"half_life_ms": 0}, {"half_life_ms": 1.5}, {"warmup_records": -1}])
def test_bad_arguments_are_refused(arguments):
    with pytest.raises(ValueError):
        HeuristicWatermark(honest_injector([1, 2, 3], 10), **arguments)
