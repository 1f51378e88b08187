"""EventStore: the cache, the log with its log file map, and the two combined."""

from __future__ import annotations

import json
import os
import random
import sqlite3

import pytest

from millstream.photon import CachedEventStore, EventLogWriter, LogEventStore, TieredEventStore
from millstream.photon.eventstore import LOG_MAP_FILE
from photon_support import FakeClock

SOURCES = ["web-1:11", "web-2:22", "fe80::7:33"]  # a server name may contain colons (IPv6)
SPAN_MS, STEP_MS, DISORDER_MS = 60_000, 20, 200


def make_query_log(seed: int = 1) -> list[tuple[str, dict]]:
    """Queries of three server processes, in the order they reach the log: each is delayed by up to
    DISORDER_MS, so a source's events arrive at most that much out of timestamp order."""
    rng = random.Random(seed)
    arrivals = []
    for source in SOURCES:
        for ts in range(1_000_000, 1_000_000 + SPAN_MS, STEP_MS):
            query_id = f"{source}:{ts}:0"
            arrivals.append((ts + rng.randrange(DISORDER_MS + 1), query_id,
                             {"query": f"q{rng.randrange(10**6)}", "source": source}))
    arrivals.sort()
    return [(query_id, event) for _, query_id, event in arrivals]


def write_log(directory: str, events: list[tuple[str, dict]], **options) -> None:
    settings = {"map_every_ms": 500, "map_every_bytes": 8 * 1024, "max_file_bytes": 100 * 1024,
                "flush_every_events": 250, **options}
    with EventLogWriter(directory, **settings) as writer:
        for query_id, event in events:
            writer.append(query_id, event)


def log_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
               if name.endswith(".jsonl"))


def test_log_lookups_find_every_event_scanning_a_small_range(tmp_path):
    events = make_query_log()
    write_log(str(tmp_path), events)
    total = log_bytes(str(tmp_path))
    assert len([name for name in os.listdir(tmp_path) if name.endswith(".jsonl")]) > 5  # spans files
    store = LogEventStore(tmp_path, max_disorder_ms=DISORDER_MS)
    sample = random.Random(2).sample(events, 400)
    scanned = []
    for query_id, event in sample:
        before = store.stats().bytes_scanned
        assert store.lookup(query_id) == event
        scanned.append(store.stats().bytes_scanned - before)
    stats = store.stats()
    assert (stats.log_lookups, stats.log_hits) == (400, 400)
    # Two map entries about (2 W + 2 D) of event time apart bound each scan: about 3% of this log.
    assert sum(scanned) / len(scanned) < total / 15
    assert max(scanned) < total / 8


def test_absent_ids_and_unknown_sources(tmp_path):
    write_log(str(tmp_path), make_query_log())
    store = LogEventStore(tmp_path, max_disorder_ms=DISORDER_MS)
    assert store.lookup("web-1:11:1030000:1") is None  # known source, no such query
    before = store.stats().bytes_scanned
    assert store.lookup("web-9:99:1030000:0") is None  # no map entry: nothing is read
    assert store.lookup("not-a-photon-id") is None
    assert store.stats().bytes_scanned == before


def test_an_understated_disorder_bound_misses_events(tmp_path):
    """The scan range really is narrow: told the log is in order when it is not, the store misses some
    events that arrived late, which it would not if it read the whole log."""
    events = make_query_log()
    write_log(str(tmp_path), events)
    store = LogEventStore(tmp_path, max_disorder_ms=0)
    found = sum(store.lookup(query_id) == event for query_id, event in random.Random(3).sample(events, 400))
    assert 0 < found < 400


