"""Durable named stream logs: how strong productions travel between computations.

Layout under the pipeline root, one directory per (stream, producer):

    streams/<stream>/<producer>/<batch>.parquet       records of that producer batch (absent if none)
    streams/<stream>/<producer>/<batch>.commit.json   {"batch", "watermark", "rows"}: makes it visible

A producer batch is written by the producer query's foreachBatch after Spark has run the batch and
before Spark commits it, data first, then the commit file, each by atomic rename. If the driver dies in
between, Spark re-runs the batch with the same id on restart and an existing commit makes the write a
no-op, so every batch id appears exactly once (MillWheel's strong productions: checkpoint, then send).
The commit carries the producer's low watermark after that batch; consumers coalesce it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from millstream.core.executor import Produced

RECORD_SCHEMA = pa.schema(
    [("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string())]
)


@dataclass(frozen=True)
class Commit:
    batch: int
    watermark: int
    rows: int


def atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class StreamLog:
    def __init__(self, root: str) -> None:
        self.root = os.path.join(root, "streams")

    def directory(self, stream: str, producer: str) -> str:
        return os.path.join(self.root, stream, producer)

    def _commit_path(self, stream: str, producer: str, batch: int) -> str:
        return os.path.join(self.directory(stream, producer), f"{batch:012d}.commit.json")

    def _data_path(self, stream: str, producer: str, batch: int) -> str:
        return os.path.join(self.directory(stream, producer), f"{batch:012d}.parquet")

    def is_committed(self, stream: str, producer: str, batch: int) -> bool:
        return os.path.exists(self._commit_path(stream, producer, batch))

    def append(self, stream: str, producer: str, batch: int, table: pa.Table, watermark: int) -> bool:
        """Write one producer batch; returns False if that batch was already committed."""
        if self.is_committed(stream, producer, batch):
            return False
        os.makedirs(self.directory(stream, producer), exist_ok=True)
        if table.num_rows:
            data_path = self._data_path(stream, producer, batch)
            tmp = f"{data_path}.tmp-{os.getpid()}"
            pq.write_table(table, tmp)
            os.replace(tmp, data_path)
        commit = {"batch": batch, "watermark": watermark, "rows": table.num_rows}
        atomic_write(self._commit_path(stream, producer, batch), json.dumps(commit).encode())
        return True

    def commits_after(self, stream: str, producer: str, after: int, limit: int) -> list[Commit]:
        """Consecutive committed batches after `after` (a gap means a batch still being written)."""
        found = []
        batch = after + 1
        while len(found) < limit:
            path = self._commit_path(stream, producer, batch)
            try:
                with open(path, "rb") as data:
                    item = json.loads(data.read())
            except FileNotFoundError:
                break
            found.append(Commit(item["batch"], item["watermark"], item["rows"]))
            batch += 1
        return found

    def first_uncommitted(self, stream: str, producer: str) -> int:
        """The lowest batch id not committed yet (a quick scan for an existing directory)."""
        directory = self.directory(stream, producer)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return 0
        batches = sorted(int(n.split(".")[0]) for n in names if n.endswith(".commit.json"))
        expected = 0
        for batch in batches:
            if batch != expected:
                break
            expected += 1
        return expected

    def read_batches(self, stream: str, producer: str, first: int, last: int) -> Iterator[pa.Table]:
        """Committed records of batches first..last inclusive."""
        for batch in range(first, last + 1):
            path = self._data_path(stream, producer, batch)
            if os.path.exists(path) and self.is_committed(stream, producer, batch):
                yield pq.read_table(path, schema=RECORD_SCHEMA)

    def read_all(self, stream: str, producers: list[str]) -> Iterator[tuple[str, pa.Table]]:
        for producer in producers:
            last = self.first_uncommitted(stream, producer) - 1
            for table in self.read_batches(stream, producer, 0, last):
                yield producer, table


def productions_table(produced: list[Produced]) -> pa.Table:
    return pa.table(
        {
            "key": [p.key for p in produced],
            "value": [p.value for p in produced],
            "timestamp": [p.timestamp for p in produced],
            "id": [p.id for p in produced],
        },
        schema=RECORD_SCHEMA,
    )
