"""Per-key invocation for one key group (key interval) of a computation: the semantic core.

Both runners drive a computation only through `KeyGroupExecutor.step`: the harness with an
in-memory store, the Spark runner with a store whose truth is Spark's state store. A step receives
its input points (`Segment`s, see watermarks.py) and the deliveries of each, in input order, and runs
every key as if the input points came one at a time:

    for each input point j, in order:
        deliver the key's records of point j: discard duplicates of injected records (dedup by id),
        flag records stamped behind the point's low watermark as late, run `process_record`;
        fire the key's timers due by the point's advanced watermark, in (time, tag) order
    at the end: fire wall-time timers due by the step's wall clock; expire dedup ids and TTL'd state

A key with nothing in a point skips it; firing its due timers later gives the same result, since a
timer's outcome depends only on the key's own state. Each production is tagged with the input point
it belongs to (for a timer, the first point whose watermark made it due), so a consumer sees the
same input points whatever batching the runner chose.

Errors in user code follow the computation's policy: `fail` raises ComputationFailed naming the
computation, stream, key and record with the user's traceback; `dead_letter` rolls the key back to
the start of the step, publishes a dead letter for the failing record or timer, and runs the key's
step again without it, so the failed invocation leaves no trace.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, NamedTuple, Sequence

from millstream.core.deadletters import dead_letter, describe_error, user_traceback
from millstream.core.production import Produced, order_base
from millstream.core.keystate import KeyState, decoded_value
from millstream.core.plan import ComputationPlan, InputPlan, KeyExtractionError
from millstream.core.store import KeyStore, StoredKey
from millstream.core.watermarks import Segment
from millstream.model.codecs import CodecError
from millstream.model.pipeline import DEAD_LETTERS, ErrorPolicy
from millstream.model.records import END_OF_TIME, Record, TimeDomain, Timer, derive_record_id
from millstream.model.state import ListState, MapState, StateSpec, ValueState

__all__ = ["ComputationError", "ComputationFailed", "Delivery", "KeyGroupExecutor", "Produced", "StepMetrics",
           "StepResult", "inspect_key", "key_or_dead_letter"]

# A key's timers that keep re-arming themselves behind the watermark would loop inside one step.
MAX_TIMER_FIRINGS_PER_STEP = 100_000


class ComputationError(RuntimeError):
    """User code misused the context; the message names the computation and key."""


class ComputationFailed(RuntimeError):
    """User code raised under the `fail` policy. The message names the computation, input stream,
    key and record (or timer), followed by the user's own traceback."""


class Delivery(NamedTuple):
    """A record arriving at a computation, keyed by that computation's extractor for its stream."""

    key: str
    stream: str
    record: Record[Any]
    segment: int  # index of the step's input point it arrived in
    dedup: bool  # True for injected records: the only ones that can arrive twice


@dataclass
class StepMetrics:
    records: int = 0
    duplicates: int = 0
    late: int = 0
    timers_fired: int = 0
    productions: int = 0
    dead_letters: int = 0

    def add(self, other: "StepMetrics") -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def as_dict(self) -> dict[str, int]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass
class StepResult:
    productions: list[Produced]
    wake_wall: int | None  # earliest wall-time timer still pending in the key group
    metrics: StepMetrics = field(default_factory=StepMetrics)


class _UserFailure(Exception):
    """User code raised; carries what failed (a delivery index or a timer) for the error policy."""

    def __init__(self, error: BaseException, item: int | None = None, timer: tuple[str, int, str] | None = None,
                 segment: int = 0) -> None:
        super().__init__(describe_error(error))
        self.error, self.item, self.timer, self.segment = error, item, timer, segment


class _StateFlushFailed(Exception):
    """A state value could not be encoded at the end of the key's step: the culprit is unknown yet."""


