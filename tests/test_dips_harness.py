"""The paper's Windower -> DipDetector on the in-process harness, against plain-Python ground truth."""

from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.model.records import END_OF_TIME
from millstream.testing import PipelineHarness


def rows(records):
    return sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)


def test_windows_and_dips_equal_ground_truth_with_delayed_records():
    spec = TrafficSpec(events=8_000, keys=6, delayed_fraction=0.05, seed=21)
    harness = PipelineHarness(build_pipeline(spec))
    harness.run_injectors(max_records_per_step=700)
    truth = expected_output(spec)
    assert len(truth["dips"]) > 3
    assert rows(harness.output("windows")) == truth["windows"]
    assert rows(harness.output("dips")) == truth["dips"]
    assert harness.metrics("windower").late == 0  # delayed, but the injector's watermark waited for them
    assert harness.low_watermark("dip_detector") == END_OF_TIME


def test_a_dishonest_watermark_turns_delays_into_late_records():
    """The same traffic with a watermark that ignores delays: records arrive late and are counted."""
    spec = TrafficSpec(events=4_000, keys=4, delayed_fraction=0.05, seed=5)
    pipeline = build_pipeline(spec)
    pipeline.injectors["traffic"].injector.watermark_at = spec.base_time  # promises too much
    harness = PipelineHarness(pipeline)
    harness.run_injectors(max_records_per_step=200)
    late = harness.metrics("windower").late
    assert late > 0
    # Late records are dropped from the windows (theirs may be out already) and counted: none is lost
    # silently, and no bucket is produced twice.
    windows = harness.output("windows")
    assert sum(r.value["count"] for r in windows) + late == spec.events
    assert len({(r.key, r.value["bucket"]) for r in windows}) == len(windows)
