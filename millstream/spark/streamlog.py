"""Durable named stream logs: how strong productions travel between computations.

Layout under the pipeline root (local or remote, see storage.py), one directory per (stream, producer):

    streams/<stream>/<producer>/<batch>.parquet       records of that producer batch (absent if none)
    streams/<stream>/<producer>/<batch>.commit.json   {"batch", "watermark", "rows"}: makes it visible

A producer batch is written by the producer query's foreachBatch after Spark has run the batch and
before Spark commits it, data first, then the commit file, each written atomically. If the driver dies in
between, Spark re-runs the batch with the same id on restart and an existing commit makes the write a
no-op, so every batch id appears exactly once (MillWheel's strong productions: checkpoint, then send).
The commit carries the producer's low watermark after that batch; consumers coalesce it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from millstream.core.executor import Produced
from millstream.spark.storage import Storage

RECORD_SCHEMA = pa.schema(
    [("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string())]
)


@dataclass(frozen=True)
class Commit:
    batch: int
    watermark: int
    rows: int


class StreamLog:
    def __init__(self, root: str) -> None:
        self.storage = Storage(root).child("streams")

    def directory(self, stream: str, producer: str) -> str:
        return f"{stream}/{producer}"

    def _commit_path(self, stream: str, producer: str, batch: int) -> str:
        return f"{stream}/{producer}/{batch:012d}.commit.json"

    def _data_path(self, stream: str, producer: str, batch: int) -> str:
        return f"{stream}/{producer}/{batch:012d}.parquet"

    def is_committed(self, stream: str, producer: str, batch: int) -> bool:
        return self.storage.exists(self._commit_path(stream, producer, batch))

    def append(self, stream: str, producer: str, batch: int, table: pa.Table, watermark: int) -> bool:
        """Write one producer batch; returns False if that batch was already committed."""
        if self.is_committed(stream, producer, batch):
            return False
        if table.num_rows:
            self.storage.write_parquet(self._data_path(stream, producer, batch), table)
        commit = {"batch": batch, "watermark": watermark, "rows": table.num_rows}
        self.storage.write_json(self._commit_path(stream, producer, batch), commit)
        return True

    def commits_after(self, stream: str, producer: str, after: int, limit: int) -> list[Commit]:
        """Consecutive committed batches after `after` (a gap means a batch still being written)."""
        found = []
        batch = after + 1
        while len(found) < limit:
            item = self.storage.read_json(self._commit_path(stream, producer, batch))
            if item is None:
                break
            found.append(Commit(item["batch"], item["watermark"], item["rows"]))
            batch += 1
        return found

    def first_uncommitted(self, stream: str, producer: str) -> int:
        """The lowest batch id not committed yet (a quick scan for an existing directory)."""
        names = self.storage.list(self.directory(stream, producer))
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
            commit = self.storage.read_json(self._commit_path(stream, producer, batch))
            if commit is not None and commit["rows"]:
                yield self.storage.read_parquet(self._data_path(stream, producer, batch), schema=RECORD_SCHEMA)

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
