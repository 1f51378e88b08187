"""Watermark holds (`ctx.set_timer(..., hold=t)`): a pending timer keeps the computation's output
watermark at or behind t, so what its firing produces at t or later is on time downstream. Ground
truth: the input's own timestamps, and a plain-Python replay of the timers (`expected_published`)."""

from __future__ import annotations

import pickle
import random

import pytest

from millstream import Computation, MapState, Pipeline, Record, ScriptedInjector, TimeDomain
from millstream.core.executor import ComputationFailed
from millstream.core.keystate import KeyState
from millstream.core.store import MemoryKeyStore, StoredKey
from millstream.model.pipeline import ErrorPolicy
from millstream.model.records import BEGINNING_OF_TIME
from millstream.testing import PipelineHarness

DELAY_MS = 1_000


class Stash(Computation):
    """Keeps each key's records and produces them all when a wall-time timer fires DELAY_MS after the
    first: the records a retry produces late in wall time, stamped with their own event time."""

    kept = MapState[str, int]("kept")

    def __init__(self, hold: bool) -> None:
        self.hold = hold

    def process_record(self, ctx, record):
        kept = ctx.state(self.kept)
        kept.put(record.id, record.timestamp)
        earliest = min(ts for _, ts in kept.items())
        ctx.set_timer("flush", ctx.wall_time + DELAY_MS, TimeDomain.WALL_TIME,
                      hold=earliest if self.hold else None)

    def process_timer(self, ctx, timer):
        kept = ctx.state(self.kept)
        for record_id, ts in sorted(kept.items()):
            ctx.produce(Record(ctx.key, record_id, ts), "out")
        kept.clear()


class Judge(Computation):
    """What a consumer sees of each record: its time, the low watermark it is judged by, late or not."""

    def process_record(self, ctx, record):
        ctx.produce(Record(ctx.key, {"ts": record.timestamp, "low_watermark": ctx.low_watermark,
                                     "late": ctx.is_late}, record.timestamp), "judged")


def stash_pipeline(hold: bool) -> Pipeline:
    return (Pipeline("holds")
            .add_injector("a", ScriptedInjector("a", []), "in_a")
            .add_injector("b", ScriptedInjector("b", []), "in_b")
            .add_computation("stash", Stash(hold), ["in_a", "in_b"], ["out"])
            .add_computation("judge", Judge(), ["out"], ["judged"]))


def run_stash(hold: bool) -> tuple[PipelineHarness, list[Record], list[int]]:
    """Two senders feed records; both watermarks then pass them before the wall-time timer fires."""
    rng = random.Random(5)
    fed = []
    h = PipelineHarness(stash_pipeline(hold), wall_time=0)
    for injector in ("a", "b"):
        records = [Record(f"k{rng.randrange(4)}", None, rng.randrange(100, 900)) for _ in range(20)]
        fed.extend(records)
        h.feed(injector, records, watermark=1_000)
    h.run()
    while_pending = []
    for watermark in (3_000, 5_000):
        h.advance_watermark("a", watermark)
        h.advance_watermark("b", watermark)
        h.run()
        while_pending.append(h.low_watermark("stash"))
    h.advance_wall_time(DELAY_MS)
    h.run()
    return h, fed, while_pending


def test_records_a_held_timer_produces_later_are_on_time_downstream():
    h, fed, while_pending = run_stash(hold=True)
    judged = [r.value for r in h.output("judged")]
    assert sorted(j["ts"] for j in judged) == sorted(r.timestamp for r in fed)
    assert [j for j in judged if j["late"]] == []
    assert h.metrics("judge").late == 0
    # held at the earliest kept record while the timer was pending, released when it fired
    assert while_pending == [min(r.timestamp for r in fed)] * 2
    assert h.low_watermark("stash") == 5_000


def test_without_the_hold_the_same_records_are_late():
    # The case the hold exists for: the test above would fail without it.
    h, fed, while_pending = run_stash(hold=False)
    assert while_pending == [3_000, 5_000]
    assert h.metrics("judge").late == len(fed)


