"""A key group's keys in Spark's state store (spark/statestore.py), against an in-memory stand-in for
Spark's ValueState and MapState whose writes become visible only when the batch commits, as Spark's
do. What is checked, apart from the code under test:

- what the store writes per batch follows what the batch changed, however long the pipeline runs
  (a head that grew by an entry per batch, rewritten by every batch, once made the small batches
  below write 6.7x what they changed, and more the longer they ran);
- every worker's cache reads what Spark committed: it catches up on the chunks other workers wrote,
  and rebuilds when it holds an attempt Spark never committed.
"""

from __future__ import annotations

import copy
import pickle
import time
from collections import Counter

import pytest

from millstream.core.dedup import seen_of
from millstream.core.store import StoredKey
from millstream.spark import statestore
from millstream.spark.statestore import Head, SparkKeyStore


class FakeSpark:
    """Committed values and one batch's pending writes; reads see the batch's own writes."""

    def __init__(self) -> None:
        self.head: bytes | None = None
        self.chunks: dict[int, bytes] = {}
        self.pending_head: bytes | None = None
        self.pending: dict[int, bytes | None] = {}
        self.written = 0  # bytes of values handed to Spark, head included
        self.chunk_reads = 0

    # ValueState
    def get(self):
        head = self.pending_head if self.pending_head is not None else self.head
        return None if head is None else (head,)

    def update(self, value) -> None:
        self.pending_head = value[0]
        self.written += len(value[0])

    # MapState
    def getValue(self, key):
        self.chunk_reads += 1
        chunk_id = key[0]
        blob = self.pending[chunk_id] if chunk_id in self.pending else self.chunks.get(chunk_id)
        return None if blob is None else (blob,)

    def updateValue(self, key, value) -> None:
        self.pending[key[0]] = value[0]
        self.written += len(value[0])

    def removeKey(self, key) -> None:
        self.pending[key[0]] = None

    def commit(self) -> None:
        if self.pending_head is not None:
            self.head = self.pending_head
        for chunk_id, blob in self.pending.items():
            if blob is None:
                self.chunks.pop(chunk_id, None)
            else:
                self.chunks[chunk_id] = blob
        self.abort()

    def abort(self) -> None:
        self.pending_head, self.pending = None, {}


@pytest.fixture(autouse=True)
def fresh_caches():
    statestore._CACHES.clear()
    yield
    statestore._CACHES.clear()


def stored(value: int) -> StoredKey:
    return StoredKey(pickle.dumps(("state", value, "x" * 60)), None, None)


HORIZON = 600_000


def batch(spark: FakeSpark, changes: dict, seen=(), watermark: int = 0, commit: bool = True) -> SparkKeyStore:
    store = SparkKeyStore(spark, spark, "ns", 0)
    store.save(dict(changes), seen_of(seen), watermark, HORIZON)
    spark.commit() if commit else spark.abort()
    return store


def plain_state(spark: FakeSpark) -> dict[str, StoredKey]:
    """The key group's keys as Spark holds them, rebuilt from a cache of no worker."""
    statestore._CACHES.clear()
    return dict(SparkKeyStore(spark, spark, "ns", 0).cache.keys.blobs)


def test_bytes_written_per_batch_follow_the_changes_however_many_batches_ran():
    spark = FakeSpark()
    batch(spark, {f"k{i}": stored(i) for i in range(5_000)})  # a large live state, written once
    changed = 0
    spark.written = 0
    for n in range(3_000):  # then small batches: 20 keys each, compactions included
        change = {f"k{(20 * n + i) % 5_000}": stored(n) for i in range(20)}
        changed += sum(len(s.blob) + len(k) for k, s in change.items())
        batch(spark, change)
    head_size = len(spark.head)
    assert spark.written <= 3 * changed, (spark.written, changed)
    assert head_size < 200, head_size


