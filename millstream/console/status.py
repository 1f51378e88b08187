"""`millstream status ROOT`: what a Spark run keeps under its root, per computation, read without Spark.

The runner's publisher writes, for every computation and every published batch (spark/commit.py):

    pipeline.json                               the computations (written first into every root)
    status/<computation>/latest.json            status after the newest batch: watermarks, counters, ...
    status/<computation>/history/<batch>.json   the same, trimmed, per batch: the plots' series
    log/<computation>/HEAD.json                 the newest position of its publication log

From those: per computation its low watermark and how far it lags behind the wall clock, its
*backlog* (entries its upstream computations have published that it has not read yet), records,
late records, duplicates, dead letters, timers pending and the inputs it counts as idle. Injectors
are not polled: their backlog is not known from the root alone.

`render_html` writes a page with no outside references (inline SVG): watermark lag and throughput
over time, one series per computation.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from millstream.console.options import UsageError
from millstream.core.plan import producer_of
from millstream.core.watermarks import declared_keyed
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME
from millstream.spark.rootfiles import LAYOUT_FILE, latest_status, read_status_history


@dataclass
class HistoryPoint:
    """One published batch of a computation."""

    batch: int
    wall_ms: int
    low_watermark: int
    records: int | None  # None in roots written before the history kept counters


@dataclass
class ComputationView:
    name: str
    batches: int = 0
    low_watermark: int = BEGINNING_OF_TIME
    input_watermark: int = BEGINNING_OF_TIME
    wall_ms: int = 0  # when its newest batch was published
    records: int = 0
    late: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    pending_timers: int | None = None  # None: not recorded by the runner that wrote the root
    backlog: int = 0
    idle_inputs: list[str] = field(default_factory=list)
    history: list[HistoryPoint] = field(default_factory=list)
    keyed_watermarks: dict[str, int] = field(default_factory=dict)  # published, per watermark key
    hold: int | None = None  # the earliest hold of its pending timers, if any (core/watermarks.py)

    def watermarks_text(self) -> str:
        """The low watermark, "held by a timer" when a hold keeps it behind the input watermark,
        then each keyed watermark on its own line ("ship: ...")."""
        lines = [format_watermark(self.low_watermark)]
        if self.hold is not None and self.hold < self.input_watermark:
            lines.append("held by a timer")
        lines += [f"{key}: {format_watermark(mark)}" for key, mark in sorted(self.keyed_watermarks.items())]
        return "\n".join(lines)

    def lag_ms(self, now_ms: int) -> int | None:
        """How far the low watermark trails the wall clock; None before it has moved or once done."""
        if self.low_watermark <= BEGINNING_OF_TIME or self.low_watermark >= END_OF_TIME:
            return None
        return now_ms - self.low_watermark


@dataclass
class RootView:
    root: str
    pipeline: str
    computations: list[ComputationView]
    read_at_ms: int


def _storage(root: str) -> Any:
    from millstream.spark.storage import Storage, is_local

    if not root.strip():
        raise UsageError("the root is empty; give a millstream root, e.g. millstream status ./millstream-data")
    if is_local(root) and not os.path.isdir(root):
        raise UsageError(f"{root}: {'a file, not a root directory' if os.path.exists(root) else 'no such directory'}")
    storage = Storage(root)
    if not storage.exists(LAYOUT_FILE):
        raise UsageError(f"{root} holds no millstream pipeline (no {LAYOUT_FILE}; run one with this --root first)")
    return storage


def read_root(root: str, with_history: bool = True) -> RootView:
    """Everything `millstream status` shows, read from the files under `root`."""
    from millstream.spark.layout import read_layout
    from millstream.spark.publog import PublicationLog

    storage = _storage(root)
    try:
        layout = read_layout(storage)
    except (ValueError, KeyError, TypeError) as error:  # not JSON, or not a layout (cut short, another tool's)
        raise UsageError(f"{root}: its {LAYOUT_FILE} is not a millstream layout ({error})") from None
    if layout is None:
        raise UsageError(f"{root} holds a pipeline written by another version of millstream ({LAYOUT_FILE})")
    names = list(layout.computations)
    heads = {name: PublicationLog(root, name).head() for name in names}
    views = []
    for name in names:
        status = storage.read_json(latest_status(name)) or {}
        metrics = status.get("metrics", {})
        view = ComputationView(
            name=name, batches=status.get("batch", -1) + 1,
            low_watermark=status.get("low_watermark", BEGINNING_OF_TIME),
            input_watermark=status.get("input_watermark", BEGINNING_OF_TIME), wall_ms=status.get("wall_ms", 0),
            records=metrics.get("records", 0), late=metrics.get("late", 0),
            duplicates=metrics.get("duplicates", 0), dead_letters=metrics.get("dead_letters", 0),
            # No status yet: nothing ran, nothing pending. A status without the counter: not recorded.
            pending_timers=metrics.get("pending_timers") if status else 0, idle_inputs=list(status.get("idle_inputs", [])),
            keyed_watermarks=declared_keyed(status.get("keyed_watermarks", {})), hold=status.get("hold"))
        for sender, position in status.get("positions", {}).items():
            producer = producer_of(sender)
            if producer in heads:
                view.backlog += max(0, heads[producer] - position)
        if with_history:
            view.history = _history(storage, name)
        views.append(view)
    return RootView(root, layout.pipeline, views, int(time.time() * 1000))


def _history(storage: Any, computation: str) -> list[HistoryPoint]:
    return [HistoryPoint(entry.get("batch", -1), entry.get("wall_ms", 0), entry.get("low_watermark", BEGINNING_OF_TIME),
                         (entry.get("metrics") or {}).get("records"))
            for entry in read_status_history(storage, computation)]


# -- the table --------------------------------------------------------------------------------------
def format_duration(ms: int | None) -> str:
    """A lag in a few characters.

    >>> [format_duration(v) for v in (None, 850, 12_400, 3_900_000, 200_000_000)]
    ['-', '850 ms', '12.4 s', '1.1 h', '2.3 d']
    """
    if ms is None:
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1_000:
        return f"{sign}{ms} ms"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if ms >= size:
            return f"{sign}{ms / size:.1f} {unit}"
    return f"{sign}{ms / 1_000:.1f} s"


EPOCH_2000_MS = 946_684_800_000


def format_watermark(mark: int) -> str:
    """A watermark as a UTC time when it looks like one (after 2000), else in milliseconds.

    >>> [format_watermark(m) for m in (-(2**47), 2**47 - 1, 12_500, 1_795_462_105_038)]
    ['start', 'end', '12500', '2026-11-23 19:28:25.038']
    """
    if mark <= BEGINNING_OF_TIME:
        return "start"
    if mark >= END_OF_TIME:
        return "end"
    if mark < EPOCH_2000_MS:
        return str(mark)
    seconds, millis = divmod(mark, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}"


def status_table(view: RootView) -> Any:
    """The rich Table of a root's computations."""
    from rich.table import Table

    table = Table(title=f"{view.pipeline}  ({view.root})", title_justify="left")
    columns = ("computation", "batches", "low watermark (UTC)", "lag", "backlog", "records", "late", "dups",
               "dead", "timers", "idle inputs")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index in (0, 10) else "right")
    for c in view.computations:
        table.add_row(c.name, f"{c.batches:,}", c.watermarks_text(),
                      "done" if c.low_watermark >= END_OF_TIME else format_duration(c.lag_ms(view.read_at_ms)),
                      f"{c.backlog:,}", f"{c.records:,}", f"{c.late:,}", f"{c.duplicates:,}", f"{c.dead_letters:,}",
                      "?" if c.pending_timers is None else f"{c.pending_timers:,}",
                      ", ".join(c.idle_inputs) or "-")
    return table


