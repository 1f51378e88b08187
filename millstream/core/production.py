"""What a step emits: productions, with where they stand in the computation's output."""

from __future__ import annotations

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


# A producer's output in the order its consumers take it: (segment, order).
output_order = attrgetter("segment", "order")


def order_base(key: str) -> int:
    """The first `order` of a key's productions (each key has 2**32 positions)."""
    return xxhash.xxh3_64_intdigest(key.encode()) << 32
