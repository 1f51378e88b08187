"""The joiner: stateless, finds a click's query, registers the click id, then hands back the joined event.

For each request (a click the dispatcher sends), as in the paper:

1. find the query in the EventStore; not there (yet): NOT_FOUND, the dispatcher retries later;
2. run the user's adapter (filter, project, enrich); filtered out: FILTERED, nothing registered;
3. commit the click id to the IdRegistry with the request's token, all of one call's requests in one
   registry transaction; a commit whose reply is lost (`CommitTimeout`, a dropped connection) is sent
   again with the SAME token, which the registry answers COMMITTED if the first one went through (the
   paper's lost-reply case);
4. only then return the joined event: the dispatcher produces it.

At most `max_outstanding` requests are in the joiner at once; requests beyond that are answered
OVERLOADED at once, without any work (the paper's bound on what a joiner that dies mid-way can leave
registered but unwritten).

**Tokens.** A token is `(owner, "<attempt>/<click record id>")`: the owner is the pipeline, and the
token is a pure function of (pipeline, click record, dispatch attempt), never random. That matters on
Spark: a micro-batch that crashed after its registry commit and before Spark committed it is run
again from the same state, so it dispatches the same click with the same attempt number and gets
COMMITTED for the same token. If the re-run took another path (the query lookup or the joiner's
capacity can differ), the registry holds an earlier attempt of the *same click record* by the *same
pipeline*: that commit belongs to a batch Spark never committed, so nothing of it was published, and
the click is this pipeline's to produce (RECLAIMED). A duplicate record of the click (another record
id) is not: the registry's answer for it is "already joined".
"""

from __future__ import annotations

import enum
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from millstream.photon.adapter import Event, JoinAdapter
from millstream.photon.eventstore import EventStore
from millstream.photon.registry import Claim, CommitOutcome, CommitStatus, IdRegistry, RegistryError, Token

UNJOINABLE_ATTEMPT = "unjoinable"


def dispatch_token(owner: str, record_id: str, attempt: int | str) -> Token:
    """The token of one dispatch attempt of one click record by one pipeline (deterministic).

    >>> dispatch_token("photon-a", "clicks-17", 2)
    Token(owner='photon-a', attempt='2/clicks-17')
    >>> dispatch_token("photon-a", "clicks-17", UNJOINABLE_ATTEMPT).attempt
    'unjoinable/clicks-17'
    """
    return Token(owner, f"{attempt}/{record_id}")


def claims_same_record(token: Token | None, owner: str, record_id: str) -> bool:
    """True when `token` is an attempt of this very click record by pipeline `owner`: a registration
    left by one of its own micro-batches that Spark never committed (see the module doc).

    >>> claims_same_record(dispatch_token("photon-a", "clicks-17", 1), "photon-a", "clicks-17")
    True
    >>> claims_same_record(dispatch_token("photon-a", "clicks-17", 1), "photon-a", "clicks-18")  # a duplicate record
    False
    >>> claims_same_record(dispatch_token("photon-b", "clicks-17", 1), "photon-a", "clicks-17")
    False
    """
    if token is None or token.owner != owner:
        return False
    _, separator, claimed_record = token.attempt.partition("/")
    return bool(separator) and claimed_record == record_id


def _registry_failures() -> tuple[type[BaseException], ...]:
    """What a registry call raises when the registry (not our code) failed: worth a retry later."""
    failures: list[type[BaseException]] = [RegistryError, sqlite3.OperationalError, ConnectionError, TimeoutError]
    try:
        import psycopg

        failures.append(psycopg.OperationalError)
    except ImportError:  # pragma: no cover - psycopg is a dependency
        pass
    return tuple(failures)


REGISTRY_FAILURES = _registry_failures()


