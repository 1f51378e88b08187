"""What a map state's key costs per access, by key type: this tree's `MapCell` against other versions
of core/keystate.py, side by side in one process.

Each case runs 200,000 iterations of a loop body on a fresh cell over a small stored map (8 entries):
a pickled tuple key, the same object or built per iteration, get + put; a JSON float key, the same
object or computed per iteration, five accesses (get, put, contains, get, get); an int key already
read in the step, one get; an int key, get + put (the Windower's access); a str key already read,
one get; and the empty loop. Each repeat runs every case once per version, the versions in a
rotated order; the table gives each version's best repeat, in ns per iteration (the loop's own cost
included, as in the empty loop), and this tree's over the first other version's.

    git show 09b2fe9^:millstream/core/keystate.py > /tmp/keystate_old.py
    python -m bench.mapkeys old=/tmp/keystate_old.py [--repeats 11]

The other files are imported as modules of their own (they import the rest of millstream from this
tree), so only a keystate.py whose imports this tree still has can be compared.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import time
from types import ModuleType
from typing import Any, Callable

from millstream.model.codecs import JsonCodec, PickleCodec
from millstream.model.state import MapState

N = 200_000
THIS_TREE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "millstream", "core",
                         "keystate.py")


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cell_of(keystate: ModuleType, codec: Any, keys: list) -> Any:
    stored = {codec.encode(k): JsonCodec().encode(i) for i, k in enumerate(keys)}
    return keystate.MapCell(MapState("m", key_codec=codec), stored)


def tuple_same(keystate: ModuleType) -> float:
    cell = cell_of(keystate, PickleCodec(), [("k", i) for i in range(8)])
    get, put, key = cell.get, cell.put, ("k", 3)
    start = time.perf_counter_ns()
    for _ in range(N):
        put(key, get(key, 0) + 1)
    return (time.perf_counter_ns() - start) / N


def tuple_fresh(keystate: ModuleType) -> float:
    cell = cell_of(keystate, PickleCodec(), [("k", i) for i in range(8)])
    get, put, names = cell.get, cell.put, ["k"] * 8
    start = time.perf_counter_ns()
    for i in range(N):
        key = (names[i & 7], i & 7)
        put(key, get(key, 0) + 1)
    return (time.perf_counter_ns() - start) / N


def float_same(keystate: ModuleType) -> float:
    cell = cell_of(keystate, JsonCodec(), [i + 0.5 for i in range(8)])
    get, put, contains, key = cell.get, cell.put, cell.contains, float("3.5")
    start = time.perf_counter_ns()
    for i in range(N):
        get(key, 0)
        put(key, i)
        contains(key)
        get(key)
        get(key)
    return (time.perf_counter_ns() - start) / N


def float_fresh(keystate: ModuleType) -> float:
    cell = cell_of(keystate, JsonCodec(), [i + 0.5 for i in range(8)])
    get, put, contains = cell.get, cell.put, cell.contains
    start = time.perf_counter_ns()
    for i in range(N):
        key = (i & 7) + 0.5
        get(key, 0)
        put(key, i)
        contains(key)
        get(key)
        get(key)
    return (time.perf_counter_ns() - start) / N


def int_read(keystate: ModuleType) -> float:
    cell = cell_of(keystate, JsonCodec(), list(range(8)))
    get = cell.get
    get(3)
    start = time.perf_counter_ns()
    for _ in range(N):
        get(3, 0)
    return (time.perf_counter_ns() - start) / N


def int_put(keystate: ModuleType) -> float:
    cell = cell_of(keystate, JsonCodec(), list(range(8)))
    get, put = cell.get, cell.put
    start = time.perf_counter_ns()
    for i in range(N):
        key = i & 7
        put(key, get(key, 0) + 1)
    return (time.perf_counter_ns() - start) / N


def str_read(keystate: ModuleType) -> float:
    cell = cell_of(keystate, JsonCodec(), [f"k{i}" for i in range(8)])
    get, key = cell.get, "k3"
    get(key)
    start = time.perf_counter_ns()
    for _ in range(N):
        get(key, 0)
    return (time.perf_counter_ns() - start) / N


def empty_loop(keystate: ModuleType) -> float:
    start = time.perf_counter_ns()
    for _ in range(N):
        pass
    return (time.perf_counter_ns() - start) / N


CASES: list[Callable[[ModuleType], float]] = [tuple_same, tuple_fresh, float_same, float_fresh, int_read, int_put,
                                              str_read, empty_loop]


def main() -> None:
    parser = argparse.ArgumentParser("bench.mapkeys")
    parser.add_argument("others", nargs="+", metavar="LABEL=PATH", help="another version's keystate.py")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    versions = [(label, load(path, f"keystate_{n}"))
                for n, (label, path) in enumerate(other.split("=", 1) for other in args.others)]
    versions.append(("this tree", load(THIS_TREE, "keystate_this_tree")))
    best = {(case.__name__, label): float("inf") for case in CASES for label, _ in versions}
    gc.disable()
    for repeat in range(args.repeats):
        rotated = versions[repeat % len(versions):] + versions[:repeat % len(versions)]
        for case in CASES:
            for label, keystate in rotated:
                best[case.__name__, label] = min(best[case.__name__, label], case(keystate))
    labels = [label for label, _ in versions]
    print(f"{'ns per iteration':18}" + "".join(f"{label:>14}" for label in labels) + f"{'this / ' + labels[0]:>16}")
    for case in CASES:
        row = [best[case.__name__, label] for label in labels]
        print(f"{case.__name__:18}" + "".join(f"{value:14.1f}" for value in row) + f"{row[-1] / row[0]:16.3f}")


if __name__ == "__main__":
    main()
