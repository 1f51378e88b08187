"""Per-key invocation for one key group (key interval) of a computation: the semantic core.

Both runners drive a computation only through `KeyGroupExecutor.step` (the Spark runner through
`step_keys`, the same step given the deliveries already grouped by key): the harness with an
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
step again without it, so the failed invocation leaves no trace. That run, and any after it, keeps a
checkpoint of the key every CHECKPOINT_RECORDS records or timer firings: a later failing record or
timer rolls the key back to the last checkpoint only and replays the invocations since, so a key's
failures cost invocations linear in its records and timers, not quadratic.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field, fields
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import xxhash

from millstream.core.deadletters import dead_letter, describe_error, user_traceback
from millstream.core.garbage import bulk_work
from millstream.core.production import Produced, ProductionRow, as_produced, order_base
from millstream.core.keystate import KeyState, NotPlainData, StateCheckpoint, decoded_value
from millstream.core.plan import ComputationPlan, InputPlan, KeyExtractionError
from millstream.core.store import KeyStore, StoredKey
from millstream.core.watermarks import Segment, earliest_holds
from millstream.model.codecs import CodecError
from millstream.model.pipeline import DEAD_LETTERS, UNHELD_WATERMARK_KEY, ErrorPolicy
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME, Record, TimeDomain, Timer, timestamp_problem
from millstream.model.state import StateSpec

__all__ = ["ComputationError", "ComputationFailed", "Delivery", "DeliveryRow", "KeyGroupExecutor", "Produced",
           "StepMetrics", "StepResult", "inspect_key", "key_or_dead_letter"]

# A key's timers that keep re-arming themselves behind the watermark would loop inside one step.
MAX_TIMER_FIRINGS_PER_STEP = 100_000
# In a key's step run again after a failure, the key's state is checkpointed every this many records,
# so that a later failure replays at most this many (0: no checkpoints, every failure reruns the step).
CHECKPOINT_RECORDS = 16
MAX_CHECKPOINT_RECORDS = 256  # the records between checkpoints double up to this while none fails
# ... unless copying the key's state takes longer: checkpoints then cost at most this share of the
# records' time (None: ignore the time, for tests that count invocations).
CHECKPOINT_COPY_SHARE: float | None = 0.25
_WALL, _LOW_WATERMARK = TimeDomain.WALL_TIME, TimeDomain.LOW_WATERMARK
_new_tuple = tuple.__new__  # a NamedTuple without its Python-level __new__
_hex128 = xxhash.xxh3_128_hexdigest
# An int of at most this many bits is in [BEGINNING_OF_TIME, END_OF_TIME]; of those only BEGINNING_OF_TIME
# has one bit more (the checks off the hot path let it through). One call costs less than two
# comparisons of ints as large as timestamps.
_TIME_BITS = END_OF_TIME.bit_length()
# A production id: the first 24 hex digits of the xxh3_128 of its text (derive_record_id). The slice is
# built once: `[:24]` builds one per production.
_ID_DIGITS = slice(24)
_NO_SKIPPED_ITEMS: frozenset[int] = frozenset()  # a key's first run of a step skips nothing
# A timer firing within a key's step, as failures name it and reruns skip it: (tag, time, setter,
# the input point it fires at). The point tells apart two firings of one timer set twice by the same
# invocation (a record delivered twice, with exactly_once=False): at most one fires per point.
FiringId = tuple[str, int, str, int]
_NO_SKIPPED_TIMERS: frozenset[FiringId] = frozenset()
_NO_TIMERS_MET: list[FiringId] = []  # shared and never added to (nothing is skipped)
# A key's hold changes until its first (most keys hold nothing): shared, replaced rather than added to.
_NO_HOLD_CHANGES: list[tuple[int, int | None]] = []
TIME_TEXTS = 4096  # at most this many timer times' texts kept (_KeyStep.time_text)
# At most this many Timers kept (by tag, for other keys' firings: _KeyStep.fire_timers) when a key's
# timers start to fire.
TIMER_OBJECTS = 4096
_NO_SPEC = object()  # no state asked for yet (None is a mistake user code can make: it must reach the check)


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


# A Delivery's fields as a plain tuple, which a step takes as well: what the Spark operator unpacks its
# bundles to, one per record (a tuple subclass costs several times as much to build and to free).
DeliveryRow = tuple[str, str, Record[Any], int, bool]
_as_delivery = partial(tuple.__new__, Delivery)  # a row as a Delivery (failures only)


@dataclass(slots=True)
class StepMetrics:
    records: int = 0
    duplicates: int = 0
    late: int = 0
    timers_fired: int = 0
    productions: int = 0
    dead_letters: int = 0
    state_bytes: int = 0  # bytes of the state the step changed: changed keys' blobs and new dedup ids
    # Net change in the user timers pending (set minus fired or deleted): summed over steps, like every
    # counter here, it is the number of timers pending.
    pending_timers: int = 0

    def add(self, other: "StepMetrics") -> None:
        self.records += other.records
        self.duplicates += other.duplicates
        self.late += other.late
        self.timers_fired += other.timers_fired
        self.productions += other.productions
        self.dead_letters += other.dead_letters
        self.state_bytes += other.state_bytes
        self.pending_timers += other.pending_timers

    def as_dict(self) -> dict[str, int]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass
class StepResult:
    rows: list[ProductionRow]  # the step's productions, in the order made, as rows
    wake_wall: int | None  # earliest wall-time timer still pending in the key group
    metrics: StepMetrics = field(default_factory=StepMetrics)
    # Per input point, the earliest time a pending timer of the key group holds the output watermark
    # at once the point is processed (None: nothing held there); None if nothing was held at all.
    holds: list[int | None] | None = None

    @property
    def productions(self) -> list[Produced]:
        return list(map(as_produced, self.rows))


class _UserFailure(Exception):
    """User code raised; carries what failed (positions in the key's deliveries, or a timer) for the
    error policy."""

    def __init__(self, error: BaseException, items: tuple[int, ...] = (), timer: FiringId | None = None,
                 segment: int = 0) -> None:
        super().__init__(describe_error(error))
        self.error, self.items, self.timer, self.segment = error, items, timer, segment


def _positions(items: Sequence[DeliveryRow], first: int, chosen: Sequence[DeliveryRow]) -> tuple[int, ...]:
    """The positions in the key's deliveries of those `chosen` among `items` (which start at position
    `first`): found by identity, since two deliveries can be equal. Only for failures: it is linear."""
    wanted = set(map(id, chosen))
    return tuple(position for position, delivery in enumerate(items, first) if id(delivery) in wanted)


class _Checkpoint(NamedTuple):
    """A key's step between two records of an input point (_KeyStep.checkpoint): what a rollback to
    it restores."""

    state: StateCheckpoint  # the key's state (KeyState.checkpoint)
    productions: int  # len(_KeyStep.out)
    seen: int  # len(_KeyStep.seen): the dedup ids of this step, in the order added
    metrics: "StepMetrics"
    order: int  # _Invocation._order: the position of the key's next production
    set_at: dict[str, int]
    timer_changes: int
    hold_changes: list[tuple[int, int | None]]
    firings: int  # _KeyStep.firings
    timers_skipped: int  # len(_KeyStep.timers_skipped)


class _DueRest(NamedTuple):
    """Due timers not fired yet when firing stopped (_KeyStep.fire_timers), in firing order: valid
    while the key's timers are as then (the context's timer_changes is `version`)."""

    # (time, tag); or, `checked`, ((input point, time), tag), among them entries of timers changed since
    # (passed over when met: _KeyStep.current)
    due: list[tuple[Any, str]]
    version: int
    checked: bool = False


def _due_now(timer: tuple[int, bool, str, str], low_watermark: int, keyed_at: Mapping[str, int],
             wall_time: int) -> bool:
    """Whether a timer (KeyState.timers' fields) is due in the firing: by the wall clock, its keyed
    watermark, or the low watermark."""
    return timer[0] <= (wall_time if timer[1] else keyed_at.get(timer[3], BEGINNING_OF_TIME) if timer[3]
                        else low_watermark)


class _StateFlushFailed(Exception):
    """A state value could not be encoded at the end of the key's step: the culprit is unknown yet."""


class _Invocation:
    """The Context handed to user code for one key; collects productions."""

    __slots__ = ("_plan", "_state", "_key", "_low_watermark", "_wall_time", "_late", "_stream",
                 "_cause", "_first_id", "_setter", "_produced", "_out", "_segment", "_handles", "_order", "_advanced",
                 "_inputs", "_after", "_by_spec", "_name", "_codecs", "_segments", "_last_spec", "_last_handle",
                 "_timers", "timer_changes", "changed_timers", "set_at", "_holds", "hold_changes")

    def __init__(self, plan: ComputationPlan, state: KeyState, key: str, wall_time: int, out: list[ProductionRow],
                 segments: Sequence[Segment] = ()) -> None:
        self._plan = plan
        self._segments = segments  # the step's input points (keyed watermarks are read from them)
        self._state = state
        self._timers = state.timers  # the key's pending timers (KeyState.timers: tag -> their fields)
        # Changes to the key's timers by user code (set, deleted, cleared): firing looks at them (in
        # changed_timers) when it moves.
        self.timer_changes = 0
        # While timers fire: the tag of each change user code made to the key's timers since the firing
        # loop last looked, one per change counted in timer_changes (None: a clear()).
        self.changed_timers: list[str | None] | None = None
        # tag -> the input point a timer was set in, for timers set this step after the first point:
        # such a timer does not fire at an earlier point (see _KeyStep.timer_point).
        self.set_at: dict[str, int] = {}
        self._holds = state.holds  # tag -> the time a pending timer holds the output watermark at
        # (input point, the key's earliest hold as that point left it) for each point in which the key's
        # holds changed, in order; the last point's hold is taken at the end (holds_by_point).
        self.hold_changes = _NO_HOLD_CHANGES
        self._key = key
        self._wall_time = wall_time
        self._out = out
        self._low_watermark = 0
        self._late = False
        self._stream: str | None = None
        self._cause: str | None = ""  # what this invocation's production ids derive from (None: see _first_id)
        # A timer firing's first production id's text, f"{name}\x1f{cause}\x1f0", built at once instead
        # of its cause (None for records: their cause is their timers' setter, needed anyway).
        self._first_id: str | None = None
        self._setter: str | None = ""  # what timers set here record as their setter (None: not derived yet)
        self._produced = 0
        self._segment = 0
        self._advanced = 0  # the watermark once the current input point is processed
        self._inputs: tuple[tuple[str, int, int], ...] = ()  # per input stream, at the current point
        self._after = False  # in process_timer: input watermarks after the point
        self._handles: dict[str, Any] = {}
        self._by_spec: dict[int, tuple[StateSpec, Any]] = {}  # id(spec passed) -> (that spec, its handle)
        # The spec asked for last and its handle: most code reads one state again and again.
        self._last_spec: Any = _NO_SPEC
        self._last_handle: Any = None
        self._order = order_base(key)  # position of the key's next production in the step's output
        self._name = plan.name
        self._codecs = plan.output_codecs

    def position(self) -> tuple[int, dict[str, int], int, list[tuple[int, int | None]]]:
        """(the key's next production's order, set_at, timer_changes, hold_changes): what rewind()
        takes back."""
        return self._order, dict(self.set_at), self.timer_changes, list(self.hold_changes)

    def rewind(self, order: int, set_at: dict[str, int], timer_changes: int,
               hold_changes: list[tuple[int, int | None]]) -> None:
        """Go on from position() as another context had it (a step restored to a checkpoint)."""
        self._order, self.set_at, self.timer_changes = order, dict(set_at), timer_changes
        self.hold_changes = list(hold_changes) if hold_changes else _NO_HOLD_CHANGES

    def holds_change(self, point: int) -> None:
        """Note that the key's holds are about to change at input point `point`. The first change at
        a point closes the entry of the point before (hold_changes: that point, the key's earliest
        hold as it left it): the earliest hold is taken once per point, not once per change, which
        would cost a key setting many held timers each of the others again."""
        changes = self.hold_changes
        if changes is _NO_HOLD_CHANGES:
            self.hold_changes = [(point, None)]
        elif changes[-1][0] != point:
            holds = self._holds
            changes[-1] = (changes[-1][0], min(holds.values()) if holds else None)
            changes.append((point, None))

    def follow_timers(self) -> None:
        """Take the key's timers again from its state (KeyState.checkpoint may replace the dict)."""
        self._timers = self._state.timers

    def _begin(self, cause: str, setter: str | None, stream: str | None, late: bool, low_watermark: int,
               segment: int, advanced: int, inputs: tuple[tuple[str, int, int], ...] = (),
               after: bool = False) -> None:
        self._cause, self._setter, self._stream, self._late, self._produced = cause, setter, stream, late, 0
        self._first_id = None
        self._low_watermark, self._segment, self._advanced = low_watermark, segment, advanced
        self._inputs, self._after = inputs, after

    # -- Context -------------------------------------------------------------------------------
    if TYPE_CHECKING:
        @property
        def key(self) -> str: ...

        @property
        def low_watermark(self) -> int: ...

        @property
        def wall_time(self) -> int: ...

        @property
        def is_late(self) -> bool: ...

        @property
        def input_stream(self) -> str | None: ...
    else:  # read-only, and read with no Python frame: user code reads them once per invocation or more
        key = property(attrgetter("_key"))
        low_watermark = property(attrgetter("_low_watermark"))
        wall_time = property(attrgetter("_wall_time"))
        is_late = property(attrgetter("_late"))
        input_stream = property(attrgetter("_stream"))

    def input_watermark(self, stream: str) -> int:
        for name, before, after in self._inputs:
            if name == stream:
                return after if self._after else before
        raise ComputationError(f"computation {self._plan.name!r} has no input stream {stream!r}; its inputs: "
                               f"{sorted(i.stream for i in self._plan.inputs)}")

    def watermark(self, key: str) -> int:
        if self._segments and key != UNHELD_WATERMARK_KEY:  # the runners' own (plan.watermark_keys)
            for name, before, after in self._segments[self._segment].keyed:
                if name == key:
                    return after if self._after else before
        raise ComputationError(f"computation {self._plan.name!r}: no input carries watermark key {key!r}; the "
                               f"keyed watermarks its inputs carry: {list(self._plan.watermark_keys)}")

    def state(self, spec: StateSpec) -> Any:
        if spec is self._last_spec:
            return self._last_handle
        known = self._by_spec.get(id(spec))
        if known is not None and known[0] is spec:  # the spec object seen before in this key's step
            handle = known[1]
        else:
            handle = self._handle(spec)
            self._by_spec[id(spec)] = (spec, handle)
        self._last_spec, self._last_handle = spec, handle
        return handle

    def _handle(self, spec: StateSpec) -> Any:
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
        # The declared spec, not the one passed: persistence encodes with the declared codecs. The
        # handle is the state's cell itself (keystate.py): one call per access.
        handle = self._state.cell(declared, self._wrote if declared.ttl_ms is not None else None)
        self._handles[declared.name] = handle
        return handle

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.LOW_WATERMARK,
                  watermark: str | None = None, hold: int | None = None) -> None:
        if type(tag) is not str or type(time) is not int or time.bit_length() > _TIME_BITS:
            self._bad_timer(tag, time)  # raises, unless time is BEGINNING_OF_TIME
        if domain is _LOW_WATERMARK:  # a module constant: an enum member's attribute lookup costs more
            wall = False
        elif domain is _WALL or domain == TimeDomain.WALL_TIME.value:
            wall = True
        elif domain == TimeDomain.LOW_WATERMARK.value:
            wall = False
        else:
            raise ComputationError(f"{self._plan.name}: timer {tag!r} domain must be a TimeDomain, got {domain!r}")
        if watermark is not None:
            self._check_watermark_key(tag, watermark, wall)
        setter = self._setter
        if setter is None:  # a timer firing sets a timer: its identity, hashed to stay bounded
            setter = self._setter = timer_setter(self.cause())
        if hold is None:
            self._timers[tag] = (time, wall, setter, watermark or "")
            if self._holds and tag in self._holds:  # set again without a hold: released
                self.holds_change(self._segment)
                del self._holds[tag]
        else:
            self._set_holding(tag, (time, wall, setter, watermark or ""), hold)
        self.timer_changes += 1
        if self.changed_timers is not None:
            self.changed_timers.append(tag)
        if self._segment:  # in the first point there is no earlier one to keep it from (and points
            self.set_at[tag] = self._segment  # only move forward: nothing is set at 0 after a later one)

    def _check_watermark_key(self, tag: str, watermark: str, wall: bool) -> None:
        if wall:
            raise ComputationError(f"{self._plan.name}: timer {tag!r} follows watermark key {watermark!r}, so its "
                                   "domain is the low watermark's, not wall time")
        if watermark not in self._plan.watermark_keys:
            raise ComputationError(f"{self._plan.name}: timer {tag!r} follows watermark key {watermark!r}, which no "
                                   f"input carries; the keyed watermarks its inputs carry: "
                                   f"{list(self._plan.watermark_keys)}")

    def _bad_timer(self, tag: Any, time: Any) -> None:
        if not isinstance(tag, str):
            raise ComputationError(f"{self._plan.name}: timer tag must be str, got {type(tag).__name__}")
        if isinstance(time, bool) or not isinstance(time, int):
            raise ComputationError(
                f"{self._plan.name}: timer {tag!r} time must be int milliseconds, got {type(time).__name__}"
            )
        if not BEGINNING_OF_TIME <= time <= END_OF_TIME:  # a record's range: a timer may be set at its timestamp
            raise ComputationError(f"{self._plan.name}: timer {tag!r} time {time} is out of range")

    def _set_holding(self, tag: str, timer: tuple[int, bool, str, str], hold: Any) -> None:
        """set_timer's part for a timer that holds the watermark (off the common path)."""
        if type(hold) is not int or not BEGINNING_OF_TIME <= hold <= END_OF_TIME:
            self._bad_hold(tag, hold)
        self.holds_change(self._segment)
        self._timers[tag] = timer
        self._holds[tag] = hold

    def _bad_hold(self, tag: str, hold: Any) -> None:
        if isinstance(hold, bool) or not isinstance(hold, int):
            raise ComputationError(
                f"{self._plan.name}: timer {tag!r} hold must be int milliseconds (a record timestamp), "
                f"got {type(hold).__name__}")
        raise ComputationError(f"{self._plan.name}: timer {tag!r} hold {hold} is out of range")

    def delete_timer(self, tag: str) -> None:
        if type(tag) is not str:
            self._bad_timer(tag, 0)
        if self._timers.pop(tag, None) is not None:
            self.timer_changes += 1
            if self.changed_timers is not None:
                self.changed_timers.append(tag)
            holds = self._holds
            if holds and tag in holds:
                self.holds_change(self._segment)
                del holds[tag]

    def produce(self, record: Record[Any], stream: str) -> None:
        codec = self._codecs.get(stream)
        if codec is None or type(record) is not Record or type(record.key) is not str or \
                type(record.timestamp) is not int or record.timestamp.bit_length() > _TIME_BITS:
            # Raises, unless only types are subclasses (of Record, say) or the time is BEGINNING_OF_TIME.
            self._bad_production(record, stream)
            value = self._encoded(record, stream, self._codecs[stream])
        else:
            try:  # a Record made by user code holds its value (inlined: the common case)
                value = codec.encode(record._value) if record._codec is None else record.encoded_value(codec)
            except CodecError as error:
                raise CodecError(f"stream {stream!r}: {error}") from None
        produced = self._produced
        text = self._first_id
        if produced or text is None:
            text = f"{self._name}\x1f{self.cause()}\x1f{produced}"
        record_id = _hex128(text.encode())[_ID_DIGITS]
        self._produced = produced + 1
        order = self._order
        self._out.append((stream, record.key, value, record.timestamp, record_id, self._segment, order))
        self._order = order + 1

    @staticmethod
    def _encoded(record: Record[Any], stream: str, codec: Any) -> bytes:
        """A production's value under its stream's codec, off the common path (a subclass of Record, say)."""
        try:
            return record.encoded_value(codec)
        except CodecError as error:
            raise CodecError(f"stream {stream!r}: {error}") from None

    def _bad_production(self, record: Any, stream: str) -> None:
        if isinstance(stream, Record) and isinstance(record, str):
            raise ComputationError(f"{self._plan.name}: produce() takes the record first, then the stream: "
                                   f"produce(record, {record!r})")
        if stream not in self._plan.output_codecs:
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
        problem = timestamp_problem(record.timestamp)
        if problem is not None:
            raise ComputationError(f"{self._plan.name}: a produced record's timestamp {problem}")

    def cause(self) -> str:
        """What this invocation's production ids derive from (record_cause or timer_cause)."""
        cause = self._cause
        if cause is None:  # a timer firing's: inside its first production id's text
            cause = self._cause = self._first_id[len(self._name) + 1:-2]  # type: ignore[index]
        return cause

    def clear(self) -> None:
        if self._holds:
            self.holds_change(self._segment)
        self._state.clear()
        self.timer_changes += 1
        if self.changed_timers is not None:
            self.changed_timers.append(None)

    def _wrote(self, spec: StateSpec) -> None:
        # Counted from the watermark once this input point is processed: a value written in the very
        # first step (judged against BEGINNING_OF_TIME) must not expire at once.
        self._state.touched(spec, self._advanced)


