"""Values cross the operator encoded: a step decodes a record's value only when user code reads it,
and a record produced as it arrived keeps its bytes (no decode, no encode). Counted with a codec
that counts, through the operator's own entry point (spark.operator.step_bundles)."""

from millstream import Computation, Pipeline, Record, ScriptedInjector
from millstream.core.plan import plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment
from millstream.model.codecs import JsonCodec
from millstream.spark.bundles import pack_deliveries
from millstream.spark.operator import step_bundles


class CountingCodec(JsonCodec):
    def __init__(self) -> None:
        super().__init__()
        self.decoded = self.encoded = 0

    def decode(self, data):
        self.decoded += 1
        return super().decode(data)

    def encode(self, value):
        self.encoded += 1
        return super().encode(value)


class Forward(Computation):
    """Reads keys and times only; forwards every record unchanged."""

    def process_record(self, ctx, record):
        if record.timestamp >= 0 and record.key:
            ctx.produce(record, "out")


class Total(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(record.key, record.value["n"] * 2, record.timestamp), "out")


def step(computation, codec, records=50):
    pipeline = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                .add_computation("c", computation, ["in"], ["out"])
                .declare_stream("in", codec).declare_stream("out", codec))
    plan = plan_computation(pipeline, "c", 1)
    items = [(f"k{i % 5}", f"k{i % 5}", JsonCodec().encode({"n": i}), 1_000 + i, f"r{i}", 0, i)
             for i in range(records)]
    return step_bundles(plan, MemoryKeyStore(), [pack_deliveries("in", True, items)], {"in": codec}, [Segment(0, 0)],
                        0)


def test_a_value_user_code_never_reads_is_never_decoded_nor_encoded_again():
    codec = CountingCodec()
    result = step(Forward(), codec)
    assert len(result.rows) == 50
    assert (codec.decoded, codec.encoded) == (0, 0)


def test_a_value_user_code_reads_is_decoded_once():
    codec = CountingCodec()
    result = step(Total(), codec)
    assert len(result.rows) == 50
    assert (codec.decoded, codec.encoded) == (50, 50)


class Enrich(Computation):
    """Changes the received value in place, then produces the received record."""

    def process_record(self, ctx, record):
        record.value["enriched"] = True
        ctx.produce(record, "out")


class ReadThenForward(Computation):
    """Reads the value, an atom here, and forwards the record unchanged."""

    def process_record(self, ctx, record):
        if record.value is not None:
            ctx.produce(record, "out")


def test_a_record_whose_value_code_changed_in_place_is_produced_with_the_change():
    codec = CountingCodec()
    result = step(Enrich(), codec)
    # production rows: (stream, key, value bytes, timestamp, id, point, order)
    assert sorted(JsonCodec().decode(row[2])["n"] for row in result.rows) == list(range(50))
    assert all(JsonCodec().decode(row[2])["enriched"] is True for row in result.rows)
    assert (codec.decoded, codec.encoded) == (50, 50)


def test_a_record_read_as_an_atom_keeps_its_bytes():
    codec = CountingCodec()
    pipeline = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                .add_computation("c", ReadThenForward(), ["in"], ["out"])
                .declare_stream("in", codec).declare_stream("out", codec))
    plan = plan_computation(pipeline, "c", 1)
    items = [(f"k{i % 5}", f"k{i % 5}", JsonCodec().encode(i), 1_000 + i, f"r{i}", 0, i) for i in range(20)]
    result = step_bundles(plan, MemoryKeyStore(), [pack_deliveries("in", True, items)], {"in": codec},
                          [Segment(0, 0)], 0)
    assert sorted(JsonCodec().decode(row[2]) for row in result.rows) == list(range(20))
    assert (codec.decoded, codec.encoded) == (20, 0)  # an int cannot have changed in place


class NormalizeThenFail(Computation):
    """Changes the value it read in place, then fails."""

    def process_record(self, ctx, record):
        value = record.value
        value["n"] = value.pop("amount") * 100
        raise ValueError("then fail")


def test_a_dead_letter_carries_the_value_as_it_arrived_not_as_the_failed_code_left_it():
    from millstream.testing import PipelineHarness

    harness = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                              .add_computation("c", NormalizeThenFail(), ["in"], [], on_error="dead_letter"))
    harness.feed("src", [Record("k", {"amount": 3}, 1), Record("k", {"amount": 4}, 2)], watermark=2)
    harness.run()
    assert sorted(letter["value"]["amount"] for letter in harness.dead_letters()) == [3, 4]
