"""The in-process harness end to end: multi-stage low watermarks, timers, exactly-once, lateness,
deterministic ids. Ground truth is computed independently in plain Python."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest

from millstream import (
    END_OF_TIME,
    Computation,
    ListState,
    MapState,
    Pipeline,
    PipelineError,
    Record,
    ScriptedInjector,
    TimeDomain,
    ValueState,
)
from millstream.model.records import BEGINNING_OF_TIME
from millstream.testing import PipelineHarness

W = 50  # window length, ms


class Windower(Computation):
    """Counts records per key and tumbling window; emits each window when the low watermark passes it."""

    counts = MapState("counts")

    def __init__(self) -> None:
        self.fired: list[tuple[int, int]] = []  # (timer time, input low watermark when fired)

    def process_record(self, ctx, record):
        window = record.timestamp // W * W
        counts = ctx.state(self.counts)
        counts.put(window, counts.get(window, 0) + 1)
        ctx.set_timer(f"w{window}", window + W)

    def process_timer(self, ctx, timer):
        self.fired.append((timer.time, ctx.low_watermark))
        window = timer.time - W
        counts = ctx.state(self.counts)
        ctx.produce(Record(ctx.key, {"window": window, "count": counts.get(window)}, timer.time), "counts")
        counts.remove(window)


class Summer(Computation):
    """Keyed by window: sums the per-key counts, emits the total once the window is complete."""

    total = ValueState("total", default=0)

    def process_record(self, ctx, record):
        handle = ctx.state(self.total)
        handle.set(handle.get() + record.value["count"])
        ctx.set_timer("emit", record.timestamp)

    def process_timer(self, ctx, timer):
        ctx.produce(Record("all", {"window": int(ctx.key), "total": ctx.state(self.total).get()}, timer.time),
                    "totals")
        ctx.state(self.total).clear()


class Auditor(Computation):
    seen = ListState("seen")

    def __init__(self) -> None:
        self.log: list[tuple[dict, int, bool, int]] = []

    def process_record(self, ctx, record):
        self.log.append((record.value, record.timestamp, ctx.is_late, ctx.low_watermark))
        ctx.state(self.seen).append(record.value["window"])


def three_stage(injectors=("src1", "src2")):
    p = Pipeline("dips")
    for name in injectors:
        p.add_injector(name, ScriptedInjector(name, []), "events")
    windower, summer, auditor = Windower(), Summer(), Auditor()
    p.add_computation("windower", windower, ["events"], ["counts"])
    p.add_computation("summer", summer, {"counts": lambda r: str(r.value["window"])}, ["totals"])
    p.add_computation("auditor", auditor, ["totals"])
    return p, windower, summer, auditor


def make_events(rng, n, keys):
    """(key, ts, injector) by index: timestamps with bounded local disorder (delays are added later)."""
    events = []
    for i in range(n):
        events.append((rng.choice(keys), 3 * i + rng.randrange(40), rng.choice(["src1", "src2"])))
    return events


def earliest_pending(h, computation, keys):
    times = [t.time for k in keys for t in h.pending_timers(computation, k) if t.domain is TimeDomain.LOW_WATERMARK]
    return min(times) if times else None


@pytest.mark.parametrize("seed", range(3))
def test_multi_stage_watermarks_are_monotonic_timers_fire_when_passed_and_timer_output_is_never_late(seed):
    rng = random.Random(seed)
    keys = [f"q{i}" for i in range(12)]
    events = make_events(rng, 600, keys)
    p, windower, summer, auditor = three_stage()
    h = PipelineHarness(p, key_groups=3)
    pending = set(range(len(events)))  # indices not yet fed
    delayed: dict[int, int] = {}  # index -> batches left to wait
    cursor = 0
    windows_seen: set[int] = set()
    while cursor < len(events) or delayed:
        batch = []
        for _ in range(rng.randint(0, 30)):
            if cursor < len(events):
                if rng.random() < 0.08:
                    delayed[cursor] = rng.randint(1, 10)  # held back on the wire
                else:
                    batch.append(cursor)
                cursor += 1
        for i in list(delayed):
            delayed[i] -= 1
            if delayed[i] <= 0:
                del delayed[i]
                batch.append(i)
        rng.shuffle(batch)
        for i in batch:
            pending.remove(i)
        for name in ("src1", "src2"):
            # Honest injector watermark: nothing unread of this injector is older.
            unread = [events[i][1] for i in pending if events[i][2] == name]
            wm = min(unread) if unread else END_OF_TIME
            h.feed(name, [Record(events[i][0], None, events[i][1], f"e{i}") for i in batch
                          if events[i][2] == name], watermark=wm)
        windows_seen.update(events[i][1] // W * W for i in batch)
        h.step()
        # Output = min(input, earliest pending low-watermark timer), never above the input.
        for comp, comp_keys in (("windower", keys), ("summer", [str(w) for w in windows_seen])):
            earliest = earliest_pending(h, comp, comp_keys)
            expected = h.input_watermark(comp) if earliest is None else min(h.input_watermark(comp), earliest)
            assert h.low_watermark(comp) == expected
            # Timers fire in the step that brings the watermark past them: none is left due.
            assert earliest is None or earliest > h.input_watermark(comp)
        assert h.input_watermark("summer") <= h.low_watermark("windower")
        assert h.input_watermark("auditor") <= h.low_watermark("summer")
    h.run()

    for comp in ("windower", "summer", "auditor"):
        history = h.watermark_history(comp)
        assert history == sorted(history), f"{comp} low watermark went backwards"
        assert history[-1] == END_OF_TIME
    # No timer fired before its computation's input low watermark reached it.
    assert windower.fired and all(time <= lw for time, lw in windower.fired)
    # Records produced by timers are never late downstream; honest input is never late either.
    assert h.metrics("windower").late == 0
    assert h.metrics("summer").late == 0 and h.metrics("auditor").late == 0
    assert all(not late and ts >= lw for _, ts, late, lw in auditor.log)
    # Ground truth: the number of events per window, each window reported exactly once.
    truth = Counter(ts // W * W for _, ts, _ in events)
    reported = Counter()
    for value, *_ in auditor.log:
        reported[value["window"]] += 1
        assert value["total"] == truth[value["window"]], value
    assert set(reported) == set(truth) and set(reported.values()) == {1}
    assert h.state("auditor", "all") == {"seen": [v["window"] for v, *_ in auditor.log]}


def test_late_records_reach_user_code_flagged_and_counted_and_watermarks_stay_monotonic():
    rng = random.Random(7)
    p, windower, summer, auditor = three_stage(injectors=("src1",))
    late_seen = []

    original = windower.process_record

    def spy(ctx, record):
        late_seen.append((record.id, ctx.is_late))
        original(ctx, record)

    windower.process_record = spy
    h = PipelineHarness(p)
    observed = BEGINNING_OF_TIME  # the windower's input low watermark when the next records arrive
    expected_late = {}
    wm = 0
    for step in range(40):
        batch = []
        for j in range(rng.randint(1, 8)):
            ts = wm + rng.randint(-120, 200)  # some behind the published watermark: late
            rid = f"s{step}-{j}"
            batch.append(Record(rng.choice("abc"), None, ts, rid))
            expected_late[rid] = ts < observed
        wm += rng.randint(0, 60)
        h.feed("src1", batch, watermark=wm)
        h.step()
        observed = wm
    h.advance_watermark("src1", END_OF_TIME)
    h.run()
    assert dict(late_seen) == expected_late
    assert sum(expected_late.values()) > 10
    assert h.metrics("windower").late == sum(expected_late.values())
    for comp in ("windower", "summer", "auditor"):
        assert h.watermark_history(comp) == sorted(h.watermark_history(comp))


def test_records_fed_with_a_watermark_beyond_them_are_not_late_but_later_ones_are():
    p, windower, *_ = three_stage(injectors=("src1",))
    h = PipelineHarness(p)
    h.feed("src1", [Record("a", None, 10, "x")], watermark=100)  # read before the promise: on time
    h.step()
    assert h.metrics("windower").late == 0
    h.feed("src1", [Record("a", None, 99, "y"), Record("a", None, 100, "z")])
    h.step()
    assert h.metrics("windower").late == 1


# -- exactly-once ------------------------------------------------------------------------------------
def counting_pipeline(**kwargs):
    class Count(Computation):
        n = ValueState("n", default=0)

        def process_record(self, ctx, record):
            ctx.state(self.n).set(ctx.state(self.n).get() + 1)
            ctx.produce(Record(record.key, record.value, record.timestamp), "out")

    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("count", Count(), ["in"], ["out"], **kwargs))
    return p


def test_redelivered_ids_are_processed_once_within_and_across_steps():
    h = PipelineHarness(counting_pipeline())
    records = [Record("k", i, 1, f"id{i}") for i in range(5)]
    h.feed("src", records + records[:2])  # duplicates inside one step
    h.step()
    h.feed("src", records)  # the injector re-feeds after a "crash"
    h.feed("src", records[3:])
    h.run()
    assert h.state("count", "k") == {"n": 5}
    assert [r.value for r in h.output("out")] == [0, 1, 2, 3, 4]
    assert h.metrics("count").duplicates == 2 + 5 + 2
    assert h.metrics("count").records == 5


def test_injector_replay_of_an_interval_is_deduplicated():
    inj = ScriptedInjector("src", [([Record("k", i, i) for i in range(4)], 3), ([Record("j", 9, 9)], 9)])
    h = PipelineHarness(counting_pipeline())
    start = inj.initial_offset("0")
    end = inj.latest_offset("0", inj.latest_offset("0", start, None), None)
    for _ in range(3):  # read the same offsets three times, as a restarted runner would
        h.feed("src", inj.read("0", start, end))
        h.step()
    assert h.metrics("count").records == 5 and h.metrics("count").duplicates == 10
    assert h.state("count", "k") == {"n": 4}


def test_dedup_horizon_forgets_ids_documented_behaviour():
    h = PipelineHarness(counting_pipeline(dedup_horizon_ms=1_000))
    h.feed("src", [Record("k", "a", 0, "dup")], watermark=0)
    h.run()
    h.feed("src", [Record("k", "a", 0, "dup")], watermark=1_000)  # within the horizon
    h.run()
    assert h.metrics("count").duplicates == 1
    # After the low watermark moved more than the horizon past the later of the id's arrival and its
    # timestamp, and the key was touched, the id is forgotten: a duplicate this late is processed again.
    h.feed("src", [Record("k", "b", 2_000, "other")], watermark=2_000)
    h.run()
    h.feed("src", [Record("k", "c", 2_000, "third")], watermark=3_000)
    h.run()
    h.feed("src", [Record("k", "a", 0, "dup")])
    h.run()
    assert h.metrics("count").records == 4 and h.state("count", "k") == {"n": 4}


def test_consecutive_windows_of_one_key_all_reach_the_consumer():
    """Window outputs of one key, far apart in time, after the key's state was fully cleared: each
    is a new record, and the consumer must not discard one as a duplicate of an earlier window."""

    class Once(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("end", record.timestamp // 3_600_000 * 3_600_000 + 3_600_000)

        def process_timer(self, ctx, timer):
            ctx.produce(Record(ctx.key, timer.time, timer.time), "windows")

    class Sink(Computation):
        got = ListState("got")

        def process_record(self, ctx, record):
            ctx.state(self.got).append(record.value)

    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("once", Once(), ["in"], ["windows"]).add_computation("sink", Sink(), ["windows"]))
    h = PipelineHarness(p)
    for hour in range(4):
        t = hour * 3_600_000
        h.feed("src", [Record("k", None, t + 10, f"r{hour}")], watermark=t)
        h.feed("src", [], watermark=t + 3_600_000)
        h.run()
    assert h.state("sink", "k") == {"got": [3_600_000 * (hour + 1) for hour in range(4)]}
    assert h.metrics("sink").duplicates == 0


# -- deterministic ids -------------------------------------------------------------------------------
def scripted_run(shards):
    rng = random.Random(3)
    p, *_ = three_stage()
    h = PipelineHarness(p, key_groups=shards)
    ts = 0
    for step in range(25):
        for name in ("src1", "src2"):
            h.feed(name, [Record(rng.choice("abcdef"), None, ts + rng.randint(0, 30)) for _ in range(5)],
                   watermark=ts)
        ts += 20
        h.step()
    for name in ("src1", "src2"):
        h.advance_watermark(name, END_OF_TIME)
    h.run()
    return {s: [(r.key, r.value, r.timestamp, r.id) for r in h.output(s)] for s in ("events", "counts", "totals")}


def test_running_the_same_pipeline_twice_gives_identical_output_ids():
    first, second = scripted_run(4), scripted_run(4)
    assert first == second
    all_ids = [r[3] for rows in first.values() for r in rows]
    assert len(all_ids) == len(set(all_ids)), "different causes produced the same id"
    assert len(first["totals"]) > 5


def test_ids_do_not_depend_on_sharding():
    by_shards = [scripted_run(n) for n in (1, 7)]
    for stream in ("events", "counts", "totals"):
        assert sorted(by_shards[0][stream], key=repr) == sorted(by_shards[1][stream], key=repr)


# -- timers through the harness ----------------------------------------------------------------------
class TimerLog(Computation):
    """value: list of ["set", tag, time, domain] / ["del", tag]; logs firings with the clocks."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, str, str, int, int]] = []

    def process_record(self, ctx, record):
        for op in record.value:
            if op[0] == "set":
                ctx.set_timer(op[1], op[2], TimeDomain(op[3]))
            else:
                ctx.delete_timer(op[1])

    def process_timer(self, ctx, timer):
        self.log.append((ctx.key, timer.time, timer.tag, timer.domain.value, ctx.low_watermark, ctx.wall_time))
        ctx.produce(Record(ctx.key, timer.tag, timer.time), "fired")


