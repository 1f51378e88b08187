"""Running millstream's commands as a user does: a subprocess, its exit code, its output, its time."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Callable, Sequence

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run(module: str, *args: str, cwd: str | None = None, timeout: float = 60) -> Ran:
    env = {**os.environ, "PYTHONPATH": ROOT_DIR, "COLUMNS": "120"}
    started = time.time()
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or ROOT_DIR, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Ran(done.returncode, done.stdout, done.stderr, time.time() - started)


def call(main: Callable[[Sequence[str]], int], *args: str, cwd: str | None = None) -> Ran:
    """A command's `main(argv)` in this process: the same exit code and output as the real command,
    without starting Python again (~0.5 s each). For the many variants of a refusal; the tests that
    prove the wiring (the entry point, a fresh interpreter, the exit status) run the real command.
    An exception that escapes `main` fails the test (the real command would print a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    here, path, modules = os.getcwd(), list(sys.path), set(sys.modules)
    started = time.time()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse's usage errors
                code = exit.code if isinstance(exit.code, int) else 1
    finally:
        os.chdir(here)
        sys.path[:] = path
        for name in set(sys.modules) - modules:  # user modules imported from cwd: not seen by the next call
            where = getattr(sys.modules[name], "__file__", None) or ""
            if cwd is not None and os.path.abspath(where).startswith(os.path.abspath(cwd) + os.sep):
                del sys.modules[name]
    return Ran(code, out.getvalue(), err.getvalue(), time.time() - started)


def assert_refused(ran: Ran, *phrases: str, within_s: float = 10.0) -> str:
    """Exit code 2, one line on stderr naming the problem, nothing else, quickly."""
    assert ran.code == 2, ran.output
    assert "Traceback" not in ran.output, ran.output
    lines = ran.error_lines()
    assert len(lines) == 1, ran.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    assert ran.seconds < within_s, f"took {ran.seconds:.1f} s"
    return lines[0]