def test_a_worker_whose_cache_lags_catches_up_on_the_chunks_it_missed():
    spark = FakeSpark()
    batch(spark, {f"k{i}": stored(i) for i in range(100)})
    batch(spark, {"k1": stored(1_001)})
    behind = copy.deepcopy(statestore._CACHES)  # another worker's cache, as of now
    for n in range(5):
        batch(spark, {f"k{n}": stored(2_000 + n)}, seen=[(f"k{n}", f"r{n}", 10 + n)])
    statestore._CACHES.clear()
    statestore._CACHES.update(behind)
    spark.chunk_reads = 0
    store = SparkKeyStore(spark, spark, "ns", 0)
    assert spark.chunk_reads == 5  # just the five chunks it missed
    assert store.cache.keys.blobs == plain_state(spark)
    assert store.cache.keys.blobs["k3"] == stored(2_003) and "r3" in store.seen_ids("k3")


def test_a_cache_holding_an_attempt_spark_never_committed_is_rebuilt():
    spark = FakeSpark()
    batch(spark, {"a": stored(1), "b": stored(2)})
    batch(spark, {"a": stored(3)}, commit=False)  # this worker's attempt: Spark never committed it
    store = SparkKeyStore(spark, spark, "ns", 0)  # the batch again, on the same worker
    assert store.cache.keys.blobs["a"] == stored(1)


def test_a_cache_behind_an_attempt_another_worker_committed_in_its_place_is_rebuilt():
    spark = FakeSpark()
    batch(spark, {"a": stored(1)})
    batch(spark, {"a": stored(2)}, commit=False)  # worker 1's attempt at batch 2: lost
    mine = copy.deepcopy(statestore._CACHES)
    statestore._CACHES.clear()
    batch(spark, {"a": stored(3)})  # worker 2 ran batch 2 again, differently: committed
    batch(spark, {"b": stored(4)})  # and batch 3
    statestore._CACHES.clear()
    statestore._CACHES.update(mine)  # worker 1 again: its cache claims batch 2 was its own
    store = SparkKeyStore(spark, spark, "ns", 0)
    assert store.cache.keys.blobs == {"a": stored(3), "b": stored(4)}


def test_after_a_compaction_every_cache_reads_the_same_keys():
    spark = FakeSpark()
    batch(spark, {f"k{i}": stored(i) for i in range(50)})
    old = copy.deepcopy(statestore._CACHES)
    n = 0
    while len(spark.chunks) > 1 or n < 10:  # small batches until a compaction folds the chunks
        batch(spark, {f"k{n % 50}": stored(1_000 + n), f"gone{n}": stored(n)} | {f"gone{n - 1}": None})
        n += 1
        assert n < 100_000
    statestore._CACHES.clear()
    statestore._CACHES.update(old)
    store = SparkKeyStore(spark, spark, "ns", 0)
    assert store.cache.keys.blobs == plain_state(spark)
    assert len(store.cache.keys.blobs) == 51


def test_state_written_by_the_first_head_format_loads_and_goes_on():
    """A root written before the head's size was bounded: a head listing every chunk with its token,
    chunks without a parent."""
    spark = FakeSpark()
    first = {"a": stored(1), "b": stored(2)}
    spark.chunks[7] = pickle.dumps(({k: tuple(v) for k, v in first.items()}, [("a", "r1", 5)]))
    spark.chunks[8] = pickle.dumps(({"b": None, "c": tuple(stored(3))}, []))
    spark.head = pickle.dumps(([(7, "t7"), (8, "t8")], 9, 200, 200, 0, 600_000))
    store = batch(spark, {"d": stored(4)})
    assert store.cache.keys.blobs == {"a": stored(1), "c": stored(3), "d": stored(4)}
    assert "r1" in store.seen_ids("a")
    assert plain_state(spark) == store.cache.keys.blobs


def committed_seen(spark: FakeSpark) -> set[tuple[str, str]]:
    """The dedup ids Spark holds, read by a worker with no cache."""
    saved = dict(statestore._CACHES)
    statestore._CACHES.clear()
    try:
        return {(key, rid) for key, rid, _ in SparkKeyStore(spark, spark, "ns", 0).cache.keys.dedup.entries()}
    finally:
        statestore._CACHES.clear()
        statestore._CACHES.update(saved)