def test_the_map_has_an_entry_at_each_sources_first_event_in_each_file(tmp_path):
    events = make_query_log()
    write_log(str(tmp_path), events)
    with sqlite3.connect(tmp_path / LOG_MAP_FILE) as connection:
        entries = set(connection.execute("SELECT source, file_seq, offset FROM log_map"))
    expected_first = set()
    for name in sorted(n for n in os.listdir(tmp_path) if n.endswith(".jsonl")):
        seen, offset = set(), 0
        with open(tmp_path / name, "rb") as log:
            for line in log:
                source = json.loads(line)["id"].rsplit(":", 2)[0]
                if source not in seen:
                    seen.add(source)
                    expected_first.add((source, int(name[7:15]), offset))
                offset += len(line)
    assert expected_first <= entries
    # An entry every W = 500 ms of event time (a little more, since the event that crosses W may come
    # late), plus those forced by new files and by M = 8 KiB of log, and nowhere near one per event.
    files = len([n for n in os.listdir(tmp_path) if n.endswith(".jsonl")])
    for source in SOURCES:
        count = sum(1 for s, _, _ in entries if s == source)
        assert SPAN_MS // 1_000 <= count <= SPAN_MS // 500 + files + log_bytes(str(tmp_path)) // 8192
    assert len(entries) < len(events) / 10


def test_events_are_visible_once_flushed(tmp_path):
    writer = EventLogWriter(tmp_path, flush_every_events=10**9)
    store = LogEventStore(tmp_path)
    writer.append("web-1:11:5000:0", {"query": "shoes"})
    assert store.lookup("web-1:11:5000:0") is None
    writer.flush()
    assert store.lookup("web-1:11:5000:0") == {"query": "shoes"}
    writer.close()


def test_a_restarted_writer_starts_a_new_file_and_old_events_stay_findable(tmp_path):
    events = make_query_log()
    half = len(events) // 2
    write_log(str(tmp_path), events[:half], max_file_bytes=10**9)
    write_log(str(tmp_path), events[half:], max_file_bytes=10**9)
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".jsonl")) == [
        "events-00000001.jsonl", "events-00000002.jsonl"]
    store = LogEventStore(tmp_path, max_disorder_ms=DISORDER_MS)
    for query_id, event in random.Random(4).sample(events, 200):
        assert store.lookup(query_id) == event


def test_cache_evicts_by_size_and_age_like_a_plain_model():
    rng = random.Random(5)
    clock = FakeClock(0)
    cache = CachedEventStore(max_events=20, max_age_ms=300, clock=clock)
    model: dict[str, int] = {}  # id -> insertion time, in insertion order
    hits = misses = 0
    for step in range(3_000):
        clock.now_ms += rng.randrange(0, 8) if rng.random() < 0.97 else rng.randrange(100, 400)  # lulls
        query_id = f"q{rng.randrange(60)}"
        if rng.random() < 0.5:
            cache.put(query_id, {"n": step})
            model.pop(query_id, None)
            model[query_id] = clock.now_ms
        else:
            model = {i: t for i, t in model.items() if clock.now_ms - t <= 300}
            expected = query_id in model
            hits += expected
            misses += not expected
            assert (cache.lookup(query_id) is not None) == expected
        model = {i: t for i, t in model.items() if clock.now_ms - t <= 300}
        while len(model) > 20:
            del model[next(iter(model))]
    stats = cache.stats()
    assert (stats.cache_hits, stats.cache_misses) == (hits, misses)
    assert stats.evicted_by_size > 0 and stats.evicted_by_age > 0


def test_tiered_store_asks_the_cache_first_then_the_log(tmp_path):
    events = make_query_log()
    cache = CachedEventStore(max_events=100)
    write_log(str(tmp_path), events, cache=cache)  # the reader fills the cache as it writes the log
    store = TieredEventStore(cache, LogEventStore(tmp_path, max_disorder_ms=DISORDER_MS))
    recent_id, recent = events[-1]
    old_id, old = events[10]
    assert store.lookup(recent_id) == recent
    stats = store.stats()
    assert (stats.cache_hits, stats.log_lookups, stats.bytes_scanned) == (1, 0, 0)
    assert store.lookup(old_id) == old
    stats = store.stats()
    assert (stats.cache_hits, stats.cache_misses, stats.log_lookups, stats.log_hits) == (1, 1, 1, 1)
    assert stats.bytes_scanned > 0
    assert store.lookup(old_id) == old  # found in the log, so now cached
    assert (store.stats().cache_hits, store.stats().log_lookups) == (2, 1)


@pytest.mark.parametrize("bad", [{"max_events": 0}, {"max_age_ms": -1}])
def test_cache_rejects_nonsense_limits(bad):
    with pytest.raises(ValueError):
        CachedEventStore(**bad)
