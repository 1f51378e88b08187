"""IdRegistry semantics, the same tests on SQLite and on PostgreSQL (see conftest.registry_target).

Expected outcomes come from a plain dict model of the registry written here, never from the code
under test.
"""

from __future__ import annotations

import random
import zlib

import pytest

from millstream.photon import (Claim, CommitOutcome, CommitStatus, DeleteStatus, IdRegistry, ReshardRefused,
                               Token, open_registry)
from millstream.photon.registry import BEGINNING_OF_TIME
from photon_support import FakeClock, expected_shard

COMMITTED, ALREADY_JOINED, EXPIRED = CommitStatus.COMMITTED, CommitStatus.ALREADY_JOINED, CommitStatus.EXPIRED


def statuses(outcomes: list[CommitOutcome]) -> list[CommitStatus]:
    return [outcome.status for outcome in outcomes]


def test_random_batches_match_a_dict_model(registry_target):
    rng = random.Random(7)
    tokens = [Token(f"joiner-{k}", f"attempt-{k % 2}") for k in range(4)]
    model: dict[str, Token] = {}  # id -> owner, the obvious registry
    with registry_target.open(initial_shards=3) as registry:
        for _ in range(12):
            batch = [Claim(f"click-{rng.randrange(60)}", rng.choice(tokens), 1_000 + rng.randrange(100))
                     for _ in range(rng.randrange(1, 25))]
            expected = []
            for claim in batch:
                owner = model.setdefault(claim.click_id, claim.token)
                expected.append(CommitOutcome(COMMITTED if owner == claim.token else ALREADY_JOINED, owner))
            assert registry.commit_each(batch) == expected
        # Event times only route: look every id up with a time it was claimed with (all in one range
        # of one sharding entry, so any time in it routes the same way).
        found = registry.lookup({f"click-{n}": 1_000 for n in range(60)})
    for n in range(60):
        result = found[f"click-{n}"]
        assert result.registered == (f"click-{n}" in model)
        assert result.token == model.get(f"click-{n}")
        assert not result.expired


def test_duplicates_inside_one_batch(registry_target):
    first, second = Token("joiner-a", "1"), Token("joiner-b", "1")
    with registry_target.open() as registry:
        outcomes = registry.commit_each([Claim("x", first, 5), Claim("x", second, 5),
                                         Claim("y", second, 5), Claim("y", second, 5)])
        assert outcomes == [CommitOutcome(COMMITTED, first), CommitOutcome(ALREADY_JOINED, first),
                            CommitOutcome(COMMITTED, second), CommitOutcome(COMMITTED, second)]
        # commit() keys by id and reports an id's first claim.
        assert registry.commit([Claim("z", second, 5), Claim("z", first, 5)]) == {
            "z": CommitOutcome(COMMITTED, second)}
    stored = {click_id: token for rows in registry_target.rows_per_shard().values()
              for click_id, (token, _) in rows.items()}
    assert stored == {"x": first.encode(), "y": second.encode(), "z": second.encode()}


def test_an_id_already_owned_beats_the_first_claim_of_a_batch(registry_target):
    """First writer wins inside a batch only among claims on an absent id: an owner already
    registered (here retrying after a lost reply) keeps the id."""
    owner, newcomer = Token("joiner-a", "1"), Token("joiner-b", "1")
    with registry_target.open() as registry:
        registry.commit([Claim("x", owner, 5)])
        assert registry.commit_each([Claim("x", newcomer, 5), Claim("x", owner, 5)]) == [
            CommitOutcome(ALREADY_JOINED, owner), CommitOutcome(COMMITTED, owner)]


class LosesReplies(IdRegistry):
    """A client whose commits reach the registry but whose replies never come back."""

    def __init__(self, backend: IdRegistry) -> None:
        self.backend = backend

    def commit_each(self, claims):
        self.backend.commit_each(claims)
        raise TimeoutError("reply lost")

    def lookup(self, ids): raise NotImplementedError
    def delete(self, click_id, token, event_time_ms): raise NotImplementedError
    def heartbeat(self, owner): raise NotImplementedError
    def owner_last_seen(self, owner): raise NotImplementedError
    def bind_owner(self, owner, root): raise NotImplementedError
    def reshard(self, shard_count, safety_margin_ms): raise NotImplementedError
    def sharding(self): raise NotImplementedError
    def gc(self, older_than_ms): raise NotImplementedError
    def gc_boundary(self): raise NotImplementedError
    def close(self): self.backend.close()


