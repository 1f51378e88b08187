"""One driver at a time per pipeline root: a lease for the polite case, epochs for the impolite one.

MillWheel attaches a sequencer to every write and lets a new owner invalidate the old one's. Here:

- `lease.json` at the root names the driver in charge (host, process, epoch) and is refreshed every
  few seconds. A second driver refuses to start while the holder is alive (same machine: its process
  exists; another machine: its lease was refreshed recently) unless told to take over.
- Every driver claims a new epoch in each computation's publication log (publog.py) before running.
  The log is create-if-absent, so a driver that was taken over finds a newer claim where it wanted to
  publish and stops: nothing it writes afterwards is ever published.
- A take-over from a driver that may still be alive also gives the new driver its own copy of Spark's
  checkpoint, cut back to the last published batch, so the old driver's Spark writes land where
  nobody reads (the runner does this; see SparkRunner).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from millstream.spark.publog import Fenced
from millstream.spark.storage import Storage

LEASE_FILE = "lease.json"
HEARTBEAT_S = 2.0
LEASE_TIMEOUT_S = 15.0


class RootInUse(RuntimeError):
    """Another driver is running on this root."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as data:
            return data.read().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (tells a pid apart from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat") as data:
            return data.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@dataclass(frozen=True)
class Holder:
    epoch: int
    host: str
    boot: str
    pid: int
    process_start: str
    heartbeat_ms: int

    @classmethod
    def me(cls, epoch: int) -> "Holder":
        pid = os.getpid()
        return cls(epoch, socket.gethostname(), _boot_id(), pid, _process_start(pid), int(time.time() * 1000))

    def describe(self) -> str:
        age = max(0.0, time.time() - self.heartbeat_ms / 1000)
        return f"process {self.pid} on host {self.host!r} (epoch {self.epoch}, seen {age:.0f} s ago)"

    def is_alive(self, timeout_s: float = LEASE_TIMEOUT_S) -> bool:
        if self.host == socket.gethostname() and self.boot and self.boot == _boot_id():
            return bool(self.process_start) and _process_start(self.pid) == self.process_start
        return time.time() - self.heartbeat_ms / 1000 < timeout_s


class Lease:
    """The root's lease file, and the heartbeat that keeps it fresh while this driver runs."""

    def __init__(self, root: str) -> None:
        self.storage = Storage(root)
        self.epoch: int | None = None
        self.fenced: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> Holder | None:
        data = self.storage.read_json(LEASE_FILE)
        if not isinstance(data, dict):
            return None
        try:
            return Holder(**data)
        except TypeError:
            return None

    def hold(self, epoch: int) -> None:
        self.epoch = epoch
        self.storage.write_json(LEASE_FILE, asdict(Holder.me(epoch)))
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="millstream-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S) and not self.fenced:
            try:
                self.beat()
            except Exception:  # a failed heartbeat is retried; the lease times out if it keeps failing
                continue

    def beat(self) -> None:
        """Refresh the lease, or note that a newer epoch holds it. Reading and rewriting the file is
        not atomic: a driver being taken over can rewrite its older epoch just after the new driver
        wrote its own. So an older epoch found in the file is overwritten, never obeyed; the old
        driver sees the newer epoch on its next beat."""
        current = self.holder()
        if self._newer(current):
            self.fenced = f"another driver took over this root: {current.describe()}"  # type: ignore[union-attr]
            return
        self.storage.write_json(LEASE_FILE, asdict(Holder.me(self.epoch or 0)))

    def _newer(self, current: Holder | None) -> bool:
        return current is not None and self.epoch is not None and current.epoch > self.epoch

    def check(self) -> None:
        """Raise Fenced if another driver has taken over."""
        if self.fenced:
            raise Fenced(self.fenced)
        current = self.holder()
        if self._newer(current):
            self.fenced = f"another driver took over this root: {current.describe()}"  # type: ignore[union-attr]
            raise Fenced(self.fenced)

    def release(self) -> None:
        """Stop the heartbeat and let the next driver start without waiting (clean stop only)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        current = self.holder()
        if current is not None and current.epoch == self.epoch and not self.fenced:
            self.storage.write_json(LEASE_FILE, {**asdict(current), "heartbeat_ms": 0, "process_start": ""})


def driver_info(epoch: int) -> dict[str, Any]:
    return asdict(Holder.me(epoch))