def test_a_cache_reads_dedup_ids_as_expired_by_a_batch_another_worker_committed():
    """Another worker's batch changed no key but moved the watermark a horizon past an id: this
    worker must not go on discarding a record with that id when Spark's state no longer has it."""
    spark = FakeSpark()
    batch(spark, {"k": stored(1)}, seen=[("k", "r1", 100)], watermark=100)
    mine = copy.deepcopy(statestore._CACHES)
    statestore._CACHES.clear()
    batch(spark, {}, watermark=100 + HORIZON + 1)  # on another worker: r1 expires
    assert ("k", "r1") not in committed_seen(spark)
    statestore._CACHES.clear()
    statestore._CACHES.update(mine)
    assert "r1" not in SparkKeyStore(spark, spark, "ns", 0).seen_ids("k")


def test_an_expiry_spark_never_committed_is_done_again_and_committed():
    """A batch that only expires ids, lost after the worker ran it, runs again on the same worker:
    what Spark commits is what a run without the loss commits."""
    spark, reference = FakeSpark(), FakeSpark()
    batch(spark, {"k": stored(1)}, seen=[("k", "r1", 100)], watermark=100)
    batch(spark, {}, watermark=100 + HORIZON + 1, commit=False)
    batch(spark, {}, watermark=100 + HORIZON + 1)
    statestore._CACHES.clear()
    batch(reference, {"k": stored(1)}, seen=[("k", "r1", 100)], watermark=100)
    batch(reference, {}, watermark=100 + HORIZON + 1)
    assert committed_seen(spark) == committed_seen(reference) == set()
    lost, whole = Head.loads(spark.head), Head.loads(reference.head)
    assert lost.watermark == whole.watermark == 100 + HORIZON + 1
    assert (lost.first_id, lost.next_id, lost.live_bytes) == (whole.first_id, whole.next_id, whole.live_bytes)


def test_a_horizon_raised_on_a_restart_never_brings_back_ids_already_forgotten():
    """Ids stay in the chunks after they expire (expiry is a function of the watermark): a rebuild
    under a larger horizon must not find again what every cache had already forgotten."""
    spark = FakeSpark()
    store = SparkKeyStore(spark, spark, "ns", 0)
    store.save({"k": stored(1)}, {"k": {"r1": 100}}, 100, 1_000)
    spark.commit()
    store = SparkKeyStore(spark, spark, "ns", 0)
    store.save({"k": stored(2)}, {}, 2_000, 1_000)  # r1 expires: 100 < 2,000 - 1,000
    spark.commit()
    store = SparkKeyStore(spark, spark, "ns", 0)
    store.save({"k": stored(3)}, {}, 2_010, 10_000)  # restarted with a 10 s horizon
    spark.commit()
    assert "r1" not in store.seen_ids("k")
    assert ("k", "r1") not in committed_seen(spark)


def test_a_key_group_with_nothing_to_do_reads_no_chunk_while_the_watermark_moves():
    """Every batch steps every key group (the heartbeat): one that changes nothing and forgets no
    id must go on from its cache, not rebuild it from Spark's state."""
    spark = FakeSpark()
    batch(spark, {f"k{i}": stored(i) for i in range(20)}, seen=[("k1", "r1", 0)], watermark=0)
    for n in range(1, 6):
        batch(spark, {f"k{n}": stored(100 + n)}, watermark=n)
    spark.chunk_reads = 0
    for watermark in range(10, 200, 10):
        batch(spark, {}, watermark=watermark)
    assert spark.chunk_reads == 0
    assert "r1" in SparkKeyStore(spark, spark, "ns", 0).seen_ids("k1")


class _Handle:
    """What the operator asks of Spark's StatefulProcessorHandle at a task's start."""

    def getValueState(self, name, schema):
        return FakeSpark()

    def getMapState(self, name, key_schema, value_schema):
        return FakeSpark()


