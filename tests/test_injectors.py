"""Injectors: replayable reads, stable ids, honest low watermarks (MillWheel section 5.3 / 6.2)."""

from __future__ import annotations

import json
import os
import threading
import time
import types

import pytest

from millstream import (
    BEGINNING_OF_TIME,
    END_OF_TIME,
    Computation,
    FileInjector,
    GeneratorInjector,
    HeuristicWatermark,
    Pipeline,
    Record,
    ScriptedInjector,
    ValueState,
)
from millstream.injectors import generator as generator_module
from millstream.model.injector import Malformed
from millstream.injectors.files import DONE_MARKER
from millstream.model.records import derive_record_id
from millstream.testing import PipelineHarness


def drain(injector, max_records=None, limit=1000):
    """Read an injector to the end through its contract: [(records, watermark)] per read."""
    offset = injector.initial_offset("0")
    reads = []
    for _ in range(limit):
        end = injector.latest_offset("0", offset, max_records)
        if end == offset:
            break
        reads.append((list(injector.read("0", offset, end)), injector.low_watermark("0", end)))
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
    assert inj.low_watermark("0", inj.initial_offset("0")) == BEGINNING_OF_TIME
    reads, final = drain(inj)
    assert [([r.value for r in recs], wm) for recs, wm in reads] == [([1, 2], 10), ([], 20), ([3], END_OF_TIME)]
    assert inj.is_finished("0", final)
    assert not inj.is_finished("0", {"step": 2})
    assert inj.low_watermark("0", {"step": 2}) == 20


def test_scripted_without_finish_keeps_the_last_watermark():
    inj = ScriptedInjector("s", [([Record("a", 1, 10)], 10)], finish=False)
    reads, final = drain(inj)
    assert reads[-1][1] == 10 and not inj.is_finished("0", final)
    assert ScriptedInjector("e", [], finish=False).low_watermark("0", {"step": 0}) == BEGINNING_OF_TIME
    assert ScriptedInjector("e", []).low_watermark("0", {"step": 0}) == END_OF_TIME


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
    assert list(inj.read("0", start, end)) == list(inj.read("0", start, end))


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
    offset = inj.latest_offset("0", inj.initial_offset("0"), None)
    first, second = list(inj.read("0", inj.initial_offset("0"), offset)), list(inj.read("0", inj.initial_offset("0"), offset))
    assert first == second and len(first) == 30
    assert [r.value for r in first] == list(range(30))
    # The next interval starts where the previous ended: no overlap, no gap.
    nxt = inj.latest_offset("0", offset, 10)
    assert [r.value for r in inj.read("0", offset, nxt)] == list(range(30, 40))
    assert json.loads(json.dumps(nxt)) == nxt  # offsets are checkpointable


def test_generator_watermark_is_the_callers_until_the_end():
    inj = GeneratorInjector(make, total=100, low_watermark=honest)
    assert inj.low_watermark("0", {"next": 0, "started_ms": 0}) == honest(0)
    assert inj.low_watermark("0", {"next": 42, "started_ms": 0}) == honest(42)
    assert inj.low_watermark("0", {"next": 100, "started_ms": 0}) == END_OF_TIME
    reads, final = drain(inj, max_records=17)
    assert inj.is_finished("0", final)
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
    assert sum(len(r) for r, _ in reads) == 0 and inj.is_finished("0", final)
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
    first = inj.latest_offset("0", inj.initial_offset("0"), None)
    assert first == {"next": 0, "started_ms": 1_000_000}
    clock.time = lambda: 1_002.5
    second = inj.latest_offset("0", first, None)
    assert second["next"] == 25
    assert inj.latest_offset("0", second, None) == second  # nothing new until the clock moves
    clock.time = lambda: 5_000.0
    assert inj.latest_offset("0", second, None)["next"] == 100
    assert [r.value for r in inj.read("0", first, second)] == list(range(25))


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_harness_run_reads_a_paced_generator_to_its_end(wrapped):
    # A generator paced in wall time has more to come than what is available at a given moment: a
    # run to the end of the input waits for it rather than stopping with part of it read.
    injector = GeneratorInjector(make, total=60, low_watermark=honest, records_per_second=200, partitions=2)
    h, comp = harness_over(HeuristicWatermark(injector, 0.99) if wrapped else injector)
    started = time.monotonic()
    h.run_injectors()
    assert sorted(r.value for r in comp.records) == list(range(60))
    assert h.input_watermark("c") == END_OF_TIME
    assert time.monotonic() - started >= 0.25  # paced: 60 records at 200 a second


