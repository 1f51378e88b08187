"""The dispatcher, joiner and EventReader as millstream computations, on the in-process harness.

One pipeline: clicks joined once whatever their duplicates, queries arriving after their clicks (retries
with backoff on wall-time timers), queries that never arrive (unjoinable, with the reason), a joiner
that is full. Registry answers the dispatcher must get right: a re-run of a micro-batch Spark never
committed (same tokens; or another path, reclaimed), and expired clicks after GC.
"""

from __future__ import annotations

import os

from millstream.photon import EventReader, RetryPolicy, open_registry, primary_key
from millstream.photon.eventstore import LogEventStore
from millstream.photon.faults import PhotonFaults
from millstream.photon.registry import ForwardingRegistry, RegistryError
from millstream import Record
from millstream.photon.joiner import dispatch_token
from photon_pipelines import T0, HarnessPhoton, click, query


def registry_url(tmp_path) -> str:
    return "sqlite:///" + os.path.join(str(tmp_path), "ids.db")


def test_each_click_is_joined_once_and_a_click_whose_query_never_comes_is_unjoinable(tmp_path):
    retry = RetryPolicy(first_retry_ms=500, max_retry_ms=4_000, unjoinable_after_ms=20_000)
    photon = HarnessPhoton(str(tmp_path), "photon-a", registry_url(tmp_path), retry=retry)
    q1, q2, late = query(1, T0 - 3_000), query(2, T0 - 2_000), query(3, T0 - 1_000)
    photon.feed("queries", [q1, q2])
    clicks = [click("c-1", q1, T0), click("c-2", q2, T0 + 10), click("c-1", q1, T0 + 20, record_id="rec-c-1-again"),
              click("c-3", late, T0 + 30), click("c-4", "web-1:7:1699999990000:99", T0 + 40)]
    photon.feed("clicks", clicks)
    assert sorted(photon.joined()) == ["c-1", "c-2"]
    waiting = photon.pending()
    assert sorted(waiting) == ["c-3", "c-4"] and all(e["reason"] == "not_found" for e in waiting.values())

    # Retries follow the backoff: each waiting click is retried no earlier than its delay says.
    first_try = {c: e["next_try"] for c, e in waiting.items()}
    assert all(T0 + 500 <= t <= T0 + 625 for t in first_try.values()), first_try
    photon.at(T0 + 400)
    assert photon.stats().dispatched == 4  # nothing retried before its time
    photon.at(T0 + 700)
    assert photon.stats().dispatched == 6 and photon.pending()["c-3"]["attempts"] == 2

    photon.feed("queries", [late])  # the query reaches its log after its click
    photon.at(T0 + 2_000)
    assert sorted(photon.joined()) == ["c-1", "c-2", "c-3"]
    for moment in range(T0 + 2_000, T0 + 26_000, 1_000):  # c-4's query never comes
        photon.at(moment)
    assert photon.unjoinable() == {"c-4": "not_found"}
    assert not photon.pending() and photon.harness.pending_wall_timers("dispatcher") is None
    stats = photon.stats()
    assert (stats.clicks, stats.duplicates, stats.joined, stats.unjoinable) == (5, 1, 3, 1)


def test_retries_back_off_exponentially_up_to_the_cap(tmp_path):
    retry = RetryPolicy(first_retry_ms=200, max_retry_ms=1_600, unjoinable_after_ms=60_000)
    photon = HarnessPhoton(str(tmp_path), "photon-a", registry_url(tmp_path), retry=retry)
    photon.feed("clicks", [click("c-1", "web-1:7:1699999999000:0", T0)])
    tries = []
    now = T0
    while now < T0 + 12_000:
        entry = photon.pending()["c-1"]
        tries.append((entry["attempts"], entry["next_try"] - now))
        now = entry["next_try"]
        photon.at(now)
    waits = [wait for _, wait in tries]
    bases = [min(1_600, 200 * 2 ** (attempts - 1)) for attempts, _ in tries]
    assert [attempts for attempts, _ in tries] == list(range(1, len(tries) + 1))
    assert all(base <= wait <= base * 1.25 for base, wait in zip(bases, waits)), list(zip(bases, waits))
    assert waits[-1] >= 1_600 and waits[0] < 260


def test_a_full_joiner_answers_overloaded_and_the_clicks_are_retried(tmp_path):
    photon = HarnessPhoton(str(tmp_path), "photon-a", registry_url(tmp_path), max_outstanding=2, shards=1)
    queries = [query(n, T0 - 1_000 + n) for n in range(5)]
    photon.feed("queries", queries)
    photon.feed("clicks", [click(f"c-{n}", q, T0 + n) for n, q in enumerate(queries)])
    assert len(photon.joined()) == 2 and photon.stats().overloaded == 3
    assert {e["reason"] for e in photon.pending().values()} == {"overloaded"}
    photon.at(T0 + 1_000)
    photon.at(T0 + 3_000)
    assert sorted(photon.joined()) == [f"c-{n}" for n in range(5)]


