"""The demos' and the millstream command's first hour, run as a user runs them (subprocesses):
bad options refused in one line before anything is touched, an unreachable Spark master found in
seconds, a failing Spark pointed at its logs, numbers on the progress display that agree with the
summary, the dips verdict against its ground truth. No test here starts Spark."""

from __future__ import annotations

import json
import os
import re
import socket
import warnings

import pytest

from clitools import Ran, assert_refused, call, run
from millstream.apps.dips import TrafficSpec, expected_output
from millstream.apps.zeitgeist.__main__ import main as zeitgeist_main
from millstream.apps.zeitgeist.generator import ZeitgeistConfig, generate
from millstream.console.options import UsageError, check_master, quiet_library_warnings
from millstream.console.progress import ProgressDisplay, Snapshot
from millstream.console.running import RunFailed, run_on_spark, snapshot_of_progress

ZEITGEIST = "millstream.apps.zeitgeist"
DIPS = "millstream.apps.dips"
SMALL = ["--queries", "12", "--minutes", "5", "--rate", "40", "--seed", "9"]  # 11,646 searches, 2 of them late


@pytest.fixture(scope="module")
def finished_zeitgeist(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Ran]:
    data_dir = str(tmp_path_factory.mktemp("zeitgeist") / "data")
    ran = run(ZEITGEIST, "--runner", "harness", "--data-dir", data_dir, *SMALL)
    assert ran.code == 0, ran.output
    return data_dir, ran


# -- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, phrase", [
    (["--minutes", "0"], "--minutes: must be > 0"),
    (["--queries", "-5"], "--queries: must be > 0"),
    (["--day-seconds", "5"], "--day-seconds: must be >= 12"),
    (["--data-dir", "/proc/nope"], "--data-dir /proc/nope: cannot create"),
    (["--data-dir", "/sys/nope"], "--data-dir /sys/nope: cannot create"),  # unwritable, even for root
    (["--master", "locl[2]"], "not a Spark master"),
])
def test_zeitgeist_refuses_a_bad_value_in_one_line(tmp_path, args, phrase) -> None:
    # In process (the real command's refusals: test_fresh_with_a_bad_value_keeps_the_finished_run).
    ran = call(zeitgeist_main, "--data-dir", str(tmp_path / "d"), *args)
    assert_refused(ran, phrase)
    assert not (tmp_path / "d").exists() or args[0] == "--data-dir"


def test_a_directory_under_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    assert_refused(run(DIPS, "--root", str(tmp_path / "file" / "root")), "which is a file")


def test_fresh_with_a_bad_value_keeps_the_finished_run(finished_zeitgeist) -> None:
    data_dir, _ = finished_zeitgeist
    before = sorted(os.listdir(data_dir))
    assert "evaluation.json" in before and "report.html" in before
    assert_refused(run(ZEITGEIST, "--fresh", "--minutes", "0", "--data-dir", data_dir), "--minutes")
    assert_refused(run(ZEITGEIST, "--fresh", "--master", "spark://127.0.0.1:1", "--data-dir", data_dir),
                   "cannot reach Spark master")
    assert sorted(os.listdir(data_dir)) == before


def test_an_unreachable_master_is_found_in_seconds_before_spark_starts(tmp_path) -> None:
    for module, option in ((ZEITGEIST, "--data-dir"), (DIPS, "--root")):
        ran = run(module, option, str(tmp_path / module), "--master", "spark://127.0.0.1:1")
        line = assert_refused(ran, "cannot reach Spark master spark://127.0.0.1:1", within_s=8.0)
        assert "refused" in line.lower()
        assert not (tmp_path / module).exists()


def test_a_listening_master_passes_the_probe() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        check_master(f"spark://127.0.0.1:{port}")
        check_master(f"spark://127.0.0.1:1,127.0.0.1:{port}")  # high availability: one master answering is enough
    with pytest.raises(UsageError, match=f"cannot reach Spark master spark://127.0.0.1:{port}"):
        check_master(f"spark://127.0.0.1:{port}")  # closed now


def test_resuming_with_other_generator_options_is_refused(finished_zeitgeist) -> None:
    data_dir, _ = finished_zeitgeist
    assert_refused(run(ZEITGEIST, "--runner", "harness", "--data-dir", data_dir, "--queries", "13"),
                   "holds a run made with --queries 12", "asks for --queries 13")


