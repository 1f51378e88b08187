"""Event-time consumers of Photon's outputs: a join or an unjoinable decision made on a retry is
stamped with its click's time, and the dispatcher's watermark is held at its earliest pending click
(a watermark hold), so none of them is late downstream. Ground truth: the clicks' own timestamps,
counted per minute in plain Python."""

from __future__ import annotations

import os
from collections import Counter

from millstream import Count, Record, TumblingWindows, WindowAggregate
from millstream.model.records import END_OF_TIME
from millstream.photon import JOINED, UNJOINABLE, PhotonPipelineSpec, RetryPolicy, build_photon_pipeline
from millstream.testing import PipelineHarness

T0 = 1_700_000_000_000
MINUTE = 60_000


def photon_with_windows(tmp_path, streams) -> PipelineHarness:
    """The stock Photon pipeline, with a per-minute count `per_minute_<stream>` of each of `streams`."""
    base = str(tmp_path)
    spec = PhotonPipelineSpec("mine", f"{base}/a", f"{base}/q", f"{base}/c", f"{base}/r",
                              "sqlite:///" + os.path.join(base, "ids.db"),
                              retry=RetryPolicy(500, 2_000, 10_000), dispatch_shards=2)
    pipeline = build_photon_pipeline(spec, sinks=False)
    for stream in streams:
        counter = WindowAggregate(TumblingWindows(MINUTE), Count(), f"per_minute_{stream}")
        pipeline.add_computation(f"per_minute_{stream}", counter, {stream: lambda r: "all"}, counter.outputs)
    return PipelineHarness(pipeline, wall_time=T0)


def test_joins_and_unjoinable_decisions_made_on_retries_are_on_time_for_a_window_downstream(tmp_path):
    h = photon_with_windows(tmp_path, (JOINED, UNJOINABLE))
    queries = [Record(f"web:1:{T0 + i * 7_000}:{i}", {"text": f"q{i}"}, T0 + i * 7_000) for i in range(12)]
    clicks = [Record(f"c{i}", {"query_id": queries[i].key}, T0 + i * 7_000 + 500) for i in range(12)]
    h.feed("queries", queries[:8], watermark=T0 + 56_000)
    h.run()
    h.feed("clicks", clicks, watermark=END_OF_TIME)  # the click log is complete
    h.run()
    # Queries 8 and 9 reach their log after their clicks; 10 and 11 never do.
    h.feed("queries", queries[8:10], watermark=END_OF_TIME)
    h.advance_watermark("reinjected", END_OF_TIME)
    h.run()
    for second in range(1, 30):
        h.advance_wall_time(T0 + second * 1_000)
        h.run()

    joined = {r.value["click_id"] for r in h.output(JOINED)}
    unjoinable = {r.value["click_id"] for r in h.output(UNJOINABLE)}
    assert joined == {f"c{i}" for i in range(10)} and unjoinable == {"c10", "c11"}
    for stream, ids in ((JOINED, joined), (UNJOINABLE, unjoinable)):
        expected = Counter(c.timestamp - c.timestamp % MINUTE for c in clicks if c.key in ids)
        windows = Counter({r.value["start"]: r.value["value"] for r in h.output(f"per_minute_{stream}")})
        assert windows == expected, stream
        assert h.metrics(f"per_minute_{stream}").late == 0


def test_while_nothing_is_reinjected_the_dispatcher_s_watermark_follows_the_clicks(tmp_path):
    # A live run: the logs go on, the verifier has re-injected nothing. A window downstream closes
    # once the clicks' watermark passes it, not when the logs end.
    h = photon_with_windows(tmp_path, (JOINED,))
    first_minute = T0 - T0 % MINUTE
    queries = [Record(f"web:1:{first_minute + i * 5_000}:{i}", {"text": f"q{i}"}, first_minute + i * 5_000)
               for i in range(20)]  # 100 s of queries: the first minute and part of the second
    clicks = [Record(f"c{i}", {"query_id": q.key}, q.timestamp + 500) for i, q in enumerate(queries)]
    h.feed("queries", queries, watermark=first_minute + 100_000)
    h.run()
    h.feed("clicks", clicks, watermark=first_minute + 100_000)
    h.run()
    for second in range(1, 12):  # the re-injection input stays quiet past its idle timeout
        h.advance_wall_time(T0 + second * 1_000)
        h.pull_injectors()
        h.run()
    assert h.low_watermark("dispatcher") == first_minute + 100_000
    expected = Counter(c.timestamp - c.timestamp % MINUTE for c in clicks
                       if c.timestamp < first_minute + MINUTE)
    assert Counter({r.value["start"]: r.value["value"] for r in h.output(f"per_minute_{JOINED}")}) == expected
