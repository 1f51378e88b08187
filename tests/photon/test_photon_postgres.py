"""PostgreSQL specifics: credentials never leak, and come from the environment when not in the DSN."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from millstream.photon import Claim, PostgresRegistry, RegistryError, Token, open_registry, redact_dsn


def test_repr_and_connection_errors_never_show_the_password(postgres_server):
    secret = postgres_server.password
    with PostgresRegistry(postgres_server.dsn(), namespace="t_repr") as registry:
        assert secret not in repr(registry) and str(postgres_server.port) in repr(registry)
        registry.drop()
    wrong = postgres_server.dsn().replace(secret, secret[::-1])
    with pytest.raises(RegistryError) as error:
        PostgresRegistry(wrong, namespace="t_wrong")
    message = "".join(str(e) for e in (error.value, error.value.__cause__, error.value.__context__) if e)
    assert "password authentication failed" in message  # the cause is still told
    assert secret not in message and secret[::-1] not in message
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_the_password_may_come_from_the_environment(postgres_server, monkeypatch):
    dsn = postgres_server.dsn(with_password=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(RegistryError):
        open_registry(dsn, namespace="t_env")
    monkeypatch.setenv("PGPASSWORD", postgres_server.password)
    with open_registry(dsn, namespace="t_env") as registry:
        assert registry.commit([Claim("x", Token("j", "1"), 1)])["x"].committed
        assert isinstance(registry, PostgresRegistry)
        registry.drop()


def test_redaction_of_dsn_forms():
    assert redact_dsn("postgresql://u:pw@h:1/d?sslmode=disable") == "postgresql://u@h:1/d"
    assert "pw" not in redact_dsn("host=h password=pw")
    assert "pw" not in redact_dsn("postgresql://u:pw@h:1/d 'unterminated")


def test_namespace_must_be_a_plain_identifier(postgres_server):
    with pytest.raises(ValueError):
        PostgresRegistry(postgres_server.dsn(), namespace='x"; DROP TABLE y; --')


def test_a_registry_survives_a_server_restart():
    """Connections cut by a restart are replaced and the transaction retried, not reported."""
    from millstream.photon.localpg import LocalPostgres

    with LocalPostgres(settings={"fsync": "off"}) as server:
        with PostgresRegistry(server.dsn(), namespace="t_restart") as registry:
            assert registry.commit([Claim("before", Token("j", "1"), 1)])["before"].committed
            server.restart()
            assert registry.commit([Claim("after", Token("j", "1"), 1)])["after"].committed
            assert registry.lookup({"before": 1, "after": 1})["before"].registered


def _commit_in_thread(registry, claim):
    """Start registry.commit_each([claim]) on a thread; the thread's outcome lands in the dict returned."""
    outcome: dict = {}

    def commit():
        try:
            outcome["result"] = registry.commit_each([claim])
        except BaseException as error:  # noqa: BLE001 - the test inspects what the call raised
            outcome["error"] = error

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    return thread, outcome


def test_a_lock_held_elsewhere_fails_the_call_in_bounded_time(postgres_server):
    """A session (a DBA's, another tool's) holding the registry's tables locked made every commit wait
    for ever: the dispatcher's step never ended. The server's statement timeout now ends each attempt,
    and the call fails as a registry failure the dispatcher retries later."""
    import psycopg

    from millstream.photon.joiner import REGISTRY_FAILURES

    with PostgresRegistry(postgres_server.dsn(), namespace="t_locked", statement_timeout_s=1) as registry:
        with psycopg.connect(postgres_server.dsn()) as holder:
            holder.execute('LOCK TABLE "t_locked_meta" IN ACCESS EXCLUSIVE MODE')  # held until the rollback
            started = time.monotonic()
            thread, outcome = _commit_in_thread(registry, Claim("held", Token("j", "1"), 1))
            thread.join(30)
            waited = time.monotonic() - started
            holder.rollback()
        thread.join(30)
        assert waited < 30, "the commit still waited for the lock after 30 s"
        assert isinstance(outcome.get("error"), REGISTRY_FAILURES), outcome
        assert registry.commit_each([Claim("free", Token("j", "1"), 1)])[0].committed  # the lock gone: on it goes
        registry.drop()


def test_a_server_process_that_stops_answering_is_cut_off_and_the_call_goes_on(postgres_server):
    """A server process that stops answering (stopped, or a peer lost without a reset) left the
    registry's call blocked on its socket for ever: the server's own timeout cannot fire in a
    process that does not run. The client's deadline cuts the connection; the retry opens a new one,
    served by another process, and the commit goes through."""
    import psycopg

    namespace = "t_stopped"
    with PostgresRegistry(postgres_server.dsn(), namespace=namespace, statement_timeout_s=1) as registry:
        assert registry.commit_each([Claim("first", Token("j", "1"), 1)])[0].committed  # this thread's connection
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
            pids = [row[0] for row in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"millstream-photon:{namespace}",))]
        assert pids, "the registry's connections name themselves (application_name)"
        stopped = []
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            started = time.monotonic()
            # The call runs on this thread's connection, served by a stopped process.
            outcome: dict = {}
            try:
                outcome["result"] = _run_with_alarm(lambda: registry.commit_each([Claim("next", Token("j", "1"), 1)]),
                                                    seconds=40)
            except BaseException as error:  # noqa: BLE001
                outcome["error"] = error
            waited = time.monotonic() - started
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        assert "error" not in outcome, outcome
        assert outcome["result"][0].committed
        assert waited < 20, f"the call took {waited:.1f} s"
        registry.drop()


class _Alarm(Exception):
    pass


def _run_with_alarm(call, seconds: int):
    """call(), interrupted by SIGALRM after `seconds` (so a test that hangs fails instead)."""
    def ring(signum, frame):
        raise _Alarm(f"still blocked after {seconds} s")

    before = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_gc_of_a_large_shard_stays_within_the_statement_timeout(postgres_server):
    """GC deleted a shard's ids behind the boundary in one statement, which the statement timeout
    ends on a large shard: the deletion failed, every retry again. It now deletes in bounded
    chunks, each its own transaction."""
    import psycopg

    namespace = "t_gc_large"
    with PostgresRegistry(postgres_server.dsn(), namespace=namespace, initial_shards=1,
                          statement_timeout_s=0.05) as registry:
        registry.gc_delete_chunk = 5_000
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as loader:
            loader.execute(f'INSERT INTO "{namespace}_shard_0" '
                           "SELECT 'click-' || n, %s, n FROM generate_series(1, 400000) n", (Token("j", "1").encode(),))
        result = registry.gc(300_001)
        assert (result.boundary_ms, result.deleted) == (300_001, 300_000)
        left = registry.lookup({"click-300000": 300_000, "click-300001": 300_001, "click-400000": 400_000})
        assert [left[c].registered for c in ("click-300001", "click-400000")] == [True, True]
        registry.drop()
