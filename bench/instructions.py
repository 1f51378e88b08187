"""Machine instructions per record of bench/core.py's runs, counted by valgrind's callgrind in each
run's timed part only: a measure the machine's speed swings do not move.

Timed runs on these shared machines swing by half from one hour to the next, and even side by side
a run of one version against another differs by a few percent from noise alone: too much to tell
whether a change to the core saved 1%. An instruction count of the same code and input is the
same on every run to within ~0.01% (the hash seed is fixed; what is left comes from memory
addresses, which differ from run to run), so a change's effect shows, whatever the machine does
meanwhile. Instructions are not time (a cache miss costs more than an add), so speed targets
stay with bench/core.py; this is the yardstick for changes to the framework's per-record cost.

The operator's full collections (spark/worker_garbage.py) are timed by the process's CPU time, which
differs under valgrind from run to run, and so would the counts: the runs stop that clock, so only
the first settle() collects in full, and the counts leave the later collections out.

Each run goes in a process of its own under `valgrind --tool=callgrind --instr-atstart=no`; the
run's `profiler` hook switches counting on and off around its timed part (`callgrind_control -i`).
The three runs of bench/core.py that matter here: the core, the Windower's own code alone (with a
thin context) and the plain-CPython Windower. Core / user code alone is the framework's share.

`python -m bench.instructions [--quick]` (results in bench/results/instructions.json); needs
valgrind (Debian's `valgrind` package). Under callgrind Python runs ~50 times slower: the 400,000
records (two of bench/core.py's 200,000-record batches: ~20 records per key per step, the second
batch on stored state) take ~4 minutes for the core, the runs two at a time; --quick counts
200,000 records (the first batch alone: no stored state yet).
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from bench.common import cli
from millstream.spark.pacing import FIRST_BATCH_RECORDS

RUNS = ("core", "user_code_alone", "plain")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `bench` imports from
CHILD_TIMEOUT_S = 3_600  # a run stuck (callgrind_control unanswered) fails rather than hangs
KEYS = 10_000
BATCH = FIRST_BATCH_RECORDS  # bench/core.py's


class CallgrindToggle:
    """Switches callgrind's counting on and off for this process (the runs' `profiler` hook). What
    the switching itself runs in between (the end of one `callgrind_control` call, the start of the
    other) is counted too: a constant, the same for every version."""

    def enable(self) -> None:
        self._control("on")

    def disable(self) -> None:
        self._control("off")

    @staticmethod
    def _control(state: str) -> None:
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)


def _child(run: str, records: int) -> None:
    """Runs one of bench/core.py's runs with counting on in its timed part (inside valgrind)."""
    from bench import core
    from millstream.spark.worker_garbage import WORKER_GARBAGE

    runners = {"core": core.run_core, "user_code_alone": core.run_user_code_alone, "plain": core.run_plain}
    # The imports' objects out of the collector's reach: whether a full collection falls in the timed
    # part then depends on the run alone, not on how many objects the imported modules happen to make
    # (one such collection is a third of the plain run's count at a few thousand records).
    gc.collect()
    gc.freeze()
    # The operator's full collections come when the process's CPU time says (WorkerGarbage.settle), and
    # under valgrind that time differs from run to run: with its clock stopped, the first collection
    # is the only one, and the count is the same on every run.
    WORKER_GARBAGE.clock = lambda: 0.0
    runners[run](KEYS, records, BATCH, CallgrindToggle())


def count(run: str, records: int) -> int:
    """Instructions in `run`'s timed part (one of RUNS), over `records` records."""
    if run not in RUNS:
        raise ValueError(f"no run {run!r}; the runs: {', '.join(RUNS)}")
    with tempfile.TemporaryDirectory(prefix="millstream-callgrind-") as scratch:
        out = os.path.join(scratch, "callgrind.out")
        env = dict(os.environ, PYTHONHASHSEED="0")
        done = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                               sys.executable, "-m", "bench.instructions", "--child", run, str(records)],
                              capture_output=True, text=True, env=env, cwd=REPOSITORY, timeout=CHILD_TIMEOUT_S)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"callgrind run of {run!r} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return int(found.group(1))


def main(quick: bool) -> dict:
    records = 2 * BATCH if not quick else BATCH
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench.instructions needs valgrind (apt-get install valgrind)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(RUNS, pool.map(lambda run: count(run, records), RUNS)))
    per_record = {run: round(n / records) for run, n in counts.items()}
    # Ratios as bench/core.py's speed ratios: the other run's instructions / the core's.
    result = {"records": records, "keys": KEYS, "batch": BATCH, "instructions_per_record": per_record,
              "core_vs_user_code_alone": round(counts["user_code_alone"] / counts["core"], 3),
              "core_vs_plain": round(counts["plain"] / counts["core"], 3),
              "framework_per_record": per_record["core"] - per_record["user_code_alone"]}
    print(f"[instructions] {records:,} records, {KEYS:,} keys, {BATCH:,}-record batches, per record: core "
          f"{per_record['core']:,}, the user code alone {per_record['user_code_alone']:,}, plain CPython "
          f"{per_record['plain']:,}; core / user code alone = {result['core_vs_user_code_alone']} (the framework: "
          f"{result['framework_per_record']:,} per record), core / plain = {result['core_vs_plain']}", flush=True)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # inside valgrind: one run (see `count`)
        _child(sys.argv[2], int(sys.argv[3]))
    else:
        cli("instructions", main)
