"""Everything one key holds, persisted as one blob: state values and pending timers.

State and timers of a key change together, and together with the step's dedup ids (dedup.py) and
productions (MillWheel keeps them in one Bigtable row); the stores write a step as one unit. Values
are kept encoded (the codec's bytes) and decoded lazily: a value when first read in a step, a map
entry by entry.

A key is *empty*, and disappears from its store, when it holds no state value and no user timer.
Nothing else pins it: production ids of timers derive from the timer itself (key, tag, time and the
invocation that set it), not from a per-key counter, and dedup ids live apart.

Expiry of state values with a TTL is scheduled on the key's low-watermark wake-up time, so it happens
on schedule whether or not the key sees records again.
"""

from __future__ import annotations

import math
import pickle
from typing import Any, Iterator, NamedTuple

from millstream.model.codecs import Codec, CodecError, JsonCodec, PickleCodec, StrCodec
from millstream.model.records import TimeDomain, Timer
from millstream.model.state import ListState, MapState, StateSpec, ValueState

_ABSENT: Any = object()
_REMOVED: Any = object()


class PendingTimer(NamedTuple):
    """A pending timer's fields. `KeyState.timers` holds them as a plain tuple in this order: a
    key sets a timer per record in common pipelines, and a tuple subclass costs several times as
    much to build. (The class stays for reading blobs that stored instances of it.)"""

    time: int
    wall: bool  # True: wall-time domain
    setter: str  # the cause that set it: part of the firing's identity (and its productions' ids)
    watermark: str = ""  # the watermark key it follows ("": the low watermark)


# Pending timers from which checkpoints journal the timers' changes instead of copying them: a copy
# costs a few ns per timer in C, a journaled change a Python call, so below this the copy is cheaper.
JOURNAL_TIMERS_FROM = 4096


class JournaledTimers(dict[str, tuple[int, bool, str, str]]):
    """KeyState.timers in a step taking checkpoints once they hold JOURNAL_TIMERS_FROM timers or more:
    going back to a checkpoint undoes the changes made since it, instead of each checkpoint copying
    every pending timer (a key with many pending timers and frequent failures paid a copy of them all
    per failure).

    Each change logs the tag with its fields before (_ABSENT: a new tag). Undoing a set or an
    overwrite keeps the dict's order; a timer present at the checkpoint and removed since would come
    back at the end of it, so its first removal copies the dict (`snapshot`, with the log's length
    then), and undo starts from that copy: the order, written into the key's blob, is the
    checkpoint's either way. Setting timers, what most code does, copies nothing.

    >>> timers = JournaledTimers({"a": (1, False, "s", ""), "b": (2, False, "s", "")})
    >>> timers.mark()
    >>> timers["c"] = (3, False, "s", "")
    >>> _ = timers.pop("a")
    >>> timers.undo()
    >>> list(timers)
    ['a', 'b']
    """

    __slots__ = ("journal", "added", "snapshot")

    def __init__(self, timers: dict[str, tuple[int, bool, str, str]]) -> None:
        super().__init__(timers)
        self.journal: list[tuple[str, Any]] = []
        self.added: set[str] = set()  # tags new since the mark
        self.snapshot: tuple[dict[str, Any], int] | None = None

    def __setitem__(self, tag: str, fields: tuple[int, bool, str, str]) -> None:
        before = self.get(tag, _ABSENT)
        if before is _ABSENT:
            self.added.add(tag)
        self.journal.append((tag, before))
        dict.__setitem__(self, tag, fields)

    def _removing(self, tag: str) -> None:
        if tag not in self.added and self.snapshot is None:  # present at the mark: keep its place
            self.snapshot = (dict(self), len(self.journal))
        self.journal.append((tag, dict.__getitem__(self, tag)))

    def __delitem__(self, tag: str) -> None:
        if tag not in self:
            raise KeyError(tag)
        self._removing(tag)
        dict.__delitem__(self, tag)

    def pop(self, tag: str, *default: Any) -> Any:
        if tag in self:
            self._removing(tag)
        return dict.pop(self, tag, *default)

    def popitem(self) -> tuple[str, tuple[int, bool, str, str]]:
        if not self:
            raise KeyError("popitem(): dictionary is empty")
        tag = next(reversed(self))
        return tag, self.pop(tag)

    def setdefault(self, tag: str, fields: Any = None) -> Any:
        if tag not in self:
            self[tag] = fields
        return dict.__getitem__(self, tag)

    def update(self, *args: Any, **changes: Any) -> None:
        for tag, fields in dict(*args, **changes).items():
            self[tag] = fields

    def __ior__(self, other: Any) -> "JournaledTimers":  # type: ignore[override, misc]
        self.update(other)
        return self

    def clear(self) -> None:
        for tag in list(self):
            self.pop(tag)

    def mark(self) -> None:
        """A checkpoint: undo() goes back to here."""
        self.journal.clear()
        self.added.clear()
        self.snapshot = None

    def undo(self) -> None:
        """The timers as at the last mark(), in its order."""
        journal = self.journal
        if self.snapshot is not None:
            copied, logged = self.snapshot
            dict.clear(self)
            dict.update(self, copied)
            del journal[logged:]
        for tag, fields in reversed(journal):
            if fields is _ABSENT:
                dict.pop(self, tag, None)
            else:
                dict.__setitem__(self, tag, fields)
        self.mark()


