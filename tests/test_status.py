"""`millstream status`: pending timers counted by the executor (harness), the root reader (backlog,
history, refusals), the table and the HTML page, on roots built here. The same command on a root a
real Spark run wrote: tests/spark/test_status_spark.py."""

from __future__ import annotations

import json
from collections import Counter
from html.parser import HTMLParser

import pytest

from clitools import assert_refused, run
from millstream import END_OF_TIME, Computation, GeneratorInjector, MapState, Pipeline, Record, TimeDomain
from millstream.console.options import UsageError
from millstream.console.status import format_watermark, lag_series, read_root, render_html, throughput_series
from millstream.spark.layout import RootLayout
from millstream.testing import PipelineHarness

KEYS = ("a", "b", "c", "d", "e")
FAR_WALL_TIME = 4_102_444_800_000  # 2100-01-01: a wall timer that stays pending


class Buckets(Computation):
    """Counts records per key and second; each second's count goes out when the watermark passes it.
    Every key also holds one wall-time timer far in the future."""

    counts = MapState[int, int]("counts")

    def process_record(self, ctx, record):
        second = record.timestamp // 1_000
        ctx.state(self.counts).put(second, ctx.state(self.counts).get(second, 0) + 1)
        ctx.set_timer(f"s{second}", (second + 1) * 1_000)
        ctx.set_timer("reminder", FAR_WALL_TIME, TimeDomain.WALL_TIME)

    def process_timer(self, ctx, timer):
        second = timer.time // 1_000 - 1
        ctx.produce(Record(ctx.key, ctx.state(self.counts).get(second), timer.time), "counts")
        ctx.state(self.counts).remove(second)


class Totals(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "totals")


def pipeline(events: int) -> Pipeline:
    injector = GeneratorInjector(lambda i: Record(KEYS[i % len(KEYS)], i, 7 * i), events, lambda n: 7 * n,
                                 max_records_per_read=100)
    return (Pipeline("status").add_injector("src", injector, "in")
            .add_computation("buckets", Buckets(), ["in"], ["counts"])
            .add_computation("totals", Totals(), ["counts"], ["totals"]))


def test_pending_timers_are_counted_as_they_are_set_and_fire():
    harness = PipelineHarness(pipeline(1_000))
    harness.feed("src", [Record(k, 1, t) for k, t in (("a", 100), ("a", 900), ("a", 1_500), ("b", 2_500))],
                  watermark=0)
    harness.run()
    # a: seconds 0 and 1 and its reminder; b: second 2 and its reminder. Setting a timer again is one.
    assert harness.metrics("buckets").pending_timers == 5
    harness.advance_watermark("src", 2_000)
    harness.run()
    assert harness.metrics("buckets").pending_timers == 3  # seconds 0 and 1 fired
    harness.advance_watermark("src", END_OF_TIME)
    harness.run()
    assert harness.metrics("buckets").pending_timers == 2  # the reminders
    assert harness.metrics("totals").pending_timers == 0


