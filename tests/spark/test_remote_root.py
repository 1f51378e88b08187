"""A remote root: stream logs, status, the layout file and sinks on an S3 endpoint (Spark's
checkpoints on local disk: this machine's Spark has no S3 connector), with the same result as a local
run."""

import os

from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner
from millstream.spark.storage import Storage


def test_pipeline_with_its_root_on_s3_matches_ground_truth(spark, tmp_path, s3_server):
    spec = TrafficSpec(events=6_000, keys=6, seed=5)
    root, sink = s3_server.location("run"), s3_server.location("dips-sink")
    checkpoints = tmp_path / "checkpoints"
    runner = SparkRunner(build_pipeline(spec, sink_dir=sink), root=root, checkpoint_root=str(checkpoints),
                         spark=spark, max_records_per_batch=1500)
    progress = runner.run(timeout=240)

    truth = expected_output(spec)
    rows = lambda records: sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)  # noqa: E731
    assert rows(runner.read_stream("windows")) == truth["windows"]
    assert rows(runner.read_stream("dips")) == truth["dips"] and truth["dips"]
    assert all(c.low_watermark == END_OF_TIME for c in progress.computations.values())
    remote = Storage(root)
    assert remote.exists("pipeline.json") and remote.list("log") == remote.list("streams") == ["dip_detector", "windower"]
    assert remote.read_json("status/windower/latest.json")["low_watermark"] == END_OF_TIME
    assert Storage(sink).list(""), "the sink wrote no file"
    assert sorted(os.listdir(checkpoints)) == ["dip_detector", "windower"]  # only Spark's state is local
