"""What failing user code costs under the dead_letter policy: one key's step through
`KeyGroupExecutor.step`, offline, with every n-th record failing, against the same step with no
record failing; invocations of user code counted, CPU time measured, side by side in one run.

A failure rolls the key's step back: user code's invocations from the run that failed are
discarded and the step runs again without the failing record. What this shows is how the step's
cost grows with the key's failures: the invocations per record (a count, the same on every run)
and the CPU time per record against the run without failures.

Its last line does the same for timers: one key's timers due in one step, every other one failing
(in process_timer), at two sizes, and the smaller with every failure starting the step over.

`python -m bench.failures [--quick]` (results in bench/results/failures.json).
"""

from __future__ import annotations

import time

from bench.common import cli
from millstream import Computation, ListState, Pipeline, Record, ScriptedInjector
from millstream.core import executor
from millstream.core.executor import Delivery, KeyGroupExecutor
from millstream.core.plan import plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment
from millstream.model.records import END_OF_TIME


class GrowingFailsOnce(Computation):
    """Fails on the record of value 1 only; every record appends a small dict to the key's list state
    (decoded whole each step) and sets a timer: the key's step copies a growing state at each
    checkpoint, item by item."""

    seen = ListState("seen")

    def __init__(self) -> None:
        self.invocations = 0

    def process_record(self, ctx, record):
        self.invocations += 1
        ctx.state(self.seen).append({"value": record.value, "at": record.timestamp})  # copied in Python
        ctx.set_timer(f"t{record.value}", END_OF_TIME)
        if record.value == 1:
            raise ValueError("refused 1")


