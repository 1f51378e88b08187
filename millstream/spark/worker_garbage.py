"""What a reused Python worker keeps between Spark tasks, kept out of the daemon's garbage collections.

PySpark's daemon reuses a worker process task after task (`spark.python.worker.reuse`) and runs a full
`gc.collect()` after each. The operator's workers keep key groups' state cached between batches
(statestore.py), and every worker keeps the modules it imported: see WorkerGarbage.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["WORKER_GARBAGE", "WorkerGarbage"]


class WorkerGarbage:
    """Keeps the full collection PySpark's daemon runs after every task from visiting what the worker keeps.

    PySpark's daemon runs `gc.collect()` after every task of a reused Python worker: a full
    collection that visits every object alive, so each task would cost time in proportion to all
    the worker holds: the key caches of the operator's workers, and even in a worker that only reads
    or writes, every module it imported (tens of thousands of objects: docs/performance.md, twelfth
    session). So every kind of millstream task ends with `settle()`: the operator after each key
    group's step, the source's read and the batch writer at their end. It moves what is alive into
    the permanent generation (`gc.freeze`, O(1)), which collections skip; frozen objects are still
    freed by reference counting, as the caches' tuples and bytes are. Only cyclic garbage that was
    frozen waits for a real full collection, run again once the worker has spent `spacing` times the
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
