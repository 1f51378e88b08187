"""SparkRunner refuses bad options in one clear error, before anything is written or Spark starts."""

from __future__ import annotations

import os
import re

import pytest

from millstream import Computation, Pipeline, ScriptedInjector
from millstream.spark.pacing import BatchPacing
from millstream.spark.runner import SparkRunner


class Nothing(Computation):
    def process_record(self, ctx, record):
        pass


def pipeline() -> Pipeline:
    p = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
    return p.add_computation("c", Nothing(), ["in"], ["out"])


@pytest.mark.parametrize("options, message", [
    ({"root": ""}, "root is empty"),
    ({"root": "   "}, "root is empty"),
    ({"root": None}, "root must be a path"),
    ({"root": 5}, "root must be a path"),
    ({"root": "foo://bucket/x"}, "unknown scheme 'foo'"),
    ({"key_groups": 2.5}, "key_groups must be a whole number >= 1 (or None for the root's own), got 2.5"),
    ({"key_groups": "8"}, "key_groups must be a whole number >= 1 (or None for the root's own), got '8'"),
    ({"key_groups": 0}, "key_groups must be a whole number >= 1 (or None for the root's own), got 0"),
    ({"key_groups": True}, "key_groups must be a whole number >= 1 (or None for the root's own), got True"),
    ({"parallelism": "2"}, "parallelism must be a whole number >= 1 (or None"),
    ({"trigger_ms": -5}, "trigger_ms must be a whole number of milliseconds >= 0, got -5"),
    ({"trigger_ms": 0.5}, "trigger_ms must be a whole number of milliseconds >= 0, got 0.5"),
    ({"max_records_per_batch": 10.0}, "max_records_per_batch must be a whole number >= 1"),
    ({"retain_logs_s": "1h"}, "retain_logs_s must be a number of seconds >= 0"),
])
def test_bad_options_are_refused_before_anything_is_written(options, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = {"root": str(tmp_path / "root"), **options}
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        SparkRunner(pipeline(), **options)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fields, message", [
    ({"target_ms": "3s"}, "target_ms must be a whole number >= 1, got '3s'"),
    ({"first": 1.5}, "first must be a whole number >= 1, got 1.5"),
])
def test_batch_pacing_refuses_what_is_no_whole_number(fields, message):
    with pytest.raises(TypeError, match=message):
        BatchPacing(**fields)


def test_the_harness_refuses_key_groups_that_are_no_whole_number():
    from millstream.testing import PipelineHarness

    for bad, error in ((0, ValueError), (2.5, TypeError)):
        with pytest.raises(error, match=f"key_groups must be a whole number >= 1, got {bad}"):
            PipelineHarness(pipeline(), key_groups=bad)


def test_a_file_sink_directory_that_cannot_be_written_is_refused_before_spark_starts(tmp_path, monkeypatch):
    """Found at the first delivery before, after a batch had run (exit 1, the sink's OSError)."""
    from millstream.model.pipeline import PipelineError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a directory")
    for path, problem in ((tmp_path / "a_file", "is a file, not a directory"),
                          (tmp_path / "a_file" / "out", f"is under {tmp_path / 'a_file'}, which is a file"),
                          ("/proc/millstream_out", "cannot create a directory in /proc")):
        for sink_format in ("jsonl", "csv"):  # millstream's own file format, and Spark's (a 70-line trace before)
            sunk = pipeline().add_sink("out", "out", str(path), format=sink_format)
            with pytest.raises(PipelineError, match=rf"sink 'out': {path}: {problem}".replace("(", r"\(")):
                SparkRunner(sunk, root=str(tmp_path / "root"))
    assert sorted(os.listdir(tmp_path)) == ["a_file"]
    # A file: URL is probed where it points, not under the working directory.
    monkeypatch.chdir("/proc")
    SparkRunner(pipeline().add_sink("out", "out", f"file://{tmp_path}/sunk"), root=str(tmp_path / "root"))
    with pytest.raises(PipelineError, match=r"sink 'out': /proc/sunk: cannot create a directory in /proc"):
        SparkRunner(pipeline().add_sink("out", "out", "file:///proc/sunk"), root=str(tmp_path / "root2"))
    monkeypatch.chdir(tmp_path)
    SparkRunner(pipeline().add_sink("out", "out", str(tmp_path / "new" / "out")), root=str(tmp_path / "root"))
    assert not (tmp_path / "new").exists()  # checked, not made
