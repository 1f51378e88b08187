"""State that goes away: keys with nothing left disappear, dedup ids and TTL'd values expire on
schedule whether or not their key is touched again, internal streams carry no dedup state, and state
stays flat over long runs where most keys stop appearing."""

from __future__ import annotations

import pytest

from millstream import (
    END_OF_TIME,
    Computation,
    GeneratorInjector,
    MapState,
    Pipeline,
    Record,
    ScriptedInjector,
    ValueState,
)
from millstream.core.keystate import KeyState
from millstream.testing import PipelineHarness


class Forward(Computation):
    """Stateless: passes every record on."""

    def __init__(self, output: str = "out") -> None:
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(record, self.output)


class Count(Computation):
    n = ValueState[int]("n", default=0)

    def process_record(self, ctx, record):
        ctx.state(self.n).set(ctx.state(self.n).get() + 1)


def _blob(harness: PipelineHarness, computation: str, key: str) -> KeyState | None:
    run = harness._run(computation)
    blob = harness._blob(run, key)
    return KeyState.loads(blob) if blob else None


def test_dedup_ids_of_a_key_never_touched_again_expire_on_schedule():
    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("fwd", Forward(), ["in"], ["out"], dedup_horizon_ms=1_000))
    h = PipelineHarness(p)
    h.feed("src", [Record("quiet", 1, 10, "a")], watermark=0)
    h.run()
    assert h.dedup_ids("fwd") == [("quiet", "a")] and h.keys("fwd") == []  # ids do not keep keys alive
    h.feed("src", [Record("busy", 1, 500, "b")], watermark=900)
    h.run()
    assert ("quiet", "a") in h.dedup_ids("fwd")  # 900 < 10 + 1000: still within the horizon
    h.feed("src", [Record("quiet", 1, 10, "a")])  # a duplicate now is caught
    h.run()
    assert h.metrics("fwd").duplicates == 1
    h.advance_watermark("src", 1_011)  # the horizon has passed for "a"; "quiet" sees nothing new
    h.run()
    assert ("quiet", "a") not in h.dedup_ids("fwd")
    h.advance_watermark("src", 5_000)
    h.run()
    assert h.dedup_ids("fwd") == []


def test_internal_streams_carry_no_dedup_state():
    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("fwd", Forward(), ["in"], ["out"])
         .add_computation("down", Forward("end"), ["out"], ["end"]))
    h = PipelineHarness(p)
    h.feed("src", [Record(f"k{i}", i, i, f"r{i}") for i in range(20)], watermark=0)
    h.run()
    assert len(h.output("end")) == 20
    assert h.dedup_ids("down") == []  # nothing to remember: its input cannot hold duplicates
    assert len(h.dedup_ids("fwd")) == 20  # the injector's records can: their ids are kept


def test_ids_read_in_a_step_whose_watermark_jumps_past_the_horizon_are_kept():
    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("count", Count(), ["in"], dedup_horizon_ms=1_000))
    h = PipelineHarness(p)
    h.feed("src", [Record("k", 1, 10, "x")], watermark=3_600_000)  # one step: the record, then an hour
    h.run()
    h.feed("src", [Record("k", 1, 10, "x")])  # the injector replays it
    h.run()
    assert h.metrics("count").duplicates == 1 and h.state("count", "k") == {"n": 1}


def _points_alone_and_together(pipeline, points):
    """The harness's outcome with a run after each input point, and with one run for them all:
    [(outputs' values, metrics)] for each."""
    outcomes = []
    for together in (False, True):
        h = PipelineHarness(pipeline())
        for point in points:
            point(h)
            if not together:
                h.run()
        h.run()
        outcomes.append(h)
    return outcomes


def test_an_id_past_its_horizon_is_forgotten_between_input_points_of_one_step():
    # Point 1 reads id "a" (mark 10); point 2 moves the watermark a horizon past it; point 3 brings "a"
    # again. Run point by point, "a" is forgotten at the end of point 2 and its copy is delivered
    # (late): one step holding the three points must do the same.
    def pipeline():
        return (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                .add_computation("fwd", Forward(), ["in"], ["out"], dedup_horizon_ms=1_000))

    points = [lambda h: h.feed("src", [Record("k", 1, 0, "a")], watermark=10),
              lambda h: h.advance_watermark("src", 1_011),
              lambda h: h.feed("src", [Record("k", 2, 0, "a")])]
    for h in _points_alone_and_together(pipeline, points):
        assert [r.value for r in h.output("out")] == [1, 2]
        assert (h.metrics("fwd").records, h.metrics("fwd").duplicates, h.metrics("fwd").late) == (2, 0, 1)
    # Within the horizon it stays a duplicate, together as alone.
    points[1] = lambda h: h.advance_watermark("src", 1_010)
    for h in _points_alone_and_together(pipeline, points):
        assert [r.value for r in h.output("out")] == [1] and h.metrics("fwd").duplicates == 1


