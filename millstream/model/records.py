"""Records, timers and the time constants every layer shares.

Times are integers in milliseconds since the Unix epoch by convention (times before it are ordinary
values): Spark's timestamps have millisecond granularity, so a finer unit would be rounded away.
"""

from __future__ import annotations

import enum
from typing import Any, Generic, Iterable, NamedTuple, TypeVar

import xxhash

# Lowest possible watermark: nothing has been promised yet.
BEGINNING_OF_TIME: int = -(2**47)
# Watermark of an input that will never produce again (a finished injector). Kept well inside the
# range Python's datetime and Spark's TimestampType both accept.
END_OF_TIME: int = 2**47 - 1

V = TypeVar("V")
_UNDECODED: Any = object()
# Record.encoded's allocation, looked up once: through the class it costs more, per delivered record.
# (A subclass's own __new__ would not run: the runners make plain Records.)
_new_object = object.__new__
_ATOMS = frozenset((int, float, str, bool, bytes, type(None)))  # values nothing can change in place


def timestamp_problem(timestamp: Any) -> str | None:
    """What is wrong with `timestamp` as a record's timestamp, or None when nothing is: a timestamp is
    an int number of milliseconds in [BEGINNING_OF_TIME, END_OF_TIME] (bool is refused: it is an int
    to Python, never a time). The one statement of the rule; the per-record paths first test
    `type(t) is int and BEGINNING_OF_TIME <= t <= END_OF_TIME`, which is stricter, and ask here only
    when that fails, to explain.

    >>> timestamp_problem(1_000) is None
    True
    >>> timestamp_problem("5")
    "is a str ('5'); timestamps are int milliseconds since the epoch"
    >>> timestamp_problem(2**50)
    'is 1125899906842624, outside [-140737488355328, 140737488355327] (int milliseconds since the epoch)'
    """
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        return (f"is a {type(timestamp).__name__} ({timestamp!r:.40}); timestamps are int milliseconds "
                "since the epoch")
    if not BEGINNING_OF_TIME <= timestamp <= END_OF_TIME:
        return (f"is {timestamp}, outside [{BEGINNING_OF_TIME}, {END_OF_TIME}] (int milliseconds since "
                "the epoch)")
    return None


class TimeDomain(str, enum.Enum):
    """Which clock a timer follows."""

    LOW_WATERMARK = "low_watermark"
    """Fires once the computation's input low watermark reaches the timer's time."""
    WALL_TIME = "wall_time"
    """Fires once the wall clock reaches the timer's time (at the runner's tick granularity)."""


class Record(Generic[V]):
    """A (key, value, timestamp) triple with a unique id.

    `id` is assigned by the framework when a computation produces the record (deterministically, so a
    replayed production gets the same id); injectors assign their own. A record delivered by the
    framework decodes its value only when user code first reads it.

    >>> r = Record("cats", {"n": 1}, 1_000)
    >>> r.key, r.value["n"], r.timestamp
    ('cats', 1, 1000)
    >>> r.with_id("a1") == Record("cats", {"n": 1}, 1_000, "a1")
    True
    """

    __slots__ = ("key", "_value", "_encoded", "_codec", "timestamp", "id")

    key: str
    timestamp: int
    id: str

    def __init__(self, key: str, value: V, timestamp: int, id: str = "") -> None:
        self.key = key
        self._value = value
        self._encoded: bytes | None = None
        self._codec: Any = None
        self.timestamp = timestamp
        self.id = id

    @classmethod
    def encoded(cls, key: str, data: bytes, codec: Any, timestamp: int, id: str) -> "Record[Any]":
        """A record whose value is decoded with `codec` on first access (used by the runners)."""
        record: Record[Any] = _new_object(cls)
        record.key = key
        record._value = _UNDECODED
        record._encoded = data
        record._codec = codec
        record.timestamp = timestamp
        record.id = id
        return record

    @classmethod
    def encoded_many(cls, keys: Iterable[str], data: Iterable[bytes], codec: Any, timestamps: Iterable[int],
                     ids: Iterable[str]) -> list["Record[Any]"]:
        """`encoded` of each (key, data, timestamp, id), all under `codec`: one loop here, not a call
        of `encoded` per record (the runners unpack bundles of records with it)."""
        records: list[Record[Any]] = []
        append, undecoded = records.append, _UNDECODED
        for key, encoded, timestamp, record_id in zip(keys, data, timestamps, ids):
            record: Record[Any] = _new_object(cls)
            record.key = key
            record._value = undecoded
            record._encoded = encoded
            record._codec = codec
            record.timestamp = timestamp
            record.id = record_id
            append(record)
        return records

    @property
    def value(self) -> V:
        if self._value is _UNDECODED:
            self._value = self._codec.decode(self._encoded)
        return self._value

    def decode_again(self) -> None:
        """Forget the decoded value of a record that came encoded (Record.encoded): the next read
        decodes it afresh. For a record handed to user code again after a rollback, since code may
        have changed the value it read in place."""
        if self._codec is not None:
            self._value = _UNDECODED

    def encoded_value(self, codec: Any) -> bytes:
        """The value's bytes under `codec`, reusing the bytes the record arrived with where the value
        cannot have changed since: never decoded, or decoded to an atom (code may change a dict or a
        list it read in place)."""
        if self._encoded is not None and self._codec is codec and (
                self._value is _UNDECODED or type(self._value) in _ATOMS):
            return self._encoded
        return codec.encode(self.value)  # type: ignore[no-any-return]

    def with_id(self, record_id: str) -> "Record[V]":
        return Record(self.key, self.value, self.timestamp, record_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.key, self.timestamp, self.id) == (other.key, other.timestamp, other.id) and (
            self.value == other.value)

    def __hash__(self) -> int:
        return hash((self.key, self.timestamp, self.id))

    def __repr__(self) -> str:
        return f"Record(key={self.key!r}, value={self.value!r}, timestamp={self.timestamp}, id={self.id!r})"

    def __reduce__(self) -> Any:
        return (Record, (self.key, self.value, self.timestamp, self.id))


class Timer(NamedTuple):
    """A timer as delivered to `process_timer`: fires in (time, tag) order per key. Read its fields
    by name: a field may be added (`hold` was), which changes what it unpacks into.

    >>> Timer(1_000, "flush")
    Timer(time=1000, tag='flush', domain=<TimeDomain.LOW_WATERMARK: 'low_watermark'>, watermark=None, hold=None)
    """

    time: int
    tag: str
    domain: TimeDomain = TimeDomain.LOW_WATERMARK
    watermark: str | None = None  # the watermark key a low-watermark timer follows; None: the low watermark
    hold: int | None = None  # where the timer held the output watermark while pending (set_timer's hold)


def derive_record_id(producer: str, *cause: object) -> str:
    """Deterministic id of a production: a function of the producing computation and the cause
    (the input record's id and the production's index, or the fired timer's identity). The same
    cause gives the same id on every run.

    >>> derive_record_id("windower", "r", "abc", 0) == derive_record_id("windower", "r", "abc", 0)
    True
    >>> derive_record_id("windower", "r", "abc", 0) != derive_record_id("windower", "r", "abc", 1)
    True
    """
    text = "\x1f".join([producer, *map(str, cause)])
    return xxhash.xxh3_128_hexdigest(text.encode())[:24]
