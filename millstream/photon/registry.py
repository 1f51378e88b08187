"""The IdRegistry contract: what every backend promises, and the rules they all share.

Photon's IdRegistry is the one piece of state that redundant pipelines share. A joiner may emit a
joined click only after the registry accepted that click's id with the joiner's token; every other
attempt on the same id is refused. This module holds the value types of that conversation, the
timestamp-based sharding configuration, the first-writer-wins resolution of one batch, and the
abstract `IdRegistry` that the SQLite and PostgreSQL backends (and the batching front end) implement.
"""

from __future__ import annotations

import abc
import bisect
import enum
import json
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from millstream.model.records import BEGINNING_OF_TIME
from millstream.photon.clock import wall_clock_ms

RETIRED_PREFIX = "retired:"
"""The owners-table row `retired:<owner>` marks `owner` as retired (see liveness.py)."""


class OwnerRetired(RuntimeError):
    """The pipeline's owner name was retired by the verifier; start it under a new name and root.

    Not a RegistryError on purpose: the joiner retries registry failures, and this must stop the
    pipeline instead (a retired owner's click ids may already have been re-injected)."""


class RegistryError(Exception):
    """A registry operation failed; nothing in the message reveals credentials."""


class ReshardRefused(RegistryError):
    """A resharding entry was refused because it could route an already registered id elsewhere."""


@dataclass(frozen=True)
class OwnerRoot:
    """The pipeline root an owner name is bound to (see millstream.photon.ownership): `root_id` is
    what tells roots apart (made at a root's first start, kept in it); `location` is where that root
    was, for messages only."""

    root_id: str
    location: str


@dataclass(frozen=True, slots=True)
class Token:
    """Who committed a click id: the joiner (`owner`) and which attempt of it.

    A joiner that lost the reply to a commit retries with the same token and is told COMMITTED; any
    other token is told ALREADY_JOINED. `owner` is what the verifier checks for liveness.

    >>> Token("joiner-7", "a1").encode()
    '["joiner-7","a1"]'
    >>> Token.decode('["joiner-7","a1"]')
    Token(owner='joiner-7', attempt='a1')
    """

    owner: str
    attempt: str
    _encoded: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # JSON keeps the encoding unambiguous whatever characters owner and attempt contain, and
        # equal tokens always encode to equal strings, which is what the database compares. Computed
        # once: a joiner sends the same token with every claim of an attempt.
        object.__setattr__(self, "_encoded", json.dumps([self.owner, self.attempt], separators=(",", ":"),
                                                        ensure_ascii=False))

    def encode(self) -> str:
        return self._encoded

    @classmethod
    def decode(cls, text: str) -> "Token":
        owner, attempt = json.loads(text)
        return cls(owner, attempt)


@dataclass(frozen=True, slots=True)
class Claim:
    """A request to register `click_id` (whose event time is `event_time_ms`) for `token`.

    >>> Claim("click-1", Token("j", "1"), 1_700_000_000_000).click_id
    'click-1'
    """

    click_id: str
    token: Token
    event_time_ms: int


class CommitStatus(str, enum.Enum):
    """The answer to one claim."""

    COMMITTED = "committed"
    """The id is registered with the claim's token: it was absent, or this is a retry of the same token."""
    ALREADY_JOINED = "already_joined"
    """Another token registered the id first: the caller must drop the click (a wasted join)."""
    EXPIRED = "expired"
    """The event time is behind the garbage-collection boundary: the registry can no longer tell
    whether the id was joined, so the caller must skip the click and never count it."""


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """The status of one claim and the token that owns the id (None when EXPIRED).

    >>> CommitOutcome(CommitStatus.ALREADY_JOINED, Token("other", "1")).committed
    False
    """

    status: CommitStatus
    token: Token | None

    @property
    def committed(self) -> bool:
        return self.status is CommitStatus.COMMITTED


@dataclass(frozen=True, slots=True)
class LookupResult:
    """What the registry knows about one id, for the dispatcher's lookup before dispatch.

    >>> LookupResult(registered=False, token=None, expired=True).expired
    True
    """

    registered: bool
    token: Token | None
    expired: bool


