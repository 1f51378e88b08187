"""An injector over a directory of JSON-lines log files (MillWheel section 5.3's example).

Contract for writers: a file becomes visible complete (write it elsewhere, then rename it into the
directory) and is never changed afterwards. Each line is an object
{"key": str, "value": any, "timestamp": int ms, "id": optional str}; without an id the record's id is
derived from the file's path and line number, so re-reading gives the same ids. A file named `_DONE`
says no more files will come. A line that is not such an object is Malformed (a dead letter), as is
one holding NaN or an infinity (the JSON codec cannot carry them) or a timestamp outside
[BEGINNING_OF_TIME, END_OF_TIME] (microseconds, say).

Low watermark, as in the paper: the minimum creation time of the files not yet read, and for files not
yet visible, the earliest creation time they can still have. A file's *creation time* is when its
writer started it, so its records are stamped no earlier. Where it comes from:

- `creation="mtime"` (default): from the file's modification time, which an ordinary writer leaves at
  the END of writing. The writer declares how long a file takes from its first record to being
  visible (`max_write_ms`): the creation time is mtime - max_write_ms, and a file that is not visible
  yet started after now - max_write_ms.
- `creation="name"`: the epoch milliseconds in the file's name (the first group of `name_pattern`),
  for writers that name files by when they started them. Files are expected to become visible in
  creation order, give or take `max_write_ms`: a file not visible yet was created no earlier than the
  newest visible one minus max_write_ms. A file whose name holds no time is read at once, as if
  created at the beginning of time (its records may be late: they reach user code flagged so).

Once `_DONE` exists and every file is read, the watermark is END_OF_TIME, and the input stays
finished if `_DONE` is deleted later (files added afterwards are still read, late). With `partitions=n`, files
are spread over n partitions by a hash of their name, each read by its own Spark task and publishing
its own watermark (with `creation="name"`, a partition bounds its files not yet visible by the newest
file of the whole directory, so a partition without files does not hold the watermark back).

An offset lists the files read that are still in the directory: delete files once read and
offsets stay small however long the injector runs. A file a listing missed for a moment (some
network filesystems) counts as gone and is read again when it shows up: its records keep their ids,
so the copies are discarded within the dedup horizon.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Iterator, Sequence

import xxhash

from millstream.model.injector import Injector, Malformed, Offset
from millstream.injectors import strict_json
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, derive_record_id, timestamp_problem

DONE_MARKER = "_DONE"
DEFAULT_NAME_PATTERN = r"(\d{1,16})"


def now_ms() -> int:
    """The wall clock the injector lists files by (a seam for tests)."""
    return int(time.time() * 1000)


class FileInjector(Injector):
    """Reads `*.jsonl` files of a directory.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "logs-1000.jsonl"), "w") as f:
    ...     _ = f.write('{"key": "a", "value": 1, "timestamp": 1500}\\n')
    >>> inj = FileInjector(folder, creation="name")
    >>> end = inj.latest_offset("0", inj.initial_offset("0"), None)
    >>> [(r.key, r.timestamp) for r in inj.read("0", inj.initial_offset("0"), end)]
    [('a', 1500)]
    >>> inj.low_watermark("0", end)
    1000

    A directory that does not exist is refused (a typo would otherwise read nothing, forever), unless
    `missing_ok=True`: then it reads as empty until it appears.
    """

    values_are_data = True  # a value the stream cannot carry is malformed input (model/injector.py)

    def __init__(self, directory: str, suffix: str = ".jsonl", max_files_per_read: int = 16,
                 creation: str = "mtime", max_write_ms: int | None = None, name_pattern: str = DEFAULT_NAME_PATTERN,
                 partitions: int = 1, missing_ok: bool = False) -> None:
        if not missing_ok and not os.path.isdir(directory):
            where = "" if os.path.isabs(directory) else f" (from {os.getcwd()!r})"
            raise ValueError(f"FileInjector: {directory!r} is not a directory{where}; create it first, or pass "
                             "missing_ok=True to read it as empty until it appears")
        if creation not in ("mtime", "name"):
            raise ValueError(f"creation must be 'mtime' or 'name', got {creation!r}")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.directory = str(directory)
        self.suffix = suffix
        self.max_files_per_read = max_files_per_read
        self.creation = creation
        # mtime is the end of writing, so a bound is needed; names carry the start exactly.
        self.max_write_ms = (10_000 if creation == "mtime" else 0) if max_write_ms is None else max_write_ms
        self.name_pattern = re.compile(name_pattern)
        self.partition_count = partitions

    def partitions(self) -> Sequence[str]:
        return tuple(str(p) for p in range(self.partition_count))

    def initial_offset(self, partition: str) -> Offset:
        return {"read": [], "watermark": BEGINNING_OF_TIME, "done": False}

    def _created(self, name: str) -> int | None:
        if self.creation == "name":
            match = self.name_pattern.search(name)
            if match is None:
                return None
            return int(match.group(1)) - self.max_write_ms
        try:
            # Whole ms, from the exact ns value (a float st_mtime can round into the next ms).
            return os.stat(os.path.join(self.directory, name)).st_mtime_ns // 1_000_000 - self.max_write_ms
        except FileNotFoundError:
            return None

    def _listing(self, partition: str) -> tuple[dict[str, int], int, bool]:
        """The partition's files with their creation times, the newest creation time of any file
        of the directory, and whether `_DONE` is there."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return {}, BEGINNING_OF_TIME, False
        created = {}
        newest = BEGINNING_OF_TIME
        for name in names:
            if not name.endswith(self.suffix) or name.startswith("."):
                continue
            mine = self._partition_of(name) == partition
            if mine or self.creation == "name":
                time_created = self._created(name)
                if time_created is None and self.creation == "name":  # no time in its name: read at once
                    if mine:
                        created[name] = BEGINNING_OF_TIME
                elif time_created is not None:
                    newest = max(newest, time_created)
                    if mine:
                        created[name] = time_created
        return created, newest, DONE_MARKER in names

    def _partition_of(self, name: str) -> str:
        if self.partition_count == 1:
            return "0"
        return str(xxhash.xxh3_64_intdigest(name.encode()) % self.partition_count)

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        listed_at = now_ms()
        created, newest, done_marker = self._listing(partition)
        already = set(start["read"])
        unread = sorted((t, n) for n, t in created.items() if n not in already)
        taking = unread[: self.max_files_per_read]
        remaining = unread[self.max_files_per_read:]
        # Files gone from the directory are forgotten: the offset lists what is there, not every
        # file ever read (a name that comes back is read again; its ids are the same).
        read = sorted((already & created.keys()) | {n for _, n in taking})
        if self.creation == "mtime":
            not_yet_visible = listed_at - self.max_write_ms
        else:  # files appear in creation order over the whole directory, give or take the bound
            not_yet_visible = newest
        watermark = min(remaining[0][0], not_yet_visible) if remaining else not_yet_visible
        watermark = max(watermark, start["watermark"])
        # Finished stays finished while nothing new comes (a _DONE deleted afterwards changes nothing):
        # a run waits for every input to say nothing new.
        done = (done_marker or start["done"]) and not remaining and (done_marker or not taking)
        end = {"read": read, "watermark": watermark, "done": done}
        if end["read"] == start["read"] and done == start["done"] and (done or watermark == start["watermark"]):
            return start  # finished, the clock's watermark means nothing new
        return end

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
        for name in sorted(set(end["read"]) - set(start["read"])):
            path = os.path.join(self.directory, name)
            # Ids derive from the file's path, not its name alone: two directories holding files of
            # the same name (part-0000.jsonl) feed different records, which must not deduplicate.
            source = os.path.join(os.path.normpath(self.directory), name)
            # Bytes that are not UTF-8 stay apart (surrogate escapes): such a line is malformed, not
            # delivered with replacement characters in place of what it said.
            with open(path, encoding="utf-8", errors="surrogateescape") as lines:
                for number, line in enumerate(lines, 1):
                    if line.strip():
                        yield _parse(line, name, number, source)

    def low_watermark(self, partition: str, offset: Offset) -> int:
        return END_OF_TIME if offset["done"] else offset["watermark"]