def test_lost_reply_retry_with_the_same_token_succeeds(registry_target):
    joiner, rival = Token("joiner-a", "attempt-1"), Token("joiner-b", "attempt-1")
    claims = [Claim(f"click-{n}", joiner, 2_000 + n) for n in range(10)]
    with pytest.raises(TimeoutError):
        LosesReplies(registry_target.open()).commit_each(claims)
    # The joiner does not know whether the commit happened; it retries with the same token.
    with registry_target.open() as registry:
        assert registry.commit_each(claims) == [CommitOutcome(COMMITTED, joiner)] * 10
        # A new attempt of the same owner is another token: it must not be told it joined.
        other_attempt = Token("joiner-a", "attempt-2")
        assert statuses(registry.commit_each([Claim("click-0", other_attempt, 2_000)])) == [ALREADY_JOINED]
        assert registry.commit_each([Claim(c.click_id, rival, c.event_time_ms) for c in claims]) == [
            CommitOutcome(ALREADY_JOINED, joiner)] * 10


def test_gc_expires_ids_and_its_boundary_never_goes_back(registry_target):
    rng = random.Random(3)
    times = {f"click-{n}": rng.randrange(1_000, 2_000) for n in range(200)}
    owner, other = Token("joiner-a", "1"), Token("joiner-b", "1")
    with registry_target.open(initial_shards=3) as registry:
        registry.commit([Claim(i, owner, t) for i, t in times.items()])
        result = registry.gc(1_500)
        below = {i for i, t in times.items() if t < 1_500}
        assert (result.boundary_ms, result.deleted) == (1_500, len(below))
        assert 0 < len(below) < len(times)

        found = registry.lookup(times)
        for click_id, t in times.items():
            if click_id in below:
                assert (found[click_id].expired, found[click_id].registered) == (True, False)
            else:
                assert (found[click_id].expired, found[click_id].token) == (False, owner)
        # Behind the boundary nobody may commit, not even the original owner: the caller skips.
        behind = sorted(below)[:5]
        outcomes = registry.commit_each([Claim(i, token, times[i]) for i in behind for token in (owner, other)])
        assert outcomes == [CommitOutcome(EXPIRED, None)] * 10
        assert registry.delete(behind[0], owner, times[behind[0]]) is DeleteStatus.EXPIRED

        assert registry.gc(1_200).boundary_ms == 1_500  # asking for less does not move it back
        assert registry.gc_boundary() == 1_500
    stored_times = [t for rows in registry_target.rows_per_shard().values() for _, t in rows.values()]
    assert len(stored_times) == len(times) - len(below) and min(stored_times) >= 1_500
    with registry_target.open() as reopened:  # the boundary is in the registry, not in the client
        assert reopened.gc_boundary() == 1_500
        assert reopened.gc(1_700).boundary_ms == 1_700


def test_delete_only_by_the_owning_token(registry_target):
    owner, other = Token("joiner-a", "1"), Token("joiner-b", "1")
    with registry_target.open() as registry:
        registry.commit([Claim("x", owner, 10)])
        assert registry.delete("x", other, 10) is DeleteStatus.OWNED_BY_OTHER
        assert registry.lookup({"x": 10})["x"].token == owner
        assert registry.delete("x", owner, 10) is DeleteStatus.DELETED
        assert registry.delete("x", owner, 10) is DeleteStatus.NOT_FOUND
        # The verifier deleted it: the re-injected click may now be joined by anyone.
        assert registry.commit([Claim("x", other, 10)])["x"] == CommitOutcome(COMMITTED, other)


def test_heartbeats_are_shared_and_never_go_back(registry_target):
    clock = FakeClock(5_000)
    with registry_target.open(clock=clock) as registry, registry_target.open() as observer:
        assert observer.owner_last_seen("joiner-a") is None
        registry.heartbeat("joiner-a")
        clock.now_ms = 4_000  # a heartbeat from a clock that went back must not make the owner look older
        registry.heartbeat("joiner-a")
        assert observer.owner_last_seen("joiner-a") == 5_000
        clock.now_ms = 9_000
        registry.heartbeat("joiner-a")
        assert observer.owner_last_seen("joiner-a") == 9_000
        assert observer.owner_last_seen("joiner-b") is None