class DeleteStatus(str, enum.Enum):
    """The answer to `IdRegistry.delete`."""

    DELETED = "deleted"
    NOT_FOUND = "not_found"
    OWNED_BY_OTHER = "owned_by_other"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class GcResult:
    """The boundary in force after a garbage collection and how many ids it deleted."""

    boundary_ms: int
    deleted: int


@dataclass(frozen=True, slots=True)
class ShardingEntry:
    """From `effective_from_ms` on (event time), ids are spread over `shard_count` shards."""

    effective_from_ms: int
    shard_count: int


def shard_of(click_id: str, shard_count: int) -> int:
    """The shard of `click_id` among `shard_count` shards; stable across processes and machines
    (Python's own `hash` of a string is salted per process, so it cannot be used here)."""
    return zlib.crc32(click_id.encode("utf-8")) % shard_count


@dataclass(frozen=True)
class ShardingConfig:
    """The paper's timestamp-based sharding configuration, stored in the registry itself.

    An id is routed with the entry in force at its *event time*, never with the newest entry, so an
    id keeps its shard however often the registry is resharded afterwards.

    >>> config = ShardingConfig((ShardingEntry(BEGINNING_OF_TIME, 2), ShardingEntry(1_000, 5)))
    >>> config.entry_at(999).shard_count, config.entry_at(1_000).shard_count
    (2, 5)
    >>> config.shard_for("click-1", 999) == shard_of("click-1", 2)
    True
    """

    entries: tuple[ShardingEntry, ...]
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.entries or self.entries[0].effective_from_ms != BEGINNING_OF_TIME:
            raise ValueError("the first sharding entry must be in force from the beginning of time")
        starts = [entry.effective_from_ms for entry in self.entries]
        if any(later <= earlier for earlier, later in zip(starts, starts[1:])):
            raise ValueError("sharding entries must have strictly increasing effective times")
        if any(entry.shard_count < 1 for entry in self.entries):
            raise ValueError("a shard count must be at least 1")
        object.__setattr__(self, "_starts", tuple(starts))  # routing runs once per claim

    def entry_at(self, event_time_ms: int) -> ShardingEntry:
        # Times before the first entry's start (the beginning of time) are behind any GC boundary and
        # never routed; max() only keeps them from wrapping round to the last entry.
        return self.entries[max(bisect.bisect_right(self._starts, event_time_ms) - 1, 0)]

    def shard_for(self, click_id: str, event_time_ms: int) -> int:
        return shard_of(click_id, self.entry_at(event_time_ms).shard_count)

    @property
    def max_shard_count(self) -> int:
        """Shards numbered below this may hold ids (shard tables are shared between entries)."""
        return max(entry.shard_count for entry in self.entries)

    def to_json(self) -> str:
        return json.dumps([[e.effective_from_ms, e.shard_count] for e in self.entries])

    @classmethod
    def from_json(cls, text: str) -> "ShardingConfig":
        return cls(tuple(ShardingEntry(int(start), int(count)) for start, count in json.loads(text)))

    @classmethod
    def initial(cls, shard_count: int) -> "ShardingConfig":
        return cls((ShardingEntry(BEGINNING_OF_TIME, shard_count),))


def next_sharding_entry(config: ShardingConfig, shard_count: int, now_ms: int,
                        safety_margin_ms: int) -> ShardingEntry:
    """The entry `reshard` would add at `now_ms`, or ValueError/ReshardRefused if it may not.

    The entry takes effect at now + margin: the margin must cover how far ahead of the registry's clock
    the event times of ids being committed may be (the paper's S). The caller must additionally check
    that no registered id has an event time at or after the new entry's start.
    """
    if shard_count < 1:
        raise ValueError("a shard count must be at least 1")
    if safety_margin_ms < 0:
        raise ValueError("a negative safety margin would apply the new configuration to the past")
    entry = ShardingEntry(now_ms + safety_margin_ms, shard_count)
    last = config.entries[-1]
    if entry.effective_from_ms <= last.effective_from_ms:
        raise ReshardRefused(
            f"an entry effective at {last.effective_from_ms} is already scheduled; a new one must start later")
    return entry


