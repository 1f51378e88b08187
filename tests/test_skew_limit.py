"""The skew limit: an injector pauses while a computation downstream of it lags behind it by more than
max_skew_ms, so what waits for the watermark stays bounded; nothing is lost or reordered: the output
is the same as without the limit."""

from __future__ import annotations

from bucket_counter import BucketCounter
from test_holds import Judge

from millstream import END_OF_TIME, Computation, GeneratorInjector, Pipeline, Record, ScriptedInjector, ValueState
from millstream.testing import PipelineHarness

FAST, SLOW = 6_000, 60  # records: the fast input runs 100x further per read than the slow one


def run(max_skew_ms):
    fast = GeneratorInjector(lambda i: Record(f"k{i % 5}", i, i * 10), FAST, lambda n: n * 10,
                             max_records_per_read=300, name="fast")
    slow = GeneratorInjector(lambda i: Record("s", i, i * 1_000), SLOW, lambda n: n * 1_000,
                             max_records_per_read=1, name="slow")
    pipeline = (Pipeline("skew")
                .add_injector("fast", fast, "in", max_skew_ms=max_skew_ms)
                .add_injector("slow", slow, "in")
                .add_computation("windows", BucketCounter(100), ["in"], ["windows"]))
    h = PipelineHarness(pipeline)
    peak = 0
    for _ in range(10_000):
        moved = h.pull_injectors()
        busy = h.step()
        peak = max(peak, h.state_bytes("windows"))
        if not moved and not busy:
            break
    return sorted((r.key, tuple(r.value)) for r in h.output("windows")), peak


def test_the_skew_limit_bounds_what_waits_and_changes_no_output():
    unlimited_output, unlimited_peak = run(None)
    limited_output, limited_peak = run(max_skew_ms=2_000)
    assert limited_output == unlimited_output and len(limited_output) > 500
    # Without the limit the fast input runs ahead of the slow one's watermark and its windows pile
    # up waiting; with it, at most ~2 s of fast input waits at a time.
    assert limited_peak * 5 < unlimited_peak, (limited_peak, unlimited_peak)


def test_while_the_stages_behind_have_published_nothing_the_injector_reads_only_up_to_the_limit():
    fast = GeneratorInjector(lambda i: Record(f"k{i % 5}", i, i * 10), FAST, lambda n: n * 10,
                             max_records_per_read=300, name="fast")
    pipeline = (Pipeline("skew").add_injector("fast", fast, "in", max_skew_ms=2_000)
                .add_computation("windows", BucketCounter(100), ["in"], ["windows"]))
    h = PipelineHarness(pipeline)
    assert h.pull_injectors()  # the first read
    assert not h.pull_injectors()  # windows has not run: the injector waits for it
    h.step()
    assert h.pull_injectors()


GAP_MS = 5_000


class Session(Computation):
    """A gap session per key, closed by a low-watermark timer GAP_MS after its last record, holding
    the watermark at the session's start (its record is stamped there): the timer waits for input
    the hold would stop, if the skew limit counted holds."""

    start = ValueState[int]("start")

    def process_record(self, ctx, record):
        start = ctx.state(self.start)
        if start.get() is None:
            start.set(record.timestamp)
        ctx.set_timer("close", record.timestamp + GAP_MS, hold=start.get())

    def process_timer(self, ctx, timer):
        start = ctx.state(self.start)
        ctx.produce(Record(ctx.key, [start.get(), timer.time], start.get()), "sessions")
        start.clear()


def expected_sessions(times: list[int]) -> list[list[int]]:
    """Gap sessions of one key's record times (plain Python): [start, last + GAP_MS]."""
    sessions: list[list[int]] = []
    for t in sorted(times):
        if sessions and t < sessions[-1][1]:
            sessions[-1][1] = t + GAP_MS
        else:
            sessions.append([t, t + GAP_MS])
    return sessions