class JoinStatus(str, enum.Enum):
    """The answer to one join request."""

    JOINED = "joined"
    """Registered with this request's token (first time, or a lost reply answered on the retry)."""
    RECLAIMED = "reclaimed"
    """Registered by an earlier attempt of this click record by this pipeline, in a micro-batch Spark
    never committed: produce it now."""
    WASTED = "wasted"
    """Another pipeline (or another record of the click) registered it first: a wasted join."""
    EXPIRED = "expired"
    """Behind the registry's GC boundary: the registry can no longer tell, so the click is skipped."""
    FILTERED = "filtered"
    """The adapter dropped the pair; nothing was registered."""
    NOT_FOUND = "not_found"
    """The query is not in the EventStore (yet)."""
    OVERLOADED = "overloaded"
    """The joiner had `max_outstanding` requests already."""
    REGISTRY_UNAVAILABLE = "registry_unavailable"
    """The registry failed even after retrying with the same token."""

    @property
    def retry(self) -> bool:
        """Whether the dispatcher should try the click again later."""
        return self in (JoinStatus.NOT_FOUND, JoinStatus.OVERLOADED, JoinStatus.REGISTRY_UNAVAILABLE)

    @property
    def produce(self) -> bool:
        """Whether the click is this pipeline's to produce."""
        return self in (JoinStatus.JOINED, JoinStatus.RECLAIMED)


@dataclass(frozen=True)
class JoinRequest:
    """One click to join: its id, the query it names, its value, event time, record id and token.

    >>> request = JoinRequest("c-1", "web:1:1000:0", {"ad": "a"}, 1_200, "clicks-1", dispatch_token("p", "clicks-1", 1))
    >>> request.claim().click_id, request.claim().event_time_ms
    ('c-1', 1200)
    """

    click_id: str
    query_id: str
    click: Event
    event_time_ms: int
    record_id: str
    token: Token

    def claim(self) -> Claim:
        return Claim(self.click_id, self.token, self.event_time_ms)


@dataclass(frozen=True)
class JoinResult:
    """The status of one request, the joined event when it is ours to produce, and the token that
    owns the click id in the registry (when the registry answered).

    >>> JoinResult(JoinStatus.NOT_FOUND).status.retry
    True
    """

    status: JoinStatus
    joined: Event | None = None
    owner: Token | None = None


@dataclass(frozen=True)
class JoinBatch:
    """The results of one `Joiner.join` call, in request order, and what it cost the registry:
    transactions sent (`commit_calls`, retries included), claims in the first of them, and retries
    after a lost reply or a registry failure.

    >>> JoinBatch([JoinResult(JoinStatus.JOINED, {})], commit_calls=2, commit_claims=1, commit_retries=1).joined
    1
    """

    results: list[JoinResult]
    commit_calls: int = 0
    commit_claims: int = 0
    commit_retries: int = 0

    @property
    def joined(self) -> int:
        return sum(1 for r in self.results if r.status.produce)


