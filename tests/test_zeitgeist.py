"""The Zeitgeist app on the in-process harness: generator, honest watermark, detection quality.

One small log (16 queries, 12 minutes of event time, ~38k searches) runs through the whole pipeline
once, stepped like Spark micro-batches; its detections are scored against the generator's ground
truth, which is computed from the config alone. Nothing here is a stored expected output: change the
detectors, the model or the watermark and these tests see it.
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

from millstream.apps.zeitgeist.evaluate import (
    DIP_REQUIRED_MAGNITUDE,
    SPIKE_REQUIRED_MAGNITUDE,
    detections_from_values,
    evaluate,
    format_table,
    overlaps,
    required,
)
from millstream.apps.zeitgeist.generator import (
    DelayedBurst,
    ZeitgeistConfig,
    ZeitgeistInjector,
    delayed_bursts,
    generate,
    ground_truth,
    make_queries,
)
from millstream.apps.zeitgeist.pipeline import COMPUTATIONS, PipelineConfig, build_pipeline
from millstream.model.records import END_OF_TIME
from millstream.testing import PipelineHarness

STEP = 3000  # searches per harness step, like a Spark micro-batch


def small_config(**changes) -> ZeitgeistConfig:
    # Seed 11: 18 anomalies, 8 of them required (5 spikes, 3 dips), an outage, 3 deliberately late searches.
    base = ZeitgeistConfig(queries=16, minutes=12, rate=50.0, seed=11)
    table = make_queries(base)
    # A heavy delayed burst on five popular queries: a minute of their searches arrives 200 s late.
    popular = [name for name, region in zip(table.names, table.regions) if region != "eg"][:5]
    burst = DelayedBurst(tuple(popular), base.start_ms + 400_000,
                         base.start_ms + 460_000, 200_000)
    return replace(base, extra_bursts=(burst,), **changes)


def run(config: ZeitgeistConfig, watermark: str = "honest", step: int = STEP) -> PipelineHarness:
    harness = PipelineHarness(build_pipeline(PipelineConfig(generator=config, watermark=watermark)))
    harness.run_injectors(max_records_per_step=step)
    return harness


@pytest.fixture(scope="module")
def small_run():
    config = small_config()
    harness = run(config)
    detections = detections_from_values([r.value for r in harness.output("anomalies")])
    evaluation = evaluate(ground_truth(config), detections, delayed_bursts(config))
    print(format_table(evaluation))
    return config, harness, detections, evaluation


# -- generator --------------------------------------------------------------------------------------
def test_generator_is_deterministic_and_seeded():
    config = ZeitgeistConfig(queries=15, minutes=6, rate=40.0, seed=3)
    a, b = generate(config), generate(config)
    for name in ("timestamp", "query", "late", "delayed", "watermark", "counts"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert ground_truth(config) == ground_truth(config)
    other = generate(replace(config, seed=4))
    assert len(other) != len(a) or not np.array_equal(other.timestamp, a.timestamp)
    # The injector replays the same records, also after pickling (as Spark ships it to workers).
    injector = ZeitgeistInjector(config, max_records_per_read=500)
    shipped = pickle.loads(pickle.dumps(injector))
    assert len(pickle.dumps(injector)) < 10_000  # ships its config, not the events
    start = injector.initial_offset("0")
    end = injector.latest_offset("0", start, 300)
    assert list(injector.read("0", start, end)) == list(shipped.read("0", start, end))
    assert len({r.id for r in injector.read("0", start, end)}) == 300


def test_ground_truth_is_what_the_traffic_shows():
    config = small_config()
    log = generate(config)
    index = log.table.index()
    truth = ground_truth(config)
    kinds = {a.cause for a in truth}
    assert kinds == {"spike", "dip", "outage"}
    assert len({a.magnitude for a in truth if a.kind == "spike"}) >= 3  # several sizes
    for a in truth:
        lo, hi = (a.start - config.start_ms) // 1000, (a.end - config.start_ms) // 1000
        observed = log.counts[index[a.query], lo:hi].sum()
        factor = a.magnitude if a.kind == "spike" else 1.0 - a.magnitude
        expected = factor * a.baseline
        assert abs(observed - expected) <= 4 * np.sqrt(expected + 1) + 0.2 * expected, a
    outage = [a for a in truth if a.cause == "outage"]
    assert outage and all(a.region == "eg" for a in outage)
    assert {a.query for a in outage} == {n for n, r in zip(log.table.names, log.table.regions) if r == "eg"}


def test_watermark_is_honest_and_delayed_data_is_waited_for():
    config = small_config()
    injector = ZeitgeistInjector(config, max_records_per_read=2000)
    log = injector.log
    assert log.delayed.sum() > 100 and log.late.sum() > 0
    rng = np.random.default_rng(0)
    offset = injector.initial_offset("0")
    published = injector.low_watermark("0", offset)
    behind = 0
    while not injector.is_finished("0", offset):
        end = injector.latest_offset("0", offset, int(rng.integers(1, 2000)))
        for record in injector.read("0", offset, end):
            n = int(record.id.split("-")[1])
            if log.late[n]:
                behind += record.timestamp < published
            else:
                assert record.timestamp >= published, (n, record, published)
        watermark = injector.low_watermark("0", end)
        assert watermark >= published  # monotonic
        published, offset = watermark, end
    assert published == END_OF_TIME
    # The deliberately late ones do arrive behind the watermark published just before them.
    late = np.nonzero(log.late)[0]
    assert (log.timestamp[late] < log.watermark[late]).all() and behind > 0
    # The burst really is delayed: its searches arrive after searches 150+ s newer than them.
    burst = config.extra_bursts[0]
    members = np.isin(log.query, [log.table.index()[q] for q in burst.queries])
    positions = np.nonzero(members & (log.timestamp >= burst.start) & (log.timestamp < burst.end))[0]
    assert (log.max_emitted[positions] - log.timestamp[positions]).min() > 150_000


# -- the pipeline -----------------------------------------------------------------------------------
def test_detection_quality(small_run):
    config, harness, detections, evaluation = small_run
    scores = evaluation.scores
    assert scores["spike"].required >= 3 and scores["dip"].required >= 2, "the test log must exercise both"
    assert evaluation.missed_required == [], format_table(evaluation)
    assert scores["all"].required_recall == 1.0
    for kind in ("spike", "dip", "all"):
        assert scores[kind].precision >= 0.95, format_table(evaluation)
    assert scores["all"].recall >= 0.6  # most weaker anomalies are found too
    # Required magnitudes are the documented ones.
    truth = ground_truth(config)
    assert all(a.magnitude >= SPIKE_REQUIRED_MAGNITUDE for a in truth if a.kind == "spike" and required(a))
    assert all(a.magnitude >= DIP_REQUIRED_MAGNITUDE for a in truth if a.kind == "dip" and required(a))


def test_outage_shows_as_dips_on_the_affected_queries_only(small_run):
    config, harness, detections, evaluation = small_run
    assert set(evaluation.outage_required) <= set(evaluation.outage_detected)
    assert len(evaluation.outage_detected) >= max(2, len(evaluation.outage_queries) // 2)
    assert evaluation.outage_unaffected_dips == []
    outage = [a for a in ground_truth(config) if a.cause == "outage"]
    start, end = outage[0].start, outage[0].end
    during = {d.query for d in detections if d.kind == "dip" and overlaps(start, end, d.start, d.end, 0)}
    explained = {a.query for a in ground_truth(config) if a.kind == "dip" and overlaps(start, end, a.start, a.end, 0)}
    assert during <= explained
    # The Windower produced every second of the silent stretch, zeros included.
    query = outage[0].query
    seconds = {r.value["start"] for r in harness.output("windows") if r.key == query and start <= r.value["start"] < end}
    assert seconds == set(range(start, end, 1000))


def test_no_dip_on_data_that_was_only_delayed(small_run):
    config, harness, detections, evaluation = small_run
    burst = config.extra_bursts[0]
    assert evaluation.burst_dips == []
    assert not [d for d in detections if d.kind == "dip" and d.query in burst.queries
                and overlaps(burst.start, burst.end, d.start, d.end, 5000)]
    # Nothing of the burst was dropped as late: the watermark waited for it.
    assert harness.metrics("windower").late <= int(generate(config).late.sum())


def test_spikes_are_flagged_before_their_data_is_complete_and_dips_after(small_run):
    config, harness, detections, evaluation = small_run
    opened = [r.value for r in harness.output("anomalies") if r.value["status"] == "open"]
    spikes = [v for v in opened if v["kind"] == "spike"]
    dips = [v for v in opened if v["kind"] == "dip"]
    assert spikes and dips
    # A spike is reported while the low watermark is still behind the seconds that show it...
    assert any(v["early"] and v["detected_wm"] < v["end"] for v in spikes)
    # ...a dip only once the watermark has passed every second it covers.
    assert all(v["detected_wm"] >= v["end"] for v in dips)


def test_late_records_are_counted_and_dropped(small_run):
    config, harness, detections, evaluation = small_run
    late = int(generate(config).late.sum())
    assert 0 < harness.metrics("windower").late <= late
    for name in COMPUTATIONS:
        assert harness.low_watermark(name) == END_OF_TIME


def test_a_naive_watermark_would_turn_delayed_data_into_dips():
    """Counter-check for the delayed-data test: the same burst under a watermark that does not wait
    for delayed searches is dropped as late, and the detector sees dips that are not there."""
    base = ZeitgeistConfig(queries=5, minutes=8, rate=40.0, seed=11, spikes=0, dips=0, outage=False, bursts=0)
    names = make_queries(base).names
    burst = DelayedBurst(names[:3], base.start_ms + 330_000, base.start_ms + 390_000, 120_000)
    config = replace(base, extra_bursts=(burst,))
    assert ground_truth(config) == []
    results = {}
    for watermark in ("honest", "naive"):
        harness = run(config, watermark)
        results[watermark] = (
            detections_from_values([r.value for r in harness.output("anomalies")]),
            harness.metrics("windower").late,
        )
    honest, honest_late = results["honest"]
    naive, naive_late = results["naive"]
    assert [d for d in honest if d.kind == "dip"] == []
    assert naive_late > 100
    naive_dips = {d.query for d in naive if d.kind == "dip" and overlaps(burst.start, burst.end, d.start, d.end, 5000)}
    assert naive_dips and naive_dips <= set(burst.queries)
