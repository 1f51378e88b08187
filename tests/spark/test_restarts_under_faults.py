"""A root restarted or rescaled after faults: a rescale killed part-way is finished by running it
again, a rescale never shares its root with a running driver nor touches another root's checkpoints,
and a driver killed right after publishing leaves no stale status. Ground truth:
weak_count_driver.expected_counts, plain Python."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import weak_count_driver  # noqa: E402

EVENTS = 2_000


def _env(kill_at=None):
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("MILLSTREAM_KILL_AT", None)
    if kill_at:
        env["MILLSTREAM_KILL_AT"] = kill_at
    return env


def _drive(root, events=EVENTS, kill_at=None, parallelism=None, rate=200.0):
    command = [sys.executable, os.path.join(HERE, "weak_count_driver.py"), "--root", str(root), "--events", str(events),
               "--rate", str(rate)]
    if parallelism:
        command += ["--parallelism", str(parallelism)]
    return subprocess.run(command, cwd=REPO, env=_env(kill_at), capture_output=True, text=True, timeout=600,
                          start_new_session=True)


def _kill_rescale_once_spark_planned_it(root, checkpoint, parallelism):
    """`millstream rescale` in a process of its own, killed once Spark logged the repartition batch's
    offsets (it writes them first, then the state, then the commit, seconds apart)."""
    committed = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    target = os.path.join(checkpoint, "offsets", str(committed + 1))
    started = time.time()
    process = subprocess.Popen([sys.executable, "-m", "millstream", "rescale", str(root), "--parallelism",
                                str(parallelism), "--master", "local[1]"], cwd=REPO, env=_env(),
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None:
        if os.path.exists(target) and os.stat(target).st_mtime >= started:
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait()
    assert process.returncode == -9, "the rescale ended before it could be killed"
    assert not os.path.exists(os.path.join(checkpoint, "commits", str(committed + 1)))


def test_a_rescale_killed_part_way_is_finished_by_running_it_again(spark, tmp_path):
    """Killed after Spark logged its repartition batch, a rescale left a root no command repaired:
    running it again read the unfinished batch's partition count, said "1 -> 1" and did nothing, and
    every start failed on Spark's unfinished repartition. Running it again now finishes it."""
    from millstream.spark.rescale import checkpoint_of, rescale
    from millstream.spark.runner import SparkRunner

    root = tmp_path / "root"
    stopped = _drive(root, kill_at="published@count:3", parallelism=2)
    assert stopped.returncode == -9, stopped.stdout + stopped.stderr[-3000:]
    checkpoint = checkpoint_of(str(root), "count")
    _kill_rescale_once_spark_planned_it(root, checkpoint, 1)
    refused = _drive(root)
    assert refused.returncode != 0 and f"--computation count --parallelism 1" in refused.stderr, refused.stderr[-2000:]

    again = rescale(spark, str(root), 1)
    assert again == {"count": (2, 1)}
    resumed = _drive(root)
    assert resumed.returncode == 0, f"rescale again said {again}; the resumed run failed:\n{resumed.stderr[-1500:]}"
    reader = SparkRunner(weak_count_driver.pipeline(EVENTS, 200.0), root=str(root), spark=spark, retain_logs_s=None)
    got = sorted((r.key, r.value[0], r.value[1]) for r in reader.read_stream("counts"))
    assert got == weak_count_driver.expected_counts(EVENTS)
    # The weak computation's counters go on across the rescale's batch (they restarted from 0).
    assert {n: c.records for n, c in reader.progress().computations.items()} == {"echo": EVENTS, "count": EVENTS}


@pytest.fixture(scope="module")
def stopped_root(tmp_path_factory):
    """A stopped root whose strong computation keeps its state in 2 partitions."""
    root = tmp_path_factory.mktemp("in-use") / "root"
    done = _drive(root, events=300, parallelism=2, rate=300.0)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(root)


