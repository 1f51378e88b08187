"""Declarations of per-key persistent state (Beam's userstate style).

A computation declares its state as class attributes; at run time `ctx.state(spec)` returns a handle
for the current key, typed by the declaration (`ValueState[int]` gives a handle whose `get()` is an
`int`). Every value is persisted through the declaration's codec, so the user chooses the
serialization; state of one key is read and written atomically with that key's timers and productions.

    class Counter(Computation):
        count: ValueState[int] = ValueState("count", default=0)

        def process_record(self, ctx, record):
            state = ctx.state(self.count)
            state.set(state.get() + 1)

`ttl_ms` bounds how long a value lives without being written, in low-watermark time: once the
computation's input low watermark passes the last write + ttl_ms, the value is gone, whether or not
the key is touched again (Flink's StateTtlConfig with OnCreateAndWrite; Spark's TTL, in event time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Iterator, Protocol, TypeVar, overload

from millstream.model.codecs import DEFAULT_CODEC, Codec, is_codec

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


def _check_declaration(name: Any, ttl_ms: int | None, **codecs: Any) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a state's name must be a non-empty str, got {name!r}")
    if ttl_ms is not None and (isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0):
        raise ValueError(f"state {name!r}: ttl_ms must be a positive int of milliseconds or None")
    for field, codec in codecs.items():
        if not is_codec(codec):
            raise TypeError(f"state {name!r}: {field} must be a codec object with encode() and decode(), such as "
                            f"millstream.JsonCodec() or millstream.PickleCodec(), got {codec!r}")


@dataclass(frozen=True)
class ValueState(Generic[T]):
    """One value per key; `get()` returns `default` until set. `set(None)` clears it: `get()` returns
    the default from then on, in the same step as in later ones, and nothing is stored.

    Typed by what `get()` returns: `ValueState("count", default=0)` is a `ValueState[int]`, and one
    without a default is a `ValueState[int | None]` (its `get()` is None until set): mypy types even
    `ValueState[int]("count")` so, and refuses it where a `ValueState[int]` is declared. Declare one
    without a default with its type, `last: ValueState[str | None] = ValueState("last")`: left
    undeclared, mypy takes it for a `ValueState[None]` and refuses every `set()`.

    >>> ValueState[int]("count", default=0).default
    0
    >>> ValueState[str | None]("last").default is None
    True
    """

    name: str
    codec: Codec = DEFAULT_CODEC
    default: Any = None
    ttl_ms: int | None = None

    if TYPE_CHECKING:  # what mypy sees; the dataclass's own __init__ runs
        @overload
        def __init__(self: ValueState[T], name: str, codec: Codec = ..., *, default: T,
                     ttl_ms: int | None = ...) -> None: ...

        @overload
        def __init__(self: ValueState[T], name: str, codec: Codec, default: T, ttl_ms: int | None = ...) -> None: ...

        @overload
        def __init__(self: ValueState[T | None], name: str, codec: Codec = ..., default: None = ...,
                     ttl_ms: int | None = ...) -> None: ...

        def __init__(self, name: str, codec: Codec = DEFAULT_CODEC, default: Any = None,
                     ttl_ms: int | None = None) -> None: ...

    def __post_init__(self) -> None:
        _check_declaration(self.name, self.ttl_ms, codec=self.codec)


@dataclass(frozen=True)
class ListState(Generic[T]):
    """An ordered list per key.

    >>> ListState[str]("seen").name
    'seen'
    """

    name: str
    codec: Codec = DEFAULT_CODEC
    ttl_ms: int | None = None

    def __post_init__(self) -> None:
        _check_declaration(self.name, self.ttl_ms, codec=self.codec)


@dataclass(frozen=True)
class MapState(Generic[K, V]):
    """A map per key, with separate codecs for the map's keys and values. Entries are decoded one by
    one as they are read, so touching one entry of a large map costs one entry.

    >>> MapState[int, int]("counts").name
    'counts'
    """

    name: str
    key_codec: Codec = DEFAULT_CODEC
    value_codec: Codec = DEFAULT_CODEC
    ttl_ms: int | None = None

    def __post_init__(self) -> None:
        _check_declaration(self.name, self.ttl_ms, key_codec=self.key_codec, value_codec=self.value_codec)


StateSpec = ValueState[Any] | ListState[Any] | MapState[Any, Any]


class ValueHandle(Protocol[T]):
    def get(self) -> T: ...

    def set(self, value: T) -> None: ...

    def clear(self) -> None: ...


class ListHandle(Protocol[T]):
    def get(self) -> list[T]: ...

    def append(self, value: T) -> None: ...

    def set(self, values: list[T]) -> None: ...

    def clear(self) -> None: ...


class MapHandle(Protocol[K, V]):
    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: V) -> V: ...

    def get(self, key: K, default: V | None = None) -> V | None: ...

    def put(self, key: K, value: V) -> None: ...

    def remove(self, key: K) -> None: ...

    def contains(self, key: K) -> bool: ...

    def items(self) -> Iterator[tuple[K, V]]: ...

    def keys(self) -> Iterator[K]: ...

    def __len__(self) -> int: ...

    def clear(self) -> None: ...