def test_a_timer_shows_its_hold_to_process_timer_and_among_the_pending_timers():
    class Shows(Computation):
        def __init__(self):
            self.fired = []

        def process_record(self, ctx, record):
            hold = record.value
            ctx.set_timer(f"t{record.timestamp}", record.timestamp + 100, hold=hold)

        def process_timer(self, ctx, timer):
            self.fired.append((timer.tag, timer.hold))

    shows = Shows()
    p = (Pipeline("shows").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("shows", shows, ["in"], []))
    h = PipelineHarness(p)
    h.feed("src", [Record("k", 5, 10), Record("k", None, 20)], watermark=0)
    h.run()
    assert [(t.tag, t.time, t.hold) for t in h.pending_timers("shows", "k")] == [("t10", 110, 5),
                                                                                 ("t20", 120, None)]
    h.advance_watermark("src", 1_000)
    h.run()
    assert shows.fired == [("t10", 5), ("t20", None)]
    assert h.pending_timers("shows", "k") == []


def test_a_hold_is_released_by_deleting_or_setting_the_timer_again_without_it():
    class Toggle(Computation):
        def process_record(self, ctx, record):
            action = record.value
            if action == "hold":
                ctx.set_timer("t", 10**9, TimeDomain.WALL_TIME, hold=record.timestamp)
            elif action == "plain":
                ctx.set_timer("t", 10**9, TimeDomain.WALL_TIME)
            else:
                ctx.delete_timer("t")

        def process_timer(self, ctx, timer):
            pass

    p = (Pipeline("toggle").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("toggle", Toggle(), ["in"], []))
    h = PipelineHarness(p)
    seen = []
    for action, ts, watermark in (("hold", 100, 200), ("plain", 300, 400), ("hold", 450, 500),
                                  ("delete", 600, 700)):
        h.feed("src", [Record("k", action, ts)], watermark=watermark)
        h.run()
        seen.append(h.low_watermark("toggle"))
    assert seen == [100, 400, 450, 700]


def test_the_earliest_hold_over_keys_and_key_groups_holds_and_the_watermark_never_goes_back():
    class Holder(Computation):
        def process_record(self, ctx, record):
            if record.value is None:
                ctx.delete_timer("t")
            else:
                ctx.set_timer("t", 10**9, TimeDomain.WALL_TIME, hold=record.value)

        def process_timer(self, ctx, timer):
            pass

    p = (Pipeline("keys").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("holder", Holder(), ["in"], []))
    h = PipelineHarness(p, key_groups=8)
    h.feed("src", [Record(f"k{i}", 1_000 + 10 * i, 2_000) for i in range(20)], watermark=5_000)
    h.run()
    assert h.low_watermark("holder") == 1_000
    h.feed("src", [Record("k0", None, 5_000), Record("k1", None, 5_000)], watermark=6_000)
    h.run()
    assert h.low_watermark("holder") == 1_020  # k2's hold, in whatever key group it is
    h.feed("src", [Record("k5", 10, 6_000)], watermark=7_000)  # a hold behind what was published
    h.run()
    assert h.low_watermark("holder") == 1_020  # holds it where it is: never back
    h.feed("src", [Record(f"k{i}", None, 7_000) for i in range(20)], watermark=8_000)
    h.run()
    assert h.low_watermark("holder") == 8_000


class Juggler(Computation):
    """Per record, the timer operations its value lists: ["set", tag, time, hold or None] or
    ["delete", tag]. A firing produces a record stamped at its hold (at its time without one)."""

    def __init__(self) -> None:
        self.holds_seen: dict[str, int] = {}

    def process_record(self, ctx, record):
        for op in record.value:
            if op[0] == "set":
                _, tag, time, hold = op
                ctx.set_timer(tag, time, hold=hold)
            else:
                ctx.delete_timer(op[1])

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, timer.tag, timer.time), "out")


def random_script(rng: random.Random, points: int) -> list[tuple[list[Record], int]]:
    script, watermark, t = [], 0, 0
    for _ in range(points):
        records = []
        for _ in range(rng.randrange(0, 4)):
            key = f"k{rng.randrange(3)}"
            ops = []
            for _ in range(rng.randrange(1, 3)):
                tag = f"t{rng.randrange(3)}"
                if rng.random() < 0.25:
                    ops.append(["delete", tag])
                else:
                    time = watermark + rng.randrange(1, 400)
                    hold = rng.choice([None, watermark + rng.randrange(-50, 300)])
                    ops.append(["set", tag, time, hold])
            t += 1
            records.append(Record(key, ops, watermark + rng.randrange(0, 50)))
        watermark += rng.randrange(0, 150)
        script.append((records, watermark))
    return script