def timer_harness(**kwargs):
    comp = TimerLog()
    p = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("timers", comp, ["in"], ["fired"]))
    return PipelineHarness(p, **kwargs), comp


def test_wall_time_timers_follow_the_harness_wall_clock():
    h, comp = timer_harness(wall_time=1_000)
    h.feed("src", [Record("k", [["set", "w", 1_500, "wall_time"], ["set", "l", 1_500, "low_watermark"]], 0)])
    h.run()
    assert h.pending_timers("timers", "k")[0].tag == "l"  # (time, tag) order: "l" < "w"
    h.advance_wall_time(1_499)
    h.run()
    assert comp.log == []
    h.advance_wall_time(1_500)
    h.run()
    assert comp.log == [("k", 1_500, "w", "wall_time", BEGINNING_OF_TIME, 1_500)]
    h.advance_watermark("src", 1_500)
    h.run()
    assert comp.log[-1] == ("k", 1_500, "l", "low_watermark", 1_500, 1_500)
    assert h.pending_timers("timers", "k") == []
    with pytest.raises(ValueError, match="wall clock does not go back"):
        h.advance_wall_time(1_000)


def test_timer_behind_the_low_watermark_fires_in_the_same_step():
    h, comp = timer_harness()
    h.feed("src", [], watermark=100)
    h.step()
    h.feed("src", [Record("k", [["set", "late", 40, "low_watermark"], ["set", "later", 101, "low_watermark"]], 0)])
    h.step()
    assert [entry[2] for entry in comp.log] == ["late"]
    assert [t.tag for t in h.pending_timers("timers", "k")] == ["later"]


