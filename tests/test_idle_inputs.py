"""Idle inputs (seed 001's idle message, MillWheel's strict minimum relaxed on purpose): a quiet
injector partition declares itself idle after its timeout, consumers leave it out of their low
watermark, so the active input's windows fire on time and no earlier than it allows; when the quiet
input comes back behind the watermark, its records are late (flagged, counted), never dropped; a
computation all of whose inputs are idle is idle too, downstream."""

from __future__ import annotations

from typing import Any, Iterator

from bucket_counter import LateAwareCounter

from millstream import Computation, Injector, Pipeline, Record
from millstream.model.injector import Offset
from millstream.testing import PipelineHarness


class Controlled(Injector):
    """Records released by the test: `release(records, watermark)` makes them readable."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[tuple[list[Record[Any]], int]] = []

    def release(self, records: list[Record[Any]], watermark: int) -> None:
        self.batches.append(([r.with_id(f"{self.name}-{len(self.batches)}-{i}") for i, r in enumerate(records)],
                             watermark))

    def initial_offset(self, partition: str) -> Offset:
        return {"n": 0}

    def latest_offset(self, partition: str, start: Offset, max_records: int | None) -> Offset:
        return {"n": len(self.batches)}

    def read(self, partition: str, start: Offset, end: Offset) -> Iterator[Record[Any]]:
        for records, _ in self.batches[start["n"]:end["n"]]:
            yield from records

    def low_watermark(self, partition: str, offset: Offset) -> int:
        return self.batches[offset["n"] - 1][1] if offset["n"] else -(2**47)


class Forward(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "copy")


def build(quiet_after_ms: int | None):
    active, quiet = Controlled("active"), Controlled("quiet")
    pipeline = (Pipeline("idle")
                .add_injector("active", active, "in")
                .add_injector("quiet", quiet, "in", idle_after_ms=quiet_after_ms)
                .add_computation("windows", LateAwareCounter(100), ["in"], ["windows", "late"])
                .add_computation("forward", Forward(), ["windows"], ["copy"]))
    return pipeline, active, quiet


def test_a_quiet_input_declared_idle_no_longer_holds_the_active_side_back():
    pipeline, active, quiet = build(quiet_after_ms=1_000)
    h = PipelineHarness(pipeline)
    active.release([Record("k", 1, 10), Record("k", 1, 150)], 200)
    quiet.release([Record("k", 1, 20)], 200)
    h.run_injectors()
    assert [w.value["bucket"] for w in h.output("windows")] == [0, 100]
    # The quiet input sends nothing more; the active one goes on.
    for t in range(300, 1_300, 100):
        active.release([Record("k", 1, t - 50)], t)
        h.advance_wall_time(h.wall_time + 250)
        h.run_injectors()
        windows = h.output("windows")
        # Never earlier than the active side allows: a window ending at E fired once its watermark >= E.
        assert all(w.value["fired_at"] >= w.timestamp for w in windows)
        # And on time once the quiet side is idle (after 1000 ms of wall time without news).
        if h.wall_time >= 1_000:
            assert windows[-1].timestamp == t - t % 100, (t, [w.timestamp for w in windows])
    assert h.input_watermark("windows") == 1_200
    # The quiet input comes back behind the watermark: its records are late, flagged, not dropped.
    quiet.release([Record("k", 1, 500), Record("k", 1, 1_250)], 1_300)
    h.run_injectors()
    assert [r.value["late"] for r in h.output("late")] == [500]
    assert h.metrics("windows").late == 1 and h.input_watermark("windows") == 1_200


def test_without_an_idle_timeout_a_quiet_input_holds_the_watermark():
    pipeline, active, quiet = build(quiet_after_ms=None)
    h = PipelineHarness(pipeline)
    active.release([Record("k", 1, 10)], 200)
    quiet.release([Record("k", 1, 20)], 200)
    for t in range(300, 1_300, 100):
        active.release([Record("k", 1, t - 50)], t)
        h.advance_wall_time(h.wall_time + 250)
        h.run_injectors()
    assert h.input_watermark("windows") == 200
    assert [w.value["bucket"] for w in h.output("windows")] == [0]  # held at the quiet input's 200


def test_a_computation_whose_inputs_are_all_idle_is_idle_downstream():
    pipeline, active, quiet = build(quiet_after_ms=500)
    h = PipelineHarness(pipeline)
    active.release([Record("k", 1, 10)], 200)
    quiet.release([Record("k", 1, 20)], 200)
    h.run_injectors()
    h.declare_idle("active")
    h.advance_wall_time(600)
    h.run_injectors()
    forward = h._run("forward").coalescer
    assert forward.is_idle("windows/windows") and h.input_watermark("forward") == 200
