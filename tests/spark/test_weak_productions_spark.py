"""Weak productions on Spark: a computation fused into its consumer's query keeps what it does on the
harness: its wall-time timers fire, and a reader of dead letters gets its dead letters and finishes.
Ground truth in plain Python from the injected records."""

from millstream import DEAD_LETTERS, Computation, GeneratorInjector, Pipeline, Record, TimeDomain, ValueState
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

EVENTS, KEYS = 60, 3


def _injector():
    return GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, 10 * i), EVENTS, lambda n: 10 * n,
                             records_per_second=200, max_records_per_read=20)


class Ticker(Computation):
    """Counts its key's records; a wall-time timer half a second after the last one reports the count."""

    seen = ValueState[int]("seen", default=0)

    def process_record(self, ctx, record):
        ctx.state(self.seen).set(ctx.state(self.seen).get() + 1)
        ctx.set_timer("tick", ctx.wall_time + 500, TimeDomain.WALL_TIME)

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, ctx.state(self.seen).get(), max(ctx.low_watermark, 0)), "ticks")


class Forward(Computation):
    def __init__(self, output):
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(Record(record.key, record.value, record.timestamp), self.output)


def test_a_weak_computations_wall_timers_fire_once_its_input_is_over(spark, tmp_path):
    """The stager told the source only the consumer's next wall timer: a weak computation's wall
    timer never had a batch planned for it, its output never came and run() waited for ever."""
    pipeline = (Pipeline("weak-wall").add_injector("src", _injector(), "in")
                .add_computation("ticker", Ticker(), ["in"], ["ticks"], production="weak")
                .add_computation("forward", Forward("out"), ["ticks"], ["out"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=90)
    last = {}
    for record in runner.read_stream("out"):
        last[record.key] = max(last.get(record.key, 0), record.value)
    assert last == {f"k{k}": sum(1 for i in range(EVENTS) if i % KEYS == k) for k in range(KEYS)}


class Picky(Computation):
    """Fails on every fifth record."""

    def process_record(self, ctx, record):
        if record.value % 5 == 0:
            raise ValueError(f"no multiples of five: {record.value}")
        ctx.produce(Record(record.key, record.value, record.timestamp), "kept")


class Letters(Computation):
    """Echoes each dead letter's record id once the low watermark passes it (a low-watermark timer)."""

    def process_record(self, ctx, record):
        ctx.produce(Record(record.key, record.value["record_id"], record.timestamp), "letters")


def test_a_reader_of_dead_letters_gets_a_weak_computations_and_finishes(spark, tmp_path):
    """The reader's plan had a sender for the weak computation's own log, which it never writes (its
    dead letters go out in its consumer's): the reader's watermark never moved and run() waited for ever."""
    pipeline = (Pipeline("weak-letters").add_injector("src", _injector(), "in")
                .add_computation("picky", Picky(), ["in"], ["kept"], production="weak", on_error="dead_letter")
                .add_computation("forward", Forward("out"), ["kept"], ["out"])
                .add_computation("letters", Letters(), [DEAD_LETTERS], ["letters"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=90)
    ids = sorted(record.value for record in runner.read_stream("letters"))
    assert len(ids) == len({i for i in range(EVENTS) if i % 5 == 0}) == len(set(ids))
    assert sorted(record.value for record in runner.read_stream("out")) == [i for i in range(EVENTS) if i % 5]
    progress = runner.progress().computations
    assert progress["letters"].low_watermark == END_OF_TIME
    # Counted once, by the computation that made them (its consumer counted them too, publishing them).
    assert (progress["picky"].dead_letters, progress["forward"].dead_letters) == (len(ids), 0)
    # Its productions are what it produced, not also the letters it passes on (60 against 48 before).
    assert progress["forward"].productions == len(runner.read_stream("out"))
