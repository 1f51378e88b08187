"""Records, timers and the time constants every layer shares.

Times are integers in milliseconds since the Unix epoch: Spark's event-time watermark has millisecond
granularity, so a finer unit would be rounded away on the Spark runner.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

# Lowest possible watermark: nothing has been promised yet.
BEGINNING_OF_TIME: int = -(2**47)
# Watermark of an input that will never produce again (a finished injector). Kept well inside the
# range Python's datetime and Spark's TimestampType both accept, because the Spark runner carries
# watermarks in a timestamp column.
END_OF_TIME: int = 2**47 - 1


class TimeDomain(str, enum.Enum):
    """Which clock a timer follows."""

    LOW_WATERMARK = "low_watermark"
    """Fires once the computation's input low watermark reaches the timer's time."""
    WALL_TIME = "wall_time"
    """Fires once the wall clock reaches the timer's time (at the runner's tick granularity)."""


@dataclass(frozen=True, slots=True)
class Record:
    """A (key, value, timestamp) triple with a unique id.

    `id` is assigned by the framework when a computation produces the record (deterministically, so a
    replayed production gets the same id and is discarded downstream); injectors assign their own.
    """

    key: str
    value: Any
    timestamp: int
    id: str = ""

    def with_id(self, record_id: str) -> "Record":
        return Record(self.key, self.value, self.timestamp, record_id)


@dataclass(frozen=True, slots=True, order=True)
class Timer:
    """A timer as delivered to `process_timer`: fires in (time, tag) order per key."""

    time: int
    tag: str
    domain: TimeDomain = field(default=TimeDomain.LOW_WATERMARK, compare=False)


def derive_record_id(producer: str, cause: str, index: int) -> str:
    """Deterministic id of the `index`-th production caused by `cause` (an input record id or a
    fired timer) in computation `producer`. Same inputs on replay -> same id -> deduplicated."""
    digest = hashlib.blake2b(f"{producer}\x1f{cause}\x1f{index}".encode(), digest_size=12)
    return digest.hexdigest()