def _parse(line: str, name: str, number: int, source: str) -> Record[Any] | Malformed:
    position = f"{name}:{number}"
    try:
        item = strict_json.loads(line)  # the pipeline's JSON codec refuses NaN and infinities too
        key, value, timestamp = item["key"], item["value"], item["timestamp"]
    except UnicodeEncodeError:  # bytes that are not UTF-8 (read as surrogate escapes)
        shown = line.encode("utf-8", "surrogateescape").decode("utf-8", "replace").rstrip("\n")
        return Malformed(position, shown, "not UTF-8 text (the bytes that are not are shown as U+FFFD)")
    except (ValueError, KeyError, TypeError) as error:
        return Malformed(position, line.rstrip("\n"), f"not a record line ({type(error).__name__}: {error}); "
                         'expected {"key": str, "value": ..., "timestamp": int}')
    if not isinstance(key, str) or isinstance(timestamp, bool) or not isinstance(timestamp, int):
        return Malformed(position, line.rstrip("\n"), "key must be a string and timestamp integer milliseconds")
    if not BEGINNING_OF_TIME <= timestamp <= END_OF_TIME:  # a cheap test per line; the rule's words when it fails
        return Malformed(position, line.rstrip("\n"), f"timestamp {timestamp_problem(timestamp)}")
    record_id = item.get("id")
    if record_id is None:
        record_id = derive_record_id("file", source, number)
    return Record(key, value, timestamp, str(record_id))
