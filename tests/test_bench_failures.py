"""bench/failures.py counts what the dead_letter policy costs: its invocation counts must be those
of the documented rule (the first failure starts the key's step over without it; from then on the
records are delivered between checkpoints, and a failure replays the records since the last one),
counted here by a plain-Python replay of that rule, and of the rule before checkpoints."""

import pytest

from bench.failures import one_step, timer_step
from millstream.core import executor


def invocations_without_checkpoints(records: int, every: int) -> int:
    """Runs of the step in record order, each skipping the failures found before and ending at the
    first new one: the invocations of user code they make together."""
    failing = {n for n in range(records) if every and (n + 1) % every == 0}  # values are n + 1
    found: set[int] = set()
    invocations = 0
    while True:
        for n in range(records):
            if n in found:
                continue
            invocations += 1
            if n in failing:
                found.add(n)
                break
        else:
            return invocations


def invocations_with_checkpoints(records: int, every: int, checkpoint_records: int) -> int:
    """The first run in record order up to the first failure; the second (the last: no timers here)
    in runs of records from a checkpoint, each failure sending it back to the run's checkpoint to
    replay the records up to the failed one, skipped from then on. Runs start at `checkpoint_records`
    and double after a run with no failure, up to MAX_CHECKPOINT_RECORDS."""
    failing = sorted(n for n in range(records) if every and (n + 1) % every == 0)
    if not failing:
        return records
    invocations, skipped = failing[0] + 1, {failing[0]}
    position, interval = 0, checkpoint_records
    while position < records:
        end = min(position + interval, records)
        interval = min(2 * interval, executor.MAX_CHECKPOINT_RECORDS)
        while True:
            failed = None
            for n in range(position, end):
                if n not in skipped:
                    invocations += 1
                    if n in failing:
                        failed = n
                        break
            if failed is None:
                break
            skipped.add(failed)
            end, interval = failed + 1, checkpoint_records
        position = end
    return invocations


@pytest.mark.parametrize("every", [0, 1, 2, 7, 50])
def test_the_benchmark_counts_the_invocations_the_rule_makes(every, monkeypatch):
    monkeypatch.setattr(executor, "CHECKPOINT_COPY_SHARE", None)  # where checkpoints fall by records alone
    run = one_step(300, every)
    assert run["invocations"] == invocations_with_checkpoints(300, every, executor.CHECKPOINT_RECORDS)
    assert run["dead_letters"] == (300 // every if every else 0)
    monkeypatch.setattr(executor, "CHECKPOINT_RECORDS", 0)  # none: every failure reruns the key's step
    run = one_step(300, every)
    assert run["invocations"] == invocations_without_checkpoints(300, every)
    assert run["dead_letters"] == (300 // every if every else 0)


@pytest.mark.parametrize("timers", [2, 40, 301])
def test_failing_timers_fire_as_the_rule_for_records_delivers(timers, monkeypatch):
    """Due timers in (time, tag) order are positions as records are: every other one failing, the
    step's firings are the invocations the records' rule makes for every second record failing."""
    monkeypatch.setattr(executor, "CHECKPOINT_COPY_SHARE", None)
    assert timer_step(timers)["firings"] == invocations_with_checkpoints(timers, 2, executor.CHECKPOINT_RECORDS)
    monkeypatch.setattr(executor, "CHECKPOINT_RECORDS", 0)
    assert timer_step(timers)["firings"] == invocations_without_checkpoints(timers, 2)
