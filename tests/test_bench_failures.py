"""bench/failures.py counts what the dead_letter policy costs: its invocation counts must be those
of the documented rule (each failure starts the key's step over without every input that failed so
far), counted here by a plain-Python replay of that rule."""

import pytest

from bench.failures import one_step


def invocations_by_the_rule(records: int, every: int) -> int:
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


@pytest.mark.parametrize("every", [0, 1, 2, 7, 50])
def test_the_benchmark_counts_the_invocations_the_rule_makes(every):
    run = one_step(300, every)
    assert run["invocations"] == invocations_by_the_rule(300, every)
    assert run["dead_letters"] == (300 // every if every else 0)