def test_a_value_past_its_ttl_is_gone_between_input_points_of_one_step():
    # Written at watermark 10 with a TTL of 100; the watermark reaches 500 in point 2; point 3's
    # record reads it: gone, whether the points run one by one or in one step. And a timer firing
    # in a later point than the write, with nothing of the key in between, reads it gone too.
    class Read(Computation):
        v = ValueState[str]("v", ttl_ms=100)

        def process_record(self, ctx, record):
            ctx.produce(Record(ctx.key, ["record", ctx.state(self.v).get()], record.timestamp), "out")
            if record.value == "write":
                ctx.state(self.v).set("x")
                ctx.set_timer("late", 400)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, ["timer", ctx.state(self.v).get()], timer.time), "out")

    def pipeline():
        return (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                .add_computation("c", Read(), ["in"], ["out"], dedup_horizon_ms=0))

    points = [lambda h: h.feed("src", [Record("k", "write", 0, "a")], watermark=10),
              lambda h: h.advance_watermark("src", 300),
              lambda h: h.advance_watermark("src", 500),
              lambda h: h.feed("src", [Record("k", "read", 600, "b")])]
    for h in _points_alone_and_together(pipeline, points):
        assert [r.value for r in h.output("out")] == [["record", None], ["timer", None], ["record", None]]
    # Within the TTL the value is read, together as alone.
    points[1] = lambda h: h.advance_watermark("src", 100)
    points[2] = lambda h: h.advance_watermark("src", 110)
    points[3] = lambda h: h.feed("src", [Record("k", "read", 600, "b")], watermark=400)
    for h in _points_alone_and_together(pipeline, points):
        assert [r.value for r in h.output("out")] == [["record", None], ["record", "x"], ["timer", "x"]]


    


def test_a_key_whose_timer_fired_and_whose_state_is_gone_disappears():
    class Once(Computation):
        pending = ValueState[int]("pending")

        def process_record(self, ctx, record):
            ctx.state(self.pending).set(record.value)
            ctx.set_timer("t", record.timestamp + 100)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, ctx.state(self.pending).get(), timer.time), "out")
            ctx.state(self.pending).clear()

    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("once", Once(), ["in"], ["out"], dedup_horizon_ms=0))
    h = PipelineHarness(p)
    ids = []
    for round_ in range(3):
        t = 1_000 * (round_ + 1)
        h.feed("src", [Record("k", round_, t, f"r{round_}")], watermark=t)
        h.advance_watermark("src", t + 500)
        h.run()
        assert h.keys("once") == []  # nothing pins it: no counter, no leftover
        ids.append(h.output("out")[-1].id)
    assert len(set(ids)) == 3  # a reborn key's timer outputs still get fresh ids


def test_state_ttl_expires_values_in_low_watermark_time_untouched_keys_included():
    class Remember(Computation):
        last = ValueState[int]("last", ttl_ms=1_000)
        seen = MapState[str, int]("seen")  # no TTL

        def process_record(self, ctx, record):
            ctx.state(self.last).set(record.value)
            ctx.state(self.seen).put(str(record.value), 1)

    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("remember", Remember(), ["in"], dedup_horizon_ms=0))
    h = PipelineHarness(p)
    h.feed("src", [Record("k", 7, 100, "a")], watermark=100)
    h.run()
    assert h.state("remember", "k") == {"last": 7, "seen": {"7": 1}}
    h.advance_watermark("src", 1_100)  # written at watermark 100: lives until the watermark passes 1100
    h.run()
    assert h.state("remember", "k")["last"] == 7
    h.advance_watermark("src", 1_101)
    h.run()
    assert h.state("remember", "k") == {"seen": {"7": 1}}


