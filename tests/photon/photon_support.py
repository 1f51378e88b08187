"""Helpers of the Photon tests: a fake clock, independent shard routing, and the code the tests run in
worker processes (spawned, so it must be importable by name)."""

from __future__ import annotations

import random
import re
import sqlite3
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from millstream.photon import BatchingRegistry, Claim, CommitOutcome, IdRegistry, Token, open_registry


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def expected_shard(click_id: str, entries: list[tuple[int, int]], event_time_ms: int) -> int:
    """Independent routing: the last (start, count) entry starting at or before the event time,
    crc32 of the id modulo its count."""
    count = [count for start, count in entries if start <= event_time_ms][-1]
    return zlib.crc32(click_id.encode()) % count


def _record(outcomes: dict[str, tuple[str, Any]], claims: list[Claim], results: list[CommitOutcome]) -> None:
    for claim, outcome in zip(claims, results):
        assert claim.click_id not in outcomes, "a worker claims each id once"
        winner = None if outcome.token is None else (outcome.token.owner, outcome.token.attempt)
        outcomes[claim.click_id] = (outcome.status.value, winner)


def race_on_ids(target: Any, owner: str, ids: dict[str, int], order_seed: int, rotation: float, barrier: Any,
                results: Any) -> None:
    """Claim every id of `ids` (id -> event time) for `owner` in batches of random sizes, starting
    together with the other workers; report {id: (status, winner)}. The order is a shuffle by
    `order_seed` (workers with the same seed collide on the same ids at the same moment) started at
    fraction `rotation` of it (workers with different rotations each get ids first). Every worker
    commits its first batch, then waits at `barrier` again for the others' first batches: on a
    loaded machine one worker could otherwise take every id before the others are scheduled at all.
    A short random pause between batches keeps the race going after that."""
    order = list(ids)
    random.Random(order_seed).shuffle(order)
    start = int(len(order) * rotation)
    order = order[start:] + order[:start]
    rng = random.Random(f"{owner}-{order_seed}")
    token = Token(owner, "attempt-1")
    outcomes: dict[str, tuple[str, Any]] = {}
    with target.open() as registry:
        barrier.wait()
        first = True
        while order:
            size = rng.randint(1, 20)
            claims = [Claim(click_id, token, ids[click_id]) for click_id in order[:size]]
            del order[:size]
            _record(outcomes, claims, registry.commit_each(claims))
            if first:
                barrier.wait()  # the others' first batches are in: each rotation won ids of its own
                first = False
            time.sleep(rng.random() / 1000)
    results.put((owner, outcomes))


def commit_in_real_time(target: Any, owner: str, offsets: list[tuple[str, int]], lag_ms: int, threads: int,
                        ready: Any, start: Any, t0: Any, results: Any) -> None:
    """Claim each id at event time t0 + offset once the wall clock has passed that time plus `lag_ms`,
    like a pipeline reading a live click log `lag_ms` behind. t0 is set by the parent when every worker
    is ready. With `threads` > 1 the ids are split among that many threads committing through one
    BatchingRegistry."""
    token = Token(owner, "attempt-1")
    outcomes: dict[str, tuple[str, Any]] = {}
    lock = threading.Lock()
    with target.open() as backend:
        registry = BatchingRegistry(backend) if threads > 1 else backend
        ready.wait()
        start.wait()
        ids = [(click_id, t0.value + offset) for click_id, offset in offsets]

        def run(part: list[tuple[str, int]]) -> None:
            pending = list(part)
            while pending:
                now_ms = time.time_ns() // 1_000_000
                due = [item for item in pending if item[1] + lag_ms <= now_ms]
                if not due:
                    time.sleep(max(0.0, (pending[0][1] + lag_ms - now_ms) / 1000))
                    continue
                pending = pending[len(due):]
                claims = [Claim(click_id, token, t) for click_id, t in due]
                answers = registry.commit_each(claims)
                with lock:
                    _record(outcomes, claims, answers)

        workers = [threading.Thread(target=run, args=(ids[k::threads],)) for k in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if isinstance(registry, BatchingRegistry):
            registry.close()
    results.put((owner, outcomes))


@dataclass
class RegistryTarget:
    """Where one test's registry lives; picklable, so worker processes can open it too."""

    backend: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def open(self, **extra: Any) -> IdRegistry:
        return open_registry(self.url, **{**self.options, **extra})

    def rows_per_shard(self) -> dict[int, dict[str, tuple[str, int]]]:
        """Shard number -> {id: (token text, event time)}, read straight from the tables."""
        found: dict[int, dict[str, tuple[str, int]]] = {}
        if self.backend == "sqlite":
            with sqlite3.connect(self.url[len("sqlite:///"):]) as connection:
                tables = [name for (name,) in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'shard_%'")]
                for table in tables:
                    rows = connection.execute(f"SELECT id, token, event_time_ms FROM {table}")
                    found[int(table.rsplit("_", 1)[1])] = {i: (tok, t) for i, tok, t in rows}
            return found
        import psycopg

        namespace = self.options["namespace"]
        with psycopg.connect(self.url) as connection:
            tables = [name for (name,) in connection.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (f"{namespace}\\_shard\\_%",))]
            for table in tables:
                if not re.fullmatch(rf"{namespace}_shard_\d+", table):
                    continue
                rows = connection.execute(f'SELECT id, token, event_time_ms FROM "{table}"')
                found[int(table.rsplit("_", 1)[1])] = {i: (tok, t) for i, tok, t in rows}
        return found
