"""Computation.setup on Spark: every task unpickles its own copy of the computation, yet each record
is processed by an instance whose setup() ran, and setup() runs once per worker process (not once per
task): a client opened in setup() is there for every later micro-batch."""

import importlib
import os
import sys

from millstream import Computation, Pipeline, Record, ScriptedInjector
from millstream.spark.runner import SparkRunner

STEPS = 6
KEYS = 12


class UsesClient(Computation):
    """setup() opens a "client" (a dict naming the process); process_record needs it and produces
    which process's client handled the record. setup() appends a line per call to `setups_log`."""

    def __init__(self, setups_log: str) -> None:
        self.setups_log = setups_log

    def setup(self, info):
        self.client = {"pid": os.getpid(), "computation": info.computation}
        with open(self.setups_log, "a") as log:
            log.write(f"{os.getpid()}\n")

    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, {"pid": self.client["pid"], "n": record.value}, record.timestamp), "out")


def test_setup_runs_once_per_worker_process_and_every_task_uses_a_set_up_instance(spark, tmp_path):
    setups_log = str(tmp_path / "setups.log")
    # One step per micro-batch, every key in every step: every batch runs tasks on every partition.
    steps = [([Record(f"k{k}", step * KEYS + k, 1_000 * step + k) for k in range(KEYS)], 1_000 * step + 999)
             for step in range(STEPS)]
    pipeline = (Pipeline("setup").add_injector("src", ScriptedInjector("src", steps), "in")
                .add_computation("uses_client", UsesClient(setups_log), ["in"], ["out"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=240)
    out = runner.read_stream("out")
    progress = runner.progress()
    assert progress.computations["uses_client"].dead_letters == 0
    assert sorted(r.value["n"] for r in out) == list(range(STEPS * KEYS))  # no record failed for lack of setup
    assert progress.computations["uses_client"].batches >= STEPS  # several batches, so several tasks per process
    with open(setups_log) as log:
        pids = [int(line) for line in log]
    assert len(pids) == len(set(pids)), f"setup() ran more than once in a process: {pids}"
    assert {r.value["pid"] for r in out} <= set(pids)  # records were handled by set-up instances


USER_MODULES = {
    # A helper module the computation's method calls through an import of its own.
    "millstream_test_helpers": '''
def doubled(n):
    return 2 * n
''',
    # A base class in a second module, whose method uses the helper.
    "millstream_test_base": '''
import millstream_test_helpers
from millstream import Computation, Record


class Doubling(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, millstream_test_helpers.doubled(record.value), record.timestamp), "out")
''',
    # The user's computation: a subclass, in a third module, calling a function imported by name.
    "millstream_test_user": '''
from millstream_test_base import Doubling
from millstream_test_helpers import doubled


class DoublingPlusOne(Doubling):
    def process_timer(self, ctx, timer):
        pass

    def plus_one(self, n):
        return doubled(n) + 1
''',
}


def test_user_code_spread_over_modules_the_workers_cannot_import_runs(spark, tmp_path, monkeypatch):
    """A computation whose class, base class and helpers live in the user's own modules, on a path
    Spark's workers do not have (a notebook's or script's directory): all of it travels by value."""
    for name, source in USER_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in USER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    user = importlib.import_module("millstream_test_user")
    steps = [([Record(f"k{k}", k, k) for k in range(KEYS)], 1_000)]
    pipeline = (Pipeline("modules").add_injector("src", ScriptedInjector("src", steps), "in")
                .add_computation("doubling", user.DoublingPlusOne(), ["in"], ["out"]))
    runner = SparkRunner(pipeline, root=str(tmp_path / "root"), spark=spark)
    runner.run(timeout=240)
    assert sorted(r.value for r in runner.read_stream("out")) == [2 * k for k in range(KEYS)]