class Joiner:
    """Joins clicks with their queries through `event_store`, registering each click id in `registry`.

    Stateless between calls; thread-safe. See the module doc for the steps and the token rules.

    >>> import tempfile, os
    >>> from millstream.photon import CachedEventStore, open_registry
    >>> store = CachedEventStore(); store.put("web:1:1000:0", {"text": "shoes"})
    >>> registry = open_registry("sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db"))
    >>> joiner = Joiner(registry, store, JoinAdapter(), max_outstanding=10)
    >>> click = JoinRequest("c-1", "web:1:1000:0", {"ad": "a"}, 1_200, "clicks-1",
    ...                     dispatch_token("photon-a", "clicks-1", 1))
    >>> batch = joiner.join([click])
    >>> batch.results[0].status.value, batch.results[0].joined["query"]
    ('joined', {'text': 'shoes'})
    >>> rival = JoinRequest("c-1", "web:1:1000:0", {"ad": "a"}, 1_200, "clicks-1",
    ...                     dispatch_token("photon-b", "clicks-1", 1))
    >>> joiner.join([rival]).results[0].status.value   # the other pipeline's join is wasted
    'wasted'
    >>> registry.close()
    """

    def __init__(self, registry: IdRegistry, event_store: EventStore, adapter: JoinAdapter, *,
                 max_outstanding: int = 1_000, commit_attempts: int = 4, retry_pause_s: float = 0.05) -> None:
        if max_outstanding < 1 or commit_attempts < 1:
            raise ValueError("max_outstanding and commit_attempts must be at least 1")
        self.registry = registry
        self.event_store = event_store
        self.adapter = adapter
        self.max_outstanding = max_outstanding
        self.commit_attempts = commit_attempts
        self.retry_pause_s = retry_pause_s
        self._lock = threading.Lock()
        self._outstanding = 0

    @property
    def outstanding(self) -> int:
        """Requests being worked on right now (by all threads)."""
        with self._lock:
            return self._outstanding

    def _admit(self, wanted: int) -> int:
        with self._lock:
            admitted = max(0, min(wanted, self.max_outstanding - self._outstanding))
            self._outstanding += admitted
            return admitted

    def _release(self, count: int) -> None:
        with self._lock:
            self._outstanding -= count

    def join(self, requests: Sequence[JoinRequest]) -> JoinBatch:
        """Answer every request (see the module doc); one registry transaction for all of them."""
        admitted = self._admit(len(requests))
        results: list[JoinResult | None] = [None] * len(requests)
        for index in range(admitted, len(requests)):
            results[index] = JoinResult(JoinStatus.OVERLOADED)
        try:
            to_commit: list[tuple[int, Event]] = []
            for index, request in enumerate(requests[:admitted]):
                query = self.event_store.lookup(request.query_id)
                if query is None:
                    results[index] = JoinResult(JoinStatus.NOT_FOUND)
                    continue
                joined = self.adapter.join(query, request.click)
                if joined is None:
                    results[index] = JoinResult(JoinStatus.FILTERED)
                else:
                    to_commit.append((index, joined))
            calls = retries = 0
            if to_commit:
                claims = [requests[index].claim() for index, _ in to_commit]
                outcomes, calls, retries = self._commit(claims)
                none: list[CommitOutcome | None] = [None] * len(to_commit)
                for (index, joined), outcome in zip(to_commit, outcomes or none):
                    results[index] = self._result(requests[index], outcome, joined)
            return JoinBatch([r for r in results if r is not None], calls, len(to_commit), retries)
        finally:
            self._release(admitted)

    def decide_unjoinable(self, requests: Sequence[JoinRequest]) -> JoinBatch:
        """Register clicks the dispatcher gives up on, so that exactly one pipeline reports each
        (the requests carry unjoinable tokens). JOINED means this pipeline decided it; WASTED that
        another decided first (joined or unjoinable); RECLAIMED an earlier decision of its own."""
        outcomes, calls, retries = self._commit([request.claim() for request in requests])
        none: list[CommitOutcome | None] = [None] * len(requests)
        results = [self._result(request, outcome, None) for request, outcome in zip(requests, outcomes or none)]
        return JoinBatch(results, calls, len(requests), retries)

    def _commit(self, claims: list[Claim]) -> tuple[list[CommitOutcome] | None, int, int]:
        """(outcomes or None if the registry kept failing, transactions sent, retries). Every retry
        carries the same tokens: if an earlier try went through and only its reply was lost, the
        registry answers COMMITTED."""
        for attempt in range(1, self.commit_attempts + 1):
            try:
                return self.registry.commit_each(claims), attempt, attempt - 1
            except REGISTRY_FAILURES:
                if attempt < self.commit_attempts:
                    time.sleep(self.retry_pause_s * 2 ** (attempt - 1))
        return None, self.commit_attempts, self.commit_attempts - 1

    @staticmethod
    def _result(request: JoinRequest, outcome: CommitOutcome | None, joined: Event | None) -> JoinResult:
        if outcome is None:
            return JoinResult(JoinStatus.REGISTRY_UNAVAILABLE)
        if outcome.status is CommitStatus.COMMITTED:
            return JoinResult(JoinStatus.JOINED, joined, outcome.token)
        if outcome.status is CommitStatus.EXPIRED:
            return JoinResult(JoinStatus.EXPIRED)
        if claims_same_record(outcome.token, request.token.owner, request.record_id):
            return JoinResult(JoinStatus.RECLAIMED, joined, outcome.token)
        return JoinResult(JoinStatus.WASTED, None, outcome.token)


def describe_owner(token: Token | None) -> dict[str, Any] | None:
    """A token as JSON for output records."""
    return None if token is None else {"owner": token.owner, "attempt": token.attempt}
