"""Which Spark task runs which key group: the value a key group carries in the grouping column.

Each computation's query groups its rows by one integer column, and Spark sends a group to shuffle
partition `pmod(murmur3(value, seed 42), partitions)` (HashPartitioning, the same for the shuffle and
for the state store). Were the value the key group's index itself, Spark's hash would deal the groups
out unevenly: 32 key groups over 2 partitions fall 20 and 12, so one task carries 5/8 of the batch
while the other's core idles, and over 8 partitions the busiest task gets 6 groups, not 4.

So a key group travels under a *label*: the smallest non-negative integer whose hash, taken modulo
`align`, is the group's index. Then Spark's partition of group g is `g mod P` for every partition
count P that divides `align`, and a batch spreads evenly (within one group) over the tasks. `align`
is the number of key groups, times whatever the parallelism at the root's first start needs for it to
divide `align` too (when that stays small): 32 key groups started on 6 cores align to 96, balanced
over 1, 2, 3, 4, 6, 8, 12, 16, 24 and 32 partitions.

Labels are chosen once, at a root's first start, and kept in its layout: Spark's state is stored under
them, so they can never change afterwards (`millstream rescale` keeps them). Roots made before labels
existed keep their identity labels (a group's index is its value).

>>> labels = GroupLabels.aligned(8)
>>> [spark_partition(label, 4) for label in labels.labels]
[0, 1, 2, 3, 0, 1, 2, 3]
>>> labels.group(labels.label(5))
5
>>> GroupLabels.identity(3).labels
(0, 1, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_C1, _C2, _MASK = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
SPARK_HASH_SEED = 42  # Murmur3Hash's default seed, which HashPartitioning uses
# Aligning to more than this many residues makes the search for labels slow (it tries about
# align * ln(key groups) integers): then only the key group count is aligned to.
MAX_ALIGN = 1 << 16


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `hash()` of an int column (Murmur3_x86_32.hashInt), as a signed 32-bit integer.

    >>> spark_hash_int(5), spark_hash_int(-7)
    (1023896466, -1618159745)
    """
    k1 = (value & _MASK) * _C1 & _MASK
    k1 = _rotl(k1, 15) * _C2 & _MASK
    h1 = seed ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition(value: int, partitions: int) -> int:
    """The shuffle partition Spark sends an int grouping value to (`pmod(hash(value), partitions)`)."""
    return spark_hash_int(value) % partitions


def alignment(key_groups: int, parallelism: int | None) -> int:
    """What labels align to: the key group count, times what `parallelism` needs to divide it, unless
    that passes MAX_ALIGN.

    >>> alignment(32, 2), alignment(32, 6), alignment(32, 64), alignment(32, None)
    (32, 96, 32, 32)
    """
    if not parallelism or parallelism >= key_groups:
        return key_groups  # at most one key group per partition: Spark runs min(parallelism, key groups)
    wanted = math.lcm(key_groups, parallelism)
    return wanted if wanted <= MAX_ALIGN else key_groups


@dataclass(frozen=True)
class GroupLabels:
    """The grouping value (label) of every key group of a root, and back."""

    labels: tuple[int, ...]
    _groups: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_groups", {label: group for group, label in enumerate(self.labels)})
        if len(self._groups) != len(self.labels):
            raise ValueError("key group labels must be distinct")

    @classmethod
    def identity(cls, key_groups: int) -> "GroupLabels":
        """A root's labels before labels existed: each key group's index."""
        return cls(tuple(range(key_groups)))

    @classmethod
    def aligned(cls, key_groups: int, align: int | None = None) -> "GroupLabels":
        """For each key group g, the smallest integer >= 0 whose Spark hash is g modulo `align`
        (default: the key group count; at least that)."""
        align = max(align or key_groups, key_groups)
        labels: list[int | None] = [None] * key_groups
        missing, value = key_groups, 0
        while missing:
            residue = spark_hash_int(value) % align
            if residue < key_groups and labels[residue] is None:
                labels[residue] = value
                missing -= 1
            value += 1
        return cls(tuple(labels))  # type: ignore[arg-type]

    def __getstate__(self) -> tuple[int, ...]:
        return self.labels  # the reverse map is rebuilt where it is unpickled

    def __setstate__(self, labels: tuple[int, ...]) -> None:
        object.__setattr__(self, "labels", labels)
        self.__post_init__()

    def __len__(self) -> int:
        return len(self.labels)

    def label(self, group: int) -> int:
        return self.labels[group]

    def group(self, label: int) -> int:
        return self._groups[label]
