"""The README's shape of pipeline: JSON-lines log files -> Windower on Spark, with a file arriving
after the watermark passed (its records are delivered late, dropped and counted), ended by `_DONE`."""

import json
import os
import time

from millstream import Computation, FileInjector, Pipeline, Record
from millstream.apps.dips import Windower
from millstream.spark.runner import SparkRunner


def write_log(directory, name, records, created_ms):
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    os.utime(path + ".tmp", ns=(created_ms * 1_000_000, created_ms * 1_000_000))
    os.rename(path + ".tmp", path)


def test_file_logs_windowed_on_spark_with_a_late_file(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    expected = {}
    for n in range(6):  # file n holds seconds n*2 .. n*2+1 of event time, created at its first second
        start = 10_000 + n * 2_000
        records = [{"key": f"q{i % 3}", "value": {"i": i}, "timestamp": start + i * 40} for i in range(50)]
        for r in records:
            bucket = r["timestamp"] - r["timestamp"] % 1000
            expected[(r["key"], bucket)] = expected.get((r["key"], bucket), 0) + 1
        write_log(logs, f"part-{n:03d}.jsonl", records, created_ms=start)

    pipeline = (Pipeline("files")
                .add_injector("logs", FileInjector(str(logs), max_files_per_read=2), "searches")
                .add_computation("windower", Windower(), ["searches"], ["windows"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.start()
    deadline = time.time() + 180
    while runner.progress().computations["windower"].low_watermark < 20_000:
        runner.raise_if_failed()
        assert time.time() < deadline, runner.progress()
        time.sleep(0.5)
    # A straggler file whose records are behind the published watermark: delivered late, counted.
    late = [{"key": "q0", "value": {"late": True}, "timestamp": 11_500, "id": "straggler"}]
    write_log(logs, "part-900.jsonl", late, created_ms=int(time.time() * 1000))
    (logs / "_DONE").write_text("")
    progress = runner.run(timeout=180)

    windows = runner.read_stream("windows")
    counts = {}
    for w in windows:
        counts[(w.key, w.value["bucket"])] = counts.get((w.key, w.value["bucket"]), 0) + w.value["count"]
    # The late record is not lost silently: the Windower (millstream.windows, late="drop") leaves it out
    # of the window, which was produced already, and the framework counts it.
    assert counts == expected
    assert progress.computations["windower"].late == 1
    assert progress.computations["windower"].records == 6 * 50 + 1


class Echo(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, record.value["i"], record.timestamp), "out")


def test_files_added_after_the_input_finished_are_read_by_the_next_run(spark, tmp_path):
    """A root whose file input had finished (`_DONE`, END_OF_TIME published) was run again after more
    files arrived: the run found its watermarks at the end, finished at once and read nothing ("0
    records in this run", exit 0), so those files were never read. Now they are (late: the watermark
    published cannot go back). Ground truth: the lines written."""
    logs = tmp_path / "logs"
    logs.mkdir()
    written = []

    def add(name, first):
        records = [{"key": f"q{i % 3}", "value": {"i": i}, "timestamp": 10_000 + i} for i in range(first, first + 20)]
        write_log(logs, name, records, created_ms=10_000)
        written.extend(records)

    def run():
        pipeline = (Pipeline("daily").add_injector("logs", FileInjector(str(logs)), "in")
                    .add_computation("echo", Echo(), ["in"], ["out"]))
        runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
        return runner, runner.run(timeout=240)

    add("day-1.jsonl", 0)
    (logs / "_DONE").touch()
    run()
    add("day-2.jsonl", 20)
    runner, progress = run()
    assert sorted((r.key, r.value, r.timestamp) for r in runner.read_stream("out")) == sorted(
        (r["key"], r["value"]["i"], r["timestamp"]) for r in written)
    assert progress.computations["echo"].late == 20