def expected_published(script: list[tuple[list[Record], int]]) -> list[int]:
    """The output watermark after each point, replayed in plain Python: a point's records set and
    delete timers in order, then every timer due by the point's watermark fires (a firing sets
    nothing); the watermark is the earlier of the input watermark and the pending holds, never back."""
    timers: dict[tuple[str, str], tuple[int, int | None]] = {}
    published, current = [], BEGINNING_OF_TIME
    for records, watermark in script:
        for record in records:
            for op in record.value:
                if op[0] == "set":
                    timers[(record.key, op[1])] = (op[2], op[3])
                else:
                    timers.pop((record.key, op[1]), None)
        for name in [name for name, (time, _) in timers.items() if time <= watermark]:
            del timers[name]
        holds = [hold for _, hold in timers.values() if hold is not None]
        current = max(current, min([watermark, *holds]))
        published.append(current)
    return published


def juggler_harness() -> PipelineHarness:
    p = (Pipeline("juggle").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("juggler", Juggler(), ["in"], ["out"])
         .add_computation("judge", Judge(), ["out"], ["judged"]))
    return PipelineHarness(p, key_groups=2)


@pytest.mark.parametrize("seed", range(40))
def test_published_watermarks_follow_the_holds_whatever_the_batching(seed):
    script = random_script(random.Random(seed), 8)
    one_at_a_time = juggler_harness()
    for records, watermark in script:
        one_at_a_time.feed("src", records, watermark=watermark)
        one_at_a_time.run()
    assert one_at_a_time.watermark_history("juggler") == expected_published(script)
    merged = juggler_harness()  # every point in one step of the juggler
    for records, watermark in script:
        merged.feed("src", records, watermark=watermark)
    merged.run()
    assert merged.low_watermark("juggler") == expected_published(script)[-1]
    # what the consumer saw of each record: the same input points, the same watermarks
    assert [r.value for r in merged.output("judged")] == [r.value for r in one_at_a_time.output("judged")]


