"""The Spark operator's worker keeps its key caches out of the full collection PySpark's daemon
runs after every task (statestore.WorkerGarbage)."""

import gc
import weakref

import pytest

from millstream.core.store import StoredKey
from millstream.spark.statestore import WorkerGarbage


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def unfrozen():
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.other: "Node | None" = None


def test_state_alive_after_a_step_is_not_visited_by_the_collection_after_the_task():
    clock = Clock()
    garbage = WorkerGarbage(spacing=20, clock=clock)
    garbage.settle()
    cache = {f"k{i}": StoredKey(b"x" * 10, i, None, ()) for i in range(1000)}  # a step fills the cache
    sample = [cache["k1"], cache["k999"]]
    clock.now += 0.5  # before the next full collection is due (at least 1 s apart)
    assert garbage.settle() is False
    alive = {id(o) for o in gc.get_objects()}  # what a collection visits
    assert not any(id(o) in alive for o in sample)
    # Frozen objects are still freed by reference counting.
    probe = weakref.ref(cache.setdefault("probe", Node()))
    del cache["probe"]
    assert probe() is None


def test_cyclic_garbage_frozen_meanwhile_is_collected_when_a_full_collection_is_due():
    clock = Clock()
    garbage = WorkerGarbage(spacing=20, clock=clock)
    garbage.settle()
    a, b = Node(), Node()
    a.other, b.other = b, a
    probe = weakref.ref(a)
    del a, b
    clock.now += 0.5
    assert garbage.settle() is False  # frozen with the cycle inside
    gc.collect()  # the daemon's collection does not see it
    assert probe() is not None
    clock.now += 3600
    assert garbage.settle() is True
    assert probe() is None


def test_a_worker_waiting_for_its_next_batch_does_not_bring_the_next_full_collection_closer():
    import time

    garbage = WorkerGarbage(spacing=0, min_gap_s=0.1)  # the default clock: the process's CPU time
    assert garbage.settle() is True
    time.sleep(0.3)  # idle between batches: no CPU spent
    assert garbage.settle() is False
    busy_until = time.process_time() + 0.15
    while time.process_time() < busy_until:  # a step's work
        pass
    assert garbage.settle() is True
