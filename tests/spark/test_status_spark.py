"""`millstream status` on a root a real Spark run wrote: the numbers agree with the input counted here,
the HTML page parses and plots one series per computation, and the progress feed saw every query."""

import os
import socket
import sys
from collections import Counter
from html.parser import HTMLParser
from urllib.parse import urlparse

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from clitools import run  # noqa: E402
from test_status import KEYS, Buckets, Totals  # noqa: E402

from millstream import GeneratorInjector, Pipeline, Record  # noqa: E402
from millstream.spark.runner import SparkRunner  # noqa: E402

EVENTS = 1_200


class Charts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.chart = None
        self.series = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure":
            self.chart = attrs["data-chart"]
            self.series[self.chart] = []
        if tag == "polyline" and attrs.get("class") == "series":
            self.series[self.chart].append((attrs["data-computation"], attrs["points"].split()))


def _outside_address():
    """This machine's address on its default route (no packet is sent), or None without one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def table_rows(text):
    """computation -> {column: cell} of the status table as printed."""
    lines = [line for line in text.splitlines() if line.startswith(("┃", "│"))]
    header_lines = [line for line in lines if line.startswith("┃")]
    # Headers may wrap over several lines: join each column's pieces.
    columns = None
    for line in header_lines:
        cells = [c.strip() for c in line.strip("┃").split("┃")]
        columns = cells if columns is None else [f"{a} {b}".strip() for a, b in zip(columns, cells)]
    rows = {}
    for line in lines:
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            rows[cells[0]] = dict(zip(columns, cells))
    return rows


def number(cell):
    return int(cell.replace(",", ""))


def test_status_of_a_real_run(spark, tmp_path):
    keys = KEYS  # a local: the lambdas travel to Spark's workers by value
    injector = GeneratorInjector(lambda i: Record(keys[i % len(keys)], i, 7 * i), EVENTS, lambda n: 7 * n,
                                 max_records_per_read=300)
    pipeline = (Pipeline("status").add_injector("src", injector, "in")
                # Weak: fused into totals' query, so the run starts one Spark query, not two (a second
                # query's source worker misses Spark's 10 s connect-back on a loaded machine).
                .add_computation("buckets", Buckets(), ["in"], ["counts"], production="weak")
                .add_computation("totals", Totals(), ["counts"], ["totals"]))
    root = str(tmp_path / "root")
    runner = SparkRunner(pipeline, root=root, spark=spark, trigger_ms=200)
    seen = []
    runner.on_query_progress(lambda computation, progress: seen.append((computation, progress.numInputRows)))
    runner.run(timeout=400)

    # Spark's UI is on and listens on the loopback interface only.
    port = urlparse(spark.sparkContext.uiWebUrl).port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    outside = _outside_address()
    if outside is not None:
        with pytest.raises(OSError):
            socket.create_connection((outside, port), timeout=5).close()

    # Spark's progress feed: the pipeline's one query (totals, buckets fused in) reported its batches.
    assert {c for c, _ in seen} == {"totals"} and len(seen) >= 2
    assert any(rows > 0 for _, rows in seen)  # the batches that read input

    buckets = Counter((KEYS[i % len(KEYS)], 7 * i // 1_000) for i in range(EVENTS))
    page = tmp_path / "status.html"
    ran = run("millstream", "status", root, "--html", str(page), timeout=120)
    assert ran.code == 0, ran.output
    rows = table_rows(ran.stdout)
    assert set(rows) == {"buckets", "totals"}
    assert number(rows["buckets"]["records"]) == EVENTS
    assert number(rows["totals"]["records"]) == len(buckets)  # one count per (key, second)
    for name in ("buckets", "totals"):
        assert rows[name]["low watermark (UTC)"] == "end" and rows[name]["lag"] == "done"
        assert number(rows[name]["late"]) == number(rows[name]["dups"]) == number(rows[name]["dead"]) == 0
        assert number(rows[name]["backlog"]) == 0
    # Every bucket timer fired; one far-future wall timer per key is still pending.
    assert number(rows["buckets"]["timers"]) == len(KEYS)
    assert number(rows["totals"]["timers"]) == 0

    charts = Charts()
    charts.feed(page.read_text())
    assert set(charts.series) == {"lag", "throughput"}
    for chart, series in charts.series.items():
        assert sorted(name for name, _ in series) == ["buckets", "totals"], chart
        assert all(points for _, points in series), chart
    assert "http" not in page.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")  # no outside refs
