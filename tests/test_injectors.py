"""Injectors: replayable reads, stable ids, honest low watermarks (MillWheel section 5.3 / 6.2)."""

from __future__ import annotations

import json
import os
import types

import pytest

from millstream import (
    BEGINNING_OF_TIME,
    END_OF_TIME,
    Computation,
    FileInjector,
    GeneratorInjector,
    Pipeline,
    Record,
    ScriptedInjector,
    ValueState,
)
from millstream.injectors import generator as generator_module
from millstream.injectors.files import DONE_MARKER, FileFormatError
from millstream.model.records import derive_record_id
from millstream.testing import PipelineHarness


def drain(injector, max_records=None, limit=1000):
    """Read an injector to the end through its contract: [(records, watermark)] per read."""
    offset = injector.initial_offset()
    reads = []
    for _ in range(limit):
        end = injector.latest_offset(offset, max_records)
        if end == offset:
            break
        reads.append((list(injector.read(offset, end)), injector.low_watermark(end)))
        offset = end
    return reads, offset


class Collect(Computation):
    count = ValueState("count", default=0)

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.late: list[Record] = []

    def process_record(self, ctx, record):
        self.records.append(record)
        if ctx.is_late:
            self.late.append(record)
        ctx.state(self.count).set(ctx.state(self.count).get() + 1)


def harness_over(injector, **kwargs):
    comp = Collect()
    p = Pipeline("p").add_injector("src", injector, "in").add_computation("c", comp, ["in"], **kwargs)
    return PipelineHarness(p), comp


# -- ScriptedInjector ------------------------------------------------------------------------------
def test_scripted_releases_one_step_per_read_with_its_watermark():
    inj = ScriptedInjector("s", [([Record("a", 1, 10), Record("b", 2, 12)], 10), ([], 20),
                                  ([Record("a", 3, 25)], 25)])
    assert inj.low_watermark(inj.initial_offset()) == BEGINNING_OF_TIME
    reads, final = drain(inj)
    assert [([r.value for r in recs], wm) for recs, wm in reads] == [([1, 2], 10), ([], 20), ([3], END_OF_TIME)]
    assert inj.is_finished(final)
    assert not inj.is_finished({"step": 2})
    assert inj.low_watermark({"step": 2}) == 20


def test_scripted_without_finish_keeps_the_last_watermark():
    inj = ScriptedInjector("s", [([Record("a", 1, 10)], 10)], finish=False)
    reads, final = drain(inj)
    assert reads[-1][1] == 10 and not inj.is_finished(final)
    assert ScriptedInjector("e", [], finish=False).low_watermark({"step": 0}) == BEGINNING_OF_TIME
    assert ScriptedInjector("e", []).low_watermark({"step": 0}) == END_OF_TIME


def test_scripted_ids_are_deterministic_distinct_and_explicit_ids_kept():
    script = [([Record("a", 1, 1), Record("a", 1, 1), Record("b", 2, 2, "mine")], 5), ([Record("a", 1, 1)], 6)]
    first = [r.id for recs, _ in drain(ScriptedInjector("s", script))[0] for r in recs]
    again = [r.id for recs, _ in drain(ScriptedInjector("s", script))[0] for r in recs]
    other = [r.id for recs, _ in drain(ScriptedInjector("t", script))[0] for r in recs]
    assert first == again
    assert first[2] == "mine"
    assert first[0] == derive_record_id("s", "step0", 0)
    assert len({first[0], first[1], first[3]}) == 3  # equal records, different positions
    assert set(first).isdisjoint(set(other) - {"mine"})


def test_scripted_rereading_an_interval_gives_identical_records():
    inj = ScriptedInjector("s", [([Record("a", i, i) for i in range(5)], 4), ([Record("b", 9, 9)], 9)])
    start, end = {"step": 0}, {"step": 2}
    assert list(inj.read(start, end)) == list(inj.read(start, end))


def test_scripted_watermark_may_not_go_back():
    with pytest.raises(ValueError, match=r"step 1: watermark 5 goes back from 10"):
        ScriptedInjector("s", [([], 10), ([], 5)])


def test_scripted_through_harness_delivers_everything_and_finishes():
    inj = ScriptedInjector("s", [([Record("a", 1, 10)], 10), ([Record("a", 2, 15), Record("b", 3, 11)], 20)])
    h, comp = harness_over(inj)
    h.run_injectors()
    assert sorted(r.value for r in comp.records) == [1, 2, 3]
    assert comp.late == []
    assert h.input_watermark("c") == END_OF_TIME


