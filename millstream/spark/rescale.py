"""Rescale a stopped pipeline: change how many Spark state partitions (tasks) a computation uses.

A computation's state is partitioned by key group, fixed when its root was created; Spark spreads the
key groups over its state partitions, and freezes their number in the checkpoint. Spark 4.2+ can
rewrite a stopped query's checkpoint to another number (`StreamingCheckpointManager.repartition`,
classic Spark only): it moves whole key groups, so no key changes group and no consumer sees a
different order (producers' positions do not depend on partitions, see core/production.py). The
output of a rescaled run is the output of a run that never rescaled.

Spark records the rescale as a batch of its own, committed without running; the publisher publishes
it as an empty entry, so batch ids and publication positions stay in step. A rescale killed after
Spark logged that batch and before it committed it leaves the batch planned with the new partition
count: Spark refuses to run the query until the repartition is finished with that same count, which
running the rescale again does first (`unfinished_repartition`).

A rescale holds the root's lease while it runs: a driver started meanwhile is refused, as on a root
another driver runs on (Spark does not allow a query to run on a checkpoint being repartitioned).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from millstream.model.locations import is_local
from millstream.spark.commit import Checkpoint, staged_after
from millstream.spark.errors import user_error_message
from millstream.spark.fencing import Holder, Lease, RootInUse
from millstream.spark.publog import PublicationLog
from millstream.spark.layout import read_layout
from millstream.spark.storage import Storage


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


class RescaleError(RuntimeError):
    """A rescale that cannot be done; the message says why."""


class UnfinishedRescale(RuntimeError):
    """A computation's checkpoint holds a repartition Spark never finished: run the rescale again."""


def checkpoint_of(root: str, computation: str) -> str:
    """The checkpoint a computation's last driver ran on (recorded in its claim)."""
    claim = PublicationLog(root, computation).last_claim()
    if claim is None:
        raise RescaleError(f"computation {computation!r} has never run on {Storage(root).describe()}")
    return str(claim["checkpoint"])


def state_partitions(checkpoint: str) -> int | None:
    """The number of state partitions Spark froze in a checkpoint (None before its first batch): as
    its newest offsets record them (a repartition to fewer leaves the others' state directories
    behind, so counting those misreads it), else as its state directories show."""
    logged = Checkpoint(checkpoint)
    planned = logged.last_planned()
    frozen = logged.batch_conf(planned).get(SHUFFLE_PARTITIONS) if planned >= 0 else None
    if frozen is not None:
        return int(frozen)
    partitions = [name for name in logged.storage.list("state/0") if name.isdigit()]
    return len(partitions) or None


def unfinished_repartition(checkpoint: str) -> tuple[int, int] | None:
    """(partitions before, partitions asked for) of a repartition Spark logged and never committed (a
    rescale killed part way), if any. A batch's partition count never changes but by a repartition,
    so an uncommitted batch planned with another count than the last committed one is that
    repartition's batch."""
    logged = Checkpoint(checkpoint)
    planned, committed = logged.last_planned(), logged.last_committed()
    if committed < 0 or planned <= committed:
        return None
    after = logged.batch_conf(planned).get(SHUFFLE_PARTITIONS)
    before = logged.batch_conf(committed).get(SHUFFLE_PARTITIONS)
    return (int(before), int(after)) if after is not None and before is not None and after != before else None


def check_no_unfinished_rescale(root: str, computation: str, checkpoint: str) -> None:
    """Refuse to start a computation whose checkpoint holds an unfinished repartition (Spark would
    fail the query on it), saying how to finish it."""
    unfinished = unfinished_repartition(checkpoint)
    if unfinished is not None:
        _, partitions = unfinished
        raise UnfinishedRescale(
            f"computation {computation!r}: a rescale to {partitions} state partitions was interrupted; finish it "
            f"before starting: millstream rescale {root} --computation {computation} --parallelism {partitions}")


def check_not_in_use(root: str) -> Holder | None:
    """Refuse (RootInUse) a root a live driver, or another rescale, holds; else its lease's last holder."""
    holder = Lease(root).holder()
    if holder is not None and holder.heartbeat_ms > 0 and holder.is_alive():
        raise RootInUse(f"{Storage(root).describe()} is in use ({holder.describe()}): stop the pipeline first")
    return holder


