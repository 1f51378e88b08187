"""Two versions of millstream side by side: the throughput job's end-to-end rate of this tree against
another commit's, in alternating fresh processes.

One run of the throughput benchmark per version, one after the other, cannot tell a 10% change
from the machine's drift on these shared machines (docs/performance.md, twenty-second and
twenty-third sessions): the JVM's JIT warms over the first full-size runs of a session, and the
machine's speed moves by half from one hour to the next. So each round starts one driver process per
version, the order alternating from round to round; each process runs the tree's own
`bench.throughput.run_millstream` (the Windower, 1e4 keys, 1e6 records, local[2], exactly-once,
10 s dedup horizon) RUNS times at full size, and the best of its runs after the first (the JIT's
warm-up) stands for it. The verdict is the median over rounds of this tree's best / the other's.

The other commit is checked out in a git worktree of its own (removed afterwards); its process
imports millstream and bench from there (PYTHONPATH), and Spark's workers follow (spark/session.py
puts the imported millstream's tree on their path). The other commit must have
`bench.throughput.run_millstream` with today's signature.

`python -m bench.versions COMMIT [--rounds N] [--runs N] [--quick]`; results in
bench/results/versions.json. Needs nothing else running: it times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import RESULTS_DIR, machine

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = 10_000
RECORDS = 1_000_000
RUNS = 4  # per process: the first warms the JIT
ROUNDS = 3
CHILD_TIMEOUT_S = 3_600


def order_of_round(number: int) -> tuple[str, str]:
    """Which version runs first in round `number`: they alternate, so a drift of the machine over the
    rounds favours neither.

    >>> [order_of_round(n) for n in range(3)]
    [('this', 'other'), ('other', 'this'), ('this', 'other')]
    """
    return ("this", "other") if number % 2 == 0 else ("other", "this")


def best_after_warm_up(rates: list[int]) -> int:
    """A process's figure: its best run after the first (the first carries the JIT's warm-up),
    or its only run.

    >>> best_after_warm_up([60_000, 95_000, 110_000, 104_000]), best_after_warm_up([70_000])
    (110000, 70000)
    """
    return max(rates[1:] or rates)


def verdict(rounds: list[dict[str, list[int]]]) -> dict[str, Any]:
    """Per round this tree's figure / the other's; their median.

    >>> verdict([{"this": [1, 120], "other": [1, 100]}, {"this": [1, 90], "other": [1, 100]},
    ...          {"this": [1, 110], "other": [1, 100]}])
    {'ratios': [1.2, 0.9, 1.1], 'median_ratio': 1.1}
    """
    ratios = [round(best_after_warm_up(r["this"]) / best_after_warm_up(r["other"]), 3) for r in rounds]
    return {"ratios": ratios, "median_ratio": round(statistics.median(ratios), 3)}


def child(runs: int, records: int) -> None:
    """In a version's process (its tree first on the path): RUNS full-size runs, rates as JSON."""
    import millstream
    from bench import throughput
    from bench.common import spark_session

    spark = spark_session(log_name="versions")
    rates = []
    for number in range(runs):
        run = throughput.run_millstream(spark, False, KEYS, records, timeout=1800, tag=f"versions{number}",
                                        check=False)
        rates.append(run["records_per_s"])
    print(json.dumps({"tree": os.path.dirname(os.path.dirname(millstream.__file__)), "rates": rates}))


def run_version(tree: str, runs: int, records: int) -> list[int]:
    env = dict(os.environ, PYTHONPATH=tree)
    # The script by its path: `python -m` would put this tree's bench first on the path.
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(runs), str(records)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the run in {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    if os.path.realpath(result["tree"]) != os.path.realpath(tree):
        raise RuntimeError(f"the run in {tree} imported millstream from {result['tree']}")
    return result["rates"]


def main() -> None:
    parser = argparse.ArgumentParser("bench.versions", description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="the other version: a commit, tag or branch of this repository")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--runs", type=int, default=RUNS, help="full-size runs per process (the first warms up)")
    parser.add_argument("--quick", action="store_true", help="100,000 records, one round of two runs: a sanity run")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "versions.json"))
    args = parser.parse_args()
    rounds_count, runs, records = (1, 2, 100_000) if args.quick else (args.rounds, args.runs, RECORDS)
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{args.commit}^{{commit}}"], cwd=REPOSITORY,
                            capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"bench.versions: {args.commit!r} is not a commit of {REPOSITORY}")
    this_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPOSITORY, capture_output=True,
                                 text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPOSITORY,
                                capture_output=True, text=True).stdout.strip())
    started = time.time()
    other_tree = tempfile.mkdtemp(prefix="millstream-versions-")
    subprocess.run(["git", "worktree", "add", "--detach", "--force", other_tree, commit.stdout.strip()],
                   cwd=REPOSITORY, check=True, capture_output=True)
    trees = {"this": REPOSITORY, "other": other_tree}
    rounds: list[dict[str, list[int]]] = []
    try:
        for number in range(rounds_count):
            rates: dict[str, list[int]] = {}
            for version in order_of_round(number):
                rates[version] = run_version(trees[version], runs, records)
                print(f"[versions] round {number + 1}, {version}: {rates[version]} records/s", flush=True)
            rounds.append(rates)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", other_tree], cwd=REPOSITORY, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPOSITORY, capture_output=True)
    result = {"benchmark": "versions", "quick": args.quick, "machine": machine(), "records": records,
              "this": this_commit + (" with uncommitted changes" if dirty else ""),
              "other": commit.stdout.strip(), "rounds": rounds, **verdict(rounds),
              "elapsed_s": round(time.time() - started, 1), "loadavg_after": os.getloadavg()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(f"[versions] this tree ({result['this'][:12]}) / {result['other'][:12]}: rounds {result['ratios']}, "
          f"median {result['median_ratio']}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        del sys.path[0]  # this script's folder: its modules (common, core, state, ...) must not shadow others
        child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
