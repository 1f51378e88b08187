"""Fault and race tests with several client PROCESSES on one registry, on both backends."""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

from millstream.photon import Token
from photon_support import commit_in_real_time, expected_shard, race_on_ids

# Workers inherit no connection from this process: a fork server, started once as a fresh interpreter
# that imports the registry modules once, forks each worker (spawning a fresh interpreter per worker
# costs its imports again, ~0.7 s of CPU each).
SPAWN = multiprocessing.get_context("forkserver")
SPAWN.set_forkserver_preload(["millstream.photon", "photon_support"])


def run_workers(processes: list[Any], results: Any) -> dict[str, dict[str, tuple[str, Any]]]:
    for process in processes:
        process.start()
    try:
        collected = dict(results.get(timeout=90) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=30)
    assert [process.exitcode for process in processes] == [0] * len(processes)
    return collected


def assert_each_id_committed_exactly_once(outcomes: dict[str, dict[str, tuple[str, Any]]],
                                          ids: list[str]) -> dict[str, str]:
    """Every id: one worker told COMMITTED, every other told ALREADY_JOINED naming that worker.
    Returns id -> winning owner."""
    winners = {}
    for click_id in ids:
        committed = [owner for owner, seen in outcomes.items() if seen[click_id][0] == "committed"]
        assert len(committed) == 1, (click_id, {owner: seen[click_id] for owner, seen in outcomes.items()})
        winner = committed[0]
        winners[click_id] = winner
        for owner, seen in outcomes.items():
            assert seen[click_id] == (("committed" if owner == winner else "already_joined"),
                                      (winner, "attempt-1"))
    return winners


def test_processes_racing_on_the_same_ids_commit_each_id_once(registry_target):
    rng = random.Random(11)
    ids = {f"click-{n}": 1_000_000 + rng.randrange(10_000) for n in range(400)}
    owners = [f"joiner-{k}" for k in range(4)]
    registry_target.open(initial_shards=3).close()  # create the registry before the race
    barrier, results = SPAWN.Barrier(len(owners)), SPAWN.Queue()
    # Workers 0 and 1 claim in the very same order (simultaneous conflicts on each id), 2 and 3 in
    # other orders starting elsewhere (so more than one worker wins ids, however they are scheduled).
    plans = [(0, 0.0), (0, 0.0), (1, 0.33), (2, 0.66)]
    outcomes = run_workers([SPAWN.Process(target=race_on_ids,
                                          args=(registry_target, owner, ids, seed, rotation, barrier, results))
                            for owner, (seed, rotation) in zip(owners, plans)], results)

    winners = assert_each_id_committed_exactly_once(outcomes, list(ids))
    assert len(set(winners.values())) > 1, "the workers did not actually race"
    with registry_target.open() as registry:
        found = registry.lookup(ids)
    assert {i: found[i].token for i in ids} == {i: Token(w, "attempt-1") for i, w in winners.items()}
    stored = [row for rows in registry_target.rows_per_shard().values() for row in rows.items()]
    assert len(stored) == len(ids)
    assert {i: token for i, (token, _) in stored} == {i: Token(w, "attempt-1").encode() for i, w in winners.items()}


def test_resharding_while_processes_commit_never_commits_an_id_twice(registry_target):
    """Three pipelines read the same live click log: A on time, B 40 ms behind (three threads through
    one BatchingRegistry), C 900 ms behind, so C re-claims ids committed before one or two reshards
    and must find them in the shard their event time routed them to. Meanwhile the registry is
    resharded 2 -> 5 -> 3 -> 7 shards."""
    offsets = [(f"click-{n}", n * 7) for n in range(450)]  # event times spread over 3.15 s
    registry_target.open(initial_shards=2).close()
    workers = [("pipeline-a", 0, 1), ("pipeline-b", 40, 3), ("pipeline-c", 900, 1)]
    ready, start, t0, results = SPAWN.Barrier(len(workers) + 1), SPAWN.Event(), SPAWN.Value("q", 0), SPAWN.Queue()
    processes = [SPAWN.Process(target=commit_in_real_time,
                               args=(registry_target, owner, offsets, lag, threads, ready, start, t0, results))
                 for owner, lag, threads in workers]
    for process in processes:
        process.start()
    ready.wait(timeout=60)
    t0.value = time.time_ns() // 1_000_000 + 100
    start.set()
    entries = []
    with registry_target.open() as registry:
        # The last entry starts ~1 s before the stream ends: room for a late reshard on a busy machine.
        for at_ms, shard_count in [(500, 5), (1_200, 3), (1_800, 7)]:
            time.sleep(max(0.0, (t0.value + at_ms) / 1000 - time.time()))
            entry = registry.reshard(shard_count, safety_margin_ms=300)
            entries.append(entry)
        config = [(e.effective_from_ms, e.shard_count) for e in registry.sharding().entries]
    try:
        outcomes = dict(results.get(timeout=90) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=30)
    assert [process.exitcode for process in processes] == [0] * len(processes)

    ids = dict((click_id, t0.value + offset) for click_id, offset in offsets)
    assert_each_id_committed_exactly_once(outcomes, list(ids))
    assert all(status == "already_joined" for status, _ in outcomes["pipeline-c"].values())
    # The reshards fell inside the stream, so ids were routed by all four entries ...
    assert all(t0.value < entry.effective_from_ms < max(ids.values()) for entry in entries)
    used = {[start for start, _ in config if start <= t][-1] for t in ids.values()}
    assert len(used) == 4
    # ... and each id is stored once, in the shard the entry in force at its event time gives it.
    rows = registry_target.rows_per_shard()
    where = [(click_id, shard) for shard, stored in rows.items() for click_id in stored]
    assert len(where) == len(ids)
    assert all(shard == expected_shard(click_id, config, ids[click_id]) for click_id, shard in where)
    assert any(shard >= 5 for _, shard in where)  # shards only the 7-shard entry uses
