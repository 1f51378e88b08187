"""Running millstream's commands as a user does: a subprocess, its exit code, its output, its time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

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
