"""The same pipeline on a Spark standalone cluster (a master and a worker started here, on 127.0.0.1)
with its root on an S3 endpoint: configuration only, same result as ground truth."""

import os
import socket
import subprocess
import sys
import time

import pyspark

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
                     spark_conf={"spark.executor.memory": "1g", "spark.cores.max": "2"})
runner.run(timeout=240)
truth = expected_output(spec)
rows = lambda records: sorted((r.key, r.value["bucket"], r.value["count"]) for r in records)
assert rows(runner.read_stream("windows")) == truth["windows"], "windows differ"
assert rows(runner.read_stream("dips")) == truth["dips"], "dips differ"
print("MASTER", runner.spark.sparkContext.master, "APP", runner.spark.sparkContext.applicationId)
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


def test_pipeline_runs_unchanged_on_a_standalone_cluster_with_a_remote_root(tmp_path, s3_server):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "work"),
           "PYTHONPATH": ROOT_DIR}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    master = subprocess.Popen([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_port())],
                              env=env, stdout=open(master_log, "w"), stderr=subprocess.STDOUT)
    worker = None
    try:
        wait_for_log(master_log, "I have been elected leader", master)
        worker = subprocess.Popen([SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                   "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()), master_url],
                                  env=env, stdout=open(worker_log, "w"), stderr=subprocess.STDOUT)
        wait_for_log(worker_log, "Successfully registered with master", worker)

        root = s3_server.location("cluster-run")
        run = subprocess.run([sys.executable, "-c", PIPELINE, master_url, root, str(tmp_path / "checkpoints")],
                             cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=400)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"MASTER {master_url}" in run.stdout
        # the work ran in an executor the master placed on the worker, not in the driver
        assert "Launching executor" in open(master_log, errors="replace").read()
        assert "Asked to launch executor" in open(worker_log, errors="replace").read()
    finally:
        for process in (worker, master):
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