# -- when Spark fails -------------------------------------------------------------------------------
class FakeProgress:
    """The shape of SparkRunner's PipelineProgress."""

    def __init__(self, records: int, done: bool = False) -> None:
        self.computations = {"count": _Computation(records, done)}
        self.injectors: dict[str, object] = {}
        self.done = done


class _Computation:
    def __init__(self, records: int, done: bool) -> None:
        self.records = records
        self.late = 3
        self.low_watermark = 2**47 - 1 if done else 5_000


class FakeRunner:
    """The SparkRunner API the commands use, with a run that failed or a resumed run's counts."""

    def __init__(self, root: str, before: int, after: int, error: BaseException | None = None) -> None:
        self.root, self.log_dir = root, root
        self.before, self.after, self.error = before, after, error

    def progress(self) -> FakeProgress:
        return FakeProgress(self.before)

    def run(self, on_progress, progress_interval=1.0, timeout=None) -> FakeProgress:
        on_progress(FakeProgress((self.before + self.after) // 2))
        if self.error is not None:
            raise self.error
        return FakeProgress(self.after, done=True)


def _snapshot(progress, at_start: int) -> Snapshot:
    return snapshot_of_progress(progress, records=progress.computations["count"].records, records_at_start=at_start)


def _records(progress) -> int:
    return progress.computations["count"].records


@pytest.fixture
def quiet_display():
    import io

    return ProgressDisplay(stream=io.StringIO(), live=False)


def test_a_spark_failure_is_one_line_naming_both_logs(tmp_path, quiet_display) -> None:
    error = RuntimeError("An error occurred while calling o42.start.\n: java.net.ConnectException: Connection "
                         "refused\n\tat java.base/sun.nio.ch.Net.connect0(Native Method)")
    with pytest.raises(RunFailed) as failed:
        run_on_spark(FakeRunner(str(tmp_path), 0, 10, error), quiet_display, _snapshot, _records)
    message = str(failed.value)
    assert "\n" not in message and "o42.start" in message
    assert str(tmp_path / "spark.log") in message and str(tmp_path / "errors.log") in message
    assert "ConnectException" in (tmp_path / "errors.log").read_text()  # the details are where it says


def test_a_pipeline_failure_keeps_the_runners_message(tmp_path, quiet_display) -> None:
    class MillstreamRunError(RuntimeError):
        pass

    # As the SparkRunner words it: what failed, the user's traceback, where the full trace is.
    error = MillstreamRunError("computation 'count' failed on stream 'clicks', key 'u1': KeyError: 'user'\n"
                               "Traceback (most recent call last):\n  File \"job.py\", line 9\n"
                               "(full trace in /x/errors.log)")
    with pytest.raises(RunFailed) as failed:
        run_on_spark(FakeRunner(str(tmp_path), 0, 10, error), quiet_display, _snapshot, _records)
    assert str(failed.value) == ("computation 'count' failed on stream 'clicks', key 'u1': KeyError: 'user' "
                                 "(full trace in /x/errors.log); the checkpoint is intact: fix it and run the same "
                                 "command again to resume")


@pytest.mark.parametrize("refusal", ["root_in_use", "unfinished_rescale"])
def test_a_refusal_to_start_is_told_as_it_is_not_as_a_spark_failure(tmp_path, quiet_display, refusal) -> None:
    # A root another driver holds, or one an interrupted rescale left, was reported as
    # "Spark failed: ..." with pointers to logs that say nothing more.
    from millstream.spark.fencing import RootInUse
    from millstream.spark.rescale import UnfinishedRescale

    error = (RootInUse("root /r is in use by another driver (process 7); stop it first") if refusal == "root_in_use"
             else UnfinishedRescale("computation 'count': a rescale to 1 state partitions was interrupted; finish it "
                                    "before starting: millstream rescale /r --computation count --parallelism 1"))
    with pytest.raises(RunFailed) as failed:
        run_on_spark(FakeRunner(str(tmp_path), 0, 10, error), quiet_display, _snapshot, _records)
    assert str(failed.value) == str(error)


def test_a_pipeline_the_runner_refuses_as_it_starts_is_a_refusal_not_a_spark_failure(tmp_path, quiet_display) -> None:
    # A computation that cannot be pickled, found before Spark starts, was "Spark failed: ..." with exit 1.
    from millstream.model.pipeline import PipelineError

    error = PipelineError("computation 'c' cannot be sent to Spark's workers: attribute 'lock' holds a "
                          "_thread.lock, which cannot be pickled; create it in setup()")
    with pytest.raises(UsageError) as refused:
        run_on_spark(FakeRunner(str(tmp_path), 0, 10, error), quiet_display, _snapshot, _records)
    assert str(refused.value) == str(error)
    assert not (tmp_path / "errors.log").exists()  # no trace to read: the line says it all


def test_rate_after_a_resume_counts_only_this_runs_records(tmp_path, quiet_display) -> None:
    final = run_on_spark(FakeRunner(str(tmp_path), before=100_000, after=130_000), quiet_display, _snapshot, _records)
    assert final.records == 130_000 and final.records_this_run == 30_000


# -- the demos' numbers -----------------------------------------------------------------------------
def _plain_progress_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if re.match(r"^\[\d+s\] ", line)]


def test_zeitgeist_header_progress_and_summary_agree(finished_zeitgeist) -> None:
    data_dir, ran = finished_zeitgeist
    assert "Traceback" not in ran.output and "FutureWarning" not in ran.output
    config = ZeitgeistConfig(queries=12, minutes=5, rate=40, seed=9)
    log = generate(config)
    # The header counts the searches generated, exactly (not rate x duration).
    assert f", {len(log):,} searches," in ran.stdout.splitlines()[0]
    assert len(log) != int(config.rate * config.seconds)
    last = _plain_progress_lines(ran.stdout)[-1]
    assert f"searches {len(log):,}/{len(log):,} (100%)" in last
    # Late searches: per computation on the display, the same numbers in the summary and evaluation.json.
    shown = {name: int(n.replace(",", "")) for name, n in re.findall(r"(\w+) done in [\d,]+ late ([\d,]+)", last)}
    summary = re.search(r"late searches dropped: windower ([\d,]+), spike_detector ([\d,]+)", ran.stdout)
    assert summary, ran.stdout
    assert (shown["windower"], shown["spike_detector"]) == (int(summary.group(1)), int(summary.group(2)))
    with open(os.path.join(data_dir, "evaluation.json")) as evaluation:
        stored = json.load(evaluation)
    assert stored["late"] == shown and stored["searches"] == len(log)
    # Late searches are the generator's deliberately late ones: never more than it made.
    assert 0 < shown["windower"] <= int(log.late.sum())
    assert f"{len(log):,} searches in this run" in ran.stdout
    # Anomalies on the last progress line are the episodes the evaluation counted.
    spikes, dips = re.search(r"spikes (\d+) \| dips (\d+)", last).groups()
    detected = stored["detections"]
    assert int(spikes) + int(dips) == len({(d["query"], d["kind"], d["start"]) for d in detected})


def test_dips_demo_ends_with_its_verdict_against_ground_truth(tmp_path) -> None:
    ran = run(DIPS, "--runner", "harness", "--root", str(tmp_path / "dips"))
    assert ran.code == 0, ran.output
    truth = expected_output(TrafficSpec())
    assert ran.stdout.strip().splitlines()[-1] == \
        f"{len(truth['windows']):,} windows, {len(truth['dips']):,} dips: matches ground truth"
    assert "-140737488355328" not in ran.output and "Traceback" not in ran.output
    assert "Warning" not in ran.output
    # Progress from the start: the first display line comes before any work is reported.
    assert _plain_progress_lines(ran.stdout)[0].startswith("[0s] starting")
    # A second run with other traffic in the same root is refused, not mixed in.
    assert_refused(run(DIPS, "--runner", "harness", "--root", str(tmp_path / "dips"), "--events", "100"),
                   "holds a run made with --events 20000")


def test_pyspark_pandas_warning_is_not_shown() -> None:
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    import pandas

    if int(pandas.__version__.split(".")[0]) < 3:
        pytest.skip("pyspark warns only with pandas >= 3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        require_minimum_pandas_version()
    assert any(issubclass(w.category, FutureWarning) for w in caught), "the warning this guards against"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_library_warnings()
        require_minimum_pandas_version()
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]


def test_a_spark_runner_in_a_users_script_hides_that_warning_alone(tmp_path) -> None:
    """A user's own script running SparkRunner (not the CLI) printed PySpark's pandas-3 warning: at
    transformWithState and at the commit's mapInArrow, some in Py4J's callback threads."""
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    import pandas

    from millstream import Pipeline, ScriptedInjector
    from millstream.spark.runner import SparkRunner

    if int(pandas.__version__.split(".")[0]) < 3:
        pytest.skip("pyspark warns only with pandas >= 3")
    pipeline = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SparkRunner(pipeline, root=str(tmp_path / "root"))
        require_minimum_pandas_version()
        warnings.warn("a user's own", FutureWarning)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == ["a user's own"]
