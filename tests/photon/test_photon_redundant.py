"""Redundant Photon pipelines sharing one IdRegistry, on the in-process harness, on SQLite and on
PostgreSQL (`registry_target`): exactly one joined event per click across pipelines, the lost reply
answered by a retry with the same token, a pipeline that dies between its registry commit and its
write repaired by the verifier, one unjoinable report per click, and resharding between steps.

The Spark end-to-end versions (separate driver processes, SIGKILL) are in tests/spark/test_photon_spark.py.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from millstream.photon import OwnerRetired, PhotonFaults, PipelineLayout, RetryPolicy, Verifier
from millstream.photon.faults import read_fault_records
from millstream.photon.joiner import dispatch_token
from millstream.photon.liveness import check_not_retired
from millstream.photon.outputs import read_sink
from photon_pipelines import T0, HarnessPhoton, click, query, write_click_log
from photon_support import expected_shard


def union_of_joined(*pipelines: HarnessPhoton) -> Counter[str]:
    return Counter(r.key for p in pipelines for r in read_sink(p.layout.joined_dir))


def test_two_pipelines_join_every_click_once_between_them(tmp_path, registry_target):
    base = str(tmp_path)
    a = HarnessPhoton(base, "photon-a", registry_target.url, registry_target.options)
    b = HarnessPhoton(base, "photon-b", registry_target.url, registry_target.options)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(40)]
    clicks = [click(f"c-{n}", queries[n % 40], T0 + n) for n in range(60)]
    for pipeline in (a, b):
        pipeline.feed("queries", queries)
    for start in range(0, 60, 10):  # the two take turns, each on the same clicks
        a.feed("clicks", clicks[start:start + 10])
        b.feed("clicks", clicks[start + 5:start + 10] + clicks[start:start + 5])
    joined = union_of_joined(a, b)
    assert joined == Counter({f"c-{n}": 1 for n in range(60)})
    assert a.stats().joined + b.stats().joined == 60
    assert b.stats().skipped == 60 - b.stats().joined  # the lookup before dispatch saved B those joins


def test_a_lost_commit_reply_is_retried_with_the_same_token_and_nothing_is_lost(tmp_path, registry_target):
    base = str(tmp_path)
    record = str(tmp_path / "faults.jsonl")
    a = HarnessPhoton(base, "photon-a", registry_target.url, registry_target.options,
                      faults=PhotonFaults(lose_reply_every=2, record_to=record))
    b = HarnessPhoton(base, "photon-b", registry_target.url, registry_target.options)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(20)]
    a.feed("queries", queries)
    b.feed("queries", queries)
    for n in range(20):  # one click per step: every second commit of A loses its reply
        a.feed("clicks", [click(f"c-{n}", queries[n], T0 + n)])
        b.feed("clicks", [click(f"c-{n}", queries[n], T0 + n)])
    lost = read_fault_records(record)
    assert len(lost) >= 5 and all(entry["fault"] == "lose_reply" for entry in lost)
    lost_ids = {click_id for entry in lost for click_id in entry["committed"]}
    assert lost_ids and lost_ids <= set(a.joined())  # A joined the clicks whose reply it lost
    assert union_of_joined(a, b) == Counter({f"c-{n}": 1 for n in range(20)})
    assert a.stats().commit_retries == len(lost) and a.stats().wasted == 0
    with registry_target.open() as registry:  # each registered with A's first token, retried as is
        found = registry.lookup({c: T0 for c in lost_ids})
        assert all(found[c].token == dispatch_token("photon-a", f"rec-{c}", 1) for c in lost_ids)


def test_a_pipeline_dead_between_commit_and_write_is_repaired_by_the_verifier(tmp_path, registry_target):
    base = str(tmp_path)
    record = str(tmp_path / "faults.jsonl")
    a = HarnessPhoton(base, "photon-a", registry_target.url, registry_target.options,
                      faults=PhotonFaults(die_after_commit=2, record_to=record), shards=1)  # a commit per feed
    b = HarnessPhoton(base, "photon-b", registry_target.url, registry_target.options)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(12)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(12)]
    log = write_click_log(base, clicks)
    a.feed("queries", queries)
    b.feed("queries", queries)
    a.feed("clicks", clicks[:4])  # commit 1: written
    with pytest.raises(Exception, match="died after registering"):
        a.feed("clicks", clicks[4:8])  # commit 2 goes through, then A dies before writing anything
    orphans = set(read_fault_records(record)[0]["committed"])
    assert orphans == {f"c-{n}" for n in range(4, 8)}
    b.feed("clicks", clicks)  # B skips what A registered
    assert not orphans & set(b.joined())

    with registry_target.open() as registry:
        registry.heartbeat("photon-a")
        verifier = Verifier(registry, log, [a.layout, b.layout], os.path.join(base, "logs", "reinjected"),
                            owner_timeout_ms=60_000)
        alive = verifier.run()  # A's heartbeat is fresh: it may still write; nothing is touched
        assert sorted(alive.waiting_for_owner) == sorted(orphans) and not alive.repaired
        verifier.owner_timeout_ms = 0  # ... and now it has been silent longer than the timeout
        repair = verifier.run()
        assert sorted(repair.repaired) == sorted(orphans) and repair.retired_owners == ["photon-a"]
        assert repair.consistent and not repair.settled
        b.pull_reinjected()
        final = verifier.run()
        assert final.settled, final
        with pytest.raises(OwnerRetired):
            check_not_retired(registry, "photon-a")
    assert union_of_joined(a, b) == Counter({c.key: 1 for c in clicks})


def test_one_pipeline_reports_a_click_unjoinable_the_other_counts_it_decided(tmp_path, registry_target):
    base = str(tmp_path)
    retry = RetryPolicy(first_retry_ms=500, max_retry_ms=2_000, unjoinable_after_ms=5_000)
    a = HarnessPhoton(base, "photon-a", registry_target.url, registry_target.options, retry=retry)
    b = HarnessPhoton(base, "photon-b", registry_target.url, registry_target.options, retry=retry)
    orphan = click("c-lost", "web-1:7:1699999999000:0", T0)
    a.feed("clicks", [orphan])
    b.feed("clicks", [orphan])
    for moment in range(T0 + 500, T0 + 10_000, 500):
        a.at(moment)
        b.at(moment)
    reports = {**{k: ("a", v) for k, v in a.unjoinable().items()}, **{k: ("b", v) for k, v in b.unjoinable().items()}}
    assert list(reports) == ["c-lost"] and reports["c-lost"][1] == "not_found"
    assert len(a.unjoinable()) + len(b.unjoinable()) == 1
    assert a.stats().decided_elsewhere + b.stats().decided_elsewhere + a.stats().skipped + b.stats().skipped == 1
    assert not a.pending() and not b.pending()


def test_resharding_between_steps_of_two_live_pipelines_joins_no_click_twice(tmp_path, registry_target):
    import time

    base = str(tmp_path)
    now = time.time_ns() // 1_000_000
    a = HarnessPhoton(base, "photon-a", registry_target.url, registry_target.options, wall_time=now)
    b = HarnessPhoton(base, "photon-b", registry_target.url, registry_target.options, wall_time=now)
    queries = [query(n, now - 10_000 + n) for n in range(90)]
    a.feed("queries", queries)
    b.feed("queries", queries)
    shard_counts = iter([7, 3, 5])
    for step in range(9):
        # Clicks stamped at the wall clock, as a live log's are; each pipeline gets them in turn.
        stamp = time.time_ns() // 1_000_000
        batch = [click(f"c-{10 * step + n}", queries[10 * step + n], stamp + n) for n in range(10)]
        (a if step % 2 else b).feed("clicks", batch)
        (b if step % 2 else a).feed("clicks", batch[::-1])
        if step % 3 == 1:
            with registry_target.open() as registry:
                registry.reshard(next(shard_counts), safety_margin_ms=50)
            time.sleep(0.06)  # the next clicks are stamped after the new entry's start
    assert union_of_joined(a, b) == Counter({f"c-{n}": 1 for n in range(90)})
    with registry_target.open() as registry:
        config = registry.sharding()
        entries = [(e.effective_from_ms, e.shard_count) for e in config.entries]
    assert [count for _, count in entries][1:] == [7, 3, 5]
    rows = registry_target.rows_per_shard()
    placed = {click_id: (shard, event_time) for shard, ids in rows.items() for click_id, (_, event_time) in ids.items()}
    assert len(placed) == 90
    used = Counter(shard for shard, _ in placed.values())
    assert all(shard == expected_shard(click_id, entries, event_time) for click_id, (shard, event_time) in placed.items())
    assert len(used) > 3  # ids routed by more than the first configuration


def test_verifier_reads_both_pipelines_outputs_and_finds_a_click_joined_twice(tmp_path):
    """The negative control of the redundancy tests: a click written by both pipelines is reported."""
    base = str(tmp_path)
    url = "sqlite:///" + os.path.join(base, "ids.db")
    clicks = [click("c-1", "web-1:7:1699999999000:0", T0)]
    log = write_click_log(base, clicks)
    for owner in ("photon-a", "photon-b"):
        layout = PipelineLayout(os.path.join(base, owner))
        os.makedirs(layout.joined_dir)
        with open(os.path.join(layout.joined_dir, "dispatcher-000000000001-0.jsonl"), "w") as out:
            out.write('{"key": "c-1", "value": {}, "timestamp": 0, "id": "x"}\n')
    from millstream.photon import open_registry

    with open_registry(url) as registry:
        report = Verifier(registry, log, [PipelineLayout(os.path.join(base, o)) for o in ("photon-a", "photon-b")],
                          os.path.join(base, "reinjected")).run()
    assert report.duplicated == ["c-1"] and not report.consistent


def test_the_armed_death_waits_for_a_commit_that_registers_something(tmp_path):
    """The fault the command uses to kill a pipeline (die_when): nothing before the file appears, no
    death at a commit that registered nothing (there would be nothing to repair), then death right
    after the first commit that registered ids, which stay registered to the dead pipeline's token."""
    from millstream.photon import Claim, Token, open_registry
    from millstream.photon.faults import FaultyRegistry, PipelineDied

    switch, record = str(tmp_path / "kill-switch"), str(tmp_path / "faults.jsonl")
    mine, theirs = Token("photon-a", "1/r"), Token("photon-b", "1/r")
    with open_registry("sqlite:///" + str(tmp_path / "ids.db")) as backend:
        faulty = FaultyRegistry(backend, PhotonFaults(die_when=switch, record_to=record))
        assert faulty.commit_each([Claim("c-1", mine, T0)])[0].committed  # not armed yet
        open(switch, "w").close()
        backend.commit_each([Claim("c-2", theirs, T0)])
        assert not faulty.commit_each([Claim("c-2", mine, T0)])[0].committed  # armed, but nothing registered
        with pytest.raises(PipelineDied):
            faulty.commit_each([Claim("c-2", mine, T0), Claim("c-3", mine, T0)])
        assert backend.lookup({"c-3": T0})["c-3"].token == mine
    deaths = read_fault_records(record)
    assert [d["fault"] for d in deaths] == ["die_after_commit"] and deaths[0]["committed"] == ["c-3"]
