"""Fault injection for the crash tests and the chaos command: kill the driver at a named moment.

Set MILLSTREAM_KILL_AT="<point>:<n>" (or "<point>@<computation>:<n>") and the driver SIGKILLs its
whole process group (itself, the JVM and its Python workers) the n-th time it reaches <point> (for that
computation). The points are the moments between two commits, where a crash hurts most:

- `staged`: a batch's output is staged, Spark has not committed it yet;
- `committed`: Spark has committed the batch, millstream has not published it yet;
- `published`: the batch is published, its sinks have not received it yet;
- `delivered`: a sink has received the batch, its progress is not recorded yet;
- `input-staged`: a DataFrame injector's micro-batch is staged, Spark has not committed it yet;
- `sink-staged` (JDBC sinks only, so not among the chaos command's `POINTS`): a batch is in the
  sink's staging table and the transaction that replaces it in the table has deleted the rows of an
  earlier delivery, not yet committed.

Nothing happens when the variable is not set.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

POINTS = ("staged", "committed", "published", "delivered", "input-staged")
_counts: dict[str, int] = {}
_lock = threading.Lock()


def _target() -> tuple[str, str | None, int] | None:
    spec = os.environ.get("MILLSTREAM_KILL_AT")
    if not spec:
        return None
    where, _, count = spec.partition(":")
    point, _, computation = where.partition("@")
    return point, computation or None, int(count or 1)


_TARGET = _target()


def reached(point: str, computation: str) -> None:
    """Mark that the driver reached `point` for `computation`; kill it here if this is the moment."""
    if _TARGET is None or _TARGET[0] != point or _TARGET[1] not in (None, computation):
        return
    with _lock:
        _counts[point] = _counts.get(point, 0) + 1
        if _counts[point] != _TARGET[2]:
            return
    sys.stderr.write(f"millstream fault injection: killing the driver at {point!r} of {computation!r} "
                     f"#{_TARGET[2]}\n")
    sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)
