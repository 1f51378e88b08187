"""Done-criterion 2 of the foundation: SIGKILL the Spark driver mid-run, restart from the checkpoint,
and the output equals the ground truth: nothing lost, nothing duplicated."""

import json
import os
import signal
import subprocess
import sys
import time

from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.model.records import END_OF_TIME
from millstream.spark.runner import SparkRunner

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS, KEYS = 16_000, 8


def start_driver(root):
    command = [sys.executable, "-m", "millstream.apps.dips", "--root", str(root), "--events", str(EVENTS),
               "--keys", str(KEYS), "--rate", "1500", "--batch-records", "1000", "--master", "local[2]",
               "--timeout", "300"]
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}
    return subprocess.Popen(command, cwd=ROOT_DIR, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def status(root, computation):
    try:
        with open(os.path.join(root, "status", computation, "latest.json")) as data:
            return json.load(data)
    except (FileNotFoundError, ValueError):
        return {"batch": -1, "low_watermark": -1}


def committed_batches(root, computation):
    return status(root, computation)["batch"] + 1


def test_sigkill_of_driver_then_restart_loses_and_duplicates_nothing(spark, tmp_path):
    root = tmp_path / "root"
    driver = start_driver(root)
    deadline = time.time() + 180
    while committed_batches(root, "dip_detector") < 3:
        assert driver.poll() is None, f"driver ended early:\n{driver.stdout.read()}"
        assert time.time() < deadline, "driver made no progress"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver JVM and its Python workers, mid-batch
    driver.wait()
    killed_at = committed_batches(root, "windower")
    assert status(root, "dip_detector")["low_watermark"] < END_OF_TIME, "killed too late: the run was done"

    restarted = start_driver(root)
    output, _ = restarted.communicate(timeout=400)
    assert restarted.returncode == 0, output[-6000:]
    assert committed_batches(root, "windower") >= killed_at
    assert status(root, "dip_detector")["low_watermark"] == END_OF_TIME, "the restart did not finish the run"

    truth = expected_output(TrafficSpec(events=EVENTS, keys=KEYS))
    reader = SparkRunner(build_pipeline(TrafficSpec(events=EVENTS, keys=KEYS)), root=str(root), spark=spark)
    windows = reader.read_stream("windows")
    dips = reader.read_stream("dips")
    assert sorted((r.key, r.value["bucket"], r.value["count"]) for r in windows) == truth["windows"]
    assert sorted((r.key, r.value["bucket"], r.value["count"]) for r in dips) == truth["dips"]
    assert len({r.id for r in windows}) == len(windows)
    assert len({r.id for r in dips}) == len(dips)
