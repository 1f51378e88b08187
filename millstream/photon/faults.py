"""Faults Photon must survive, injected where they hurt: at the registry commit of a join.

`PhotonFaults` travels with the dispatcher (it is part of a pipeline's spec) and wraps the registry the
joiner commits through:

- `lose_reply_every=n`: every n-th commit call of a process goes through, then its reply is lost (the
  caller sees `CommitTimeout`). The joiner must retry with the same token and be told COMMITTED; a
  joiner that made a new token would be refused and lose the click.
- `die_after_commit=n`: the n-th commit call of a process goes through, then the pipeline dies before
  anything of the micro-batch is written: the click ids are registered to it, the joined events
  exist nowhere. On Spark the whole pipeline is SIGKILLed (its driver's process group, which holds
  the JVM, and the Spark worker's own group); in the in-process harness `PipelineDied` is raised.
- `die_when=path`: the same, at the first commit call after the file `path` appears that registered
  at least one click id (a death after a commit that registered nothing would leave nothing to
  repair); a demo or a test arms it at the moment it chooses.

Each fault that fires appends one JSON line to `record_to` (if given): which fault, which click ids,
the process, so a test can check that the fault really happened and where.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from millstream.photon.batching import CommitTimeout
from millstream.photon.registry import Claim, CommitOutcome, ForwardingRegistry, IdRegistry


class PipelineDied(RuntimeError):
    """Raised in place of killing the process when no process group is given (in-process tests).

    >>> isinstance(PipelineDied("after commit"), RuntimeError)
    True
    """


@dataclass(frozen=True)
class PhotonFaults:
    """Which faults to inject (all off by default); see the module doc.

    >>> PhotonFaults(lose_reply_every=5).active, PhotonFaults().active
    (True, False)
    """

    lose_reply_every: int = 0
    die_after_commit: int = 0
    die_when: str | None = None
    kill_process_group: int | None = None  # the pipeline driver's process group (Spark runs)
    record_to: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.lose_reply_every or self.die_after_commit or self.die_when)

    @property
    def dies(self) -> bool:
        return bool(self.die_after_commit or self.die_when)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "PhotonFaults":
        return cls(**dict(data or {}))

    def wrap(self, registry: IdRegistry) -> IdRegistry:
        """`registry` as the joiner should see it: with the faults, if any."""
        return FaultyRegistry(registry, self) if self.active else registry


class FaultyRegistry(ForwardingRegistry):
    """An IdRegistry whose commits misbehave as `faults` say; everything else is passed through.

    >>> import tempfile, os
    >>> from millstream.photon import Token, open_registry
    >>> backend = open_registry("sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db"))
    >>> registry = PhotonFaults(lose_reply_every=1).wrap(backend)
    >>> claim = Claim("c-1", Token("photon-a", "1/clicks-1"), 1_700_000_000_000)
    >>> try:
    ...     registry.commit_each([claim])
    ... except CommitTimeout:
    ...     print("reply lost")
    reply lost
    >>> backend.commit_each([claim])[0].status.value   # it went through: the same token is told so
    'committed'
    >>> registry.close()
    """

    def __init__(self, backend: IdRegistry, faults: PhotonFaults) -> None:
        self.backend = backend
        self.faults = faults
        self._lock = threading.Lock()
        self._commits = 0

    def commit_each(self, claims: Sequence[Claim]) -> list[CommitOutcome]:
        outcomes = self.backend.commit_each(claims)
        with self._lock:
            self._commits += 1
            number = self._commits
        faults = self.faults
        if (faults.die_after_commit and number == faults.die_after_commit) or (
                faults.die_when is not None and any(o.committed for o in outcomes) and os.path.exists(faults.die_when)):
            self._record("die_after_commit", claims, outcomes)
            if faults.kill_process_group is not None:
                # The driver's group holds the driver and its JVM; Spark's Python daemon made a group
                # of its own for its workers, this process among them.
                os.killpg(faults.kill_process_group, signal.SIGKILL)
                os.killpg(os.getpgrp(), signal.SIGKILL)
            raise PipelineDied(f"injected fault: the pipeline died after registering {len(claims)} click ids")
        if faults.lose_reply_every and number % faults.lose_reply_every == 0:
            self._record("lose_reply", claims, outcomes)
            raise CommitTimeout(f"injected fault: the reply to a commit of {len(claims)} claims was lost")
        return outcomes

    def _record(self, fault: str, claims: Sequence[Claim], outcomes: Sequence[CommitOutcome]) -> None:
        if self.faults.record_to is None:
            return
        line = {"fault": fault, "pid": os.getpid(), "at_ms": time.time_ns() // 1_000_000,
                "committed": [c.click_id for c, o in zip(claims, outcomes) if o.committed],
                "tokens": [c.token.attempt for c in claims]}
        with open(self.faults.record_to, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()
            os.fsync(out.fileno())  # the kill follows at once



def read_fault_records(path: str) -> list[dict[str, Any]]:
    """The faults that fired, as recorded by `PhotonFaults(record_to=path)`."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
