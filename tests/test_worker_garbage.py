"""A reused Python worker keeps what it holds (the operator's key caches, every module it imported) out
of the full collection PySpark's daemon runs after every task (spark/worker_garbage.py)."""

import gc
import weakref

from millstream.core.store import StoredKey
from millstream.spark.worker_garbage import WorkerGarbage


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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


def _unfrozen_objects(task) -> tuple[int, int]:
    """What PySpark's daemon would visit in its full collection before and right after `task` ran, in
    a process that imported all a worker imports (tens of thousands of objects)."""
    gc.unfreeze()
    before = len(gc.get_objects())
    task()
    return before, len(gc.get_objects())


def test_a_writer_task_leaves_the_worker_frozen_for_the_daemon_s_collection(tmp_path):
    from millstream.core.production import Produced, order_base
    from millstream.spark.writer import BatchWriter
    from test_writer import operator_rows

    productions = [Produced("out", f"k{i % 7}", b"v", i, f"id{i}", 0, order_base(f"k{i % 7}") + i) for i in range(500)]
    rows = operator_rows(productions, 3, 50)
    before, after = _unfrozen_objects(lambda: list(BatchWriter(str(tmp_path), "win", 1, "a", ())(iter([rows]))))
    assert before > 10_000 and after < 1_000


def test_a_source_task_leaves_the_worker_frozen_for_the_daemon_s_collection(tmp_path):
    from millstream.spark.partitioning import GroupLabels
    from millstream.spark.source import BatchPlan, InputsReader, SourcePlan, _Partition

    reader = InputsReader(SourcePlan(None, str(tmp_path), (), "wake", GroupLabels((0, 1, 2))))  # type: ignore[arg-type]
    heartbeat = _Partition("heartbeat", None, BatchPlan((), 0).dumps())
    before, after = _unfrozen_objects(lambda: list(reader.read(heartbeat)))
    assert before > 10_000 and after < 1_000