def test_a_micro_batch_run_again_after_a_crash_produces_its_joins_with_the_same_tokens(tmp_path):
    url = registry_url(tmp_path)
    q = query(1, T0 - 1_000)
    photon = HarnessPhoton(str(tmp_path), "photon-a", url)
    photon.feed("queries", [q])
    photon.feed("clicks", [click("c-1", q, T0)])
    assert photon.joined() == ["c-1"]
    # Spark never committed that batch: nothing of it was published. The re-run starts over.
    photon.restart()
    photon.feed("queries", [q])
    photon.feed("clicks", [click("c-1", q, T0)])
    assert photon.joined() == ["c-1"] and photon.stats().reclaimed == 0  # same token: COMMITTED again
    with open_registry(url) as registry:
        assert registry.lookup({"c-1": T0})["c-1"].token == dispatch_token("photon-a", "rec-c-1", 1)


def test_a_rerun_that_takes_another_path_reclaims_its_own_registration_and_a_duplicate_record_does_not(tmp_path):
    url = registry_url(tmp_path)
    q = query(1, T0 - 1_000)
    first = HarnessPhoton(str(tmp_path), "photon-a", url)
    first.feed("clicks", [click("c-1", q, T0)])  # query not there yet: attempt 1 fails
    first.feed("queries", [q])
    first.at(T0 + 1_000)  # attempt 2 registers c-1 ... and the batch is lost before Spark commits it
    assert first.joined() == ["c-1"]
    rerun = first.restart()
    rerun.feed("queries", [q])
    rerun.feed("clicks", [click("c-1", q, T0)])  # this time attempt 1 finds the query: another token
    assert rerun.joined() == ["c-1"] and rerun.stats().reclaimed == 1
    rerun.feed("clicks", [click("c-1", q, T0 + 5, record_id="rec-c-1-duplicate")])
    assert rerun.joined() == ["c-1"] and rerun.stats().skipped == 1


def test_a_click_behind_the_gc_boundary_is_skipped_as_expired_never_joined_again(tmp_path):
    url = registry_url(tmp_path)
    old, recent = query(1, T0 - 60_000), query(2, T0 - 1_000)
    photon = HarnessPhoton(str(tmp_path), "photon-a", url)
    photon.feed("queries", [old, recent])
    photon.feed("clicks", [click("c-old", old, T0 - 59_000), click("c-new", recent, T0)])
    assert sorted(photon.joined()) == ["c-new", "c-old"]
    with open_registry(url) as registry:
        result = registry.gc(T0 - 30_000)
        assert result.deleted == 1  # c-old's row is gone: only the boundary remembers it
    photon.feed("clicks", [click("c-old", old, T0 - 59_000, record_id="rec-c-old-replayed")])
    assert sorted(photon.joined()) == ["c-new", "c-old"]
    assert photon.unjoinable() == {"c-old": "expired"} and photon.stats().expired == 1


def test_a_pair_the_adapter_filters_out_is_not_registered(tmp_path):
    from millstream.photon import JoinAdapter

    class NoSpam(JoinAdapter):
        def filter(self, query, click):
            return not click.get("spam")

    url = registry_url(tmp_path)
    photon = HarnessPhoton(str(tmp_path), "photon-a", url)
    from millstream.photon import build_photon_pipeline
    from millstream.testing import PipelineHarness

    photon.harness = PipelineHarness(build_photon_pipeline(photon.spec, adapter=NoSpam(), sinks=False), wall_time=T0)
    q = query(1, T0 - 1_000)
    photon.feed("queries", [q])
    spam = click("c-spam", q, T0)
    spam.value["spam"] = True
    photon.feed("clicks", [spam, click("c-ok", q, T0)])
    assert photon.joined() == ["c-ok"] and photon.stats().filtered == 1
    with open_registry(url) as registry:
        assert not registry.lookup({"c-spam": T0})["c-spam"].registered


def test_event_readers_taking_turns_in_two_processes_keep_the_log_findable(tmp_path):
    from millstream import Pipeline, ScriptedInjector
    from millstream.testing import PipelineHarness

    directory = str(tmp_path / "events")

    def reader() -> PipelineHarness:  # each harness plays one Spark worker process holding a writer
        return PipelineHarness(Pipeline("reader").add_injector("q", ScriptedInjector("q", []), "q")
                               .add_computation("event_reader", EventReader(directory), {"q": primary_key}),
                               wall_time=T0)

    workers = [reader(), reader()]
    queries = [query(n, T0 + 10 * n, server=f"web-{n % 3}") for n in range(300)]
    for step, start in enumerate(range(0, 300, 30)):
        worker = workers[step % 2 if step < 6 else 0]  # alternate, then stay
        worker.advance_wall_time(T0 + 1_000 * (step + 1))
        worker.feed("q", queries[start:start + 30])
        worker.run()
    store = LogEventStore(directory)
    assert all(store.lookup(q.key) == q.value for q in queries)
    assert store.stats().bytes_scanned < 300 * 300 * 60 / 4  # bounded scans, not the whole log each time



