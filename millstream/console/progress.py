"""The live progress display every millstream command shares (the demos and `millstream run`).

On a terminal: a multi-line table redrawn in place with `rich`, sized to the terminal's width, one
row per computation (low watermark as a time, lag, records, late, dead letters) under a header with
the elapsed time, the records read in this run, their rate and any totals the command adds
(anomalies so far). Elsewhere (a pipe, a log file, CI): one plain line every `plain_every` seconds.

The display is redrawn by its own thread, so it shows the elapsed time while Spark starts, before the
first progress report arrives. It writes to a duplicate of the terminal's file descriptor: Spark's
JVM, started meanwhile, gets stdout pointed at its log file for a moment and must not take the
display with it.

Numbers come from one `Snapshot` at a time, and the final summary is printed from the last one, so
what the display showed last and what the summary says are the same numbers.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Sequence

from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME

NOT_YET = "-"


def format_time(ms: int | None) -> str:
    """A low watermark as a readable UTC time of day (milliseconds are event times since the epoch).

    >>> format_time(1_296_086_400_000 + 192_500)
    '00:03:12.5'
    >>> format_time(BEGINNING_OF_TIME), format_time(END_OF_TIME)
    ('-', 'done')
    """
    if ms is None or ms <= BEGINNING_OF_TIME:
        return NOT_YET
    if ms >= END_OF_TIME:
        return "done"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 100_000}"


def format_duration(ms: float | None) -> str:
    """A lag in the largest unit that keeps it short.

    >>> format_duration(1_250), format_duration(95_000), format_duration(7_380_000), format_duration(None)
    ('1.2s', '1m35s', '2h03m', '-')
    """
    if ms is None:
        return NOT_YET
    seconds = max(0.0, ms / 1000)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


@dataclass(frozen=True)
class ComputationStatus:
    """One computation as the display shows it. `dead_letters` is None when the runner does not
    report them.

    >>> ComputationStatus("windower", 1_000, records=5, late=1).dead_letters is None
    True
    """

    name: str
    low_watermark: int
    records: int
    late: int
    dead_letters: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one redraw shows. `records` counts the input records read so far over the whole
    run (resumed runs included); `records_at_start` what had been read before this process started,
    so rates cover this run only. `newest_event`: the newest event time read (lags are measured from
    it; None: no lags). `totals`: extra (label, value) pairs, e.g. anomalies so far.

    >>> s = Snapshot(130, (ComputationStatus("count", 1_000, 130, 0),), records_at_start=100, newest_event=2_500)
    >>> s.records_this_run, s.lag(s.computations[0])
    (30, 1500.0)
    """

    records: int
    computations: tuple[ComputationStatus, ...]
    total: int | None = None
    records_at_start: int = 0
    newest_event: int | None = None
    totals: tuple[tuple[str, str], ...] = ()
    phase: str = "running"

    @property
    def records_this_run(self) -> int:
        return self.records - self.records_at_start

    def lag(self, status: ComputationStatus) -> float | None:
        if self.newest_event is None or status.low_watermark <= BEGINNING_OF_TIME:
            return None
        if status.low_watermark >= END_OF_TIME:
            return 0.0
        return float(max(0, self.newest_event - status.low_watermark))

    @property
    def done(self) -> bool:
        return bool(self.computations) and all(c.low_watermark >= END_OF_TIME for c in self.computations)


