"""Batch pacing in Spark: the stager's measurement reaches the source, batches grow while they run
fast, each cap is in Spark's offset log, and every record is published exactly once."""

from __future__ import annotations

from millstream import GeneratorInjector, Pipeline, Record
from millstream.model.computation import Computation
from millstream.spark.commit import Checkpoint
from millstream.spark.rescale import checkpoint_of
from millstream.spark.runner import BatchPacing, SparkRunner
from millstream.spark.storage import Storage

TOTAL = 30_000


class PassThrough(Computation):
    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.produce(Record(record.key, record.value, record.timestamp), "out")


def logged_batches(root: str, computation: str) -> list[dict]:
    """Spark's offset log: each batch's end offset, as the commit protocol reads it."""
    checkpoint = Checkpoint(checkpoint_of(root, computation))
    ends = [checkpoint.end_offset(batch) for batch in range(checkpoint.last_committed() + 1)]
    return [end for end in ends if end is not None]


def test_batches_grow_while_fast_and_every_record_is_published_once(spark, tmp_path) -> None:
    injector = GeneratorInjector(lambda i: Record(f"k{i % 13}", i, 1_000 + i, f"r{i}"), total=TOTAL,
                                 low_watermark=lambda n: 1_000 + n, max_records_per_read=TOTAL)
    pipeline = (Pipeline("paced").add_injector("gen", injector, "events")
                .add_computation("pass", PassThrough(), ["events"], ["out"]))
    root = str(tmp_path / "root")
    # A target far above what these batches take: each one may double the next.
    runner = SparkRunner(pipeline, root=root, spark=spark,
                         batch_pacing=BatchPacing(target_ms=120_000, first=2_000, floor=1_000))
    runner.run(timeout=300)

    reads = [(end["cap"], sum(p["end"]["next"] - p["start"]["next"] for p in end["points"] if "start" in p))
             for end in logged_batches(root, "pass")]
    assert [r for r in reads if r[1]] == [(2_000, 2_000), (4_000, 4_000), (8_000, 8_000), (16_000, 16_000)], reads
    wake = Storage(root).read_json("status/pass/wake.json")
    assert wake["last_batch"]["records"] == 16_000 and wake["last_batch"]["run_ms"] > 0, wake
    published = sorted(r.value for r in runner.read_stream("out"))
    assert published == list(range(TOTAL))
