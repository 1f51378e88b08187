"""spark/bundles.py: records travel from the source to the operator as column bundles, and the
operator hands the executor each key's records in input order, whatever order the bundles came in.

The expected order is computed here in plain Python from the records themselves: all records of a
key group, in the order the bundles arrived, stably sorted by (input point, order)."""

import random

import pytest

from millstream import Computation, ListState, Pipeline, Record, ScriptedInjector
from millstream.core.executor import ComputationFailed, Delivery, KeyGroupExecutor
from millstream.core.plan import plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment
from millstream.model.codecs import DEFAULT_CODEC, PickleCodec
from millstream.spark.bundles import (BUNDLE_RECORDS, deliveries_by_key, pack_deliveries, pack_production_columns,
                                      unpack_deliveries, unpack_production_columns)

CODECS = {"a": DEFAULT_CODEC, "b": PickleCodec()}


def expected_by_key(arrived):
    """{key: [(stream, dedup, record key, value, timestamp, id, segment)]} in input order, from the
    bundles' records as (stream, dedup, item) in the order they arrived."""
    in_order = sorted(arrived, key=lambda entry: (entry[2][5], entry[2][6]))  # stable: ties as they arrived
    by_key = {}
    for stream, dedup, (key, record_key, value, timestamp, record_id, segment, _) in in_order:
        by_key.setdefault(key, []).append((stream, dedup, record_key, CODECS[stream].decode(value), timestamp,
                                           record_id, segment))
    return by_key


def delivered(by_key):
    return {key: [(d.stream, d.dedup, d.record.key, d.record.value, d.record.timestamp, d.record.id, d.segment)
                  for d in map(Delivery._make, group)] for key, group in by_key.items()}


@pytest.mark.parametrize("seed", range(40))
def test_each_keys_records_come_in_input_order_whatever_order_the_bundles_arrive_in(seed):
    rng = random.Random(seed)
    points = rng.choice([1, 1, 3])
    senders = []  # each sender's bundles, each bundle in the sender's order
    for sender in range(rng.randint(1, 4)):
        stream, dedup = rng.choice([("a", True), ("a", False), ("b", False)])
        extracted = rng.random() < 0.5  # keyed by an extractor: the record's own key differs
        items, order = [], 0
        for point in range(points):
            for _ in range(rng.randint(0, 12)):
                order += rng.randint(0, 2)  # equal orders across senders: ties
                record_key = f"r{rng.randint(0, 5)}"
                key = f"k{rng.randint(0, 3)}" if extracted else record_key
                value = rng.choice([1, "x", {"n": order}, None])
                items.append((key, record_key, CODECS[stream].encode(value), rng.randint(0, 50),
                              f"s{sender}-{len(items)}", point, order))
        size = rng.randint(1, 6)
        senders.append([(stream, dedup, items[at:at + size]) for at in range(0, len(items), size)])
    arrived = [bundle for bundles in senders for bundle in bundles if bundle[2]]
    rng.shuffle(arrived)  # Spark's shuffle: any order
    bundles = [unpack_deliveries(pack_deliveries(stream, dedup, items)) for stream, dedup, items in arrived]
    expected = expected_by_key([(stream, dedup, item) for stream, dedup, items in arrived for item in items])
    assert delivered(deliveries_by_key(bundles, CODECS)) == expected


def test_a_bundle_keeps_a_records_own_key_apart_from_the_computations_key():
    same = unpack_deliveries(pack_deliveries("a", True, [("k", "k", b"1", 5, "i", 0, 0)]))
    apart = unpack_deliveries(pack_deliveries("a", True, [("k", "user-7", b"1", 5, "i", 0, 0)]))
    assert same.record_keys is None and apart.record_keys == ("user-7",)
    ((key, _, record, _, _),) = deliveries_by_key([apart], CODECS)["k"]
    assert (key, record.key) == ("k", "user-7")


