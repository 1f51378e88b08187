"""Batch pacing (spark/pacing.py): while input waits, each batch is sized from the one before to take
about the target time, and the source plans its injector reads with that cap. Offline: the rule
against a plain model of a machine, and the source's planning against a generator injector."""

from __future__ import annotations

import pytest

from millstream import GeneratorInjector, Pipeline, Record
from millstream.core.plan import plan_computation
from millstream.model.computation import Computation
from millstream.spark.pacing import BatchPacing, LastBatch
from millstream.spark.partitioning import GroupLabels
from millstream.spark.source import InputsReader, Sender, SourcePlan, initial_offset, plan_next_batch
from millstream.spark.storage import Storage


def batch_ms(records: int, fixed_ms: float, records_per_ms: float) -> int:
    """A plain model of a machine: a batch costs a fixed time plus its records."""
    return int(fixed_ms + records / records_per_ms)


@pytest.mark.parametrize("records_per_ms,fixed_ms", [(150.0, 40.0), (80.0, 40.0), (2.0, 400.0), (5_000.0, 60.0)])
def test_batches_settle_near_the_target_time_on_any_machine(records_per_ms: float, fixed_ms: float) -> None:
    pacing = BatchPacing(target_ms=3_000, first=200_000, floor=1_000, ceiling=50_000_000)
    cap, times = None, []
    for _ in range(30):
        cap = pacing.next_cap(cap, None if cap is None else LastBatch(cap, times[-1]))
        times.append(batch_ms(cap, fixed_ms, records_per_ms))
    # Settled: the last batches take the target time, within a batch's fixed part and rounding.
    assert all(abs(t - 3_000) <= fixed_ms + 10 for t in times[-5:]), times


def test_growth_is_at_most_twofold_per_batch_and_shrinking_is_immediate() -> None:
    pacing = BatchPacing(target_ms=3_000, first=200_000)
    caps = [pacing.next_cap(None, None)]
    for _ in range(4):  # a very fast machine: every batch ran in 10 ms
        caps.append(pacing.next_cap(caps[-1], LastBatch(caps[-1], 10)))
    assert caps == [200_000, 400_000, 800_000, 1_600_000, 3_200_000]
    # One slow batch (a batch of heavy records): the next is sized from it at once.
    assert pacing.next_cap(3_200_000, LastBatch(3_200_000, 30_000)) == 320_000


def test_a_batch_that_did_not_fill_its_cap_says_nothing_about_speed() -> None:
    pacing = BatchPacing(target_ms=3_000, first=200_000)
    # Caught up: 300 records in a batch that took 150 ms (mostly Spark's fixed cost).
    assert pacing.next_cap(400_000, LastBatch(300, 150)) == 400_000
    # Half the cap is enough to measure.
    assert pacing.next_cap(400_000, LastBatch(200_000, 3_000)) == 200_000
    assert pacing.next_cap(400_000, None) == 400_000  # nothing noted (an older root's wake file)


def test_floor_and_ceiling_bound_every_cap() -> None:
    pacing = BatchPacing(target_ms=1_000, first=5_000, floor=2_000, ceiling=8_000)
    assert pacing.next_cap(5_000, LastBatch(5_000, 1)) == 8_000
    assert pacing.next_cap(5_000, LastBatch(5_000, 1_000_000)) == 2_000


@pytest.mark.parametrize("args", [{"target_ms": 0}, {"floor": 0}, {"first": 10, "floor": 20},
                                  {"first": 10, "ceiling": 5}])
def test_settings_that_cannot_work_are_refused(args: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        BatchPacing(**args)


class PassThrough(Computation):
    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.produce(Record(record.key, record.value, record.timestamp), "out")


def source_plan(root: str, batch_cap: int | BatchPacing, partitions: int = 2) -> SourcePlan:
    injector = GeneratorInjector(lambda i: Record(f"k{i % 7}", i, 1_000 + i, f"r{i}"), total=100_000,
                                 low_watermark=lambda n: 1_000 + n, max_records_per_read=1_000_000,
                                 partitions=partitions)
    pipeline = (Pipeline("paced").add_injector("gen", injector, "events")
                .add_computation("pass", PassThrough(), ["events"], ["out"]))
    plan = plan_computation(pipeline, "pass")
    senders = tuple(Sender(s, injector, True) for s in plan.senders())
    return SourcePlan(plan, root, senders, "wake.json", GroupLabels(tuple(range(plan.key_groups))),
                      batch_cap=batch_cap)


def records_in(end: dict) -> int:
    return sum(p["end"]["next"] - p["start"]["next"] for p in end["points"] if "start" in p)


def test_the_source_reads_what_pacing_allows_and_logs_the_cap(tmp_path) -> None:
    plan = source_plan(str(tmp_path), BatchPacing(target_ms=1_000, first=4_000))
    start = initial_offset(plan)
    first = plan_next_batch(plan, start, False, now_ms=1)
    assert (records_in(first), first["cap"]) == (4_000, 4_000)  # 2,000 from each of the two partitions
    # The first batch ran in 400 ms: 10,000 in 1 s, but at most twice the cap.
    second = plan_next_batch(plan, first, False, now_ms=2, last=LastBatch(4_000, 400))
    assert (records_in(second), second["cap"]) == (8_000, 8_000)
    third = plan_next_batch(plan, second, False, now_ms=3, last=LastBatch(8_000, 2_000))
    assert (records_in(third), third["cap"]) == (4_000, 4_000)


def test_a_fixed_cap_stays_fixed_whatever_was_measured(tmp_path) -> None:
    plan = source_plan(str(tmp_path), 3_000)
    first = plan_next_batch(plan, initial_offset(plan), False, now_ms=1)
    second = plan_next_batch(plan, first, False, now_ms=2, last=LastBatch(3_000, 1))
    assert [records_in(first), records_in(second)] == [3_000, 3_000]


def test_the_reader_takes_the_last_batch_from_the_stagers_wake_file(tmp_path) -> None:
    plan = source_plan(str(tmp_path), BatchPacing(target_ms=1_000, first=4_000), partitions=1)
    reader = InputsReader(plan)
    first = reader.latestOffset(None)
    assert records_in(first) == 4_000
    Storage(str(tmp_path)).write_json("wake.json", {"batch": 0, "next_wall_timer": None,
                                                    "last_batch": {"records": 4_000, "run_ms": 800}})
    assert records_in(reader.latestOffset(first)) == 5_000  # 4,000 in 0.8 s: 5,000 in 1 s


@pytest.mark.parametrize("args,error", [({"max_records_per_batch": 0}, ValueError), ({"batch_pacing": 3_000}, TypeError)])
def test_the_runner_refuses_batch_settings_that_cannot_work(tmp_path, args: dict, error: type) -> None:
    from millstream.spark.runner import SparkRunner

    injector = GeneratorInjector(lambda i: Record("k", i, i, f"r{i}"), total=1, low_watermark=lambda n: n)
    valid = (Pipeline("refused").add_injector("gen", injector, "events")
             .add_computation("pass", PassThrough(), ["events"], ["out"]))
    with pytest.raises(error, match="max_records_per_batch|BatchPacing"):
        SparkRunner(valid, root=str(tmp_path / "root"), **args)