def test_ids_stay_where_their_event_time_routed_them_across_a_reshard(registry_target):
    clock = FakeClock(100_000)
    owner, rival = Token("joiner-a", "1"), Token("joiner-b", "1")
    old = {f"old-{n}": 99_000 + n for n in range(80)}
    new = {f"new-{n}": 101_500 + n for n in range(80)}
    with registry_target.open(initial_shards=2, clock=clock) as registry:
        registry.commit([Claim(i, owner, t) for i, t in old.items()])
        entry = registry.reshard(5, safety_margin_ms=1_000)
        assert (entry.effective_from_ms, entry.shard_count) == (101_000, 5)
        clock.now_ms = 101_400
        registry.commit([Claim(i, owner, t) for i, t in new.items()])
        # Ids committed before the reshard, claimed again after it by another joiner: the registry
        # must find them where they are, whatever shard the new count would give them.
        outcomes = registry.commit([Claim(i, rival, t) for i, t in {**old, **new}.items()])
        assert all(outcome == CommitOutcome(ALREADY_JOINED, owner) for outcome in outcomes.values())
        with registry_target.open() as other_client:  # the configuration lives in the registry
            assert [(e.effective_from_ms, e.shard_count) for e in other_client.sharding().entries] == [
                (BEGINNING_OF_TIME, 2), (101_000, 5)]

    entries = [(BEGINNING_OF_TIME, 2), (101_000, 5)]
    rows = registry_target.rows_per_shard()
    assert sorted(rows) == [0, 1, 2, 3, 4]  # the shards are real tables
    where = {click_id: shard for shard, ids in rows.items() for click_id in ids}
    assert sum(len(ids) for ids in rows.values()) == len(old) + len(new)  # every id stored once
    for click_id, t in {**old, **new}.items():
        assert where[click_id] == expected_shard(click_id, entries, t)
    # Meaningful only if the new count moves some old ids and fills the new shards:
    assert any(expected_shard(i, entries, t) != zlib.crc32(i.encode()) % 5 for i, t in old.items())
    assert any(where[i] >= 2 for i in new)


def test_reshard_refuses_what_could_route_an_id_twice(registry_target):
    clock = FakeClock(50_000)
    with registry_target.open(initial_shards=2, clock=clock) as registry:
        with pytest.raises(ValueError):
            registry.reshard(3, safety_margin_ms=-1)  # would apply to the past
        with pytest.raises(ValueError):
            registry.reshard(0, safety_margin_ms=100)
        # An id stamped ahead of the registry's clock (beyond the margin) is already registered with
        # the current entry; an entry starting before its time would route it elsewhere.
        registry.commit([Claim("early-bird", Token("j", "1"), 50_500)])
        with pytest.raises(ReshardRefused):
            registry.reshard(3, safety_margin_ms=400)
        entry = registry.reshard(3, safety_margin_ms=600)
        assert entry.effective_from_ms == 50_600
        with pytest.raises(ReshardRefused):  # may not be scheduled before the pending entry
            registry.reshard(4, safety_margin_ms=100)
        assert [e.shard_count for e in registry.sharding().entries] == [2, 3]
        clock.now_ms = 51_000
        assert registry.reshard(4, safety_margin_ms=100).effective_from_ms == 51_100


def test_open_registry_rejects_unknown_schemes_without_echoing_the_url():
    with pytest.raises(ValueError) as error:
        open_registry("mysql://user:hunter2@db/clicks")
    assert "hunter2" not in str(error.value) and "mysql" in str(error.value)


def test_sqlite_url_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_registry("sqlite:///relative.db") as registry:
        registry.commit([Claim("x", Token("j", "1"), 1)])
    assert (tmp_path / "relative.db").exists()
    absolute = tmp_path / "sub" / "absolute.db"
    absolute.parent.mkdir()
    with open_registry(f"sqlite:///{absolute}") as registry:
        assert registry.lookup({"x": 1})["x"].registered is False
    assert absolute.exists()
