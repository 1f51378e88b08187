"""The scaling benchmark's verdict: speed-ups per round, their median, and how the report shows them.

Rates here are made up; the expected ratios are worked out by hand."""

import subprocess
import sys

import pytest

from bench import scaling
from bench.run import table
from bench.scaling import Cluster, ratios_by_round, speedups, summarize_rounds


def _row(config: str, parallelism: int, rate: int, round_number: int = 0) -> dict:
    return {"config": config, "parallelism": parallelism, "round": round_number, "records_per_s": rate,
            "driver_share": 0.04, "driver_share_max": 0.05, "cores_busy": 1.8, "cpu_us_per_record": 20.0,
            "matches_expected": True}


def test_a_round_gives_two_cores_over_one_locally_and_on_the_cluster() -> None:
    rows = [_row("local1", 1, 50_000), _row("local2", 2, 80_000), _row("cluster1", 1, 40_000),
            _row("cluster2", 2, 70_000)]
    assert speedups(rows) == {"local": 1.6, "cluster": 1.75}


def test_a_failed_configuration_leaves_its_ratio_unknown() -> None:
    rows = [_row("local1", 1, 50_000), _row("local2", 2, 80_000), _row("cluster1", 1, 40_000),
            {"config": "cluster2", "error": "worker lost"}]
    assert speedups(rows) == {"local": 1.6, "cluster": None}


def test_the_reported_speed_up_is_the_median_of_the_rounds_and_a_failed_round_leaves_it_unknown() -> None:
    assert summarize_rounds({"local": [1.55, 1.38, 1.77], "cluster": [1.64, 1.9, 1.66]}) == \
        {"local": 1.55, "cluster": 1.66}
    assert summarize_rounds({"local": [1.8, None, 1.75], "cluster": []}) == {"local": None, "cluster": None}


def test_the_report_lists_each_round_and_judges_the_median() -> None:
    runs = [_row("local1", 1, 50_000, 0), _row("local2", 2, 90_000, 0),
            _row("local1", 1, 50_000, 1), _row("local2", 2, 70_000, 1),
            _row("local1", 1, 50_000, 2), _row("local2", 2, 86_000, 2),
            {"config": "cluster1", "error": "master did not start", "round": 0}]
    report = table({"scaling": {"runs": runs, "speedup": {"local": 1.72, "cluster": None},
                                "speedup_by_round": {"local": [1.8, 1.4, 1.72], "cluster": [None]}}})
    lines = report.splitlines()
    local = next(line for line in lines if "speed-up local[2] / local[1]" in line)
    assert "rounds 1.8x, 1.4x, 1.72x; median 1.72x" in local and local.rstrip().endswith("| met |")
    cluster = next(line for line in lines if "speed-up standalone" in line)
    assert "median n/a" in cluster and "MISSED" not in cluster
    assert any("local2, round 2: records/s" in line and "70,000; 1.8 of 2; 20.0 us" in line for line in lines)
    assert any("cluster1, round 1: failed" in line and "MISSED" in line for line in lines)


def test_ratios_are_taken_within_each_round_never_across_rounds() -> None:
    # Round 1 ran fast, round 0 slow: a ratio across rounds (round 0's one core against round 1's
    # two) would read 100,000 / 40,000 = 2.5x.
    rows = [_row("local1", 1, 40_000, 0), _row("local2", 2, 60_000, 0), _row("cluster1", 1, 40_000, 0),
            _row("cluster2", 2, 66_000, 0),
            _row("local1", 1, 60_000, 1), _row("local2", 2, 100_000, 1), _row("cluster1", 1, 50_000, 1),
            {"config": "cluster2", "error": "worker lost", "round": 1}]
    assert ratios_by_round(rows) == {"local": [1.5, 1.67], "cluster": [1.65, None]}
    assert summarize_rounds(ratios_by_round(rows)) == {"local": 1.58, "cluster": None}


def test_a_cluster_that_fails_to_start_stops_what_it_started(tmp_path, monkeypatch) -> None:
    """A master that started, then a worker that never registers: the master must not run on into
    the next configuration or round."""
    cluster = Cluster(workers=1, directory=str(tmp_path))
    started: list[subprocess.Popen] = []

    def start(args: list[str], log: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        cluster.processes.append(process)
        started.append(process)
        return process

    def wait_for_log(path: str, text: str, process: subprocess.Popen, limit_s: float = 90) -> None:
        if "registered" in text:
            raise RuntimeError("the worker did not register")

    monkeypatch.setattr(cluster, "_start", start)
    monkeypatch.setattr(scaling, "_wait_for_log", wait_for_log)
    with pytest.raises(RuntimeError, match="did not register"):
        with cluster:
            pass
    assert len(started) == 2 and all(process.poll() is not None for process in started)
