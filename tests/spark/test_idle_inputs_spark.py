"""Idle inputs on Spark: one injector goes quiet for longer than its idle timeout; the other's windows
fire anyway, complete and never early; when the quiet one comes back behind the watermark, its
records are flagged late; the run ends only once both injectors have finished."""

import json
import os
from collections import Counter

from bucket_counter import LateAwareCounter

from millstream import END_OF_TIME, FileInjector, GeneratorInjector, Pipeline, Record
from millstream.spark.runner import SparkRunner

EVENTS = 2_400


def write(directory, name, records):
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as out:
        out.write("".join(json.dumps({"key": k, "value": 1, "timestamp": t}) + "\n" for k, t in records))
    os.rename(path + ".tmp", path)


def test_a_quiet_injector_declared_idle_lets_the_other_one_through(spark, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    write(files, "log-100.jsonl", [("k0", 150), ("k1", 250)])
    steady = GeneratorInjector(lambda i: Record(f"k{i % 3}", i, 10 * i), EVENTS, lambda n: 10 * n,
                               records_per_second=150, max_records_per_read=300)
    pipeline = (Pipeline("idle")
                .add_injector("steady", steady, "in")
                .add_injector("files", FileInjector(str(files), creation="name"), "in", idle_after_ms=2_000)
                .add_computation("windows", LateAwareCounter(1000), ["in"], ["windows", "late"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark, trigger_ms=200)
    returned = []

    def on_progress(progress):
        # Once the steady input is over, the quiet one's watermark no longer holds anything back:
        # the windows computation reaches the end. Then the quiet input comes back, late.
        if progress.computations["windows"].low_watermark >= END_OF_TIME and not returned:
            write(files, "log-5000.jsonl", [("k2", 5_100), ("k2", 5_200)])
            open(files / "_DONE", "w").close()
            returned.append(True)

    progress = runner.run(on_progress=on_progress, progress_interval=0.5, timeout=400)
    assert returned, "the windows never got past the quiet input"
    windows = runner.read_stream("windows")
    expected = Counter((f"k{i % 3}", 10 * i - 10 * i % 1_000) for i in range(EVENTS))
    expected.update({("k0", 0): 1, ("k1", 0): 1})
    assert Counter({(w.key, w.value["bucket"]): w.value["n"] for w in windows}) == expected
    assert len(windows) == len(expected)  # each window once
    assert all(w.value["fired_at"] >= w.timestamp for w in windows), "a window fired early"
    assert sorted(r.value["late"] for r in runner.read_stream("late")) == [5_100, 5_200]
    assert progress.computations["windows"].late == 2