def test_a_stopped_query_s_caches_leave_a_worker_when_a_later_query_starts_there():
    """A driver that runs query after query must not leave its workers holding (and collecting)
    every stopped query's state: the next query's operator drops those caches at its task's start,
    but not those a query restarted on the same root has read since, nor any other namespace's."""
    from millstream import Computation, Pipeline, ScriptedInjector
    from millstream.core.plan import plan_computation
    from millstream.spark.operator import KeyGroupProcessor
    from millstream.spark.partitioning import GroupLabels

    class Noop(Computation):
        def process_record(self, ctx, record):
            pass

    pipeline = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
    pipeline.add_computation("c", Noop(), ["in"], [])
    saved_caches, saved_stopped = dict(statestore._CACHES), dict(statestore._STOPPED)
    statestore._CACHES.clear()
    statestore._STOPPED.clear()
    try:
        for namespace in ("old#c", "restarted#c", "running#c"):
            SparkKeyStore(FakeSpark(), FakeSpark(), namespace, 0)
        statestore.note_stopped(["old#c", "restarted#c"])
        time.sleep(0.01)
        SparkKeyStore(FakeSpark(), FakeSpark(), "restarted#c", 0)  # read again by its restarted query
        assert set(statestore.stopped_namespaces()) == {"old#c", "restarted#c"}

        processor = KeyGroupProcessor(plan_computation(pipeline, "c", key_groups=1), "/nowhere", "new#c",
                                      GroupLabels.identity(1), statestore.stopped_namespaces())
        processor.init(_Handle())
        assert sorted(statestore._CACHES) == [("restarted#c", 0), ("running#c", 0)]

        statestore.note_started(["old#c"])  # a query on that root again: later queries leave it be
        assert set(statestore.stopped_namespaces()) == {"restarted#c"}
    finally:
        statestore._CACHES.clear()
        statestore._CACHES.update(saved_caches)
        statestore._STOPPED.clear()
        statestore._STOPPED.update(saved_stopped)


def test_chunks_holding_ids_as_triples_still_load():
    """Chunks written before ids were kept per key hold them as a list of (key, id, mark): a worker
    rebuilding from such a root knows them, and expires them on their marks."""
    spark = FakeSpark()
    batch(spark, {"k": stored(1)}, seen=[("k", "r1", 100), ("j", "r2", 5_000)], watermark=100)
    keys, _, parent = pickle.loads(spark.chunks[0])
    spark.chunks[0] = pickle.dumps((keys, [("k", "r1", 100), ("j", "r2", 5_000)], parent))
    assert committed_seen(spark) == {("k", "r1"), ("j", "r2")}
    batch(spark, {}, watermark=101 + HORIZON)  # r1's horizon has passed, not r2's
    assert committed_seen(spark) == {("j", "r2")}


def test_a_compaction_keeps_every_dedup_id_split_over_base_chunks(monkeypatch):
    """A compaction rewrites the live ids into base chunks of at most CHUNK_BYTES' worth each: a
    worker with no cache reads back exactly the ids within the horizon."""
    monkeypatch.setattr(statestore, "CHUNK_BYTES", 10 * statestore._DEDUP_ENTRY_BYTES)  # 10 ids a chunk
    monkeypatch.setattr(statestore, "COMPACT_MIN_BYTES", 0)  # compact at twice the live state
    spark = FakeSpark()
    added: dict[tuple[str, str], int] = {}
    n = compactions = 0
    while compactions < 2:
        watermark = n * HORIZON // 8  # an id expires 8 batches after it came
        seen = [(f"k{(n + i) % 7}", f"r{n}-{i}", watermark) for i in range(5)]
        added.update(((key, rid), mark) for key, rid, mark in seen)
        before = Head.loads(spark.head).first_id if spark.head else 0
        batch(spark, {f"k{n % 7}": stored(n)}, seen=seen, watermark=watermark)
        compactions += Head.loads(spark.head).first_id != before
        n += 1
        assert n < 1_000
    live = {pair for pair, mark in added.items() if mark >= watermark - HORIZON}
    assert committed_seen(spark) == live
    # Right after the compaction every chunk is a base chunk; one ends with the key that fills it.
    sizes = [sum(map(len, seen.values())) for seen in (pickle.loads(b)[1] for b in spark.chunks.values()) if seen]
    most_of_a_key = max(Counter(key for key, _ in live).values())
    assert sum(sizes) == len(live) and len(sizes) > 1 and max(sizes) < 10 + most_of_a_key
