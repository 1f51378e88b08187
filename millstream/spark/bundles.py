"""Record bundles: many records of one key group carried in one Spark row.

The Python stateful operator converts every row it receives into a Python object column by column and
every row it emits back into Arrow the same way: the input side alone measured ~65 us per row of the
source's schema, more than the user's own code costs per record. MillWheel moves work between workers in
batches too; we do the same inside Spark. The source groups a batch's records by key group and packs up
to BUNDLE_RECORDS of them into one binary cell, and the operator unpacks them in one call. Spark still
shuffles, checkpoints and commits everything; it just sees a few rows per key group instead of one per
record.

Bundles only ever travel between millstream's own source, operators and writer within one query,
written and read by the same code version, so pickle (fast, and exact for str, bytes and int) is safe.
"""

from __future__ import annotations

import pickle
from operator import itemgetter
from typing import Any, Sequence

from millstream.core import flatpickle
from millstream.core.executor import Delivery
from millstream.core.production import Produced, ProductionRow, as_produced
from millstream.model.records import Record

BUNDLE_RECORDS = 4096

# A delivery: (key, stream, record key, encoded value, timestamp, id, input point, order, dedup).
DeliveryItem = tuple[str, str, str, bytes, int, str, int, int, bool]
_INPUT_ORDER = itemgetter(6, 7)


def deliveries_by_key(items: list[DeliveryItem], codecs: dict[str, Any]) -> dict[str, list[Delivery]]:
    """A key group's unpacked bundles as the executor's deliveries, per key in input order (point,
    then position: Spark's shuffle delivers bundles in any order). `codecs`: each input stream's
    codec. Sorts `items` in place.

    >>> from millstream.model.codecs import DEFAULT_CODEC
    >>> items = [("b", "s", "b", b"2", 20, "i2", 0, 2, True), ("a", "s", "a", b"1", 10, "i1", 0, 1, True),
    ...          ("a", "s", "a", b"3", 30, "i3", 1, 0, True)]
    >>> {key: [d.record.value for d in group] for key, group in deliveries_by_key(items, {"s": DEFAULT_CODEC}).items()}
    {'a': [1, 3], 'b': [2]}
    """
    items.sort(key=_INPUT_ORDER)
    new, encoded = tuple.__new__, Record.encoded
    by_key: dict[str, list[Delivery]] = {}
    for key, stream, rkey, value, ts, rid, segment, _, dedup in items:
        delivery = new(Delivery, (key, stream, encoded(rkey, value, codecs[stream], ts, rid), segment, dedup))
        group = by_key.get(key)
        if group is None:
            by_key[key] = [delivery]
        else:
            group.append(delivery)
    return by_key


def pack(items: Sequence[Any]) -> bytes:
    return flatpickle.dumps(list(items))


def unpack(bundle: bytes | None) -> list[Any]:
    return pickle.loads(bundle) if bundle else []


def pack_productions(items: Sequence[Produced | ProductionRow]) -> bytes:
    """Productions (dead letters and passed-through rejects) as one bundle of rows. Pickle reduces a
    NamedTuple through a Python-level call per item, a plain tuple in C: they travel as plain tuples."""
    return flatpickle.dumps(list(map(tuple, items)))


def unpack_productions(bundle: bytes | None) -> list[Produced]:
    return list(map(as_produced, pickle.loads(bundle))) if bundle else []


def pack_production_columns(rows: Sequence[ProductionRow]) -> bytes:
    """A step's rows of productions as one bundle of columns, Produced's fields in order: the writer
    extends its own lists with them and sorts in Arrow, with no Produced built per production."""
    return flatpickle.dumps(list(zip(*rows)) if rows else [()] * len(Produced._fields))


def unpack_production_columns(bundle: bytes | None) -> list[tuple[Any, ...]]:
    """The columns `pack_production_columns` packed (none for no bundle).

    >>> rows = [("s", "k", b"v", 1, "id1", 0, 5), ("s", "k", b"w", 2, "id2", 0, 6)]
    >>> unpack_production_columns(pack_production_columns(rows))[1:3], unpack_production_columns(None)
    ([('k', 'k'), (b'v', b'w')], [])
    >>> len(unpack_production_columns(pack_production_columns([])))  # no rows: still every column
    7
    """
    return pickle.loads(bundle) if bundle else []