@contextmanager
def _holding_root(root: str) -> Iterator[None]:
    """The root's lease, held while the block runs (under the epoch it has: a rescale publishes nothing)."""
    holder = check_not_in_use(root)
    lease = Lease(root)
    lease.hold(holder.epoch if holder is not None else 0)
    try:
        yield
    finally:
        lease.release()


def _repartition(manager: Any, name: str, checkpoint: str, parallelism: int) -> None:
    """Spark's repartition of one checkpoint; its refusals as a RescaleError of one line."""
    try:
        manager.repartition(checkpoint, parallelism)
    except Exception as error:
        if "STATE_REPARTITION" not in str(error):
            raise
        raise RescaleError(f"computation {name!r}: Spark refused the repartition: "
                           f"{user_error_message(str(error))}") from None


def forget_uncommitted_batch(root: str, computation: str, checkpoint: str) -> None:
    """A stop interrupts the batch in flight: Spark logged its offsets, never committed it. Spark's
    repartition refuses such a checkpoint. millstream never published that batch (it publishes
    committed batches only), so its planned offsets can go: the next start plans it again. So can
    what an attempt of it staged: the repartition commits a batch of its own under that id."""
    storage = Storage(checkpoint)
    committed = max((int(n) for n in storage.list("commits") if n.isdigit()), default=-1)
    for name in storage.list("offsets"):
        batch = name.lstrip(".").split(".")[0]
        if batch.isdigit() and int(batch) > committed:
            storage.delete(f"offsets/{name}")
    staged = Storage(root)
    for path in staged_after(staged, computation, committed):
        staged.delete(path)


def rescale(spark: Any, root: str, parallelism: int, computations: Sequence[str] | None = None) -> dict[str, tuple[int | None, int]]:
    """Repartition the state of `computations` (default: every computation that ran) to
    `parallelism` partitions. The pipeline must be stopped; the rescale holds the root meanwhile.
    Returns {name: (before, after)}."""
    if parallelism < 1:
        raise RescaleError("parallelism must be >= 1")
    layout = read_layout(Storage(root))
    if layout is None:
        raise RescaleError(f"{Storage(root).describe()} holds no pipeline this version of millstream reads")
    here = os.path.abspath(root) if is_local(root) else root
    if layout.location is not None and layout.location != here:
        raise RescaleError(f"{Storage(root).describe()} was made at {layout.location}: its logs name that root's "
                           "checkpoints, which a rescale here would change; rescale the root where it was made")
    if parallelism > layout.key_groups:
        raise RescaleError(f"parallelism {parallelism} is more than the root's {layout.key_groups} key groups: "
                           "the extra tasks would have nothing to do")
    names = list(computations) if computations else list(layout.strong)
    unknown = [name for name in names if name not in layout.computations]
    if unknown:
        raise RescaleError(f"no computation {unknown[0]!r} in this root; known: {list(layout.computations)}")
    manager = getattr(spark, "_streamingCheckpointManager", None)
    if manager is None:
        raise RescaleError("this Spark session cannot repartition checkpoints (Spark 4.2+, classic Spark only)")
    done: dict[str, tuple[int | None, int]] = {}
    with _holding_root(root):
        for name in names:
            checkpoint = checkpoint_of(root, name)
            abandoned = unfinished_repartition(checkpoint)
            started_from = None
            if abandoned is not None:  # Spark finishes it only with the count it was started with
                started_from, interrupted = abandoned
                _repartition(manager, name, checkpoint, interrupted)
            before = state_partitions(checkpoint)
            if before == parallelism:
                done[name] = (started_from or before, parallelism)
                continue
            if before is None:
                raise RescaleError(f"computation {name!r} has no state yet: start it once, or choose its parallelism "
                                   "at the first start (SparkRunner(parallelism=...))")
            forget_uncommitted_batch(root, name, checkpoint)
            _repartition(manager, name, checkpoint, parallelism)
            done[name] = (started_from or before, state_partitions(checkpoint) or parallelism)
    return done
