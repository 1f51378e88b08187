"""Record bundles: many records of one shard carried in one Spark row.

The Python stateful operator converts every row it receives into a Python object column by column and
every row it emits back into Arrow the same way: the input side alone measured ~65 us per row of the
source's schema, more than the user's own code costs per record. MillWheel moves work between workers in
batches too; we do the same inside Spark. The source groups a batch's records by shard and packs up to
BUNDLE_RECORDS of them into one binary cell, the operator unpacks them in one call, and its productions
leave the same way. Spark still shuffles, checkpoints and commits everything; it just sees a few rows
per shard instead of one per record.

Bundles only ever travel between millstream's own source, operators and committer within one query,
written and read by the same code version, so pickle (fast, and exact for str, bytes and int) is safe.
"""

from __future__ import annotations

import pickle
from typing import Iterator, Sequence

BUNDLE_RECORDS = 4096

# A delivery: (key, record key, stream, encoded value, timestamp, id). Source and hand-over rows.
DeliveryItem = tuple[str, str, str, bytes, int, str]
# A production: (stream, record key, encoded value, timestamp, id). Operator output for the committer.
ProductionItem = tuple[str, str, bytes, int, str]


def pack(items: Sequence[tuple]) -> bytes:
    return pickle.dumps(list(items), protocol=5)


def unpack(bundle: bytes | None) -> list[tuple]:
    return pickle.loads(bundle) if bundle else []


def chunks(items: Sequence[tuple], size: int = BUNDLE_RECORDS) -> Iterator[bytes]:
    """`items` as bundles of at most `size` items each."""
    for start in range(0, len(items), size):
        yield pack(items[start:start + size])
