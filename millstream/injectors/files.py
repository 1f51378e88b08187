"""An injector over a directory of JSON-lines log files (MillWheel section 5.3's example).

Contract for writers: a file becomes visible complete (write elsewhere, then rename into the
directory), is never changed afterwards, and its modification time is its creation time. Each line is
an object {"key": str, "value": any, "timestamp": int ms, "id": optional str}; without an id the
record's id is derived from the file's path and line number, so re-reading gives the same ids. A file named
`_DONE` says no more files will come.

Low watermark, as in the paper: the minimum creation time of the files not yet read. When every known
file has been read it is the newest creation time read so far (a file arriving later is created later),
and once `_DONE` exists and all is read it is END_OF_TIME.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

from millstream.model.injector import Injector, Offset
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, derive_record_id

DONE_MARKER = "_DONE"


class FileFormatError(ValueError):
    """A log file line is not a valid record; the message names file and line."""


class FileInjector(Injector):
    def __init__(self, directory: str, suffix: str = ".jsonl", max_files_per_read: int = 16) -> None:
        self.directory = str(directory)
        self.suffix = suffix
        self.max_files_per_read = max_files_per_read

    def initial_offset(self) -> Offset:
        return {"read": [], "watermark": BEGINNING_OF_TIME, "done": False}

    def _listing(self) -> tuple[dict[str, int], bool]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return {}, False
        created = {}
        for name in names:
            if name.endswith(self.suffix) and not name.startswith("."):
                try:
                    # Whole ms, from the exact ns value (a float st_mtime can round into the next ms).
                    created[name] = os.stat(os.path.join(self.directory, name)).st_mtime_ns // 1_000_000
                except FileNotFoundError:
                    continue
        return created, DONE_MARKER in names

    def latest_offset(self, start: Offset, max_records: int | None) -> Offset:
        created, done_marker = self._listing()
        already = set(start["read"])
        unread = sorted((t, n) for n, t in created.items() if n not in already)
        taking = unread[: self.max_files_per_read]
        remaining = unread[self.max_files_per_read:]
        read = sorted(already | {n for _, n in taking})
        if remaining:
            watermark = remaining[0][0]
        elif read:
            watermark = max(created.get(n, BEGINNING_OF_TIME) for n in read)
        else:
            watermark = BEGINNING_OF_TIME
        watermark = max(watermark, start["watermark"])
        done = done_marker and not remaining
        end = {"read": read, "watermark": watermark, "done": done}
        return start if end == start else end

    def read(self, start: Offset, end: Offset) -> Iterator[Record]:
        for name in sorted(set(end["read"]) - set(start["read"])):
            path = os.path.join(self.directory, name)
            # Ids derive from the file's path, not its name alone: two directories holding files of
            # the same name (part-0000.jsonl) feed different records, which must not deduplicate.
            source = os.path.join(os.path.normpath(self.directory), name)
            with open(path, encoding="utf-8") as lines:
                for number, line in enumerate(lines, 1):
                    if line.strip():
                        yield _parse(line, name, number, source)

    def low_watermark(self, offset: Offset) -> int:
        return END_OF_TIME if offset["done"] else offset["watermark"]


def _parse(line: str, name: str, number: int, source: str) -> Record:
    try:
        item = json.loads(line)
        key, timestamp = item["key"], item["timestamp"]
    except (ValueError, KeyError, TypeError) as error:
        raise FileFormatError(f"{name}:{number}: not a record line ({error}); expected "
                              '{"key": str, "value": ..., "timestamp": int}') from None
    if not isinstance(key, str) or isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise FileFormatError(f"{name}:{number}: key must be a string and timestamp integer milliseconds")
    record_id = item.get("id") or derive_record_id("file", source, number)
    return Record(key, item.get("value"), timestamp, str(record_id))
