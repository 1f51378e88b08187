"""Batch pacing: how many injector records the next batch may read while input waits.

Every batch costs Spark a fixed time besides its records (planning, scheduling two stages, the
offset and commit logs, the stager), whatever the batch holds. A fixed record cap spreads that cost
well on one machine and badly on a faster one, where the same records take less time and the fixed
part weighs more (docs/performance.md, "batch pacing"). So the cap follows the speed: the stager
notes each batch's records and how long it ran (in the computation's wake file), and the source sizes
the next batch to take about `target_ms`.

The rule, with the last batch's `records` and run time `run_ms` and the cap it was planned with:

- no cap yet (a new root, or offsets of an older version): `first`;
- nothing noted, or the last batch read fewer than half its cap (input did not wait, so its time
  says little about what a full batch costs): the cap stays;
- otherwise `records * target_ms / run_ms`, at most twice the last cap (a record may cost more in
  a larger batch, through memory and the state it touches: batches grow a step at a time), and at
  any size below (a slow batch shrinks the next one at once);
- always within [`floor`, `ceiling`].

The cap only binds while input waits (a backlog, a catch-up): a pipeline keeping up reads what
arrived since the last trigger, and its batches stay as short as the trigger makes them. Each cap is
part of the batch's end offset, which Spark logs before the batch runs, so a batch re-run after a
crash reads exactly the records it read the first time.

>>> pacing = BatchPacing(target_ms=3000, first=200_000)
>>> pacing.next_cap(None, None)  # nothing measured yet
200000
>>> pacing.next_cap(200_000, LastBatch(records=200_000, run_ms=1_000))  # 600,000 in 3 s: 2x at most
400000
>>> pacing.next_cap(400_000, LastBatch(records=400_000, run_ms=2_500))  # 480,000 records in 3 s
480000
>>> pacing.next_cap(480_000, LastBatch(records=480_000, run_ms=6_000))  # slower: straight down
240000
>>> pacing.next_cap(240_000, LastBatch(records=500, run_ms=150))  # input did not wait: unchanged
240000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

DEFAULT_BATCH_TARGET_MS = 3_000
FIRST_BATCH_RECORDS = 200_000


@dataclass(frozen=True)
class LastBatch:
    """What the stager measured of a computation's last batch: the records it delivered, and the time
    from the stager's call (which runs Spark's job) to its outputs staged."""

    records: int
    run_ms: int

    def to_json(self) -> dict[str, int]:
        return {"records": self.records, "run_ms": self.run_ms}

    @classmethod
    def from_json(cls, noted: Mapping[str, Any] | None) -> "LastBatch | None":
        """The measurement noted in a wake file; None where there is none (an older root)."""
        if not noted or noted.get("records") is None or noted.get("run_ms") is None:
            return None
        return cls(int(noted["records"]), int(noted["run_ms"]))


@dataclass(frozen=True)
class BatchPacing:
    """Batch caps that aim at `target_ms` per batch (the module doc has the rule).

    >>> BatchPacing(target_ms=1000, first=10, floor=5, ceiling=100).next_cap(10, LastBatch(10, 10))
    20
    >>> BatchPacing(target_ms=1000, first=10, floor=5, ceiling=100).next_cap(80, LastBatch(80, 100))
    100
    >>> BatchPacing(target_ms=1000, first=10, floor=5, ceiling=100).next_cap(10, LastBatch(10, 60_000))
    5
    """

    target_ms: int = DEFAULT_BATCH_TARGET_MS
    first: int = FIRST_BATCH_RECORDS
    floor: int = 1_000
    ceiling: int = 5_000_000

    def __post_init__(self) -> None:
        for name in ("target_ms", "first", "floor", "ceiling"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"batch pacing: {name} must be a whole number >= 1, got {value!r}")
        if self.target_ms < 1:
            raise ValueError(f"batch pacing needs target_ms >= 1, got {self.target_ms}")
        if not 1 <= self.floor <= self.first <= self.ceiling:
            raise ValueError(f"batch pacing needs 1 <= floor <= first <= ceiling, got {self.floor}, {self.first}, "
                             f"{self.ceiling}")

    def next_cap(self, last_cap: int | None, last: LastBatch | None) -> int:
        if last_cap is None:
            return self.first
        if last is None or 2 * last.records < last_cap:
            return self._bounded(last_cap)
        estimate = last.records * self.target_ms // max(1, last.run_ms)
        return self._bounded(min(estimate, 2 * last_cap))

    def _bounded(self, cap: int) -> int:
        return max(self.floor, min(self.ceiling, cap))
