"""Rescale a stopped pipeline: change how many Spark state partitions (tasks) a computation uses.

A computation's state is partitioned by key group, fixed when its root was created; Spark spreads the
key groups over its state partitions, and freezes their number in the checkpoint. Spark 4.2+ can
rewrite a stopped query's checkpoint to another number (`StreamingCheckpointManager.repartition`,
classic Spark only): it moves whole key groups, so no key changes group and no consumer sees a
different order (producers' positions do not depend on partitions, see core/production.py). The
output of a rescaled run is the output of a run that never rescaled.

Spark records the rescale as a batch of its own, committed without running; the publisher publishes
it as an empty entry, so batch ids and publication positions stay in step.
"""

from __future__ import annotations

from typing import Any, Sequence

from millstream.spark.commit import Checkpoint, staged_after
from millstream.spark.fencing import Lease, RootInUse
from millstream.spark.publog import PublicationLog
from millstream.spark.layout import read_layout
from millstream.spark.storage import Storage


class RescaleError(RuntimeError):
    """A rescale that cannot be done; the message says why."""


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
    frozen = logged.batch_conf(planned).get("spark.sql.shuffle.partitions") if planned >= 0 else None
    if frozen is not None:
        return int(frozen)
    partitions = [name for name in logged.storage.list("state/0") if name.isdigit()]
    return len(partitions) or None


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
    `parallelism` partitions. The pipeline must be stopped. Returns {name: (before, after)}."""
    if parallelism < 1:
        raise RescaleError("parallelism must be >= 1")
    holder = Lease(root).holder()
    if holder is not None and holder.heartbeat_ms > 0 and holder.is_alive():
        raise RootInUse(f"{Storage(root).describe()} is in use ({holder.describe()}): stop the pipeline first")
    layout = read_layout(Storage(root))
    if layout is None:
        raise RescaleError(f"{Storage(root).describe()} holds no pipeline this version of millstream reads")
    if parallelism > layout.key_groups:
        raise RescaleError(f"parallelism {parallelism} is more than the root's {layout.key_groups} key groups: "
                           "the extra tasks would have nothing to do")
    names = list(computations) if computations else list(layout.strong)
    manager = getattr(spark, "_streamingCheckpointManager", None)
    if manager is None:
        raise RescaleError("this Spark session cannot repartition checkpoints (Spark 4.2+, classic Spark only)")
    done: dict[str, tuple[int | None, int]] = {}
    for name in names:
        if name not in layout.computations:
            raise RescaleError(f"no computation {name!r} in this root; known: {list(layout.computations)}")
        checkpoint = checkpoint_of(root, name)
        before = state_partitions(checkpoint)
        if before == parallelism:
            done[name] = (before, parallelism)
            continue
        if before is None:
            raise RescaleError(f"computation {name!r} has no state yet: start it once, or choose its parallelism "
                               "at the first start (SparkRunner(parallelism=...))")
        forget_uncommitted_batch(root, name, checkpoint)
        manager.repartition(checkpoint, parallelism)
        done[name] = (before, state_partitions(checkpoint) or parallelism)
    return done