class _Outage(ForwardingRegistry):
    """A registry that is down (every lookup and commit fails) while `failures_left` > 0: each failed
    commit counts one down; the server is back after the last."""

    failures_left = 0

    def __init__(self, backend) -> None:
        self.backend = backend

    def lookup(self, ids):
        if _Outage.failures_left > 0:
            raise RegistryError("registry down")
        return self.backend.lookup(ids)

    def commit_each(self, claims):
        if _Outage.failures_left > 0:
            _Outage.failures_left -= 1
            raise RegistryError("registry down")
        return self.backend.commit_each(claims)


class _OutageFaults(PhotonFaults):
    def wrap(self, registry):
        return _Outage(registry)


def test_a_click_whose_query_was_found_is_joined_after_an_outage_longer_than_the_deadline(tmp_path):
    """The registry is down past the clicks' deadline and comes back during a join commit's retries:
    the join commits then, or later; the click is never given up as unjoinable while its query is
    there (giving up is a registry commit too, which could just as well have registered the join)."""
    retry = RetryPolicy(first_retry_ms=500, max_retry_ms=2_000, unjoinable_after_ms=5_000)
    photon = HarnessPhoton(str(tmp_path), "photon-a", registry_url(tmp_path), retry=retry, shards=1,
                           faults=_OutageFaults())
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(10)]
    photon.feed("queries", queries)
    _Outage.failures_left = 10 ** 9
    photon.feed("clicks", [click(f"c-{n}", queries[n], T0 + n) for n in range(10)])
    for moment in range(T0 + 500, T0 + 6_000, 500):  # past the deadline, still down
        photon.at(moment)
    assert not photon.joined() and not photon.unjoinable() and len(photon.pending()) == 10
    _Outage.failures_left = 4  # back during the next step's join commit, after its first tries
    for moment in range(T0 + 6_500, T0 + 15_000, 500):
        photon.at(moment)
    assert sorted(photon.joined()) == sorted(f"c-{n}" for n in range(10)) and photon.unjoinable() == {}
    assert not photon.pending()


def test_a_click_the_adapter_cannot_read_is_reported_unjoinable_once_and_the_others_join(tmp_path):
    """A click record without the adapter's query-id field stopped the dispatcher, on every restart
    and in every redundant pipeline (they read the same log): it is decided unjoinable instead, once
    across pipelines, with the adapter's error as its reason."""
    url = registry_url(tmp_path)
    a = HarnessPhoton(str(tmp_path / "a"), "photon-a", url, shards=1)
    b = HarnessPhoton(str(tmp_path / "b"), "photon-b", url, shards=1)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(5)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(5)]
    clicks.insert(2, Record("c-bad", {"ad": "ad-x"}, T0, "rec-bad"))  # no "query_id"
    for photon in (a, b):
        photon.feed("queries", queries)
        photon.feed("clicks", clicks)
    assert sorted([*a.joined(), *b.joined()]) == [f"c-{n}" for n in range(5)]
    reasons = [*a.unjoinable().items(), *b.unjoinable().items()]
    assert len(reasons) == 1 and reasons[0][0] == "c-bad" and reasons[0][1].startswith("malformed: KeyError")


def test_a_registry_down_when_a_worker_sets_the_dispatcher_up_is_waited_for(tmp_path, monkeypatch):
    """The registry unreachable when a worker set the dispatcher up (setup() opened it) failed the
    set-up, and with it the step (on Spark, the query): an outage at the wrong moment stopped the
    pipeline, where one during a step only delays clicks. Now the registry is opened on first use, and
    again at each use while it fails; its clicks wait as in any outage and join once it is back."""
    from millstream.photon.dispatcher import RegistrySpec
    from millstream.photon.pipeline import build_photon_pipeline
    from millstream.testing import PipelineHarness

    real_open = RegistrySpec.open
    down = {"now": False}

    def open_unless_down(spec):
        if down["now"]:
            raise RegistryError("connection refused (the test's outage)")
        return real_open(spec)

    monkeypatch.setattr(RegistrySpec, "open", open_unless_down)
    photon = HarnessPhoton(str(tmp_path), "photon-a", registry_url(tmp_path), shards=1)  # the driver's checks pass
    down["now"] = True
    photon.harness = PipelineHarness(build_photon_pipeline(photon.spec, sinks=False), wall_time=T0)  # a worker's set-up
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(5)]
    photon.feed("queries", queries)
    photon.feed("clicks", [click(f"c-{n}", queries[n], T0 + n) for n in range(5)])
    photon.at(T0 + 1_000)
    assert not photon.joined() and len(photon.pending()) == 5
    assert all(entry["reason"] == "registry_unavailable" for entry in photon.pending().values())
    down["now"] = False
    for moment in range(T0 + 1_500, T0 + 12_000, 500):
        photon.at(moment)
    assert sorted(photon.joined()) == [f"c-{n}" for n in range(5)] and not photon.pending()
