"""Server-side batching: many callers, one transaction per batch, each caller gets its own answer."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from millstream.photon import (BatchingRegistry, Claim, CommitOutcome, CommitStatus, CommitTimeout, IdRegistry,
                               Token)

A, B = Token("joiner-a", "1"), Token("joiner-b", "1")
COMMITTED, ALREADY_JOINED = CommitStatus.COMMITTED, CommitStatus.ALREADY_JOINED


class RecordingBackend:
    """Passes commits to a real registry, remembering each batch; while `gate` is closed, a commit
    waits in the backend, so requests pile up in the batcher's queue."""

    def __init__(self, backend: IdRegistry, fail_on: str | None = None, delay_s: float = 0.0) -> None:
        self.backend = backend
        self.batches: list[list[Claim]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_on = fail_on
        self.delay_s = delay_s

    def commit_each(self, claims: list[Claim]) -> list[CommitOutcome]:
        self.entered.set()
        self.gate.wait()
        time.sleep(self.delay_s)
        self.batches.append(list(claims))
        if self.fail_on is not None and any(claim.click_id == self.fail_on for claim in claims):
            raise RuntimeError("the transaction failed")
        return self.backend.commit_each(claims)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


def in_thread(function: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run function in a thread; the returned dict gets 'result' or 'error' and 'thread'."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = function(*args, **kwargs)
        except BaseException as error:
            box["error"] = error

    box["thread"] = threading.Thread(target=run)
    box["thread"].start()
    return box


def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def block_the_batcher(backend: RecordingBackend, batcher: BatchingRegistry) -> dict[str, Any]:
    """Close the gate and get a first request stuck in the backend; later requests queue up."""
    backend.gate.clear()
    first = in_thread(batcher.commit_each, [Claim("warm-up", A, 1)])
    wait_until(backend.entered.is_set)
    return first


def test_concurrent_callers_share_transactions_and_get_their_own_answers(registry_target):
    backend = RecordingBackend(registry_target.open(), delay_s=0.002)
    batcher = BatchingRegistry(backend, max_batch=50)  # type: ignore[arg-type]
    tokens = [Token(f"joiner-{k}", "1") for k in range(16)]
    answers: dict[int, list[tuple[Claim, CommitOutcome]]] = {k: [] for k in range(16)}

    def client(k: int) -> None:
        rng = random.Random(k)
        for _ in range(25):
            claims = [Claim(f"click-{rng.randrange(150)}", tokens[k], 1_000) for _ in range(rng.randint(1, 3))]
            answers[k].extend(zip(claims, batcher.commit_each(claims)))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    batcher.close()

    # Ground truth from the batches as the backend saw them, in order: an id belongs to its first claim.
    owner: dict[str, Token] = {}
    for batch in backend.batches:
        for claim in batch:
            owner.setdefault(claim.click_id, claim.token)
    for k, pairs in answers.items():
        for claim, outcome in pairs:
            assert outcome == CommitOutcome(COMMITTED if owner[claim.click_id] == claim.token else ALREADY_JOINED,
                                            owner[claim.click_id])
    requests = 16 * 25
    sizes = [len(batch) for batch in backend.batches]
    assert sum(sizes) == sum(len(pairs) for pairs in answers.values())
    assert len(sizes) < requests / 2, "callers did not share transactions"
    assert max(sizes) <= 50
    stats = batcher.stats()
    assert (stats.batches, stats.claims, stats.largest_batch) == (len(sizes), sum(sizes), max(sizes))
    with registry_target.open() as registry:
        found = registry.lookup({click_id: 1_000 for click_id in owner})
    assert {i: r.token for i, r in found.items()} == owner
    backend.backend.close()


def test_the_earlier_caller_wins_inside_one_batch(registry_target):
    backend = RecordingBackend(registry_target.open())
    batcher = BatchingRegistry(backend)  # type: ignore[arg-type]
    warm_up = block_the_batcher(backend, batcher)
    first = in_thread(batcher.commit_each, [Claim("x", A, 5)])
    wait_until(lambda: batcher.queued_requests() == 1)
    second = in_thread(batcher.commit_each, [Claim("x", B, 5)])
    wait_until(lambda: batcher.queued_requests() == 2)
    backend.gate.set()
    for box in (warm_up, first, second):
        box["thread"].join()
    assert first["result"] == [CommitOutcome(COMMITTED, A)]
    assert second["result"] == [CommitOutcome(ALREADY_JOINED, A)]
    assert backend.batches[1] == [Claim("x", A, 5), Claim("x", B, 5)]  # one transaction for both
    batcher.close()
    backend.backend.close()


def test_a_timed_out_commit_is_retried_with_the_same_token(registry_target):
    """The lost-reply case through the batcher: the caller gives up, the batch commits anyway, and the
    retry with the caller's token is told COMMITTED, while any other token is refused."""
    backend = RecordingBackend(registry_target.open())
    batcher = BatchingRegistry(backend)  # type: ignore[arg-type]
    backend.gate.clear()
    with pytest.raises(CommitTimeout):
        batcher.commit_each([Claim("x", A, 5)], timeout_s=0.05)
    assert batcher.lookup({"x": 5})["x"].registered is False  # not yet: the backend is still blocked
    backend.gate.set()
    wait_until(lambda: batcher.stats().batches == 1)
    assert batcher.lookup({"x": 5})["x"].token == A
    assert batcher.commit_each([Claim("x", A, 5)]) == [CommitOutcome(COMMITTED, A)]
    assert batcher.commit_each([Claim("x", B, 5)]) == [CommitOutcome(ALREADY_JOINED, A)]
    batcher.close()
    backend.backend.close()


def test_a_failed_transaction_fails_every_caller_of_its_batch(registry_target):
    backend = RecordingBackend(registry_target.open(), fail_on="poison")
    batcher = BatchingRegistry(backend)  # type: ignore[arg-type]
    warm_up = block_the_batcher(backend, batcher)
    poisoned = in_thread(batcher.commit_each, [Claim("poison", A, 5)])
    wait_until(lambda: batcher.queued_requests() == 1)
    bystander = in_thread(batcher.commit_each, [Claim("innocent", B, 5)])
    wait_until(lambda: batcher.queued_requests() == 2)
    backend.gate.set()
    for box in (warm_up, poisoned, bystander):
        box["thread"].join()
    assert isinstance(poisoned["error"], RuntimeError) and isinstance(bystander["error"], RuntimeError)
    assert batcher.lookup({"innocent": 5})["innocent"].registered is False  # rolled back with the batch
    assert batcher.commit_each([Claim("innocent", B, 5)]) == [CommitOutcome(COMMITTED, B)]  # still serving
    batcher.close()
    backend.backend.close()


def test_batches_respect_max_batch_and_never_split_a_request(tmp_path):
    from millstream.photon import SqliteRegistry

    backend = RecordingBackend(SqliteRegistry(tmp_path / "ids.db"))
    batcher = BatchingRegistry(backend, max_batch=4)  # type: ignore[arg-type]
    warm_up = block_the_batcher(backend, batcher)
    boxes = []
    for n in range(10):
        boxes.append(in_thread(batcher.commit_each, [Claim(f"single-{n}", A, 5)]))
        wait_until(lambda n=n: batcher.queued_requests() == n + 1)
    big = [Claim(f"big-{n}", B, 5) for n in range(7)]
    boxes.append(in_thread(batcher.commit_each, big))
    wait_until(lambda: batcher.queued_requests() == 11)
    backend.gate.set()
    for box in [warm_up, *boxes]:
        box["thread"].join()
    assert [len(batch) for batch in backend.batches] == [1, 4, 4, 2, 7]
    assert boxes[-1]["result"] == [CommitOutcome(COMMITTED, B)] * 7
    batcher.close()
    backend.backend.close()


def test_max_wait_gathers_requests_that_arrive_soon_after(tmp_path):
    from millstream.photon import SqliteRegistry

    backend = RecordingBackend(SqliteRegistry(tmp_path / "ids.db"))
    batcher = BatchingRegistry(backend, max_wait_ms=400)  # type: ignore[arg-type]
    early = in_thread(batcher.commit_each, [Claim("early", A, 5)])
    time.sleep(0.02)
    late = in_thread(batcher.commit_each, [Claim("late", A, 5)])
    for box in (early, late):
        box["thread"].join()
    assert [len(batch) for batch in backend.batches] == [2]
    batcher.close()
    backend.backend.close()


def test_close_commits_what_is_queued_then_refuses(tmp_path):
    from millstream.photon import RegistryError, SqliteRegistry

    backend = RecordingBackend(SqliteRegistry(tmp_path / "ids.db"))
    batcher = BatchingRegistry(backend)  # type: ignore[arg-type]
    warm_up = block_the_batcher(backend, batcher)
    queued = in_thread(batcher.commit_each, [Claim("queued", A, 5)])
    wait_until(lambda: batcher.queued_requests() == 1)
    closing = in_thread(batcher.close)
    backend.gate.set()
    for box in (warm_up, queued, closing):
        box["thread"].join()
    assert queued["result"] == [CommitOutcome(COMMITTED, A)]
    with pytest.raises(RegistryError):
        batcher.commit_each([Claim("after", A, 5)])
    backend.backend.close()
