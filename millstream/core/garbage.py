"""Garbage collection around bulk work: a step, a batch's bundles built or unpacked, its output written.

Such work allocates hundreds of thousands of short-lived tuples and records in one go, while the
process may also hold much long-lived data (a key group's dedup ids, cached key state). With CPython's
default thresholds every 700 allocations start a young collection, and the older generations are
traversed again and again as the batch's own objects pile up: a third of the writer's time went
there (docs/performance.md). Inside `bulk_work()` young objects are collected less often and full
collections wait (young cycles are still found); the process's own thresholds come back after it.

>>> import gc
>>> before = gc.get_threshold()
>>> with bulk_work():
...     gc.get_threshold()[0] >= BULK_THRESHOLD[0]
True
>>> gc.get_threshold() == before
True
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["BULK_THRESHOLD", "bulk_work"]

BULK_THRESHOLD = (100_000, 1_000, 1_000)


@contextmanager
def bulk_work() -> Iterator[None]:
    """Raise the collection thresholds to at least BULK_THRESHOLD for the block (nests)."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(before, BULK_THRESHOLD)))
    try:
        yield
    finally:
        gc.set_threshold(*before)