def test_low_watermark_timer_fires_in_the_step_that_passes_it():
    # Like a Spark micro-batch: records are judged against the watermark they were sent under, then
    # timers due by the batch's new input watermark fire, in the same step.
    h, comp = timer_harness()
    h.feed("src", [Record("k", [["set", "t", 500, "low_watermark"]], 0)], watermark=100)
    h.step()
    assert (h.input_watermark("timers"), h.low_watermark("timers")) == (100, 100)
    h.advance_watermark("src", 499)
    h.step()
    assert h.low_watermark("timers") == 499 and comp.log == []
    h.advance_watermark("src", 10_000)
    h.step()
    assert comp.log[0][1:3] == (500, "t") and comp.log[0][4] == 10_000
    assert h.low_watermark("timers") == 10_000
    assert [(r.value, r.timestamp) for r in h.output("fired")] == [("t", 500)]
    assert h.watermark_history("timers") == [100, 499, 10_000]


@pytest.mark.parametrize("seed", range(3))
def test_randomized_timers_through_the_harness_fire_in_order_and_only_when_due(seed):
    rng = random.Random(seed)
    h, comp = timer_harness(key_groups=3)
    keys = [f"k{i}" for i in range(30)]
    tags = ["a", "b", "c", "d"]
    pending: dict[str, dict[str, tuple[int, str]]] = defaultdict(dict)  # model
    expected: list[tuple[str, int, str, str]] = []
    lw = wall = 0  # the clocks the harness delivers this step's records at
    inj_wm = 0
    serial = 0

    def model_fire(at_lw, at_wall):
        for key in keys:
            while True:
                due = [(t, tag) for tag, (t, d) in pending[key].items()
                       if (t <= at_lw if d == "low_watermark" else t <= at_wall)]
                if not due:
                    break
                t, tag = min(due)
                expected.append((key, t, tag, pending[key].pop(tag)[1]))

    for _ in range(50):
        batch = []
        for _ in range(rng.randint(0, 15)):
            key, ops = rng.choice(keys), []
            for _ in range(rng.randint(1, 3)):
                tag = rng.choice(tags)
                if rng.random() < 0.2:
                    ops.append(["del", tag])
                    pending[key].pop(tag, None)
                else:
                    domain = rng.choice(["low_watermark", "low_watermark", "wall_time"])
                    t = (lw if domain == "low_watermark" else wall) + rng.randint(1, 150)
                    ops.append(["set", tag, t, domain])
                    pending[key][tag] = (t, domain)
            serial += 1
            batch.append(Record(key, ops, 0, f"r{serial}"))
        inj_wm += rng.choice([0, 10, 40])
        wall += rng.choice([0, 0, 30])
        h.feed("src", batch, watermark=inj_wm)
        h.advance_wall_time(wall)
        h.step()
        # Harness step (like a Spark micro-batch): deliver at the input watermark coalesced in the
        # previous step, then fire what the injector's new watermark (and the wall clock) made due.
        lw = inj_wm
        model_fire(lw, wall)
    h.advance_watermark("src", END_OF_TIME)
    h.advance_wall_time(10**12)
    h.run()
    model_fire(lw, 10**12)
    model_fire(END_OF_TIME, 10**12)

    got = defaultdict(list)
    for key, t, tag, domain, at_lw, at_wall in comp.log:
        got[key].append((key, t, tag, domain))
        assert t <= (at_lw if domain == "low_watermark" else at_wall)
    want = defaultdict(list)
    for entry in expected:
        want[entry[0]].append(entry)
    assert dict(got) == dict(want)
    assert len(comp.log) > 200
    for entries in got.values():  # only future times were set: each domain's history is sorted
        for domain in ("low_watermark", "wall_time"):
            seq = [(t, tag) for _, t, tag, d in entries if d == domain]
            assert seq == sorted(seq)