# -- GeneratorInjector -----------------------------------------------------------------------------
def make(i: int) -> Record:
    # Bounded disorder: base time 10*i, jitter up to 25 ms either way.
    return Record(f"k{i % 7}", i, 10 * i + ((i * 37) % 51) - 25, f"gen-{i}")


def honest(n: int) -> int:
    return 10 * n - 25  # <= every timestamp with index >= n


def test_generator_read_is_deterministic_replay():
    inj = GeneratorInjector(make, total=100, low_watermark=honest, max_records_per_read=30)
    offset = inj.latest_offset(inj.initial_offset(), None)
    first, second = list(inj.read(inj.initial_offset(), offset)), list(inj.read(inj.initial_offset(), offset))
    assert first == second and len(first) == 30
    assert [r.value for r in first] == list(range(30))
    # The next interval starts where the previous ended: no overlap, no gap.
    nxt = inj.latest_offset(offset, 10)
    assert [r.value for r in inj.read(offset, nxt)] == list(range(30, 40))
    assert json.loads(json.dumps(nxt)) == nxt  # offsets are checkpointable


def test_generator_watermark_is_the_callers_until_the_end():
    inj = GeneratorInjector(make, total=100, low_watermark=honest)
    assert inj.low_watermark({"next": 0, "started_ms": 0}) == honest(0)
    assert inj.low_watermark({"next": 42, "started_ms": 0}) == honest(42)
    assert inj.low_watermark({"next": 100, "started_ms": 0}) == END_OF_TIME
    reads, final = drain(inj, max_records=17)
    assert inj.is_finished(final)
    assert [len(recs) for recs, _ in reads] == [17] * 5 + [15]
    assert [wm for _, wm in reads] == [honest(17 * n) for n in range(1, 6)] + [END_OF_TIME]
    # Honesty of the watermark the caller supplied: nothing read later is behind it.
    offset = 0
    for recs, wm in reads:
        offset += len(recs)
        later = [make(i).timestamp for i in range(offset, 100)]
        assert all(ts >= wm for ts in later)


def test_generator_with_no_records_finishes_immediately():
    inj = GeneratorInjector(make, total=0, low_watermark=honest)
    reads, final = drain(inj)
    assert sum(len(r) for r, _ in reads) == 0 and inj.is_finished(final)
    with pytest.raises(ValueError, match="total must be >= 0"):
        GeneratorInjector(make, total=-1, low_watermark=honest)


def test_generator_honest_watermark_means_no_late_records_in_a_harness_run():
    h, comp = harness_over(GeneratorInjector(make, total=500, low_watermark=honest, max_records_per_read=40))
    h.run_injectors(max_records_per_step=23)
    assert sorted(r.value for r in comp.records) == list(range(500))
    assert comp.late == [] and h.metrics("c").late == 0
    assert h.input_watermark("c") == END_OF_TIME


def test_generator_dishonest_watermark_delivers_late_records_flagged():
    h, comp = harness_over(GeneratorInjector(make, total=200, low_watermark=lambda n: 10 * n + 30,
                                             max_records_per_read=20))
    h.run_injectors(max_records_per_step=20)
    assert len(comp.records) == 200  # late records are still delivered...
    assert comp.late and h.metrics("c").late == len(comp.late)  # ...flagged and counted
    assert all(r.timestamp < 10 * (r.value - r.value % 20) + 30 for r in comp.late)


def test_generator_records_without_ids_get_distinct_deterministic_ids():
    inj = GeneratorInjector(lambda i: Record("same-key", i, i), total=50, low_watermark=lambda n: n)
    reads, _ = drain(inj)
    ids = [r.id for recs, _ in reads for r in recs]
    assert all(ids) and len(set(ids)) == 50
    assert ids == [r.id for recs, _ in drain(GeneratorInjector(lambda i: Record("same-key", i, i), total=50,
                                                               low_watermark=lambda n: n))[0] for r in recs]
    h, comp = harness_over(GeneratorInjector(lambda i: Record("same-key", i, i), total=50,
                                             low_watermark=lambda n: n))
    h.run_injectors()
    assert len(comp.records) == 50, "records of one key were deduplicated away"


