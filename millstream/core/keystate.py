"""Per-key persistent data (state, timers, seen record ids) and the pages that group keys.

Everything of one key lives in one KeyState, written in one piece: state, timers and dedup ids change
together (MillWheel keeps them in one Bigtable row). Keys are grouped into pages so a store write
covers many keys, and only pages touched in a step are rewritten. Decoding is lazy: a page keeps its
keys' encoded bytes and decodes only the keys a step touches.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterator

from millstream.model.records import TimeDomain, Timer
from millstream.model.state import ListState, StateSpec, ValueState

_ABSENT = object()
_CLEARED = object()  # a value cleared by user code this step


class KeyState:
    __slots__ = ("encoded", "live", "timers", "seen", "timers_fired")

    def __init__(self) -> None:
        self.encoded: dict[str, Any] = {}  # state name -> persisted form (codec bytes)
        self.live: dict[str, Any] = {}  # state name -> decoded value touched this step
        self.timers: dict[str, Timer] = {}  # tag -> pending timer
        self.seen: dict[str, int] = {}  # record id -> input low watermark when it arrived
        self.timers_fired = 0  # part of production ids caused by timers; deterministic on replay

    # -- state values --------------------------------------------------------------------------
    def value(self, spec: StateSpec) -> Any:
        """The decoded, mutable value of a state for this step (decoded once, kept live)."""
        live = self.live.get(spec.name, _ABSENT)
        if live is _CLEARED:
            live = _ABSENT
            self.encoded.pop(spec.name, None)
        if live is not _ABSENT:
            return live
        stored = self.encoded.get(spec.name, _ABSENT)
        if isinstance(spec, ValueState):
            live = copy.deepcopy(spec.default) if stored is _ABSENT else spec.codec.decode(stored)
        elif isinstance(spec, ListState):
            live = [] if stored is _ABSENT else [spec.codec.decode(b) for b in stored]
        else:
            live = {} if stored is _ABSENT else {
                spec.key_codec.decode(k): spec.value_codec.decode(v) for k, v in stored
            }
        self.live[spec.name] = live
        return live

    def set_value(self, spec: StateSpec, value: Any) -> None:
        self.live[spec.name] = value

    def clear_value(self, spec: StateSpec) -> None:
        self.live[spec.name] = _CLEARED

    def flush(self, specs: dict[str, StateSpec]) -> None:
        """Encode every value touched this step (user code may have mutated it in place). Empty
        lists and maps, None values and cleared states are not stored at all."""
        for name, live in self.live.items():
            spec = specs[name]
            if live is _CLEARED or live is None or (not live and not isinstance(spec, ValueState)):
                self.encoded.pop(name, None)
            elif (isinstance(spec, ValueState) and name not in self.encoded
                  and type(live) is type(spec.default) and live == spec.default):
                continue  # only read, never set: nothing to store
            elif isinstance(spec, ValueState):
                self.encoded[name] = spec.codec.encode(live)
            elif isinstance(spec, ListState):
                self.encoded[name] = [spec.codec.encode(v) for v in live]
            else:
                self.encoded[name] = [
                    (spec.key_codec.encode(k), spec.value_codec.encode(v)) for k, v in live.items()
                ]
        self.live.clear()

    def is_empty(self) -> bool:
        # A key that ever fired a timer is kept for its counter: ids of timer productions derive
        # from it, and restarting it at 0 would repeat ids a consumer may still deduplicate against.
        return not (self.encoded or self.timers or self.seen or self.timers_fired)

    # -- timers --------------------------------------------------------------------------------
    def earliest_timer(self, domain: TimeDomain) -> int | None:
        times = [t.time for t in self.timers.values() if t.domain is domain]
        return min(times) if times else None

    def due_timer(self, low_watermark: int, wall_time: int) -> Timer | None:
        """The next timer to fire: the earliest (time, tag) among those due."""
        due = [
            t
            for t in self.timers.values()
            if (t.time <= low_watermark if t.domain is TimeDomain.LOW_WATERMARK else t.time <= wall_time)
        ]
        return min(due) if due else None

    # -- persistence ---------------------------------------------------------------------------
    def dumps(self) -> bytes:
        timers = [(t.tag, t.time, t.domain is TimeDomain.WALL_TIME) for t in self.timers.values()]
        return pickle.dumps((self.encoded, timers, self.seen, self.timers_fired), protocol=5)

    @classmethod
    def loads(cls, blob: bytes) -> "KeyState":
        state = cls()
        state.encoded, timers, state.seen, state.timers_fired = pickle.loads(blob)
        state.timers = {
            tag: Timer(time, tag, TimeDomain.WALL_TIME if wall else TimeDomain.LOW_WATERMARK)
            for tag, time, wall in timers
        }
        return state



@dataclass
class Page:
    """A group of keys of one shard, persisted as one blob. Tracks each key's earliest timers so a
    step can find due timers without decoding every key."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    next_lw_timer: dict[str, int] = field(default_factory=dict)
    next_wall_timer: dict[str, int] = field(default_factory=dict)
    decoded: dict[str, KeyState] = field(default_factory=dict)

    def key_state(self, key: str) -> KeyState:
        state = self.decoded.get(key)
        if state is None:
            blob = self.blobs.get(key)
            state = KeyState.loads(blob) if blob is not None else KeyState()
            self.decoded[key] = state
        return state

    def keys_with_due_timers(self, low_watermark: int, wall_time: int) -> list[str]:
        due = {k for k, t in self.next_lw_timer.items() if t <= low_watermark}
        due.update(k for k, t in self.next_wall_timer.items() if t <= wall_time)
        return sorted(due)

    def earliest(self, domain: TimeDomain) -> int | None:
        table = self.next_lw_timer if domain is TimeDomain.LOW_WATERMARK else self.next_wall_timer
        return min(table.values()) if table else None

    def flush(self, specs: dict[str, StateSpec]) -> None:
        """Write decoded keys back into blobs and refresh the timer index."""
        for key, state in self.decoded.items():
            state.flush(specs)
            self.next_lw_timer.pop(key, None)
            self.next_wall_timer.pop(key, None)
            if state.is_empty():
                self.blobs.pop(key, None)
                continue
            self.blobs[key] = state.dumps()
            lw = state.earliest_timer(TimeDomain.LOW_WATERMARK)
            wall = state.earliest_timer(TimeDomain.WALL_TIME)
            if lw is not None:
                self.next_lw_timer[key] = lw
            if wall is not None:
                self.next_wall_timer[key] = wall
        self.decoded.clear()

    def dumps(self) -> bytes:
        return pickle.dumps((self.blobs, self.next_lw_timer, self.next_wall_timer), protocol=5)

    @classmethod
    def loads(cls, blob: bytes) -> "Page":
        blobs, lw, wall = pickle.loads(blob)
        return cls(blobs, lw, wall)

    def keys(self) -> Iterator[str]:
        return iter(self.blobs)
