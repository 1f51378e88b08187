"""Reading a publication log that retention pruned (no Spark needed)."""

from millstream.spark.publog import BATCH, CLAIM, PublicationLog


def make_log(tmp_path, kinds):
    log = PublicationLog(str(tmp_path), "c")
    for position, kind in enumerate(kinds):
        assert log.append(position, {"type": kind, "n": position})
    return log


def prune(log, below):
    claims = [p for p in range(below) if log.read(p)["type"] == CLAIM]
    log.mark_pruned(below, claims)
    for p in range(below):
        if p not in claims:
            log.delete(p)


def test_a_reader_from_the_start_starts_at_the_first_retained_entry(tmp_path):
    log = make_log(tmp_path, [CLAIM, BATCH, BATCH, CLAIM, BATCH, BATCH, BATCH])
    prune(log, 5)
    assert [p for p, _ in log.entries_after(-1, 10)] == [0, 5, 6]  # a kept claim, then the retained batches
    assert [p for p, _ in log.entries_after(5, 10)] == [6]
    assert log.entries_after(6, 10) == []


def test_the_newest_claim_and_batch_are_found_below_the_pruned_mark(tmp_path):
    log = make_log(tmp_path, [CLAIM, BATCH, BATCH, CLAIM, BATCH, BATCH])
    prune(log, 6)
    assert log.head() == 5
    assert log.last_claim()["n"] == 3
    assert [p for p, _ in log.entries_backwards(log.head())] == [3, 0]
    assert log.last_batch() == (-1, None)
    assert log.append(6, {"type": BATCH, "n": 6}) and log.last_batch()[0] == 6


def test_an_unpruned_log_reads_as_before(tmp_path):
    log = make_log(tmp_path, [CLAIM, BATCH, BATCH])
    assert log.pruned() == (0, [])
    assert [p for p, _ in log.entries_after(-1, 2)] == [0, 1]
    assert [p for p, _ in log.entries_backwards(2)] == [2, 1, 0]


def test_kept_streams_of_pruned_entries_read_before_the_retained_batches(tmp_path):
    log = make_log(tmp_path, [CLAIM, BATCH, BATCH, BATCH, BATCH])
    log.keep(2, {"type": BATCH, "n": 2, "streams": {"dead_letters": [["p2", 1]]}})
    prune(log, 3)
    assert [(p, e["n"]) for p, e in log.batches()] == [(2, 2), (3, 3), (4, 4)]
    assert log.batches().__next__()[1]["streams"] == {"dead_letters": [["p2", 1]]}


def test_an_entry_kept_and_not_deleted_yet_is_read_once(tmp_path):
    """Retention keeps, marks, then deletes: a stop between any two of them reads each batch once,
    whole if it was not marked yet, else as kept."""
    log = make_log(tmp_path, [BATCH, BATCH, BATCH])
    log.keep(0, {"type": BATCH, "n": "kept 0", "streams": {}})
    assert [e["n"] for _, e in log.batches()] == [0, 1, 2]  # kept, not marked: the entry is whole
    log.mark_pruned(1, [])
    assert [e["n"] for _, e in log.batches()] == ["kept 0", 1, 2]  # marked, not deleted yet
    log.delete(0)
    assert [e["n"] for _, e in log.batches()] == ["kept 0", 1, 2]