class _Invocation:
    """The Context handed to user code for one key; collects productions."""

    __slots__ = ("_plan", "_state", "_key", "_low_watermark", "_wall_time", "_late", "_stream",
                 "_cause", "_produced", "_out", "_segment", "_handles", "_order", "_advanced")

    def __init__(self, plan: ComputationPlan, state: KeyState, key: str, wall_time: int, out: list[Produced]) -> None:
        self._plan = plan
        self._state = state
        self._key = key
        self._wall_time = wall_time
        self._out = out
        self._low_watermark = 0
        self._late = False
        self._stream: str | None = None
        self._cause: tuple[Any, ...] = ()
        self._produced = 0
        self._segment = 0
        self._advanced = 0  # the watermark once the current input point is processed
        self._handles: dict[str, Any] = {}
        self._order = order_base(key)  # position of the key's next production in the step's output

    def _begin(self, cause: tuple[Any, ...], stream: str | None, late: bool, low_watermark: int, segment: int,
               advanced: int) -> None:
        self._cause, self._stream, self._late, self._produced = cause, stream, late, 0
        self._low_watermark, self._segment, self._advanced = low_watermark, segment, advanced

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
        name = getattr(spec, "name", None)
        handle = self._handles.get(name)  # type: ignore[arg-type]
        if handle is not None and type(handle.spec) is type(spec):
            return handle
        # Compared by name and kind, not identity: the plan travels to Spark workers pickled.
        declared = self._plan.state_specs.get(name)  # type: ignore[arg-type]
        if declared is None or type(declared) is not type(spec):
            raise ComputationError(
                f"computation {self._plan.name!r} used state {spec!r} that is not declared as a class "
                "attribute of the computation (declare it like `count = ValueState('count')`)"
            )
        # The declared spec, not the one passed: persistence encodes with the declared codecs.
        if isinstance(declared, MapState):
            handle = _MapHandle(self, declared)
        elif isinstance(declared, ListState):
            handle = _ListHandle(self, declared)
        else:
            handle = _ValueHandle(self, declared)
        self._handles[declared.name] = handle
        return handle

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.LOW_WATERMARK) -> None:
        if not isinstance(tag, str):
            raise ComputationError(f"{self._plan.name}: timer tag must be str, got {type(tag).__name__}")
        if isinstance(time, bool) or not isinstance(time, int):
            raise ComputationError(
                f"{self._plan.name}: timer {tag!r} time must be int milliseconds, got {type(time).__name__}"
            )
        if not -END_OF_TIME <= time <= END_OF_TIME:
            raise ComputationError(f"{self._plan.name}: timer {tag!r} time {time} is out of range")
        wall = domain is TimeDomain.WALL_TIME or domain == TimeDomain.WALL_TIME.value
        if not wall and domain is not TimeDomain.LOW_WATERMARK and domain != TimeDomain.LOW_WATERMARK.value:
            raise ComputationError(f"{self._plan.name}: timer {tag!r} domain must be a TimeDomain, got {domain!r}")
        self._state.set_timer(tag, time, wall, _cause_id(self._cause), self._segment)

    def delete_timer(self, tag: str) -> None:
        self._state.timers.pop(tag, None)

    def produce(self, record: Record[Any], stream: str) -> None:
        codec = self._plan.output_codecs.get(stream)
        if codec is None:
            raise ComputationError(
                f"computation {self._plan.name!r} produced to stream {stream!r}, which is not among its "
                f"declared outputs {sorted(s for s in self._plan.output_codecs if s != DEAD_LETTERS)}"
            )
        if not isinstance(record, Record):
            raise ComputationError(f"{self._plan.name}: produce() needs a millstream.Record")
        if not isinstance(record.key, str):
            raise ComputationError(
                f"{self._plan.name}: produced record key must be str, got {type(record.key).__name__}"
            )
        if isinstance(record.timestamp, bool) or not isinstance(record.timestamp, int):
            raise ComputationError(f"{self._plan.name}: record timestamp must be int milliseconds")
        try:
            value = record.encoded_value(codec)
        except CodecError as error:
            raise CodecError(f"stream {stream!r}: {error}") from None
        record_id = derive_record_id(self._plan.name, *self._cause, self._produced)
        self._produced += 1
        self._out.append(Produced(stream, record.key, value, record.timestamp, record_id, self._segment, self._order))
        self._order += 1

    def clear(self) -> None:
        self._state.clear()
        self._handles.clear()

    def _wrote(self, spec: StateSpec) -> None:
        # Counted from the watermark once this input point is processed: a value written in the very
        # first step (judged against BEGINNING_OF_TIME) must not expire at once.
        self._state.touched(spec, self._advanced)


def _cause_id(cause: tuple[Any, ...]) -> str:
    """A short identity of an invocation, recorded with the timers it sets."""
    return derive_record_id(*map(str, cause))[:16] if cause else ""


