"""The IdRegistry on a SQL database, written once for every backend.

A backend (SQLite, PostgreSQL) supplies connections and a handful of per-shard statements
(`ShardTransaction`); this module supplies the semantics: routing by the sharding entry in force at an
id's event time, first writer wins inside a batch, the GC boundary, the rules of resharding and the
locking that keeps a reshard from racing a commit.

Locking, in words: every transaction first reads the registry's one metadata row (sharding
configuration and GC boundary). Commits read it with a *shared* lock, reshard and GC with an
*exclusive* one, so a reshard waits for the commits that routed ids with the old configuration, and
a commit that starts after a reshard routes with the new one. Lookups need no lock: a reshard only
adds an entry starting after every registered id, so it never moves an id that exists.
"""

from __future__ import annotations

import abc
import enum
import threading
import time
import weakref
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from millstream.photon.clock import Clock
from millstream.photon.registry import (RETIRED_PREFIX, Claim, CommitOutcome, DeleteStatus, GcResult, IdRegistry,
                                        LookupResult, OwnerRetired, OwnerRoot, RegistryError, ReshardRefused,
                                        ShardingConfig, ShardingEntry, Token, first_live_claims,
                                        next_sharding_entry, resolve_batch)

T = TypeVar("T")
C = TypeVar("C")


class LockMode(enum.Enum):
    """How a transaction holds the metadata row."""

    READ = "read"  # read-only, no lock (lookups)
    SHARED = "shared"  # writes (commits, deletes, heartbeats): the configuration may not change under them
    EXCLUSIVE = "exclusive"  # reshard and moving the GC boundary


@dataclass(frozen=True)
class RegistryMeta:
    sharding: ShardingConfig
    gc_boundary_ms: int


class ShardTransaction(abc.ABC):
    """The statements a backend runs inside one open transaction."""

    @abc.abstractmethod
    def read_meta(self) -> RegistryMeta:
        """Read the metadata row, taking the lock the transaction's LockMode asks for."""

    @abc.abstractmethod
    def write_meta(self, meta: RegistryMeta) -> None: ...

    @abc.abstractmethod
    def create_shard(self, shard: int) -> None:
        """Create shard table `shard` if it does not exist."""

    @abc.abstractmethod
    def claim(self, shard: int, claims: Sequence[Claim]) -> dict[str, Token]:
        """Insert each claim whose id is absent; return the owner of every claimed id afterwards.

        `claims` have distinct ids, sorted by id: taking row locks in one global order keeps
        concurrent batches from deadlocking.
        """

    @abc.abstractmethod
    def find(self, shard: int, ids: Sequence[str]) -> dict[str, Token]:
        """The owners of those `ids` that are registered in `shard`."""

    @abc.abstractmethod
    def delete_owned(self, shard: int, click_id: str, token: Token) -> DeleteStatus:
        """Delete the id if `token` owns it: DELETED, NOT_FOUND or OWNED_BY_OTHER."""

    @abc.abstractmethod
    def latest_event_time(self, shard: int) -> int | None: ...

    @abc.abstractmethod
    def delete_older_than(self, shard: int, boundary_ms: int, limit: int) -> int:
        """Delete at most `limit` of the shard's ids older than `boundary_ms`; how many went."""

    @abc.abstractmethod
    def touch_owner(self, owner: str, now_ms: int) -> None: ...

    @abc.abstractmethod
    def owner_last_seen(self, owner: str) -> int | None: ...

    @abc.abstractmethod
    def now_ms(self) -> int:
        """The database's own clock (ms since the epoch)."""

    @abc.abstractmethod
    def bind_owner(self, owner: str, root: OwnerRoot) -> OwnerRoot:
        """Insert (owner, root) unless the owner has a row; return the owner's root afterwards."""


class _ConnectionHolder(Generic[C]):
    """Owns one thread's connection and closes it when the thread ends (its thread-local is freed)
    or when the registry is closed, whichever comes first."""

    def __init__(self, connection: C, close: Callable[[C], None]) -> None:
        self.connection = connection
        self._close = close
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._close(self.connection)
            except Exception:  # closing a broken connection must not mask the caller's error
                pass

    def __del__(self) -> None:
        self.close()


class PerThreadConnections(Generic[C]):
    """One connection per thread: neither sqlite3 nor psycopg connections may run two transactions
    at once, and clients of a registry are typically many threads."""

    def __init__(self, connect: Callable[[], C], close: Callable[[C], None]) -> None:
        self._connect = connect
        self._close = close
        self._local = threading.local()
        self._all: "weakref.WeakSet[_ConnectionHolder[C]]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def get(self) -> C:
        holder: _ConnectionHolder[C] | None = getattr(self._local, "holder", None)
        if holder is None or holder._closed:
            if self._closed:
                raise RegistryError("the registry is closed")
            holder = _ConnectionHolder(self._connect(), self._close)
            self._local.holder = holder
            with self._lock:
                self._all.add(holder)
        return holder.connection

    def discard(self) -> None:
        """Drop this thread's connection (after an error that may have left it unusable)."""
        holder = getattr(self._local, "holder", None)
        if holder is not None:
            holder.close()
            self._local.holder = None

    def close_all(self) -> None:
        self._closed = True
        with self._lock:
            holders = list(self._all)
        for holder in holders:
            holder.close()


