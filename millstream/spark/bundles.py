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
from itertools import chain, islice, repeat
from operator import itemgetter, le
from typing import Any, Mapping, NamedTuple, Sequence

from millstream.core import flatpickle
from millstream.core.executor import DeliveryRow
from millstream.core.production import Produced, ProductionRow, as_produced
from millstream.model.records import Record

BUNDLE_RECORDS = 4096
CACHED_POSITIONS = 1 << 16  # _positions keeps at most this many ints
_POSITIONS: list[int] = []

# What a feed hands the bundler per record, in the order read: (key under the computation's
# extractor, the record's own key, encoded value, timestamp, id, input point, order). The stream
# and whether records can arrive twice are the feed's, the same for all of its records.
FeedItem = tuple[str, str, bytes, int, str, int, int]


class DeliveryBundle(NamedTuple):
    """Records of one input stream bound for one key group, as columns: what one Spark cell
    carries from the source (or a fused producer) to the operator. A record's place in input order
    is (segment, order); neither a bundle's records nor the bundles a key group receives need be in
    that order (Spark's shuffle delivers bundles in any order)."""

    stream: str
    dedup: bool  # injected records: the only ones that can arrive twice (Delivery.dedup)
    keys: Sequence[str]  # each record's key under the computation's extractor for `stream`
    record_keys: Sequence[str] | None  # the records' own keys; None: the same as `keys`
    values: Sequence[bytes]
    timestamps: Sequence[int]
    ids: Sequence[str]
    segments: Sequence[int]
    orders: Sequence[int]


def pack_deliveries(stream: str, dedup: bool, items: Sequence[FeedItem]) -> bytes:
    """A feed's records of one key group as one bundle: a DeliveryBundle's fields pickled as a plain
    tuple, but for the keys. A key group's records share few keys: each distinct key is sent once, and
    each record's key as its place among them (bytes while they are at most 256), so the receiver
    decodes and hashes a key once, not once per record. Keys of a subclass of str go as they are.

    >>> bundle = unpack_deliveries(pack_deliveries("s", True, [("a", "a", b"1", 10, "i1", 0, 0),
    ...                                                        ("b", "b", b"2", 20, "i2", 0, 1),
    ...                                                        ("a", "a", b"3", 30, "i3", 0, 2)]))
    >>> bundle.keys, bundle.record_keys, bundle.ids
    (('a', 'b', 'a'), None, ('i1', 'i2', 'i3'))
    """
    keys, record_keys, values, timestamps, ids, segments, orders = zip(*items)
    distinct: tuple[str, ...] = keys
    places: bytes | tuple[int, ...] | None = None
    if set(map(type, keys)) == {str}:
        distinct = tuple(dict.fromkeys(keys))
        place = dict(zip(distinct, range(len(distinct))))
        places = tuple(map(place.__getitem__, keys))
        if len(distinct) <= 256:
            places = bytes(places)
    return flatpickle.dumps((stream, dedup, distinct, places, None if record_keys == keys else record_keys, values,
                             timestamps, ids, segments, orders))


def unpack_deliveries(bundle: bytes) -> DeliveryBundle:
    stream, dedup, keys, places, *columns = pickle.loads(bundle)
    if places is not None:  # keys by their places among the distinct keys (pack_deliveries)
        keys = (keys[places[0]],) if len(places) == 1 else itemgetter(*places)(keys)
    return DeliveryBundle(stream, dedup, keys, *columns)


