"""The EventStore: find a primary event (a query) by its id, as Photon's joiner does for each click.

Two stores, as in the paper:

- `CachedEventStore`: recent events in memory. Most clicks come soon after their query, so most
  lookups end here.
- `LogEventStore`: everything else, from the primary log itself. While the events are read,
  `EventLogWriter` appends them to JSON-lines files and, every W ms of event time or M bytes per
  source, records where it is in a *log file map* (source, timestamp -> file, byte offset) kept in
  SQLite (the paper keeps it in Bigtable). Ids carry their source and timestamp
  (`<server>:<process>:<timestamp_ms>:<seq>`), so a lookup reads two map entries around the id's
  time and scans only the bytes between them.

`TieredEventStore` asks the cache first, then the log.

Why two map entries bound the scan: a source's events reach the log at most `max_disorder_ms` out of
timestamp order (if a is written before b, then ts(a) <= ts(b) + D). So a map entry stamped before
ts - D was written before the event, and one stamped after ts + D was written after it.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Protocol

from millstream.photon.clock import Clock, wall_clock_ms
from millstream.photon.ids import EventId

Event = dict[str, Any]
"""A primary event: any JSON object."""

LOG_MAP_FILE = "log-map.sqlite"


_LOG_FILE = re.compile(r"events-(\d{8})\.jsonl")


def log_file_name(file_seq: int) -> str:
    return f"events-{file_seq:08d}.jsonl"


class EventStore(Protocol):
    """Anything that finds a primary event by its id."""

    def lookup(self, query_id: str) -> Event | None: ...


@dataclass(frozen=True, slots=True)
class EventStoreStats:
    """Counters of a store; each store fills the ones it has, `+` adds two stores' counters."""

    cache_hits: int = 0
    cache_misses: int = 0
    evicted_by_age: int = 0
    evicted_by_size: int = 0
    log_lookups: int = 0
    log_hits: int = 0
    bytes_scanned: int = 0

    def __add__(self, other: "EventStoreStats") -> "EventStoreStats":
        return EventStoreStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


class CachedEventStore:
    """Recent events in memory, at most `max_events` of them and none older than `max_age_ms`.

    Age is time since insertion by `clock` (the paper's cache expires entries after minutes); when
    full, the oldest insertion goes first. Thread-safe.

    >>> now = [0]
    >>> cache = CachedEventStore(max_events=2, max_age_ms=1000, clock=lambda: now[0])
    >>> cache.put("q1", {"query": "shoes"}); cache.put("q2", {"query": "hats"})
    >>> cache.lookup("q1")
    {'query': 'shoes'}
    >>> cache.put("q3", {"query": "socks"})  # full: q1, the oldest insertion, goes
    >>> cache.lookup("q1") is None, len(cache)
    (True, 2)
    >>> now[0] = 1001; cache.lookup("q2") is None  # expired
    True
    """

    def __init__(self, max_events: int = 100_000, max_age_ms: int = 10 * 60_000, clock: Clock | None = None) -> None:
        if max_events < 1 or max_age_ms < 0:
            raise ValueError("max_events must be positive and max_age_ms not negative")
        self.max_events = max_events
        self.max_age_ms = max_age_ms
        self._clock: Clock = clock or wall_clock_ms
        self._entries: OrderedDict[str, tuple[int, Event]] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._by_age = self._by_size = 0

    def _evict_expired(self, now_ms: int) -> None:
        while self._entries:
            inserted_ms, _ = next(iter(self._entries.values()))
            if now_ms - inserted_ms <= self.max_age_ms:
                return
            self._entries.popitem(last=False)
            self._by_age += 1

    def put(self, query_id: str, event: Event) -> None:
        with self._lock:
            now_ms = self._clock()
            self._entries.pop(query_id, None)  # re-inserting makes the entry young again
            self._entries[query_id] = (now_ms, event)
            self._evict_expired(now_ms)
            while len(self._entries) > self.max_events:
                self._entries.popitem(last=False)
                self._by_size += 1

    def lookup(self, query_id: str) -> Event | None:
        with self._lock:
            self._evict_expired(self._clock())
            entry = self._entries.get(query_id)
            if entry is None:
                self._misses += 1
                return None
            self._hits += 1
            return entry[1]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def stats(self) -> EventStoreStats:
        with self._lock:
            return EventStoreStats(cache_hits=self._hits, cache_misses=self._misses,
                                   evicted_by_age=self._by_age, evicted_by_size=self._by_size)