class FailEvery(Computation):
    """Fails on record values divisible by `every` (0: never); the others produce themselves."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.invocations = 0

    def process_record(self, ctx, record):
        self.invocations += 1
        if self.every and record.value % self.every == 0:
            raise ValueError(f"refused {record.value}")
        ctx.produce(Record(ctx.key, record.value, record.timestamp), "out")


class TimersFailEvery(FailEvery):
    """FailEvery whose records each also set a timer that stays pending (at END_OF_TIME): the key's
    pending timers grow with its records, as a session window's or a deadline's do."""

    def process_record(self, ctx, record):
        ctx.set_timer(f"t{record.value}", END_OF_TIME)
        super().process_record(ctx, record)


class OddTimersFail(Computation):
    """Each record sets a timer numbered by its value; the firings of odd-numbered timers fail."""

    def __init__(self) -> None:
        self.invocations = 0  # firings

    def process_record(self, ctx, record):
        ctx.set_timer(f"t{record.value}", record.timestamp)

    def process_timer(self, ctx, timer):
        self.invocations += 1
        if int(timer.tag[1:]) % 2:
            raise ValueError(f"refused {timer.tag}")
        ctx.produce(Record(ctx.key, timer.tag, timer.time), "out")


def timer_step(timers: int) -> dict:
    """One key's `timers` timers (set in a first step, not timed) fired in one step, every other one
    failing: its firings and CPU per timer."""
    computation = OddTimersFail()
    executor = key_group_executor(computation)
    executor.step([Delivery("hot", "in", Record("hot", n, n, f"r{n}"), 0, True) for n in range(timers)],
                  [Segment(-1, -1)], 0)
    started = time.process_time()
    result = executor.step([], [Segment(-1, timers)], 0)
    cpu_s = time.process_time() - started
    assert result.metrics.dead_letters == timers // 2 and result.metrics.timers_fired == timers - timers // 2
    return {"timers": timers, "firings": computation.invocations, "cpu_us_per_timer": round(cpu_s / timers * 1e6, 2)}


def key_group_executor(computation: Computation) -> KeyGroupExecutor:
    """`computation` under the dead_letter policy, one key group, an in-memory store."""
    pipeline = Pipeline("failures").add_injector("src", ScriptedInjector("src", []), "in")
    pipeline.add_computation("c", computation, ["in"], ["out"], on_error="dead_letter")
    return KeyGroupExecutor(plan_computation(pipeline, "c", key_groups=1), MemoryKeyStore())


def one_step(records: int, every: int, computation: Computation | None = None) -> dict:
    computation = computation or FailEvery(every)
    executor = key_group_executor(computation)
    deliveries = [Delivery("hot", "in", Record("hot", n + 1, n, f"r{n}"), 0, True) for n in range(records)]
    started = time.process_time()
    result = executor.step(deliveries, [Segment(-1, records)], 0)
    cpu_s = time.process_time() - started
    expected_dead = records // every if every else 0 if not isinstance(computation, GrowingFailsOnce) else 1
    assert result.metrics.dead_letters == expected_dead and result.metrics.records == records - expected_dead
    return {"failing_every": every or None, "dead_letters": expected_dead, "invocations": computation.invocations,
            "invocations_per_record": round(computation.invocations / records, 3),
            "cpu_us_per_record": round(cpu_s / records * 1e6, 2)}


def main(quick: bool) -> dict:
    records = 2_000 if quick else 20_000
    runs = [one_step(records, every) for every in (0, 1000, 100, 10, 2, 1)]
    baseline = runs[0]["cpu_us_per_record"]
    for run in runs:
        run["cpu_vs_no_failures"] = round(run["cpu_us_per_record"] / baseline, 2)
        print(f"every {run['failing_every'] or 'none':>5}: {run['invocations_per_record']:6.3f} invocations per record, "
              f"{run['cpu_us_per_record']:8.2f} us CPU per record ({run['cpu_vs_no_failures']}x no failures)")
    # One early failure, then a growing state: checkpoints (a copy of the key's state each) against
    # starting the step over (executor.CHECKPOINT_RECORDS = 0), alternating, best of three each.
    growing: dict[str, list[float]] = {"checkpoints": [], "starting over": []}
    for _ in range(3):
        for name, every_records in (("checkpoints", executor.CHECKPOINT_RECORDS), ("starting over", 0)):
            saved, executor.CHECKPOINT_RECORDS = executor.CHECKPOINT_RECORDS, every_records
            try:
                growing[name].append(one_step(records, 0, GrowingFailsOnce())["cpu_us_per_record"])
            finally:
                executor.CHECKPOINT_RECORDS = saved
    best = {name: min(times) for name, times in growing.items()}
    ratio = round(best["checkpoints"] / best["starting over"], 2)
    print(f"one early failure, a growing list of dicts and a timer per record: {best['checkpoints']:.2f} us CPU per record "
          f"with checkpoints, {best['starting over']:.2f} starting over ({ratio}x)")
    # Every 10th record failing while the key's pending timers grow (a timer per record): the cost
    # per record at 4x the records, against 1x (1.0: linear), best of three each.
    sizes = (records // 2, records * 2)
    pending: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(3):
        for size in sizes:
            pending[size].append(one_step(size, 10, TimersFailEvery(10))["cpu_us_per_record"])
    per_record = {size: min(times) for size, times in pending.items()}
    growth = round(per_record[sizes[1]] / per_record[sizes[0]], 2)
    print(f"every 10th failing, a pending timer per record: {per_record[sizes[0]]:.2f} us CPU per record at "
          f"{sizes[0]:,} records, {per_record[sizes[1]]:.2f} at {sizes[1]:,} "
          f"({growth}x per record at 4x the records)")
    # Every other timer failing: firings and CPU per timer at 4x the timers against 1x, with
    # checkpoints; and the smaller starting the step over at each failure (CHECKPOINT_RECORDS = 0).
    small, large = records // 10, records // 10 * 4
    timed = {"checkpoints": timer_step(small), "checkpoints at 4x": timer_step(large)}
    saved, executor.CHECKPOINT_RECORDS = executor.CHECKPOINT_RECORDS, 0
    try:
        timed["starting over"] = timer_step(small)
    finally:
        executor.CHECKPOINT_RECORDS = saved
    print(f"every other timer failing: {timed['checkpoints']['firings'] / small:.2f} firings and "
          f"{timed['checkpoints']['cpu_us_per_timer']:.2f} us CPU per timer at {small:,} timers, "
          f"{timed['checkpoints at 4x']['firings'] / large:.2f} and {timed['checkpoints at 4x']['cpu_us_per_timer']:.2f} "
          f"at {large:,}; starting over at each failure {timed['starting over']['firings'] / small:.2f} and "
          f"{timed['starting over']['cpu_us_per_timer']:.2f} at {small:,}")
    return {"records_of_the_key": records, "runs": runs, "every_other_timer_failing": timed,
            "one_failure_growing_state_us_per_record": best, "checkpoints_vs_starting_over": ratio,
            "failing_every_10_pending_timers_us_per_record": {str(size): us for size, us in per_record.items()},
            "failing_every_10_pending_timers_growth_at_4x": growth}


if __name__ == "__main__":
    cli("failures", main)
