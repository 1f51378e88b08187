"""The embedded IdRegistry: one SQLite file, shared by every thread and process on one machine.

Each shard is its own table in the file (`shard_0`, `shard_1`, ...). The file is in WAL mode, so
lookups read while a commit writes; every writing transaction starts with BEGIN IMMEDIATE, which takes
SQLite's single write lock up front: writers, in whatever process, run one at a time, and a commit's
read of the configuration and its inserts happen under that one lock.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from typing import Iterator, Sequence

from millstream.photon.clock import Clock
from millstream.photon.registry import Claim, DeleteStatus, OwnerRoot, ShardingConfig, Token
from millstream.photon.sharded import (LockMode, PerThreadConnections, RegistryMeta, ShardedSqlRegistry,
                                       ShardTransaction, meta_from_row)

_SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SqliteRegistry(ShardedSqlRegistry):
    """IdRegistry in a SQLite file: no server, several processes may open the same file.

    `synchronous="FULL"` (the default) syncs the WAL at every commit, so an id reported COMMITTED
    survives a power cut; "NORMAL" is faster and still never corrupts the file, but may lose the
    last commits on power loss (not on a process crash).

    >>> import tempfile, os
    >>> registry = SqliteRegistry(os.path.join(tempfile.mkdtemp(), "ids.db"), initial_shards=3)
    >>> claim = Claim("click-9", Token("joiner-a", "1"), 1_700_000_000_000)
    >>> registry.commit_each([claim, claim])[1].status.value
    'committed'
    >>> registry.lookup({"click-9": 1_700_000_000_000})["click-9"].registered
    True
    >>> registry.close()
    """

    def __init__(self, path: str | os.PathLike[str], *, initial_shards: int = 4, clock: Clock | None = None,
                 busy_timeout_s: float = 60.0, synchronous: str = "FULL") -> None:
        super().__init__(clock)
        if synchronous.upper() not in _SYNCHRONOUS_LEVELS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS_LEVELS}")
        self.path = os.fspath(path)
        if self.path in ("", ":memory:") or self.path.startswith("file::memory:"):
            raise ValueError(f"a SQLite registry needs the path of a file every pipeline opens, got {self.path!r}: "
                             "sqlite gives each connection of an empty path or :memory: a database of its own")
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ValueError(f"SQLite registry {self.path!r}: its directory {directory!r} does not exist")
        self._busy_timeout_s = busy_timeout_s
        self._synchronous = synchronous.upper()
        self._config_cache: dict[str, ShardingConfig] = {}
        self._connections: PerThreadConnections[sqlite3.Connection] = PerThreadConnections(
            self._connect, sqlite3.Connection.close)
        self._create_schema(initial_shards)

    def __repr__(self) -> str:
        return f"SqliteRegistry({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: the module issues no BEGIN of its own; we open every transaction
        # explicitly, choosing IMMEDIATE for writers. check_same_thread=False only so that close() and
        # the end of a thread may close it from elsewhere: each connection is used by one thread.
        connection = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None,
                                     check_same_thread=False)
        connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
        connection.execute(f"PRAGMA synchronous = {self._synchronous}")
        return connection

    def _create_schema(self, initial_shards: int) -> None:
        connection = self._connections.get()
        # WAL is a property of the file, so this is a no-op for every opener but the first.
        connection.execute("PRAGMA journal_mode = WAL")

        def body(txn: ShardTransaction) -> None:
            assert isinstance(txn, _SqliteTransaction)
            txn.connection.execute(
                "CREATE TABLE IF NOT EXISTS meta (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), "
                "sharding TEXT NOT NULL, gc_boundary_ms INTEGER NOT NULL)")
            txn.connection.execute(
                "CREATE TABLE IF NOT EXISTS owners (owner TEXT PRIMARY KEY, last_seen_ms INTEGER NOT NULL)")
            txn.connection.execute(
                "CREATE TABLE IF NOT EXISTS owner_roots (owner TEXT PRIMARY KEY, root_id TEXT NOT NULL, "
                "location TEXT NOT NULL)")
            row = txn.connection.execute("SELECT sharding, gc_boundary_ms FROM meta").fetchone()
            if row is None:
                config = ShardingConfig.initial(initial_shards)
                txn.connection.execute("INSERT INTO meta VALUES (1, ?, ?)",
                                       (config.to_json(), config.entries[0].effective_from_ms))
                for shard in range(initial_shards):
                    txn.create_shard(shard)

        self._run(LockMode.EXCLUSIVE, body)

    @contextmanager
    def _transaction(self, mode: LockMode) -> Iterator[ShardTransaction]:
        connection = self._connections.get()
        connection.execute("BEGIN" if mode is LockMode.READ else "BEGIN IMMEDIATE")
        try:
            yield _SqliteTransaction(connection, self._config_cache)
            connection.execute("COMMIT")
        except BaseException:
            # Also when COMMIT itself failed: the transaction is still open, and the retry's BEGIN
            # would fail inside it.
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise

    def _is_transient(self, error: BaseException) -> bool:
        # "database is locked" / "busy" after the busy timeout: another process held the write lock
        # for longer than we waited. Nothing was written, so the transaction can simply run again.
        return isinstance(error, sqlite3.OperationalError) and any(
            word in str(error).lower() for word in ("locked", "busy"))

    def close(self) -> None:
        self._connections.close_all()


def _table(shard: int) -> str:
    return f"shard_{int(shard)}"


class _SqliteTransaction(ShardTransaction):
    def __init__(self, connection: sqlite3.Connection, config_cache: dict[str, ShardingConfig]) -> None:
        self.connection = connection
        self._config_cache = config_cache

    def read_meta(self) -> RegistryMeta:
        # The lock was taken by BEGIN IMMEDIATE (writers) or is not needed (readers, which see a
        # snapshot of the file for the whole transaction).
        row = self.connection.execute("SELECT sharding, gc_boundary_ms FROM meta WHERE singleton = 1").fetchone()
        return meta_from_row(row, self._config_cache)

    def write_meta(self, meta: RegistryMeta) -> None:
        self.connection.execute("UPDATE meta SET sharding = ?, gc_boundary_ms = ? WHERE singleton = 1",
                                (meta.sharding.to_json(), meta.gc_boundary_ms))

    def create_shard(self, shard: int) -> None:
        table = _table(shard)
        # WITHOUT ROWID stores rows in the primary-key b-tree itself: one lookup per id, not two.
        self.connection.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (id TEXT PRIMARY KEY, token TEXT NOT NULL, "
            f"event_time_ms INTEGER NOT NULL) WITHOUT ROWID")
        self.connection.execute(f"CREATE INDEX IF NOT EXISTS {table}_event_time ON {table} (event_time_ms)")

    def find(self, shard: int, ids: Sequence[str]) -> dict[str, Token]:
        # json_each passes any number of ids as one parameter (no limit on bound variables).
        rows = self.connection.execute(
            f"SELECT id, token FROM {_table(shard)} WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(ids)),))
        return {click_id: Token.decode(token) for click_id, token in rows}

    def claim(self, shard: int, claims: Sequence[Claim]) -> dict[str, Token]:
        # We hold the database's write lock, so reading the owners and then inserting the absent ids
        # cannot interleave with any other writer.
        owners = self.find(shard, [claim.click_id for claim in claims])
        absent = [claim for claim in claims if claim.click_id not in owners]
        self.connection.executemany(
            f"INSERT INTO {_table(shard)} (id, token, event_time_ms) VALUES (?, ?, ?)",
            [(claim.click_id, claim.token.encode(), claim.event_time_ms) for claim in absent])
        owners.update((claim.click_id, claim.token) for claim in absent)
        return owners

    def delete_owned(self, shard: int, click_id: str, token: Token) -> DeleteStatus:
        owner = self.find(shard, [click_id]).get(click_id)
        if owner is None:
            return DeleteStatus.NOT_FOUND
        if owner != token:
            return DeleteStatus.OWNED_BY_OTHER
        self.connection.execute(f"DELETE FROM {_table(shard)} WHERE id = ?", (click_id,))
        return DeleteStatus.DELETED

    def latest_event_time(self, shard: int) -> int | None:
        row = self.connection.execute(f"SELECT max(event_time_ms) FROM {_table(shard)}").fetchone()
        return None if row[0] is None else int(row[0])

    def delete_older_than(self, shard: int, boundary_ms: int, limit: int) -> int:
        table = _table(shard)
        cursor = self.connection.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} "
                                         "WHERE event_time_ms < ? LIMIT ?)", (boundary_ms, limit))
        return cursor.rowcount

    def touch_owner(self, owner: str, now_ms: int) -> None:
        self.connection.execute(
            "INSERT INTO owners (owner, last_seen_ms) VALUES (?, ?) ON CONFLICT (owner) "
            "DO UPDATE SET last_seen_ms = max(last_seen_ms, excluded.last_seen_ms)", (owner, now_ms))

    def owner_last_seen(self, owner: str) -> int | None:
        row = self.connection.execute("SELECT last_seen_ms FROM owners WHERE owner = ?", (owner,)).fetchone()
        return None if row is None else int(row[0])

    def now_ms(self) -> int:
        # SQLite's 'now', in ms: SQLite has no server, so this is the clock of the machine this process
        # runs on (one clock while every user of the file runs on one machine).
        row = self.connection.execute("SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
                                      ).fetchone()
        return int(row[0])

    def bind_owner(self, owner: str, root: OwnerRoot) -> OwnerRoot:
        # Under the database's write lock: the insert and the read see no other writer in between.
        self.connection.execute("INSERT INTO owner_roots (owner, root_id, location) VALUES (?, ?, ?) "
                                "ON CONFLICT (owner) DO NOTHING", (owner, root.root_id, root.location))
        root_id, location = self.connection.execute(
            "SELECT root_id, location FROM owner_roots WHERE owner = ?", (owner,)).fetchone()
        return OwnerRoot(root_id, location)