def record_cause(stream: str, record_id: str) -> str:
    """The identity of a record's invocation: its productions' ids derive from it, and the timers it
    sets record it as their setter. Unique per computation: a record is delivered once."""
    return f"r\x1f{stream}\x1f{record_id}"


def timer_cause(key: str, tag: str, time: int, setter: str) -> str:
    """The identity of a timer firing: (key, tag, time) and the invocation that set it, so a key
    reborn after losing all its state still fires timers with fresh identities (no counter)."""
    return f"t\x1f{key}\x1f{tag}\x1f{time}\x1f{setter}"


def timer_setter(cause: str) -> str:
    """A firing's identity as the setter of the timers it sets: hashed, so chains of timers setting
    timers stay bounded in size."""
    return xxhash.xxh3_64_hexdigest(cause.encode())


def _next_interval(interval: int, failed: bool, started: float, copied: float, done: int) -> int:
    """The invocations (records or firings) before the next checkpoint, after a run of `done` of them
    whose checkpoint was taken from `started` to `copied` (perf_counter): long enough that a
    checkpoint costs at most CHECKPOINT_COPY_SHARE of the invocations' time (a large state is copied
    seldom), doubling up to MAX_CHECKPOINT_RECORDS while none fails."""
    floor = CHECKPOINT_RECORDS
    if CHECKPOINT_COPY_SHARE and done:
        per_invocation = (time.perf_counter() - copied) / done
        floor = max(floor, int((copied - started) / (CHECKPOINT_COPY_SHARE * per_invocation or 1e-9)))
    return floor if failed else max(floor, min(2 * interval, MAX_CHECKPOINT_RECORDS))