def test_a_key_groups_records_beyond_one_bundle_keep_their_order():
    items = [(f"k{i % 3}", f"k{i % 3}", b"%d" % i, i, f"i{i}", 0, i) for i in range(3 * BUNDLE_RECORDS)]
    bundles = [unpack_deliveries(pack_deliveries("a", True, items[at:at + BUNDLE_RECORDS]))
               for at in range(0, len(items), BUNDLE_RECORDS)]
    by_key = deliveries_by_key(bundles[::-1], CODECS)
    assert [record.value for _, _, record, _, _ in by_key["k1"]] == list(range(1, 3 * BUNDLE_RECORDS, 3))
    assert deliveries_by_key([], CODECS) == {}


class FailsOnSome(Computation):
    """Fails on records whose value is a multiple of 7 (after changing the value it read in place), and
    on timers at times that are multiples of 5; keeps a list and a timer per record."""

    seen = ListState("seen")

    def process_record(self, ctx, record):
        value = record.value
        value["n"] += 1000  # in place: a rerun must decode the record again
        if (value["n"] - 1000) % 7 == 0:
            raise ValueError(f"record {record.id}")
        ctx.state(self.seen).append(value["n"])
        ctx.set_timer(f"t{record.timestamp}", record.timestamp + 1)
        ctx.produce(Record(ctx.key, value, record.timestamp), "out")

    def process_timer(self, ctx, timer):
        if timer.time % 5 == 0:
            raise ValueError(f"timer {timer.tag}")
        ctx.produce(Record(ctx.key, len(ctx.state(self.seen).get()), timer.time), "out")


class FailsOnSomeBatched(FailsOnSome):
    def process_records(self, ctx, records):
        for record in records:
            self.process_record(ctx, record)


@pytest.mark.parametrize("computation", [FailsOnSome, FailsOnSomeBatched])
@pytest.mark.parametrize("on_error", ["dead_letter", "fail"])
def test_a_step_from_bundles_rows_is_the_step_from_deliveries(computation, on_error):
    """The operator hands the executor its records as plain tuples (DeliveryRow), not Deliveries: the
    executor's every path (input points, failures, reruns and their checkpoints, dead letters, the
    fail policy's message) gives what it gives for the same records as Deliveries."""
    items = [(f"k{i % 3}", f"k{i % 3}", DEFAULT_CODEC.encode({"n": i}), 10 * i, f"i{i}", i // 40, i)
             for i in range(120)]
    bundles = [unpack_deliveries(pack_deliveries("a", True, items[at:at + 50])) for at in range(0, 120, 50)]
    segments = [Segment(0, 400), Segment(400, 800), Segment(800, 2000)]

    def run(by_key):
        pipeline = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "a")
        pipeline.add_computation("c", computation(), ["a"], ["out"], on_error=on_error)
        executor = KeyGroupExecutor(plan_computation(pipeline, "c", 1), MemoryKeyStore())
        try:
            result = executor.step_keys(by_key, segments, 0)
        except ComputationFailed as failed:
            return str(failed).split("\n")[0]
        return result.rows, result.metrics, sorted((k, s.blob) for k, s in executor.store.blobs.items())

    rows = deliveries_by_key(bundles, CODECS)
    assert all(type(row) is tuple for group in rows.values() for row in group)
    as_deliveries = {key: list(map(Delivery._make, group)) for key, group in deliveries_by_key(bundles, CODECS).items()}
    from_rows, from_deliveries = run(rows), run(as_deliveries)
    assert from_rows == from_deliveries
    if on_error == "dead_letter":
        assert from_rows[1].dead_letters > 0 and from_rows[1].productions > 0
    else:
        assert "failed on key" in from_rows


@pytest.mark.parametrize("streams", [["out"], ["out", "alerts"], ["out", "alerts", "dead-letters"]])
def test_production_columns_come_back_as_the_rows_were(streams):
    rng = random.Random(len(streams))
    rows = [(rng.choice(streams), f"k{i}", b"%d" % i, i, f"id{i}", rng.randint(0, 2), i << 40 | i)
            for i in range(rng.randint(1, 50))]
    assert list(zip(*unpack_production_columns(pack_production_columns(rows)))) == rows
