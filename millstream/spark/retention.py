"""Retention: what of a computation's published output is deleted, and when.

Policy (`SparkRunner(retain_logs_s=...)`, default one hour; None keeps everything):

- A batch entry of a computation's publication log, with its record files, its staged manifests, its
  status history and the leftovers of attempts Spark did not keep, is deleted once
  1. every reader is past it: each consumer's last *committed* Spark batch read beyond it (a replay
     starts there, so nothing a replay can read is ever deleted), and each sink delivered it; and
  2. it was published more than `retain_logs_s` ago, so a computation added to the running pipeline
     with `start="earliest"` finds at least that much history.
- A log no computation or sink reads (a pipeline's final output, read with `read_stream`) is kept
  whole, and so is a stream nobody reads in a log that is read (its dead letters, a side output):
  before a batch entry goes, the files of such streams are written down apart
  (`PublicationLog.keep`) and stay; `read_stream` reads them there. Only the files of streams that
  are read go with the entry.
- Claims stay (fencing and take-over look for the newest one); they are one small file per driver
  start. The newest batch entry stays too (a restart resumes from it).
- Injector streams are not logged: their sources keep them. A DataFrame injector's staged batches
  (injectors/dataframe.py) follow the same rule: a staged batch goes once every consumer's last
  committed Spark batch read past it and it was staged more than `retain_logs_s` ago; the newest
  stays. A computation added later with `start="earliest"` reads it from the oldest batch kept.

Worked example: computation `windower` publishes positions 0..9; consumer `totals` has committed a
batch that read up to position 6, the sink `out` delivered up to 8. Entries 0..6 are deleted once they
are older than `retain_logs_s`; 7..9 stay until `totals` commits past them.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from millstream.core.plan import ComputationPlan
from millstream.injectors.dataframe import DataFrameInjector
from millstream.model.pipeline import DEAD_LETTERS
from millstream.spark.commit import staged_paths
from millstream.spark.publog import BATCH, CLAIM
from millstream.spark.rootfiles import status_history
from millstream.spark.storage import Storage

if TYPE_CHECKING:
    from millstream.model.pipeline import Pipeline
    from millstream.spark.commit import ComputationCommit
    from millstream.spark.sinks import SinkDelivery

DEFAULT_RETAIN_LOGS_S = 3600.0
PRUNE_EVERY_S = 30.0


class LogRetention:
    def __init__(self, root: str, retain_s: float | None, every_s: float = PRUNE_EVERY_S) -> None:
        self.root = root
        self.storage = Storage(root)
        self.retain_s = retain_s
        self.every_s = every_s
        self._last_run = 0.0

    def maybe_prune(self, pipeline: "Pipeline", commits: dict[str, "ComputationCommit"],
                    sinks: "SinkDelivery | None") -> int:
        if self.retain_s is None or time.time() - self._last_run < self.every_s:
            return 0
        return self.prune(pipeline, commits, sinks)

    def prune(self, pipeline: "Pipeline", commits: dict[str, "ComputationCommit"],
              sinks: "SinkDelivery | None", now_ms: int | None = None) -> int:
        """Delete what the policy allows; returns how many batch entries went."""
        self._last_run = time.time()
        if self.retain_s is None:
            return 0
        cutoff_ms = (now_ms if now_ms is not None else int(time.time() * 1000)) - int(self.retain_s * 1000)
        deleted = 0
        for name, commit in list(commits.items()):
            read_up_to = self.read_up_to(name, pipeline, commits, sinks)
            if read_up_to is not None:
                deleted += self._prune_log(commit, read_up_to, cutoff_ms, unread_streams(pipeline, name))
        for name, node in pipeline.injectors.items():
            if isinstance(node.injector, DataFrameInjector) and node.injector.storage is not None:
                read = self.staged_read_up_to(name, commits)
                if read is not None:
                    node.injector.prune_staged(read, cutoff_ms)
        return deleted

    def staged_read_up_to(self, injector: str, commits: dict[str, "ComputationCommit"]) -> int | None:
        """The last staged batch of a DataFrame injector every consumer's committed batch is past."""
        batches: list[int] = []
        for commit in commits.values():
            senders = [s.name for plan in (*commit.fused, commit.plan) for s in plan.senders()
                       if s.is_injector and s.producer == injector]
            if not senders:
                continue
            offset = commit.checkpoint.committed_offset()
            for sender in senders:
                item = (offset or {}).get("senders", {}).get(sender)
                batches.append(item["offset"]["batch"] if item else -1)
        return min(batches) if batches else None

    def read_up_to(self, producer: str, pipeline: "Pipeline", commits: dict[str, "ComputationCommit"],
                   sinks: "SinkDelivery | None") -> int | None:
        """The last log position of `producer` every reader is past; None if nothing reads it."""
        positions: list[int] = []
        for commit in commits.values():
            senders = [s for plan in (*commit.fused, commit.plan) for s in _log_senders(plan, producer)]
            if not senders:
                continue
            offset = commit.checkpoint.committed_offset()
            for sender in senders:
                item = (offset or {}).get("senders", {}).get(sender)
                positions.append(item["position"] if item else -1)
        outputs = set(pipeline.outputs(producer)) if producer in pipeline.computations else set()
        for sink in pipeline.sinks.values():
            if sink.stream in outputs:
                positions.append(sinks.delivered(sink.name, producer)[1] if sinks is not None else -1)
        return min(positions) if positions else None

    def _prune_log(self, commit: "ComputationCommit", read_up_to: int, cutoff_ms: int,
                   unread: frozenset[str] = frozenset()) -> int:
        log = commit.writer.log
        name = commit.plan.name
        # The newest batch stays: a restart finds the last published batch and its status there.
        newest, _ = log.last_batch()
        read_up_to = min(read_up_to, newest - 1)
        below, claims = log.pruned()
        doomed: list[tuple[int, int]] = []  # (position, batch)
        kept: dict[int, set[str]] = {}  # position -> the full paths of its files that stay
        position = below
        while position <= read_up_to:
            entry = log.read(position)
            if entry is None:
                break
            if entry["type"] == CLAIM:
                claims.append(position)
            elif entry["type"] == BATCH:
                if entry["status"].get("wall_ms", 0) > cutoff_ms:
                    break
                doomed.append((position, entry["batch"]))
                streams = {stream: files for stream, files in entry["streams"].items()
                           if stream in unread and any(rows for _, rows in files)}
                if streams:  # kept apart before anything goes (read_stream reads it there)
                    log.keep(position, {**entry, "streams": streams})
                    kept[position] = {path for files in streams.values() for path, _ in files}
            position += 1
        if position == below:
            return 0
        log.mark_pruned(position, claims)
        members = [name, *(f.name for f in commit.fused)]
        last_batch = max((b for _, b in doomed), default=-1)
        for entry_position, batch in doomed:
            self._delete_batch_files(f"streams/{name}/{batch:012d}", kept.get(entry_position, set()))
            for path in staged_paths(self.storage, name, batch):
                self.storage.delete(path)
            for member in members:
                self.storage.delete(status_history(member, batch))
            log.delete(entry_position)
        self._delete_sink_leftovers(name, last_batch)
        return len(doomed)

    def _delete_batch_files(self, directory: str, keeping: set[str]) -> None:
        """A batch's record files (every attempt's), except those `keeping` names (full paths)."""
        if not keeping:
            self.storage.delete(directory)
            return
        for attempt in self.storage.list(directory):
            for file in self.storage.list(f"{directory}/{attempt}"):
                path = f"{directory}/{attempt}/{file}"
                if self.storage.full_path(path) not in keeping:
                    self.storage.delete(path)

    def _delete_sink_leftovers(self, computation: str, up_to_batch: int) -> None:
        """Sink files staged by attempts Spark did not keep (kept attempts' files were moved)."""
        pattern = re.compile(rf"^{re.escape(computation)}-(\d{{12}})-")
        for sink in self.storage.list("sinks"):
            for name in self.storage.list(f"sinks/{sink}/staging"):
                match = pattern.match(name)
                if match and int(match.group(1)) <= up_to_batch:
                    self.storage.delete(f"sinks/{sink}/staging/{name}")


def unread_streams(pipeline: "Pipeline", producer: str) -> frozenset[str]:
    """The streams of `producer`'s log that no computation and no sink reads: retention keeps them
    (a log nobody reads at all is kept whole).

    >>> from millstream import Computation, Pipeline, ScriptedInjector
    >>> pipeline = (Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
    ...             .add_computation("a", Computation(), ["in"], ["main", "side"])
    ...             .add_computation("b", Computation(), ["main"], ["out"]).add_sink("s", "out", "/tmp/out"))
    >>> sorted(unread_streams(pipeline, "a")), sorted(unread_streams(pipeline, "b"))
    (['dead_letters', 'side'], ['dead_letters'])
    """
    if producer not in pipeline.computations:
        return frozenset()
    sunk = {sink.stream for sink in pipeline.sinks.values()}

    def read(stream: str) -> bool:  # (a computation reading dead letters does not receive its own)
        return stream in sunk or any(reader != producer or stream != DEAD_LETTERS
                                     for reader in pipeline.consumers(stream))

    return frozenset(stream for stream in pipeline.outputs(producer) if not read(stream))


def _log_senders(plan: ComputationPlan, producer: str) -> list[str]:
    return [s.name for s in plan.senders() if not s.is_injector and s.producer == producer]

