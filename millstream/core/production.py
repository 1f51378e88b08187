"""What a step emits: productions, with where they stand in the computation's output."""

from __future__ import annotations

from functools import partial
from operator import attrgetter
from typing import NamedTuple

import xxhash


class Produced(NamedTuple):
    """A production, value already encoded with the output stream's codec.

    `segment` is the input point of the step it belongs to; `order` its position among the step's
    productions of that point: the producing key's hash, then the production's index within the key.
    A consumer takes a producer's records in (segment, order) order, which depends only on the data,
    not on how keys were grouped into tasks, so rescaling a computation does not change what its
    consumers see."""

    stream: str
    key: str
    value: bytes
    timestamp: int
    id: str
    segment: int
    order: int


# Produced's fields as a plain tuple: what a step collects and bundles carry. A step builds one per
# production, and a tuple subclass costs several times as much to build (and to pickle).
ProductionRow = tuple[str, str, bytes, int, str, int, int]
as_produced = partial(tuple.__new__, Produced)  # a row as a Produced, built in C

# A producer's output in the order its consumers take it: (segment, order).
OUTPUT_ORDER = ("segment", "order")
output_order = attrgetter(*OUTPUT_ORDER)


def order_base(key: str) -> int:
    """The first `order` of a key's productions (each key has 2**32 positions)."""
    return xxhash.xxh3_64_intdigest(key.encode()) << 32