def test_a_paced_generator_says_when_its_next_record_comes(monkeypatch):
    clock = types.SimpleNamespace(time=lambda: 1_000.0)
    monkeypatch.setattr(generator_module, "time", clock)
    inj = GeneratorInjector(make, total=6, low_watermark=honest, records_per_second=2, partitions=2)
    assert inj.next_arrival_s("1", inj.initial_offset("1")) is None  # not started: it moves when asked
    first = inj.latest_offset("1", inj.initial_offset("1"), None)
    assert inj.next_arrival_s("1", first) == 1.0  # index 1 is the second record: 1 s after the start
    clock.time = lambda: 1_000.75
    assert inj.next_arrival_s("1", first) == 0.25
    clock.time = lambda: 1_009.0
    assert inj.next_arrival_s("1", first) == 0.0
    end = inj.latest_offset("1", first, None)
    assert end["next"] == 3 and inj.next_arrival_s("1", end) is None  # finished
    assert GeneratorInjector(make, total=6, low_watermark=honest).next_arrival_s("0", first) is None  # unpaced


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
    write(d, "log-3000.jsonl", [rec("a", 3, 3_100)], 0)
    write(d, "log-1000.jsonl", [rec("a", 1, 1_100)], 0)
    write(d, "log-2000.jsonl", [rec("b", 2, 2_100)], 0)
    inj = FileInjector(d, max_files_per_read=1, creation="name")
    o0 = inj.initial_offset("0")
    assert inj.low_watermark("0", o0) == BEGINNING_OF_TIME
    o1 = inj.latest_offset("0", o0, None)
    assert [r.value for r in inj.read("0", o0, o1)] == [1]  # oldest file first
    assert inj.low_watermark("0", o1) == 2_000  # two unread: min creation time 2000
    o2 = inj.latest_offset("0", o1, None)
    assert [r.value for r in inj.read("0", o1, o2)] == [2] and inj.low_watermark("0", o2) == 3_000
    o3 = inj.latest_offset("0", o2, None)
    assert [r.value for r in inj.read("0", o2, o3)] == [3]
    assert inj.low_watermark("0", o3) == 3_000  # all known read: newest creation time read
    assert inj.latest_offset("0", o3, None) == o3
    assert not inj.is_finished("0", o3)
    write(d, "log-4000.jsonl", [rec("a", 4, 4_100)], 0)  # a new file, created later
    o4 = inj.latest_offset("0", o3, None)
    assert [r.value for r in inj.read("0", o3, o4)] == [4] and inj.low_watermark("0", o4) == 4_000
    # _DONE: once everything is read the watermark is END_OF_TIME.
    open(os.path.join(d, DONE_MARKER), "w").close()
    o5 = inj.latest_offset("0", o4, None)
    assert list(inj.read("0", o4, o5)) == [] and inj.low_watermark("0", o5) == END_OF_TIME and inj.is_finished("0", o5)
    assert json.loads(json.dumps(o5)) == o5


def test_file_names_with_a_visibility_bound_hold_the_watermark_back(tmp_path):
    d = str(tmp_path)
    write(d, "log-5000.jsonl", [rec("a", 1, 5_100)], 0)
    inj = FileInjector(d, creation="name", max_write_ms=300)
    o1 = inj.latest_offset("0", inj.initial_offset("0"), None)
    assert inj.low_watermark("0", o1) == 4_700  # a file created up to 300 ms earlier may still appear


def test_file_done_waits_for_unread_files(tmp_path):
    d = str(tmp_path)
    for i in range(3):
        write(d, f"f{100 * i}.jsonl", [rec("k", i, 100 * i)], 0)
    open(os.path.join(d, DONE_MARKER), "w").close()
    inj = FileInjector(d, max_files_per_read=2, creation="name")
    o1 = inj.latest_offset("0", inj.initial_offset("0"), None)
    assert inj.low_watermark("0", o1) == 200 and not inj.is_finished("0", o1)
    o2 = inj.latest_offset("0", o1, None)
    assert inj.low_watermark("0", o2) == END_OF_TIME