def resolve_batch(claims: Sequence[Claim], boundary_ms: int,
                  owners: Mapping[str, Token]) -> list[CommitOutcome]:
    """The outcome of each claim of one batch, in order, given who owns each id after the batch.

    `owners` maps every live id of the batch to the token that holds it once the batch's transaction
    has run: the token already stored, or for an id that was absent the token of the batch's first
    live claim on it (see `first_live_claims`). Claims behind `boundary_ms` are EXPIRED.
    """
    outcomes = []
    for claim in claims:
        if claim.event_time_ms < boundary_ms:
            outcomes.append(CommitOutcome(CommitStatus.EXPIRED, None))
            continue
        owner = owners[claim.click_id]
        status = CommitStatus.COMMITTED if owner == claim.token else CommitStatus.ALREADY_JOINED
        outcomes.append(CommitOutcome(status, owner))
    return outcomes


def first_live_claims(claims: Iterable[Claim], boundary_ms: int) -> list[Claim]:
    """The first claim on each id that is not behind the GC boundary: what a batch must write.

    De-duplicating first is what makes "first writer inside a batch wins" hold, and it is required by
    PostgreSQL, whose INSERT ... ON CONFLICT DO UPDATE may not touch one row twice in one statement.
    """
    first: dict[str, Claim] = {}
    for claim in claims:
        if claim.event_time_ms >= boundary_ms and claim.click_id not in first:
            first[claim.click_id] = claim
    return list(first.values())