# -- inspection API ----------------------------------------------------------------------------------
def test_inspection_errors_name_what_is_known():
    h, _ = timer_harness()
    with pytest.raises(KeyError, match=r"unknown computation 'nope'; known: \['timers'\]"):
        h.low_watermark("nope")
    with pytest.raises(PipelineError, match=r"unknown injector 'nope'; known: \['src'\]"):
        h.feed("nope", [])
    with pytest.raises(KeyError, match="no stream 'nope' in pipeline 'p'; its streams: "):
        h.output("nope")
    h.advance_watermark("src", 10)
    with pytest.raises(ValueError, match=r"'src' watermark cannot go back from 10 to 5"):
        h.advance_watermark("src", 5)


def test_feed_assigns_deterministic_ids_when_missing():
    ids = []
    for _ in range(2):
        h = PipelineHarness(counting_pipeline())
        h.feed("src", [Record("k", i, 0) for i in range(3)] + [Record("k", 3, 0, "given")])
        ids.append([r.id for r in h.output("in")])
    assert ids[0] == ids[1] and ids[0][3] == "given" and len(set(ids[0])) == 4


def test_times_and_keys_that_are_not_ints_and_strs_are_refused_where_given():
    """A float watermark or wall time reached user code's ctx.low_watermark / ctx.wall_time and failed
    there; a non-str key failed deep inside the state decoding."""
    harness = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                              .add_computation("c", Windower(), ["in"], ["counts"]))
    with pytest.raises(ValueError, match=r"injector 'src' watermark is a float \(999.5\)"):
        harness.feed("src", [Record("k", 1, 5)], watermark=999.5)
    with pytest.raises(ValueError, match=r"injector 'src' watermark is a str"):
        harness.advance_watermark("src", "1000")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"the wall time is a float"):
        harness.advance_wall_time(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keys are str, got int \(7\)"):
        harness.state("c", 7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keys are str"):
        harness.pending_timers("c", 7)  # type: ignore[arg-type]
    harness.feed("src", [Record("k", 1, 5)], watermark=1_000)  # ints: fine
    harness.run()


def test_a_failed_step_stops_the_harness_and_leaves_it_readable():
    # Key groups step one after another: when the second one's key fails, the first one's new state
    # was saved and its productions never published, and the step's input points were taken. Going on
    # reported output no run could produce (n=2 for a key whose first record was never published):
    # the harness now refuses to go on, and what it holds stays readable.
    from millstream import ValueState
    from millstream.core.executor import ComputationFailed
    from millstream.core.plan import key_group
    from millstream.testing import HarnessStopped

    class Count(Computation):
        n = ValueState[int]("n", default=0)

        def process_record(self, ctx, record):
            if record.value == "boom":
                raise ValueError("boom")
            ctx.state(self.n).set(ctx.state(self.n).get() + 1)
            ctx.produce(Record(ctx.key, ctx.state(self.n).get(), record.timestamp), "out")

    keys = [f"k{i}" for i in range(40)]
    early = next(k for k in keys if key_group(k, 4) == 0)
    late = next(k for k in keys if key_group(k, 4) == 3)
    h = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                        .add_computation("c", Count(), ["in"], ["out"]), key_groups=4)
    h.feed("src", [Record(early, "ok", 1, "a"), Record(late, "boom", 2, "b")], watermark=10)
    with pytest.raises(ComputationFailed, match="boom"):
        h.run()
    for going_on in (lambda: h.feed("src", [Record(early, "ok", 3, "c")]), h.run, h.step,
                     lambda: h.advance_watermark("src", 20), lambda: h.advance_wall_time(5), h.pull_injectors):
        with pytest.raises(HarnessStopped, match=r"stopped at a failed step \(computation 'c': ComputationFailed: "):
            going_on()
    assert h.output("out") == [] and h.low_watermark("c") < 10  # as the failed step left them