def test_file_watermark_never_goes_back_when_an_older_file_shows_up(tmp_path):
    d = str(tmp_path)
    write(d, "new-5000.jsonl", [rec("k", 1, 5_000)], 0)
    inj = FileInjector(d, creation="name")
    o1 = inj.latest_offset("0", inj.initial_offset("0"), None)
    write(d, "old-1000.jsonl", [rec("k", 2, 1_000)], 0)  # breaks the writer contract
    o2 = inj.latest_offset("0", o1, None)
    assert inj.low_watermark("0", o2) == 5_000
    assert [r.value for r in inj.read("0", o1, o2)] == [2]


def read_all(inj, partition, offset):
    """Read a partition until its offset stops moving: (values read, the last offset)."""
    values = []
    while True:
        end = inj.latest_offset(partition, offset, None)
        if end == offset:
            return values, offset
        values += [r.value for r in inj.read(partition, offset, end)]
        offset = end


def test_partitioned_files_are_read_once_and_an_empty_partition_does_not_hold_the_watermark(tmp_path):
    """Files named by creation time come in creation order over the whole directory: a partition
    that has no file (yet) bounds its next one by the newest file of any partition."""
    d = str(tmp_path)
    for i in range(1, 4):
        write(d, f"log-{1000 * i}.jsonl", [rec("k", i, 1000 * i + 5)], 0)
    inj = FileInjector(d, creation="name", partitions=8)
    assert inj.partitions() == tuple(str(p) for p in range(8))
    read, watermarks = [], []
    for partition in inj.partitions():
        values, offset = read_all(inj, partition, inj.initial_offset(partition))
        read += values
        watermarks.append(inj.low_watermark(partition, offset))
    assert sorted(read) == [1, 2, 3]
    assert watermarks == [3_000] * 8  # the newest visible file's creation time, in every partition


def test_the_offset_forgets_files_gone_from_the_directory(tmp_path):
    """Writers delete log files once read: the offset, written by Spark at every batch, lists only
    the files still there, so it does not grow with every file ever read."""
    d = str(tmp_path)
    inj = FileInjector(d, creation="name")
    offset = inj.initial_offset("0")
    for i in range(1, 50):
        write(d, f"log-{1000 * i}.jsonl", [rec("k", i, 1000 * i)], 0)
        values, offset = read_all(inj, "0", offset)
        assert values == [i]
        if i > 2:
            os.remove(os.path.join(d, f"log-{1000 * (i - 2)}.jsonl"))
    assert len(offset["read"]) <= 3
    assert inj.low_watermark("0", offset) == 49_000


def test_file_mtime_is_exact_to_the_millisecond(tmp_path, monkeypatch):
    # Modification times have nanosecond precision; as a float in seconds they can round up into the
    # next millisecond. The creation estimate uses the millisecond the file was last written in.
    from millstream.injectors import files

    monkeypatch.setattr(files, "now_ms", lambda: 1_800_000_000_000)
    d = str(tmp_path)
    write(d, "older.jsonl", [rec("k", 1, 1_600_000_000_000)], 1_600_000_000_000)
    path = write(d, "newer.jsonl", [rec("k", 2, 1_700_000_000_123)], 0)
    ns = 1_700_000_000_123 * 1_000_000 + 999_999  # just below the next millisecond
    os.utime(path, ns=(ns, ns))
    inj = FileInjector(d, max_files_per_read=1, max_write_ms=100)
    o1 = inj.latest_offset("0", inj.initial_offset("0"), None)
    assert o1["read"] == ["older.jsonl"]
    assert inj.low_watermark("0", o1) == 1_700_000_000_023  # the unread file's mtime minus the write bound
    o2 = inj.latest_offset("0", o1, None)
    # Everything read: a file not visible yet started at most max_write_ms before now.
    assert inj.low_watermark("0", o2) == 1_800_000_000_000 - 100


