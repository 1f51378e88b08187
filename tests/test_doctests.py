"""The runnable examples in the public docstrings of the modules this suite owns."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

import millstream


def _modules_with_examples() -> list[str]:
    """Every millstream module whose source holds a docstring example (photon's are run by
    tests/photon/test_photon_doctests.py, some against a PostgreSQL server)."""
    package = pathlib.Path(millstream.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        if ">>> " in path.read_text() and not name.startswith("millstream.photon."):
            found.append(name)
    return found


MODULES = _modules_with_examples()


def test_the_modules_everyone_reads_first_are_among_them() -> None:
    assert {"millstream.core.watermarks", "millstream.model.pipeline", "millstream.joins",
            "millstream.testing.harness"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0