# -- the page ---------------------------------------------------------------------------------------
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def lag_series(c: ComputationView) -> list[tuple[float, float]]:
    """(wall seconds, watermark lag in seconds) per batch where the watermark is a time."""
    return [(p.wall_ms / 1000, (p.wall_ms - p.low_watermark) / 1000) for p in c.history
            if BEGINNING_OF_TIME < p.low_watermark < END_OF_TIME and p.wall_ms]


def throughput_series(c: ComputationView) -> list[tuple[float, float]]:
    """(wall seconds, records per second since the batch before) per batch."""
    points = [p for p in c.history if p.records is not None and p.wall_ms]
    return [(b.wall_ms / 1000, (b.records - a.records) * 1000 / (b.wall_ms - a.wall_ms))  # type: ignore[operator]
            for a, b in zip(points, points[1:]) if b.wall_ms > a.wall_ms]


def _chart(title: str, unit: str, series: Sequence[tuple[str, list[tuple[float, float]]]], start: float,
           end: float, from_zero: bool = True) -> str:
    """One SVG line chart; `from_zero=False` fits the y axis to the values (a lag of years behind the
    wall clock, for replayed data, still shows how it moves)."""
    width, height, left, bottom, top, right = 760, 260, 70, 30, 20, 150
    xs = [x - start for _, points in series for x, _ in points] or [0.0, 1.0]
    ys = [y for _, points in series for _, y in points] or [0.0, 1.0]
    x0, x1 = 0.0, max(max(xs), end - start, 1e-9)
    y0, y1 = (min(0.0, min(ys)) if from_zero else min(ys)), max(max(ys), 1e-9)
    if y1 <= y0:
        y0, y1 = y0 - 1, y1 + 1

    def sx(x: float) -> float:
        return left + (x - start - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
             f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" font-size="11">{_label(y1)}</text>',
             f'<text x="{left - 6}" y="{height - bottom}" text-anchor="end" font-size="11">{_label(y0)}</text>',
             f'<text x="{width - right}" y="{height - 8}" text-anchor="end" font-size="11">{x1:,.0f} s</text>',
             f'<text x="{left}" y="{height - 8}" font-size="11">0 s</text>',
             f'<text x="{left + 4}" y="{top - 6}" font-size="11">{html.escape(unit)}</text>']
    for index, (name, points) in enumerate(series):
        color = COLORS[index % len(COLORS)]
        coordinates = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        parts.append(f'<polyline class="series" data-computation="{html.escape(name)}" fill="none" '
                     f'stroke="{color}" stroke-width="1.5" points="{coordinates}"/>')
        parts.append(f'<text x="{width - right + 8}" y="{top + 14 * (index + 1)}" font-size="12" '
                     f'fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1_000 else f"{value:.3g}"


def _html_cell(value: Any) -> str:
    text = f"{value:,}" if isinstance(value, int) else str(value)
    return html.escape(text).replace("\n", "<br>")


def render_html(view: RootView) -> str:
    """A self-contained page: the status table and, per computation, watermark lag and throughput
    over wall time (x: seconds since the first batch shown)."""
    lags = [(c.name, lag_series(c)) for c in view.computations]
    rates = [(c.name, throughput_series(c)) for c in view.computations]
    times = [x for _, points in lags + rates for x, _ in points]
    start = min(times) if times else 0.0
    end = max(times) if times else 0.0  # both charts on one time axis
    rows = "\n".join(
        "<tr>" + "".join(f"<td>{_html_cell(v)}</td>" for v in (
            c.name, c.batches, c.watermarks_text(),
            "done" if c.low_watermark >= END_OF_TIME else format_duration(c.lag_ms(view.read_at_ms)),
            c.backlog, c.records, c.late, c.duplicates, c.dead_letters,
            "?" if c.pending_timers is None else c.pending_timers, ", ".join(c.idle_inputs) or "-")) + "</tr>"
        for c in view.computations)
    header = "".join(f"<th>{h}</th>" for h in ("computation", "batches", "low watermark", "lag", "backlog",
                                                "records", "late", "duplicates", "dead letters", "timers",
                                                "idle inputs"))
    read_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(view.read_at_ms / 1000))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>millstream status: {html.escape(view.pipeline)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} td:first-child{{text-align:left}}</style>
</head><body>
<h1>{html.escape(view.pipeline)}</h1>
<p>root {html.escape(view.root)}, read {read_at}</p>
<table><tr>{header}</tr>
{rows}
</table>
<h2 id="lag">Watermark lag behind wall time</h2>
<figure class="chart" data-chart="lag">
{_chart("watermark lag", "lag (s)", lags, start, end, from_zero=False)}
</figure>
<h2 id="throughput">Throughput</h2>
<figure class="chart" data-chart="throughput">
{_chart("throughput", "records/s", rates, start, end)}
</figure>
</body></html>
"""