class KeyState:
    """One key's persisted data plus the values decoded during the current step."""

    __slots__ = ("values", "written", "timers", "holds", "_live")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}  # state name -> bytes | list[bytes] | dict[bytes, bytes]
        self.written: dict[str, int] = {}  # state name -> watermark at its last write (TTL'd states)
        # tag -> a PendingTimer's fields. The executor sets timers in it directly (it is the per-record
        # path) and keeps the step's own timer bookkeeping: changes while firing, input points.
        self.timers: dict[str, tuple[int, bool, str, str]] = {}
        # tag -> the time a pending timer holds the computation's output watermark at (its `hold`);
        # apart from the timers, so keys that hold nothing store and copy nothing more.
        self.holds: dict[str, int] = {}
        self._live: dict[str, Any] = {}  # state name -> cell decoded this step

    # -- persistence ---------------------------------------------------------------------------
    def dumps(self) -> bytes:
        # Timers as parallel lists of tags and their tuples.
        timers = self.timers
        if self.holds:
            return pickle.dumps((self.values, self.written, list(timers), list(timers.values()), self.holds),
                                protocol=5)
        return pickle.dumps((self.values, self.written, list(timers), list(timers.values())), protocol=5)

    @classmethod
    def loads(cls, blob: bytes) -> "KeyState":
        loaded = pickle.loads(blob)
        if len(loaded) == 4:  # every key of every step comes through here: no dicts built to be replaced
            state = cls.__new__(cls)
            state.values, state.written, tags, timers = loaded
            state.timers = dict(zip(tags, timers))
            state.holds = {}
            state._live = {}
            return state
        state = cls()
        if len(loaded) == 5:  # a key whose timers hold the watermark
            state.values, state.written, tags, timers, state.holds = loaded
            state.timers = dict(zip(tags, timers))
            return state
        # Blobs written before timers were stored as parallel lists: a dict of timers.
        state.values, state.written, by_tag = loaded
        for tag, fields in by_tag.items():
            timer = PendingTimer(*fields)  # 3 fields before keyed watermarks
            state.timers[tag] = (timer.time, timer.wall, timer.setter, timer.watermark)
        return state

    def is_empty(self) -> bool:
        return not (self.values or self.timers)

    def checkpoint(self) -> "StateCheckpoint":
        """The key's state as the step has left it so far, to go back to (restored()): the decoded
        cells copied (user code may mutate their values in place), the persisted encodings not. Those
        stay unchanged until the step's flush (only a flush writes them), so a checkpoint is valid
        between flushes only. Nothing is encoded: taking one changes nothing, unlike a flush. Raises
        NotPlainData for a decoded value that is not plain data (dict, list, tuple, str, int, float,
        bool, None, bytes): a copy of anything else might not behave as the original (identity, a
        set's order)."""
        memo: dict[int, Any] = {}
        cells = {name: cell.copy(memo) for name, cell in self._live.items()}  # first: it may raise
        timers = self.timers
        if type(timers) is JournaledTimers:
            timers.mark()  # undone on restore, not copied
        elif len(timers) >= JOURNAL_TIMERS_FROM:  # a new dict: whoever holds `timers` must take it again
            timers = self.timers = JournaledTimers(timers)
        else:
            timers = dict(timers)
        return StateCheckpoint(dict(self.values), dict(self.written), timers, cells, dict(self.holds))

    @classmethod
    def restored(cls, checkpoint: "StateCheckpoint") -> "KeyState":
        """The key's state as at `checkpoint`, made of the checkpoint's own copies, the journaled
        timers' changes since undone (it is spent: a second use would see what the state did since);
        the cells of states first used since do not exist, as in a run that never used them."""
        state = cls.__new__(cls)
        timers = checkpoint.timers
        if type(timers) is JournaledTimers:
            timers.undo()
        state.values, state.written, state.timers = checkpoint.values, checkpoint.written, timers
        state.holds = checkpoint.holds
        state._live = dict(checkpoint.cells)
        return state

    def report_writes_to(self, on_write: Any) -> None:
        """Cells that report writes (TTL'd states) report them to `on_write` from now on."""
        for cell in self._live.values():
            if cell.on_write is not None:
                cell.on_write = on_write

    # -- state values --------------------------------------------------------------------------
    def cell(self, spec: StateSpec, on_write: Any = None) -> Any:
        """The step's live cell for a state, decoded on first use: what `ctx.state()` hands to user
        code. `on_write(spec)` is called on writes (TTL bookkeeping), if given."""
        cell = self._live.get(spec.name)
        if cell is None:
            stored = self.values.get(spec.name, _ABSENT)
            if isinstance(spec, MapState):
                cell = MapCell(spec, {} if stored is _ABSENT else stored, on_write)
            elif isinstance(spec, ListState):
                cell = ListCell(spec, [] if stored is _ABSENT else [spec.codec.decode(b) for b in stored], on_write)
            else:
                cell = ValueCell(spec, _ABSENT if stored is _ABSENT else spec.codec.decode(stored), on_write)
            self._live[spec.name] = cell
        return cell

    def touched(self, spec: StateSpec, watermark: int) -> None:
        """Note a write of a state with a TTL at `watermark`."""
        if spec.ttl_ms is not None:
            self.written[spec.name] = watermark

    def clear(self) -> None:
        """Drop every state value and pending timer (ctx.clear()); dedup ids stay. Cells handed out
        this step stay usable: they are emptied, not replaced."""
        self.values.clear()
        self.written.clear()
        self.timers.clear()
        self.holds.clear()
        for cell in self._live.values():
            cell.clear()

    def drop(self, name: str) -> None:
        """Remove one state's value (TTL expiry)."""
        self.values.pop(name, None)
        self.written.pop(name, None)
        cell = self._live.get(name)
        if cell is not None:
            cell.clear()

    def flush(self, specs: dict[str, StateSpec], last: bool = False) -> None:
        """Encode every cell of this step (user code may have mutated values in place). Empty lists
        and maps, None values and cleared states are not stored at all. Cells stay valid, unless
        `last`: the step's last flush, after which its cells are forgotten (end_step) unread.

        In the order the states are declared, not the order the step first used them: what a step
        stores then does not depend on which of its invocations ran (a rollback to a checkpoint keeps
        a cell a failed invocation first used)."""
        live = self._live
        names: Any = live
        if len(live) > 1:
            names = [name for name in specs if name in live]
            if len(names) != len(live):  # cells of states not passed in `specs` (direct use): last
                names += [name for name in live if name not in specs]
        for name in names:
            cell = live[name]
            try:
                encoded = cell.encode(last)
            except CodecError as error:
                raise self._first_refused(specs, name, error) from None
            if encoded is None:
                self.values.pop(name, None)
                self.written.pop(name, None)
            elif encoded is not _ABSENT:
                self.values[name] = encoded

    def _first_refused(self, specs: dict[str, StateSpec], name: str, error: CodecError) -> CodecError:
        """The error to report when state `name` failed to encode: that of the first state, in the
        order they are declared, that fails (the cells' order follows the step's accesses). Its
        encode() calls change cells as a flush does, without storing: safe only because a failed
        flush discards the key's run (the executor runs the step again from its blob)."""
        for other in specs:
            if other == name:
                break
            cell = self._live.get(other)
            if cell is not None:
                try:
                    cell.encode()
                except CodecError as earlier:
                    name, error = other, earlier
                    break
        return CodecError(f"state {name!r}: {error}")

    def end_step(self) -> None:
        """Forget the step's cells (after the last flush of a step)."""
        self._live.clear()

    # -- timers --------------------------------------------------------------------------------
    def wake_times(self, ttls: dict[str, int]) -> tuple[int | None, int | None, dict[str, int]]:
        """(low-watermark time, wall time, per watermark key its time) at which this key next has
        work: a user timer or an expiring state value."""
        lw = wall = None
        keyed: dict[str, int] = {}
        for time, in_wall_time, _, watermark in self.timers.values():
            if in_wall_time:
                wall = time if wall is None or time < wall else wall
            elif watermark:
                known = keyed.get(watermark)
                keyed[watermark] = time if known is None or time < known else known
            elif lw is None or time < lw:
                lw = time
        for name, mark in self.written.items():
            if name not in ttls:  # its TTL taken away since (a restart): the next expire drops the mark
                continue
            expiry = mark + ttls[name] + 1
            lw = expiry if lw is None or expiry < lw else lw
        return lw, wall, keyed

    def expire(self, low_watermark: int, ttls: dict[str, int]) -> None:
        """Forget state values whose TTL is up at `low_watermark`."""
        for name, mark in list(self.written.items()):
            ttl = ttls.get(name)
            if ttl is None:  # the state has no TTL any more (a restart took it away): its value stays
                del self.written[name]
            elif low_watermark > mark + ttl:
                self.drop(name)

    def hold(self) -> int | None:
        """The earliest time the key's pending timers hold the output watermark at, if any."""
        holds = self.holds
        return min(holds.values()) if holds else None

    def user_timers(self) -> list[Timer]:
        holds = self.holds
        return sorted(Timer(time, tag, TimeDomain.WALL_TIME if wall else TimeDomain.LOW_WATERMARK, watermark or None,
                            holds.get(tag)) for tag, (time, wall, _, watermark) in self.timers.items())