class RateMeter:
    """Records per second of this run: over the last `window_s` seconds while running (Spark reports
    in micro-batch steps), over the whole run for the summary.

    >>> meter = RateMeter(started=100.0, window_s=2.0)
    >>> meter.add(102.0, 1_000); meter.add(104.0, 5_000)
    >>> meter.recent(), meter.overall(104.0, 5_000)
    (2000.0, 1250.0)
    """

    def __init__(self, started: float, window_s: float = 30.0) -> None:
        self.started = started
        self.window_s = window_s
        self.samples: list[tuple[float, int]] = [(started, 0)]

    def add(self, now: float, records_this_run: int) -> None:
        self.samples.append((now, records_this_run))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.pop(0)

    def recent(self) -> float:
        (t0, r0), (t1, r1) = self.samples[0], self.samples[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0

    @staticmethod
    def overall_of(elapsed: float, records_this_run: int) -> float:
        return records_this_run / elapsed if elapsed > 0 else 0.0

    def overall(self, now: float, records_this_run: int) -> float:
        return self.overall_of(now - self.started, records_this_run)


def plain_line(snapshot: Snapshot, elapsed: float, rate: float, unit: str = "records") -> str:
    """The display as one line, for logs.

    >>> s = Snapshot(50, (ComputationStatus("count", 2_000, 50, 1, 0),), total=100, newest_event=3_500)
    >>> plain_line(s, 12.0, 4.2)
    '[12s] records 50/100 (50%) 4/s | count 00:00:02.0 lag 1.5s in 50 late 1 dead 0'
    """
    head = f"[{elapsed:.0f}s] {snapshot.phase + ' | ' if snapshot.phase != 'running' else ''}{unit} {snapshot.records:,}"
    if snapshot.total:
        head += f"/{snapshot.total:,} ({snapshot.records / snapshot.total:.0%})"
    head += f" {rate:,.0f}/s"
    parts = [head]
    for c in snapshot.computations:
        part = f"{c.name} {format_time(c.low_watermark)}"
        lag = snapshot.lag(c)
        if lag is not None and c.low_watermark < END_OF_TIME:
            part += f" lag {format_duration(lag)}"
        part += f" in {c.records:,} late {c.late:,}"
        if c.dead_letters is not None:
            part += f" dead {c.dead_letters:,}"
        parts.append(part)
    parts += [f"{label} {value}" for label, value in snapshot.totals]
    return " | ".join(parts)


_COLUMNS = (("low watermark", "left"), ("lag", "right"), ("records", "right"), ("late", "right"),
            ("dead letters", "right"))
_NAME_MIN = 8
_GAP = 2


def render(snapshot: Snapshot | None, elapsed: float, rate: float, unit: str = "records",
           waiting: str = "starting", width: int = 100) -> Any:
    """The display as a rich renderable for a terminal `width` columns wide: a header, then a table
    with a row per computation, or, where the table would not fit, a short wrapped line for each.
    Nothing is ever cut: a number cut short would be a wrong number."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if snapshot is None:
        return Text(f"{waiting} ... {elapsed:.0f}s", style="bold")
    header = Text()
    header.append(f"{elapsed:.0f}s ", style="bold")
    if snapshot.phase != "running":
        header.append(f"{snapshot.phase}  ")
    header.append(f"{unit} {snapshot.records:,}")
    if snapshot.total:
        header.append(f"/{snapshot.total:,} ({snapshot.records / snapshot.total:.0%})")
    header.append(f"  {rate:,.0f}/s")
    for label, value in snapshot.totals:
        header.append(f"  {label} ")
        header.append(value, style="bold")
    rows = []
    for c in snapshot.computations:
        lag = snapshot.lag(c)
        rows.append((c.name, format_time(c.low_watermark), format_duration(lag) if lag is not None else NOT_YET,
                     f"{c.records:,}", f"{c.late:,}", NOT_YET if c.dead_letters is None else f"{c.dead_letters:,}"))
    widths = [max([len(title)] + [len(row[i]) for row in rows]) for i, (title, _) in enumerate(_COLUMNS, start=1)]
    if _NAME_MIN + sum(widths) + _GAP * len(widths) > width:
        lines = [header]
        for row in rows:
            lines.append(Text(f"{row[0]}: lw {row[1]}, lag {row[2]}, in {row[3]}, late {row[4]}, dead {row[5]}"))
        return Group(*lines)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="dim", padding=(0, _GAP // 2))
    # Only the names give way on a narrow terminal.
    table.add_column("computation", overflow="ellipsis", min_width=_NAME_MIN)
    for (title, justify), widest in zip(_COLUMNS, widths):
        table.add_column(title, justify=justify, no_wrap=True, min_width=widest)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*row)
    return Group(header, table)


def _terminal_stream(stream: IO[str]) -> IO[str]:
    """A duplicate of `stream`'s descriptor (see the module doc), or `stream` if it has none."""
    try:
        return os.fdopen(os.dup(stream.fileno()), "w", buffering=1, encoding=getattr(stream, "encoding", None))
    except (AttributeError, OSError, ValueError):
        return stream


class ProgressDisplay:
    """Shows Snapshots as they come (`update`); `close()` leaves the last one on screen.

    Use as a context manager around the run. `live=None` picks the live display on a terminal and
    plain lines otherwise.

    >>> import io
    >>> out = io.StringIO()
    >>> with ProgressDisplay(stream=out, live=False, waiting="starting Spark") as display:
    ...     display.update(Snapshot(10, (ComputationStatus("count", 1_000, 10, 0),), total=20))
    >>> print(out.getvalue())
    [0s] starting Spark ...
    [0s] records 10/20 (50%) ... | count 00:00:01.0 in 10 late 0
    <BLANKLINE>
    """

    def __init__(self, stream: IO[str] | None = None, live: bool | None = None, plain_every: float = 10.0,
                 unit: str = "records", waiting: str = "starting", refresh_per_second: float = 4.0) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.plain_every = plain_every
        self.unit = unit
        self.waiting = waiting
        self.refresh_per_second = refresh_per_second
        self.started = time.time()
        self.meter = RateMeter(self.started)
        self.snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Any = None
        self._out: IO[str] | None = None
        self._last_plain = 0.0

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "ProgressDisplay":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.started = time.time()
        self.meter = RateMeter(self.started)
        self.stream.flush()
        self._out = _terminal_stream(self.stream)
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self._out, force_terminal=True)
            self._live = Live(console=console, get_renderable=self._renderable, transient=False,
                              refresh_per_second=self.refresh_per_second, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start()
        else:
            self._emit_plain(force=True)
            self._thread = threading.Thread(target=self._plain_loop, name="millstream-progress", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        elif self.snapshot is not None:  # else the line saying it is waiting is there already
            self._emit_plain(force=True)
        if self._out is not None and self._out is not self.stream:
            self._out.flush()
            self._out.close()
        self._out = None

    # -- data ---------------------------------------------------------------------------------
    def update(self, snapshot: Snapshot) -> None:
        with self._lock:
            self.snapshot = snapshot
            self.meter.add(time.time(), snapshot.records_this_run)

    def elapsed(self) -> float:
        return time.time() - self.started

    def rate(self) -> float:
        return self.meter.recent()

    def summary_rate(self) -> float:
        """Records per second over this whole run (what the final summary prints)."""
        snapshot = self.snapshot
        return self.meter.overall(time.time(), snapshot.records_this_run) if snapshot else 0.0

    # -- drawing ------------------------------------------------------------------------------
    def _renderable(self) -> Any:
        with self._lock:
            width = self._live.console.width if self._live is not None else 100
            return render(self.snapshot, self.elapsed(), self.rate(), self.unit, self.waiting, width)

    def _emit_plain(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_plain < self.plain_every:
            return
        self._last_plain = now
        with self._lock:
            snapshot = self.snapshot
            line = (plain_line(snapshot, self.elapsed(), self.rate(), self.unit) if snapshot is not None
                    else f"[{self.elapsed():.0f}s] {self.waiting} ...")
        out = self._out or self.stream
        out.write(line + "\n")
        out.flush()

    def _plain_loop(self) -> None:
        while not self._stop.wait(0.25):
            self._emit_plain()


def last_lines(snapshot: Snapshot, width: int, elapsed: float = 0.0, rate: float = 0.0,
               unit: str = "records") -> list[str]:
    """The live display as it would be drawn on a terminal `width` columns wide (for tests and
    for checking the layout)."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=False, color_system=None).print(
        render(snapshot, elapsed, rate, unit, width=width))
    return buffer.getvalue().rstrip("\n").split("\n")


__all__: Sequence[str] = ["ComputationStatus", "ProgressDisplay", "RateMeter", "Snapshot", "format_duration",
                          "format_time", "last_lines", "plain_line", "render"]
