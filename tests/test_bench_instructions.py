"""bench/instructions.py counts a run's timed part only, and the same on every run (to within what
memory addresses change: ~0.01% over 400,000 records)."""

import shutil

import pytest

from bench.instructions import count

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                                reason="needs valgrind")


def test_the_count_is_the_same_on_every_run_and_covers_the_timed_part_alone():
    small = count("core", 3_000)
    assert small > 0  # counting was switched on
    assert abs(count("core", 3_000) - small) <= small / 1_000
    # Twice the records, about twice the instructions: the interpreter's start, the imports and the
    # workload's generation (billions of instructions, the same for both) are not counted.
    assert 1.6 < count("core", 6_000) / small < 2.6