_IMMUTABLE = (int, float, str, bool, bytes, type(None))
_PLAIN_ATOMS = frozenset(_IMMUTABLE)


class NotPlainData(Exception):
    """A decoded state value a checkpoint does not copy (KeyState.checkpoint)."""


class StateCheckpoint(NamedTuple):
    """A key's state within a step (KeyState.checkpoint)."""

    values: dict[str, Any]  # the persisted encodings, shared with the state (unchanged until a flush)
    written: dict[str, int]
    timers: dict[str, tuple[int, bool, str, str]]  # a copy, or the state's JournaledTimers (marked)
    cells: dict[str, Any]  # name -> a copy of the cell
    holds: dict[str, int]  # a copy


# Plain data nested deeper than this is not copied (NotPlainData: the step starts over instead).
MAX_PLAIN_DEPTH = 100


def _plain_copy(value: Any, memo: dict[int, Any], depth: int = 0) -> Any:
    """A copy of plain data, as deep as its containers go, sharing what the original shares (`memo`:
    id of a container -> its copy, for one copy of a key's state); raises NotPlainData for anything
    else (dict keys included: they are shared, so they must be immutable), or nested deeper than
    MAX_PLAIN_DEPTH. Lists and dicts of atoms are copied in C."""
    kind = type(value)
    if kind in _PLAIN_ATOMS:
        return value
    copied = memo.get(id(value))
    if copied is not None:
        return copied
    if depth >= MAX_PLAIN_DEPTH:
        raise NotPlainData(f"state nested deeper than {MAX_PLAIN_DEPTH}")
    if kind is list:
        if set(map(type, value)) <= _PLAIN_ATOMS:
            copied = memo[id(value)] = value.copy()
        else:
            copied = memo[id(value)] = []
            for item in value:
                copied.append(_plain_copy(item, memo, depth + 1))
    elif kind is dict:
        _check_plain_keys(value, memo, depth)
        if set(map(type, value.values())) <= _PLAIN_ATOMS:
            copied = memo[id(value)] = value.copy()
        else:
            copied = memo[id(value)] = {}
            for key, item in value.items():
                copied[key] = _plain_copy(item, memo, depth + 1)
    elif kind is tuple:
        items = []
        for item in value:
            items.append(_plain_copy(item, memo, depth + 1))
        copied = memo[id(value)] = value if all(a is b for a, b in zip(items, value)) else tuple(items)
    else:
        raise NotPlainData(f"a {kind.__name__} in state")
    return copied