class _KeyStep:
    """One key through one step (see the module doc). Raises _UserFailure when user code fails."""

    __slots__ = ("plan", "key", "state", "segments", "advanced", "wall_time", "out", "metrics", "skip_items",
                 "skip_timers", "flush_each", "on_failure", "on_timer_failure", "seen", "seen_before", "ctx",
                 "keyed_advanced", "keyed_after", "time_texts", "timer_objects", "firings", "timers_before",
                 "hold_before", "timers_skipped")

    def __init__(self, executor: "KeyGroupExecutor", key: str, blob: bytes | None, segments: Sequence[Segment],
                 wall_time: int, skip_items: AbstractSet[int], skip_timers: AbstractSet[FiringId],
                 flush_each: bool, on_failure: Callable[[_UserFailure], None] | None = None) -> None:
        self.plan = executor.plan
        self.key = key
        self.state = KeyState.loads(blob) if blob is not None else KeyState()
        self.segments = segments
        self.advanced = executor.advanced
        self.wall_time = wall_time
        self.out: list[ProductionRow] = []
        self.metrics = StepMetrics()
        self.skip_items, self.skip_timers, self.flush_each = skip_items, skip_timers, flush_each
        # Given (a run after a failure, dead_letter policy): records are delivered between checkpoints,
        # a record's failure is handed to it (the policy: dead letter, skip) and the step goes back to
        # the last checkpoint. (Not with flush_each: checkpoints share the persisted encodings, valid
        # only between flushes; nor under the batch hook: a call takes a point's records at once.)
        self.on_failure = on_failure if (on_failure is not None and CHECKPOINT_RECORDS and not flush_each
                                         and not executor.plan.batched) else None
        # The same for timers (fire), under the batch hook too: a firing is one timer.
        self.on_timer_failure = on_failure if (on_failure is not None and CHECKPOINT_RECORDS
                                               and not flush_each) else None
        self.seen: dict[str, int] = {}  # ids of injected records this step, with their marks
        self.seen_before = executor.store.seen_ids(key)  # the key's ids of earlier steps
        self.ctx = _Invocation(self.plan, self.state, key, wall_time, self.out, segments)
        self.keyed_advanced = executor.keyed_advanced
        self.keyed_after = executor.keyed_after
        self.time_texts = executor.time_texts
        self.timer_objects = executor.timer_objects
        self.firings = 0
        self.timers_before = len(self.state.timers)
        self.hold_before = self.state.hold() if self.state.holds else None
        # Timers that failed in an earlier run, met in this one (fire() adds only where skip_timers holds any,
        # or may come to: on_timer_failure adds to it).
        self.timers_skipped: list[FiringId] = \
            [] if skip_timers or self.on_timer_failure is not None else _NO_TIMERS_MET

    def run(self, items: Sequence[DeliveryRow]) -> None:
        """The key's deliveries in input order. A delivery is known by its position in `items` (the
        same list in every run of the key's step): what failed, and what a rerun skips."""
        plan, segments = self.plan, self.segments
        deliver = self.deliver if self.on_failure is None else self.deliver_with_checkpoints
        position, count = 0, len(items)
        if self.state.written:  # what the step before left past its TTL (a TTL shortened since, say)
            self.state.expire(segments[0].low_watermark, plan.ttls)
        if len(segments) == 1 and count:  # one input point (the common step): no runs to find
            deliver(items, 0, 0)
            position = count
        while position < count:  # the key's records, one input point at a time
            j = items[position][3]  # its segment
            end = position + 1
            while end < count and items[end][3] == j:
                end += 1
            if j > 0:  # the key's timers made due before this point fire before its records
                self.fire(segments[j - 1].advanced_to, j - 1)
                if self.state.written:  # and what the point before left past its TTL is gone
                    self.state.expire(segments[j - 1].advanced_to, plan.ttls)
            deliver(items[position:end], j, position)
            position = end
        last = len(segments) - 1
        self.fire(segments[last].advanced_to, last, wall=True)
        state = self.state
        if state.written:
            state.expire(segments[last].advanced_to, plan.ttls)
        try:
            state.flush(plan.state_specs, last=True)
        except CodecError as error:
            raise _StateFlushFailed(str(error)) from error
        state.end_step()

    def deliver(self, items: Sequence[DeliveryRow], j: int, first: int) -> None:
        """The key's records of input point j (`items`, from position `first` of the key's) that
        reach user code, one by one to process_record, or (plan.batched) together to
        process_records: those neither skipped (dead-lettered in an earlier run of this step) nor
        duplicates of injected records already seen. Counts records, duplicates and late records.
        (_begin inlined: this is the per-record hot path.)"""
        state, ctx, plan = self.state, self.ctx, self.plan
        process_record = plan.computation.process_record
        low_watermark, advanced, inputs = self.segments[j][:3]
        flush_each = self.flush_each
        seen, seen_before = self.seen, self.seen_before
        # What every invocation of this point shares (see _Invocation._begin).
        ctx._low_watermark, ctx._segment, ctx._advanced, ctx._inputs, ctx._after = (
            low_watermark, j, advanced, inputs, False)
        ctx._first_id = None  # records' ids derive from _cause, set per record
        skip = self.skip_items
        chosen: Sequence[DeliveryRow] = items
        if skip:
            chosen = []
            for position, delivery in enumerate(items, first):
                if position not in skip:
                    chosen.append(delivery)
                elif delivery[4]:  # dedup; dead-lettered: that is its outcome, and a copy of it a duplicate
                    record = delivery[2]
                    seen.setdefault(record.id, advanced if advanced > record.timestamp else record.timestamp)
        batch: list[DeliveryRow] | None = [] if plan.batched else None
        late = duplicates = 0  # counted in this key's run (a failure discards the run's metrics)
        for delivery in chosen:
            _, stream, record, _, dedup = delivery
            timestamp, rid = record.timestamp, record.id
            if dedup:
                if (rid in seen or rid in seen_before) and not (j and self.forgotten(rid, j)):
                    duplicates += 1
                    continue
                # Kept until the watermark has moved a horizon past the later of the point's
                # advanced watermark and the record's time: never forgotten in the step that read it.
                seen[rid] = advanced if advanced > timestamp else timestamp
            late_record = timestamp < low_watermark
            if late_record:
                late += 1
            if batch is not None:
                batch.append(delivery)
                continue
            cause = f"r\x1f{stream}\x1f{rid}"  # record_cause()
            ctx._cause = ctx._setter = cause
            ctx._stream, ctx._late, ctx._produced = stream, late_record, 0
            try:
                process_record(ctx, record)
                if flush_each:
                    state.flush(plan.state_specs)
            except Exception as error:
                raise _UserFailure(error, items=_positions(items, first, (delivery,)), segment=j) from error
        metrics = self.metrics
        metrics.records += len(chosen) - duplicates
        metrics.duplicates += duplicates
        metrics.late += late
        if batch:
            self.deliver_batch(batch, items, j, first)

    def forgotten(self, rid: str, j: int) -> bool:
        """Whether the id `rid`, seen before, was forgotten by input point j: its mark is past the
        dedup horizon at the watermark the point before left, as if the points came one at a time
        (a step forgets ids only at its end; the store, DedupIndex.expire, by the same rule)."""
        mark = self.seen.get(rid)
        if mark is None:
            mark = self.seen_before[rid]
        return mark < self.segments[j - 1].advanced_to - self.plan.dedup_horizon_ms

    def deliver_with_checkpoints(self, items: Sequence[DeliveryRow], j: int, first: int) -> None:
        """deliver(), a run of records at a time, with a checkpoint before each run: a record that
        fails is handed to on_failure (which skips it from then on), the key is rolled back to the
        checkpoint, and the records since are delivered again up to the failed one. Runs start at
        CHECKPOINT_RECORDS records and double while no record fails, up to MAX_CHECKPOINT_RECORDS or
        longer when the checkpoint's copy is slow (CHECKPOINT_COPY_SHARE). The outcome does not depend
        on where the checkpoints fall, only the cost.
        A checkpoint serves one rollback: code that fails again on the way back (it is not
        deterministic) makes the step start over, as before checkpoints."""
        position, count = 0, len(items)
        interval = CHECKPOINT_RECORDS
        while position < count:
            end = min(position + interval, count)
            started = time.perf_counter()
            checkpoint = self.checkpoint()
            copied = time.perf_counter()
            failed = False
            while True:
                try:
                    self.deliver(items[position:end], j, first + position)
                    break
                except _UserFailure as failure:
                    if checkpoint is None:  # the state is not plain data, or code failed anew on the way back
                        raise  # (it is not deterministic): the step starts over instead
                    self.restore(checkpoint)
                    checkpoint = None  # spent
                    self.on_failure(failure)  # type: ignore[misc]
                    end = max(failure.items) - first + 1  # replay up to the failed record, now skipped
                    for delivery in items[position:end]:  # code may have changed a value it read in place
                        delivery[2].decode_again()
                    failed = True
            interval = _next_interval(interval, failed, started, copied, end - position)
            position = end

    def checkpoint(self) -> _Checkpoint | None:
        """The key's step as it is now, or None if its state holds a value that is not plain data."""
        try:
            state = self.state.checkpoint()
        except NotPlainData:
            return None
        self.ctx.follow_timers()  # the checkpoint may have put the timers in a journaled dict
        metrics = StepMetrics()
        metrics.add(self.metrics)
        return _Checkpoint(state, len(self.out), len(self.seen), metrics, *self.ctx.position(), self.firings,
                           len(self.timers_skipped))

    def restore(self, checkpoint: _Checkpoint) -> None:
        """The key's step as it was at `checkpoint` (between two invocations: no timer fires meanwhile),
        with a new context, as a run that starts over has: code that keeps handles per context gets
        the restored state's. The checkpoint is spent."""
        state = self.state = KeyState.restored(checkpoint.state)
        ctx = self.ctx = _Invocation(self.plan, state, self.key, self.wall_time, self.out, self.segments)
        state.report_writes_to(ctx._wrote)
        ctx.rewind(checkpoint.order, checkpoint.set_at, checkpoint.timer_changes, checkpoint.hold_changes)
        del self.out[checkpoint.productions:]
        seen = self.seen
        while len(seen) > checkpoint.seen:  # ids are only added in a step: the newest go
            seen.popitem()
        self.metrics = StepMetrics()
        self.metrics.add(checkpoint.metrics)
        self.firings = checkpoint.firings
        del self.timers_skipped[checkpoint.timers_skipped:]

    def deliver_batch(self, admitted: list[DeliveryRow], items: Sequence[DeliveryRow], j: int, first: int) -> None:
        """process_records: the key's admitted records of input point j in one call (`items`, from
        position `first`, are all the key's records of the point: failures name positions in them)."""
        low_watermark, advanced, inputs = self.segments[j][:3]
        _, stream, head, _, _ = admitted[0]
        cause = record_cause(stream, head.id)
        self.ctx._begin(cause, cause, stream, False, low_watermark, j, advanced, inputs)
        try:
            self.plan.computation.process_records(self.ctx, [delivery[2] for delivery in admitted])
            if self.flush_each:
                self.state.flush(self.plan.state_specs)
        except Exception as error:
            raise _UserFailure(error, items=_positions(items, first, admitted), segment=j) from error

    def fire(self, low_watermark: int, boundary: int, wall: bool = False) -> None:
        """Fire the key's timers due by `low_watermark` (and by the wall clock, with `wall`), each
        at the input point it belongs to (timer_point), in (point, time, tag) order.

        In a run after a failure (dead_letter policy), firings go in runs with a checkpoint before
        each, as records do (deliver_with_checkpoints): a timer that fails is handed to
        on_timer_failure (which skips it from then on), the key is rolled back to the checkpoint and
        the firings since are made again up to the failed one. Firing stops between two timers and
        goes on in the same order, from the rest of the sorted due timers (not sorted again: a key
        with many failing timers would sort them all once per failure)."""
        if self.on_timer_failure is None:
            self.fire_timers(low_watermark, boundary, wall)
            return
        rest = self.fire_timers(low_watermark, boundary, wall, 0)  # sorted, none fired
        if rest is None:  # nothing due: no checkpoint (a copy of the key's state)
            return
        interval = CHECKPOINT_RECORDS
        while True:
            started = time.perf_counter()
            checkpoint = self.checkpoint()
            copied = time.perf_counter()
            first, rest_at_checkpoint = self.firings, rest
            try:
                rest = self.fire_timers(low_watermark, boundary, wall, interval, rest)
            except _UserFailure as failure:
                if checkpoint is None:  # the state is not plain data: the step starts over instead
                    raise
                replay = self.firings - first  # the firings up to the failed one, skipped from now on
                self.restore(checkpoint)
                self.on_timer_failure(failure)
                # Made again without a checkpoint: code that fails anew on the way back (it is not
                # deterministic) makes the step start over, as for records.
                rest = self.fire_timers(low_watermark, boundary, wall, replay, rest_at_checkpoint)
                interval = CHECKPOINT_RECORDS
                continue
            if rest is None:
                return
            interval = _next_interval(interval, False, started, copied, self.firings - first)

    def fire_timers(self, low_watermark: int, boundary: int, wall: bool = False, limit: int | None = None,
                    rest: "_DueRest | None" = None) -> "_DueRest | None":
        """fire() without checkpoints; with `limit`, at most that many firings (those skipped
        included). None once no timer is due; if it stopped at the limit, the due timers not fired
        yet, in order, which a call with `rest` goes on from (if the key's timers are as then).

        The due timers are sorted once. When user code changes the key's timers while they fire, the
        order is kept: the timers it set that are due now are placed in it, and entries of timers changed
        since are passed over when met (checked). Only a clear() takes the order again: a key's firings
        that each set a timer cost no scan of all its timers each."""
        state = self.state
        if not state.timers:
            return None
        ctx, plan, segments = self.ctx, self.plan, self.segments
        process_timer = plan.computation.process_timer
        skip = self.skip_timers
        single = len(segments) == 1
        lw = low_watermark
        keyed_at = self.keyed_after[boundary]  # keyed timers fire by these
        wall_time = self.wall_time if wall else BEGINNING_OF_TIME - 1  # no wall-time timer is due
        key, flush_each = self.key, self.flush_each
        # The text of a firing's first production id, up to the timer's fields (timer_cause()).
        head = f"{plan.name}\x1ft\x1f{key}\x1f"
        time_texts, timer_objects = self.time_texts, self.timer_objects
        if len(timer_objects) >= TIMER_OBJECTS:
            timer_objects.clear()
        holds = state.holds
        # What every firing shares (_begin, inlined: this is the per-timer hot path); the fields of
        # the input point a firing belongs to are set when the point changes.
        ctx._stream, ctx._late, ctx._after = None, False, True
        current = -1
        fired = self.firings
        # One comparison per firing for both bounds: the limit, and the runaway guard.
        bound = MAX_TIMER_FIRINGS_PER_STEP if limit is None else min(MAX_TIMER_FIRINGS_PER_STEP, fired + limit)
        skipped = 0  # firings dead-lettered in an earlier run of this step: not counted
        changed: list[str | None] = []
        ctx.changed_timers = changed
        try:
            while True:
                timers = state.timers
                if rest is not None and rest.version == ctx.timer_changes:
                    # A checked order gets timers placed in it: a copy, as fire() keeps the rest to replay from.
                    due, checked, rest = list(rest.due) if rest.checked else rest.due, rest.checked, None
                else:  # (_due_now, inlined)
                    due = sorted([(timer[0], tag) for tag, timer in timers.items()
                                  if timer[0] <= (wall_time if timer[1] else
                                                  keyed_at.get(timer[3], BEGINNING_OF_TIME) if timer[3] else lw)])
                    if not due:
                        return None
                    if not single:  # as if the points came one at a time: a point's timers before a later one's
                        due.sort(key=lambda due_timer: (self.point_of(due_timer[1], timers[due_timer[1]], boundary),
                                                        due_timer))
                    checked = False
                version, sorted_at, passed = ctx.timer_changes, fired, 0
                for placed, tag in due:
                    if checked and not self.current(placed, tag, timers.get(tag), lw, keyed_at, wall_time, boundary):
                        passed += 1
                        continue
                    if fired >= bound:
                        if fired < MAX_TIMER_FIRINGS_PER_STEP:  # the limit
                            return _DueRest(due[fired - sorted_at + passed:], version, checked)
                        raise ComputationError(
                            f"computation {plan.name!r}, key {key!r}: more than {MAX_TIMER_FIRINGS_PER_STEP} "
                            "timers fired in one step; a timer that re-sets itself at or behind the low "
                            "watermark fires again at once, forever"
                        )
                    fired += 1
                    timer = timers.pop(tag)
                    time, wall_timer, setter, _ = timer
                    point = boundary if single else self.point_of(tag, timer, boundary)
                    if holds and tag in holds:  # fired: its hold is released
                        ctx.holds_change(point)
                        hold = holds.pop(tag)
                    else:
                        hold = None
                    if skip and (tag, time, setter, point) in skip:
                        skipped += 1
                        self.timers_skipped.append((tag, time, setter, point))
                        continue
                    if point != current:
                        current = point
                        if point and state.written:  # as if the points came one at a time: values
                            state.expire(segments[point - 1].advanced_to, plan.ttls)  # past their TTL
                        at = segments[point].advanced_to
                        ctx._low_watermark, ctx._segment, ctx._advanced, ctx._inputs = (
                            at, point, at, segments[point].inputs)
                    ctx._cause, ctx._setter, ctx._produced = None, None, 0
                    text = time_texts.get(time)
                    if text is None:
                        text = self.time_text(time)
                    ctx._first_id = f"{head}{tag}\x1f{text}\x1f{setter}\x1f0"  # see _Invocation.cause()
                    if wall_timer or timer[3] or hold is not None:
                        timer_object = _new_tuple(Timer, (time, tag, _WALL if wall_timer else _LOW_WATERMARK,
                                                          timer[3] or None, hold))
                    else:  # a plain low-watermark timer: its Timer is kept by tag for the firings of other keys
                        # (windows' timers share tag and time; a Timer is immutable, and building one costs
                        # more than finding it). Built here when not found: a tag's time may differ per key.
                        kept = timer_objects.get(tag)
                        if kept is None or kept[0] != time:
                            kept = timer_objects[tag] = _new_tuple(Timer, (time, tag, _LOW_WATERMARK, None, None))
                        timer_object = kept
                    try:
                        process_timer(ctx, timer_object)
                        if flush_each:
                            state.flush(plan.state_specs)
                    except Exception as error:
                        raise _UserFailure(error, timer=(tag, time, setter, point), segment=point) from error
                    if ctx.timer_changes != version:  # user code changed the key's timers
                        if None in changed or len(changed) != ctx.timer_changes - version:
                            del changed[:]
                            break  # cleared (or changed unseen): take the order again
                        rest_at = fired - sorted_at + passed
                        if not checked:  # the rest as ((point, time), tag), once: the loop goes on from it
                            rest = _DueRest(self.checked_due(due, rest_at, changed, lw, keyed_at, wall_time,
                                                             boundary), ctx.timer_changes, True)
                            del changed[:]
                            break
                        for changed_tag in dict.fromkeys(changed):
                            if changed_tag is not None:  # (None is a clear(), not met here)
                                self.place_due(due, rest_at, changed_tag, timers.get(changed_tag), lw, keyed_at,
                                               wall_time, boundary)
                        del changed[:]
                        version = ctx.timer_changes
                else:
                    return None
        finally:
            ctx.changed_timers = None
            self.metrics.timers_fired += fired - self.firings - skipped
            self.firings = fired

    def checked_due(self, due: list[tuple[Any, str]], rest_at: int, changed: list[str | None], low_watermark: int,
                    keyed_at: Mapping[str, int], wall_time: int, boundary: int) -> list[tuple[Any, str]]:
        """The due timers not fired yet, from `rest_at` of an unchecked order, as ((point, time), tag)
        in firing order after user code changed the timers of `changed`: theirs as they are now, if due."""
        timers = self.state.timers
        changed_tags = {tag for tag in changed if tag is not None}  # (None is a clear(), not met here)
        rest = []
        for _, tag in due[rest_at:]:
            timer = timers.get(tag)
            if timer is not None and tag not in changed_tags:
                rest.append((self.placed_at(tag, timer, boundary), tag))
        for tag in changed_tags:
            timer = timers.get(tag)
            if timer is not None and _due_now(timer, low_watermark, keyed_at, wall_time):
                rest.append((self.placed_at(tag, timer, boundary), tag))
        return sorted(rest)

    def place_due(self, due: list[tuple[Any, str]], rest_at: int, tag: str, timer: tuple[int, bool, str, str] | None,
                  low_watermark: int, keyed_at: Mapping[str, int], wall_time: int, boundary: int) -> None:
        """Place a timer user code set while timers fire among the checked due timers not fired yet
        (from `rest_at`), if it is due."""
        if timer is not None and _due_now(timer, low_watermark, keyed_at, wall_time):
            bisect.insort(due, (self.placed_at(tag, timer, boundary), tag), lo=rest_at)

    def current(self, placed: tuple[int, int], tag: str, timer: tuple[int, bool, str, str] | None, low_watermark: int,
                keyed_at: Mapping[str, int], wall_time: int, boundary: int) -> bool:
        """Whether a checked entry, `tag` placed at (point, time), is the tag's timer as it is now, due
        at that point (an entry of a timer changed since it was placed is not: the timer was placed anew
        if due)."""
        return (timer is not None and _due_now(timer, low_watermark, keyed_at, wall_time)
                and self.placed_at(tag, timer, boundary) == placed)

    def placed_at(self, tag: str, timer: tuple[int, bool, str, str], boundary: int) -> tuple[int, int]:
        """A due timer's place in a checked order: (the input point it fires at, its time)."""
        return (boundary if len(self.segments) == 1 else self.point_of(tag, timer, boundary), timer[0])

    def time_text(self, time: int) -> str:
        """A timer time's decimal text, kept for the firings of other keys at the same time (windows'
        timers are, and formatting an int costs more than finding it)."""
        texts = self.time_texts
        if len(texts) >= TIME_TEXTS:
            texts.clear()
        text = texts[time] = str(time)
        return text

    def point_of(self, tag: str, timer: tuple[int, bool, str, str], boundary: int) -> int:
        """The input point a due timer (KeyState.timers' fields) fires at, when the step has several."""
        return boundary if timer[1] else self.timer_point(tag, timer[0], boundary, timer[3])

    def timer_point(self, tag: str, time: int, boundary: int, watermark_key: str = "") -> int:
        """The input point a low-watermark firing belongs to: the first one whose advanced watermark
        (the timer's keyed watermark, for a keyed timer) reached the timer, but not before the point
        in which the timer was set. (Wall-time firings belong to the step's last point.)"""
        earliest = self.ctx.set_at.get(tag, 0)
        advanced = self.keyed_advanced[watermark_key] if watermark_key else self.advanced
        return min(boundary, max(earliest, bisect.bisect_left(advanced, time)))

    def stored(self) -> StoredKey | None:
        state = self.state
        if not (state.values or state.timers):  # state.is_empty(), inlined: once per key and step
            return None
        lw, wall, keyed = state.wake_times(self.plan.ttls)
        return StoredKey(state.dumps(), lw, wall, tuple(sorted(keyed.items())) if keyed else (),
                         state.hold() if state.holds else None)

    def holds_by_point(self) -> list[int | None] | None:
        """The key's earliest hold after each input point of the step (None: it holds nothing
        there), or None if it held nothing in the step at all."""
        changes = self.ctx.hold_changes
        if changes:  # the point of the latest change, as the step left it
            changes = [*changes[:-1], (changes[-1][0], self.state.hold() if self.state.holds else None)]
        elif self.hold_before is None:
            return None
        current, i, by_point = self.hold_before, 0, []
        for j in range(len(self.segments)):
            while i < len(changes) and changes[i][0] <= j:
                current = changes[i][1]
                i += 1
            by_point.append(current)
        return by_point