def test_the_rescale_command_refuses_a_root_in_use_in_one_line_before_starting_spark(stopped_root):
    """It ended in a Python traceback (RootInUse), exit code 1, after starting a Spark session."""
    from millstream.spark.fencing import LEASE_FILE, Holder

    lease = os.path.join(stopped_root, LEASE_FILE)
    with open(lease) as data:
        released = data.read()
    with open(lease, "w") as data:  # what a running driver's heartbeat keeps there: a live process (this one)
        json.dump(asdict(Holder.me(99)), data)
    spark_log = os.path.join(stopped_root, "spark.log")  # where the command's session would log

    def log_state():
        return os.stat(spark_log).st_mtime_ns if os.path.exists(spark_log) else None

    before = log_state()
    try:
        done = subprocess.run([sys.executable, "-m", "millstream", "rescale", stopped_root, "--parallelism", "1",
                               "--master", "local[1]"], cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=300)
    finally:
        with open(lease, "w") as data:
            data.write(released)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(errors) == 1 and "in use" in errors[0], (
        f"exit code {done.returncode}, stderr:\n" + "\n".join(errors[-12:]))
    assert log_state() == before, "a Spark session was started"


def test_a_driver_starting_while_a_rescale_runs_is_refused(stopped_root):
    """rescale() checked the lease once and never held it: a driver started while Spark repartitioned
    the checkpoint claimed the root, and both worked on one checkpoint."""
    from millstream.spark.fencing import RootInUse
    from millstream.spark.rescale import rescale
    from millstream.spark.runner import SparkRunner

    outcome = {}

    class Manager:
        """Spark's checkpoint manager, standing in: while it repartitions, a driver tries to start."""

        def repartition(self, checkpoint, partitions):
            driver = SparkRunner(weak_count_driver.pipeline(300, 300.0), root=stopped_root, retain_logs_s=None)
            try:
                driver.claim()
                outcome["claimed"] = f"epoch {driver.epoch}"
                driver.lease.release()
            except RootInUse as refused:
                outcome["refused"] = str(refused)

    class Session:
        _streamingCheckpointManager = Manager()

    rescale(Session(), stopped_root, 1)
    assert "refused" in outcome, f"a driver claimed the root ({outcome.get('claimed')}) during the repartition"
    driver = SparkRunner(weak_count_driver.pipeline(300, 300.0), root=stopped_root, retain_logs_s=None)
    driver.claim()  # the rescale over, the root is free at once
    driver.lease.release()


def test_a_rescale_of_a_copied_root_is_refused_and_leaves_the_original_alone(stopped_root, tmp_path):
    """A root's logs name its checkpoints by path: a rescale of a copy repartitioned the original's
    checkpoint (and deleted its uncommitted offsets). The runner refuses to run a copy; so does rescale."""
    import shutil

    from millstream.spark.rescale import RescaleError, rescale

    copy = str(tmp_path / "copy")
    shutil.copytree(stopped_root, copy)
    touched = []

    class Session:
        class _streamingCheckpointManager:  # noqa: N801 - Spark's attribute name
            @staticmethod
            def repartition(checkpoint, partitions):
                touched.append(checkpoint)

    with pytest.raises(RescaleError, match="was made at"):
        rescale(Session(), copy, 1)
    assert touched == []


def test_a_driver_killed_right_after_publishing_leaves_no_stale_status(spark, tmp_path):
    """Killed between appending a batch to its log and writing its status files, a driver left the
    status a batch behind the log for good (the batch is not published again): the runner's "done"
    and the skew limit read it, and a restart after the last batch, or behind a skew limit, waited
    for ever (found by an independent review). A restart's claim writes them from the log."""
    import json

    from millstream.spark.publog import PublicationLog
    from millstream.spark.runner import SparkRunner

    root = tmp_path / "root"
    killed = _drive(root, kill_at="published@count:2")
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]

    def statuses():
        found = {}
        for name in ("count", "echo"):
            with open(os.path.join(root, "status", name, "latest.json")) as data:
                found[name] = json.load(data)["batch"]
        return found

    _, entry = PublicationLog(str(root), "count").last_batch()
    assert statuses() == {"count": entry["batch"] - 1, "echo": entry["batch"] - 1}  # the moment the kill hit
    runner = SparkRunner(weak_count_driver.pipeline(EVENTS, 200.0), root=str(root), spark=spark, retain_logs_s=None)
    runner.claim()
    runner.lease.release()
    assert statuses() == {"count": entry["batch"], "echo": entry["batch"]}
    assert os.path.exists(os.path.join(root, "status", "count", "history", f"{entry['batch']:012d}.json"))
