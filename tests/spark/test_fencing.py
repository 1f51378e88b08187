"""Sequencers: one driver at a time per root, with two real driver processes.

A second driver refuses while the first runs; one that takes over fences the first (whose later
writes change nothing: every publication after the take-over is the new driver's) and finishes the
run with the output a single driver would give. On local disk and with the root on an S3 endpoint."""

import json
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from millstream.spark.publog import PublicationLog
from millstream.spark.storage import Storage

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(os.path.dirname(HERE))
EVENTS, KEYS = 3_000, 6


def start(root, out, *extra, rate, checkpoints=None):
    command = [sys.executable, os.path.join(HERE, "fence_driver.py"), "--root", root, "--out", str(out),
               "--events", str(EVENTS), "--rate", str(rate), *extra]
    if checkpoints:
        command += ["--checkpoint-root", checkpoints]
    return subprocess.Popen(command, cwd=ROOT_DIR, env={**os.environ, "PYTHONPATH": ROOT_DIR},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def batches_published(root):
    log = PublicationLog(root, "count")
    return sum(1 for _, e in log.entries_after(-1, 10_000) if e["type"] == "batch")


def claimed_epochs(root):
    return [e["epoch"] for _, e in PublicationLog(root, "count").entries_after(-1, 10_000) if e["type"] == "claim"]


def outcome(path):
    return path.read_text() if path.exists() else "(the driver wrote no outcome)"


def wait_for(condition, seconds, what):
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_second_driver_refuses_and_a_take_over_fences_the_first(where, tmp_path, request):
    root = str(tmp_path / "root") if where == "local" else request.getfixturevalue("s3_server").location("root")
    checkpoints = str(tmp_path / "checkpoints")
    # The first driver is paced to need 600 s, so it is still running whenever the take-over lands
    # (the offsets keep its start time: the one taking over, paced faster, catches up at once).
    first = start(root, tmp_path / "first.json", rate=EVENTS / 600, checkpoints=checkpoints)
    third = None
    try:
        wait_for(lambda: batches_published(root) >= 3, 180, "the first driver's batches")
        # A second driver on the same root refuses, quickly, naming the one that runs.
        started = time.time()
        second = start(root, tmp_path / "second.json", rate=EVENTS / 600, checkpoints=checkpoints)
        assert second.wait(timeout=120) == 3
        refusal = json.loads((tmp_path / "second.json").read_text())["error"]
        assert "in use by another driver" in refusal and f"process {first.pid}" in refusal, refusal
        assert time.time() - started < 30, "the refusal must not wait for Spark"
        assert first.poll() is None, "the refusing driver disturbed the running one"
        # A third takes over: it claims before starting Spark, the first is fenced and stops, and the
        # third finishes the run.
        started = time.time()
        third = start(root, tmp_path / "third.json", "--takeover", rate=1_000, checkpoints=checkpoints)
        wait_for(lambda: claimed_epochs(root) == [1, 2] or third.poll() is not None, 120, "the take-over's claim")
        assert claimed_epochs(root) == [1, 2], outcome(tmp_path / "third.json")
        claimed = time.time()
        assert claimed - started < 60, f"the take-over claimed {claimed - started:.0f} s after it started"
        try:
            assert first.wait(timeout=120) == 3, "the first driver finished instead of being fenced"
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the fenced driver still ran {time.time() - claimed:.0f} s after the take-over "
                                 f"claimed (batches published: {batches_published(root)})") from None
        fenced = json.loads((tmp_path / "first.json").read_text())["error"]
        assert "took over" in fenced or "another driver" in fenced, fenced
        assert third.wait(timeout=600) == 0, outcome(tmp_path / "third.json")
    finally:
        for process in (first, third):
            if process is not None and process.poll() is None:
                process.kill()
    log = PublicationLog(root, "count")
    entries = log.entries_after(-1, 100_000)
    claims = [(p, e["epoch"]) for p, e in entries if e["type"] == "claim"]
    assert [epoch for _, epoch in claims] == [1, 2], claims  # the refusing driver claimed nothing
    takeover_position, takeover_epoch = claims[-1]
    assert all(e["epoch"] == takeover_epoch for p, e in entries if p > takeover_position), \
        "the fenced driver published after the take-over"
    batches = [e["batch"] for _, e in entries if e["type"] == "batch"]
    assert batches == list(range(len(batches))), "a batch published twice or skipped"
    # Exactly the output of one driver: per key, running counts 1..n once each.
    counts: dict[str, list[int]] = {}
    storage = Storage(root)
    for _, entry in entries:
        for path, rows in entry.get("streams", {}).get("counts", []) if entry["type"] == "batch" else []:
            table = pq.read_table(path, filesystem=storage.fs).to_pydict()
            for key, value in zip(table["key"], table["value"]):
                counts.setdefault(key, []).append(int(value))
    assert {k: sorted(v) for k, v in counts.items()} == {
        f"k{k}": list(range(1, EVENTS // KEYS + 1)) for k in range(KEYS)}
