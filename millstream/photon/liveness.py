"""Who is alive: pipelines' heartbeats in the IdRegistry, and retiring a pipeline for good.

The verifier may delete a click id only when the pipeline whose token holds it is gone: a live
pipeline may still be about to publish the joined event. Each pipeline's driver therefore writes a
heartbeat for its owner name (its tokens' owner) every second (`OwnerHeartbeat`); an owner whose
last heartbeat is older than the verifier's timeout is presumed gone.

Heartbeats are stamped with the registry's own clock (`IdRegistry.now_ms`: the database's) and the
verifier measures silence with that same clock, so a skewed clock on a pipeline's or the verifier's
machine cannot make a live owner look gone.

Presumed is not enough on its own: a pipeline restarted on its old root publishes the micro-batches
Spark had committed before the crash, and those may hold joins of the ids the verifier deleted. So
the verifier *retires* an owner before touching its ids, and a pipeline refuses to start under a
retired owner name (`check_not_retired`): it must start again under a new name, on a new root. A
pipeline that is still running when its owner is retired (it was silent for the timeout, yet not
dead: a stalled process, a partition from the registry) is fenced: the registry refuses its next
commit with OwnerRetired, which stops it. What it had registered before the retirement and publishes
afterwards can still be joined twice: that window is documented in docs/photon.md. The retirement
mark is a row of the registry's owners table named `retired:<owner>` (its time is when it was
retired), so every backend has it without a schema change.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from millstream.photon.registry import RETIRED_PREFIX, IdRegistry, OwnerRetired

__all__ = ["RETIRED_PREFIX", "OwnerHeartbeat", "OwnerRetired", "check_not_retired", "is_gone", "retire_owner",
           "retired_at"]


def retire_owner(registry: IdRegistry, owner: str) -> None:
    """Mark `owner` as gone for good (idempotent: the mark's time moves, its meaning does not); the
    registry refuses the owner's commits from then on."""
    registry.retire(owner)


def retired_at(registry: IdRegistry, owner: str) -> int | None:
    """When `owner` was retired (ms), or None.

    >>> import tempfile, os
    >>> from millstream.photon import open_registry
    >>> registry = open_registry("sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db"))
    >>> retired_at(registry, "photon-a") is None
    True
    >>> retire_owner(registry, "photon-a"); retired_at(registry, "photon-a") is not None
    True
    >>> registry.close()
    """
    return registry.owner_last_seen(RETIRED_PREFIX + owner)


def check_not_retired(registry: IdRegistry, owner: str) -> None:
    """Raise OwnerRetired if the verifier retired `owner` (call before starting a pipeline)."""
    when = retired_at(registry, owner)
    if when is not None:
        raise OwnerRetired(f"pipeline owner {owner!r} was retired by the verifier (at {when} ms): its click ids "
                           "were re-injected; start it under a new owner name with a new root")


def is_gone(registry: IdRegistry, owner: str, timeout_ms: int, now_ms: int | None = None) -> bool:
    """True if `owner` never sent a heartbeat, sent none for `timeout_ms`, or was retired. `now_ms`
    must be on the registry's clock (the default reads it: `registry.now_ms()`).

    >>> import tempfile, os
    >>> from millstream.photon import open_registry
    >>> registry = open_registry("sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db"))
    >>> registry.heartbeat("photon-a")
    >>> is_gone(registry, "photon-a", timeout_ms=10_000), is_gone(registry, "photon-b", timeout_ms=10_000)
    (False, True)
    >>> registry.close()
    """
    if retired_at(registry, owner) is not None:
        return True
    last_seen = registry.owner_last_seen(owner)
    now_ms = registry.now_ms() if now_ms is None else now_ms
    return last_seen is None or now_ms - last_seen > timeout_ms


class OwnerHeartbeat:
    """A thread writing `owner`'s heartbeat every `every_s` seconds through its own registry client
    (`open_registry()` is called in the thread's process; the registry is closed on `stop`).

    >>> import tempfile, os
    >>> from millstream.photon import open_registry
    >>> url = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db")
    >>> with OwnerHeartbeat(lambda: open_registry(url), "photon-a", every_s=0.05):
    ...     pass
    >>> with open_registry(url) as registry:
    ...     registry.owner_last_seen("photon-a") is not None
    True
    """

    def __init__(self, open_registry: Callable[[], IdRegistry], owner: str, every_s: float = 1.0) -> None:
        self.open_registry = open_registry
        self.owner = owner
        self.every_s = every_s
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._registry: IdRegistry | None = None

    def start(self) -> "OwnerHeartbeat":
        self._registry = self.open_registry()
        self._registry.heartbeat(self.owner)  # alive from the first moment, before Spark starts
        self._thread = threading.Thread(target=self._loop, name=f"photon-heartbeat-{self.owner}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._registry.heartbeat(self.owner)  # type: ignore[union-attr]
            except Exception:  # a registry hiccup must not stop the pipeline; the next beat retries
                self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    def __enter__(self) -> "OwnerHeartbeat":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
