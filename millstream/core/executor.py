"""Per-key invocation for one shard (key interval) of a computation: the semantic core.

Both runners drive a computation only through `ShardExecutor.step`: the harness with an in-memory
store, the Spark runner with transformWithState's RocksDB-backed state. One step:

1. For each key, in arrival order: discard records whose id the key has already seen (exactly-once
   delivery), flag records behind the input low watermark as late, run `process_record`.
2. Fire due timers per key in (time, tag) order: low-watermark timers with time <= the input low
   watermark, wall-time timers with time <= the wall clock. A timer set during the step that is
   already due fires in the same step.
3. Write back every touched page: state, timers, seen ids and productions of a key change together,
   and the caller commits the step's writes and productions as one unit.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Protocol

from millstream.core.keystate import KeyState, Page
from millstream.core.plan import ComputationPlan, route
from millstream.model.records import END_OF_TIME, Record, TimeDomain, Timer, derive_record_id
from millstream.model.state import ListState, MapState, StateSpec, ValueState


# A key's timers that keep re-arming themselves behind the watermark would loop inside one step.
MAX_TIMER_FIRINGS_PER_STEP = 100_000


class ComputationError(RuntimeError):
    """User code misused the context; the message names the computation and key."""


class Delivery(NamedTuple):  # NamedTuples: built once per record, half the cost of a dataclass
    """A record arriving at a computation, keyed by that computation's extractor for its stream."""

    key: str
    stream: str
    record: Record


class Produced(NamedTuple):
    """A production, value already encoded with the output stream's codec."""

    stream: str
    key: str
    value: bytes
    timestamp: int
    id: str


@dataclass
class StepMetrics:
    records: int = 0
    duplicates: int = 0
    late: int = 0
    timers_fired: int = 0
    productions: int = 0

    def add(self, other: "StepMetrics") -> None:
        self.records += other.records
        self.duplicates += other.duplicates
        self.late += other.late
        self.timers_fired += other.timers_fired
        self.productions += other.productions


@dataclass
class StepResult:
    productions: list[Produced]
    next_lw_timer: int | None  # earliest pending low-watermark timer of the shard
    next_wall_timer: int | None
    metrics: StepMetrics = field(default_factory=StepMetrics)


class ShardStore(Protocol):
    """Where a shard's pages and index live between steps."""

    def load_index(self) -> bytes | None: ...

    def save_index(self, blob: bytes) -> None: ...

    def load_page(self, page: int) -> bytes | None: ...

    def save_page(self, page: int, blob: bytes | None) -> None: ...


class MemoryShardStore:
    """A ShardStore in a dict, for the harness."""

    def __init__(self) -> None:
        self.index: bytes | None = None
        self.pages: dict[int, bytes] = {}

    def load_index(self) -> bytes | None:
        return self.index

    def save_index(self, blob: bytes) -> None:
        self.index = blob

    def load_page(self, page: int) -> bytes | None:
        return self.pages.get(page)

    def save_page(self, page: int, blob: bytes | None) -> None:
        if blob is None:
            self.pages.pop(page, None)
        else:
            self.pages[page] = blob


class ShardIndex:
    """Per shard: each page's earliest timers, so due pages are found without reading them all."""

    def __init__(self, lw: dict[int, int] | None = None, wall: dict[int, int] | None = None) -> None:
        self.lw: dict[int, int] = lw or {}
        self.wall: dict[int, int] = wall or {}

    def due_pages(self, low_watermark: int, wall_time: int) -> set[int]:
        return {p for p, t in self.lw.items() if t <= low_watermark} | {
            p for p, t in self.wall.items() if t <= wall_time
        }

    def update(self, page_id: int, page: Page) -> None:
        for table, domain in ((self.lw, TimeDomain.LOW_WATERMARK), (self.wall, TimeDomain.WALL_TIME)):
            earliest = page.earliest(domain)
            if earliest is None:
                table.pop(page_id, None)
            else:
                table[page_id] = earliest

    def earliest(self, domain: TimeDomain) -> int | None:
        table = self.lw if domain is TimeDomain.LOW_WATERMARK else self.wall
        return min(table.values()) if table else None

    def dumps(self) -> bytes:
        return pickle.dumps((self.lw, self.wall), protocol=5)

    @classmethod
    def loads(cls, blob: bytes | None) -> "ShardIndex":
        return cls(*pickle.loads(blob)) if blob else cls()


