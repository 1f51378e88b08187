"""What a computation or a sink cannot pick up where it left off on a root: refused at start, before
Spark runs anything, instead of found later as lost or stuck output.

A computation's checkpoint holds, in its source's offsets (Spark's `offsets/<batch>`), one entry per
sender: each injector partition's offset, each upstream log's position. Three things about a root can
change under it while it is stopped:

- The pipeline: its inputs, their producers, an injector's partitions. A sender the checkpoint does not
  hold has no offset to go on from (the source failed at its first batch); one the pipeline no longer
  has would keep its last watermark in the coalesced one for good (the computation's watermark froze
  and its timers never fired). So a computation's senders are fixed for the life of its checkpoint.
- Retention (retention.py) deletes a published log entry once every reader *of the pipeline that
  runs* is past it. A computation or a sink left out of a run is no reader then: brought back, its
  position may lie before what was deleted, and reading on would skip it (a reader new to a log
  starts at its oldest retained entry, as documented; one with a position must not). Claims are
  never deleted, so a position is missing only where a batch was.
- Its checkpoint: gone (Spark would start the computation over with empty state while its log goes
  on) or given elsewhere by `checkpoint_root=` (the root's claims name where it is).

A `parallelism=` other than the one a root's checkpoints froze is not refused, only told
(`parallelism_kept`): the run goes on with the root's, and `millstream rescale` changes it.

>>> missing_entries(position=3, below=7, kept_claims=[5])
[4, 6]
>>> missing_entries(position=6, below=7, kept_claims=[])
[]
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from millstream.core.plan import producer_of
from millstream.model.pipeline import Pipeline
from millstream.spark.commit import ComputationCommit
from millstream.spark.publog import PublicationLog
from millstream.spark.rescale import state_partitions
from millstream.spark.rootfiles import sink_progress
from millstream.spark.storage import Storage


def _under(location: str, directory: str) -> bool:
    return location.rstrip("/").startswith(directory.rstrip("/") + "/")


def missing_entries(position: int, below: int, kept_claims: Iterable[int]) -> list[int]:
    """The log positions after `position` that retention deleted: those below its first retained
    one (`below`), but for the claims it keeps."""
    return sorted(set(range(position + 1, below)) - set(kept_claims))


def _deleted_after(root: str, producer: str, position: int) -> list[int]:
    below, claims = PublicationLog(root, producer).pruned()
    return missing_entries(position, below, claims)


def _span(positions: Sequence[int]) -> str:
    return str(positions[0]) if len(positions) == 1 else f"{positions[0]}-{positions[-1]}"


def parallelism_kept(root: str, commit: ComputationCommit, parallelism: int | None) -> str | None:
    """What to tell a user whose `parallelism` the root's checkpoint overrides (None: nothing): a
    computation's state partitions are fixed at its first start and changed by `millstream rescale`.
    A warning, not a refusal: the run goes on, as before, with the root's."""
    frozen = state_partitions(commit.checkpoint.location)
    asked = None if parallelism is None else max(1, min(parallelism, commit.plan.key_groups))
    if frozen is None or asked is None or frozen == asked:
        return None
    return (f"computation {commit.plan.name!r} keeps its state in {frozen} partitions on this root (fixed at its first "
            f"start), so parallelism={parallelism} does not apply to it: to change it, stop the pipeline and run "
            f"`millstream rescale {root} --parallelism {parallelism}`")


def computation_refusals(root: str, commit: ComputationCommit, checkpoint_root: str | None = None) -> list[str]:
    """Why a computation's query (the strong computation of `commit`, and the weak ones fused ahead
    of it) cannot resume from its checkpoint; none for a new one. `checkpoint_root`: where the
    runner was told to keep checkpoints, if it was."""
    first, checkpoint = commit.source_reader, commit.checkpoint
    location = checkpoint.location
    if checkpoint_root is not None and not _under(location, checkpoint_root):
        return [f"computation {commit.plan.name!r} keeps its checkpoint at {location}, not under checkpoint_root="
                f"{checkpoint_root}: a root's checkpoints stay where they were made (leave checkpoint_root out)"]
    resumed = checkpoint.committed_offset()
    if commit.last_published >= 1 and resumed is None:
        return [f"computation {commit.plan.name!r} published batches up to {commit.last_published}, but its "
                f"checkpoint at {location} holds no committed batch (removed or moved away?): Spark would start it "
                "over with empty state. Put the checkpoint back, or start a new root"]
    planned = checkpoint.last_planned()
    offset = checkpoint.end_offset(planned) if planned >= 0 else None
    if offset is None:
        return []
    held, wanted = set(offset["senders"]), set(first.sender_names())
    if held != wanted:
        changes = [f"{label}: {', '.join(sorted(names))}" for label, names in
                   (("no longer read", held - wanted), ("new", wanted - held)) if names]
        return [f"computation {first.name!r} reads from other inputs than its checkpoint holds ({'; '.join(changes)}): "
                "a computation's input streams, their producers and its injectors' partitions are fixed for the "
                "life of its checkpoint. Give the changed computation a new name (it starts afresh), or run it with "
                "its inputs as they were"]
    refusals = []
    for sender, item in sorted((resumed or {"senders": {}})["senders"].items()):
        if "position" not in item:  # an injector partition: its offsets are the injector's own
            continue
        producer = producer_of(sender)
        deleted = _deleted_after(root, producer, item["position"])
        if deleted:
            refusals.append(
                f"computation {first.name!r} goes on reading {producer!r}'s log after entry {item['position']}, but "
                f"retention deleted entries {_span(deleted)} while {first.name!r} was not part of the pipeline run "
                "on this root: what it had not read is gone. Give it a new name to start it afresh from what is "
                "retained, or start a new root")
    return refusals


def sink_refusals(root: str, pipeline: Pipeline, strong: Iterable[str]) -> list[str]:
    """Why a sink that delivered from this root before cannot go on where it left off (none for a
    sink new to it, which starts at the oldest retained entry)."""
    storage, strong = Storage(root), set(strong)
    refusals = []
    for node in sorted(pipeline.sinks.values(), key=lambda n: n.name):
        for producer in pipeline.producers(node.stream):
            if producer not in strong:
                continue
            progress = storage.read_json(sink_progress(node.name, producer))
            if not isinstance(progress, Mapping):
                continue
            deleted = _deleted_after(root, producer, int(progress.get("position", -1)))
            if deleted:
                refusals.append(
                    f"sink {node.name!r} goes on delivering {producer!r}'s output after batch {progress.get('batch')}, "
                    f"but retention deleted log entries {_span(deleted)} while the sink was not part of the pipeline "
                    "run on this root: those batches cannot be delivered. Give the sink a new name (it receives "
                    "from the oldest retained batch), or start a new root")
    return refusals
