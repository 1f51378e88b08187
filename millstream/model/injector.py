"""Injectors bring external data into a pipeline and seed its low watermarks.

An injector is a *replayable* source: given the same offsets it yields the same records, so a runner
can re-read after a crash and the record ids (assigned by the injector) deduplicate any overlap.
Offsets are small JSON-serializable dicts the injector defines; the runner stores them in its
checkpoint and hands them back.

The injector also publishes its own low watermark (MillWheel section 5.3): the timestamp below which
it promises no more records. A record behind that promise is still delivered; consumers see it as late.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterator

from millstream.model.records import END_OF_TIME, Record

Offset = dict[str, Any]


class Injector(ABC):
    @abstractmethod
    def initial_offset(self) -> Offset:
        """Offset before anything has been read."""

    @abstractmethod
    def latest_offset(self, start: Offset, max_records: int | None) -> Offset:
        """How far the injector can read now, starting at `start`, taking at most about
        `max_records` records (None: no limit). Returns `start` when nothing new is available."""

    @abstractmethod
    def read(self, start: Offset, end: Offset) -> Iterator[Record]:
        """The records between two offsets, deterministically. Every record carries an id."""

    @abstractmethod
    def low_watermark(self, offset: Offset) -> int:
        """The injector's published low watermark once everything up to `offset` has been read;
        `END_OF_TIME` once it will never produce again."""

    def is_finished(self, offset: Offset) -> bool:
        """True when nothing will ever follow `offset`."""
        return self.low_watermark(offset) >= END_OF_TIME