def session_pipeline(max_skew_ms, steps, downstream_judge=True):
    pipeline = (Pipeline("held")
                .add_injector("src", ScriptedInjector("src", steps), "in", max_skew_ms=max_skew_ms)
                .add_computation("session", Session(), ["in"], ["sessions"]))
    if downstream_judge:  # a computation held through its input, as far from the injector again
        pipeline.add_computation("judge", Judge(), ["sessions"], ["judged"])
    return pipeline


def test_a_hold_further_behind_than_the_limit_does_not_stop_the_input_it_waits_for():
    """A session held at its start longer than max_skew_ms: the skew limit measures the stages behind
    by what they have processed, not by their held watermarks, so the input reaches the timer and
    every session closes, on time downstream; a quiet stretch between bursts splits the sessions."""
    first, second = [1_000 * i for i in range(1, 31)], [60_000 + 1_000 * i for i in range(12)]
    times = first + second
    steps = ([([Record("k", t, t)], t) for t in first] + [([], 50_000)]  # quiet: the watermark moves on
             + [([Record("k", t, t)], t) for t in second] + [([], 100_000)])
    h = PipelineHarness(session_pipeline(2_000, steps))
    h.run_injectors(max_records_per_step=1)  # a record per input point, as the plain-Python sessions take them
    assert h.metrics("session").records == len(times)
    assert [r.value for r in h.output("sessions")] == expected_sessions(times) == [[1_000, 35_000],
                                                                                  [60_000, 76_000]]
    assert [r.value["late"] for r in h.output("judged")] == [False, False]  # the hold kept them on time
    assert h.low_watermark("session") == END_OF_TIME  # the script ended: everything released


def test_the_limit_still_stops_the_injector_while_a_stage_behind_has_not_processed_its_input():
    """The skew limit's own case with a hold present: the injector reads (a record per read) until
    it is more than max_skew_ms past what the stages behind have processed, and no further until
    they process it; the hold, at the first record, never stops it."""
    times = [1_000 * i for i in range(1, 31)]
    h = PipelineHarness(session_pipeline(2_000, [([Record("k", t, t)], t) for t in times]))

    def reads() -> int:
        count = 0
        while h.pull_injectors(max_records=1):
            count += 1
        return count

    assert reads() == 1  # nothing processed downstream yet: one read (the harness starts at the beginning)
    rounds = []
    for _ in range(3):
        h.run()  # the stages behind process what was read
        rounds.append(reads())
    # processed up to 1 s: reads at 1, 2 and 3 s past it are within the limit, the fourth is not
    assert rounds == [3, 3, 3]
    assert h.low_watermark("session") == 1_000  # held at the session's start all along


def test_the_unheld_watermark_is_the_runners_own_not_user_code_s():
    """The reserved key a skew limit adds (core/watermarks.py: skew_watermark) is not a watermark
    key user code can read, set timers on or publish, and the messages that list keys leave it out."""
    import pytest

    from millstream.core.executor import ComputationFailed

    class Reads(Computation):
        def process_record(self, ctx, record):
            if record.value == "read":
                ctx.watermark("~unheld")
            else:
                ctx.set_timer("t", 10, watermark="~unheld")

    for action in ("read", "timer"):
        pipeline = (Pipeline("own").add_injector("src", ScriptedInjector("src", []), "in", max_skew_ms=1_000)
                    .add_computation("reads", Reads(), ["in"], []))
        h = PipelineHarness(pipeline)
        h.feed("src", [Record("k", action, 5)], watermark=5)
        with pytest.raises(ComputationFailed, match=r"'~unheld'.*carry: \[\]"):
            h.run()
        with pytest.raises(ValueError, match=r"its watermark_keys: \[\]"):  # a harness that goes on
            PipelineHarness(pipeline).advance_watermark("src", 6, keyed={"~unheld": 6})
        assert h.keyed_watermarks("reads") == {}
