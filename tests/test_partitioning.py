"""Key group labels (millstream/spark/partitioning.py): the values Spark hashes to pick a key group's
task. The hash must be Spark's own, bit for bit; the labels must spread key groups evenly; and a root
keeps the labels its state was written under. (tests/spark/test_partitioning_spark.py checks the
spreading in Spark itself.)"""

import json
import pickle
from collections import Counter

import pytest

from millstream import Computation, Pipeline, PipelineError, Record, ScriptedInjector
from millstream.spark.partitioning import GroupLabels, alignment, spark_hash_int, spark_partition
from millstream.spark.runner import SparkRunner
from millstream.spark.storage import Storage

# Spark 4.3's `hash(cast(v as int))`, read from a local session: the ground truth for the hash.
SPARK_HASHES = {0: 933211791, 1: -559580957, 2: 1765031574, 5: 1023896466, -7: -1618159745, 31: 972445202,
                32: 1879002950, 1000: -14577491, 123456: 1905992991, 2**31 - 1: 133916647, -2**31: 723455942,
                -1: -1604776387}
# Spark's partitions of key group indexes 0..31 (`pmod(hash(id), 2)`): 12 land in one, 20 in the other.
SPARK_IDENTITY_SPLIT_OVER_2 = [12, 20]


def test_the_hash_is_sparks():
    assert {v: spark_hash_int(v) for v in SPARK_HASHES} == SPARK_HASHES


def test_key_group_indexes_are_spread_unevenly_and_labels_evenly():
    identity = Counter(spark_partition(g, 2) for g in range(32))
    assert sorted(identity.values()) == SPARK_IDENTITY_SPLIT_OVER_2
    labels = GroupLabels.aligned(32)
    for partitions in (1, 2, 4, 8, 16, 32):
        spread = Counter(spark_partition(label, partitions) for label in labels.labels)
        assert sorted(spread.values()) == [32 // partitions] * partitions, partitions
        assert all(spark_partition(labels.label(g), partitions) == g % partitions for g in range(32))


def test_labels_aligned_to_a_parallelism_that_does_not_divide_the_key_groups():
    labels = GroupLabels.aligned(32, alignment(32, 6))
    for partitions in (3, 6, 2, 4, 8):
        spread = Counter(spark_partition(label, partitions) for label in labels.labels)
        assert max(spread.values()) - min(spread.values()) <= 1 and len(spread) == partitions, partitions
    # Only the key group count: 6 partitions are left to chance.
    unaligned = Counter(spark_partition(label, 6) for label in GroupLabels.aligned(32).labels)
    assert max(unaligned.values()) - min(unaligned.values()) > 1


def test_labels_are_the_smallest_values_with_their_residue():
    labels = GroupLabels.aligned(8)
    assert len(set(labels.labels)) == 8
    for group, label in enumerate(labels.labels):
        assert spark_hash_int(label) % 8 == group
        assert all(spark_hash_int(v) % 8 != group for v in range(label))
    assert [labels.group(label) for label in labels.labels] == list(range(8))


def test_alignment_grows_only_when_it_stays_small():
    assert alignment(32, None) == alignment(32, 2) == alignment(32, 32) == alignment(32, 100) == 32
    assert alignment(32, 6) == 96 and alignment(32, 5) == 160
    assert alignment(4096, 1000) == 4096  # lcm 512000: too many values to search


def test_labels_travel_pickled_and_refuse_duplicates():
    labels = GroupLabels.aligned(16)
    copy = pickle.loads(pickle.dumps(labels))
    assert copy == labels and copy.group(labels.label(11)) == 11
    with pytest.raises(ValueError):
        GroupLabels((3, 3))


class Count(Computation):
    def process_record(self, ctx, record):
        pass


def pipeline():
    return (Pipeline("labels").add_injector("src", ScriptedInjector("src", []), "in")
            .add_computation("count", Count(), ["in"], []))


def test_a_new_root_chooses_its_labels_at_first_start_and_an_old_root_keeps_key_group_indexes(tmp_path):
    fresh = tmp_path / "fresh"
    SparkRunner(pipeline(), root=str(fresh), key_groups=8)
    layout = json.loads((fresh / "pipeline.json").read_text())
    assert layout["group_labels"] is None  # not started yet
    SparkRunner(pipeline(), root=str(fresh), key_groups=8)
    assert json.loads((fresh / "pipeline.json").read_text())["group_labels"] is None

    old = tmp_path / "old"
    SparkRunner(pipeline(), root=str(old), key_groups=8)
    layout = json.loads((old / "pipeline.json").read_text())
    del layout["group_labels"]  # as a root written before labels existed
    (old / "pipeline.json").write_text(json.dumps(layout))
    runner = SparkRunner(pipeline(), root=str(old), key_groups=8)
    assert runner.group_labels == GroupLabels.identity(8)
    runner.claim()
    try:
        assert json.loads((old / "pipeline.json").read_text())["group_labels"] == list(range(8))
    finally:
        runner.lease.release()


def labels_chosen_by_another_driver(root) -> list[int]:
    """What a driver's first start writes: the layout with the labels it chose."""
    layout = json.loads((root / "pipeline.json").read_text())
    layout["group_labels"] = list(GroupLabels.aligned(8, alignment(8, 3)).labels)  # chosen for 3 cores
    (root / "pipeline.json").write_text(json.dumps(layout))
    return layout["group_labels"]


def test_constructing_a_runner_never_writes_back_a_layout_it_read_before_another_driver_chose_labels(
        tmp_path, monkeypatch):
    root = tmp_path / "root"
    SparkRunner(pipeline(), root=str(root), key_groups=8)
    chosen: list[list[int]] = []
    read_json = Storage.read_json

    def read_then_the_first_driver_chooses(self, path):
        layout = read_json(self, path)
        if path == "pipeline.json" and not chosen:
            chosen.append(labels_chosen_by_another_driver(root))  # lands just after this read
        return layout

    monkeypatch.setattr(Storage, "read_json", read_then_the_first_driver_chooses)
    SparkRunner(pipeline(), root=str(root), key_groups=8)  # a second driver, refused later or not
    assert chosen and json.loads((root / "pipeline.json").read_text())["group_labels"] == chosen[0]


def test_a_runner_constructed_before_the_first_start_takes_the_labels_that_start_chose(tmp_path):
    root = tmp_path / "root"
    later = SparkRunner(pipeline(), root=str(root), key_groups=8)
    first_start = labels_chosen_by_another_driver(root)  # another runner starts, runs and stops
    later.claim()
    try:
        # Its start chooses labels only for a root that has none: these stay.
        assert later.group_labels is not None and list(later.group_labels.labels) == first_start
        assert json.loads((root / "pipeline.json").read_text())["group_labels"] == first_start
    finally:
        later.lease.release()


def test_a_layout_changed_before_the_claim_is_refused_and_the_root_left_free(tmp_path):
    root = tmp_path / "root"
    runner = SparkRunner(pipeline(), root=str(root), key_groups=8)
    layout = json.loads((root / "pipeline.json").read_text())
    layout["key_groups"] = 16  # another pipeline run took the root meanwhile
    (root / "pipeline.json").write_text(json.dumps(layout))
    with pytest.raises(PipelineError, match="16 key groups"):
        runner.claim()
    assert json.loads((root / "pipeline.json").read_text())["key_groups"] == 16  # not overwritten
    taker = SparkRunner(pipeline(), root=str(root), key_groups=16)
    taker.claim()  # the refused driver left the root free, with no wait for its lease to go stale
    taker.lease.release()
