"""Taking over a root from a driver that still runs: the lease and the claims (no Spark started;
tests/spark/test_fencing.py runs two real drivers)."""

import os
import sys
from dataclasses import asdict

import pytest

from millstream.spark import runner as runner_module
from millstream.spark.fencing import LEASE_FILE, Holder, Lease
from millstream.spark.publog import BATCH, CLAIM, Fenced, PublicationLog
from millstream.spark.runner import SparkRunner
from millstream.spark.storage import Storage

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "spark"))
from fence_driver import pipeline  # noqa: E402


def held(root: str, epoch: int) -> Lease:
    lease = Lease(root)
    lease.epoch = epoch
    return lease


def test_an_old_drivers_late_heartbeat_does_not_fence_the_driver_that_took_over(tmp_path):
    root = str(tmp_path)
    old, new = held(root, 1), held(root, 2)
    old.beat()
    new.beat()  # the take-over writes epoch 2
    # The old driver's heartbeat read the file before the take-over and writes after it.
    Storage(root).write_json(LEASE_FILE, asdict(Holder.me(1)))
    new.check()  # an older epoch in the file is not a take-over
    new.beat()
    assert new.fenced is None and new.holder().epoch == 2  # type: ignore[union-attr]
    old.beat()
    assert old.fenced is not None and "took over" in old.fenced
    with pytest.raises(Fenced):
        old.check()
    assert new.holder().epoch == 2  # type: ignore[union-attr]  # the fenced driver wrote nothing more


def test_a_newer_epoch_fences_at_once(tmp_path):
    old, new = held(str(tmp_path), 3), held(str(tmp_path), 4)
    old.beat()
    old.check()
    new.beat()
    with pytest.raises(Fenced, match="another driver took over"):
        old.check()


def running_first_driver(root: str, checkpoints: str, batches: int) -> PublicationLog:
    """A root as a live first driver (this very process, epoch 1) leaves it after `batches` batches."""
    log = PublicationLog(root, "count")
    checkpoint = f"{checkpoints}/count/g0000"
    assert log.append(0, {"type": CLAIM, "epoch": 1, "checkpoint": checkpoint})
    for batch in range(batches):
        assert log.append(batch + 1, {"type": BATCH, "epoch": 1, "batch": batch, "status": {}})
    spark_checkpoint = Storage(checkpoint)
    for batch in range(batches + 2):  # Spark may be ahead of the publications
        spark_checkpoint.write_json(f"offsets/{batch}", {"batch": batch})
        spark_checkpoint.write_json(f"commits/{batch}", {"batch": batch})
    Storage(root).write_json(LEASE_FILE, asdict(Holder.me(1)))
    return log


def test_a_take_over_claims_after_batches_the_first_driver_publishes_meanwhile(tmp_path, monkeypatch):
    root, checkpoints = str(tmp_path / "root"), str(tmp_path / "checkpoints")
    log = running_first_driver(root, checkpoints, batches=3)
    copy = runner_module._copy_checkpoint
    copies: list[int] = []

    def copy_while_the_first_driver_publishes(location: str, last_published: int) -> str:
        copies.append(last_published)
        copied = copy(location, last_published)
        if len(copies) < 3:  # it publishes the batch Spark already committed, twice
            batch = 3 + len(copies) - 1
            assert log.append(log.head() + 1, {"type": BATCH, "epoch": 1, "batch": batch, "status": {}})
        return copied

    monkeypatch.setattr(runner_module, "_copy_checkpoint", copy_while_the_first_driver_publishes)
    taking_over = SparkRunner(pipeline(100, 10.0), root=root, checkpoint_root=checkpoints, takeover=True)
    taking_over.claim()
    assert copies == [2, 3, 4]
    entries = log.entries_after(-1, 100)
    assert [(e["type"], e["epoch"]) for _, e in entries][-3:] == [(BATCH, 1), (BATCH, 1), (CLAIM, 2)]
    claim = entries[-1][1]
    copied = Storage(claim["checkpoint"])
    assert claim["checkpoint"].endswith("g0001") and sorted(copied.list("commits")) == ["0", "1", "2", "3", "4"]
    assert taking_over.lease.holder().epoch == 2  # type: ignore[union-attr]
    taking_over.lease.release()


def test_a_take_over_racing_another_new_driver_refuses(tmp_path, monkeypatch):
    root, checkpoints = str(tmp_path / "root"), str(tmp_path / "checkpoints")
    log = running_first_driver(root, checkpoints, batches=2)
    copy = runner_module._copy_checkpoint

    def another_driver_claims_meanwhile(location: str, last_published: int) -> str:
        assert log.append(log.head() + 1, {"type": CLAIM, "epoch": 2, "checkpoint": "elsewhere"})
        return copy(location, last_published)

    monkeypatch.setattr(runner_module, "_copy_checkpoint", another_driver_claims_meanwhile)
    taking_over = SparkRunner(pipeline(100, 10.0), root=root, checkpoint_root=checkpoints, takeover=True)
    with pytest.raises(runner_module.RootInUse, match="at the same moment"):
        taking_over.claim()


def test_a_file_the_running_driver_removes_during_the_copy_does_not_stop_the_take_over(tmp_path, monkeypatch):
    root, checkpoints = str(tmp_path / "root"), str(tmp_path / "checkpoints")
    running_first_driver(root, checkpoints, batches=2)
    temporary = f"{checkpoints}/count/g0000/state/0/0/..4.changelog.TID14.tmp.crc"
    Storage(f"{checkpoints}/count/g0000").write_json("state/0/0/..4.changelog.TID14.tmp.crc", {})
    real_copy = runner_module.pafs.copy_files
    calls: list[int] = []

    def copy_as_spark_renames_its_temporary_file(source, *args, **kwargs):
        calls.append(1)
        if os.path.exists(temporary):  # listed, then gone before pyarrow opens it
            os.remove(temporary)
            raise FileNotFoundError(f"[Errno 2] Failed to open local file '{temporary}'")
        return real_copy(source, *args, **kwargs)

    monkeypatch.setattr(runner_module.pafs, "copy_files", copy_as_spark_renames_its_temporary_file)
    taking_over = SparkRunner(pipeline(100, 10.0), root=root, checkpoint_root=checkpoints, takeover=True)
    taking_over.claim()
    claim = PublicationLog(root, "count").last_claim()
    assert len(calls) == 2 and claim["epoch"] == 2  # type: ignore[index]
    assert sorted(Storage(claim["checkpoint"]).list("commits")) == ["0", "1"]  # type: ignore[index]
    taking_over.lease.release()