def test_a_ttl_changed_on_restart_applies_to_values_written_before():
    # A key written under a TTL, then run by the computation declared without it (a restart with
    # changed code, on the same store): the value stays and no longer expires; the TTL's mark goes.
    from millstream.core.executor import Delivery, KeyGroupExecutor
    from millstream.core.plan import plan_computation
    from millstream.core.store import MemoryKeyStore
    from millstream.core.watermarks import Segment

    def remember(ctx, record, last):
        if record.value is not None:
            ctx.state(last).set(record.value)
        else:
            ctx.produce(Record(ctx.key, ctx.state(last).get(), record.timestamp), "out")

    class Remember(Computation):
        last = ValueState[int]("last", ttl_ms=100_000)

        def process_record(self, ctx, record):
            remember(ctx, record, self.last)

    class RememberForGood(Computation):  # the same code, the TTL taken away
        last = ValueState[int]("last")

        def process_record(self, ctx, record):
            remember(ctx, record, self.last)

    class RememberBriefly(Computation):  # the same code, the TTL shortened
        last = ValueState[int]("last", ttl_ms=1_000)

        def process_record(self, ctx, record):
            remember(ctx, record, self.last)

    def executor(computation, store):
        pipeline = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                    .add_computation("c", computation, ["in"], ["out"], dedup_horizon_ms=0))
        return KeyGroupExecutor(plan_computation(pipeline, "c", key_groups=1), store)

    store = MemoryKeyStore()
    executor(Remember(), store).step([Delivery("k", "in", Record("k", 7, 100, "a"), 0, True)], [Segment(0, 100)], 0)
    assert KeyState.loads(store.load(["k"])["k"]).written == {"last": 100}
    later = executor(RememberForGood(), store)
    result = later.step([Delivery("k", "in", Record("k", None, 5_000, "b"), 0, True)], [Segment(5_000, 5_000)], 0)
    assert [p.value for p in result.productions] == [b"7"]
    assert KeyState.loads(store.load(["k"])["k"]).written == {}
    assert store.due(END_OF_TIME, 0, {}) == []  # nothing left to wake it for

    # Shortened: the value written at 100 is gone once the watermark is past 1,100, though the key
    # was stored to wake at 100,101 under the longer TTL and ran at neither.
    store = MemoryKeyStore()
    executor(Remember(), store).step([Delivery("k", "in", Record("k", 7, 100, "a"), 0, True)], [Segment(0, 100)], 0)
    later = executor(RememberBriefly(), store)
    result = later.step([Delivery("k", "in", Record("k", None, 5_000, "b"), 0, True)], [Segment(5_000, 5_000)], 0)
    assert [p.value for p in result.productions] == [b"null"]


def test_ctx_clear_discards_everything_of_the_key():
    class Forget(Computation):
        n = ValueState[int]("n", default=0)
        items = MapState[str, int]("items")

        def process_record(self, ctx, record):
            if record.value == "forget":
                ctx.clear()
                return
            ctx.state(self.n).set(ctx.state(self.n).get() + 1)
            ctx.state(self.items).put(record.value, 1)
            ctx.set_timer("later", 10_000)

    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("forget", Forget(), ["in"], dedup_horizon_ms=0))
    h = PipelineHarness(p)
    h.feed("src", [Record("k", "a", 1, "1"), Record("k", "b", 2, "2")], watermark=0)
    h.run()
    assert h.state("forget", "k") == {"n": 2, "items": {"a": 1, "b": 1}} and h.pending_timers("forget", "k")
    h.feed("src", [Record("k", "forget", 3, "3")], watermark=5)
    h.run()
    assert h.state("forget", "k") == {} and h.pending_timers("forget", "k") == []
    assert h.keys("forget") == []
    assert ("k", "3") in h.dedup_ids("forget")  # dedup ids stay until their horizon: duplicates are still caught


class Windower(Computation):
    counts = MapState[int, int]("counts")

    def process_record(self, ctx, record):
        bucket = record.timestamp - record.timestamp % 1_000
        counts = ctx.state(self.counts)
        counts.put(bucket, counts.get(bucket, 0) + 1)
        ctx.set_timer(f"w{bucket}", bucket + 1_000)

    def process_timer(self, ctx, timer):
        bucket = timer.time - 1_000
        ctx.produce(Record(ctx.key, ctx.state(self.counts).get(bucket), timer.time), "windows")
        ctx.state(self.counts).remove(bucket)