def test_a_failed_record_s_hold_is_rolled_back_with_it():
    class Failing(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer(record.value["tag"], 10**9, TimeDomain.WALL_TIME, hold=record.timestamp)
            if record.value.get("fail"):
                raise ValueError("bad record")

        def process_timer(self, ctx, timer):
            pass

    p = (Pipeline("fail").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("failing", Failing(), ["in"], [], on_error=ErrorPolicy.DEAD_LETTER))
    h = PipelineHarness(p)
    # The first failure makes the key's step run again without it, taking checkpoints; the second
    # rolls the key back to the last checkpoint, holds included.
    records = [Record("k", {"tag": f"t{i}"}, 500 + i) for i in range(60)]
    records.insert(20, Record("k", {"tag": "early", "fail": True}, 100))
    records.insert(50, Record("k", {"tag": "later", "fail": True}, 200))
    h.feed("src", records, watermark=1_000)
    h.run()
    assert len(h.dead_letters()) == 2
    assert h.low_watermark("failing") == 500


def test_a_hold_first_set_after_the_checkpoint_a_failure_rolls_back_to():
    class Late(Computation):
        def process_record(self, ctx, record):
            if record.value.get("hold"):
                ctx.set_timer("t", 10**9, TimeDomain.WALL_TIME, hold=record.timestamp)
            if record.value.get("fail"):
                raise ValueError("bad record")

        def process_timer(self, ctx, timer):
            pass

    p = (Pipeline("late").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("late", Late(), ["in"], [], on_error=ErrorPolicy.DEAD_LETTER))
    h = PipelineHarness(p)
    # The rerun after the first failure checkpoints before records 0, 16 and 48; the hold comes
    # after the last of them, and the second failure rolls back to it and replays the hold.
    records = [Record("k", {}, 500 + i) for i in range(60)]
    records[5] = Record("k", {"fail": True}, 505)
    records[49] = Record("k", {"hold": True}, 549)
    records[50] = Record("k", {"fail": True}, 550)
    h.feed("src", records, watermark=1_000)
    h.run()
    assert len(h.dead_letters()) == 2
    assert h.low_watermark("late") == 549


def test_a_bad_hold_is_refused_naming_the_timer():
    class Bad(Computation):
        def process_record(self, ctx, record):
            ctx.set_timer("retry", 5, TimeDomain.WALL_TIME, hold=record.value)

    for value, words in (("soon", "hold must be int milliseconds"), (2**62, "out of range")):
        p = (Pipeline("bad").add_injector("src", ScriptedInjector("src", []), "in")
             .add_computation("bad", Bad(), ["in"], []))
        h = PipelineHarness(p)
        h.feed("src", [Record("k", value, 1)], watermark=2)
        with pytest.raises(Exception) as raised:
            h.run()
        assert words in str(raised.value) and "'retry'" in str(raised.value)


def test_holds_persist_with_the_key_and_old_blobs_and_stored_keys_still_load():
    state = KeyState()
    state.timers["t"] = (5, True, "s", "")
    state.holds["t"] = 3
    again = KeyState.loads(state.dumps())
    assert again.holds == {"t": 3} and again.hold() == 3
    old = pickle.dumps(({}, {}, ["t"], [(5, True, "s", "")]), protocol=5)  # a blob from before holds
    assert KeyState.loads(old).holds == {} and KeyState.loads(old).timers == {"t": (5, True, "s", "")}
    assert StoredKey.of((b"x", 1, None, ())).hold is None
    assert StoredKey.of((b"x", 1, None, (), 7)).hold == 7


def test_the_store_finds_the_earliest_hold_past_stale_and_excluded_keys():
    store = MemoryKeyStore()
    store.apply({"a": StoredKey(b"", None, None, (), 10), "b": StoredKey(b"", None, None, (), 20),
                 "c": StoredKey(b"", None, None, (), None)})
    assert store.min_hold() == 10
    assert store.min_hold({"a"}) == 20
    assert store.min_hold() == 10  # excluding puts the passed-over entries back
    store.apply({"a": StoredKey(b"", None, None, (), 30), "b": None})
    assert store.min_hold() == 30  # a's old hold and b's are stale
    store.apply({"a": StoredKey(b"", None, None, (), None)})
    assert store.min_hold() is None



def test_a_held_computation_whose_inputs_are_all_idle_is_not_idle_downstream():
    # Idle, it would be left out of its consumer's watermark, and the hold with it.
    p = (Pipeline("idle").add_injector("a", ScriptedInjector("a", []), "in_a")
         .add_injector("c", ScriptedInjector("c", []), "in_c")
         .add_computation("stash", Stash(hold=True), ["in_a"], ["out"])
         .add_computation("judge", Judge(), ["out", "in_c"], ["judged"]))
    h = PipelineHarness(p, wall_time=0)
    kept = [Record("k", None, 100), Record("k", None, 200)]
    h.feed("a", kept, watermark=1_000)
    h.feed("c", [], watermark=1_000)
    h.run()
    h.declare_idle("a")  # the stash's only input goes quiet while its timer holds
    h.run()
    h.advance_watermark("c", 5_000)
    h.run()
    assert h.input_watermark("judge") == 100
    h.advance_wall_time(DELAY_MS)
    h.run()
    judged = [r.value for r in h.output("judged")]
    assert sorted(j["ts"] for j in judged) == [100, 200] and not any(j["late"] for j in judged)


def test_a_weak_computation_that_holds_is_refused_as_on_spark():
    p = (Pipeline("weak").add_injector("src", ScriptedInjector("src", []), "in")
         .add_computation("stash", Stash(hold=True), ["in"], ["out"], production="weak")
         .add_computation("judge", Judge(), ["out"], ["judged"]))
    h = PipelineHarness(p)
    h.feed("src", [Record("k", None, 1)], watermark=2)
    with pytest.raises(ComputationFailed, match="'stash' holds its output watermark.*strong productions"):
        h.run()