class KeyGroupExecutor:
    """Runs steps of a computation for the keys of one key group against a KeyStore."""

    def __init__(self, plan: ComputationPlan, store: KeyStore) -> None:
        self.plan = plan
        self.store = store
        self.advanced: list[int] = []
        self.keyed_advanced: dict[str, list[int]] = {}  # per watermark key, its advanced value per point
        self.keyed_after: list[dict[str, int]] = []  # per point, Segment.keyed_after()
        self.time_texts: dict[int, str] = {}  # timer times' decimal texts (_KeyStep.time_text)
        self.timer_objects: dict[str, Timer] = {}  # plain low-watermark Timers by tag (_KeyStep.fire_timers)

    def step(self, deliveries: Iterable[DeliveryRow], segments: Sequence[Segment], wall_time: int,
             passthrough: Sequence[Produced] = (), forwarded: Sequence[Produced] = ()) -> StepResult:
        """Run one step: `deliveries` in input order (segment, then position), then due timers.
        `passthrough` are dead letters made before the computation (key extraction, malformed
        input): published with the step's productions and counted as this computation's.
        `forwarded`: another computation's productions published with this step's, counted by
        their maker (a fused weak computation's dead letters)."""
        by_key: dict[str, list[DeliveryRow]] = {}
        for delivery in deliveries:
            by_key.setdefault(delivery[0], []).append(delivery)
        return self.step_keys(by_key, segments, wall_time, passthrough, forwarded)

    def step_keys(self, by_key: Mapping[str, Sequence[DeliveryRow]], segments: Sequence[Segment], wall_time: int,
                  passthrough: Sequence[Produced] = (), forwarded: Sequence[Produced] = ()) -> StepResult:
        """`step`, with the deliveries already grouped by key (each key's in input order)."""
        if not segments:
            raise ValueError("a step has at least one input point (a heartbeat: Segment(wm, wm))")
        with bulk_work():  # a step's many short-lived objects beside the key group's live data (garbage.py)
            return self._step(by_key, segments, wall_time, passthrough, forwarded)

    def _step(self, by_key: Mapping[str, Sequence[DeliveryRow]], segments: Sequence[Segment], wall_time: int,
              passthrough: Sequence[Produced], forwarded: Sequence[Produced]) -> StepResult:
        self.advanced = [s.advanced_to for s in segments]
        self.keyed_after = [s.keyed_after() for s in segments]
        self.keyed_advanced = {name: [after[name] for after in self.keyed_after] for name, _, _ in segments[0].keyed}
        last = segments[-1].advanced_to
        keys = list(by_key)
        known = set(keys)
        keys.extend(k for k in self.store.due(last, wall_time, self.keyed_after[-1]) if k not in known)
        blobs = self.store.load(keys)
        out: list[ProductionRow] = [*map(tuple, forwarded), *map(tuple, passthrough)]  # type: ignore[list-item]
        metrics = StepMetrics(dead_letters=len(passthrough))
        changes: dict[str, StoredKey | None] = {}
        seen: dict[str, dict[str, int]] = {}
        seen_bytes = 0  # of the new dedup ids: key, id and an 8-byte mark each
        holds: list[int | None] | None = None
        key_step, items_of, blob_of, add_metrics = self._key_step, by_key.get, blobs.get, metrics.add
        for key in keys:
            step = key_step(key, items_of(key, ()), blob_of(key), segments, wall_time, out, metrics)
            changes[key] = step.stored()
            if step.hold_before is not None or step.ctx.hold_changes:
                holds = earliest_holds(holds, step.holds_by_point())
            step_metrics = step.metrics
            step_metrics.pending_timers = len(step.state.timers) - step.timers_before
            ids = step.seen
            if ids:
                seen[key] = ids
                seen_bytes += len(ids) * (len(key) + 8) + sum(map(len, ids))
            out.extend(step.out)
            add_metrics(step_metrics)
        untouched = self.store.min_hold(changes)  # the keys the step did not run hold as before
        if untouched is not None:
            holds = earliest_holds(holds, [untouched] * len(segments))
        self.store.save(changes, seen, last, self.plan.dedup_horizon_ms)
        metrics.productions = len(out) - len(forwarded)
        metrics.state_bytes = sum(len(k) + len(s.blob) for k, s in changes.items() if s is not None) + seen_bytes
        return StepResult(out, self.store.next_wall_time(), metrics, holds)

    def _key_step(self, key: str, items: Sequence[DeliveryRow], blob: bytes | None,
                  segments: Sequence[Segment], wall_time: int, out: list[ProductionRow],
                  metrics: StepMetrics) -> _KeyStep:
        """The key's step; run again without each failing input under the dead_letter policy (runs
        after the first deliver records between checkpoints: see the module doc)."""
        step = _KeyStep(self, key, blob, segments, wall_time, _NO_SKIPPED_ITEMS, _NO_SKIPPED_TIMERS, False)
        try:
            step.run(items)  # the common case: nothing fails, and nothing is set up for failures
            return step
        except (_StateFlushFailed, _UserFailure) as first:
            failure = first
        skip_items: set[int] = set()
        skip_timers: set[FiringId] = set()
        # A failed timer's dead letter, published only if the run that stands meets the timer: code
        # that is not deterministic may not set it again.
        timer_letters: dict[FiringId, ProductionRow] = {}
        flush_each = False

        def apply_policy(failure: _UserFailure) -> None:
            failed: list[Delivery | None] = [_as_delivery(items[i]) for i in failure.items] or [None]
            if self.plan.on_error is ErrorPolicy.FAIL:
                raise ComputationFailed(self._failure_message(key, failed, failure)) from None
            if failure.timer is not None:
                timer_letters[failure.timer] = tuple(self._dead_letter(key, None, failure))  # type: ignore[assignment]
                skip_timers.add(failure.timer)
                return
            for delivery in failed:
                out.append(tuple(self._dead_letter(key, delivery, failure)))  # type: ignore[arg-type]
                metrics.dead_letters += 1
            skip_items.update(failure.items)

        for _ in range(len(items) + MAX_TIMER_FIRINGS_PER_STEP + 2):
            if isinstance(failure, _StateFlushFailed):
                flush_each = True  # run again, encoding after every invocation, to find the culprit
            else:
                apply_policy(failure)
            for delivery in items:  # code may have changed a value it read in place
                delivery[2].decode_again()
            step = _KeyStep(self, key, blob, segments, wall_time, skip_items, skip_timers, flush_each,
                            apply_policy if skip_items or skip_timers else None)
            try:
                step.run(items)
            except (_StateFlushFailed, _UserFailure) as again:
                failure = again
                continue
            for timer in step.timers_skipped:
                out.append(timer_letters[timer])
                metrics.dead_letters += 1
            return step
        raise ComputationError(f"computation {self.plan.name!r}, key {key!r}: step did not settle")

    def _failure_message(self, key: str, failed: Sequence[Delivery | None], failure: _UserFailure) -> str:
        delivery, records = failed[0], [d.record for d in failed if d is not None]
        if delivery is not None and len(records) > 1:  # a process_records call: which record is not known
            times = [record.timestamp for record in records]
            where = (f"process_records with {len(records)} records from stream {delivery.stream!r} "
                     f"({records[0].id!r} to {records[-1].id!r}, timestamps {min(times)} to {max(times)})")
        elif delivery is not None:
            where = (f"record {delivery.record.id!r} from stream {delivery.stream!r} "
                     f"(timestamp {delivery.record.timestamp})")
        else:
            tag, time, _, _ = failure.timer or ("?", 0, "", 0)
            where = f"timer {tag!r} at {time}"
        return (f"computation {self.plan.name!r} failed on key {key!r}, {where}: {describe_error(failure.error)}\n"
                f"{user_traceback(failure.error)}")

    def _dead_letter(self, key: str, delivery: Delivery | None, failure: _UserFailure) -> Produced:
        if delivery is not None:
            record = delivery.record
            record.decode_again()  # the value as it arrived, not as the failed code left it
            try:
                value = record.value
            except Exception as error:  # the value itself did not decode
                value = f"<undecodable: {describe_error(error)}>"
            return dead_letter(self.plan.name, key=key, stream=delivery.stream, sender=None, record_id=record.id,
                               timestamp=record.timestamp, value=value, error=failure.error, segment=failure.segment)
        tag, time, setter, _ = failure.timer or ("", 0, "", 0)
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
