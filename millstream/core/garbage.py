"""Garbage collection around bulk work (a step, a batch's bundles built or unpacked, its output written),
and after a Spark task in a reused Python worker (WorkerGarbage).

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
import time
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["BULK_THRESHOLD", "WORKER_GARBAGE", "WorkerGarbage", "bulk_work"]

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


class WorkerGarbage:
    """Keeps the full collection PySpark's daemon runs after every task from visiting what the worker keeps.

    PySpark's daemon runs `gc.collect()` after every task of a reused Python worker: a full
    collection that visits every object alive, so each task would cost time in proportion to all
    the worker holds: the key caches of the operator's workers, and even in a worker that only reads
    or writes, every module it imported (tens of thousands of objects; docs/performance.md measured
    both). So every kind of task ends with `settle()`: the operator after each key group's step, the
    source's read and the batch writer at their end. It moves what is alive into the permanent
    generation (`gc.freeze`, O(1)), which collections skip; frozen objects are still freed by
    reference counting, as the caches' tuples and bytes are. Only cyclic garbage that was frozen
    waits for a real full collection, run again once the worker has spent `spacing` times the
    collection's own CPU time, and at least `min_gap_s`, on other work: `clock` is the process's CPU
    time, so a full collection takes at most ~1/spacing of the worker's work however large the
    state, and a worker waiting for its next batch does not bring the next collection closer.

    >>> clock = iter([0.0, 0.1, 1.0, 2.2, 2.2, 2.2]).__next__  # the times settle() reads, in order
    >>> garbage = WorkerGarbage(spacing=20, min_gap_s=1.0, clock=clock)
    >>> garbage.settle()  # the first one collects in full: from 0.0 to 0.1, so the next from 2.1
    True
    >>> garbage.settle(), garbage.settle()  # at 1.0: too soon; at 2.2: due
    (False, True)
    >>> gc.get_freeze_count() > 0
    True
    >>> gc.unfreeze()
    """

    def __init__(self, spacing: float = 100.0, min_gap_s: float = 1.0, clock: Any = time.process_time) -> None:
        self.spacing, self.min_gap_s, self.clock = spacing, min_gap_s, clock
        self.next_full_at: float | None = None

    def settle(self) -> bool:
        """Freeze what is alive; first collect in full if it is time. True if it collected."""
        collected = False
        if self.next_full_at is None or self.clock() >= self.next_full_at:
            gc.unfreeze()
            started = self.clock()
            gc.collect()
            ended = self.clock()
            self.next_full_at = ended + max(self.min_gap_s, self.spacing * (ended - started))
            collected = True
        gc.freeze()
        return collected


WORKER_GARBAGE = WorkerGarbage()