def test_pending_timers_over_a_whole_run_on_the_harness():
    harness = PipelineHarness(pipeline(1_000))
    harness.run_injectors()
    assert harness.metrics("buckets").pending_timers == len(KEYS)
    assert harness.metrics("totals").records == len(Counter((KEYS[i % 5], 7 * i // 1_000) for i in range(1_000)))


# -- the reader, on roots laid out as the Spark runner writes them (spark/commit.py) ------------------
def write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def fake_root(tmp_path, upstream_head=7, read_up_to=3):
    root = tmp_path / "root"
    write(root / "pipeline.json", RootLayout("demo", 4, {"up": None, "down": None}, None).record())
    for position in range(upstream_head + 1):
        write(root / "log" / "up" / f"{position:012d}.json", {"type": "batch"})
    write(root / "log" / "up" / "HEAD.json", {"position": 2})  # a stale hint: the reader probes on
    marks = {"up": [(1_000, 0, 0), (2_000, 500, 100), (3_000, 2_400, 300)],
             "down": [(1_100, 0, 0), (2_100, 400, 40), (3_100, 2_000, 100)]}
    for name, points in marks.items():
        for batch, (wall, mark, records) in enumerate(points):
            write(root / "status" / name / "history" / f"{batch:012d}.json",
                  {"batch": batch, "low_watermark": mark, "wall_ms": wall, "metrics": {"records": records}})
    write(root / "status" / "up" / "latest.json",
          {"batch": 2, "low_watermark": 2_400, "senders": {"in/src#0": 2_500}, "idle_inputs": ["in/src#0"],
           "keyed_watermarks": {"ship": 1_000},
           "metrics": {"records": 300, "late": 4, "duplicates": 2, "dead_letters": 1, "pending_timers": 9},
           "wall_ms": 3_000})
    write(root / "status" / "down" / "latest.json",
          {"batch": 2, "low_watermark": 2_000, "input_watermark": 2_400, "hold": 2_000,
           "positions": {"out/up#0": read_up_to},
           "metrics": {"records": 100, "late": 0}, "wall_ms": 3_100})
    return root


def test_reader_counts_backlog_and_reads_counters_and_history(tmp_path):
    view = read_root(str(fake_root(tmp_path, upstream_head=7, read_up_to=3)))
    down, up = view.computations  # in the layout's order: by name
    assert (up.name, down.name) == ("up", "down")
    assert down.backlog == 4 and up.backlog == 0  # up's log has entries 4..7 that down has not read
    assert (up.records, up.late, up.duplicates, up.dead_letters, up.pending_timers) == (300, 4, 2, 1, 9)
    assert up.idle_inputs == ["in/src#0"] and down.idle_inputs == []
    assert up.keyed_watermarks == {"ship": 1_000} and down.keyed_watermarks == {}
    assert up.watermarks_text().splitlines()[1] == "ship: " + format_watermark(1_000)
    assert down.hold == 2_000 and down.watermarks_text().splitlines()[1] == "held by a timer"
    assert up.hold is None and "held" not in up.watermarks_text()
    assert down.pending_timers is None  # not recorded: shown as unknown, not as 0
    assert [p.records for p in up.history] == [0, 100, 300]
    assert up.lag_ms(10_000) == 10_000 - 2_400
    assert throughput_series(up) == [(2.0, 100.0), (3.0, 200.0)]
    assert lag_series(down) == [(1.1, 1.1), (2.1, 1.7), (3.1, 1.1)]


def test_html_page_has_one_series_per_computation_per_chart(tmp_path):
    page = render_html(read_root(str(fake_root(tmp_path))))

    class Series(HTMLParser):
        found: list = []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "polyline":
                self.found.append((attrs["data-computation"], len(attrs["points"].split())))

    parser = Series()
    parser.feed(page)
    # lag: a point per batch; throughput: one per interval between batches.
    assert sorted(parser.found) == [("down", 2), ("down", 3), ("up", 2), ("up", 3)]
    assert "<script" not in page and "src=" not in page and "href=" not in page
    assert "<br>ship: " in page  # the keyed watermark, under the low watermark


def test_status_command_prints_the_table_and_writes_the_page(tmp_path):
    root = fake_root(tmp_path)
    ran = run("millstream", "status", str(root), "--html", str(tmp_path / "page.html"))
    assert ran.code == 0, ran.output
    up = next(line for line in ran.stdout.splitlines() if line.startswith("│ up "))
    cells = [c.strip() for c in up.strip("│").split("│")]
    assert cells[4:10] == ["0", "300", "4", "2", "1", "9"]  # backlog, records, late, dups, dead, timers
    assert (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_status_into_a_pipe_prints_whole_titles_and_cells(tmp_path):
    """Out of a terminal, without COLUMNS (a pipe, a file, CI's log), rich drew the table in 80
    columns and cut every title and many cells ("com…", "bat…")."""
    import os
    import subprocess
    import sys

    from clitools import ROOT_DIR

    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    env["PYTHONPATH"] = ROOT_DIR
    done = subprocess.run([sys.executable, "-m", "millstream", "status", str(fake_root(tmp_path))], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    titles = next(line for line in done.stdout.splitlines() if "computation" in line)
    for title in ("computation", "batches", "low watermark (UTC)", "backlog", "records", "timers", "idle inputs"):
        assert title in titles, done.stdout
    assert "…" not in done.stdout, done.stdout
    assert max(map(len, done.stdout.splitlines())) < 200


def test_status_refuses_what_is_not_a_root(tmp_path):
    assert_refused(run("millstream", "status", str(tmp_path / "missing")), "no such directory")
    assert_refused(run("millstream", "status", str(tmp_path)), "holds no millstream pipeline")
    with pytest.raises(UsageError):
        read_root(str(tmp_path))
    write(tmp_path / "pipeline.json", {**RootLayout("demo", 4, {"up": None}, None).record(), "format": 2})
    assert_refused(run("millstream", "status", str(tmp_path)), "written by another version of millstream")
    from millstream.spark.layout import LAYOUT_FORMAT

    for cut_short in ("", "garbage", json.dumps({"format": LAYOUT_FORMAT})):  # cut short, another tool's, no fields
        (tmp_path / "pipeline.json").write_text(cut_short)
        with pytest.raises(UsageError, match=r"its pipeline.json is not a millstream layout"):
            read_root(str(tmp_path))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match=r"a-file: a file, not a root directory"):
        read_root(str(tmp_path / "a-file"))


def test_watch_follows_the_root_until_ctrl_c(tmp_path):
    """Into a file (not a terminal) --watch prints one table after another; Ctrl-C ends it with 0."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from clitools import ROOT_DIR

    root = fake_root(tmp_path)
    output = tmp_path / "watch.txt"

    def wait_for(text):
        deadline = time.time() + 120
        while time.time() < deadline:
            if text in output.read_text():
                return True
            time.sleep(0.2)
        return False

    env = {**os.environ, "PYTHONPATH": ROOT_DIR, "COLUMNS": "120"}
    with open(output, "w") as out:
        watch = subprocess.Popen([sys.executable, "-m", "millstream", "status", str(root), "--watch",
                                  "--interval", "0.2"], stdout=out, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert wait_for("│     300 │")
            write(root / "status" / "up" / "latest.json", {"batch": 3, "low_watermark": 3_000,
                                                          "metrics": {"records": 123_456}, "wall_ms": 4_000})
            assert wait_for("123,456")
        finally:
            watch.send_signal(signal.SIGINT)
            _, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
