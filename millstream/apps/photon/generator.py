"""A deterministic query log and click log, written live the way log servers write them.

Queries come from `servers` web servers at about `queries_per_second`, each with a Photon event id
(`web-<s>:<process>:<timestamp>:<seq>`). A query gets 0-2 clicks (on average `clicks_per_query`); a
click comes after its query by a delay with a long tail (log-normal, median `click_delay_median_ms`,
capped at `max_click_delay_ms`). To make the join hard the way Photon's is:

- `late_query_fraction` of the clicked queries reach the query log only *after* their first click
  (up to `late_query_max_ms` later): the click must wait for its query;
- `lost_query_fraction` of the clicked queries never reach the query log: their clicks are unjoinable;
- `duplicate_click_fraction` of the clicks are logged twice (the second copy up to 3 s later, with
  its own record id, the same click id).

Every record has a "logged at" time; the log writer puts the records logged in each `file_every_ms`
window into one file per log, named by the window's start (`queries-<ms>.jsonl`), renamed into place
when the window ends, so the pipelines' FileInjectors (creation="name") read them as they appear. All
times are real epoch milliseconds counted from `start_ms`, the moment the traffic starts: event times
are the wall clock's, as in a live system (the registry's resharding and GC are in wall-clock time).

Everything follows from the config and its seed: the same config gives the same logs.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping

from millstream.injectors.files import DONE_MARKER


@dataclass(frozen=True)
class PhotonDataConfig:
    """The generator's settings (see the module doc); `start_ms` is filled in when the traffic starts.

    >>> config = PhotonDataConfig(seconds=5, queries_per_second=20, start_ms=1_700_000_000_000)
    >>> data = generate(config)
    >>> len(data.queries) == sum(1 for q in data.queries if q.logged_at_ms is not None) + len(data.lost_queries)
    True
    """

    seed: int = 7
    seconds: float = 60.0
    queries_per_second: float = 30.0
    clicks_per_query: float = 0.4
    servers: int = 3
    click_delay_median_ms: int = 1_500
    click_delay_sigma: float = 1.1
    max_click_delay_ms: int = 30_000
    late_query_fraction: float = 0.05
    late_query_max_ms: int = 6_000
    lost_query_fraction: float = 0.03
    duplicate_click_fraction: float = 0.03
    file_every_ms: int = 1_000
    start_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("seconds", "queries_per_second"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("late_query_fraction", "lost_query_fraction", "duplicate_click_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1")
        if not 0 <= self.clicks_per_query <= 2:
            raise ValueError("clicks_per_query must be between 0 and 2")
        if self.servers < 1 or self.file_every_ms < 10 or self.max_click_delay_ms < 1:
            raise ValueError("servers must be >= 1, file_every_ms >= 10 and max_click_delay_ms >= 1")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PhotonDataConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def traffic_end_ms(self) -> int:
        """When the last record can be logged."""
        tail = self.max_click_delay_ms + max(self.late_query_max_ms, 3_000)
        return self.start_ms + int(self.seconds * 1000) + tail


@dataclass(frozen=True)
class LoggedRecord:
    """A record of one of the logs and when it is logged (None: never)."""

    key: str
    value: dict[str, Any]
    timestamp: int
    id: str
    logged_at_ms: int | None

    def line(self) -> str:
        return json.dumps({"key": self.key, "value": self.value, "timestamp": self.timestamp, "id": self.id},
                          sort_keys=True)


@dataclass(frozen=True)
class PhotonData:
    queries: list[LoggedRecord]  # every query made, logged or not
    clicks: list[LoggedRecord]  # every click record logged (duplicates included)

    @property
    def lost_queries(self) -> list[LoggedRecord]:
        return [q for q in self.queries if q.logged_at_ms is None]


def _click_delay(rng: random.Random, config: PhotonDataConfig) -> int:
    delay = config.click_delay_median_ms * math.exp(rng.gauss(0.0, config.click_delay_sigma))
    return max(50, min(config.max_click_delay_ms, int(delay)))


def generate(config: PhotonDataConfig) -> PhotonData:
    """The logs of `config`: the same config, the same records (see the module doc)."""
    rng = random.Random(config.seed)
    start, duration = config.start_ms, int(config.seconds * 1000)
    count = int(config.seconds * config.queries_per_second)
    queries: list[LoggedRecord] = []
    clicks: list[LoggedRecord] = []
    sequence: dict[tuple[int, int], int] = {}
    click_seq: dict[int, int] = {}
    for index in range(count):
        at = start + int(index * duration / count) + rng.randrange(max(1, duration // count))
        server = rng.randrange(config.servers)
        seq = sequence.get((server, at), 0)
        sequence[(server, at)] = seq + 1
        query_id = f"web-{server}:{4000 + server}:{at}:{seq}"
        value = {"text": f"query {rng.randrange(5_000)}", "server": f"web-{server}", "ads": rng.randrange(1, 6)}
        n_clicks = sum(rng.random() < config.clicks_per_query / 2 for _ in range(2))
        times = sorted(at + _click_delay(rng, config) for _ in range(n_clicks))
        logged: int | None = at
        if times and rng.random() < config.lost_query_fraction:
            logged = None
        elif times and rng.random() < config.late_query_fraction:
            logged = times[0] + rng.randrange(200, max(201, config.late_query_max_ms))
        queries.append(LoggedRecord(query_id, value, at, f"q{index}", logged))
        for position, click_at in enumerate(times):
            click_server = rng.randrange(config.servers)
            cseq = click_seq.get(click_at, 0)
            click_seq[click_at] = cseq + 1
            click_id = f"click-{click_server}:{5000 + click_server}:{click_at}:{cseq}"
            click_value = {"query_id": query_id, "ad": f"ad-{rng.randrange(1_000)}", "slot": position,
                           "cost_micros": rng.randrange(10_000, 2_000_000)}
            copies = 2 if rng.random() < config.duplicate_click_fraction else 1
            for copy in range(copies):
                logged_click = click_at if copy == 0 else click_at + rng.randrange(100, 3_000)
                clicks.append(LoggedRecord(click_id, click_value, click_at, f"c{len(clicks)}", logged_click))
    return PhotonData(queries, clicks)


def window_files(records: list[LoggedRecord], config: PhotonDataConfig, prefix: str) -> dict[int, list[LoggedRecord]]:
    """Window start -> the records logged in that window (in logging order)."""
    windows: dict[int, list[LoggedRecord]] = {}
    for record in sorted((r for r in records if r.logged_at_ms is not None), key=lambda r: (r.logged_at_ms, r.id)):
        offset = (record.logged_at_ms - config.start_ms) // config.file_every_ms  # type: ignore[operator]
        windows.setdefault(config.start_ms + offset * config.file_every_ms, []).append(record)
    return windows


class LogWriter:
    """Writes the query and click logs of `data` into `query_log` and `click_log` in real time: each
    window's file appears when the window ends; `_DONE` follows the last one. Runs in a thread
    (`start`); `visible_ms` records when each click record's file appeared (for latencies).

    >>> import tempfile, os
    >>> base = tempfile.mkdtemp()
    >>> config = PhotonDataConfig(seconds=0.2, queries_per_second=10, file_every_ms=50, max_click_delay_ms=50,
    ...                           late_query_max_ms=50, start_ms=int(time.time() * 1000))
    >>> writer = LogWriter(config, generate(config), os.path.join(base, "q"), os.path.join(base, "c")).start()
    >>> writer.join(30); writer.done
    True
    >>> os.path.exists(os.path.join(base, "q", "_DONE"))
    True
    """

    def __init__(self, config: PhotonDataConfig, data: PhotonData, query_log: str, click_log: str,
                 on_file: Callable[[str, int, int], None] | None = None) -> None:
        self.config = config
        self.query_log = query_log
        self.click_log = click_log
        self.on_file = on_file
        self.query_windows = window_files(data.queries, config, "queries")
        self.click_windows = window_files(data.clicks, config, "clicks")
        self.visible_ms: dict[str, int] = {}  # click record id -> when its file appeared
        self.written = {"queries": 0, "clicks": 0}
        self.done = False
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="photon-log-writer", daemon=True)

    def start(self) -> "LogWriter":
        os.makedirs(self.query_log, exist_ok=True)
        os.makedirs(self.click_log, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            config = self.config
            starts = sorted(set(self.query_windows) | set(self.click_windows))
            last = max(starts, default=config.start_ms)
            for window in range(config.start_ms, max(last, config.traffic_end_ms) + 1, config.file_every_ms):
                wait = (window + config.file_every_ms) / 1000 - time.time()
                if wait > 0 and self._stop.wait(wait):
                    return
                self._write(self.query_log, f"queries-{window}.jsonl", self.query_windows.get(window, []), "queries")
                clicks = self.click_windows.get(window, [])
                visible = self._write(self.click_log, f"clicks-{window}.jsonl", clicks, "clicks")
                for record in clicks:
                    self.visible_ms[record.id] = visible
            for directory in (self.query_log, self.click_log):
                open(os.path.join(directory, DONE_MARKER), "w").close()
            self.done = True
        except BaseException as error:  # the orchestrator reports it
            self.error = error

    def _write(self, directory: str, name: str, records: list[LoggedRecord], log: str) -> int:
        """Write a file complete under a hidden name, then rename it into the log; returns when it
        became visible (ms)."""
        if not records:
            return int(time.time() * 1000)
        temporary = os.path.join(directory, "." + name)
        with open(temporary, "w", encoding="utf-8") as out:
            out.writelines(record.line() + "\n" for record in records)
        os.replace(temporary, os.path.join(directory, name))
        visible = os.stat(os.path.join(directory, name)).st_ctime_ns // 1_000_000
        self.written[log] += len(records)
        if self.on_file is not None:
            self.on_file(log, len(records), visible)
        return visible