def _check_plain_keys(mapping: dict[Any, Any], memo: dict[int, Any], depth: int) -> None:
    """Refuse a dict whose keys are not plain atoms or tuples of plain data (keys are not copied)."""
    if set(map(type, mapping)) <= _PLAIN_ATOMS:
        return
    for key in mapping:
        if type(key) not in _PLAIN_ATOMS and (type(key) is not tuple or _plain_copy(key, memo, depth + 1) is not key):
            raise NotPlainData(f"a {type(key).__name__} as a dict key in state")


class ValueCell:
    """A value state during one step, and the handle user code gets for it."""

    __slots__ = ("spec", "value", "origin", "deleted", "on_write")

    def __init__(self, spec: ValueState[Any], stored: Any, on_write: Any = None) -> None:
        self.spec = spec
        self.value = stored
        self.origin = "stored" if stored is not _ABSENT else "absent"  # or "default", "set"
        self.deleted = False  # cleared this step: the stored value must go
        self.on_write = on_write

    def copy(self, memo: dict[int, Any]) -> "ValueCell":
        copied = ValueCell.__new__(ValueCell)
        copied.spec, copied.origin, copied.on_write = self.spec, self.origin, self.on_write
        copied.deleted = self.deleted
        copied.value = self.value if self.value is _ABSENT else _plain_copy(self.value, memo)
        return copied

    def get(self) -> Any:
        if self.origin == "absent":
            default = self.spec.default
            # A mutable default must not be shared between keys: each key gets its own copy.
            self.value = default if type(default) in _IMMUTABLE else pickle.loads(pickle.dumps(default))
            self.origin = "default"
        return self.value

    def set(self, value: Any) -> None:
        if value is None:  # None clears: the default reads from here on, in this step as in later ones
            self.clear()
            return
        self.value, self.origin = value, "set"
        if self.on_write is not None:
            self.on_write(self.spec)

    def clear(self) -> None:
        self.value, self.origin, self.deleted = _ABSENT, "absent", True

    def encode(self, last: bool = False) -> Any:
        """bytes to store, None to delete, _ABSENT to leave as stored."""
        origin, value = self.origin, self.value
        unchanged = None if self.deleted else _ABSENT
        if origin == "absent" or (origin == "stored" and type(value) in _IMMUTABLE):
            return unchanged
        if origin == "default" and type(value) is type(self.spec.default) and value == self.spec.default:
            return unchanged  # only read, never changed: nothing to store
        if value is None:
            return None
        encoded = self.spec.codec.encode(value)
        self.origin, self.deleted = "stored", False  # what is stored now
        return encoded


