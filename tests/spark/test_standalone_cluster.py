"""The same pipeline on a Spark standalone cluster (a master and a worker started here, on 127.0.0.1)
with its root on an S3 endpoint: configuration only, same result as ground truth."""

import importlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import pyspark
import pytest

from millstream.spark.rescale import checkpoint_of, state_partitions

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_CLASS = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")

# Run in a fresh process: this test process already holds the suite's local[2] session.
PIPELINE = """
import sys
from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.spark.runner import SparkRunner

master, root, checkpoints = sys.argv[1:4]
spec = TrafficSpec(events=4000, keys=5, seed=8)
runner = SparkRunner(build_pipeline(spec), root=root, checkpoint_root=checkpoints, master=master,
                     spark_conf={"spark.executor.memory": "1g", "spark.cores.max": "3"})
runner.run(timeout=240)
truth = expected_output(spec)
rows = lambda records: sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)
assert rows(runner.read_stream("windows")) == truth["windows"], "windows differ"
assert rows(runner.read_stream("dips")) == truth["dips"], "dips differ"
print("MASTER", runner.spark.sparkContext.master, "APP", runner.spark.sparkContext.applicationId)
print("STATE PARTITIONS", runner.spark.conf.get("spark.sql.shuffle.partitions"))
"""


# A pipeline started while the cluster has no executor yet: the test adds the worker once the
# driver's application is registered with the master.
EARLY_START = """
import sys
from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.spark.runner import SparkRunner

master, root = sys.argv[1:3]
spec = TrafficSpec(events=2000, keys=5, seed=3)
runner = SparkRunner(build_pipeline(spec), root=root, master=master, spark_conf={"spark.executor.memory": "1g"})
print("CORES AT SESSION START", runner.spark.sparkContext.defaultParallelism, flush=True)
runner.run(timeout=240)
rows = lambda records: sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)
assert rows(runner.read_stream("windows")) == expected_output(spec)["windows"], "windows differ"
print("STATE PARTITIONS", runner.spark.conf.get("spark.sql.shuffle.partitions"))
"""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_log(path, text, process, limit_s=60):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        assert process.poll() is None, open(path, errors="replace").read()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not in {path}:\n" + open(path, errors="replace").read()[-3000:])


def start_master(here, env):
    """A standalone master on 127.0.0.1: (the process, its URL, its log)."""
    port = free_port()
    master_log = here / "master.log"
    master = subprocess.Popen([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_port())],
                              env=env, stdout=open(master_log, "w"), stderr=subprocess.STDOUT)
    return master, f"spark://127.0.0.1:{port}", master_log


