"""A deterministic, seeded search-query log with injected anomalies and a ground truth.

What it makes (all times int ms, event time starting at `start_ms`):

- `queries` queries with Zipf-like popularity (rank r gets a share proportional to r**-zipf), each in
  a region ("us", "eu", "in", "eg", "br", "jp"). A region sets the query's daily cycle phase; a "day"
  is compressed to `day_seconds` of event time.
- Per query and second: rate = popularity * daily profile * anomaly factor, times gamma noise
  (overdispersion), then a Poisson count; events are spread uniformly inside their second.
- Anomalies, recorded as ground truth (`ground_truth(config)`): spikes of several multipliers and
  durations, dips of several depths and durations, and one regional outage: every query of region
  "eg" goes near-silent for a while (MillWheel's "Egyptian" example). Anomalies start after a warm-up
  day (the model needs one) and never overlap on a query.
- Arrival order: every event arrives after a small jitter (out of order by a few hundred ms); a small
  fraction is *delayed* by seconds to tens of seconds, and one *delayed burst* holds back every event
  of a few queries for a whole interval by minutes. Delayed data is complete, only late on the wire.
  A tiny fraction is *deliberately late*: the injector's watermark does not wait for it.

The injector's low watermark after emitting n records is the minimum timestamp of the records not yet
emitted (deliberately late ones excluded): honest, so delayed data is never mistaken for a dip.

The anomaly schedule uses its own random stream and needs no events: `ground_truth(config)` is cheap
and independent of the event arrays and of the pipeline.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterator, Sequence

import numpy as np

from millstream.injectors.generator import GeneratorInjector
from millstream.model.injector import Injector, Offset
from millstream.model.records import END_OF_TIME, Record

SECOND = 1000
REGIONS = ("us", "eu", "in", "eg", "br", "jp")
# Daily-cycle phase offset of each region, in fractions of a day (time zones).
REGION_PHASE = {"us": 0.0, "eu": 0.30, "in": 0.55, "eg": 0.36, "br": -0.08, "jp": 0.68}
# Region of each popularity rank cycles through this pattern (shuffled per seed), so every region
# gets queries of every popularity, including popular ones.
REGION_PATTERN = ("us",) * 7 + ("eu",) * 5 + ("in",) * 3 + ("eg",) * 2 + ("br",) * 2 + ("jp",)
OUTAGE_REGION = "eg"

_TOPICS = {
    "us": ["weather", "nfl", "super bowl", "stock market", "obama", "netflix", "lottery", "amazon", "traffic",
           "recipes", "iphone", "hurricane", "walmart", "tax refund", "mortgage rates", "nba"],
    "eu": ["bundesliga", "euro exchange", "champions league", "bbc news", "ryanair", "eurovision",
           "le monde", "tour de france", "ikea", "oktoberfest", "brexit", "premier league"],
    "in": ["cricket score", "bollywood", "ipl", "sensex", "railway pnr", "monsoon", "diwali", "mumbai",
           "delhi metro", "tamil movies"],
    "eg": ["cairo", "al jazeera", "tahrir", "alexandria", "egypt news", "ahram", "nile", "mubarak",
           "arabic music", "zamalek"],
    "br": ["futebol", "globo", "carnaval", "flamengo", "sao paulo", "novela", "mega sena", "rio"],
    "jp": ["tokyo", "anime", "shinkansen", "nikkei", "sumo", "j league"],
}
_MODIFIERS = ["", "live", "today", "news", "results", "map", "video", "tickets", "score", "2011", "online",
              "schedule", "photos", "forecast", "wiki", "app"]


@dataclass(frozen=True)
class Anomaly:
    """One injected anomaly. `magnitude`: for a spike the traffic multiplier (3.0 = three times the
    normal traffic); for a dip the fraction of traffic lost (0.9 = 90% of the searches missing).
    `baseline`: events the query would have had over the interval without the anomaly (expected
    value), `rate`: its mean per second. `cause`: "spike", "dip" or "outage"."""

    query: str
    kind: str
    start: int
    end: int
    magnitude: float
    cause: str
    region: str
    baseline: float
    rate: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DelayedBurst:
    """Every event of `queries` with a timestamp in [start, end) arrives `delay_ms` later than it
    would have: delayed on the wire, not missing."""

    queries: tuple[str, ...]
    start: int
    end: int
    delay_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"queries": list(self.queries), "start": self.start, "end": self.end, "delay_ms": self.delay_ms}


@dataclass(frozen=True)
class ZeitgeistConfig:
    """Everything that determines the generated log. Same config -> same events, same order, same
    ground truth. Sizes: roughly `rate * minutes * 60` events."""

    queries: int = 100
    minutes: float = 24.0
    seed: int = 1
    rate: float = 200.0  # mean events per second over all queries
    day_seconds: int = 240  # one compressed "day" of event time
    zipf: float = 1.0
    start_ms: int = 1296086400000  # 2011-01-27T00:00:00Z
    noise_cv: float = 0.15  # per-second multiplicative (gamma) noise on the rate
    jitter_ms: float = 150.0  # mean arrival jitter (exponential): out of order by a few hundred ms
    delayed_fraction: float = 0.002  # events delayed by delay_min_s..delay_max_s
    delay_min_s: float = 2.0
    delay_max_s: float = 25.0
    late_fraction: float = 0.00005  # deliberately late events: the watermark does not wait for them
    spikes: int | None = None  # None: scaled with duration and queries
    dips: int | None = None
    outage: bool = True
    outage_seconds: int = 100
    bursts: int = 1  # delayed bursts placed automatically
    burst_queries: int = 6
    burst_seconds: int = 40
    burst_delay_s: int = 150
    extra_anomalies: tuple[Anomaly, ...] = ()  # placed as given (magnitude/baseline/rate recomputed)
    extra_bursts: tuple[DelayedBurst, ...] = ()
    # Floors the scheduler keeps for placed spikes and dips (the outage hits every query of its region).
    spike_min_baseline: float = 40.0
    spike_min_rate: float = 1.0
    dip_min_baseline: float = 60.0
    dip_min_rate: float = 2.0

    def __post_init__(self) -> None:
        if self.queries < 1:
            raise ValueError("queries must be >= 1")
        if self.minutes <= 0:
            raise ValueError("minutes must be > 0")
        if self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.day_seconds < 12:
            raise ValueError("day_seconds must be >= 12")

    # -- derived ---------------------------------------------------------------------------------
    @property
    def seconds(self) -> int:
        return int(round(self.minutes * 60))

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.seconds * SECOND

    @property
    def day_ms(self) -> int:
        return self.day_seconds * SECOND

    # -- persistence -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("extra_anomalies", "extra_bursts"):
                value = [v.to_json() for v in value]
            data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ZeitgeistConfig":
        data = dict(data)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown generator settings {sorted(unknown)}")
        if "extra_anomalies" in data:
            data["extra_anomalies"] = tuple(Anomaly(**a) for a in data["extra_anomalies"])
        if "extra_bursts" in data:
            data["extra_bursts"] = tuple(
                DelayedBurst(tuple(b["queries"]), b["start"], b["end"], b["delay_ms"]) for b in data["extra_bursts"]
            )
        return cls(**data)

    def cache_key(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


# -- queries and their traffic model ----------------------------------------------------------------
@dataclass(frozen=True)
class QueryTable:
    names: tuple[str, ...]
    regions: tuple[str, ...]
    base_rate: np.ndarray  # mean events/s per query (over a day)
    amplitude: np.ndarray  # first-harmonic amplitude of the daily profile
    amplitude2: np.ndarray  # second harmonic
    phase: np.ndarray  # fractions of a day
    phase2: np.ndarray

    def index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def profile(self, q: int | np.ndarray, seconds: np.ndarray, day_seconds: int) -> np.ndarray:
        """Mean rate (events/s) of query `q` at second offsets `seconds` (second centers), no anomaly."""
        x = (np.asarray(seconds, dtype=float) + 0.5) / day_seconds
        shape = (1.0 + self.amplitude[q] * np.sin(2 * np.pi * (x + self.phase[q]))
                 + self.amplitude2[q] * np.sin(4 * np.pi * (x + self.phase2[q])))
        rate: np.ndarray = self.base_rate[q] * shape
        return rate


def _streams(seed: int) -> dict[str, np.random.Generator]:
    names = ("queries", "schedule", "bursts", "noise", "arrival")
    children = np.random.SeedSequence([seed, 2011]).spawn(len(names))
    return {name: np.random.Generator(np.random.PCG64(child)) for name, child in zip(names, children)}


def make_queries(config: ZeitgeistConfig) -> QueryTable:
    rng = _streams(config.seed)["queries"]
    pattern = list(REGION_PATTERN)
    regions: list[str] = []
    while len(regions) < config.queries:
        rng.shuffle(pattern)
        regions.extend(pattern)
    regions = regions[: config.queries]
    names: list[str] = []
    used: set[str] = set()
    for rank, region in enumerate(regions):
        topics = _TOPICS[region]
        for attempt in range(1000):
            topic = topics[int(rng.integers(len(topics)))]
            modifier = _MODIFIERS[int(rng.integers(len(_MODIFIERS)))] if attempt < 50 else str(attempt)
            name = f"{topic} {modifier}".strip()
            if name not in used:
                break
        used.add(name)
        names.append(name)
    weights = np.arange(1, config.queries + 1, dtype=float) ** -config.zipf
    base = config.rate * weights / weights.sum()
    amplitude = rng.uniform(0.35, 0.6, config.queries)
    amplitude2 = rng.uniform(0.0, 0.15, config.queries)
    phase = np.array([REGION_PHASE[r] for r in regions]) + rng.normal(0.0, 0.02, config.queries)
    phase2 = rng.uniform(0.0, 1.0, config.queries)
    return QueryTable(tuple(names), tuple(regions), base, amplitude, amplitude2, phase, phase2)


def _baseline(table: QueryTable, config: ZeitgeistConfig, q: int, start: int, end: int) -> float:
    seconds = np.arange((start - config.start_ms) // SECOND, (end - config.start_ms) // SECOND)
    return float(table.profile(q, seconds, config.day_seconds).sum()) if len(seconds) else 0.0


# -- anomaly schedule (ground truth) ------------------------------------------------------------------
SPIKE_MAGNITUDES = (1.5, 2.0, 3.0, 4.0, 6.0, 10.0)
SPIKE_SECONDS = (5, 10, 20, 40, 90)
DIP_MAGNITUDES = (0.5, 0.7, 0.8, 0.9, 1.0)
DIP_SECONDS = (15, 30, 60, 120)
OUTAGE_MAGNITUDE = 0.97
GAP_SECONDS = 90  # minimum normal traffic between two anomalies of a query


def _usable_window(config: ZeitgeistConfig) -> tuple[int, int]:
    """Anomalies live in [warm-up day + 10%, end - 30 s]: the model needs a day of history first."""
    first = config.start_ms + int(config.day_ms * 1.1)
    last = config.end_ms - 30 * SECOND
    return first, last


def _auto_counts(config: ZeitgeistConfig) -> tuple[int, int]:
    first, last = _usable_window(config)
    usable_minutes = max(0.0, (last - first) / 60_000)
    scale = max(1.0, config.queries / 100) ** 0.5
    spikes = config.spikes if config.spikes is not None else int(round(1.5 * usable_minutes * scale))
    dips = config.dips if config.dips is not None else int(round(0.75 * usable_minutes * scale))
    return spikes, dips


class _Occupancy:
    """Per query, the intervals already taken by anomalies or bursts (with a gap around them)."""

    def __init__(self) -> None:
        self.taken: dict[str, list[tuple[int, int]]] = {}

    def free(self, query: str, start: int, end: int, gap: int) -> bool:
        return all(end + gap <= s or e + gap <= start for s, e in self.taken.get(query, []))

    def take(self, query: str, start: int, end: int) -> None:
        self.taken.setdefault(query, []).append((start, end))


def _schedule(config: ZeitgeistConfig) -> tuple[list[Anomaly], list[DelayedBurst]]:
    table = make_queries(config)
    index = table.index()
    occupancy = _Occupancy()
    anomalies: list[Anomaly] = []
    bursts: list[DelayedBurst] = []
    first, last = _usable_window(config)
    gap = GAP_SECONDS * SECOND

    def make(q: int, kind: str, start: int, end: int, magnitude: float, cause: str) -> Anomaly:
        baseline = _baseline(table, config, q, start, end)
        seconds = max(1, (end - start) // SECOND)
        return Anomaly(table.names[q], kind, start, end, float(magnitude), cause, table.regions[q],
                       round(baseline, 3), round(baseline / seconds, 4))

    for given in config.extra_anomalies:
        if given.query not in index:
            raise ValueError(f"extra anomaly on unknown query {given.query!r}")
        anomaly = make(index[given.query], given.kind, given.start, given.end, given.magnitude, given.cause)
        anomalies.append(anomaly)
        occupancy.take(anomaly.query, anomaly.start, anomaly.end)
    for burst in config.extra_bursts:
        for query in burst.queries:
            if query not in index:
                raise ValueError(f"delayed burst on unknown query {query!r}")
            occupancy.take(query, burst.start, burst.end)
        bursts.append(burst)

    rng = _streams(config.seed)["schedule"]
    if last <= first:
        return anomalies, bursts

    # The regional outage first: every query of the region, one interval.
    if config.outage:
        length = config.outage_seconds * SECOND
        lo = first + (last - first) // 4
        hi = max(lo + 1, last - length - (last - first) // 8)
        start = config.start_ms + ((int(rng.integers(lo, hi)) - config.start_ms) // SECOND) * SECOND
        end = min(start + length, last)
        for q, region in enumerate(table.regions):
            if region == OUTAGE_REGION:
                anomaly = make(q, "dip", start, end, OUTAGE_MAGNITUDE, "outage")
                anomalies.append(anomaly)
                occupancy.take(anomaly.query, start, end)

    # Spikes and dips: sizes and durations cycle through their lists in a shuffled order, so every
    # size appears; query and time are drawn until the traffic floors and the gaps hold.
    spikes, dips = _auto_counts(config)
    weights = np.sqrt(table.base_rate)
    weights = weights / weights.sum()
    plan: list[tuple[str, float, int]] = []
    for kind, count, magnitudes, durations in (("spike", spikes, SPIKE_MAGNITUDES, SPIKE_SECONDS),
                                                ("dip", dips, DIP_MAGNITUDES, DIP_SECONDS)):
        sizes = [magnitudes[i % len(magnitudes)] for i in range(count)]
        lengths = [durations[i % len(durations)] for i in range(count)]
        rng.shuffle(sizes)
        rng.shuffle(lengths)
        plan.extend((kind, m, d) for m, d in zip(sizes, lengths))
    for kind, magnitude, seconds in plan:
        min_baseline = config.spike_min_baseline if kind == "spike" else config.dip_min_baseline
        min_rate = config.spike_min_rate if kind == "spike" else config.dip_min_rate
        length = seconds * SECOND
        for _ in range(400):
            q = int(rng.choice(len(weights), p=weights))
            if last - length <= first:
                break
            start = config.start_ms + ((int(rng.integers(first, last - length)) - config.start_ms) // SECOND) * SECOND
            end = start + length
            if not occupancy.free(table.names[q], start, end, gap):
                continue
            anomaly = make(q, kind, start, end, magnitude, kind)
            if anomaly.baseline < min_baseline or anomaly.rate < min_rate:
                continue
            anomalies.append(anomaly)
            occupancy.take(anomaly.query, start, end)
            break

    # Delayed bursts: a few queries whose events of one interval all arrive minutes late.
    brng = _streams(config.seed)["bursts"]
    for _ in range(config.bursts):
        length = config.burst_seconds * SECOND
        if last - length <= first:
            break
        for _attempt in range(200):
            start = config.start_ms + ((int(brng.integers(first, last - length)) - config.start_ms) // SECOND) * SECOND
            end = start + length
            candidates = [table.names[q] for q in brng.permutation(len(table.names))[: 4 * config.burst_queries]
                          if occupancy.free(table.names[q], start, end, gap)]
            if len(candidates) >= min(config.burst_queries, len(table.names)):
                chosen = tuple(sorted(candidates[: config.burst_queries]))
                for query in chosen:
                    occupancy.take(query, start, end)
                bursts.append(DelayedBurst(chosen, start, end, config.burst_delay_s * SECOND))
                break
    anomalies.sort(key=lambda a: (a.start, a.query, a.kind))
    return anomalies, bursts


def ground_truth(config: ZeitgeistConfig) -> list[Anomaly]:
    """The injected anomalies, computed from the config alone (no events generated)."""
    return _schedule(config)[0]


def delayed_bursts(config: ZeitgeistConfig) -> list[DelayedBurst]:
    return _schedule(config)[1]


# -- events -----------------------------------------------------------------------------------------
@dataclass
class EventLog:
    """The generated log in arrival order: numpy arrays, one entry per event."""

    config: ZeitgeistConfig
    table: QueryTable
    timestamp: np.ndarray  # int64 ms, arrival order
    query: np.ndarray  # int32 index into table.names
    late: np.ndarray  # bool: deliberately late (the watermark does not wait for it)
    delayed: np.ndarray  # bool: delayed on the wire (random delay or a burst); the watermark waits
    watermark: np.ndarray  # int64: low watermark after emitting n events, n = 0..N (last = END)
    max_emitted: np.ndarray  # int64: max timestamp among the first n events, n = 0..N
    counts: np.ndarray = field(repr=False)  # (queries, seconds) event counts

    def __len__(self) -> int:
        return len(self.timestamp)

    def record(self, n: int) -> Record:
        q = int(self.query[n])
        return Record(self.table.names[q], self.table.regions[q], int(self.timestamp[n]), f"zq-{n}")


def generate(config: ZeitgeistConfig) -> EventLog:
    """Generate the whole log (deterministic). Memory: ~40 bytes per event plus 12 bytes per
    query-second."""
    table = make_queries(config)
    anomalies, bursts = _schedule(config)
    index = table.index()
    streams = _streams(config.seed)
    noise_rng, arrival_rng = streams["noise"], streams["arrival"]
    seconds = config.seconds
    second_index = np.arange(seconds)

    counts = np.empty((config.queries, seconds), dtype=np.int32)
    shape_k = 1.0 / max(config.noise_cv, 1e-6) ** 2
    factors: dict[int, np.ndarray] = {}
    for anomaly in anomalies:
        q = index[anomaly.query]
        f = factors.setdefault(q, np.ones(seconds))
        lo = (anomaly.start - config.start_ms) // SECOND
        hi = (anomaly.end - config.start_ms) // SECOND
        factor = anomaly.magnitude if anomaly.kind == "spike" else 1.0 - anomaly.magnitude
        f[lo:hi] *= factor
    for q in range(config.queries):
        rate = table.profile(q, second_index, config.day_seconds)
        if q in factors:
            rate = rate * factors[q]
        noisy = rate * noise_rng.gamma(shape_k, 1.0 / shape_k, seconds) if config.noise_cv > 0 else rate
        counts[q] = noise_rng.poisson(noisy)

    total = int(counts.sum())
    flat = counts.ravel()
    query = np.repeat(np.arange(config.queries, dtype=np.int32), counts.sum(axis=1))
    second_of = np.repeat(np.tile(second_index, config.queries), flat)
    timestamp = config.start_ms + second_of.astype(np.int64) * SECOND + arrival_rng.integers(0, SECOND, total)

    arrival = timestamp.astype(np.float64) + arrival_rng.exponential(config.jitter_ms, total)
    delayed = arrival_rng.random(total) < config.delayed_fraction
    arrival[delayed] += arrival_rng.uniform(config.delay_min_s * SECOND, config.delay_max_s * SECOND,
                                            int(delayed.sum()))
    for burst in bursts:
        members = np.isin(query, [index[q] for q in burst.queries])
        inside = members & (timestamp >= burst.start) & (timestamp < burst.end)
        arrival[inside] += burst.delay_ms
        delayed |= inside
    late = arrival_rng.random(total) < config.late_fraction
    # Deliberately late events arrive long after everything else of their time.
    late_delay = max([config.burst_delay_s * SECOND, int(config.delay_max_s * SECOND)]
                     + [b.delay_ms for b in bursts]) + 120 * SECOND
    arrival[late] += late_delay + arrival_rng.uniform(0, 60 * SECOND, int(late.sum()))
    delayed &= ~late

    order = np.argsort(arrival, kind="stable")
    timestamp, query, late, delayed = timestamp[order], query[order], late[order], delayed[order]

    # Honest low watermark: after n events, the minimum timestamp among events n.. (late excluded).
    big = np.iinfo(np.int64).max
    guarded = np.where(late, big, timestamp)
    suffix = np.minimum.accumulate(guarded[::-1])[::-1] if total else np.empty(0, dtype=np.int64)
    watermark = np.empty(total + 1, dtype=np.int64)
    watermark[:total] = suffix
    watermark[total] = END_OF_TIME
    if total:
        # Only late events left: everything on time has been emitted; promise the end of the log.
        on_time_max = int(timestamp[~late].max()) if (~late).any() else config.start_ms
        watermark[:total] = np.minimum(watermark[:total], max(on_time_max, config.start_ms))
    max_emitted = np.empty(total + 1, dtype=np.int64)
    max_emitted[0] = config.start_ms
    if total:
        max_emitted[1:] = np.maximum.accumulate(timestamp)
    return EventLog(config, table, timestamp, query, late, delayed, watermark, max_emitted, counts)


_CACHE: dict[str, EventLog] = {}
_CACHE_LOCK = threading.Lock()


def cached_log(config: ZeitgeistConfig) -> EventLog:
    """The log of `config`, generated once per process (Spark's Python workers reuse it across
    micro-batches)."""
    key = config.cache_key()
    with _CACHE_LOCK:
        log = _CACHE.get(key)
        if log is None:
            if len(_CACHE) >= 2:
                _CACHE.clear()
            log = _CACHE[key] = generate(config)
        return log


# -- the injector ------------------------------------------------------------------------------------
class ZeitgeistInjector(Injector):
    """Injects the generated log in arrival order. Offsets count emitted events.

    watermark="honest" (default): after n events, min timestamp of events not yet emitted (except the
    deliberately late). watermark="naive": max emitted timestamp minus `naive_bound_ms`, a heuristic
    that ignores delayed data: delayed events then arrive behind the watermark and are treated as
    late (useful to show what an honest watermark buys).

    Pickles as its config only; the event arrays are regenerated (deterministically) where used.
    """

    def __init__(self, config: ZeitgeistConfig, records_per_second: float | None = None,
                 max_records_per_read: int = 50_000, watermark: str = "honest",
                 naive_bound_ms: int = 2000, partitions: int = 1) -> None:
        if watermark not in ("honest", "naive"):
            raise ValueError("watermark must be 'honest' or 'naive'")
        self.config = config
        self.records_per_second = records_per_second
        self.max_records_per_read = max_records_per_read
        self.watermark_mode = watermark
        self.naive_bound_ms = naive_bound_ms
        self.partition_count = partitions
        self._inner: GeneratorInjector | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_inner"] = None
        return state

    @property
    def log(self) -> EventLog:
        return cached_log(self.config)

    def _generator(self) -> GeneratorInjector:
        if self._inner is None:
            log = self.log
            if self.watermark_mode == "honest":
                def watermark_at(n: int) -> int:
                    return int(log.watermark[n])
            else:
                bound = self.naive_bound_ms

                def watermark_at(n: int) -> int:
                    return int(log.max_emitted[n]) - bound if n else self.config.start_ms - bound
            self._inner = GeneratorInjector(log.record, len(log), watermark_at, self.records_per_second,
                                            self.max_records_per_read, partitions=self.partition_count)
        return self._inner

    def partitions(self) -> Sequence[str]:
        return tuple(str(p) for p in range(self.partition_count))

    def initial_offset(self, partition: str) -> Offset:
        return self._generator().initial_offset(partition)

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        return self._generator().latest_offset(partition, start, max_records)

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any]]:
        return self._generator().read(partition, start, end)

    def low_watermark(self, partition: str, offset: Offset) -> int:
        return self._generator().low_watermark(partition, offset)

    def next_arrival_s(self, partition: str, offset: Offset) -> float | None:
        return self._generator().next_arrival_s(partition, offset)

    def max_emitted(self, emitted: int) -> int:
        """Largest event time among the first `emitted` events (for event-time lag displays)."""
        log = self.log
        return int(log.max_emitted[max(0, min(emitted, len(log)))])


def describe(config: ZeitgeistConfig, events: int | None = None) -> str:
    """One line about the log. `events`: the exact number of searches generated (else the expected
    number, rate x duration, which the Poisson draws miss by a few percent)."""
    truth = ground_truth(config)
    kinds: dict[str, int] = {}
    for a in truth:
        kinds[a.cause] = kinds.get(a.cause, 0) + 1
    days = config.seconds / config.day_seconds
    return (f"{config.queries} queries, {config.minutes:g} min of event time ({days:.1f} days of "
            f"{config.day_seconds} s), "
            + (f"{events:,} searches" if events is not None else f"~{int(config.rate * config.seconds):,} searches")
            + f", seed {config.seed}; "
            f"anomalies: " + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))

