"""The EventReader: a millstream computation that reads the primary log into the EventStore.

As in the paper, the EventReader appends every primary event (query) to the EventStore's log files,
records the log file map as it goes (every W ms of event time or M bytes per source), and fills the
cache. The joiner then finds queries by id: in the cache if it was filled in the same process, else
with a bounded scan of the log (`millstream.photon.eventstore`).

One writer per directory: the EventLogWriter's map entries must follow the order of the bytes in the
log. So every primary record goes to one key (`PRIMARY_KEY`): millstream runs one key in one place at a
time. Between two micro-batches Spark may run that key in another Python worker process; a process
whose log file is no longer the newest in the directory closes it and starts a new one before writing,
so the log stays in write order whatever process wrote it. It checks once per step: a new step has a
new planned wall time.

Writing is a side effect outside Spark's commit: a micro-batch that is run again writes its queries
again. That is harmless (a lookup stops at the first copy, and copies are identical), so the
EventReader needs no exactly-once protocol of its own.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from millstream.model.computation import Computation, ComputationInfo, Context
from millstream.model.records import Record
from millstream.photon.adapter import JoinAdapter
from millstream.photon.eventstore import CachedEventStore, EventLogWriter, LogEventStore, TieredEventStore

PRIMARY_KEY = "primary"
_LOG_FILE = re.compile(r"events-(\d{8})\.jsonl")

# One cache per EventStore directory per process: filled by an EventReader running in this process,
# read by joiners running in it (the paper's cache is a shared service; here it is shared only by the
# computations Spark happens to run in one Python worker).
_CACHES: dict[str, CachedEventStore] = {}
_CACHES_LOCK = threading.Lock()


def process_cache(directory: str, max_events: int = 100_000, max_age_ms: int = 10 * 60_000) -> CachedEventStore:
    """This process's cache of the EventStore in `directory` (made on first use).

    >>> import tempfile; folder = tempfile.mkdtemp()
    >>> process_cache(folder) is process_cache(folder)
    True
    """
    key = os.path.abspath(directory)
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = CachedEventStore(max_events=max_events, max_age_ms=max_age_ms)
        return cache


def open_event_store(directory: str, max_disorder_ms: int) -> TieredEventStore:
    """The EventStore a joiner reads: this process's cache, then the log (`max_disorder_ms` bounds how
    far out of timestamp order a source's primary events reach the log, late ones included)."""
    return TieredEventStore(process_cache(directory), LogEventStore(directory, max_disorder_ms=max_disorder_ms))


def primary_key(record: Record[Any]) -> str:
    """Key extractor of the primary log: every record to one key (one writer, see the module doc)."""
    return PRIMARY_KEY


def newest_log_file(directory: str) -> int:
    """The sequence number of the newest log file in `directory` (0: none)."""
    matches = (_LOG_FILE.fullmatch(name) for name in os.listdir(directory))
    return max((int(m.group(1)) for m in matches if m), default=0)


class EventReader(Computation):
    """Appends each primary record's value to the EventStore in `directory`, under the adapter's
    query id. Produces nothing; a record whose id is not a Photon event id raises (add it with
    on_error="dead_letter" to route such records to dead letters).

    >>> import tempfile
    >>> from millstream import Pipeline, ScriptedInjector
    >>> from millstream.testing import PipelineHarness
    >>> folder = tempfile.mkdtemp()
    >>> pipeline = (Pipeline("reader")
    ...     .add_injector("queries", ScriptedInjector("queries", []), "queries")
    ...     .add_computation("event_reader", EventReader(folder), {"queries": primary_key}))
    >>> harness = PipelineHarness(pipeline)
    >>> harness.feed("queries", [Record("web:1:1000:0", {"text": "shoes"}, 1_000)], watermark=1_000)
    >>> harness.run()
    >>> LogEventStore(folder).lookup("web:1:1000:0")
    {'text': 'shoes'}
    """

    def __init__(self, directory: str, adapter: JoinAdapter | None = None, *, map_every_ms: int = 1_000,
                 map_every_bytes: int = 256 * 1024, max_file_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = os.path.abspath(directory)
        self.adapter = adapter or JoinAdapter()
        self.map_every_ms = map_every_ms
        self.map_every_bytes = map_every_bytes
        self.max_file_bytes = max_file_bytes
        self._writer: EventLogWriter | None = None
        self._step_wall: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_writer"] = None  # files and connections are opened where the computation runs
        state["_step_wall"] = None
        return state

    def setup(self, info: ComputationInfo) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._writer, self._step_wall = None, None

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _writer_for_step(self, wall_time: int) -> EventLogWriter:
        if self._writer is None or (wall_time != self._step_wall
                                    and newest_log_file(self.directory) != self._writer.file_seq):
            if self._writer is not None:
                self._writer.close()
            self._writer = EventLogWriter(self.directory, map_every_ms=self.map_every_ms,
                                          map_every_bytes=self.map_every_bytes, max_file_bytes=self.max_file_bytes,
                                          cache=process_cache(self.directory))
        self._step_wall = wall_time
        return self._writer

    def process_record(self, ctx: Context, record: Record[Any]) -> None:
        writer = self._writer_for_step(ctx.wall_time)
        writer.append(self.adapter.query_id(record), record.value)
        # Visible to joiners in other processes at once: the line and, when one is due, its map entry.
        writer.flush()