class ListCell:
    """A list state during one step, and the handle user code gets for it."""

    __slots__ = ("spec", "items", "on_write")

    def __init__(self, spec: ListState[Any], items: list[Any], on_write: Any = None) -> None:
        self.spec, self.items, self.on_write = spec, items, on_write

    def copy(self, memo: dict[int, Any]) -> "ListCell":
        return ListCell(self.spec, _plain_copy(self.items, memo), self.on_write)

    def get(self) -> list[Any]:
        return self.items

    def append(self, value: Any) -> None:
        self.items.append(value)
        if self.on_write is not None:
            self.on_write(self.spec)

    def set(self, values: list[Any]) -> None:
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise TypeError(f"list state {self.spec.name!r}: set() takes a list of items, got {type(values).__name__} "
                            f"{values!r:.60}; to store one item, use set([item]) or append(item)")
        self.items = list(values)
        if self.on_write is not None:
            self.on_write(self.spec)

    def clear(self) -> None:
        self.items = []

    def encode(self, last: bool = False) -> Any:
        codec = self.spec.codec
        return [codec.encode(v) for v in self.items] or None


_MISSING: Any = object()

# Key codecs whose decoded keys are exactly the keys that were stored: decode(encode(k)) equals k,
# of k's type, and equal keys hash alike (JSON has no NaN). A small stored map is indexed by its
# decoded keys under these alone: with another codec, a key the index misses might still be stored.
_EXACT_KEY_CODECS = (JsonCodec, StrCodec)
# Key types a map keeps as the keys themselves under these codecs and pickle: two keys of these types
# are equal exactly when their encodings are (an int and a str never are), so Python's equality finds
# the entry the encoding would. Other keys (1.0 == 1 == True, -0.0 == 0.0, a tuple holding them) are
# kept as their encodings; under any other codec, every key is.
_KEPT_KEY_TYPES = frozenset((int, str))
_NO_KEPT_KEY_TYPES: frozenset[type] = frozenset()
# Key types whose forms a map remembers for the step by type and value (MapCell._form): equal keys of
# one of these types are the same data, so any codec that is a function of its input encodes them
# alike, but for a zero float's sign, which is checked. Equal tuples may encode apart ((1,) and (1.0,);
# under pickle, one str twice or two equal strs): a tuple's form is remembered for tuples of the same
# item types only if its items are of these types, no float a zero and no str or bytes twice (`_flat_types`),
# else for that tuple object alone.
_VALUE_FORM_TYPES = frozenset((float, bool, type(None), bytes, int, str))
# A map remembering this many key forms in a step forgets them and starts again (each NaN object is
# one more: NaN equals nothing).
MAX_REMEMBERED_FORMS = 4096
# A map of up to this many stored entries may be indexed by its decoded keys in a step (MapCell), so
# that lookups of keys not stored encode nothing; a larger map encodes each key looked up.
INDEXED_MAP_ENTRIES = 32


