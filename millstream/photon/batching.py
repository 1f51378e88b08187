"""Server-side batching (the paper's group commit) in front of any IdRegistry.

Photon's registry server puts each RPC's request on an in-memory queue; one background thread takes
whatever is queued and commits it as a single transaction, then answers every caller. A commit costs
about the same for one id as for a thousand (the price is the round trips and the log flush, not the
bytes), so throughput grows with the number of concurrent callers instead of being capped at one
transaction per id. Here the callers are threads of one process sharing a `BatchingRegistry`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from millstream.photon.registry import Claim, CommitOutcome, ForwardingRegistry, IdRegistry, RegistryError


class CommitTimeout(RegistryError):
    """No answer within the caller's timeout. The claims may or may not have been committed: retry
    with the same token, which is answered COMMITTED if they were (the paper's lost-reply case)."""


@dataclass(frozen=True, slots=True)
class BatchingStats:
    """Transactions run by the background thread and the claims they carried."""

    batches: int
    claims: int
    largest_batch: int

    @property
    def mean_batch(self) -> float:
        return self.claims / self.batches if self.batches else 0.0


class _Request:
    __slots__ = ("claims", "done", "outcomes", "error")

    def __init__(self, claims: list[Claim]) -> None:
        self.claims = claims
        self.done = threading.Event()
        self.outcomes: list[CommitOutcome] = []
        self.error: BaseException | None = None


class BatchingRegistry(ForwardingRegistry):
    """Commits the claims of many concurrent callers in one transaction of `backend`.

    The background thread takes the queued requests, up to `max_batch` claims (a single larger request
    is never split). If fewer requests are queued than the previous batch answered, it waits up to
    `max_wait_ms` for the rest: the callers it just answered usually come straight back with their next
    request, and without this pause every other batch would hold only the first of them to return
    (measured: batches of half the callers on average). With `max_wait_ms=0` it takes only what is
    already queued. Requests are committed in arrival order, so inside a batch the earlier caller's
    claim wins. Everything but commits goes straight to `backend`. `close()` stops the thread after
    committing what is queued; it does not close `backend`.

    >>> import tempfile, os
    >>> from millstream.photon import SqliteRegistry, Token
    >>> backend = SqliteRegistry(os.path.join(tempfile.mkdtemp(), "ids.db"))
    >>> registry = BatchingRegistry(backend, max_batch=1000)
    >>> registry.commit([Claim("c1", Token("j", "1"), 1_700_000_000_000)])["c1"].status.value
    'committed'
    >>> registry.stats().batches
    1
    >>> registry.close(); backend.close()
    """

    def __init__(self, backend: IdRegistry, max_batch: int = 1000, max_wait_ms: float = 2.0) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_wait_ms < 0:
            raise ValueError("max_wait_ms must not be negative")
        self.backend = backend
        self.max_batch = max_batch
        self.max_wait_ms = max_wait_ms
        self._queue: deque[_Request] = deque()
        self._wakeup = threading.Condition()
        self._closing = False
        self._batches = self._claims = self._largest = 0
        self._previous_requests = 0  # requests in the last batch: how many callers may come back
        self._thread = threading.Thread(target=self._commit_loop, name="photon-registry-batcher", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"BatchingRegistry({self.backend!r}, max_batch={self.max_batch}, max_wait_ms={self.max_wait_ms})"

    # ---- callers --------------------------------------------------------------------------------

    def commit_each(self, claims: Sequence[Claim], timeout_s: float | None = None) -> list[CommitOutcome]:
        """Queue the claims and wait for the batch they join to commit (see `CommitTimeout`)."""
        request = _Request(list(claims))
        if not request.claims:
            return []
        with self._wakeup:
            if self._closing:
                raise RegistryError("the batching registry is closed")
            self._queue.append(request)
            self._wakeup.notify()
        if not request.done.wait(timeout_s):
            raise CommitTimeout(f"no answer for {len(request.claims)} claims within {timeout_s} s")
        if request.error is not None:
            raise request.error
        return request.outcomes

    def queued_requests(self) -> int:
        """Requests waiting for the background thread (not counting the batch being committed)."""
        with self._wakeup:
            return len(self._queue)

    def stats(self) -> BatchingStats:
        with self._wakeup:
            return BatchingStats(self._batches, self._claims, self._largest)

    # ---- the background thread ------------------------------------------------------------------

    def _next_batch(self) -> list[_Request] | None:
        with self._wakeup:
            while not self._queue:
                if self._closing:
                    return None
                self._wakeup.wait()
            batch = [self._queue.popleft()]
            size = len(batch[0].claims)
            # Before any batch there is nothing to go by: wait the whole max_wait for company.
            expected = self._previous_requests or None
            deadline = time.monotonic() + self.max_wait_ms / 1000
            while size < self.max_batch:
                if self._queue:
                    if size + len(self._queue[0].claims) > self.max_batch:
                        break
                    batch.append(self._queue.popleft())
                    size += len(batch[-1].claims)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing or (expected is not None and len(batch) >= expected):
                    break
                self._wakeup.wait(remaining)
            self._previous_requests = len(batch)
            return batch

    def _commit_loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            claims = [claim for request in batch for claim in request.claims]
            try:
                outcomes = self.backend.commit_each(claims)
            except BaseException as error:  # every caller of the batch must hear about it
                for request in batch:
                    request.error = error
                    request.done.set()
                continue
            with self._wakeup:
                self._batches += 1
                self._claims += len(claims)
                self._largest = max(self._largest, len(claims))
            start = 0
            for request in batch:
                request.outcomes = outcomes[start:start + len(request.claims)]
                start += len(request.claims)
                request.done.set()

    def close(self) -> None:
        with self._wakeup:
            self._closing = True
            self._wakeup.notify_all()
        self._thread.join()

