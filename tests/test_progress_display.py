"""The shared progress display: fits the terminal without cutting a number, shows progress before
the first report arrives, falls back to plain lines off a terminal, and its rates cover this run."""

from __future__ import annotations

import io
import re
import time

import pytest

from millstream.console.progress import (
    ComputationStatus,
    ProgressDisplay,
    RateMeter,
    Snapshot,
    format_time,
    last_lines,
)
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME

START = 1_296_086_400_000  # 2011-01-27T00:00:00Z


def zeitgeist_like(records: int = 123_456) -> Snapshot:
    return Snapshot(
        records=records, total=303_420, records_at_start=100_000, newest_event=START + 195_000,
        computations=(ComputationStatus("windower", START + 192_500, 123_456, 17, 0),
                      ComputationStatus("model_calculator", START + 190_000, 23_456, 0, 2),
                      ComputationStatus("spike_detector", BEGINNING_OF_TIME, 0, 15, 0),
                      ComputationStatus("dip_detector", END_OF_TIME, 9_999_999, 0, None)),
        totals=(("spikes", "3"), ("dips", "12")))


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_fits_the_terminal_and_keeps_every_number(width: int) -> None:
    lines = last_lines(zeitgeist_like(), width)
    assert all(len(line) <= width for line in lines), lines
    text = " ".join(lines)
    for number in ("123,456", "23,456", "9,999,999", "17", "15", "303,420"):
        assert re.search(rf"(?<![\d,]){re.escape(number)}(?!,?\d)", text), (number, lines)
    assert "spikes 3" in text and "dips 12" in text
    assert "00:03:12.5" in text and "done" in text  # watermarks as times, never raw milliseconds
    assert str(BEGINNING_OF_TIME) not in text and str(END_OF_TIME) not in text
    assert "2.5s" in text  # the windower's lag behind the newest event


def test_watermarks_read_as_times() -> None:
    assert format_time(START + 61_000) == "00:01:01.0"
    assert format_time(BEGINNING_OF_TIME) == "-" and format_time(END_OF_TIME) == "done"


def test_plain_lines_start_before_the_first_report_and_end_with_the_last() -> None:
    out = io.StringIO()
    display = ProgressDisplay(stream=out, live=False, plain_every=0.1, unit="searches", waiting="starting Spark")
    with display:
        time.sleep(0.35)  # Spark starting: nothing reported yet
        display.update(zeitgeist_like(150_000))
    lines = out.getvalue().splitlines()
    waiting = [line for line in lines if "starting Spark" in line]
    assert len(waiting) >= 2 and lines[0] == waiting[0]  # shown at once, and again while it waits
    assert "searches 150,000/303,420" in lines[-1] and "windower 00:03:12.5 lag 2.5s" in lines[-1]
    assert "late 17" in lines[-1] and "late 15" in lines[-1] and "dead 2" in lines[-1]


def test_live_display_redraws_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with ProgressDisplay(stream=out, refresh_per_second=20) as display:
        time.sleep(0.2)
        display.update(zeitgeist_like())
        time.sleep(0.2)
    screen = out.getvalue()
    assert "starting" in screen and "\x1b[" in screen  # drawn in place with terminal controls
    assert "123,456" in screen and "dead letters" in screen


def test_rates_count_this_run_only() -> None:
    meter = RateMeter(started=0.0)
    snapshot = zeitgeist_like(130_000)  # 100,000 of them read by an earlier run
    assert snapshot.records_this_run == 30_000
    assert meter.overall(10.0, snapshot.records_this_run) == 3_000