class MapCell:
    """A map state during one step, and the handle user code gets for it. Entries are decoded one at
    a time, on first read, and kept by their key's *form*; changed and read entries are encoded again
    at the end of the step (a read value may have been mutated in place).

    A map's keys are their encodings: 1, 1.0 and True are three keys under JSON, as stored, in every
    step. A key is kept in its form: an int or str key under JSON, str or pickle keys as itself
    (equal such keys are encoded alike); any other key as its encoding (decoded back, under an exact
    codec, when that gives an int or a str: a str subclass under StrCodec); a key the codec refuses as
    the 1-tuple `(key,)`, which nothing stored can match (putting it is the error, at the flush).

    A key is found in the stored entries by its encoding, as it was stored. A small map whose key
    codec decodes exactly (_EXACT_KEY_CODECS) also gets an index of its stored keys, decoded, once
    a step has encoded as many distinct keys for lookups as the map has stored entries (a step looking
    up few keys builds none: it decodes no more keys than the step has encoded). A key absent from
    the index cannot be stored, so the common lookup, of a key not there yet, encodes nothing; a key
    present in it is still looked up by its encoding.

    The form of a key not of a kept type takes an encoding (and a decoding, under an exact codec) to
    find: the step remembers it (`forms`): for keys of _VALUE_FORM_TYPES by type and value, for tuples
    of them by item types and value where equal such tuples encode alike (`_flat_types`), for other
    tuples of plain data by the tuple object; so a key used again in the step, or built again equal,
    is not encoded again. A form depends on the key alone, not on the entries, so what is remembered
    holds across flushes and checkpoints; the cell, and with it what it remembers, lives one step.

    >>> cell = MapCell(MapState("m"), {b"1": b"10", b'"a"': b"20"})
    >>> cell.get(1), cell.get("a"), cell.get(2, 0), cell.get(1.0, "absent")
    (10, 20, 0, 'absent')
    >>> cell.put(2, 30); cell.remove("a"); cell.put(2.0, 40)
    >>> sorted(cell.encode().items())
    [(b'1', b'10'), (b'2', b'30'), (b'2.0', b'40')]
    """

    __slots__ = ("spec", "stored", "live", "on_write", "encoded", "index", "unindexed_lookups", "moved", "removals",
                 "kept", "exact", "forms")

    def __init__(self, spec: MapState[Any, Any], stored: dict[bytes, bytes], on_write: Any = None) -> None:
        self.spec = spec
        self.stored = stored  # encoded key -> encoded value, as persisted
        self.live: dict[Any, Any] = {}  # key's form -> value (or _REMOVED) read or written this step
        self.on_write = on_write
        self.encoded: dict[Any, bytes] = {}  # key -> its encoding, for kept keys encoded this step
        codec_type = type(spec.key_codec)
        self.exact = codec_type in _EXACT_KEY_CODECS
        # The types of keys kept as themselves (see the class doc).
        self.kept = _KEPT_KEY_TYPES if self.exact or codec_type is PickleCodec else _NO_KEPT_KEY_TYPES
        if not self.kept:
            self.__class__ = _EncodedKeysMapCell  # (the same slots)
        # The stored kept keys, decoded (to their encodings); None: not built (yet), or not for this map.
        self.index: dict[Any, bytes] | None = None
        self.unindexed_lookups = self._lookups_before_index()
        # Keys put again after a removal this step: they go last, as in a dict (`_all`, `encode`).
        self.moved: set[Any] = set()
        self.removals = False  # whether anything was removed this step (a put looks for a removal only then)
        # key -> (the key, its form, a tuple's item types if equal tuples of them share it) for keys not
        # of a kept type, made on first use (equal keys of other types share a slot: see `_form`).
        self.forms: dict[Any, tuple[Any, Any, tuple[type, ...] | None]] | None = None

    def copy(self, memo: dict[int, Any]) -> "MapCell":
        copied = MapCell.__new__(type(self))
        copied.spec, copied.stored, copied.on_write = self.spec, self.stored, self.on_write
        live = self.live
        _check_plain_keys(live, memo, 0)
        copied.live = {key: value if value is _REMOVED else _plain_copy(value, memo) for key, value in live.items()}
        copied.encoded = dict(self.encoded)
        copied.index = None if self.index is None else dict(self.index)
        copied.unindexed_lookups = self.unindexed_lookups
        copied.moved, copied.removals = set(self.moved), self.removals
        copied.kept, copied.exact = self.kept, self.exact
        copied.forms = self.forms  # shared: a form depends on the key alone
        return copied

    def _lookups_before_index(self) -> int:
        """How many keys are looked up by their encoding alone before the index is built (see the
        class doc): as many as the stored entries; -1: none is built for this map."""
        stored = self.stored
        if len(stored) > INDEXED_MAP_ENTRIES or type(self.spec.key_codec) not in _EXACT_KEY_CODECS:
            return -1
        return len(stored)

    def _index_for_lookup(self) -> dict[Any, bytes] | None:
        """The index, for a lookup about to be made: built if the map has waited for enough keys."""
        index = self.index
        if index is None and self.unindexed_lookups == 0:
            index = self._build_index()
        return index

    def _build_index(self) -> dict[Any, bytes]:
        decode, kept = self.spec.key_codec.decode, self.kept
        index = self.index = {}
        for encoded in self.stored:
            key = decode(encoded)
            if type(key) in kept:
                index[key] = encoded
        return index

    def _form(self, key: Any) -> Any:
        """The form of a key not of a kept type (see the class doc), remembered for the step where it
        can be. Raises TypeError for a key that is not hashable."""
        forms = self.forms
        if forms is not None:
            try:
                seen = forms.get(key)
            except TypeError:  # a key, or an item of a tuple, that is not hashable
                return self._new_form(key)
            # Found by equality: the very key (only keys of the types below are remembered), or one of
            # its type (item types) and, if a zero, sign.
            if seen is not None:
                other = seen[0]
                if other is key:
                    return seen[1]
                kind = type(key)
                if kind is tuple:
                    if seen[2] is not None and seen[2] == tuple(map(type, key)):
                        forms[key] = (key, seen[1], seen[2])  # this tuple's next use: found as itself
                        return seen[1]
                elif type(other) is kind and (key or kind is not float
                                              or math.copysign(1.0, key) == math.copysign(1.0, other)):
                    return seen[1]
        kind = type(key)
        if kind is not tuple and kind not in _VALUE_FORM_TYPES:
            return self._new_form(key)
        form = self._new_form(key)
        types = None
        if kind is tuple:
            types = _flat_types(key)
            if types is None and not _plain_key(key, 0):
                return form
        if forms is None:
            forms = self.forms = {}
        elif len(forms) >= MAX_REMEMBERED_FORMS:
            forms.clear()
        forms[key] = (key, form, types)
        return form

    def _new_form(self, key: Any) -> Any:
        """The form of a key not of a kept type, found from its encoding."""
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"map state {self.spec.name!r}: a key must be hashable (a str, int, tuple, ...), got "
                            f"{type(key).__name__} {key!r:.60}") from None
        codec = self.spec.key_codec
        try:
            encoded = codec.encode(key)
        except CodecError:
            return (key,)
        if self.exact:
            decoded = codec.decode(encoded)
            if type(decoded) in self.kept:
                return decoded
        return encoded

    def _stored_form(self, encoded: bytes) -> Any:
        """The form of the key stored as `encoded`: the form a lookup of that key takes."""
        kept = self.kept
        if not kept:
            return encoded
        codec = self.spec.key_codec
        key = codec.decode(encoded)
        if type(key) in kept and (self.exact or codec.encode(key) == encoded):
            return key
        return encoded

    def _key(self, form: Any) -> Any:
        """The key a listing shows for a form: the stored key as decoded."""
        kind = type(form)
        if kind in self.kept:
            return form
        if kind is tuple:
            return form[0]
        return self.spec.key_codec.decode(form)

    def _encode_key(self, key: Any) -> bytes:
        """The encoding of a kept key, cached for the step."""
        data = self.encoded.get(key)
        if data is None:
            data = self.encoded[key] = self.spec.key_codec.encode(key)
            left = self.unindexed_lookups  # a key encoded for the first time: one nearer the index
            if left > 0:
                self.unindexed_lookups = left - 1
        return data

    def _stored_value(self, form: Any) -> bytes | None:
        """The persisted encoding of the value of the key of form `form`, if any. A key the key codec
        refuses cannot have been stored: it is absent here (and reported when it is put, at the end of
        the step), so looking it up gives the same answer whether or not anything is stored."""
        stored = self.stored
        if not stored:  # nothing persisted: no key to encode for the lookup
            return None
        kind = type(form)
        if kind not in self.kept:
            return None if kind is tuple else stored.get(form)
        index = self._index_for_lookup()
        if index is not None and form not in index:
            return None
        try:
            return stored.get(self._encode_key(form))
        except CodecError:
            return None

    def _get_form(self, form: Any, default: Any) -> Any:
        """get() of the key of form `form`."""
        value = self.live.get(form, _MISSING)
        if value is _MISSING:
            data = self._stored_value(form)
            if data is None:
                return default
            value = self.live[form] = self.spec.value_codec.decode(data)
        return default if value is _REMOVED else value

    # get, put, remove and contains take an int or str key as itself: this class is for maps that keep
    # them (kept is _KEPT_KEY_TYPES; see __init__), so a key's type is checked without looking at kept.
    def get(self, key: Any, default: Any = None) -> Any:
        kind = type(key)
        if kind is not int and kind is not str:
            form = self._form(key)
            value = self.live.get(form, _MISSING)  # _get_form(), inlined where the step has the entry
            if value is _MISSING:
                return self._get_form(form, default)
            return default if value is _REMOVED else value
        value = self.live.get(key, _MISSING)
        if value is _MISSING:
            stored = self.stored
            if not stored:  # _stored_value(), inlined: the per-record path
                return default
            index = self.index  # _index_for_lookup(), inlined
            if index is None and self.unindexed_lookups == 0:
                index = self._build_index()
            if index is not None and key not in index:
                return default  # not stored: nothing to encode
            encoded = self.encoded.get(key)  # _encode_key(), inlined
            if encoded is None:
                try:
                    encoded = self.encoded[key] = self.spec.key_codec.encode(key)
                except CodecError:
                    return default
                left = self.unindexed_lookups
                if left > 0:
                    self.unindexed_lookups = left - 1
            data = stored.get(encoded)
            if data is None:
                return default
            value = self.live[key] = self.spec.value_codec.decode(data)
        return default if value is _REMOVED else value

    def put(self, key: Any, value: Any) -> None:
        kind = type(key)
        if kind is not int and kind is not str:
            key = self._form(key)
        live = self.live  # _put_form(), inlined: the per-record path
        if self.removals and live.get(key) is _REMOVED:  # put again after a removal: last, as in a dict
            del live[key]
            self.moved.add(key)
        live[key] = value
        if self.on_write is not None:
            self.on_write(self.spec)

    def remove(self, key: Any) -> None:
        kind = type(key)
        if kind is not int and kind is not str:
            key = self._form(key)
        self.live[key] = _REMOVED
        self.removals = True

    def contains(self, key: Any) -> bool:
        kind = type(key)
        if kind is not int and kind is not str:
            key = self._form(key)
        value = self.live.get(key, _MISSING)  # _contains_form(), inlined
        if value is _MISSING:
            return self._stored_value(key) is not None
        return value is not _REMOVED

    def _put_form(self, form: Any, value: Any) -> None:
        live = self.live
        if self.removals and live.get(form) is _REMOVED:  # put again after a removal: last, as in a dict
            del live[form]
            self.moved.add(form)
        live[form] = value
        if self.on_write is not None:
            self.on_write(self.spec)

    def _contains_form(self, form: Any) -> bool:
        value = self.live.get(form, _MISSING)
        if value is _MISSING:
            return self._stored_value(form) is not None
        return value is not _REMOVED

    def clear(self) -> None:
        self.removals = True
        live = self.live
        for form in live:  # entries of this step, stored or not yet
            live[form] = _REMOVED
        for encoded in self.stored:
            live[self._stored_form(encoded)] = _REMOVED

    def _all(self) -> dict[Any, Any]:
        """Every entry decoded (iteration needs them all), by form, in the order of a dict that took
        the map's whole history: the stored entries in their stored order, then those put this step
        that are new or put again after a removal, in the order put. (Not `live`'s order: that is the
        order the step touched them, a read included, so it would depend on where steps begin.)"""
        value_codec, live, moved = self.spec.value_codec, self.live, self.moved
        ordered: dict[Any, Any] = {}
        for encoded, data in self.stored.items():
            form = self._stored_form(encoded)
            if form in moved:
                continue
            value = live.get(form, _MISSING)
            if value is _MISSING:
                value = live[form] = value_codec.decode(data)
            ordered[form] = value
        for form, value in live.items():
            if form not in ordered:
                ordered[form] = value
        return ordered

    def items(self) -> Iterator[tuple[Any, Any]]:
        key = self._key
        return iter([(key(f), v) for f, v in self._all().items() if v is not _REMOVED])

    def keys(self) -> Iterator[Any]:
        key = self._key
        return iter([key(f) for f, v in self._all().items() if v is not _REMOVED])

    def __len__(self) -> int:
        return sum(1 for v in self._all().values() if v is not _REMOVED)

    def encode(self, last: bool = False) -> Any:
        """The entries as stored after the step so far (None: none left; _ABSENT: no change). Unless
        `last` (the cell is not used again), the cell stays valid: removal markers leave `live`."""
        if not self.live:
            return _ABSENT
        stored = self.stored  # owned by the KeyState; a failed step reloads the key from its blob
        value_codec, encode_key, known, kept = self.spec.value_codec, self._encode_key, self.encoded, self.kept
        index = self.index
        removed: list[Any] | None = None if last else []
        moved = self.moved
        try:
            for form, value in self.live.items():
                kind = type(form)
                if value is not _REMOVED:
                    if kind in kept:
                        encoded = known.get(form) or encode_key(form)
                    elif kind is tuple:  # a key the codec refuses: its error
                        encoded = self.spec.key_codec.encode(form[0])
                    else:
                        encoded = form
                    if moved and form in moved:  # last, as in a dict
                        stored.pop(encoded, None)
                    stored[encoded] = value_codec.encode(value)
                    continue
                if removed is not None:
                    removed.append(form)
                # Else nothing to remove: no entry stored, or none under the key (index), so the
                # entry was put and removed within the step; or a key the codec refuses.
                if not stored:
                    continue
                if kind in kept:
                    if index is None or form in index:
                        try:
                            stored.pop(known.get(form) or encode_key(form), None)
                        except CodecError:
                            pass  # a key the codec refuses was never stored
                elif kind is not tuple:
                    stored.pop(form, None)
        finally:  # the stored entries changed, even if a value was refused part way
            self.index = None
            self.unindexed_lookups = self._lookups_before_index()
        if removed is None:
            return stored or None
        for form in removed:
            del self.live[form]
        moved.clear()
        self.removals = False  # no marker is left in `live`
        return stored or None