def _slow_writer(directory: str, name: str, records: int, pause_s: float, started: threading.Event | None = None):
    """An ordinary writer: writes a file elsewhere, one record at a time stamped with the real time
    of writing, then renames it into the log directory. The file's mtime is the end of writing."""
    scratch = os.path.join(directory, "..", "scratch-" + name)
    with open(scratch, "w", encoding="utf-8") as out:
        for i in range(records):
            out.write(json.dumps(rec("k", f"{name}-{i}", int(time.time() * 1000))) + "\n")
            out.flush()
            if started is not None and i == 0:
                started.set()
            time.sleep(pause_s)
    os.rename(scratch, os.path.join(directory, name))


def _late_records_reading_while_files_are_written(directory: str, inj: FileInjector) -> tuple[int, int]:
    """Read the directory while two overlapping slow writers work (the second starts before the
    first ends and is renamed after it); returns (records read, records behind the watermark of
    the read before)."""
    os.makedirs(directory)
    first_started = threading.Event()
    writers = [threading.Thread(target=_slow_writer, args=(directory, "a.jsonl", 6, 0.05, first_started)),
               threading.Thread(target=_slow_writer, args=(directory, "b.jsonl", 12, 0.05))]
    writers[0].start()
    first_started.wait()
    time.sleep(0.1)
    writers[1].start()
    offset, read, late = inj.initial_offset("0"), 0, 0
    while any(w.is_alive() for w in writers) or not inj.latest_offset("0", offset, None)["read"] == offset["read"]:
        end = inj.latest_offset("0", offset, None)
        watermark_before = inj.low_watermark("0", offset)
        for record in inj.read("0", offset, end):
            read += 1
            late += record.timestamp < watermark_before
        offset = end
        time.sleep(0.02)
    return read, late


def test_ordinary_write_then_rename_writers_get_an_honest_watermark(tmp_path):
    # Real file times, nothing set by hand: with the declared write bound no record arrives behind
    # the watermark; taking mtimes as creation times (no bound) makes records late.
    read, late = _late_records_reading_while_files_are_written(
        str(tmp_path / "bounded"), FileInjector(str(tmp_path / "bounded"), max_write_ms=2_000, missing_ok=True))
    assert (read, late) == (18, 0)
    read, late = _late_records_reading_while_files_are_written(
        str(tmp_path / "naive"), FileInjector(str(tmp_path / "naive"), max_write_ms=0, missing_ok=True))
    assert read == 18 and late > 0


def test_file_ids_are_stable_across_rereads_and_instances(tmp_path):
    d = str(tmp_path)
    write(d, "a.jsonl", [rec("k", 1, 1), "", rec("k", 1, 1), rec("k", 2, 2, id="explicit"), rec("k", 3, 3, id=0)], 10)
    inj = FileInjector(d)
    start = inj.initial_offset("0")
    end = inj.latest_offset("0", start, None)
    first = list(inj.read("0", start, end))
    assert first == list(inj.read("0", start, end)) == list(FileInjector(d).read("0", start, end))
    assert [r.id for r in first][2] == "explicit"
    assert [r.id for r in first][3] == "0"  # an explicit falsy id is the record's id
    assert first[0].id != first[1].id  # identical lines, different line numbers
    assert all(r.id for r in first)