class _ValueHandle:
    __slots__ = ("_ctx", "spec", "_ttl")

    def __init__(self, ctx: _Invocation, spec: ValueState[Any]) -> None:
        self._ctx, self.spec, self._ttl = ctx, spec, spec.ttl_ms is not None

    def get(self) -> Any:
        return self._ctx._state.cell(self.spec).get()

    def set(self, value: Any) -> None:
        self._ctx._state.cell(self.spec).set(value)
        if self._ttl:
            self._ctx._wrote(self.spec)

    def clear(self) -> None:
        self._ctx._state.cell(self.spec).clear()


class _ListHandle:
    __slots__ = ("_ctx", "spec", "_ttl")

    def __init__(self, ctx: _Invocation, spec: ListState[Any]) -> None:
        self._ctx, self.spec, self._ttl = ctx, spec, spec.ttl_ms is not None

    def get(self) -> list[Any]:
        return self._ctx._state.cell(self.spec).items  # type: ignore[no-any-return]

    def append(self, value: Any) -> None:
        self._ctx._state.cell(self.spec).items.append(value)
        if self._ttl:
            self._ctx._wrote(self.spec)

    def set(self, values: list[Any]) -> None:
        self._ctx._state.cell(self.spec).items = list(values)
        if self._ttl:
            self._ctx._wrote(self.spec)

    def clear(self) -> None:
        self._ctx._state.cell(self.spec).items = []


class _MapHandle:
    __slots__ = ("_ctx", "spec", "_ttl")

    def __init__(self, ctx: _Invocation, spec: MapState[Any, Any]) -> None:
        self._ctx, self.spec, self._ttl = ctx, spec, spec.ttl_ms is not None

    def get(self, key: Any, default: Any = None) -> Any:
        return self._ctx._state.cell(self.spec).get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._ctx._state.cell(self.spec).put(key, value)
        if self._ttl:
            self._ctx._wrote(self.spec)

    def remove(self, key: Any) -> None:
        self._ctx._state.cell(self.spec).remove(key)

    def contains(self, key: Any) -> bool:
        return self._ctx._state.cell(self.spec).contains(key)  # type: ignore[no-any-return]

    def items(self) -> Any:
        return self._ctx._state.cell(self.spec).items()

    def keys(self) -> Any:
        return self._ctx._state.cell(self.spec).keys()

    def __len__(self) -> int:
        return len(self._ctx._state.cell(self.spec))

    def clear(self) -> None:
        self._ctx._state.cell(self.spec).clear()