def deliveries_by_key(bundles: Sequence[DeliveryBundle], codecs: Mapping[str, Any]) -> dict[str, list[DeliveryRow]]:
    """A key group's bundles as the executor's deliveries (DeliveryRow: a Delivery's fields as a plain
    tuple), per key in input order: (segment, order), ties in the order the bundles came in (Python's
    sort is stable). `codecs`: each input stream's codec. Records decode their values only when user
    code reads them.

    >>> from millstream.model.codecs import DEFAULT_CODEC
    >>> bundles = [unpack_deliveries(pack_deliveries("s", True, [("b", "b", b"2", 20, "i2", 0, 2),
    ...                                                            ("a", "a", b"3", 30, "i3", 1, 0)])),
    ...            unpack_deliveries(pack_deliveries("s", True, [("a", "a", b"1", 10, "i1", 0, 1)]))]
    >>> {key: [record.value for _, _, record, _, _ in group]
    ...  for key, group in deliveries_by_key(bundles, {"s": DEFAULT_CODEC}).items()}
    {'a': [1, 3], 'b': [2]}
    """
    encoded_many = Record.encoded_many
    deliveries: list[DeliveryRow] = []
    for bundle in bundles:  # built bundle by bundle, in C loops where they can be (a bundle's stream is one)
        records = encoded_many(bundle.record_keys or bundle.keys, bundle.values, codecs[bundle.stream],
                               bundle.timestamps, bundle.ids)
        deliveries.extend(zip(bundle.keys, repeat(bundle.stream), records, bundle.segments, repeat(bundle.dedup)))
    order = _input_order(bundles)
    ordered: Sequence[DeliveryRow] = deliveries
    if order is not None:  # permuted in one C call (order has two positions or more: it gives a tuple)
        ordered = itemgetter(*order)(deliveries)
    by_key: dict[str, list[DeliveryRow]] = {}
    for delivery in ordered:
        key = delivery[0]
        group = by_key.get(key)
        if group is None:
            by_key[key] = [delivery]
        else:
            group.append(delivery)
    return by_key


def _input_order(bundles: Sequence[DeliveryBundle]) -> list[int] | None:
    """The positions of the bundles' records (concatenated) in input order; None when they are in it.
    A stable sort: records of equal (segment, order), from different senders, keep the bundles' order."""
    orders = list(chain.from_iterable(bundle.orders for bundle in bundles))
    segments = list(chain.from_iterable(bundle.segments for bundle in bundles))
    rank: list[Any] = orders  # one input point: its order alone
    if segments and segments.count(segments[0]) != len(segments):  # (count: no ordering comparisons)
        rank = list(zip(segments, orders))
    if all(map(le, rank, islice(rank, 1, None))):
        return None
    positions = _positions(len(rank))
    positions.sort(key=rank.__getitem__)
    return positions


def _positions(count: int) -> list[int]:
    """[0, 1, ..., count - 1], up to CACHED_POSITIONS of them from ints made once per process (an int
    past 256 is an object of its own, made and freed per position otherwise)."""
    global _POSITIONS
    if count > CACHED_POSITIONS:
        return list(range(count))
    positions = _POSITIONS  # read once: another thread may replace it meanwhile, never change it
    if len(positions) < count:
        positions = _POSITIONS = list(range(count))
    return positions[:count]


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
    extends its own lists with them and sorts in Arrow, with no Produced built per production. A
    stream column of one name (most computations produce to one stream) travels as that name once."""
    if not rows:
        return flatpickle.dumps([()] * len(Produced._fields))
    columns: list[Any] = list(zip(*rows))
    streams = columns[0]
    if streams.count(streams[0]) == len(streams):
        columns[0] = streams[0]
    return flatpickle.dumps(columns)


def unpack_production_columns(bundle: bytes | None) -> list[tuple[Any, ...]]:
    """The columns `pack_production_columns` packed (none for no bundle).

    >>> rows = [("s", "k", b"v", 1, "id1", 0, 5), ("s", "k", b"w", 2, "id2", 0, 6)]
    >>> unpack_production_columns(pack_production_columns(rows))[:3], unpack_production_columns(None)
    ([('s', 's'), ('k', 'k'), (b'v', b'w')], [])
    >>> unpack_production_columns(pack_production_columns(rows + [("t", "k", b"x", 3, "id3", 0, 7)]))[0]
    ('s', 's', 't')
    >>> len(unpack_production_columns(pack_production_columns([])))  # no rows: still every column
    7
    """
    if not bundle:
        return []
    columns = pickle.loads(bundle)
    if type(columns[0]) is str:  # one stream
        columns[0] = (columns[0],) * len(columns[1])
    return columns  # type: ignore[no-any-return]
