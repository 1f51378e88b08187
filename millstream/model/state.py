"""Declarations of per-key persistent state (Beam's userstate style).

A computation declares its state as class attributes; at run time `ctx.state(spec)` returns a handle
for the current key. Every value is persisted through the declaration's codec, so the user chooses the
serialization; state of one key is read and written atomically with that key's timers and productions.

    class Counter(Computation):
        count = ValueState("count", default=0)

        def process_record(self, ctx, record):
            state = ctx.state(self.count)
            state.set(state.get() + 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Iterator, Protocol, TypeVar

from millstream.model.codecs import DEFAULT_CODEC, Codec

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class ValueState(Generic[T]):
    """One value per key; `get()` returns `default` until set."""

    name: str
    codec: Codec = DEFAULT_CODEC
    default: Any = None


@dataclass(frozen=True)
class ListState(Generic[T]):
    """An ordered list per key."""

    name: str
    codec: Codec = DEFAULT_CODEC


@dataclass(frozen=True)
class MapState(Generic[K, V]):
    """A map per key, with separate codecs for the map's keys and values."""

    name: str
    key_codec: Codec = DEFAULT_CODEC
    value_codec: Codec = DEFAULT_CODEC


StateSpec = ValueState | ListState | MapState


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
    def get(self, key: K, default: V | None = None) -> V | None: ...

    def put(self, key: K, value: V) -> None: ...

    def remove(self, key: K) -> None: ...

    def contains(self, key: K) -> bool: ...

    def items(self) -> Iterator[tuple[K, V]]: ...

    def keys(self) -> Iterator[K]: ...

    def __len__(self) -> int: ...

    def clear(self) -> None: ...
