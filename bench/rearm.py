"""Firings that set timers: one key's timers all due in one step, each firing setting its own tag again
far ahead (a periodic timer per item, say), against the same timers whose firings set nothing;
through `KeyGroupExecutor.step`, offline, at two sizes, side by side in one run.

Reported: CPU time per firing at 4x the timers against 1x (1.0: linear in the key's timers), and
firings that set a timer against firings that set none, at the larger size. Each figure is the best
of three steps.

`python -m bench.rearm [--quick]` (results in bench/results/rearm.json).
"""

from __future__ import annotations

import time

from bench.common import cli
from millstream import Computation, Pipeline, Record, ScriptedInjector
from millstream.core.executor import Delivery, KeyGroupExecutor
from millstream.core.plan import plan_computation
from millstream.core.store import MemoryKeyStore
from millstream.core.watermarks import Segment

FAR_AHEAD = 10**12


class SetsTimers(Computation):
    """A record of value n sets timers t0..t{n-1} at 10..n+9; a firing sets its tag again far ahead."""

    rearm = True

    def process_record(self, ctx, record):
        for i in range(record.value):
            ctx.set_timer(f"t{i}", 10 + i)

    def process_timer(self, ctx, timer):
        if self.rearm:
            ctx.set_timer(timer.tag, FAR_AHEAD + timer.time)


class SetsNothing(SetsTimers):
    rearm = False


def firing_step(computation: Computation, timers: int) -> float:
    """CPU microseconds per firing of one step firing `timers` due timers of one key."""
    pipeline = Pipeline("rearm").add_injector("src", ScriptedInjector("src", []), "in")
    pipeline.add_computation("c", computation, ["in"], ["out"])
    executor = KeyGroupExecutor(plan_computation(pipeline, "c", key_groups=1), MemoryKeyStore())
    executor.step([Delivery("k", "in", Record("k", timers, 1, "r1"), 0, True)], [Segment(0, 0)], 0)
    started = time.process_time()
    result = executor.step([], [Segment(FAR_AHEAD - 1, FAR_AHEAD - 1)], 0)
    cpu_s = time.process_time() - started
    assert result.metrics.timers_fired == timers
    return cpu_s / timers * 1e6


def main(quick: bool) -> dict:
    small = 500 if quick else 2_000
    sizes = (small, 4 * small)
    us: dict[str, dict[int, float]] = {"sets a timer": {}, "sets nothing": {}}
    for name, computation in (("sets a timer", SetsTimers()), ("sets nothing", SetsNothing())):
        for size in sizes:
            us[name][size] = round(min(firing_step(computation, size) for _ in range(3)), 3)
    growth = {name: round(by_size[sizes[1]] / by_size[sizes[0]], 2) for name, by_size in us.items()}
    against_none = round(us["sets a timer"][sizes[1]] / us["sets nothing"][sizes[1]], 2)
    for name, by_size in us.items():
        print(f"firings that {name.replace('sets', 'set')}: {by_size[sizes[0]]:.2f} us CPU per firing "
              f"at {sizes[0]:,} due timers, {by_size[sizes[1]]:.2f} at {sizes[1]:,} ({growth[name]}x per firing at 4x)")
    print(f"at {sizes[1]:,}: firings that set a timer cost {against_none}x those that set none")
    return {"timers": list(sizes), "us_per_firing": {name: {str(k): v for k, v in by_size.items()}
                                                     for name, by_size in us.items()},
            "growth_at_4x": growth, "sets_a_timer_vs_nothing": against_none}


if __name__ == "__main__":
    cli("rearm", main)
