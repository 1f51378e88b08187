"""The runnable examples in the public docstrings of the modules this suite owns."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "millstream.windows.assigners",
    "millstream.windows.aggregators",
    "millstream.windows.aggregate",
    "millstream.console.options",
    "millstream.console.progress",
    "millstream.console.datadir",
    "millstream.apps.dips",
    "millstream.apps.zeitgeist.report",
    "millstream.apps.photon.adapter",
    "millstream.apps.photon.generator",
    "millstream.apps.photon.report",
    "millstream.cli",
    "millstream.injectors.heuristic",
    "millstream.console.status",
    "millstream.spark.storage",
    "millstream.spark.session",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0
