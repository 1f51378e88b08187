"""mypy on millstream/ (clean, with the settings in pyproject.toml) and on what a user's code sees:
tests/typecheck/flows.py must type-check, and every line of tests/typecheck/wrong.py marked `# wrong`
must be refused (which also proves the API's types are not Any).

mypy runs as a subprocess from the project's root, so it reads [tool.mypy] and keeps its incremental
cache in .mypy_cache: ~20 s of CPU the first time, a few seconds after that."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = os.path.join("tests", "typecheck")


def mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy", reason="mypy is in the test extras: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "mypy", *paths], cwd=ROOT_DIR, capture_output=True, text=True,
                          timeout=600)


def test_millstream_and_a_users_typed_code_pass_mypy() -> None:
    checked = mypy("millstream", os.path.join(CHECKS, "flows.py"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found" in checked.stdout


def test_mypy_refuses_each_wrongly_typed_use() -> None:
    path = os.path.join(CHECKS, "wrong.py")
    with open(os.path.join(ROOT_DIR, path)) as source:
        wrong = {n for n, line in enumerate(source, 1) if line.rstrip().endswith("# wrong")}
    assert len(wrong) >= 8
    checked = mypy(path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    # By file name: mypy's cache may report a file under the path it was first checked at.
    refused = {int(n) for n in re.findall(r"\bwrong\.py:(\d+): error:", checked.stdout)}
    assert refused == wrong, checked.stdout
