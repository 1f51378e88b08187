"""Credentials never travel in locations: a root, checkpoint root or sink path with credentials in it
(user:password@, or a secret query option) is refused before anything is written, by a message that
does not repeat them; the CLI refuses it in one line. (On Spark, tests/spark/test_source_options.py:
no data source option carries the plan, the root or a secret.)"""

from __future__ import annotations

import os

import pytest

from clitools import assert_refused, call
from millstream import Pipeline, ScriptedInjector
from millstream.cli import main as millstream_main
from millstream.model.computation import Computation
from millstream.spark.runner import SparkRunner
from millstream.spark.storage import CredentialsInLocation, Storage, check_no_credentials, redact_location

KEY, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
WITH_CREDENTIALS = [
    f"s3://{KEY}:{SECRET}@bucket/root",
    f"s3://{KEY}@bucket/root",
    f"s3://bucket/root?region=eu-west-1&access_key={KEY}&secret_key={SECRET}",
    f"s3a://bucket/root?session_token={SECRET}",
    f"gs://bucket/root?X-Goog-Signature={SECRET}",
]


class PassThrough(Computation):
    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.produce(record, "out")


def pipeline(sink: str | None = None) -> Pipeline:
    p = (Pipeline("creds").add_injector("src", ScriptedInjector("s", []), "in")
         .add_computation("pass", PassThrough(), ["in"], ["out"]))
    if sink is not None:
        p.add_sink("out_files", "out", sink)
    return p


def _assert_no_secret(text: str) -> None:
    assert KEY not in text and SECRET not in text and "EXAMPLE" not in text, text


@pytest.mark.parametrize("location", WITH_CREDENTIALS)
def test_a_location_with_credentials_is_refused_without_repeating_them(location: str) -> None:
    with pytest.raises(CredentialsInLocation) as refused:
        check_no_credentials(location, "root")
    _assert_no_secret(str(refused.value))
    assert "carries credentials" in str(refused.value) and "environment" in str(refused.value)
    with pytest.raises(CredentialsInLocation):
        Storage(location)
    _assert_no_secret(redact_location(location))


def test_locations_without_credentials_pass() -> None:
    for location in ["/tmp/x", "file:///tmp/x", "relative/dir", "hdfs://namenode:8020/x",
                     "s3://bucket/root?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1"]:
        check_no_credentials(location)


@pytest.mark.parametrize("where", ["root", "checkpoint_root", "sink"])
def test_the_spark_runner_refuses_them_before_writing_anything(tmp_path, where: str) -> None:
    location = WITH_CREDENTIALS[0]
    root = location if where == "root" else str(tmp_path / "root")
    kwargs = {"checkpoint_root": location} if where == "checkpoint_root" else {}
    with pytest.raises(CredentialsInLocation) as refused:
        SparkRunner(pipeline(location if where == "sink" else None), root=root, **kwargs)
    _assert_no_secret(str(refused.value))
    assert not os.path.exists(tmp_path / "root"), "nothing is written before the refusal"


def test_millstream_run_refuses_them_in_one_line(tmp_path) -> None:
    (tmp_path / "job.py").write_text("from millstream import Pipeline, ScriptedInjector\n"
                                     "from millstream.windows import Count, TumblingWindows, WindowAggregate\n"
                                     "w = WindowAggregate(TumblingWindows(1000), Count(), 'counts')\n"
                                     "pipeline = Pipeline('job').add_injector('src', ScriptedInjector('s', []), 'in')"
                                     ".add_computation('w', w, ['in'], w.outputs)\n")
    line = assert_refused(call(millstream_main, "run", "job:pipeline", "--root", WITH_CREDENTIALS[0],
                               cwd=str(tmp_path)), "--root s3://bucket/root carries credentials")
    _assert_no_secret(line)
    assert os.listdir(tmp_path) == ["job.py"] or "s3:" not in os.listdir(tmp_path)
