"""Fixtures of the Photon tests: our own PostgreSQL server, and one registry per backend.

`registry_target` is parametrized over both backends, so every test that uses it runs on SQLite and
on PostgreSQL. A target knows how to open the registry (in this process or in a worker process) and
how to read the shard tables directly, bypassing the registry, so tests can check where ids really
are.
"""

from __future__ import annotations

import os
import re
import sqlite3
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from millstream.photon import IdRegistry, open_registry
from millstream.photon.localpg import LocalPostgres, PostgresUnavailable


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    try:
        server = LocalPostgres(settings={
            # Durability is not under test here; the benchmark runs with PostgreSQL's defaults.
            "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            "max_connections": "200", "shared_buffers": "64MB"})
    except PostgresUnavailable as missing:
        pytest.skip(f"PostgreSQL tests need the server binaries: {missing}")
    server.start()
    yield server
    server.stop()


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


@pytest.fixture(params=["sqlite", "postgres"])
def registry_target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[RegistryTarget]:
    if request.param == "sqlite":
        yield RegistryTarget("sqlite", "sqlite:///" + os.path.join(str(tmp_path), "registry.db"))
        return
    server: LocalPostgres = request.getfixturevalue("postgres_server")
    target = RegistryTarget("postgres", server.dsn(), {"namespace": f"t_{uuid.uuid4().hex[:12]}"})
    yield target
    from millstream.photon import PostgresRegistry

    registry = target.open()
    assert isinstance(registry, PostgresRegistry)
    registry.drop()
    registry.close()