def test_an_explicit_falsy_id_is_deduplicated(tmp_path):
    d = str(tmp_path)
    write(d, "a-1.jsonl", [rec("k", "x", 5, id=0)], 0)
    write(d, "b-2.jsonl", [rec("k", "x", 5, id=0)], 0)
    h, comp = harness_over(FileInjector(d, creation="name"))
    h.run_injectors()
    assert len(comp.records) == 1 and h.metrics("c").duplicates == 1


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
    # Python's json reads these, the pipeline's JSON codec refuses them: malformed here, not a stop later.
    ('{"key": "k", "value": NaN, "timestamp": 1}', "JSON has no NaN"),
    ('{"key": "k", "value": {"x": [-Infinity]}, "timestamp": 1}', "JSON has no -Infinity"),
    (json.dumps(rec("k", 1, 1_732_886_400_000_000)), "timestamp is 1732886400000000, outside"),  # microseconds
    ('{"key": "k", "value": 1e400, "timestamp": 1}', "out of a float's range"),  # no float holds it
    # Python's json reads an escaped surrogate half (no UTF-8 text holds it: encoding its key stopped the
    # pipeline, on every restart) and crashes on deep nesting (RecursionError stopped it likewise).
    pytest.param('{"key": "\\ud800", "value": 1, "timestamp": 1}', "not strict JSON", id="surrogate-half"),
    pytest.param('{"key": "k", "value": ' + "[" * 5000 + "]" * 5000 + ', "timestamp": 1}', "nested too deeply",
                 id="nested-5000-deep"),
])
def test_malformed_line_is_yielded_with_file_and_line(tmp_path, line, problem):
    d = str(tmp_path)
    write(d, "bad.jsonl", [rec("k", 1, 1), "", line, rec("k", 2, 2)], 10)
    inj = FileInjector(d)
    start = inj.initial_offset("0")
    items = list(inj.read("0", start, inj.latest_offset("0", start, None)))
    assert [type(i).__name__ for i in items] == ["Record", "Malformed", "Record"]
    assert items[1].position == "bad.jsonl:3" and problem in items[1].error and items[1].raw == line


def test_a_line_that_is_not_utf8_is_malformed_not_delivered_altered(tmp_path):
    # Read with errors="replace", a latin-1 line reached user code as a good record holding U+FFFD
    # where its text was.
    d = str(tmp_path)
    with open(os.path.join(d, "latin.jsonl"), "wb") as out:
        out.write(b'{"key": "a", "value": "ok", "timestamp": 1}\n')
        out.write('{"key": "b", "value": "caf\u00e9", "timestamp": 2}\n'.encode("latin-1"))
        out.write(b'{"key": "c", "value": "ok", "timestamp": 3}\n')
    inj = FileInjector(d)
    start = inj.initial_offset("0")
    items = list(inj.read("0", start, inj.latest_offset("0", start, None)))
    assert [type(i).__name__ for i in items] == ["Record", "Malformed", "Record"]
    assert items[1].position == "latin.jsonl:2" and "not UTF-8" in items[1].error
    assert items[1].raw == '{"key": "b", "value": "caf\ufffd", "timestamp": 2}'  # shown, JSON can carry it
    h, comp = harness_over(FileInjector(d))
    h.run_injectors()
    assert [r.key for r in comp.records] == ["a", "c"] and len(h.dead_letters()) == 1


def test_a_file_whose_name_holds_no_time_is_read_not_skipped(tmp_path):
    # With creation="name", a file whose name the pattern does not match was left out of every
    # listing: its records were lost, silently.
    d = str(tmp_path)
    write(d, "log-1000.jsonl", [rec("k", 1, 1_500)], 0)
    write(d, "log-final.jsonl", [rec("k", 2, 1_600), rec("k", 3, 1_700)], 0)
    write(d, DONE_MARKER, [], 0)
    h, comp = harness_over(FileInjector(d, creation="name"))
    h.run_injectors()
    assert sorted(r.value for r in comp.records) == [1, 2, 3]


class _Rows(ScriptedInjector):
    """A scripted injector standing in for one whose values are input data (files, rows, messages)."""

    values_are_data = True


def test_a_value_the_stream_cannot_carry_is_a_dead_letter_from_data_and_a_stop_from_code():
    # A DataFrame row holding NaN stopped the pipeline on the codec's refusal, on every restart (the
    # batch is staged with it). From an injector whose values are data it is malformed input; from
    # one whose values a user's code builds it is still a mistake, named.
    from millstream.model.codecs import CodecError

    records = [Record("k", 1.5, 1, "r1"), Record("k", float("nan"), 2, "r2"), Record("k", 2.5, 3, "r3")]
    h, comp = harness_over(_Rows("src", [(records, 10)], finish=True))
    h.run_injectors()
    assert [r.value for r in comp.records] == [1.5, 2.5]
    [letter] = h.dead_letters()
    assert letter["record_id"] == "r2" and "cannot carry" in letter["error"] and letter["value"] == "nan"
    h, comp = harness_over(ScriptedInjector("src", [(records, 10)], finish=True))
    with pytest.raises(CodecError, match=r"injector 'src', stream 'in', record 'r2': JSON cannot store nan"):
        h.run_injectors()


