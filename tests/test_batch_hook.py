"""process_records: a key's records of one input point in one call, with the same outcome as one
call per record (output, ids excepted: a batch call is one cause), and dead letters for a failing call."""

import random
from collections import Counter

from millstream import Computation, MapState, Pipeline, Record, ScriptedInjector
from millstream.testing import PipelineHarness


class PerRecord(Computation):
    counts = MapState[int, int]("counts")

    def process_record(self, ctx, record):
        bucket = record.timestamp - record.timestamp % 100
        ctx.state(self.counts).put(bucket, ctx.state(self.counts).get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + 100)

    def process_timer(self, ctx, timer):
        bucket = timer.time - 100
        ctx.produce(Record(ctx.key, [bucket, ctx.state(self.counts).get(bucket)], timer.time), "windows")
        ctx.state(self.counts).remove(bucket)


class Batched(PerRecord):
    def __init__(self):
        self.calls = []

    def process_records(self, ctx, records):
        self.calls.append(len(records))
        per_bucket = Counter(r.timestamp - r.timestamp % 100 for r in records)
        counts = ctx.state(self.counts)
        for bucket, n in per_bucket.items():
            counts.put(bucket, counts.get(bucket, 0) + n)
            ctx.set_timer(f"w{bucket}", bucket + 100)


def script(seed):
    rng = random.Random(seed)
    steps, t = [], 0
    for _ in range(30):
        steps.append(([Record(f"k{rng.randrange(4)}", None, t + rng.randrange(150)) for _ in range(rng.randrange(25))], t))
        t += 40
    return steps


def run(computation, seed):
    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", script(seed)), "in")
         .add_computation("win", computation, ["in"], ["windows"]))
    h = PipelineHarness(p)
    h.run_injectors()
    return sorted((r.key, tuple(r.value), r.timestamp) for r in h.output("windows")), h


def test_process_records_gives_what_process_record_gives():
    for seed in range(4):
        batched = Batched()
        expected, _ = run(PerRecord(), seed)
        got, harness = run(batched, seed)
        assert got == expected
        assert max(batched.calls) > 1, "never more than one record per call: the hook was not exercised"
        assert harness.metrics("win").records == sum(batched.calls)


def test_a_failing_batch_call_sends_its_records_to_dead_letters():
    class Fussy(Computation):
        def process_records(self, ctx, records):
            if any(r.value == "bad" for r in records):
                raise ValueError("bad batch")
            for r in records:
                ctx.produce(r, "out")

    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", [
        ([Record("a", "ok", 1, "a1"), Record("a", "bad", 2, "a2"), Record("b", "ok", 3, "b1")], 10)]), "in")
         .add_computation("fussy", Fussy(), ["in"], ["out"], on_error="dead_letter"))
    h = PipelineHarness(p)
    h.run_injectors()
    assert [(r.key, r.value) for r in h.output("out")] == [("b", "ok")]
    assert sorted(d["record_id"] for d in h.dead_letters()) == ["a1", "a2"]
    assert {d["error"] for d in h.dead_letters()} == {"ValueError: bad batch"}


def test_the_batch_hook_counts_duplicates_and_late_records_as_per_record_calls_do():
    # Step i injects its records with watermark 100 * i: a record behind the previous step's
    # watermark is late; an id injected before is a duplicate and reaches no user code.
    rng = random.Random(7)
    steps, sent, expected_late, expected_duplicates = [], [], 0, 0
    for i in range(12):
        records = []
        for _ in range(rng.randrange(1, 12)):
            if sent and rng.random() < 0.25:
                records.append(rng.choice(sent))  # the same record again
                expected_duplicates += 1
                continue
            timestamp = 100 * i + rng.randrange(-250, 100)
            record = Record(f"k{rng.randrange(3)}", None, timestamp, f"r{len(sent)}")
            sent.append(record)
            expected_late += timestamp < 100 * (i - 1) and i > 0
            records.append(record)
        steps.append((records, 100 * i))

    def metrics(computation):
        p = (Pipeline("p").add_injector("src", ScriptedInjector("src", steps), "in")
             .add_computation("win", computation, ["in"], ["windows"]))
        h = PipelineHarness(p)
        h.run_injectors()
        m = h.metrics("win")
        return m.records, m.duplicates, m.late

    batched = Batched()
    assert metrics(batched) == metrics(PerRecord()) == (len(sent), expected_duplicates, expected_late)
    assert max(batched.calls) > 1


def test_a_failing_batch_call_under_fail_names_the_call_not_its_first_record():
    """Which record of a process_records call is at fault is not known: the error says the call,
    with how many records and the first and last ids, and names no single record as the culprit."""
    import pytest

    from millstream.core.executor import ComputationFailed

    class Refusing(Batched):
        def process_records(self, ctx, records):
            raise ValueError("refused")

    records = [Record("k", None, t, f"id-{t}") for t in (1, 2, 3)]
    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", [(records, 10)]), "in")
         .add_computation("win", Refusing(), ["in"], ["windows"]))
    with pytest.raises(ComputationFailed) as failed:
        PipelineHarness(p).run_injectors()
    first_line = str(failed.value).splitlines()[0]
    assert "process_records with 3 records from stream 'in' ('id-1' to 'id-3', timestamps 1 to 3)" in first_line
    assert "ValueError: refused" in first_line and "record 'id-1'" not in first_line
