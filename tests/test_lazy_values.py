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