def test_malformed_input_goes_to_dead_letters_and_the_pipeline_goes_on(tmp_path):
    d = str(tmp_path)
    write(d, "log-1.jsonl", [rec("k", 1, 1), "{oops", rec("k", 2, 2)], 0)
    h, comp = harness_over(FileInjector(d, creation="name"))
    h.run_injectors()
    assert [r.value for r in comp.records] == [1, 2]
    [letter] = h.dead_letters()
    assert letter["record_id"] == "log-1.jsonl:2" and letter["value"] == "{oops" and letter["sender"] == "src"
    assert "not a record line" in letter["error"] and letter["computation"] == "c"


def test_integers_beyond_64_bits_are_read_exactly(tmp_path):
    d = str(tmp_path)
    values = [-9_999_999_999_999_999_999, 2 ** 64, -(2 ** 63) - 1, 2 ** 63]
    write(d, "big.jsonl", [rec("k", v, 1) for v in values], 10)
    inj = FileInjector(d)
    start = inj.initial_offset("0")
    assert [r.value for r in inj.read("0", start, inj.latest_offset("0", start, None))] == values


def test_lines_the_pipeline_cannot_carry_are_dead_letters_and_the_pipeline_goes_on(tmp_path):
    d = str(tmp_path)
    write(d, "log-1.jsonl", [rec("k", 1, 1), '{"key": "k", "value": NaN, "timestamp": 2}',
                             rec("k", 3, 2 ** 60), rec("k", 4, 4)], 0)
    h, comp = harness_over(FileInjector(d, creation="name"))
    h.run_injectors()
    assert [r.value for r in comp.records] == [1, 4]
    assert sorted(letter["record_id"] for letter in h.dead_letters()) == ["log-1.jsonl:2", "log-1.jsonl:3"]


def test_malformed_input_with_the_fail_policy_stops_with_file_and_line(tmp_path):
    from millstream.testing.harness import InjectorFailed

    d = str(tmp_path)
    write(d, "log-1.jsonl", [rec("k", 1, 1), "{oops"], 0)
    comp = Collect()
    p = (Pipeline("p").add_injector("src", FileInjector(d, creation="name"), "in", on_malformed="fail")
         .add_computation("c", comp, ["in"]))
    with pytest.raises(InjectorFailed, match=r"injector 'src'.*log-1\.jsonl:2.*not a record line"):
        PipelineHarness(p).run_injectors()


def test_file_listing_ignores_other_suffixes_hidden_files_and_missing_directory(tmp_path):
    d = str(tmp_path)
    write(d, "ok.jsonl", [rec("k", 1, 1)], 10)
    write(d, ".hidden.jsonl", [rec("k", 2, 1)], 1)
    write(d, "notes.txt", ["not a record"], 1)
    write(d, "other.csv", ["x"], 1)
    inj = FileInjector(d)
    end = inj.latest_offset("0", inj.initial_offset("0"), None)
    assert end["read"] == ["ok.jsonl"] and [r.value for r in inj.read("0", inj.initial_offset("0"), end)] == [1]
    with pytest.raises(ValueError, match=r"'.*nope' is not a directory.*missing_ok=True"):
        FileInjector(str(tmp_path / "nope"))  # a typo, most likely
    missing = FileInjector(str(tmp_path / "nope"), max_write_ms=1_000, missing_ok=True)
    nothing = missing.latest_offset("0", missing.initial_offset("0"), None)
    assert nothing["read"] == [] and nothing["watermark"] >= time.time() * 1000 - 1_000 - 60_000
    assert FileInjector(d, suffix=".txt").latest_offset("0", {"read": [], "watermark": BEGINNING_OF_TIME,
                                                         "done": False}, None)["read"] == ["notes.txt"]


