"""Failures users can act on, told in one message instead of a Spark stack trace.

When a user's code fails under the `fail` policy (or a key extractor, or malformed input), the worker
that saw it writes the exact message to `errors/<computation>.json` under the root before the task
fails; the driver reads it when the query fails, so the message does not have to be dug out of Spark's
trace. The full trace still goes to errors.log.
"""

from __future__ import annotations

import re
import time
from typing import Any

from millstream.spark.storage import Storage


# Failures that say nothing about the pipeline (a machine too busy for a Python worker to connect back
# in time): the query is restarted from its checkpoint, a bounded number of times, after a pause that
# grows, since a rapid retry meets the same load.
_TRANSIENT = ("Python worker failed to connect back", "Timed out while waiting for the Python worker")
MAX_RESTARTS = 12
RESTART_BACKOFF_CAP_S = 20.0


def restart_after(error: Any, restarts_so_far: int) -> float | None:
    """Seconds to wait before restarting a query that failed with `error`, or None: do not restart."""
    if restarts_so_far >= MAX_RESTARTS or not any(p in str(error) for p in _TRANSIENT):
        return None
    return min(RESTART_BACKOFF_CAP_S, 0.5 * 2.0 ** (restarts_so_far + 1))


class MillstreamRunError(RuntimeError):
    """A computation's query failed; the message carries the user-level cause, not Spark's trace."""


def report_failure(root: str, computation: str, message: str) -> None:
    """Record a user-level failure for the driver to show (best effort)."""
    try:
        Storage(root).write_json(f"errors/{computation}.json", {"message": message, "time_ms": int(time.time() * 1000)})
    except Exception:
        pass


def reported_failure(root: str, computation: str, since_ms: int) -> str | None:
    """The failure reported for `computation` since `since_ms`, if any."""
    data: Any = Storage(root).read_json(f"errors/{computation}.json")
    if isinstance(data, dict) and data.get("time_ms", 0) >= since_ms:
        return str(data.get("message"))
    return None


_PYTHON_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Failed)): (.+)$")


def user_error_message(spark_message: str) -> str:
    """The last Python exception line of a Spark failure (the user's own error), else its first line."""
    lines = [line.strip() for line in spark_message.splitlines()]
    for line in reversed(lines):
        match = _PYTHON_ERROR.match(line)
        if match and not match.group(1).startswith(("Py4J", "Streaming", "Spark")):
            return f"{match.group(1)}: {match.group(2)}"
    return lines[0] if lines else spark_message
