"""Done-criterion 1 of the foundation: the paper's Windower -> DipDetector pipeline on local Spark,
over out-of-order and delayed data, equals a ground truth computed in plain Python."""

import json
import os

from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.model.records import END_OF_TIME
from millstream.spark import runner as runner_module
from millstream.spark.runner import SparkRunner


def as_rows(records):
    return sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)


def test_windower_dip_detector_matches_ground_truth(spark, tmp_path):
    spec = TrafficSpec(events=12_000, keys=8, seed=11)
    sink = tmp_path / "dips-sink"
    runner = SparkRunner(build_pipeline(spec, sink_dir=str(sink)), root=str(tmp_path / "root"), spark=spark,
                         max_records_per_batch=3000)
    progress = runner.run(timeout=240)

    truth = expected_output(spec)
    assert len(truth["dips"]) > 5, "the generated traffic must contain dips for this test to mean anything"
    windows = runner.read_stream("windows")
    dips = runner.read_stream("dips")
    assert as_rows(windows) == truth["windows"]
    assert as_rows(dips) == truth["dips"]
    # exactly once: no id twice
    assert len({r.id for r in windows}) == len(windows)
    # delayed records were delivered on time (the injector's watermark is honest), none dropped
    assert progress.computations["windower"].records == spec.events
    assert progress.computations["windower"].late == 0
    assert all(c.low_watermark == END_OF_TIME for c in progress.computations.values())
    # the JSON-lines sink holds the same dips
    lines = [json.loads(line) for path in sink.glob("*.jsonl") for line in open(path)]
    assert sorted((d["key"], d["value"]["bucket"], d["value"]["count"]) for d in lines) == truth["dips"]


def test_low_watermarks_are_monotonic_and_held_by_upstream(spark, tmp_path, monkeypatch):
    # The detector reads one windower publication per batch, so it sees the windower's watermarks one
    # by one however the two queries' batches interleave (by default it takes up to 64 at once).
    plans, source_plan = [], runner_module.SourcePlan

    def one_publication_per_batch(*args, **kwargs):
        plans.append(source_plan(*args, **kwargs, max_log_entries=1))
        return plans[-1]

    monkeypatch.setattr(runner_module, "SourcePlan", one_publication_per_batch)
    spec = TrafficSpec(events=6_000, keys=5, seed=3)
    runner = SparkRunner(build_pipeline(spec), root=str(tmp_path / "root"), spark=spark, max_records_per_batch=1000)
    runner.run(timeout=240)
    assert {plan.computation.name for plan in plans} == {"windower", "dip_detector"}, \
        "the runner no longer builds its sources' plans through SourcePlan: patch it anew"
    windower = runner.watermark_history("windower")
    detector = runner.watermark_history("dip_detector")
    assert len(windower) > 5 and len(detector) > 5
    for history in (windower, detector):
        marks = [h["low_watermark"] for h in history]
        assert marks == sorted(marks), "a low watermark went backwards"
        assert all(h["low_watermark"] <= h["input_watermark"] for h in history)
    # the detector's input watermark never runs ahead of what the windower had published
    published = [h["low_watermark"] for h in windower]
    assert max(h["input_watermark"] for h in detector) <= max(published)
    assert all(h["input_watermark"] in published or h["input_watermark"] < published[0] for h in detector)


def test_weak_productions_fuse_windower_into_detector_with_the_same_result(spark, tmp_path):
    spec = TrafficSpec(events=8_000, keys=6, seed=19)
    runner = SparkRunner(build_pipeline(spec, windower_production="weak"), root=str(tmp_path / "root"),
                         spark=spark, max_records_per_batch=2000)
    progress = runner.run(timeout=240)
    truth = expected_output(spec)
    assert len(truth["dips"]) > 3
    assert as_rows(runner.read_stream("dips")) == truth["dips"]
    # one query for both; no durable hop: the windows stream was never logged
    assert not (tmp_path / "root" / "streams" / "windows").exists()
    assert not (tmp_path / "root" / "checkpoints" / "windower").exists()
    windower, detector = progress.computations["windower"], progress.computations["dip_detector"]
    assert windower.records == spec.events and windower.productions == len(truth["windows"])
    assert detector.records == len(truth["windows"]) and detector.late == 0
    assert windower.low_watermark == detector.low_watermark == END_OF_TIME
    history = runner.watermark_history("dip_detector")
    assert [h["low_watermark"] for h in history] == sorted(h["low_watermark"] for h in history)