def test_file_injector_through_harness(tmp_path):
    d = str(tmp_path)
    for i in range(5):
        write(d, f"log{1_000 * i}.jsonl", [rec(f"k{j}", [i, j], 1_000 * i + j) for j in range(4)], 0)
    open(os.path.join(d, DONE_MARKER), "w").close()
    h, comp = harness_over(FileInjector(d, max_files_per_read=2, creation="name"))
    h.run_injectors()
    assert sorted(tuple(r.value) for r in comp.records) == [(i, j) for i in range(5) for j in range(4)]
    assert comp.late == [] and h.input_watermark("c") == END_OF_TIME
    assert h.state("c", "k0") == {"count": 5}


class _Forward(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "out")


def _through_harness(make_record) -> PipelineHarness:
    pipeline = Pipeline("p").add_injector("gen", GeneratorInjector(make_record, total=3, low_watermark=lambda n: 0), "in")
    harness = PipelineHarness(pipeline.add_computation("fwd", _Forward(), ["in"], ["out"]))
    harness.run_injectors()
    return harness


@pytest.mark.parametrize("make_record, message", [
    (lambda i: Record("k", i, str(i)), "injector 'gen' gave a record whose timestamp is a str"),
    (lambda i: Record("k", i, i + 0.5), "injector 'gen' gave a record whose timestamp is a float"),
    (lambda i: Record("k", i, 2**63), "injector 'gen' gave a record whose timestamp is 9223372036854775808, outside"),
    (lambda i: Record(7, i, i), "injector 'gen' gave a record whose key is a int"),
    (lambda i: {"key": "k", "value": i}, "injector '.*' gave a dict .* where a millstream.Record"),
])
def test_what_an_injector_gives_that_is_no_record_is_refused_naming_it(make_record, message):
    from millstream.model.injector import InjectorError

    with pytest.raises(InjectorError, match=message):
        _through_harness(make_record)


def test_a_value_the_streams_codec_refuses_names_the_injector():
    from millstream import CodecError

    with pytest.raises(CodecError, match="injector 'gen', stream 'in'.*set"):
        _through_harness(lambda i: Record("k", {1, 2}, i))


def test_feed_refuses_one_bare_record_and_records_that_are_none():
    from millstream.model.injector import InjectorError

    pipeline = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
    harness = PipelineHarness(pipeline.add_computation("fwd", _Forward(), ["in"], ["out"]))
    with pytest.raises(TypeError, match="wrap one record in a list"):
        harness.feed("src", Record("k", 1, 5))
    with pytest.raises(InjectorError, match="injector 'src' gave a record whose timestamp is a str"):
        harness.feed("src", [Record("k", 1, "5")])


def test_a_finished_file_input_says_nothing_new_however_the_clock_moves(tmp_path):
    # Its offset changed with the clock's watermark on every call: the runner planned an empty batch
    # per trigger for it, and a run could not tell it had read everything.
    (tmp_path / "a.jsonl").write_text('{"key": "a", "value": 1, "timestamp": 5}\n')
    (tmp_path / "_DONE").touch()
    inj = FileInjector(str(tmp_path))
    end = inj.latest_offset("0", inj.initial_offset("0"), None)
    time.sleep(0.005)
    assert end["done"] and inj.latest_offset("0", end, None) == end
    (tmp_path / "_DONE").unlink()  # a finished input stays finished: a run reading it can end
    time.sleep(0.005)
    assert inj.latest_offset("0", end, None) == end
    (tmp_path / "b.jsonl").write_text('{"key": "b", "value": 2, "timestamp": 6}\n')
    assert inj.latest_offset("0", end, None)["read"] == ["a.jsonl", "b.jsonl"]


def test_a_file_line_without_a_value_is_malformed_not_delivered_as_none(tmp_path):
    # {"vale": ...} (a typo) was delivered with value None.
    (tmp_path / "a.jsonl").write_text('{"key": "a", "vale": 1, "timestamp": 5}\n{"key": "b", "value": null, '
                                      '"timestamp": 6}\n')
    inj = FileInjector(str(tmp_path))
    start = inj.initial_offset("0")
    items = list(inj.read("0", start, inj.latest_offset("0", start, None)))
    assert isinstance(items[0], Malformed) and "'value'" in items[0].error
    assert isinstance(items[1], Record) and items[1].value is None  # an explicit null is a value
