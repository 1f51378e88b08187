"""Which event-time windows a record belongs to: tumbling and sliding windows.

A window is the half-open interval [start, end) of event time in milliseconds. It is complete once
the computation's input low watermark reaches `end`: every record stamped before `end` is in then,
and a record stamped exactly `end` belongs to the next window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, order=True)
class Window:
    """The event-time interval [start, end) in milliseconds.

    >>> w = Window(1_000, 2_000)
    >>> w.contains(1_999), w.contains(2_000), w.size_ms
    (True, False, 1000)
    """

    start: int
    end: int

    @property
    def size_ms(self) -> int:
        return self.end - self.start

    def contains(self, timestamp: int) -> bool:
        return self.start <= timestamp < self.end


@runtime_checkable
class WindowAssigner(Protocol):
    """Maps a timestamp to the windows containing it (oldest first) and a window start back to its
    window (window state is stored by start). TumblingWindows and SlidingWindows are assigners.

    >>> isinstance(TumblingWindows(1_000), WindowAssigner)
    True
    """

    def windows_of(self, timestamp: int) -> list[Window]: ...

    def window_at(self, start: int) -> Window: ...


def _positive_ms(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int of milliseconds, got {value!r}")
    return value


@dataclass(frozen=True)
class TumblingWindows:
    """Windows of `size_ms` that do not overlap: each record is in exactly one. Windows start at
    multiples of `size_ms` (shifted by `offset_ms`).

    >>> TumblingWindows(1_000).windows_of(2_500)
    [Window(start=2000, end=3000)]
    >>> TumblingWindows(1_000, offset_ms=300).windows_of(2_200)
    [Window(start=1300, end=2300)]
    """

    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        _positive_ms("TumblingWindows size_ms", self.size_ms)
        if isinstance(self.offset_ms, bool) or not isinstance(self.offset_ms, int):
            raise ValueError(f"TumblingWindows offset_ms must be an int, got {self.offset_ms!r}")

    def windows_of(self, timestamp: int) -> list[Window]:
        start = timestamp - (timestamp - self.offset_ms) % self.size_ms
        return [Window(start, start + self.size_ms)]

    def window_at(self, start: int) -> Window:
        return Window(start, start + self.size_ms)


@dataclass(frozen=True)
class SlidingWindows:
    """Windows of `size_ms` starting every `slide_ms`: a record is in size_ms / slide_ms windows,
    rounded down or up by where it falls (1,000 / 300: in 3 or 4). `slide_ms` may not exceed
    `size_ms`: a record in a gap between windows would be
    in none of them, which this module refuses rather than dropping it silently.

    >>> SlidingWindows(3_000, 1_000).windows_of(2_500)
    [Window(start=0, end=3000), Window(start=1000, end=4000), Window(start=2000, end=5000)]
    >>> SlidingWindows(1_000, 1_000).windows_of(2_500) == TumblingWindows(1_000).windows_of(2_500)
    True
    >>> len(SlidingWindows(1_000, 300).windows_of(0)), len(SlidingWindows(1_000, 300).windows_of(100))
    (4, 3)
    """

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        _positive_ms("SlidingWindows size_ms", self.size_ms)
        _positive_ms("SlidingWindows slide_ms", self.slide_ms)
        if self.slide_ms > self.size_ms:
            raise ValueError(f"SlidingWindows slide_ms ({self.slide_ms}) must not exceed size_ms ({self.size_ms}): "
                             "records between windows would belong to none")
        if isinstance(self.offset_ms, bool) or not isinstance(self.offset_ms, int):
            raise ValueError(f"SlidingWindows offset_ms must be an int, got {self.offset_ms!r}")

    def windows_of(self, timestamp: int) -> list[Window]:
        last = timestamp - (timestamp - self.offset_ms) % self.slide_ms  # latest start at or before it
        windows = []
        start = last
        while start + self.size_ms > timestamp:
            windows.append(Window(start, start + self.size_ms))
            start -= self.slide_ms
        windows.reverse()
        return windows

    def window_at(self, start: int) -> Window:
        return Window(start, start + self.size_ms)