def _open_log_map(directory: str) -> sqlite3.Connection:
    connection = sqlite3.connect(os.path.join(directory, LOG_MAP_FILE), timeout=60.0, isolation_level=None,
                                 check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS log_map (source TEXT NOT NULL, timestamp_ms INTEGER NOT NULL, "
        "file_seq INTEGER NOT NULL, offset INTEGER NOT NULL)")
    # By time, for the two entries around an id; by position, for a source's first entry.
    connection.execute("CREATE INDEX IF NOT EXISTS log_map_by_time ON log_map (source, timestamp_ms)")
    connection.execute("CREATE INDEX IF NOT EXISTS log_map_by_position ON log_map (source, file_seq, offset)")
    return connection


def _id_prefix(query_id: str) -> bytes:
    """How a log line holding `query_id` starts (the writer puts the id first, compactly)."""
    return b'{"id":' + json.dumps(query_id, ensure_ascii=False).encode() + b","


class EventLogWriter:
    """Appends primary events to JSON-lines log files and maintains the log file map.

    A map entry (source, timestamp, file, offset) is written for the first event of each source in each
    file, and then whenever a source's event is `map_every_ms` of event time after its last entry or
    `map_every_bytes` of log after it. Log lines are flushed before the map entries that point at them
    are committed, so a reader never follows an entry to bytes that are not there. A writer always
    starts a new file, so a restarted writer never appends to a file a crash may have cut short. One
    writer per directory.

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> with EventLogWriter(directory, map_every_ms=1000) as writer:
    ...     for ts in range(1_000, 10_000, 500):
    ...         writer.append(f"web-1:7:{ts}:0", {"query": f"q{ts}"})
    >>> writer.map_entries  # one per 1000 ms of event time
    9
    >>> LogEventStore(directory).lookup("web-1:7:4500:0")
    {'query': 'q4500'}
    """

    def __init__(self, directory: str | os.PathLike[str], *, map_every_ms: int = 1000,
                 map_every_bytes: int = 256 * 1024, max_file_bytes: int = 64 * 1024 * 1024,
                 flush_every_events: int = 1000, cache: CachedEventStore | None = None) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.map_every_ms = map_every_ms
        self.map_every_bytes = map_every_bytes
        self.max_file_bytes = max_file_bytes
        self.flush_every_events = flush_every_events
        self.cache = cache
        self._map = _open_log_map(self.directory)
        existing = [_LOG_FILE.fullmatch(name) for name in os.listdir(self.directory)]
        self.file_seq = max((int(match.group(1)) for match in existing if match), default=0) + 1
        self._file = open(os.path.join(self.directory, log_file_name(self.file_seq)), "ab")
        self._file_bytes = 0
        self._last_entry: dict[str, tuple[int, int]] = {}  # source -> (timestamp, offset) in this file
        self._pending: list[tuple[str, int, int, int]] = []
        self._unflushed_events = 0
        self.events = self.bytes_written = self.map_entries = 0

    def append(self, query_id: str, event: Event) -> None:
        event_id = EventId.parse(query_id)
        line = json.dumps({"id": query_id, "event": event}, separators=(",", ":"),
                          ensure_ascii=False).encode() + b"\n"
        if self._file_bytes and self._file_bytes + len(line) > self.max_file_bytes:
            self._roll()
        offset = self._file_bytes
        last = self._last_entry.get(event_id.source)
        if (last is None or event_id.timestamp_ms >= last[0] + self.map_every_ms
                or offset - last[1] >= self.map_every_bytes):
            self._pending.append((event_id.source, event_id.timestamp_ms, self.file_seq, offset))
            self._last_entry[event_id.source] = (event_id.timestamp_ms, offset)
        self._file.write(line)
        self._file_bytes += len(line)
        self.events += 1
        self.bytes_written += len(line)
        if self.cache is not None:
            self.cache.put(query_id, event)
        self._unflushed_events += 1
        if self._unflushed_events >= self.flush_every_events:
            self.flush()

    def flush(self) -> None:
        """Make appended events visible to `LogEventStore` readers."""
        self._file.flush()
        if self._pending:
            self._map.execute("BEGIN IMMEDIATE")
            self._map.executemany("INSERT INTO log_map VALUES (?, ?, ?, ?)", self._pending)
            self._map.execute("COMMIT")
            self.map_entries += len(self._pending)
            self._pending = []
        self._unflushed_events = 0

    def _roll(self) -> None:
        self.flush()
        self._file.close()
        self.file_seq += 1
        self._file = open(os.path.join(self.directory, log_file_name(self.file_seq)), "ab")
        self._file_bytes = 0
        self._last_entry = {}  # every source gets an entry at its first event in the new file

    def close(self) -> None:
        self.flush()
        self._file.close()
        self._map.close()

    def __enter__(self) -> "EventLogWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LogEventStore:
    """Finds events in the logs written by `EventLogWriter`, reading a small byte range per lookup.

    `max_disorder_ms` must bound how far out of timestamp order one source's events reach the log (0
    for sources whose events arrive in order); a larger value scans more bytes, a too small one can
    miss events. Thread-safe. See `EventLogWriter` for an example.

    >>> import tempfile
    >>> LogEventStore(tempfile.mkdtemp()).lookup("web-1:7:4500:0") is None  # empty directory
    True
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_disorder_ms: int = 0) -> None:
        if max_disorder_ms < 0:
            raise ValueError("max_disorder_ms must not be negative")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.max_disorder_ms = max_disorder_ms
        self._map = _open_log_map(self.directory)
        self._lock = threading.Lock()
        self._lookups = self._hits = self._bytes = 0

    def _scan_range(self, event_id: EventId) -> tuple[tuple[int, int], tuple[int, int] | None] | None:
        """(start, end) positions (file_seq, offset) to scan; end None means to the end of the log."""
        source, ts, slack = event_id.source, event_id.timestamp_ms, self.max_disorder_ms
        start = self._map.execute(
            "SELECT file_seq, offset FROM log_map WHERE source = ? AND timestamp_ms < ? "
            "ORDER BY timestamp_ms DESC LIMIT 1", (source, ts - slack)).fetchone()
        if start is None:  # nothing early enough: from the source's first entry
            start = self._map.execute(
                "SELECT file_seq, offset FROM log_map WHERE source = ? ORDER BY file_seq, offset LIMIT 1",
                (source,)).fetchone()
            if start is None:
                return None
        end = self._map.execute(
            "SELECT file_seq, offset FROM log_map WHERE source = ? AND timestamp_ms > ? "
            "ORDER BY timestamp_ms LIMIT 1", (source, ts + slack)).fetchone()
        return (int(start[0]), int(start[1])), None if end is None else (int(end[0]), int(end[1]))

    def lookup(self, query_id: str) -> Event | None:
        try:
            event_id = EventId.parse(query_id)
        except ValueError:
            return None  # not a Photon id: no log holds it
        with self._lock:
            self._lookups += 1
            bounds = self._scan_range(event_id)
        if bounds is None:
            return None
        event, scanned = self._scan(_id_prefix(query_id), *bounds)
        with self._lock:
            self._bytes += scanned
            self._hits += event is not None
        return event

    def _scan(self, prefix: bytes, start: tuple[int, int],
              end: tuple[int, int] | None) -> tuple[Event | None, int]:
        scanned = 0
        file_seq, offset = start
        while end is None or (file_seq, offset) < end:
            path = os.path.join(self.directory, log_file_name(file_seq))
            if not os.path.exists(path):
                break
            with open(path, "rb") as log:
                log.seek(offset)
                position = offset
                for line in log:
                    if end is not None and (file_seq, position) >= end:
                        return None, scanned
                    if not line.endswith(b"\n"):
                        break  # the writer is still writing this line
                    scanned += len(line)
                    position += len(line)
                    if line.startswith(prefix):
                        return json.loads(line)["event"], scanned
            file_seq, offset = file_seq + 1, 0
        return None, scanned

    def stats(self) -> EventStoreStats:
        with self._lock:
            return EventStoreStats(log_lookups=self._lookups, log_hits=self._hits, bytes_scanned=self._bytes)

    def close(self) -> None:
        self._map.close()


class TieredEventStore:
    """The cache first, then the log; an event found in the log is put in the cache.

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> with EventLogWriter(directory) as writer:
    ...     writer.append("web-1:7:1000:0", {"query": "shoes"})
    >>> store = TieredEventStore(CachedEventStore(), LogEventStore(directory))
    >>> store.lookup("web-1:7:1000:0"), store.lookup("web-1:7:1000:0")
    ({'query': 'shoes'}, {'query': 'shoes'})
    >>> stats = store.stats(); (stats.cache_hits, stats.log_lookups)
    (1, 1)
    """

    def __init__(self, cache: CachedEventStore, log: LogEventStore, populate_cache: bool = True) -> None:
        self.cache = cache
        self.log = log
        self.populate_cache = populate_cache

    def lookup(self, query_id: str) -> Event | None:
        event = self.cache.lookup(query_id)
        if event is not None:
            return event
        event = self.log.lookup(query_id)
        if event is not None and self.populate_cache:
            self.cache.put(query_id, event)
        return event

    def stats(self) -> EventStoreStats:
        return self.cache.stats() + self.log.stats()
