"""The IdRegistry on PostgreSQL (psycopg 3).

Tables live in the connected database under a name prefix (`namespace`): `<ns>_meta` (one row: the
sharding configuration and the GC boundary), `<ns>_owners` (heartbeats), `<ns>_owner_roots` (the
pipeline root each owner name belongs to) and one table per shard, `<ns>_shard_<n>`. A batch is
claimed with one statement per shard it touches, in one transaction:

    INSERT INTO shard AS registry (id, token, event_time_ms)
    SELECT * FROM unnest(ids, tokens, times)
    ON CONFLICT (id) DO UPDATE SET token = registry.token WHERE registry.token = EXCLUDED.token
    RETURNING id

which returns exactly the ids that are the caller's (absent before, or already held by the same
token: the lost-reply retry). Credentials come from the DSN or libpq's environment (PGPASSWORD,
PGPASSFILE, ...) and never appear in a repr or an error raised here.

No call waits for ever. The server ends a statement after `statement_timeout_s` (a lock another
session holds, a slow disk) and a session idle inside a transaction for twice that (a client paused
while holding locks its peers wait for); a server process that does not run at all (stopped, or a
peer gone without a reset) cannot time itself out, so the client cuts a transaction's connection
after `transaction_deadline_s`. Each ends the attempt with an OperationalError: the transaction is
retried on a new connection, and a call that keeps failing is a registry failure the dispatcher
retries later.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from millstream.photon.clock import Clock
from millstream.photon.registry import Claim, DeleteStatus, OwnerRoot, RegistryError, ShardingConfig, Token
from millstream.photon.sharded import (LockMode, PerThreadConnections, RegistryMeta, ShardedSqlRegistry,
                                       ShardTransaction, meta_from_row)

if TYPE_CHECKING:
    import psycopg

_NAMESPACE = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def transaction_deadline_s(statement_timeout_s: float) -> float:
    """How long the client lets a transaction run before it cuts the connection: a transaction is a
    few statements, each of which the server ends at `statement_timeout_s`, so the server's own
    timeout, which leaves the connection usable, comes first whenever the server runs.

    >>> transaction_deadline_s(5.0)
    16.0
    """
    return 3 * statement_timeout_s + 1


class _Watchdog:
    """Cuts the socket of a connection whose transaction outlives `seconds` (the blocked call then
    fails as a dropped connection does). One thread per registry, started on first use and stopped
    by `close`; a cut never falls after the transaction's end (both hold the same lock).

    >>> import socket as s
    >>> ours, theirs = s.socketpair()
    >>> watchdog = _Watchdog(0.05)
    >>> with watchdog.watching(ours.fileno()):
    ...     ours.recv(1)  # blocked: the peer never sends
    b''
    >>> watchdog.close(); ours.close(); theirs.close()
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._watched: dict[int, tuple[float, int]] = {}  # id of the entry -> (deadline, socket's fd)
        self._next_entry = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def watching(self, fd: int) -> Iterator[None]:
        with self._changed:
            entry, self._next_entry = self._next_entry, self._next_entry + 1
            self._watched[entry] = (time.monotonic() + self._seconds, fd)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="registry-watchdog", daemon=True)
                self._thread.start()
            elif len(self._watched) == 1:
                self._changed.notify()  # the thread waits without a deadline while nothing is watched
        try:
            yield
        finally:
            with self._changed:
                self._watched.pop(entry, None)  # gone already if it was cut

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                for entry, (deadline, fd) in list(self._watched.items()):
                    if deadline <= now:
                        del self._watched[entry]
                        _cut(fd)
                earliest = min((deadline for deadline, _ in self._watched.values()), default=None)
                self._changed.wait(None if earliest is None else max(0.0, earliest - now))


def _cut(fd: int) -> None:
    """Shut the socket `fd` down both ways: a call blocked on it returns at once."""
    try:
        with socket.socket(fileno=os.dup(fd)) as peer:
            peer.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed: nothing to cut
        pass