class IdRegistry(abc.ABC):
    """The registry every Photon pipeline shares: each click id is committed by exactly one token.

    Backends: `SqliteRegistry` (embedded, one file, several processes) and `PostgresRegistry`; wrap
    either in `BatchingRegistry` for server-side batching. Open one from a URL with `open_registry`.

    >>> import tempfile, os
    >>> from millstream.photon import open_registry
    >>> registry = open_registry("sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db"))
    >>> mine, theirs = Token("joiner-a", "1"), Token("joiner-b", "1")
    >>> registry.commit([Claim("click-1", mine, 1_700_000_000_000)])["click-1"].status.value
    'committed'
    >>> registry.commit([Claim("click-1", theirs, 1_700_000_000_000)])["click-1"].token == mine
    True
    >>> registry.close()
    """

    @abc.abstractmethod
    def commit_each(self, claims: Sequence[Claim]) -> list[CommitOutcome]:
        """Register the claims in one transaction; the outcome of each claim, in order.

        Inside the batch the first claim on an id wins: the same id twice with two tokens gives
        COMMITTED then ALREADY_JOINED; twice with the same token, COMMITTED twice. Raises OwnerRetired
        (refusing the whole batch) if the owner of any claim was retired (`retire`).
        """

    def commit(self, claims: Iterable[Claim]) -> dict[str, CommitOutcome]:
        """`commit_each` keyed by click id; an id claimed twice reports its first claim's outcome."""
        claims = list(claims)
        outcomes: dict[str, CommitOutcome] = {}
        for claim, outcome in zip(claims, self.commit_each(claims)):
            outcomes.setdefault(claim.click_id, outcome)
        return outcomes

    @abc.abstractmethod
    def lookup(self, ids: Mapping[str, int]) -> dict[str, LookupResult]:
        """What the registry knows of each id; `ids` maps click id -> event time (ms), which routes
        the id to its shard and tells whether it is behind the GC boundary."""

    @abc.abstractmethod
    def delete(self, click_id: str, token: Token, event_time_ms: int) -> DeleteStatus:
        """Unregister `click_id` only if `token` still owns it (the verifier's repair)."""

    @abc.abstractmethod
    def heartbeat(self, owner: str) -> None:
        """Record that `owner` is alive now."""

    @abc.abstractmethod
    def owner_last_seen(self, owner: str) -> int | None:
        """When `owner` last sent a heartbeat (ms, on the registry's clock: see `now_ms`), or None if never."""

    def now_ms(self) -> int:
        """The registry's own clock (ms): heartbeats are stamped with it and the verifier measures
        silence with it, so the clocks of the machines running pipelines and verifier do not matter.
        SQL backends read the database's clock; this default is the local wall clock."""
        return wall_clock_ms()

    def retire(self, owner: str) -> None:
        """Mark `owner` as retired for good: from then on `commit_each` refuses its claims with
        OwnerRetired (backends check the mark inside the commit's transaction)."""
        self.heartbeat(RETIRED_PREFIX + owner)

    @abc.abstractmethod
    def bind_owner(self, owner: str, root: OwnerRoot) -> OwnerRoot:
        """Bind `owner` to `root` if it is bound to no root yet; return the root it is bound to now.

        Atomic: of two first binds of one owner name, one wins and both are told the winner. A
        binding is never changed or removed (a new root needs a new owner name).
        """

    @abc.abstractmethod
    def reshard(self, shard_count: int, safety_margin_ms: int) -> ShardingEntry:
        """Spread ids with event time >= now + margin over `shard_count` shards; returns the new entry.

        Refused (ReshardRefused) if an id with event time at or after that instant is already
        registered, or if an entry starting later is already scheduled.
        """

    @abc.abstractmethod
    def sharding(self) -> ShardingConfig:
        """The sharding configuration in force."""

    @abc.abstractmethod
    def gc(self, older_than_ms: int) -> GcResult:
        """Move the GC boundary to `older_than_ms` (it never goes back) and delete ids behind it."""

    @abc.abstractmethod
    def gc_boundary(self) -> int:
        """Ids with event time below this are expired."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the registry's data stays."""

    def __enter__(self) -> "IdRegistry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ForwardingRegistry(IdRegistry):
    """A registry that wraps another and passes every call on to it; wrappers (batching, fault
    injection) override only what they change."""

    def __init__(self, backend: IdRegistry) -> None:
        self.backend = backend

    def commit_each(self, claims: Sequence[Claim]) -> list[CommitOutcome]:
        return self.backend.commit_each(claims)

    def lookup(self, ids: Mapping[str, int]) -> dict[str, LookupResult]:
        return self.backend.lookup(ids)

    def delete(self, click_id: str, token: Token, event_time_ms: int) -> DeleteStatus:
        return self.backend.delete(click_id, token, event_time_ms)

    def heartbeat(self, owner: str) -> None:
        self.backend.heartbeat(owner)

    def owner_last_seen(self, owner: str) -> int | None:
        return self.backend.owner_last_seen(owner)

    def now_ms(self) -> int:
        return self.backend.now_ms()

    def retire(self, owner: str) -> None:
        self.backend.retire(owner)

    def bind_owner(self, owner: str, root: OwnerRoot) -> OwnerRoot:
        return self.backend.bind_owner(owner, root)

    def reshard(self, shard_count: int, safety_margin_ms: int) -> ShardingEntry:
        return self.backend.reshard(shard_count, safety_margin_ms)

    def sharding(self) -> ShardingConfig:
        return self.backend.sharding()

    def gc(self, older_than_ms: int) -> GcResult:
        return self.backend.gc(older_than_ms)

    def gc_boundary(self) -> int:
        return self.backend.gc_boundary()

    def close(self) -> None:
        self.backend.close()


class OpenedOnFirstUse(ForwardingRegistry):
    """A registry opened by `open` at its first call, and at each call after while opening fails:
    a worker that starts while the registry is unreachable waits for it like any other outage
    (each call raises what opening raised: a registry failure, retried later) instead of failing
    its set-up.

    >>> import tempfile, os
    >>> from millstream.photon import open_registry
    >>> path, opened = os.path.join(tempfile.mkdtemp(), "ids.db"), []
    >>> registry = OpenedOnFirstUse(lambda: opened.append(1) or open_registry("sqlite:///" + path))
    >>> opened
    []
    >>> registry.lookup({"c1": 1})["c1"].registered, opened
    (False, [1])
    >>> registry.close()
    """

    def __init__(self, open: Callable[[], IdRegistry]) -> None:  # noqa: A002 - the registry's open
        self._open = open
        self._backend: IdRegistry | None = None

    @property
    def backend(self) -> IdRegistry:
        if self._backend is None:
            self._backend = self._open()
        return self._backend

    @backend.setter
    def backend(self, registry: IdRegistry) -> None:
        self._backend = registry

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

