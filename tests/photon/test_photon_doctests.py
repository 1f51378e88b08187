"""The examples in the photon modules' docstrings run (PostgreSQL ones against the test server)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["adapter", "batching", "clock", "credentials", "dispatcher", "eventreader", "eventstore", "factory",
           "faults", "ids", "joiner", "liveness", "outputs", "ownership", "pipeline", "registry", "sharded",
           "sqlite_registry", "verifier"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(f"millstream.photon.{name}"))
    assert result.failed == 0


def test_postgres_docstring_examples(postgres_server):
    from millstream.photon import localpg, postgres_registry

    assert doctest.testmod(postgres_registry, extraglobs={"dsn": postgres_server.dsn()}).failed == 0
    assert doctest.testmod(localpg).failed == 0