class _EncodedKeysMapCell(MapCell):
    """A MapCell whose key codec keeps no key as itself (see MapCell's doc): an int or str key takes
    its form too."""

    __slots__ = ()

    def get(self, key: Any, default: Any = None) -> Any:
        return self._get_form(self._form(key), default)

    def put(self, key: Any, value: Any) -> None:
        self._put_form(self._form(key), value)

    def remove(self, key: Any) -> None:
        self.live[self._form(key)] = _REMOVED
        self.removals = True

    def contains(self, key: Any) -> bool:
        return self._contains_form(self._form(key))


def _flat_types(key: tuple[Any, ...]) -> tuple[type, ...] | None:
    """The item types of a tuple whose encoding any equal tuple of the same item types shares (see
    _VALUE_FORM_TYPES); None for any other tuple."""
    types = tuple(map(type, key))
    if not _VALUE_FORM_TYPES.issuperset(types):
        return None
    if float in types and not all(item for item in key if type(item) is float):
        return None  # a zero: 0.0 == -0.0
    if str in types or bytes in types:
        shared = [item for item in key if type(item) is str or type(item) is bytes]
        if len(set(shared)) < len(shared):
            return None
    return types


def _plain_key(key: tuple[Any, ...], depth: int) -> bool:
    """Whether a tuple holds only plain atoms and tuples of them (at most 20 deep): its encoding
    cannot change while it lives, so its form can be remembered."""
    if depth > 20:
        return False
    for item in key:
        kind = type(item)
        if kind not in _PLAIN_ATOMS and (kind is not tuple or not _plain_key(item, depth + 1)):
            return False
    return True


def decoded_value(cell: Any) -> Any:
    """A state's whole decoded value, for inspection (the harness's `state()`)."""
    if isinstance(cell, MapCell):
        return dict(cell.items())
    if isinstance(cell, ListCell):
        return list(cell.items)
    return cell.get()


def specs_codec(spec: StateSpec) -> Codec:
    return spec.value_codec if isinstance(spec, MapState) else spec.codec
