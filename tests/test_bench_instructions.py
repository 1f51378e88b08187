"""bench/instructions.py counts a run's timed part only, and the same on every run (to within what
memory addresses change: ~0.01% over 400,000 records)."""

import shutil

import pytest

from bench.instructions import count

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                                reason="needs valgrind")


def test_the_count_is_the_same_on_every_run():
    first = count("core", 3_000)
    assert first > 0  # counting was switched on
    assert abs(count("core", 3_000) - first) <= first / 1_000


@pytest.mark.parametrize("run", ["core", "user_code_alone", "plain"])
def test_the_count_covers_the_timed_part_alone(run):
    # Twice the records, about twice the instructions: the interpreter's start and the imports
    # (billions of instructions, the same for both sizes) are not counted. (The toggling's own
    # subprocess call is: ~20 million, the same for both, which the plain run's 2,000 records, ~26
    # million, do not dwarf: its ratio is ~1.56.)
    assert 1.4 < count(run, 4_000) / count(run, 2_000) < 2.6
