"""Issue 2's promise: interrupt the Zeitgeist demo (Ctrl-C reaches the whole process group, Spark's
JVM included) and run the same command again: it resumes from the checkpoint without double counting."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from millstream.model.records import END_OF_TIME

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command(data_dir, weak):
    return [sys.executable, "-m", "millstream.apps.zeitgeist", "--queries", "30", "--minutes", "6",
            "--data-dir", str(data_dir), "--master", "local[2]", "--timeout", "400",
            *(["--weak-windower"] if weak else [])]


def status(data_dir, computation):
    try:
        with open(os.path.join(data_dir, "run", "status", computation, "latest.json")) as data:
            return json.load(data)
    except (FileNotFoundError, ValueError):
        return {"batch": -1, "metrics": {"records": 0}}


@pytest.mark.parametrize("weak", [False, True], ids=["strong", "weak-windower"])
def test_ctrl_c_then_same_command_resumes_without_double_counting(tmp_path, weak):
    data_dir = tmp_path / "zeitgeist"
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}
    first = subprocess.Popen(command(data_dir, weak), cwd=ROOT_DIR, env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while status(data_dir, "model_calculator")["batch"] < 1:
        assert first.poll() is None, first.stdout.read()
        assert time.time() < deadline, "no progress before the interrupt"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)  # what Ctrl-C does in a terminal
    first.wait(timeout=120)
    assert status(data_dir, "dip_detector").get("low_watermark", -1) < END_OF_TIME, "interrupted too late"

    second = subprocess.run(command(data_dir, weak), cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from its checkpoint" in second.stdout

    config = json.load(open(data_dir / "config.json"))
    windower = status(data_dir, "windower")["metrics"]
    assert status(data_dir, "dip_detector")["low_watermark"] == END_OF_TIME
    # every search delivered exactly once across the two runs (the log holds no duplicates)
    from millstream.apps.zeitgeist.generator import ZeitgeistConfig, ZeitgeistInjector

    searches = len(ZeitgeistInjector(ZeitgeistConfig.from_json(config["generator"])).log)
    assert windower["records"] == searches
    # the anomaly sink holds each record once, and each episode's open/closed report once
    lines = [json.loads(line) for name in sorted(os.listdir(data_dir / "anomalies-jsonl"))
             for line in open(data_dir / "anomalies-jsonl" / name)]
    assert lines, "the run found no anomaly: the test would prove nothing"
    assert len({a["id"] for a in lines}) == len(lines)
    episodes = [(a["key"], a["value"]["kind"], a["value"]["episode"], a["value"]["status"]) for a in lines]
    assert len(set(episodes)) == len(episodes)
    assert "precision" in second.stdout
