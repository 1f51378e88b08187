"""Done-criterion 1 of the foundation: the paper's Windower -> DipDetector pipeline on local Spark,
over out-of-order and delayed data, equals a ground truth computed in plain Python."""

import json
import os

from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.model.records import END_OF_TIME
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
    lines = [json.loads(line) for name in os.listdir(sink) for line in open(sink / name)]
    assert sorted((d["key"], d["value"]["bucket"], d["value"]["count"]) for d in lines) == truth["dips"]


def test_low_watermarks_are_monotonic_and_held_by_upstream(spark, tmp_path):
    spec = TrafficSpec(events=6_000, keys=5, seed=3)
    runner = SparkRunner(build_pipeline(spec), root=str(tmp_path / "root"), spark=spark, max_records_per_batch=1000)
    runner.run(timeout=240)
    windower = runner.watermark_history("windower")
    detector = runner.watermark_history("dip_detector")
    assert len(windower) > 5 and len(detector) > 3
    for history in (windower, detector):
        marks = [h["low_watermark"] for h in history]
        assert marks == sorted(marks), "a low watermark went backwards"
        assert all(h["low_watermark"] <= h["input_watermark"] for h in history)
    # the detector's input watermark never runs ahead of what the windower had published
    published = [h["low_watermark"] for h in windower]
    assert max(h["input_watermark"] for h in detector) <= max(published)
    assert all(h["input_watermark"] in published or h["input_watermark"] < published[0] for h in detector)
