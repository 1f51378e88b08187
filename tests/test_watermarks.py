"""WatermarkCoalescer, input points and output watermarks: the low-watermark arithmetic shared by both runners.

Rules under test (Hazelcast keyed-watermark design, MillWheel section 5.5):
min over inputs, regression raises, idle inputs excluded, all-idle holds, a waking idle input does not
move the coalesced value back, the coalesced value is monotonic.
"""

from __future__ import annotations

import random

import pytest

from millstream.core.watermarks import Segment, WatermarkCoalescer, WatermarkRegressionError, output_watermarks
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME


def test_coalesced_is_min_over_inputs_hazelcast_example():
    # The worked example of the Hazelcast design doc: in wm(N, M) -> out wm.
    c = WatermarkCoalescer(["0", "1"])
    assert c.observe("0", 10) == BEGINNING_OF_TIME  # input 1 has published nothing yet
    assert c.observe("1", 12) == 10
    assert c.observe("0", 11) == 11
    assert c.observe("1", 13) == 11  # minimum still 11
    assert c.observe("0", 14) == 13
    assert c.coalesced == 13
    assert c.inputs() == {"0": 14, "1": 13}
    assert c.input_watermark("0") == 14


def test_input_that_published_nothing_holds_the_minimum_at_beginning_of_time():
    c = WatermarkCoalescer(["a", "b", "c"])
    c.observe("a", 500)
    c.observe("b", 700)
    assert c.coalesced == BEGINNING_OF_TIME
    assert c.observe("c", 600) == 500


def test_regression_raises_and_leaves_state_untouched():
    c = WatermarkCoalescer(["a", "b"])
    c.observe("a", 100)
    c.observe("b", 200)
    with pytest.raises(WatermarkRegressionError, match=r"'a'.*99.*100"):
        c.observe("a", 99)
    assert c.input_watermark("a") == 100
    assert c.coalesced == 100
    # Publishing the same value again is not a regression.
    assert c.observe("a", 100) == 100


def test_regression_raises_even_for_an_idle_input():
    c = WatermarkCoalescer(["a", "b"])
    c.observe("a", 100)
    c.mark_idle("a")
    with pytest.raises(WatermarkRegressionError):
        c.observe("a", 50)


def test_idle_input_is_excluded_from_the_minimum():
    c = WatermarkCoalescer(["fast", "silent"])
    c.observe("fast", 1_000)
    assert c.coalesced == BEGINNING_OF_TIME  # "silent" holds everything back
    assert c.mark_idle("silent") == 1_000
    assert c.is_idle("silent") and not c.is_idle("fast")
    assert c.observe("fast", 2_000) == 2_000


def test_all_inputs_idle_holds_where_it_is():
    c = WatermarkCoalescer(["a", "b"])
    c.observe("a", 10)
    c.observe("b", 20)
    assert c.coalesced == 10
    c.mark_idle("a")
    assert c.coalesced == 20
    # Everything idle: hold, do not jump ahead to END_OF_TIME nor fall back.
    assert c.mark_idle("b") == 20
    assert c.coalesced == 20


def test_all_idle_from_the_start_stays_at_beginning_of_time():
    c = WatermarkCoalescer(["a"])
    assert c.mark_idle("a") == BEGINNING_OF_TIME


def test_waking_idle_input_behind_does_not_move_coalesced_back():
    c = WatermarkCoalescer(["a", "b"])
    c.observe("b", 5)
    c.mark_idle("b")
    assert c.observe("a", 50) == 50
    # b wakes up behind the coalesced value: it rejoins the minimum, but the value holds.
    assert c.observe("b", 20) == 50
    assert not c.is_idle("b")
    assert c.observe("a", 60) == 50  # min(60, 20) = 20 < 50: still held
    assert c.observe("b", 55) == 55  # now the minimum of both passes the held value
    assert c.observe("b", 100) == 60


def test_restored_coalescer_never_reports_below_its_checkpointed_value():
    c = WatermarkCoalescer(["a"], coalesced=1_000)
    assert c.coalesced == 1_000
    assert c.observe("a", 10) == 1_000
    assert c.observe("a", 2_000) == 2_000


def test_end_of_time_inputs():
    c = WatermarkCoalescer(["a", "b"])
    c.observe("a", END_OF_TIME)
    assert c.observe("b", 7) == 7
    assert c.observe("b", END_OF_TIME) == END_OF_TIME


def test_misuse_errors():
    with pytest.raises(ValueError, match="at least one input"):
        WatermarkCoalescer([])
    c = WatermarkCoalescer(["a"])
    with pytest.raises(KeyError):
        c.observe("nope", 1)
    with pytest.raises(KeyError):
        c.mark_idle("nope")


@pytest.mark.parametrize("seed", range(8))
def test_randomized_coalescing_matches_plain_model_and_is_monotonic(seed):
    rng = random.Random(seed)
    names = [f"in{i}" for i in range(rng.randint(1, 6))]
    c = WatermarkCoalescer(names)
    # Independent model of the rules.
    published = {n: BEGINNING_OF_TIME for n in names}
    idle: set[str] = set()
    held = BEGINNING_OF_TIME
    previous = c.coalesced
    for _ in range(300):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.15:
            got = c.mark_idle(name)
            idle.add(name)
        elif roll < 0.25 and published[name] > BEGINNING_OF_TIME:
            with pytest.raises(WatermarkRegressionError):
                c.observe(name, published[name] - rng.randint(1, 50))
            got = c.coalesced
        else:
            base = published[name] if published[name] > BEGINNING_OF_TIME else rng.randint(0, 100)
            value = base + rng.choice([0, 0, 1, 5, 30, 200])
            got = c.observe(name, value)
            published[name] = value
            idle.discard(name)
        active = [published[n] for n in names if n not in idle]
        if active:
            held = max(held, min(active))
        assert got == held == c.coalesced
        assert got >= previous, "coalesced watermark went backwards"
        previous = got
        assert c.inputs() == published
        assert all(c.is_idle(n) == (n in idle) for n in names)


def test_input_points_carry_the_coalesced_watermark_before_and_after_each_sender_advance():
    c = WatermarkCoalescer(["a", "b"])
    assert c.advance("a", 10) == Segment(BEGINNING_OF_TIME, BEGINNING_OF_TIME)  # b holds the minimum
    assert c.advance("b", 7) == Segment(BEGINNING_OF_TIME, 7)
    assert c.advance("b", 30) == Segment(7, 10)
    assert c.advance("a", 25) == Segment(10, 25)


def test_output_watermark_follows_each_input_point_and_never_goes_back():
    assert output_watermarks(BEGINNING_OF_TIME, [Segment(BEGINNING_OF_TIME, 5)]) == [5]
    assert output_watermarks(100, [Segment(100, 100), Segment(100, 150), Segment(150, END_OF_TIME)]) == [
        100, 150, END_OF_TIME]
    # A published watermark is never withdrawn, even if the input's coalesced value is lower (a
    # restored coalescer after a pipeline change).
    assert output_watermarks(200, [Segment(50, 60)]) == [200]