class ShardedSqlRegistry(IdRegistry):
    """`IdRegistry` semantics on top of a backend's `ShardTransaction`; see the module docstring.

    Subclasses implement `_transaction` and `_is_transient`.

    >>> import tempfile, os
    >>> from millstream.photon import SqliteRegistry
    >>> registry = SqliteRegistry(os.path.join(tempfile.mkdtemp(), "ids.db"), initial_shards=2)
    >>> isinstance(registry, ShardedSqlRegistry), registry.sharding().entries[-1].shard_count
    (True, 2)
    >>> registry.close()
    """

    # A transaction that fails with a transient error (deadlock, lock timeout, dropped connection)
    # is retried this many times in all. Retrying a commit is safe even when the failed attempt did
    # commit and only its reply was lost: the same token is told COMMITTED again.
    retry_attempts = 5
    # GC deletes a shard's ids behind the boundary this many per transaction: each deletion stays
    # well within a statement timeout, and holds the shard's rows only briefly.
    gc_delete_chunk = 50_000

    def __init__(self, clock: Clock | None = None) -> None:
        # Tests inject a clock; by default time is the database's own (see `now_ms`).
        self._injected_clock = clock

    def _now(self, txn: ShardTransaction) -> int:
        return self._injected_clock() if self._injected_clock is not None else txn.now_ms()

    @abc.abstractmethod
    def _transaction(self, mode: LockMode) -> AbstractContextManager[ShardTransaction]:
        """Open a transaction on this thread's connection; commit on normal exit, roll back on error."""

    @abc.abstractmethod
    def _is_transient(self, error: BaseException) -> bool:
        """Whether `error` is worth retrying the whole transaction for."""

    def _run(self, mode: LockMode, body: Callable[[ShardTransaction], T]) -> T:
        for attempt in range(1, self.retry_attempts + 1):
            try:
                with self._transaction(mode) as txn:
                    return body(txn)
            except Exception as error:
                if attempt == self.retry_attempts or not self._is_transient(error):
                    raise
            # Back off (50, 100, 200, 400 ms): a restarting server or a lock holder needs a moment.
            time.sleep(0.05 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    # ---- commits --------------------------------------------------------------------------------

    def commit_each(self, claims: Sequence[Claim]) -> list[CommitOutcome]:
        claims = list(claims)
        if not claims:
            return []

        def body(txn: ShardTransaction) -> list[CommitOutcome]:
            meta = txn.read_meta()
            # The fence: a retired owner's ids may already be re-injected, so it may register no more.
            # `retire` holds the metadata row exclusively, so this check and the retirement are ordered.
            for owner in sorted({claim.token.owner for claim in claims}):
                if txn.owner_last_seen(RETIRED_PREFIX + owner) is not None:
                    raise OwnerRetired(f"pipeline owner {owner!r} was retired by the verifier: the registry "
                                       "refuses its commits; start it under a new owner name with a new root")
            by_shard: dict[int, list[Claim]] = {}
            for claim in first_live_claims(claims, meta.gc_boundary_ms):
                shard = meta.sharding.shard_for(claim.click_id, claim.event_time_ms)
                by_shard.setdefault(shard, []).append(claim)
            owners: dict[str, Token] = {}
            for shard in sorted(by_shard):
                owners.update(txn.claim(shard, sorted(by_shard[shard], key=lambda c: c.click_id)))
            return resolve_batch(claims, meta.gc_boundary_ms, owners)

        return self._run(LockMode.SHARED, body)

    def lookup(self, ids: Mapping[str, int]) -> dict[str, LookupResult]:
        ids = dict(ids)
        if not ids:
            return {}

        def body(txn: ShardTransaction) -> dict[str, LookupResult]:
            meta = txn.read_meta()
            results: dict[str, LookupResult] = {}
            by_shard: dict[int, list[str]] = {}
            for click_id, event_time_ms in ids.items():
                if event_time_ms < meta.gc_boundary_ms:
                    results[click_id] = LookupResult(registered=False, token=None, expired=True)
                else:
                    by_shard.setdefault(meta.sharding.shard_for(click_id, event_time_ms), []).append(click_id)
            for shard, shard_ids in sorted(by_shard.items()):
                found = txn.find(shard, shard_ids)
                for click_id in shard_ids:
                    token = found.get(click_id)
                    results[click_id] = LookupResult(registered=token is not None, token=token, expired=False)
            return results

        return self._run(LockMode.READ, body)

    def delete(self, click_id: str, token: Token, event_time_ms: int) -> DeleteStatus:
        def body(txn: ShardTransaction) -> DeleteStatus:
            meta = txn.read_meta()
            if event_time_ms < meta.gc_boundary_ms:
                return DeleteStatus.EXPIRED
            return txn.delete_owned(meta.sharding.shard_for(click_id, event_time_ms), click_id, token)

        return self._run(LockMode.SHARED, body)

    # ---- liveness -------------------------------------------------------------------------------

    def heartbeat(self, owner: str) -> None:
        # Stamped with the database's clock, not the client's: a client whose clock is behind must
        # not look silent to the verifier, which measures silence with the same database clock.
        self._run(LockMode.SHARED, lambda txn: txn.touch_owner(owner, self._now(txn)))

    def owner_last_seen(self, owner: str) -> int | None:
        return self._run(LockMode.READ, lambda txn: txn.owner_last_seen(owner))

    def now_ms(self) -> int:
        return self._run(LockMode.READ, self._now)

    def retire(self, owner: str) -> None:
        def body(txn: ShardTransaction) -> None:
            txn.read_meta()  # exclusive: waits for commits in flight, and later commits see the mark
            txn.touch_owner(RETIRED_PREFIX + owner, self._now(txn))

        self._run(LockMode.EXCLUSIVE, body)

    def bind_owner(self, owner: str, root: OwnerRoot) -> OwnerRoot:
        return self._run(LockMode.SHARED, lambda txn: txn.bind_owner(owner, root))

    # ---- configuration --------------------------------------------------------------------------

    def reshard(self, shard_count: int, safety_margin_ms: int) -> ShardingEntry:
        def body(txn: ShardTransaction) -> ShardingEntry:
            meta = txn.read_meta()
            entry = next_sharding_entry(meta.sharding, shard_count, self._now(txn), safety_margin_ms)
            # The exclusive lock keeps commits out, so this check and the new entry are atomic: no id
            # routed by the old entry can have an event time the new entry covers.
            in_force = meta.sharding.entries[-1]
            latest = [txn.latest_event_time(shard) for shard in range(in_force.shard_count)]
            newest = max((t for t in latest if t is not None), default=None)
            if newest is not None and newest >= entry.effective_from_ms:
                raise ReshardRefused(
                    f"an id with event time {newest} is registered, at or after the new entry's start "
                    f"{entry.effective_from_ms}; use a larger safety margin")
            for shard in range(shard_count):
                txn.create_shard(shard)
            txn.write_meta(RegistryMeta(ShardingConfig(meta.sharding.entries + (entry,)), meta.gc_boundary_ms))
            return entry

        return self._run(LockMode.EXCLUSIVE, body)

    def sharding(self) -> ShardingConfig:
        return self._run(LockMode.READ, lambda txn: txn.read_meta().sharding)

    def gc(self, older_than_ms: int) -> GcResult:
        def move_boundary(txn: ShardTransaction) -> RegistryMeta:
            meta = txn.read_meta()
            if older_than_ms > meta.gc_boundary_ms:
                meta = RegistryMeta(meta.sharding, older_than_ms)
                txn.write_meta(meta)
            return meta

        # First the boundary, under the exclusive lock: from then on every commit answers EXPIRED
        # behind it. The rows behind it can then go in ordinary transactions, one shard at a time,
        # without holding commits up for the whole deletion.
        meta = self._run(LockMode.EXCLUSIVE, move_boundary)
        deleted, chunk = 0, self.gc_delete_chunk
        for shard in range(meta.sharding.max_shard_count):
            def delete_behind(txn: ShardTransaction, shard: int = shard) -> int:
                return txn.delete_older_than(shard, meta.gc_boundary_ms, chunk)

            while True:
                gone = self._run(LockMode.SHARED, delete_behind)
                deleted += gone
                if gone < chunk:
                    break
        return GcResult(meta.gc_boundary_ms, deleted)

    def gc_boundary(self) -> int:
        return self._run(LockMode.READ, lambda txn: txn.read_meta().gc_boundary_ms)


def meta_from_row(row: Sequence[Any], cache: dict[str, ShardingConfig]) -> RegistryMeta:
    """Decode (sharding json, gc boundary), parsing a configuration text once per process."""
    text, boundary = row[0], int(row[1])
    config = cache.get(text)
    if config is None:
        config = ShardingConfig.from_json(text)
        cache.clear()  # only the newest configuration is worth keeping
        cache[text] = config
    return RegistryMeta(config, boundary)