def start_worker(here, env, master_url, cores):
    worker_log = here / "worker.log"
    worker = subprocess.Popen([SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--cores", str(cores), "--memory", "2g", "--webui-port", str(free_port()),
                               master_url], env=env, stdout=open(worker_log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for_log(worker_log, "Successfully registered with master", worker)
    except BaseException:
        stop(worker)  # the caller never gets it to stop
        raise
    return worker


def stop(*processes):
    for process in processes:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def cluster_env(here):
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(here / "work"),
            "PYTHONPATH": ROOT_DIR}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Spark standalone master and one worker on 127.0.0.1: (master URL, master log, environment)."""
    here = tmp_path_factory.mktemp("cluster")
    env = cluster_env(here)
    master, master_url, master_log = start_master(here, env)
    worker = None
    try:
        wait_for_log(master_log, "I have been elected leader", master)
        worker = start_worker(here, env, master_url, 3)
        yield master_url, master_log, env
    finally:
        stop(worker, master)


def executors_launched(master_log):
    return open(master_log, errors="replace").read().count("Launching executor")


def test_pipeline_runs_unchanged_on_a_standalone_cluster_with_a_remote_root(tmp_path, s3_server, cluster):
    master_url, master_log, env = cluster
    before = executors_launched(master_log)
    root = s3_server.location("cluster-run")
    run = subprocess.run([sys.executable, "-c", PIPELINE, master_url, root, str(tmp_path / "checkpoints")],
                         cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"MASTER {master_url}" in run.stdout
    # Parallelism follows the cluster (the worker's 3 cores; Spark's own default before its
    # executors register is 2), not what the driver saw the moment its session started.
    assert "STATE PARTITIONS 3" in run.stdout, run.stdout[-2000:]
    # the work ran in an executor the master placed on the worker, not in the driver
    assert executors_launched(master_log) > before


def test_a_project_from_millstream_new_runs_with_millstream_run_locally_and_on_the_cluster(tmp_path, cluster):
    """The README's path for a user's own pipeline: `millstream new`, then `millstream run` on local
    Spark and on a standalone cluster; both give the harness's result."""
    master_url, master_log, env = cluster
    command = [sys.executable, "-m", "millstream"]
    made = subprocess.run([*command, "new", "clicks", "--directory", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "clicks"
    # Ground truth in plain Python: clicks per page and minute of the project's own sample input.
    sys.path.insert(0, str(project))
    try:
        sample = importlib.import_module("pipeline")
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("pipeline", None)
    truth = Counter()
    for click in map(sample.sample_click, range(6_000)):
        truth[(click.key, click.timestamp - click.timestamp % sample.MINUTE_MS)] += 1
    for name, where in (("harness", ["--runner", "harness"]),
                        ("local", ["--master", "local[2]", "--root", str(tmp_path / "local")]),
                        ("cluster", ["--master", master_url, "--root", str(tmp_path / "cluster")])):
        before = executors_launched(master_log)
        ran = subprocess.run([*command, "run", "pipeline:pipeline", *where], cwd=project, env=env,
                             capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert "6,000 records in this run" in ran.stdout, ran.stdout[-3000:]
        if name == "harness":
            assert f"clicks_per_minute: {len(truth)} records" in ran.stdout, ran.stdout[-3000:]
            continue
        output = project / "clicks-output"
        rows = [json.loads(line) for f in sorted(output.glob("*.jsonl")) for line in open(f)]
        assert Counter({(r["key"], r["value"]["start"]): r["value"]["value"] for r in rows}) == truth
        assert len(rows) == len(truth)
        output.rename(project / f"{name}-output")
        if name == "cluster":
            assert executors_launched(master_log) > before  # the cluster did the work
            # `millstream run` asks for no cores (no spark.cores.max): every computation still runs
            # on the worker's 3 state partitions, not on Spark's default of 2.
            root = str(tmp_path / "cluster")
            partitions = {c: state_partitions(checkpoint_of(root, c)) for c in sample.pipeline.computations}
            assert partitions and set(partitions.values()) == {3}, partitions


def test_a_new_root_waits_for_executors_that_register_after_its_session_started(tmp_path):
    """Spark reports 2 cores until a cluster's first executor registers; a new root must not freeze
    that into its checkpoints. Here the only worker joins after the driver's session is up."""
    env = cluster_env(tmp_path)
    master, master_url, master_log = start_master(tmp_path, env)
    worker = run = None
    try:
        wait_for_log(master_log, "I have been elected leader", master)
        run = subprocess.Popen([sys.executable, "-c", EARLY_START, master_url, str(tmp_path / "root")],
                               cwd=ROOT_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_log(master_log, "Registering app", master)
        time.sleep(3)  # the driver goes on without an executor meanwhile
        worker = start_worker(tmp_path, env, master_url, 3)
        stdout, stderr = run.communicate(timeout=400)
        assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
        assert "CORES AT SESSION START 2" in stdout, stdout  # the race this test is about took place
        assert "STATE PARTITIONS 3" in stdout, stdout
        assert {state_partitions(checkpoint_of(str(tmp_path / "root"), c)) for c in ("windower", "dip_detector")} == {3}
    finally:
        if run is not None and run.poll() is None:
            run.kill()
        stop(worker, master)