class _Invocation:
    """The Context handed to user code for one key; collects productions."""

    __slots__ = ("_plan", "_state", "_key", "_low_watermark", "_wall_time", "_late", "_stream",
                 "_cause", "_produced", "_out")

    def __init__(self, plan: ComputationPlan, state: KeyState, key: str, low_watermark: int,
                 wall_time: int, out: list[Produced]) -> None:
        self._plan = plan
        self._state = state
        self._key = key
        self._low_watermark = low_watermark
        self._wall_time = wall_time
        self._late = False
        self._stream: str | None = None
        self._cause = ""
        self._produced = 0
        self._out = out

    def _begin(self, cause: str, stream: str | None, late: bool) -> None:
        self._cause, self._stream, self._late, self._produced = cause, stream, late, 0

    # -- Context -------------------------------------------------------------------------------
    @property
    def key(self) -> str:
        return self._key

    @property
    def low_watermark(self) -> int:
        return self._low_watermark

    @property
    def wall_time(self) -> int:
        return self._wall_time

    @property
    def is_late(self) -> bool:
        return self._late

    @property
    def input_stream(self) -> str | None:
        return self._stream

    def state(self, spec: StateSpec) -> Any:
        # Compared by name and kind, not identity: the plan travels to Spark workers pickled.
        declared = self._plan.state_specs.get(getattr(spec, "name", None))
        if declared is None or type(declared) is not type(spec):
            raise ComputationError(
                f"computation {self._plan.name!r} used state {spec!r} that is not declared as a class "
                "attribute of the computation (declare it like `count = ValueState('count')`)"
            )
        # The declared spec, not the one passed: persistence (KeyState.flush) encodes with the
        # declared codecs, so reads must decode with them too.
        if isinstance(declared, ValueState):
            return _ValueHandle(self._state, declared)
        if isinstance(declared, ListState):
            return _ListHandle(self._state, declared)
        return _MapHandle(self._state, declared)

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.LOW_WATERMARK) -> None:
        if not isinstance(tag, str):
            raise ComputationError(f"{self._plan.name}: timer tag must be str, got {type(tag).__name__}")
        if isinstance(time, bool) or not isinstance(time, int):
            raise ComputationError(
                f"{self._plan.name}: timer {tag!r} time must be int milliseconds, got {type(time).__name__}"
            )
        if not -END_OF_TIME <= time <= END_OF_TIME:
            raise ComputationError(f"{self._plan.name}: timer {tag!r} time {time} is out of range")
        self._state.timers[tag] = Timer(time, tag, domain if type(domain) is TimeDomain else TimeDomain(domain))

    def delete_timer(self, tag: str) -> None:
        self._state.timers.pop(tag, None)

    def produce(self, record: Record, stream: str) -> None:
        codec = self._plan.output_codecs.get(stream)
        if codec is None:
            raise ComputationError(
                f"computation {self._plan.name!r} produced to stream {stream!r}, which is not among its "
                f"declared outputs {sorted(self._plan.output_codecs)}"
            )
        if not isinstance(record, Record):
            raise ComputationError(f"{self._plan.name}: produce() needs a millstream.Record")
        if not isinstance(record.key, str):
            raise ComputationError(
                f"{self._plan.name}: produced record key must be str, got {type(record.key).__name__}"
            )
        if isinstance(record.timestamp, bool) or not isinstance(record.timestamp, int):
            raise ComputationError(f"{self._plan.name}: record timestamp must be int milliseconds")
        record_id = derive_record_id(self._plan.name, self._cause, self._produced)
        self._produced += 1
        self._out.append(Produced(stream, record.key, codec.encode(record.value), record.timestamp, record_id))


class _ValueHandle:
    __slots__ = ("_state", "_spec")

    def __init__(self, state: KeyState, spec: ValueState) -> None:
        self._state, self._spec = state, spec

    def get(self) -> Any:
        return self._state.value(self._spec)

    def set(self, value: Any) -> None:
        self._state.set_value(self._spec, value)

    def clear(self) -> None:
        self._state.clear_value(self._spec)


class _ListHandle:
    __slots__ = ("_state", "_spec")

    def __init__(self, state: KeyState, spec: ListState) -> None:
        self._state, self._spec = state, spec

    def get(self) -> list[Any]:
        return self._state.value(self._spec)

    def append(self, value: Any) -> None:
        self._state.value(self._spec).append(value)

    def set(self, values: list[Any]) -> None:
        self._state.set_value(self._spec, list(values))

    def clear(self) -> None:
        self._state.clear_value(self._spec)


class _MapHandle:
    __slots__ = ("_state", "_spec")

    def __init__(self, state: KeyState, spec: MapState) -> None:
        self._state, self._spec = state, spec

    def _map(self) -> dict[Any, Any]:
        return self._state.value(self._spec)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._map()[key] = value

    def remove(self, key: Any) -> None:
        self._map().pop(key, None)

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def items(self) -> Any:
        return iter(list(self._map().items()))

    def keys(self) -> Any:
        return iter(list(self._map()))

    def __len__(self) -> int:
        return len(self._map())

    def clear(self) -> None:
        self._state.clear_value(self._spec)