class _KeyStep:
    """One key through one step (see the module doc). Raises _UserFailure when user code fails."""

    def __init__(self, executor: "KeyGroupExecutor", key: str, blob: bytes | None, segments: Sequence[Segment],
                 wall_time: int, skip_items: set[int], skip_timers: set[tuple[str, int, str]],
                 flush_each: bool) -> None:
        self.plan = executor.plan
        self.key = key
        self.state = KeyState.loads(blob) if blob is not None else KeyState()
        self.segments = segments
        self.advanced = executor.advanced
        self.wall_time = wall_time
        self.out: list[Produced] = []
        self.metrics = StepMetrics()
        self.skip_items, self.skip_timers, self.flush_each = skip_items, skip_timers, flush_each
        self.ctx = _Invocation(self.plan, self.state, key, wall_time, self.out)
        self.firings = 0

    def run(self, items: Sequence[tuple[int, Delivery]]) -> None:
        plan, state, ctx = self.plan, self.state, self.ctx
        computation = plan.computation
        segments = self.segments
        current = -1  # input point of the records being delivered
        for index, delivery in items:
            j = delivery.segment
            if j != current:
                if j > 0:  # the key's timers made due before this point fire before its records
                    self.fire(segments[j - 1].advanced_to, j - 1)
                current = j
            if index in self.skip_items:
                continue
            record = delivery.record
            if delivery.dedup:
                if record.id in state.seen:
                    self.metrics.duplicates += 1
                    continue
                # Kept until the watermark has moved a horizon past the later of the point's
                # advanced watermark and the record's time: never forgotten in the step that read it.
                state.seen[record.id] = max(segments[j].advanced_to, record.timestamp)
            low_watermark = segments[j].low_watermark
            late = record.timestamp < low_watermark
            self.metrics.records += 1
            self.metrics.late += late
            ctx._begin(("r", delivery.stream, record.id), delivery.stream, late, low_watermark, j,
                       segments[j].advanced_to)
            try:
                computation.process_record(ctx, record)
                if self.flush_each:
                    state.flush(plan.state_specs)
            except Exception as error:
                raise _UserFailure(error, item=index, segment=j) from error
        last = len(segments) - 1
        self.fire(segments[last].advanced_to, last, wall=True)
        state.expire(segments[last].advanced_to, plan.dedup_horizon_ms, plan.ttls)
        try:
            state.flush(plan.state_specs)
        except CodecError as error:
            raise _StateFlushFailed(str(error)) from error

    def fire(self, low_watermark: int, boundary: int, wall: bool = False) -> None:
        """Fire the key's timers due by `low_watermark` (and by the wall clock, with `wall`) in
        (time, tag) order, each tagged with the input point it belongs to (timer_point)."""
        state, ctx, plan = self.state, self.ctx, self.plan
        lw = low_watermark
        wall_time = self.wall_time if wall else -END_OF_TIME - 1
        while state.timers:
            due = state.next_due(lw, wall_time)
            if due is None:
                return
            tag, timer = due
            if self.firings >= MAX_TIMER_FIRINGS_PER_STEP:
                raise ComputationError(
                    f"computation {plan.name!r}, key {self.key!r}: more than {MAX_TIMER_FIRINGS_PER_STEP} "
                    "timers fired in one step; a timer that re-sets itself at or behind the low watermark "
                    "fires again at once, forever"
                )
            self.firings += 1
            point = self.timer_point(tag, timer.time, timer.wall, boundary)
            del state.timers[tag]
            identity = (tag, timer.time, timer.setter)
            if identity in self.skip_timers:
                continue
            self.metrics.timers_fired += 1
            domain = TimeDomain.WALL_TIME if timer.wall else TimeDomain.LOW_WATERMARK
            at = self.segments[point].advanced_to
            ctx._begin(("t", self.key, tag, timer.time, timer.setter), None, False, at, point, at)
            try:
                plan.computation.process_timer(ctx, Timer(timer.time, tag, domain))
                if self.flush_each:
                    state.flush(plan.state_specs)
            except Exception as error:
                raise _UserFailure(error, timer=identity, segment=point) from error

    def timer_point(self, tag: str, time: int, wall: bool, boundary: int) -> int:
        """The input point a firing belongs to: the first one whose advanced watermark reached the
        timer, but not before the point in which the timer was set (wall timers: the step's last)."""
        if wall:
            return boundary
        earliest = self.state.earliest_boundary(tag)
        return min(boundary, max(earliest, bisect.bisect_left(self.advanced, time)))

    def stored(self) -> StoredKey | None:
        state = self.state
        if state.is_empty():
            return None
        lw, wall = state.wake_times(self.plan.dedup_horizon_ms, self.plan.ttls)
        return StoredKey(state.dumps(), lw, wall)