def test_generator_pacing_follows_the_clock_and_replays_without_it(monkeypatch):
    clock = types.SimpleNamespace(time=lambda: 1_000.0)
    monkeypatch.setattr(generator_module, "time", clock)
    inj = GeneratorInjector(make, total=100, low_watermark=honest, records_per_second=10)
    first = inj.latest_offset(inj.initial_offset(), None)
    assert first == {"next": 0, "started_ms": 1_000_000}
    clock.time = lambda: 1_002.5
    second = inj.latest_offset(first, None)
    assert second["next"] == 25
    assert inj.latest_offset(second, None) == second  # nothing new until the clock moves
    clock.time = lambda: 5_000.0
    assert inj.latest_offset(second, None)["next"] == 100
    assert [r.value for r in inj.read(first, second)] == list(range(25))


# -- FileInjector ----------------------------------------------------------------------------------
def write(directory, name, lines, created_ms):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    os.utime(path, ns=(created_ms * 1_000_000, created_ms * 1_000_000))
    return path


def rec(key, value, ts, **extra):
    return {"key": key, "value": value, "timestamp": ts, **extra}


def test_file_watermark_is_min_creation_time_of_unread_files(tmp_path):
    d = str(tmp_path)
    write(d, "c.jsonl", [rec("a", 3, 3_100)], 3_000)
    write(d, "a.jsonl", [rec("a", 1, 1_100)], 1_000)
    write(d, "b.jsonl", [rec("b", 2, 2_100)], 2_000)
    inj = FileInjector(d, max_files_per_read=1)
    o0 = inj.initial_offset()
    assert inj.low_watermark(o0) == BEGINNING_OF_TIME
    o1 = inj.latest_offset(o0, None)
    assert [r.value for r in inj.read(o0, o1)] == [1]  # oldest file first
    assert inj.low_watermark(o1) == 2_000  # b and c unread: min creation time 2000
    o2 = inj.latest_offset(o1, None)
    assert [r.value for r in inj.read(o1, o2)] == [2] and inj.low_watermark(o2) == 3_000
    o3 = inj.latest_offset(o2, None)
    assert [r.value for r in inj.read(o2, o3)] == [3]
    assert inj.low_watermark(o3) == 3_000  # all known read: newest creation time read
    assert inj.latest_offset(o3, None) == o3
    assert not inj.is_finished(o3)
    # A new file (created later) appears.
    write(d, "d.jsonl", [rec("a", 4, 4_100)], 4_000)
    o4 = inj.latest_offset(o3, None)
    assert [r.value for r in inj.read(o3, o4)] == [4] and inj.low_watermark(o4) == 4_000
    # _DONE: once everything is read the watermark is END_OF_TIME.
    open(os.path.join(d, DONE_MARKER), "w").close()
    o5 = inj.latest_offset(o4, None)
    assert list(inj.read(o4, o5)) == [] and inj.low_watermark(o5) == END_OF_TIME and inj.is_finished(o5)
    assert json.loads(json.dumps(o5)) == o5


def test_file_done_waits_for_unread_files(tmp_path):
    d = str(tmp_path)
    for i in range(3):
        write(d, f"f{i}.jsonl", [rec("k", i, 100 * i)], 100 * i)
    open(os.path.join(d, DONE_MARKER), "w").close()
    inj = FileInjector(d, max_files_per_read=2)
    o1 = inj.latest_offset(inj.initial_offset(), None)
    assert inj.low_watermark(o1) == 200 and not inj.is_finished(o1)
    o2 = inj.latest_offset(o1, None)
    assert inj.low_watermark(o2) == END_OF_TIME


def test_file_watermark_never_goes_back_when_an_older_file_shows_up(tmp_path):
    d = str(tmp_path)
    write(d, "new.jsonl", [rec("k", 1, 5_000)], 5_000)
    inj = FileInjector(d)
    o1 = inj.latest_offset(inj.initial_offset(), None)
    write(d, "old.jsonl", [rec("k", 2, 1_000)], 1_000)  # breaks the writer contract
    o2 = inj.latest_offset(o1, None)
    assert inj.low_watermark(o2) == 5_000
    assert [r.value for r in inj.read(o1, o2)] == [2]


def test_file_creation_time_is_exact_to_the_millisecond(tmp_path):
    # Modification times have nanosecond precision; as a float in seconds they can round up into the
    # next millisecond. The creation time is the millisecond the file was created in.
    d = str(tmp_path)
    write(d, "older.jsonl", [rec("k", 1, 1_600_000_000_000)], 1_600_000_000_000)
    path = write(d, "newer.jsonl", [rec("k", 2, 1_700_000_000_123)], 0)
    ns = 1_700_000_000_123 * 1_000_000 + 999_999  # just below the next millisecond
    os.utime(path, ns=(ns, ns))
    inj = FileInjector(d, max_files_per_read=1)
    o1 = inj.latest_offset(inj.initial_offset(), None)
    assert o1["read"] == ["older.jsonl"]
    assert inj.low_watermark(o1) == 1_700_000_000_123  # the unread file's creation time
    o2 = inj.latest_offset(o1, None)
    assert inj.low_watermark(o2) == 1_700_000_000_123  # everything read: the newest creation time


