"""The publication log of a computation: what it has delivered, in order, fenced by epoch.

Layout under the pipeline root, one directory per computation:

    log/<computation>/<position>.json   one entry per position, created only if absent
    log/<computation>/HEAD.json         a hint of the last position (readers probe forward from it)
    log/<computation>/PRUNED.json       once retention pruned the log: the first retained position,
                                        and the positions of the claims kept below it

An entry is a *claim* (a driver taking charge of the computation with a new epoch) or a *batch*
publication: the files holding the records of every output stream for one Spark batch, the output
watermark after each of the batch's input points, and the computation's status after it. Entries are
created with `Storage.create` (create-if-absent), so positions form one total order even with two
drivers racing: a driver appends at the position after the last one it knows; if another driver got
there first, it reads what is there, and a claim of a newer epoch means it has been fenced
(MillWheel's sequencers: a zombie's later writes change nothing).

Consumers read a producer's log from the position after the last one they consumed; the position is
part of their Spark offsets, so a replayed batch reads exactly the same entries. Retention
(retention.py) prunes batch entries every reader is past; claims are kept, since fencing and take-over
look for the newest one. A reader that starts from the beginning starts at the first retained entry.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Iterator

from millstream.spark.storage import Storage

BATCH = "batch"
CLAIM = "claim"
PRUNED_FILE = "PRUNED.json"
KEPT_DIR = "kept"  # what retention keeps of the batch entries it deletes (PublicationLog.keep)


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

    def pruned(self) -> tuple[int, list[int]]:
        """(first retained position, claims kept below it); (0, []) if never pruned."""
        data = self.storage.read_json(PRUNED_FILE)
        if not isinstance(data, dict):
            return 0, []
        return int(data["below"]), [int(p) for p in data["claims"]]

    def entries_after(self, position: int, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """Consecutive entries after `position` (at most `limit`); from the first retained entry if
        retention pruned those after `position`."""
        return list(islice(self.entries_from(position), limit))

    def entries_from(self, position: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """The entries after `position`, read one at a time as the caller goes on."""
        while True:
            entry = self.read(position + 1)
            if entry is None:
                below, _ = self.pruned()
                if position + 1 >= below:
                    return
                position = below - 1
                continue
            position += 1
            yield position, entry

    def head(self) -> int:
        """The last position written (-1: the log is empty)."""
        hint = self.storage.read_json("HEAD.json")
        position = hint["position"] if isinstance(hint, dict) else -1
        while self.storage.exists(self._name(position + 1)):
            position += 1
        return position

    def entries_backwards(self, position: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """Entries from `position` down: the retained ones, then the claims kept below them."""
        below, claims = self.pruned()
        while position >= below:
            entry = self.read(position)
            if entry is not None:
                yield position, entry
            position -= 1
        for kept in sorted((c for c in claims if c <= position), reverse=True):
            entry = self.read(kept)
            if entry is not None:
                yield kept, entry

    def mark_pruned(self, below: int, claims: list[int]) -> None:
        """Record that positions before `below` (except `claims`) are about to be deleted; written
        before anything is deleted, so a reader never meets a gap it cannot explain."""
        self.storage.write_json(PRUNED_FILE, {"below": below, "claims": sorted(claims)})

    def delete(self, position: int) -> None:
        self.storage.delete(self._name(position))

    def keep(self, position: int, entry: dict[str, Any]) -> None:
        """Keep a batch entry's streams that nobody reads (its dead letters, a side output) past the
        entry: retention writes them here before it deletes the entry."""
        self.storage.write_json(f"{KEPT_DIR}/{self._name(position)}", entry)

    def batches(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Every batch entry still readable, oldest first: those kept of pruned entries (`keep`: only
        the streams nobody reads), then the retained ones."""
        retained = self.entries_from(-1)
        kept = {int(name.split(".")[0]): name for name in self.storage.list(KEPT_DIR)}
        below, _ = self.pruned()
        for position in sorted(kept):
            if position < below:  # (a kept entry at or past the mark: retention stopped before deleting it)
                entry = self.storage.read_json(f"{KEPT_DIR}/{kept[position]}")
                if isinstance(entry, dict):
                    yield position, entry
        for position, entry in retained:
            if entry["type"] == BATCH and (position >= below or position not in kept):
                yield position, entry

    def last_batch(self) -> tuple[int, dict[str, Any] | None]:
        """The newest batch entry (and its position), if any."""
        for position, entry in self.entries_backwards(self.head()):
            if entry["type"] == BATCH:
                return position, entry
        return -1, None

    def last_read_position(self) -> int:
        """The position of the newest entry a reader must read (-1: none): the newest batch with
        input points for its readers. A batch without any (the one a rescale commits) is read only
        with a later one, as claims are, so a reader may stay behind it for good."""
        for position, entry in self.entries_backwards(self.head()):
            if entry["type"] == BATCH and entry["output"]:
                return position
        return -1

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