def redact_dsn(dsn: str) -> str:
    """A DSN fit for messages: user, host, port and database only; never a password.

    >>> redact_dsn("postgresql://alice:s3cret@db.example:5433/clicks")
    'postgresql://alice@db.example:5433/clicks'
    >>> redact_dsn("host=db password=s3cret dbname=clicks")
    'postgresql://db/clicks'
    """
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        # The parser's own message quotes the string it could not parse, password included.
        return "postgresql://<unparseable DSN>"
    user = f"{params['user']}@" if params.get("user") else ""
    host = str(params.get("host") or "")
    port = f":{params['port']}" if params.get("port") else ""
    dbname = f"/{params['dbname']}" if params.get("dbname") else ""
    return f"postgresql://{user}{host}{port}{dbname}"


def _scrub(message: str, dsn: str) -> str:
    """`message` with any password of `dsn` blotted out (belt and braces: libpq does not quote it)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        return "(details withheld: the DSN could not be parsed)"
    return message.replace(str(password), "***") if password else message


class PostgresRegistry(ShardedSqlRegistry):
    """IdRegistry on a PostgreSQL server; many processes and machines may share it.

    `dsn` is a libpq connection string or URL, e.g. "postgresql://photon@127.0.0.1:5432/clicks" with the
    password in PGPASSWORD (the test suite runs this example against its own server).

    >>> registry = PostgresRegistry(dsn, namespace="doctest_pg", initial_shards=2)
    >>> registry.commit([Claim("c1", Token("j", "1"), 1_700_000_000_000)])["c1"].status.value
    'committed'
    >>> "password" in repr(registry) or (registry.namespace, registry.sharding().max_shard_count)
    ('doctest_pg', 2)
    >>> registry.drop(); registry.close()
    """

    def __init__(self, dsn: str, *, namespace: str = "photon", initial_shards: int = 4,
                 clock: Clock | None = None, connect_timeout_s: int = 10, statement_timeout_s: float = 5.0) -> None:
        super().__init__(clock)
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError("namespace must be lower-case letters, digits and underscores (at most 41)")
        if not statement_timeout_s > 0:
            raise ValueError(f"statement_timeout_s must be positive, got {statement_timeout_s!r}")
        self._dsn = dsn
        self.namespace = namespace
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_ms = max(1, round(statement_timeout_s * 1000))
        self._watchdog = _Watchdog(transaction_deadline_s(statement_timeout_s))
        self._config_cache: dict[str, ShardingConfig] = {}
        self._connections: PerThreadConnections["psycopg.Connection[Any]"] = PerThreadConnections(
            self._connect, lambda connection: connection.close())
        self._create_schema(initial_shards)

    def __repr__(self) -> str:
        return f"PostgresRegistry({redact_dsn(self._dsn)!r}, namespace={self.namespace!r})"

    def _connect(self) -> "psycopg.Connection[Any]":
        import psycopg

        try:
            # autocommit: transactions are opened explicitly by `_transaction`, so a connection is
            # never left idle inside a transaction holding locks.
            return psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout_s,
                                   application_name=f"millstream-photon:{self.namespace}",
                                   options=f"-c statement_timeout={self._statement_timeout_ms} "
                                           f"-c idle_in_transaction_session_timeout={2 * self._statement_timeout_ms}")
        except psycopg.Error as error:
            raise RegistryError(f"cannot connect to {redact_dsn(self._dsn)}: "
                                f"{_scrub(str(error), self._dsn)}") from None

    def _create_schema(self, initial_shards: int) -> None:
        ns = self.namespace

        def body(txn: ShardTransaction) -> None:
            assert isinstance(txn, _PostgresTransaction)
            # Serialise concurrent creators: CREATE TABLE IF NOT EXISTS alone can still fail with a
            # unique violation when two sessions create the same table at the same moment.
            txn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"millstream.photon.{ns}",))
            txn.execute(f'CREATE TABLE IF NOT EXISTS "{ns}_meta" (singleton integer PRIMARY KEY '
                        f"CHECK (singleton = 1), sharding text NOT NULL, gc_boundary_ms bigint NOT NULL)")
            txn.execute(f'CREATE TABLE IF NOT EXISTS "{ns}_owners" (owner text PRIMARY KEY, '
                        f"last_seen_ms bigint NOT NULL)")
            txn.execute(f'CREATE TABLE IF NOT EXISTS "{ns}_owner_roots" (owner text PRIMARY KEY, '
                        f"root_id text NOT NULL, location text NOT NULL)")
            if txn.execute(f'SELECT 1 FROM "{ns}_meta"').fetchone() is None:
                config = ShardingConfig.initial(initial_shards)
                txn.execute(f'INSERT INTO "{ns}_meta" VALUES (1, %s, %s)',
                            (config.to_json(), config.entries[0].effective_from_ms))
                for shard in range(initial_shards):
                    txn.create_shard(shard)

        self._run(LockMode.EXCLUSIVE, body)

    @contextmanager
    def _transaction(self, mode: LockMode) -> Iterator[ShardTransaction]:
        import psycopg

        connection = self._connections.get()
        try:
            with self._watchdog.watching(connection.fileno()), connection.transaction():
                yield _PostgresTransaction(connection, self.namespace, mode, self._config_cache)
        except psycopg.OperationalError:
            # The connection may be dead (server restart, network): the retry gets a new one.
            self._connections.discard()
            raise

    def _is_transient(self, error: BaseException) -> bool:
        import psycopg

        # Deadlocks cannot happen between our own batches (rows are locked in (shard, id) order)
        # but can with other writers; a dropped connection may have lost the reply to a commit that
        # did happen, which the token makes safe to retry.
        return isinstance(error, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure,
                                  psycopg.errors.LockNotAvailable, psycopg.OperationalError))

    def close(self) -> None:
        self._connections.close_all()
        self._watchdog.close()

    def drop(self) -> None:
        """Delete this namespace's tables (tests and benchmarks clean up with it)."""
        ns = self.namespace

        def body(txn: ShardTransaction) -> None:
            assert isinstance(txn, _PostgresTransaction)
            shard_tables = [row[0] for row in txn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE %s",
                (f"{ns}\\_shard\\_%",))]
            for table in [f"{ns}_meta", f"{ns}_owners", f"{ns}_owner_roots", *shard_tables]:
                txn.execute(f'DROP TABLE IF EXISTS "{table}"')

        self._run(LockMode.READ, body)


