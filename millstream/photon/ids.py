"""Photon-style unique event ids: server, process, timestamp and a sequence number.

Every server makes its own ids without coordination, as in the paper (server IP, process id,
timestamp). The timestamp is part of the id on purpose: the EventStore finds a query in its log by the
id's time, and the IdRegistry routes a click id by its event time.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass

from millstream.photon.clock import Clock, wall_clock_ms


@dataclass(frozen=True, slots=True)
class EventId:
    """`<server>:<process>:<timestamp_ms>:<sequence>`; `server` may itself contain colons (IPv6).

    >>> event_id = EventId.parse("10.0.0.7:4242:1700000000123:5")
    >>> event_id.timestamp_ms, event_id.source
    (1700000000123, '10.0.0.7:4242')
    >>> str(event_id)
    '10.0.0.7:4242:1700000000123:5'
    """

    server: str
    process: str
    timestamp_ms: int
    sequence: int

    def __post_init__(self) -> None:
        if not self.server or not self.process or ":" in self.process:
            raise ValueError("server and process must be non-empty and process may not contain ':'")
        if self.sequence < 0:
            raise ValueError("sequence must not be negative")

    def __str__(self) -> str:
        return f"{self.server}:{self.process}:{self.timestamp_ms}:{self.sequence}"

    @property
    def source(self) -> str:
        """The server process that made the id: its ids' timestamps never go back."""
        return f"{self.server}:{self.process}"

    @classmethod
    def parse(cls, text: str) -> "EventId":
        # From the right: the last three fields have no colons, the server may have some.
        parts = text.rsplit(":", 3)
        if len(parts) != 4:
            raise ValueError(f"not an event id (server:process:timestamp:sequence): {text!r}")
        server, process, timestamp, sequence = parts
        try:
            return cls(server, process, int(timestamp), int(sequence))
        except ValueError:
            raise ValueError(f"not an event id (server:process:timestamp:sequence): {text!r}") from None


def event_time_of(event_id: str) -> int:
    """The timestamp (ms) inside a Photon-style event id.

    >>> event_time_of("web-3:17:1700000000123:0")
    1700000000123
    """
    return EventId.parse(event_id).timestamp_ms


class EventIdGenerator:
    """Unique ids for one server process; timestamps never go back, even if the clock does.

    Two ids in the same millisecond differ by their sequence number; the sequence restarts at 0 when
    the timestamp moves on. Thread-safe.

    >>> ticks = iter([1000, 1000, 999, 1001])
    >>> generator = EventIdGenerator("web-3", "17", clock=lambda: next(ticks))
    >>> [generator.next_id() for _ in range(4)]
    ['web-3:17:1000:0', 'web-3:17:1000:1', 'web-3:17:1000:2', 'web-3:17:1001:0']
    """

    def __init__(self, server: str | None = None, process: str | None = None, clock: Clock | None = None) -> None:
        self.server = server or socket.gethostname()
        self.process = process or str(os.getpid())
        EventId(self.server, self.process, 0, 0)  # validates the two names once
        self._clock: Clock = clock or wall_clock_ms
        self._lock = threading.Lock()
        self._last_ms: int | None = None
        self._sequence = 0

    def next_event_id(self, timestamp_ms: int | None = None) -> EventId:
        """The next id, stamped now (or at `timestamp_ms` if later than the previous id's stamp)."""
        with self._lock:
            stamp = self._clock() if timestamp_ms is None else timestamp_ms
            if self._last_ms is not None and stamp <= self._last_ms:
                stamp = self._last_ms
                self._sequence += 1
            else:
                self._sequence = 0
            self._last_ms = stamp
            return EventId(self.server, self.process, stamp, self._sequence)

    def next_id(self, timestamp_ms: int | None = None) -> str:
        return str(self.next_event_id(timestamp_ms))
