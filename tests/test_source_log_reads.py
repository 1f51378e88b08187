"""How a computation's source reads its producers' publication logs (spark/source.py), offline: claims
(a producer's driver starting) carry no records and must never hold a consumer back, however many
there are in a row."""

from __future__ import annotations

import pytest

from millstream import GeneratorInjector, Pipeline, Record
from millstream.core.plan import plan_computation
from millstream.model.computation import Computation
from millstream.spark.partitioning import GroupLabels
from millstream.spark.publog import BATCH, CLAIM, PublicationLog
from millstream.spark.source import Sender, SourcePlan, initial_offset, plan_next_batch


class PassThrough(Computation):
    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.produce(Record(record.key, record.value, record.timestamp), "out")


def consumer_plan(root: str, max_log_entries: int | None = None) -> SourcePlan:
    """The plan of `down`'s source, reading `up`'s log (`max_log_entries`: the runner's default if None)."""
    injector = GeneratorInjector(lambda i: Record(f"k{i}", i, 1_000 + i, f"r{i}"), total=10,
                                 low_watermark=lambda n: 1_000 + n)
    pipeline = (Pipeline("logs").add_injector("gen", injector, "events")
                .add_computation("up", PassThrough(), ["events"], ["mid"])
                .add_computation("down", PassThrough(), ["mid"], ["out"]))
    plan = plan_computation(pipeline, "down")
    senders = tuple(Sender(s, None, False) for s in plan.senders())
    return SourcePlan(plan, root, senders, "wake.json", GroupLabels(tuple(range(plan.key_groups))),
                      batch_cap=1_000, **({} if max_log_entries is None else {"max_log_entries": max_log_entries}))


def publish(log: PublicationLog, position: int, watermark: int) -> None:
    log.append(position, {"type": BATCH, "epoch": 1, "output": [watermark], "files": {}})


def log_positions(offset: dict) -> list[int]:
    return [point["position"] for point in offset["points"] if "position" in point]


@pytest.mark.parametrize("claims", [1, 3, 70])
def test_claims_in_a_row_never_hold_the_consumer_back(tmp_path, claims: int) -> None:
    plan = consumer_plan(str(tmp_path), max_log_entries=2)
    log = PublicationLog(str(tmp_path), "up")
    for position in range(claims):  # the producer's driver started `claims` times before it published
        log.append(position, {"type": CLAIM, "epoch": position + 1})
    for batch in range(3):
        publish(log, claims + batch, 2_000 + batch)
    start = initial_offset(plan)
    first = plan_next_batch(plan, start, False, now_ms=1)
    assert log_positions(first) == [claims, claims + 1]  # at most two batch entries a batch
    assert first["watermark"] == 2_001
    second = plan_next_batch(plan, first, False, now_ms=2)
    assert log_positions(second) == [claims + 2] and second["watermark"] == 2_002
    assert plan_next_batch(plan, second, False, now_ms=3) is second  # nothing more to read


def test_claims_after_the_last_batch_are_not_a_batch(tmp_path) -> None:
    plan = consumer_plan(str(tmp_path), max_log_entries=2)
    log = PublicationLog(str(tmp_path), "up")
    publish(log, 0, 2_000)
    first = plan_next_batch(plan, initial_offset(plan), False, now_ms=1)
    for position in range(1, 5):
        log.append(position, {"type": CLAIM, "epoch": position + 1})
    assert plan_next_batch(plan, first, False, now_ms=2) is first  # no empty batch for claims alone
    publish(log, 5, 2_001)
    assert log_positions(plan_next_batch(plan, first, False, now_ms=3)) == [5]


def test_more_claims_in_a_row_than_the_default_limit_are_passed_over(tmp_path) -> None:
    plan = consumer_plan(str(tmp_path))  # the runner's limit of publications a batch
    log = PublicationLog(str(tmp_path), "up")
    claims = plan.max_log_entries + 6
    for position in range(claims):
        log.append(position, {"type": CLAIM, "epoch": position + 1})
    publish(log, claims, 2_000)
    assert log_positions(plan_next_batch(plan, initial_offset(plan), False, now_ms=1)) == [claims]


def test_claims_between_batches_are_passed_over_and_the_next_batch_goes_on_after_the_last_read(tmp_path) -> None:
    plan = consumer_plan(str(tmp_path), max_log_entries=2)
    log = PublicationLog(str(tmp_path), "up")
    publish(log, 0, 2_000)
    log.append(1, {"type": CLAIM, "epoch": 2})
    publish(log, 2, 2_001)
    log.append(3, {"type": CLAIM, "epoch": 3})
    publish(log, 4, 2_002)
    first = plan_next_batch(plan, initial_offset(plan), False, now_ms=1)
    assert log_positions(first) == [0, 2]
    assert log_positions(plan_next_batch(plan, first, False, now_ms=2)) == [4]