class _PostgresTransaction(ShardTransaction):
    def __init__(self, connection: "psycopg.Connection[Any]", namespace: str, mode: LockMode,
                 config_cache: dict[str, ShardingConfig]) -> None:
        self._connection = connection
        self._ns = namespace
        self._mode = mode
        self._config_cache = config_cache

    def execute(self, query: str, params: Sequence[Any] | None = None) -> "psycopg.Cursor[Any]":
        return self._connection.execute(query, params)

    def _table(self, shard: int) -> str:
        return f'"{self._ns}_shard_{int(shard)}"'

    def read_meta(self) -> RegistryMeta:
        # FOR SHARE / FOR UPDATE on the one metadata row is the registry's configuration lock (see
        # millstream.photon.sharded). In READ COMMITTED, a FOR SHARE that waited for a reshard returns
        # the row as the reshard left it, so the commit routes with the new configuration.
        lock = {LockMode.READ: "", LockMode.SHARED: " FOR SHARE", LockMode.EXCLUSIVE: " FOR UPDATE"}[self._mode]
        row = self.execute(f'SELECT sharding, gc_boundary_ms FROM "{self._ns}_meta" WHERE singleton = 1{lock}'
                           ).fetchone()
        if row is None:
            raise RegistryError(f"registry namespace {self._ns!r} has no metadata row")
        return meta_from_row(row, self._config_cache)

    def write_meta(self, meta: RegistryMeta) -> None:
        self.execute(f'UPDATE "{self._ns}_meta" SET sharding = %s, gc_boundary_ms = %s WHERE singleton = 1',
                     (meta.sharding.to_json(), meta.gc_boundary_ms))

    def create_shard(self, shard: int) -> None:
        table = self._table(shard)
        index = f'"{self._ns}_shard_{int(shard)}_event_time"'
        self.execute(f"CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, token text NOT NULL, "
                     f"event_time_ms bigint NOT NULL)")
        self.execute(f"CREATE INDEX IF NOT EXISTS {index} ON {table} (event_time_ms)")

    def find(self, shard: int, ids: Sequence[str]) -> dict[str, Token]:
        rows = self.execute(f"SELECT id, token FROM {self._table(shard)} WHERE id = ANY(%b)", (list(ids),))
        return {click_id: Token.decode(token) for click_id, token in rows}

    def claim(self, shard: int, claims: Sequence[Claim]) -> dict[str, Token]:
        # `claims` come sorted by id and unnest keeps array order, so rows are locked in one global
        # order by every batch. The no-op update on a same-token conflict is what makes the statement
        # return the id of a retry; a conflict with another token updates nothing and returns nothing.
        mine = {row[0] for row in self.execute(
            f"INSERT INTO {self._table(shard)} AS registry (id, token, event_time_ms) "
            f"SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[]) "
            f"ON CONFLICT (id) DO UPDATE SET token = registry.token WHERE registry.token = EXCLUDED.token "
            f"RETURNING id",
            # %b: binary parameters. In text format psycopg escapes every array element with a regex,
            # which costs more than the statement itself for batches of thousands.
            ([c.click_id for c in claims], [c.token.encode() for c in claims], [c.event_time_ms for c in claims]))}
        owners = {claim.click_id: claim.token for claim in claims if claim.click_id in mine}
        taken = [claim.click_id for claim in claims if claim.click_id not in mine]
        if taken:
            # ON CONFLICT locked these rows, so they are still there and still someone else's.
            owners.update(self.find(shard, taken))
        return owners

    def delete_owned(self, shard: int, click_id: str, token: Token) -> DeleteStatus:
        deleted = self.execute(f"DELETE FROM {self._table(shard)} WHERE id = %s AND token = %s RETURNING id",
                               (click_id, token.encode())).fetchone()
        if deleted is not None:
            return DeleteStatus.DELETED
        return DeleteStatus.OWNED_BY_OTHER if self.find(shard, [click_id]) else DeleteStatus.NOT_FOUND

    def latest_event_time(self, shard: int) -> int | None:
        row = self.execute(f"SELECT max(event_time_ms) FROM {self._table(shard)}").fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def delete_older_than(self, shard: int, boundary_ms: int, limit: int) -> int:
        table = self._table(shard)
        return self.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE event_time_ms < %s "
                            "LIMIT %s)", (boundary_ms, limit)).rowcount

    def touch_owner(self, owner: str, now_ms: int) -> None:
        self.execute(f'INSERT INTO "{self._ns}_owners" AS o (owner, last_seen_ms) VALUES (%s, %s) '
                     f"ON CONFLICT (owner) DO UPDATE SET last_seen_ms = GREATEST(o.last_seen_ms, "
                     f"EXCLUDED.last_seen_ms)", (owner, now_ms))

    def owner_last_seen(self, owner: str) -> int | None:
        row = self.execute(f'SELECT last_seen_ms FROM "{self._ns}_owners" WHERE owner = %s', (owner,)).fetchone()
        return None if row is None else int(row[0])

    def now_ms(self) -> int:
        # The server's clock (clock_timestamp: the moment of the call, not the transaction's start).
        row = self.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        return int(row[0])

    def bind_owner(self, owner: str, root: OwnerRoot) -> OwnerRoot:
        # A concurrent first bind makes the INSERT wait for it, then do nothing; the SELECT, a new
        # statement in READ COMMITTED, sees the row that won.
        self.execute(f'INSERT INTO "{self._ns}_owner_roots" (owner, root_id, location) VALUES (%s, %s, %s) '
                     f"ON CONFLICT (owner) DO NOTHING", (owner, root.root_id, root.location))
        row = self.execute(f'SELECT root_id, location FROM "{self._ns}_owner_roots" WHERE owner = %s',
                           (owner,)).fetchone()
        assert row is not None, owner  # inserted above, or by the bind that won; never deleted
        return OwnerRoot(str(row[0]), str(row[1]))
