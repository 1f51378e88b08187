"""PostgreSQL specifics: credentials never leak, and come from the environment when not in the DSN."""

from __future__ import annotations

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