class KeyGroupExecutor:
    """Runs steps of a computation for the keys of one key group against a KeyStore."""

    def __init__(self, plan: ComputationPlan, store: KeyStore) -> None:
        self.plan = plan
        self.store = store
        self.advanced: list[int] = []

    def step(self, deliveries: Iterable[Delivery], segments: Sequence[Segment], wall_time: int,
             passthrough: Sequence[Produced] = ()) -> StepResult:
        """Run one step: `deliveries` in input order (segment, then position), then due timers.
        `passthrough` are dead letters made before the computation (key extraction, malformed
        input): published with the step's productions."""
        if not segments:
            raise ValueError("a step has at least one input point (a heartbeat: Segment(wm, wm))")
        self.advanced = [s.advanced_to for s in segments]
        by_key: dict[str, list[tuple[int, Delivery]]] = {}
        for index, delivery in enumerate(deliveries):
            items = by_key.get(delivery.key)
            if items is None:
                by_key[delivery.key] = [(index, delivery)]
            else:
                items.append((index, delivery))
        last = segments[-1].advanced_to
        keys = list(by_key)
        known = set(keys)
        keys.extend(k for k in self.store.due(last, wall_time) if k not in known)
        blobs = self.store.load(keys)
        out: list[Produced] = list(passthrough)
        metrics = StepMetrics(dead_letters=len(passthrough))
        changes: dict[str, StoredKey | None] = {}
        for key in keys:
            step = self._key_step(key, by_key.get(key, ()), blobs.get(key), segments, wall_time, out, metrics)
            changes[key] = step.stored()
            out.extend(step.out)
            metrics.add(step.metrics)
        self.store.save(changes)
        metrics.productions = len(out)
        return StepResult(out, self.store.next_wall_time(), metrics)

    def _key_step(self, key: str, items: Sequence[tuple[int, Delivery]], blob: bytes | None,
                  segments: Sequence[Segment], wall_time: int, out: list[Produced], metrics: StepMetrics) -> _KeyStep:
        """The key's step, run again without each failing input under the dead_letter policy."""
        skip_items: set[int] = set()
        skip_timers: set[tuple[str, int, str]] = set()
        flush_each = False
        for _ in range(len(items) + MAX_TIMER_FIRINGS_PER_STEP + 2):
            step = _KeyStep(self, key, blob, segments, wall_time, skip_items, skip_timers, flush_each)
            try:
                step.run(items)
                return step
            except _StateFlushFailed:
                flush_each = True  # run again, encoding after every invocation, to find the culprit
                continue
            except _UserFailure as failure:
                delivery = items[[i for i, _ in items].index(failure.item)][1] if failure.item is not None else None
                if self.plan.on_error is ErrorPolicy.FAIL:
                    raise ComputationFailed(self._failure_message(key, delivery, failure)) from None
                out.append(self._dead_letter(key, delivery, failure))
                metrics.dead_letters += 1
                if failure.item is not None:
                    skip_items.add(failure.item)
                elif failure.timer is not None:
                    skip_timers.add(failure.timer)
        raise ComputationError(f"computation {self.plan.name!r}, key {key!r}: step did not settle")

    def _failure_message(self, key: str, delivery: Delivery | None, failure: _UserFailure) -> str:
        if delivery is not None:
            where = (f"record {delivery.record.id!r} from stream {delivery.stream!r} "
                     f"(timestamp {delivery.record.timestamp})")
        else:
            tag, time, _ = failure.timer or ("?", 0, "")
            where = f"timer {tag!r} at {time}"
        return (f"computation {self.plan.name!r} failed on key {key!r}, {where}: {describe_error(failure.error)}\n"
                f"{user_traceback(failure.error)}")

    def _dead_letter(self, key: str, delivery: Delivery | None, failure: _UserFailure) -> Produced:
        if delivery is not None:
            record = delivery.record
            try:
                value = record.value
            except Exception as error:  # the value itself did not decode
                value = f"<undecodable: {describe_error(error)}>"
            return dead_letter(self.plan.name, key=key, stream=delivery.stream, sender=None, record_id=record.id,
                               timestamp=record.timestamp, value=value, error=failure.error, segment=failure.segment)
        tag, time, setter = failure.timer or ("", 0, "")
        return dead_letter(self.plan.name, key=key, stream=None, sender=None, record_id=None, timestamp=time,
                           value=None, error=failure.error, segment=failure.segment,
                           timer={"tag": tag, "time": time, "setter": setter})


def key_or_dead_letter(plan: ComputationPlan, input_plan: InputPlan, record: Record[Any], sender: str,
                       segment: int) -> str | Produced:
    """The computation's key for `record`. When the key extractor fails: under the dead_letter policy a
    dead letter instead, under fail a ComputationFailed naming computation, stream and record."""
    try:
        return input_plan.key_of(record)
    except KeyExtractionError as error:
        if plan.on_error is ErrorPolicy.FAIL:
            raise ComputationFailed(f"computation {plan.name!r}: {error}, on record {record.id!r}\n"
                                    f"{user_traceback(error.error)}") from error.error
        try:
            value = record.value
        except Exception as undecodable:
            value = f"<undecodable: {describe_error(undecodable)}>"
        return dead_letter(plan.name, key=None, stream=input_plan.stream, sender=sender, record_id=record.id,
                           timestamp=record.timestamp, value=value, error=str(error),
                           traceback_text=user_traceback(error.error), segment=segment)


def inspect_key(plan: ComputationPlan, blob: bytes | None) -> tuple[dict[str, Any], list[Timer]]:
    """A key's decoded state values (absent states omitted) and pending user timers."""
    if blob is None:
        return {}, []
    state = KeyState.loads(blob)
    values = {name: decoded_value(state.cell(spec)) for name, spec in plan.state_specs.items()
              if name in state.values}
    return values, state.user_timers()
