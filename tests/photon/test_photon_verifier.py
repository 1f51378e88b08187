"""The verifier and liveness where they went wrong: a skewed clock taken for a dead
owner, a retired pipeline that kept committing, a click reported unjoinable twice, registry failures
during verification, and clicks the adapter filters out. Harness-level (see photon_pipelines.py)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any, Mapping

import pytest

from millstream.photon import JoinAdapter, PipelineLayout, Verifier, open_registry
from millstream.photon.driver import stopped_by_retirement
from millstream.photon.liveness import is_gone, retire_owner
from millstream.photon.outputs import read_sink
from millstream.photon.pipeline import build_photon_pipeline
from millstream.photon.registry import DeleteStatus, ForwardingRegistry, RegistryError, Token
from millstream.photon.verifier import wait_until_settled
from millstream.testing import PipelineHarness
from photon_pipelines import T0, HarnessPhoton, click, query, write_click_log


def joined_counts(*pipelines: HarnessPhoton) -> Counter[str]:
    return Counter(r.key for p in pipelines for r in read_sink(p.layout.joined_dir))


# ---- liveness on the registry's clock, and retired owners fenced ---- ------------------------------

def test_a_verifier_whose_clock_runs_ahead_retires_no_live_owner(tmp_path):
    base = str(tmp_path)
    url = "sqlite:///" + os.path.join(base, "ids.db")
    a = HarnessPhoton(base, "photon-a", url, shards=1)
    b = HarnessPhoton(base, "photon-b", url, shards=1)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(20)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(20)]
    log = write_click_log(base, clicks)
    a.feed("queries", queries)
    b.feed("queries", queries)
    a.feed("clicks", clicks[:10])
    a.harness.feed("clicks", clicks[10:])
    a.harness.run()  # registered, not yet published: a Spark micro-batch still running
    with open_registry(url) as registry:
        registry.heartbeat("photon-a")
        registry.heartbeat("photon-b")
        skewed = Verifier(registry, log, [a.layout, b.layout], os.path.join(base, "logs", "reinjected"),
                          owner_timeout_ms=15_000, clock=lambda: time.time_ns() // 1_000_000 + 16_000)
        report = skewed.run()
        assert report.retired_owners == [] and report.repaired == []
        assert sorted(report.waiting_for_owner) == sorted(c.key for c in clicks[10:])
    a.write_outputs()  # the micro-batch commits
    b.feed("clicks", clicks)
    b.pull_reinjected()
    assert joined_counts(a, b) == Counter({c.key: 1 for c in clicks})


def test_heartbeats_are_stamped_with_the_registry_clock_not_the_clients(registry_target, monkeypatch):
    real_time_ns = time.time_ns
    with registry_target.open() as registry:
        # This client's clock is a minute behind: its heartbeat must not look a minute old.
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - 60_000 * 1_000_000)
        registry.heartbeat("photon-a")
        monkeypatch.setattr(time, "time_ns", real_time_ns)
        true_now = real_time_ns() // 1_000_000
        last_seen = registry.owner_last_seen("photon-a")
        assert last_seen is not None and abs(true_now - last_seen) < 5_000
        assert abs(registry.now_ms() - true_now) < 5_000
        assert not is_gone(registry, "photon-a", timeout_ms=15_000)


def test_a_retired_pipeline_that_is_still_running_commits_nothing_and_stops(tmp_path, registry_target):
    base = str(tmp_path)
    a = HarnessPhoton(base, "photon-a", registry_target.url, registry_target.options, shards=1)
    b = HarnessPhoton(base, "photon-b", registry_target.url, registry_target.options, shards=1)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(10)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(10)]
    a.feed("queries", queries)
    b.feed("queries", queries)
    a.feed("clicks", clicks[:5])
    with registry_target.open() as registry:
        retire_owner(registry, "photon-a")  # the verifier's verdict, while A still runs
        with pytest.raises(Exception) as stopped:
            a.feed("clicks", clicks[5:])
        assert "OwnerRetired" in str(stopped.value) and "photon-a" in str(stopped.value)  # says why it stopped
        assert stopped_by_retirement(stopped.value)  # what the driver turns into its "retired" exit code
        found = registry.lookup({c.key: c.timestamp for c in clicks[5:]})
        assert not any(answer.registered for answer in found.values())  # A registered none of them
    b.feed("clicks", clicks)
    assert joined_counts(a, b) == Counter({c.key: 1 for c in clicks})


# ---- a click reported unjoinable twice ---- --------------------------------------------------------

def write_unjoinable(layout: PipelineLayout, click_id: str, reason: str) -> None:
    os.makedirs(layout.unjoinable_dir, exist_ok=True)
    with open(os.path.join(layout.unjoinable_dir, "dispatcher-000000000001-0.jsonl"), "a") as out:
        out.write(json.dumps({"key": click_id, "value": {"reason": reason}, "timestamp": T0, "id": "x"}) + "\n")


def test_a_click_reported_unjoinable_twice_is_neither_consistent_nor_settled(tmp_path):
    base = str(tmp_path)
    clicks = [click("c-1", "web-1:7:1699999999000:0", T0), click("c-2", "web-1:7:1699999999000:1", T0)]
    log = write_click_log(base, clicks)
    layouts = [PipelineLayout(os.path.join(base, owner)) for owner in ("photon-a", "photon-b")]
    for layout in layouts:
        write_unjoinable(layout, "c-1", "not_found")  # decided twice: the registry should have stopped one
        write_unjoinable(layout, "c-2", "expired")  # the one documented exception: each pipeline reports it
    with open_registry("sqlite:///" + os.path.join(base, "ids.db")) as registry:
        report = Verifier(registry, log, layouts, os.path.join(base, "reinjected")).run()
    assert report.unjoinable_twice == ["c-1"]
    assert not report.consistent and not report.settled


# ---- registry failures while verifying ---- --------------------------------------------------------

class FailsFirstCalls(ForwardingRegistry):
    """A registry whose first `failures` reads fail, as while a PostgreSQL server restarts."""

    def __init__(self, backend: Any, failures: int) -> None:
        super().__init__(backend)
        self.failures = failures

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RegistryError("connection refused (the server is restarting)")

    def lookup(self, ids: Mapping[str, int]) -> Any:
        self._maybe_fail()
        return super().lookup(ids)

    def now_ms(self) -> int:
        self._maybe_fail()
        return super().now_ms()


def test_wait_until_settled_tries_again_after_a_registry_failure(tmp_path):
    base = str(tmp_path)
    a = HarnessPhoton(base, "photon-a", "sqlite:///" + os.path.join(base, "ids.db"))
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(3)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(3)]
    log = write_click_log(base, clicks)
    a.feed("queries", queries)
    a.feed("clicks", clicks)
    with open_registry(a.spec.registry_url) as backend:
        registry = FailsFirstCalls(backend, failures=2)
        reports = wait_until_settled(Verifier(registry, log, [a.layout], os.path.join(base, "re")),
                                     timeout_s=30, every_s=0.01)
    assert registry.failures == 0 and reports and reports[-1].settled


class FailsSecondDelete(ForwardingRegistry):
    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.deletes = 0

    def delete(self, click_id: str, token: Token, event_time_ms: int) -> DeleteStatus:
        self.deletes += 1
        if self.deletes == 2:
            raise RegistryError("connection lost")
        return super().delete(click_id, token, event_time_ms)


def test_a_registry_failure_mid_repair_still_reinjects_what_was_deleted(tmp_path):
    base = str(tmp_path)
    url = "sqlite:///" + os.path.join(base, "ids.db")
    clicks = [click(f"c-{n}", f"web-1:7:{T0 - 1000}:{n}", T0 + n) for n in range(3)]
    log = write_click_log(base, clicks)
    reinject = os.path.join(base, "reinjected")
    with open_registry(url) as backend:
        from millstream.photon import Claim

        backend.commit([Claim(c.key, Token("photon-dead", f"1/{c.id}"), c.timestamp) for c in clicks])
        registry = FailsSecondDelete(backend)
        with pytest.raises(RegistryError):
            Verifier(registry, log, [PipelineLayout(os.path.join(base, "a"))], reinject, owner_timeout_ms=0).run()
        found = backend.lookup({c.key: c.timestamp for c in clicks})
    deleted = {c.key for c in clicks if not found[c.key].registered}
    reinjected = {json.loads(line)["key"] for name in os.listdir(reinject) if not name.startswith(".")
                  for line in open(os.path.join(reinject, name))}
    assert deleted and deleted == reinjected  # nothing deleted is left without a re-injection


# ---- clicks the adapter filters out ---- -----------------------------------------------------------

class NoSpam(JoinAdapter):
    def filter(self, query: Any, click: Any) -> bool:
        return not click.get("spam")


def test_a_click_the_adapter_filters_out_settles_as_filtered(tmp_path):
    base = str(tmp_path)
    a = HarnessPhoton(base, "photon-a", "sqlite:///" + os.path.join(base, "ids.db"))
    a.harness = PipelineHarness(build_photon_pipeline(a.spec, adapter=NoSpam(), sinks=False), wall_time=T0)
    queries = [query(n, T0 - 5_000 + 10 * n) for n in range(3)]
    clicks = [click(f"c-{n}", queries[n], T0 + n) for n in range(3)]
    clicks[2].value["spam"] = True
    log = write_click_log(base, clicks)
    a.feed("queries", queries)
    a.feed("clicks", clicks)
    assert a.stats().filtered == 1 and not a.pending()
    with open_registry(a.spec.registry_url) as registry:
        report = Verifier(registry, log, [a.layout], os.path.join(base, "re"), adapter=NoSpam()).run()
        assert report.filtered == ["c-2"] and not report.unsettled and report.settled, report
        # The same click with an adapter that keeps it is not settled: nobody joined it.
        assert Verifier(registry, log, [a.layout], os.path.join(base, "re")).run().unsettled == ["c-2"]
