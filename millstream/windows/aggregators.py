"""What a window computes: an aggregator folds the window's values into an accumulator and turns
it into the window's result (Bytewax's fold_window, Beam's CombineFn without merging).

An aggregator is three pure functions: `init()` a fresh accumulator, `add(accumulator, value)` the
accumulator with one more value, `finish(accumulator)` the result. Accumulators are persisted per key
and window between records, so they must pickle (they are written and read only by the pipeline).
`merge` is not part of the contract: tumbling and sliding windows keep one accumulator per window
and never need to combine two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, TypeVar

In = TypeVar("In")
Acc = TypeVar("Acc")
Out = TypeVar("Out")
In_contra = TypeVar("In_contra", contravariant=True)
Out_co = TypeVar("Out_co", covariant=True)


class Aggregator(Protocol[In_contra, Acc, Out_co]):
    """The fold a WindowAggregate runs per key and window: any object with these three methods.

    >>> class Average:
    ...     def init(self): return [0, 0.0]
    ...     def add(self, acc, value): return [acc[0] + 1, acc[1] + value]
    ...     def finish(self, acc): return acc[1] / acc[0]
    >>> avg = Average()
    >>> avg.finish(avg.add(avg.add(avg.init(), 1.0), 4.0))
    2.5
    """

    def init(self) -> Acc: ...

    def add(self, accumulator: Acc, value: In_contra) -> Acc: ...

    def finish(self, accumulator: Acc) -> Out_co: ...


class _Comparable(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


C = TypeVar("C", bound=_Comparable)


class Count:
    """How many records the window holds.

    >>> agg = Count()
    >>> agg.finish(agg.add(agg.add(agg.init(), "a"), "b"))
    2
    """

    def init(self) -> int:
        return 0

    def add(self, accumulator: int, value: object) -> int:
        return accumulator + 1

    def finish(self, accumulator: int) -> int:
        return accumulator

    def __repr__(self) -> str:
        return "Count()"


class Sum:
    """The sum of the window's values (numbers).

    >>> agg = Sum()
    >>> agg.finish(agg.add(agg.add(agg.init(), 2), 3.5))
    5.5
    """

    def init(self) -> float:
        return 0

    def add(self, accumulator: float, value: float) -> float:
        return accumulator + value

    def finish(self, accumulator: float) -> float:
        return accumulator

    def __repr__(self) -> str:
        return "Sum()"


class Min(Generic[C]):
    """The smallest of the window's values. A window exists only once a record is in it, so the
    result is never None for an emitted window.

    >>> agg = Min[int]()
    >>> agg.finish(agg.add(agg.add(agg.init(), 7), 3))
    3
    """

    def init(self) -> C | None:
        return None

    def add(self, accumulator: C | None, value: C) -> C | None:
        return value if accumulator is None or value < accumulator else accumulator

    def finish(self, accumulator: C | None) -> C | None:
        return accumulator

    def __repr__(self) -> str:
        return "Min()"


class Max(Generic[C]):
    """The largest of the window's values.

    >>> agg = Max[int]()
    >>> agg.finish(agg.add(agg.add(agg.init(), 7), 3))
    7
    """

    def init(self) -> C | None:
        return None

    def add(self, accumulator: C | None, value: C) -> C | None:
        return value if accumulator is None or accumulator < value else accumulator

    def finish(self, accumulator: C | None) -> C | None:
        return accumulator

    def __repr__(self) -> str:
        return "Max()"


class Collect(Generic[In]):
    """The window's values as a list, in the order they were processed (arrival order, which is
    not event-time order: sort the result if order matters).

    >>> agg = Collect[str]()
    >>> agg.finish(agg.add(agg.add(agg.init(), "x"), "y"))
    ['x', 'y']
    """

    def init(self) -> list[In]:
        return []

    def add(self, accumulator: list[In], value: In) -> list[In]:
        accumulator.append(value)
        return accumulator

    def finish(self, accumulator: list[In]) -> list[In]:
        return accumulator

    def __repr__(self) -> str:
        return "Collect()"


def _identity(accumulator: Any) -> Any:
    return accumulator


@dataclass(frozen=True)
class Fold(Generic[In, Acc, Out]):
    """Your own aggregator from plain functions. `finish` defaults to returning the accumulator.
    Use module-level functions (or lambdas) without outside state: they run on Spark's workers.
    Give the types (value, accumulator, result) as below where code is type-checked: mypy cannot
    infer them from lambdas.

    >>> mean = Fold[float, list, float](init=lambda: [0, 0.0],
    ...                                 add=lambda acc, v: [acc[0] + 1, acc[1] + v],
    ...                                 finish=lambda acc: acc[1] / acc[0])
    >>> mean.finish(mean.add(mean.add(mean.init(), 1.0), 2.0))
    1.5
    """

    init: Callable[[], Acc]
    add: Callable[[Acc, In], Acc]
    finish: Callable[[Acc], Out] = _identity

    def __post_init__(self) -> None:
        for name in ("init", "add", "finish"):
            if not callable(getattr(self, name)):
                raise TypeError(f"Fold {name}= must be callable")
