"""Exactly-once where it hurts: the chaos command (python -m millstream.chaos), run as users run it,
kills the driver process group between two commits (staged but not committed by Spark; committed but
not published; published but not delivered to the sinks; delivered but not recorded) and at a random
moment, restarts it each time, and checks everything published against an independent ground truth:
two senders into an order-sensitive ledger, a computation that draws random numbers, low-watermark and
wall-time timers, JSON-lines sinks.

The negative control runs the same kill with the random computation's exactly-once switched off
(it then publishes a batch's first attempt while Spark keeps the state of the re-run): the checks must
catch that, or they would prove nothing."""

import json
import os
import subprocess
import sys

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def chaos(tmp_path, *args):
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "millstream.chaos", "--events", "1200", "--accounts", "8", "--root",
               str(tmp_path / "chaos"), "--report", str(report), *args]
    done = subprocess.run(command, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ROOT_DIR},
                          capture_output=True, text=True, timeout=1_500)
    return done, (json.loads(report.read_text()) if report.exists() else None)


def test_kills_between_every_two_commits_lose_duplicate_and_alter_nothing(tmp_path):
    done, report = chaos(tmp_path, "--kill-at", "staged@lottery:4", "--kill-at", "committed@ledger:3",
                         "--kill-at", "published@lottery:1", "--kill-at", "delivered@lottery:1", "--kill-at", "6.0")
    assert report is not None, done.stdout + done.stderr
    killed = [k for k in report["kills"] if k["outcome"] == "killed"]
    assert len(killed) == 5, report["kills"]  # every kill landed before the input was over
    failing = [c for c in report["checks"] if not c["ok"]]
    assert not failing, failing
    assert done.returncode == 0 and "0 lost, 0 duplicated, 0 altered" in done.stdout


def test_the_checks_catch_a_computation_publishing_an_attempt_spark_did_not_keep(tmp_path):
    done, report = chaos(tmp_path, "--kill-at", "staged@lottery:4", "--kill-at", "staged@lottery:4",
                         "--lottery-exactly-once-off")
    assert report is not None, done.stdout + done.stderr
    lottery = next(c for c in report["checks"] if c["name"].startswith("lottery"))
    assert lottery["broken"], "a published first attempt and a kept re-run went unnoticed"
    assert done.returncode == 1 and "FAILED" in done.stdout
