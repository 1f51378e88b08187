"""MillWheel's heuristic ("99%") low watermark as an option on any injector (paper, section 8.2).

A strict watermark promises that nothing older will come, so it waits for the slowest record: one
search delayed on the wire by a minute holds every window downstream back by a minute. MillWheel
offers pipelines that prefer speed to completeness a heuristic watermark instead: the progress of
99% of the records, stragglers left out. `HeuristicWatermark(injector, quantile=0.99)` is that option
for one injector. It wraps the injector and publishes, per partition,

    max(strict watermark of the wrapped injector, newest event time read - bound)

where `bound` is learned from the data: the `quantile` of recent *lateness*, how far a record's
timestamp was behind the newest timestamp read before it in its partition. With quantile q, about a
fraction 1 - q of the records arrive behind the watermark (fewer when one read spans much event time,
below). They are still delivered, as late: counted in each consumer's `late` metric and flagged
`ctx.is_late`, so the user code decides (drop them, as Zeitgeist does, or correct an output).

What it learns lives in the offset. A runner computes a partition's watermark from an offset alone and
logs offsets (Spark, every batch) to replay them, so the watermark must be a function of the offset:
`latest_offset` reads the new range through the wrapped injector (its `read` is deterministic) and
folds the records into a small summary carried in the offset:

    {"inner": <the wrapped injector's offset>,
     "lateness": {"newest": <newest event time read>, "watermark": <heuristic part, never goes back>,
                  "on_time": <weight of records not behind the newest>,
                  "first": <index of the first bucket>, "weights": [<weight per bucket>, ...],
                  "seen": <records read>}}

- Buckets are log-scale: bucket b holds lateness in [2**(b/8), 2**((b+1)/8)) ms, 9% wide, so the bound
  is resolved to a few percent (the tail is interpolated within a bucket) from 1 ms to 2**48 ms with at
  most 384 buckets: the offset stays under a few KB however long the run (typically ~1 KB).
- Decay in event time: a record's weight halves every `half_life_ms` that the newest event time moves
  on after it was read, so the bound follows a change of the lateness within a few half-lives, and a
  quiet partition forgets nothing (no event time passes). Weights are rounded to 6 significant digits
  and ones too small to matter for the quantile are dropped, keeping the JSON short.
- Warm-up: until the partition has read `warmup_records` records (default 10 / (1 - q): ten records in
  the tail), counted plainly ("seen"; the decayed weight would not do: at a low rate it settles near
  rate x half-life / ln 2, below the warm-up for good), the estimate is noise and the watermark is the
  strict one. An offset written before the count was kept takes its weight as the count (the weight
  never exceeds it).

What it costs: every record is read twice, once by `latest_offset` (on the Spark driver, with the
batch's planning) and once by `read` (in the executors), plus ~1 us of Python per record for the
summary, and the summary in every offset Spark logs.

Choosing the quantile: the bound is the q-quantile of lateness, so its lag behind the newest event
time is that bound: 0.99 (MillWheel's example) trails by what 99% of records make, 0.999 waits for
rarer stragglers. The late fraction is about 1 - q when a read spans little event time compared with
the lateness, and smaller otherwise: the records of a read are judged against the watermark published
before it, and those stamped after the previous newest time cannot be behind it.

Limits: a record stamped far in the future moves the newest event time, and the watermark, with it
(everything after is late); and lateness is learned only from records already read, so the first
records of a sudden delay (an outage upstream) are late before the bound grows. Learning leaves out
the wrapped injector's Malformed items, but not a record whose value the stream's codec refuses: the
runner makes it a dead letter (`model/injector.py`, `refused_value`), after this injector, which does
not know the stream's codec, has counted its timestamp (as the newest event time, and in warm-up).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Mapping, Sequence

from millstream.model.injector import Injector, Malformed, Offset
from millstream.model.records import BEGINNING_OF_TIME, Record

BUCKETS_PER_OCTAVE = 8  # lateness buckets 2**(1/8) = 9% wide
MAX_BUCKET = 48 * BUCKETS_PER_OCTAVE - 1  # 2**48 ms: beyond any lateness between BEGINNING and END_OF_TIME
SIGNIFICANT_DIGITS = 6
# A bucket lighter than this fraction of the tail the quantile allows cannot move the bound measurably
# (all 384 together shift the tail by at most 4%): dropped, to keep offsets short.
NEGLIGIBLE_TAIL_SHARE = 1e-4
# Rebase weights before 2**exponent overflows a float (a read spanning > 1000 half-lives).
MAX_EXPONENT = 512.0


class LatenessSummary:
    """The decaying histogram of lateness one partition carries in its offset (see the module doc)."""

    def __init__(self, newest: int | None = None, watermark: int = BEGINNING_OF_TIME, on_time: float = 0.0,
                 weights: dict[int, float] | None = None, seen: int = 0) -> None:
        self.newest = newest
        self.watermark = watermark
        self.on_time = on_time
        self.weights: dict[int, float] = dict(weights or {})
        self.seen = seen  # records read (warm-up)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LatenessSummary":
        first = data["first"]
        weights = {first + i: w for i, w in enumerate(data["weights"]) if w}
        summary = cls(data["newest"], data["watermark"], data["on_time"], weights)
        seen = data.get("seen")
        # Written before the count was kept: at least its weight (a record weighs 1 at most).
        summary.seen = math.ceil(summary.total) if seen is None else seen
        return summary

    def to_json(self) -> dict[str, Any]:
        if self.weights:
            first, last = min(self.weights), max(self.weights)
            dense: list[float] = [self.weights.get(b, 0) for b in range(first, last + 1)]
        else:
            first, dense = 0, []
        return {"newest": self.newest, "watermark": self.watermark, "on_time": self.on_time,
                "first": first, "weights": dense, "seen": self.seen}

    @property
    def total(self) -> float:
        return self.on_time + sum(self.weights.values())

    def observe(self, timestamps: Iterable[int], half_life_ms: float) -> None:
        """Fold the timestamps of one read (in read order) into the summary."""
        # Weights are accumulated relative to the newest time at the start (`reference`): a record read
        # when the newest time was N weighs 2**((N - reference) / half_life) there; one multiplication
        # at the end brings everything to the new newest time. Rebased when the exponent gets large.
        newest = self.newest
        reference = newest
        on_time, weights = 0.0, dict[int, float]()
        weight, weight_at = 1.0, newest
        seen = self.seen
        for timestamp in timestamps:
            seen += 1
            if newest is None or timestamp >= newest:
                if newest is None:
                    reference = timestamp
                newest = timestamp
                bucket = -1
            else:
                bucket = min(MAX_BUCKET, int(math.log2(newest - timestamp) * BUCKETS_PER_OCTAVE))
            if newest != weight_at:
                exponent = (newest - (newest if reference is None else reference)) / half_life_ms
                if exponent > MAX_EXPONENT:
                    scale = 2.0 ** -exponent
                    on_time *= scale
                    weights = {b: w * scale for b, w in weights.items()}
                    self.on_time *= scale
                    self.weights = {b: w * scale for b, w in self.weights.items()}
                    reference, exponent = newest, 0.0
                weight, weight_at = 2.0 ** exponent, newest
            if bucket < 0:
                on_time += weight
            else:
                weights[bucket] = weights.get(bucket, 0.0) + weight
        self.seen = seen
        if newest is None or reference is None:
            return  # nothing read
        decay = 2.0 ** (-(newest - reference) / half_life_ms)
        self.on_time = self.on_time * decay + on_time * decay
        for bucket in set(self.weights) | set(weights):
            self.weights[bucket] = (self.weights.get(bucket, 0.0) + weights.get(bucket, 0.0)) * decay
        self.newest = newest

    def compact(self, quantile: float) -> None:
        """Round weights and drop the negligible ones (deterministic: a replay computes the same)."""
        negligible = NEGLIGIBLE_TAIL_SHARE * (1.0 - quantile) * self.total
        self.on_time = _round(self.on_time)
        self.weights = {b: _round(w) for b, w in self.weights.items() if w >= negligible and _round(w) > 0}

    def bound(self, quantile: float, warmup: float) -> int | None:
        """The smallest lateness B (ms) such that the weight of records later than B is at most
        1 - quantile of the total; None while fewer than `warmup` records have been read."""
        total = self.total
        if self.seen < warmup or total <= 0:
            return None
        allowed = (1.0 - quantile) * total
        tail = 0.0  # weight of the buckets above the current one
        for bucket in sorted(self.weights, reverse=True):
            weight = self.weights[bucket]
            if tail + weight <= allowed:
                tail += weight
                continue
            # The bound lies inside this bucket. Assume the tail falls geometrically across it (exact
            # for power-law tails, close for others); with nothing above, its weight spreads evenly.
            if tail > 0:
                depth = math.log(allowed / tail) / math.log((tail + weight) / tail)
            else:
                depth = allowed / weight
            top = (bucket + 1) / BUCKETS_PER_OCTAVE
            return math.ceil(math.pow(2.0, top - depth / BUCKETS_PER_OCTAVE))
        return 0  # the allowed tail reaches into the records that were not behind at all

    def advance(self, quantile: float, warmup: float) -> None:
        """Move the heuristic watermark to newest - bound (never back)."""
        bound = self.bound(quantile, warmup)
        if bound is not None and self.newest is not None:
            self.watermark = max(self.watermark, self.newest - bound)


def _round(weight: float) -> float:
    return float(f"{weight:.{SIGNIFICANT_DIGITS}g}")


class HeuristicWatermark(Injector):
    """Wraps `injector` to publish MillWheel's heuristic watermark: per partition, the newest event
    time read minus the `quantile` of recent lateness, never below the wrapped injector's own
    (strict) watermark. Records behind it are delivered as late. See the module doc for the summary
    it keeps in the offset, the decay and the costs.

    Here every 100th record arrives 5 s behind the others, which are out of order by up to 300 ms.
    The strict watermark waits 5 s for the stragglers; the 98% watermark trails by the jitter only:

    >>> from millstream import GeneratorInjector, HeuristicWatermark, Record
    >>> def stamp(i):
    ...     return 10 * i - (5_000 if i % 100 == 0 else i * i * 7919 % 301)
    >>> strict = GeneratorInjector(lambda i: Record("k", i, stamp(i)), total=100_000,
    ...                            low_watermark=lambda n: 10 * n - 5_000, max_records_per_read=1_000)
    >>> fast = HeuristicWatermark(strict, quantile=0.98)
    >>> offset = fast.initial_offset("0")
    >>> for _ in range(20):
    ...     offset = fast.latest_offset("0", offset, None)
    >>> newest = fast.newest_event_time(offset)
    >>> newest - strict.low_watermark("0", offset["inner"]), newest - fast.low_watermark("0", offset)
    (4899, 256)
    >>> fast.learned_bound_ms(offset)
    256
    """

    def __init__(self, injector: Injector, quantile: float = 0.99, half_life_ms: int = 300_000,
                 warmup_records: float | None = None) -> None:
        """`quantile`: the share of records the watermark waits for (0.5 <= q < 1). `half_life_ms`:
        event time after which a record counts half in the lateness summary. `warmup_records`: the
        records a partition reads before its summary is trusted (default 10 / (1 - quantile)); the
        strict watermark holds until then."""
        if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0.5 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile!r}")
        if isinstance(half_life_ms, bool) or not isinstance(half_life_ms, int) or half_life_ms <= 0:
            raise ValueError(f"half_life_ms must be a positive int of milliseconds, got {half_life_ms!r}")
        if warmup_records is not None and (isinstance(warmup_records, bool) or warmup_records < 0):
            raise ValueError(f"warmup_records must be >= 0 or None, got {warmup_records!r}")
        self.injector = injector
        self.watermark_keys = tuple(injector.watermark_keys)  # keyed watermarks pass through, strict
        self.values_are_data = injector.values_are_data
        self.quantile = float(quantile)
        self.half_life_ms = half_life_ms
        self.warmup_records = 10.0 / (1.0 - self.quantile) if warmup_records is None else float(warmup_records)

    def __repr__(self) -> str:
        return f"HeuristicWatermark({self.injector!r}, quantile={self.quantile}, half_life_ms={self.half_life_ms})"

    # -- the Injector contract -------------------------------------------------------------------
    def id_namespace(self) -> tuple[str, str] | None:
        return self.injector.id_namespace()  # the wrapped injector's records, ids and all

    def partitions(self) -> Sequence[str]:
        return self.injector.partitions()

    def initial_offset(self, partition: str) -> Offset:
        return {"inner": self.injector.initial_offset(partition), "lateness": LatenessSummary().to_json()}

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        end = self.injector.latest_offset(partition, start["inner"], max_records)
        if end == start["inner"]:
            return start  # nothing new: runners see an unchanged offset as "nothing to read"
        summary = LatenessSummary.from_json(start["lateness"])
        summary.observe(self._timestamps(partition, start["inner"], end), self.half_life_ms)
        summary.compact(self.quantile)
        summary.advance(self.quantile, self.warmup_records)
        return {"inner": end, "lateness": summary.to_json()}

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any] | Malformed]:
        return self.injector.read(partition, start["inner"], end["inner"])

    def low_watermark(self, partition: str, offset: Offset) -> int:
        heuristic: int = offset["lateness"]["watermark"]
        return max(self.injector.low_watermark(partition, offset["inner"]), heuristic)

    def keyed_watermarks(self, partition: str, offset: Offset) -> Mapping[str, int]:
        return self.injector.keyed_watermarks(partition, offset["inner"])

    def is_finished(self, partition: str, offset: Offset) -> bool:
        return self.injector.is_finished(partition, offset["inner"])

    def next_arrival_s(self, partition: str, offset: Offset) -> float | None:
        return self.injector.next_arrival_s(partition, offset["inner"])

    # -- what it learned (status, benchmarks) ------------------------------------------------------
    def learned_bound_ms(self, offset: Offset) -> int | None:
        """How far the heuristic watermark trails the newest event time at `offset` (None in warm-up)."""
        return LatenessSummary.from_json(offset["lateness"]).bound(self.quantile, self.warmup_records)

    def newest_event_time(self, offset: Offset) -> int | None:
        """The newest event time read in the partition up to `offset` (None before any record)."""
        newest: int | None = offset["lateness"]["newest"]
        return newest

    def _timestamps(self, partition: str, start: Offset, end: Offset) -> Iterator[int]:
        for item in self.injector.read(partition, start, end):
            # A Malformed item is dead-lettered by the runner and has no event time. (A record whose
            # value the stream's codec refuses is counted here: see the module doc's limits.)
            if not isinstance(item, Malformed):
                yield item.timestamp
