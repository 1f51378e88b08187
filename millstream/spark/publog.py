"""The publication log of a computation: what it has delivered, in order, fenced by epoch.

Layout under the pipeline root, one directory per computation:

    log/<computation>/<position>.json   one entry per position, created only if absent
    log/<computation>/HEAD.json         a hint of the last position (readers probe forward from it)

An entry is a *claim* (a driver taking charge of the computation with a new epoch) or a *batch*
publication: the files holding the records of every output stream for one Spark batch, the output
watermark after each of the batch's input points, and the computation's status after it. Entries are
created with `Storage.create` (create-if-absent), so positions form one total order even with two
drivers racing: a driver appends at the position after the last one it knows; if another driver got
there first, it reads what is there, and a claim of a newer epoch means it has been fenced
(MillWheel's sequencers: a zombie's later writes change nothing).

Consumers read a producer's log from the position after the last one they consumed; the position is
part of their Spark offsets, so a replayed batch reads exactly the same entries.
"""

from __future__ import annotations

from typing import Any, Iterator

from millstream.spark.storage import Storage

BATCH = "batch"
CLAIM = "claim"


class Fenced(RuntimeError):
    """Another driver has taken charge of the computation: this one must stop publishing."""


class PublicationLog:
    def __init__(self, root: str, computation: str) -> None:
        self.storage = Storage(root).child(f"log/{computation}")
        self.computation = computation

    @staticmethod
    def _name(position: int) -> str:
        return f"{position:012d}.json"

    def read(self, position: int) -> dict[str, Any] | None:
        entry = self.storage.read_json(self._name(position))
        return entry if isinstance(entry, dict) else None

    def entries_after(self, position: int, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """Consecutive entries after `position` (at most `limit`)."""
        found = []
        while len(found) < limit:
            entry = self.read(position + 1)
            if entry is None:
                break
            position += 1
            found.append((position, entry))
        return found

    def head(self) -> int:
        """The last position written (-1: the log is empty)."""
        hint = self.storage.read_json("HEAD.json")
        position = hint["position"] if isinstance(hint, dict) else -1
        while self.storage.exists(self._name(position + 1)):
            position += 1
        return position

    def entries_backwards(self, position: int) -> Iterator[tuple[int, dict[str, Any]]]:
        while position >= 0:
            entry = self.read(position)
            if entry is not None:
                yield position, entry
            position -= 1

    def last_batch(self) -> tuple[int, dict[str, Any] | None]:
        """The newest batch entry (and its position), if any."""
        for position, entry in self.entries_backwards(self.head()):
            if entry["type"] == BATCH:
                return position, entry
        return -1, None

    def last_claim(self) -> dict[str, Any] | None:
        for _, entry in self.entries_backwards(self.head()):
            if entry["type"] == CLAIM:
                return entry
        return None

    def append(self, position: int, entry: dict[str, Any]) -> bool:
        """Create the entry at `position` if nothing is there yet."""
        created = self.storage.create_json(self._name(position), entry)
        if created:
            self.storage.write_json("HEAD.json", {"position": position})
        return created


class FencedWriter:
    """Appends one driver's entries to a computation's log under its epoch."""

    def __init__(self, log: PublicationLog, epoch: int, next_position: int) -> None:
        self.log = log
        self.epoch = epoch
        self.next_position = next_position

    def append(self, entry: dict[str, Any]) -> int:
        """Append `entry` (stamped with this writer's epoch); raises Fenced if a newer epoch has
        claimed the computation. Returns the entry's position."""
        entry = {**entry, "epoch": self.epoch}
        position = self.next_position
        if not self.log.append(position, entry):
            there = self.log.read(position) or {}
            raise Fenced(
                f"computation {self.log.computation!r}: another driver (epoch {there.get('epoch')}) wrote "
                f"position {position} of its log; this driver (epoch {self.epoch}) stops publishing"
            )
        self.next_position = position + 1
        return position
