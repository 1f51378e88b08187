"""Where one Photon pipeline keeps its things, and reading its outputs and its input logs without Spark.

    <directory>/run/            the millstream root (Spark checkpoints, stream logs, status)
    <directory>/eventstore/     the EventStore: log files, log file map
    <directory>/out/joined/     JSON-lines sink of the `joined` stream (one file per delivered batch)
    <directory>/out/unjoinable/ JSON-lines sink of the `unjoinable` stream
    <directory>/out/stats/      JSON-lines sink of the `photon_stats` stream

Sink files are moved into their directory when their micro-batch is delivered, so on Linux a file's
ctime is the moment its records became visible downstream (the report's latency uses it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from millstream.injectors.files import FileInjector
from millstream.model.injector import Malformed
from millstream.model.records import Record


@dataclass(frozen=True)
class PipelineLayout:
    """The directories of one pipeline under `directory`.

    >>> PipelineLayout("/data/photon-a").joined_dir
    '/data/photon-a/out/joined'
    """

    directory: str

    @property
    def run_root(self) -> str:
        return os.path.join(self.directory, "run")

    @property
    def event_store(self) -> str:
        return os.path.join(self.directory, "eventstore")

    @property
    def joined_dir(self) -> str:
        return os.path.join(self.directory, "out", "joined")

    @property
    def unjoinable_dir(self) -> str:
        return os.path.join(self.directory, "out", "unjoinable")

    @property
    def stats_dir(self) -> str:
        return os.path.join(self.directory, "out", "stats")


@dataclass(frozen=True)
class SinkRecord:
    """One line of a JSON-lines sink file and when that file was delivered (its ctime, ms)."""

    key: str
    value: Any
    timestamp: int
    id: str
    delivered_ms: int


class SinkTail:
    """Reads the files of a JSON-lines sink directory as they are delivered, each file once.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> tail = SinkTail(folder)
    >>> with open(os.path.join(folder, "dispatcher-000000000001-0.jsonl"), "w") as f:
    ...     _ = f.write('{"id": "x", "key": "c-1", "timestamp": 5, "value": {"n": 1}}\\n')
    >>> [(r.key, r.value) for r in tail.poll()], tail.poll()
    ([('c-1', {'n': 1})], [])
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._seen: set[str] = set()

    def poll(self) -> list[SinkRecord]:
        """The records of the files delivered since the last poll."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".jsonl") and n not in self._seen)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            path = os.path.join(self.directory, name)
            delivered_ms = os.stat(path).st_ctime_ns // 1_000_000
            with open(path, encoding="utf-8") as lines:
                for line in lines:
                    if line.strip():
                        item = json.loads(line)
                        found.append(SinkRecord(item["key"], item["value"], item["timestamp"], item["id"], delivered_ms))
            self._seen.add(name)
        return found


def read_sink(directory: str) -> list[SinkRecord]:
    """Every record of a JSON-lines sink directory."""
    return SinkTail(directory).poll()


def read_log(directory: str, creation: str = "name", max_write_ms: int | None = None) -> list[Record[Any]]:
    """Every record of a directory of JSON-lines log files, read as a pipeline's FileInjector reads it
    (same record ids); lines that are not records are left out."""
    injector = FileInjector(directory, creation=creation, max_write_ms=max_write_ms, max_files_per_read=1 << 30,
                            missing_ok=True)
    start = injector.initial_offset("0")
    end = injector.latest_offset("0", start, None)
    return [item for item in injector.read("0", start, end) if not isinstance(item, Malformed)]