class ShardExecutor:
    """Runs one step of a computation for the keys of one shard against a ShardStore."""

    def __init__(self, plan: ComputationPlan, store: ShardStore) -> None:
        self.plan = plan
        self.store = store

    def step(self, deliveries: Iterable[Delivery], low_watermark: int, wall_time: int,
             advanced_watermark: int | None = None) -> StepResult:
        """Deliver `deliveries` (judged late against `low_watermark`, the input low watermark they
        were sent under), then fire every timer due by `advanced_watermark` (the input low watermark
        after these records; default: unchanged) or by `wall_time`, in (time, tag) order per key."""
        plan = self.plan
        timer_watermark = low_watermark if advanced_watermark is None else max(low_watermark, advanced_watermark)
        index = ShardIndex.loads(self.store.load_index())
        out: list[Produced] = []
        metrics = StepMetrics()

        # Page by page, so only one page of the shard is in memory at a time: its keys' records,
        # then their due timers and the due timers of its other keys, then the page is written back.
        by_page: dict[int, dict[str, list[Delivery]]] = defaultdict(dict)
        for delivery in deliveries:
            key = delivery.key
            keyed = by_page[route(key, plan.shards, plan.pages_per_shard)[1]]
            items = keyed.get(key)
            if items is None:
                keyed[key] = [delivery]
            else:
                items.append(delivery)
        due_pages = index.due_pages(timer_watermark, wall_time)
        for page_id in sorted(by_page.keys() | due_pages):
            blob = self.store.load_page(page_id)
            page = Page.loads(blob) if blob is not None else Page()
            keys = list(by_page.get(page_id, ()))
            for key in keys:
                self._deliver(key, page.key_state(key), by_page[page_id][key], low_watermark, wall_time, out,
                              metrics)
            if page_id in due_pages:
                keys.extend(page.keys_with_due_timers(timer_watermark, wall_time))
            for key in dict.fromkeys(keys):
                state = page.key_state(key)
                metrics.timers_fired += self._fire_due(key, state, timer_watermark, wall_time, out)
                _forget_old_ids(state, timer_watermark, plan.dedup_horizon_ms)
            page.flush(plan.state_specs)
            self.store.save_page(page_id, page.dumps() if page.blobs else None)
            index.update(page_id, page)
        self.store.save_index(index.dumps())
        metrics.productions = len(out)
        return StepResult(
            out,
            index.earliest(TimeDomain.LOW_WATERMARK),
            index.earliest(TimeDomain.WALL_TIME),
            metrics,
        )

    def _deliver(self, key: str, state: KeyState, items: list[Delivery], low_watermark: int, wall_time: int,
                 out: list[Produced], metrics: StepMetrics) -> None:
        plan = self.plan
        ctx = _Invocation(plan, state, key, low_watermark, wall_time, out)
        for delivery in items:
            record = delivery.record
            if record.id in state.seen:
                metrics.duplicates += 1
                continue
            # Kept for the horizon counted from the later of arrival watermark and event time:
            # a record seen before any watermark was published must not be forgotten at once.
            state.seen[record.id] = max(low_watermark, record.timestamp)
            late = record.timestamp < low_watermark
            metrics.records += 1
            metrics.late += late
            ctx._begin(f"r:{record.id}", delivery.stream, late)
            plan.computation.process_record(ctx, record)

    def _fire_due(self, key: str, state: KeyState, low_watermark: int, wall_time: int,
                  out: list[Produced]) -> int:
        fired = 0
        ctx = _Invocation(self.plan, state, key, low_watermark, wall_time, out)
        while (timer := state.due_timer(low_watermark, wall_time)) is not None:
            if fired >= MAX_TIMER_FIRINGS_PER_STEP:
                raise ComputationError(
                    f"computation {self.plan.name!r}, key {key!r}: more than {MAX_TIMER_FIRINGS_PER_STEP} "
                    "timers fired in one step; a timer that re-sets itself at or behind the low watermark "
                    "fires again at once, forever"
                )
            del state.timers[timer.tag]
            state.timers_fired += 1
            ctx._begin(f"t:{key}:{state.timers_fired}", None, False)
            self.plan.computation.process_timer(ctx, timer)
            fired += 1
        return fired


def _forget_old_ids(state: KeyState, low_watermark: int, horizon_ms: int) -> None:
    """Drop dedup ids kept longer than the horizon (in low-watermark progress since arrival)."""
    if state.seen:
        cutoff = low_watermark - horizon_ms
        if min(state.seen.values()) < cutoff:
            state.seen = {rid: wm for rid, wm in state.seen.items() if wm >= cutoff}