def test_file_ids_are_stable_across_rereads_and_instances(tmp_path):
    d = str(tmp_path)
    write(d, "a.jsonl", [rec("k", 1, 1), "", rec("k", 1, 1), rec("k", 2, 2, id="explicit")], 10)
    inj = FileInjector(d)
    start = inj.initial_offset()
    end = inj.latest_offset(start, None)
    first = list(inj.read(start, end))
    assert first == list(inj.read(start, end)) == list(FileInjector(d).read(start, end))
    assert [r.id for r in first][2] == "explicit"
    assert first[0].id != first[1].id  # identical lines, different line numbers
    assert all(r.id for r in first)


def test_file_records_of_two_directories_do_not_collide(tmp_path):
    # Two log directories with the same file names feeding one computation (a union): the records are
    # different, so their ids must differ or exactly-once delivery would drop half of them.
    for sub in ("east", "west"):
        os.mkdir(tmp_path / sub)
        write(str(tmp_path / sub), "part-0000.jsonl", [rec("user", sub, 1)], 1)
    comp = Collect()
    p = (Pipeline("p").add_injector("east", FileInjector(str(tmp_path / "east")), "in")
         .add_injector("west", FileInjector(str(tmp_path / "west")), "in")
         .add_computation("c", comp, ["in"]))
    h = PipelineHarness(p)
    h.pull_injectors()
    h.step()
    assert sorted(r.value for r in comp.records) == ["east", "west"]


@pytest.mark.parametrize("line, problem", [
    ("{not json", "not a record line"),
    (json.dumps({"value": 1, "timestamp": 1}), "not a record line"),  # no key
    (json.dumps({"key": "k", "value": 1}), "not a record line"),  # no timestamp
    (json.dumps([1, 2, 3]), "not a record line"),
    (json.dumps("text"), "not a record line"),
    (json.dumps(rec(5, 1, 1)), "key must be a string"),
    (json.dumps(rec("k", 1, 1.5)), "timestamp integer milliseconds"),
    (json.dumps(rec("k", 1, True)), "timestamp integer milliseconds"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, problem):
    d = str(tmp_path)
    write(d, "bad.jsonl", [rec("k", 1, 1), "", line], 10)
    inj = FileInjector(d)
    start = inj.initial_offset()
    with pytest.raises(FileFormatError, match=rf"^bad\.jsonl:3: .*{problem}"):
        list(inj.read(start, inj.latest_offset(start, None)))


def test_file_listing_ignores_other_suffixes_hidden_files_and_missing_directory(tmp_path):
    d = str(tmp_path)
    write(d, "ok.jsonl", [rec("k", 1, 1)], 10)
    write(d, ".hidden.jsonl", [rec("k", 2, 1)], 1)
    write(d, "notes.txt", ["not a record"], 1)
    write(d, "other.csv", ["x"], 1)
    inj = FileInjector(d)
    end = inj.latest_offset(inj.initial_offset(), None)
    assert end["read"] == ["ok.jsonl"] and [r.value for r in inj.read(inj.initial_offset(), end)] == [1]
    missing = FileInjector(str(tmp_path / "nope"))
    assert missing.latest_offset(missing.initial_offset(), None) == missing.initial_offset()
    assert FileInjector(d, suffix=".txt").latest_offset({"read": [], "watermark": BEGINNING_OF_TIME,
                                                         "done": False}, None)["read"] == ["notes.txt"]


def test_file_injector_through_harness(tmp_path):
    d = str(tmp_path)
    for i in range(5):
        write(d, f"log{i}.jsonl", [rec(f"k{j}", [i, j], 1_000 * i + j) for j in range(4)], 1_000 * i)
    open(os.path.join(d, DONE_MARKER), "w").close()
    h, comp = harness_over(FileInjector(d, max_files_per_read=2))
    h.run_injectors()
    assert sorted(tuple(r.value) for r in comp.records) == [(i, j) for i in range(5) for j in range(4)]
    assert comp.late == [] and h.input_watermark("c") == END_OF_TIME
    assert h.state("c", "k0") == {"count": 5}
