"""bench/versions.py compares this tree with another commit: its rules (alternating order, the
figure of a process, the verdict) and its refusal of a commit that is not one."""

import doctest
import subprocess
import sys

import bench.versions as versions
from bench.versions import REPOSITORY, order_of_round, verdict


def test_the_examples_in_its_docstrings_run():
    result = doctest.testmod(versions)
    assert result.attempted >= 3 and result.failed == 0


def test_each_version_runs_first_in_as_many_rounds_as_the_other():
    firsts = [order_of_round(n)[0] for n in range(6)]
    assert firsts.count("this") == firsts.count("other") == 3
    assert all(sorted(order_of_round(n)) == ["other", "this"] for n in range(6))


def test_the_verdict_ignores_each_process_s_warm_up_run_and_takes_the_median_round():
    rounds = [{"this": [10, 100, 120], "other": [500, 100, 90]},  # warm-ups faster than any later run
              {"this": [10, 80], "other": [10, 100]},
              {"this": [10, 300], "other": [10, 100]}]
    assert verdict(rounds) == {"ratios": [1.2, 0.8, 3.0], "median_ratio": 1.2}


def test_a_name_that_is_no_commit_is_refused_before_anything_runs():
    done = subprocess.run([sys.executable, "-m", "bench.versions", "no-such-commit-anywhere"], cwd=REPOSITORY,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "'no-such-commit-anywhere' is not a commit" in done.stderr
    assert "Traceback" not in done.stderr
