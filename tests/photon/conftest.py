"""Fixtures of the Photon tests: our own PostgreSQL server, and one registry per backend.

`registry_target` is parametrized over both backends, so every test that uses it runs on SQLite and
on PostgreSQL. A target knows how to open the registry (in this process or in a worker process) and
how to read the shard tables directly, bypassing the registry, so tests can check where ids really
are.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pytest

from millstream.photon.localpg import LocalPostgres, PostgresUnavailable
from photon_support import RegistryTarget


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
