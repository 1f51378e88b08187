"""The user contract: a computation is user code run per key, serialized per key.

Kept deliberately small (MillWheel's API, section 5 of the paper): two hooks called by the system and
a context through which the code reads its key's state, sets timers and produces records.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, Protocol, overload

from millstream.model.records import Record, TimeDomain, Timer
from millstream.model.state import (
    ListHandle,
    ListState,
    MapHandle,
    MapState,
    ValueHandle,
    ValueState,
)


class Context(Protocol):
    """What user code may do while the framework runs it for one key."""

    @property
    def key(self) -> str:
        """The key this invocation runs for."""
        ...

    @property
    def low_watermark(self) -> int:
        """The computation's input low watermark: no more on-time records are expected below it."""
        ...

    @property
    def wall_time(self) -> int:
        """Wall-clock time of this invocation, in ms (a value the test harness controls)."""
        ...

    @property
    def is_late(self) -> bool:
        """True when the record being processed is behind the input low watermark."""
        ...

    @property
    def input_stream(self) -> str | None:
        """Name of the stream the current record came from (None in `process_timer`)."""
        ...

    @overload
    def state(self, spec: ValueState[Any]) -> ValueHandle[Any]: ...

    @overload
    def state(self, spec: ListState[Any]) -> ListHandle[Any]: ...

    @overload
    def state(self, spec: MapState[Any, Any]) -> MapHandle[Any, Any]: ...

    def state(self, spec: Any) -> Any:
        """The current key's handle for a state declared on the computation class."""
        ...

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.LOW_WATERMARK) -> None:
        """Set (or move) the key's timer `tag`. A low-watermark timer at or behind the current low
        watermark fires in the same step, right after the current invocation."""
        ...

    def delete_timer(self, tag: str) -> None:
        """Cancel the key's timer `tag` if it is pending."""
        ...

    def produce(self, record: Record, stream: str) -> None:
        """Emit `record` on `stream` (one of the computation's declared outputs). Its id is assigned
        deterministically by the framework."""
        ...


class Computation(ABC):
    """Subclass and override the hooks; declare state as class attributes (see millstream.state)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        """Called once per delivered record (duplicates by id are discarded before this)."""

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        """Called when a timer set by `ctx.set_timer` fires."""