def test_state_stays_flat_over_event_time_as_keys_come_and_go():
    # 25,000 keys, each active for a moment of event time and then never again, over 7.5 minutes of
    # event time, 15 times the dedup horizon. Keys leave as fast as new ones arrive.
    keys_total, duration_ms, horizon_ms = 25_000, 450_000, 30_000
    rate_per_ms = 0.05  # 50 records per second of event time
    step_records = 1_250  # 25 s of event time per step
    sample_ms = 15_000
    total = int(duration_ms * rate_per_ms)
    per_key_ms = duration_ms // keys_total

    def make(i: int) -> Record:
        t = int(i / rate_per_ms)
        return Record(f"q{t // per_key_ms}", None, t)

    injector = GeneratorInjector(make, total, lambda n: int(n / rate_per_ms), max_records_per_read=step_records)
    p = Pipeline("p").add_injector("src", injector, "in").add_computation(
        "windower", Windower(), ["in"], ["windows"], dedup_horizon_ms=horizon_ms)
    h = PipelineHarness(p)
    samples = []  # (event time, keys held, bytes held)
    while h.pull_injectors(step_records) or h.step():
        h.step()
        watermark = h.input_watermark("windower")
        if watermark >= END_OF_TIME:
            break
        if not samples or watermark - samples[-1][0] >= sample_ms:
            stores = [e.store for e in h._run("windower").executors]
            samples.append((watermark, sum(len(s.dedup) for s in stores),
                            sum(len(b.blob) for s in stores for b in s.blobs.values())))
    steady = [s for s in samples if s[0] >= 3 * horizon_ms]  # well past the horizon
    assert len(steady) >= 10
    ids_held = [k for _, k, _ in steady]
    bytes_held = [b for _, _, b in steady]
    assert max(ids_held) <= 1.1 * min(ids_held), f"dedup ids held grew: {ids_held}"
    assert max(bytes_held) <= 1.1 * min(bytes_held), f"state bytes held grew: {bytes_held}"
    # What is held is what arrived within the horizon (plus one step: an id's horizon counts from the
    # watermark once its step is processed), not everything ever seen.
    step_ms = step_records / rate_per_ms
    assert max(ids_held) <= 1.1 * (horizon_ms + step_ms) * rate_per_ms < total / 5


@pytest.mark.parametrize("ids_return", [True, False])
def test_the_dedup_index_expires_exactly_the_ids_past_their_horizon(ids_return):
    """Against a plain dict of (key, id) -> mark: random batches of ids and random expiries; after
    each, the same ids are known. With `ids_return`, ids are added again, before or after they
    expired, with new marks (the newest mark counts); without, every id is new (as a step adds
    them), which the index expires by a faster path."""
    import random

    from millstream.core.dedup import DedupIndex, seen_of

    rng = random.Random(7)
    index, model = DedupIndex(), {}
    watermark = 0
    fresh = iter(range(10**9))
    for _ in range(400):
        batch = [(f"k{rng.randrange(20)}", f"r{rng.randrange(300) if ids_return else next(fresh)}",
                  watermark + rng.randrange(-50, 400)) for _ in range(rng.randrange(0, 12))]
        batch = list({(k, r): (k, r, m) for k, r, m in batch}.values())
        index.add(seen_of(batch))
        model.update({(k, r): m for k, r, m in batch})
        watermark += rng.randrange(0, 60)
        horizon = rng.choice([0, 100, 250])
        index.expire(watermark, horizon)
        model = {pair: mark for pair, mark in model.items() if mark >= watermark - horizon}
        assert {(k, r): m for k, r, m in index.entries()} == model
        assert all(r in index.ids_of(k) for k, r in model) and len(index) == len(model)
    for watermark in range(watermark, watermark + 500):  # no more ids: they go, the last ones at once
        index.expire(watermark, 0)
        model = {pair: mark for pair, mark in model.items() if mark >= watermark}
        assert {(k, r): m for k, r, m in index.entries()} == model and len(index) == len(model)
    assert not model


def test_key_blobs_written_before_the_timer_layout_changed_still_load():
    """A root written by an earlier version holds (values, written, {tag: timer}) blobs."""
    import pickle

    from millstream.core.keystate import PendingTimer

    old = pickle.dumps(({"n": b"3"}, {}, {"t": PendingTimer(5, False, "s", "")}), protocol=5)
    older = pickle.dumps(({"n": b"3"}, {}, {"t": (5, True, "s")}), protocol=5)
    assert KeyState.loads(old).timers == {"t": PendingTimer(5, False, "s", "")}
    assert KeyState.loads(older).timers == {"t": PendingTimer(5, True, "s", "")}
    state = KeyState.loads(old)
    assert KeyState.loads(state.dumps()).timers == state.timers and KeyState.loads(state.dumps()).values == {"n": b"3"}
