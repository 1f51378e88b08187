"""The skew limit on a root that ran before the unheld watermark (`~unheld`, core/watermarks.py:
skew_watermark) existed: its statuses and offsets carry no such key. Driven through the Spark
source's batch planning (`plan_next_batch`) with the statuses the older code wrote; no Spark."""

from __future__ import annotations

from test_skew_limit import session_pipeline

from millstream import Computation, GeneratorInjector, Pipeline, Record
from millstream.core.plan import plan_computation
from millstream.model.pipeline import ErrorPolicy
from millstream.spark.partitioning import GroupLabels
from millstream.spark.rootfiles import latest_status
from millstream.spark.source import Sender, SourcePlan, initial_offset, plan_next_batch
from millstream.spark.storage import Storage

BEGINNING = -(1 << 47)


def source_for(pipeline: Pipeline, name: str, root: str) -> SourcePlan:
    """The source plan of computation `name`'s query, reading a record per batch."""
    plan = plan_computation(pipeline, name)
    node = pipeline.injectors["src"]
    senders = tuple(Sender(s, node.injector, True, ErrorPolicy.DEAD_LETTER, None, node.max_skew_ms,
                           tuple(pipeline.downstream(s.stream))) for s in plan.senders())
    return SourcePlan(plan, root, senders, f"wake-{name}.json", GroupLabels(tuple(range(plan.key_groups))),
                      batch_cap=1)


def test_a_root_stalled_by_a_hold_before_the_unheld_watermark_reads_on(tmp_path):
    """The gap session held at 1 s while the injector had read to 4 s under a 2 s limit, as the
    older code left it (statuses with the held watermark and no ~unheld): the source plans again,
    since a computation that has published without the key is not counted until it publishes it."""
    times = [1_000 * i for i in range(1, 31)]
    pipeline = session_pipeline(2_000, [([Record("k", t, t)], t) for t in times])
    source, storage = source_for(pipeline, "session", str(tmp_path)), Storage(str(tmp_path))
    offset = initial_offset(source)
    for batch in range(4):
        offset = plan_next_batch(source, offset, False, now_ms=batch)
        for name in ("session", "judge"):  # held at the session's start, as the older code published
            storage.write_json(latest_status(name), {"batch": batch, "low_watermark": 1_000, "keyed_watermarks": {}})
    assert offset["watermark"] == 4_000
    again = plan_next_batch(source, offset, False, now_ms=10)
    assert again is not offset and again["watermark"] == 5_000
    # Once they publish the key, they count again: 2 s behind the injector's 5 s, reading goes on;
    # at 1 s behind nothing processed since, it stops.
    for name, unheld in (("session", 3_000), ("judge", 3_000)):
        storage.write_json(latest_status(name), {"batch": 5, "low_watermark": 1_000, "keyed_watermarks": {"~unheld": unheld}})
    assert plan_next_batch(source, again, False, now_ms=11) is not again
    storage.write_json(latest_status("judge"), {"batch": 5, "low_watermark": 1_000, "keyed_watermarks": {"~unheld": 1_000}})
    assert plan_next_batch(source, again, False, now_ms=12) is again


class Pass(Computation):
    def process_record(self, ctx, record):
        pass


def test_two_branches_joining_read_on_while_the_join_has_the_key_from_one_branch_only(tmp_path):
    """src (limited) -> a and -> b, both -> join, no holds, after a long run of the older code: a
    publishes ~unheld first, so join's is the beginning of time until b's does (b's sender has none
    yet). The limit counts join by its low watermark meanwhile, not by the beginning of time (which
    it reads as where the injector first started, far behind), so b reads and publishes too."""
    src = GeneratorInjector(lambda i: Record("k", i, 1_000 * i, f"r{i}"), total=10_000,
                            low_watermark=lambda n: 1_000 * n, max_records_per_read=1)
    pipeline = (Pipeline("two").add_injector("src", src, "in", max_skew_ms=2_000)
                .add_computation("a", Pass(), ["in"], ["out_a"])
                .add_computation("b", Pass(), ["in"], ["out_b"])
                .add_computation("join", Pass(), ["out_a", "out_b"], ["out"]))
    storage = Storage(str(tmp_path))
    a_source, b_source = source_for(pipeline, "a", str(tmp_path)), source_for(pipeline, "b", str(tmp_path))
    a_offset, b_offset = initial_offset(a_source), initial_offset(b_source)
    for batch in range(50):  # the older code's run, every stage keeping up
        a_offset = plan_next_batch(a_source, a_offset, False, now_ms=batch)
        b_offset = plan_next_batch(b_source, b_offset, False, now_ms=batch)
        for name in ("a", "b", "join"):
            storage.write_json(latest_status(name), {"batch": batch, "low_watermark": a_offset["watermark"],
                                                     "keyed_watermarks": {}})
    a_offset = plan_next_batch(a_source, a_offset, False, now_ms=100)  # upgraded: a runs first
    wm = a_offset["watermark"]
    storage.write_json(latest_status("a"), {"batch": 50, "low_watermark": wm, "keyed_watermarks": {"~unheld": wm}})
    coalescer = plan_computation(pipeline, "join").coalescer()
    coalescer.advance("out_b/b", wm - 1_000)  # b's last publication, from before: no keyed watermarks
    coalescer.advance("out_a/a", wm, keyed={"~unheld": wm})
    assert coalescer.keyed_watermarks()["~unheld"] == BEGINNING
    storage.write_json(latest_status("join"), {"batch": 50, "low_watermark": wm - 1_000,
                                               "keyed_watermarks": coalescer.keyed_watermarks()})
    assert plan_next_batch(b_source, b_offset, False, now_ms=200) is not b_offset
    assert plan_next_batch(a_source, a_offset, False, now_ms=200) is not a_offset


def test_an_offset_written_before_the_key_is_not_a_move_of_its_injector(tmp_path):
    """An injector partition whose stored offset carries no ~unheld, with nothing new to read: no
    input point is planned (one would wake a partition idle before, holding the watermark back)."""
    src = GeneratorInjector(lambda i: Record("k", i, 1_000 * i, f"r{i}"), total=3,
                            low_watermark=lambda n: 1_000 * n, max_records_per_read=1)
    pipeline = (Pipeline("quiet").add_injector("src", src, "in", max_skew_ms=2_000)
                .add_computation("a", Pass(), ["in"], ["out_a"]))
    source = source_for(pipeline, "a", str(tmp_path))
    offset = initial_offset(source)
    for batch in range(10):
        following = plan_next_batch(source, offset, False, now_ms=batch)
        if following is offset:
            break
        offset = following
        Storage(str(tmp_path)).write_json(latest_status("a"), {"batch": batch, "low_watermark": offset["watermark"],
                                                               "keyed_watermarks": {"~unheld": offset["watermark"]}})
    assert plan_next_batch(source, offset, False, now_ms=20) is offset  # read to the end
    (sender,) = offset["senders"]
    before_the_key = {**offset, "senders": {sender: {**offset["senders"][sender], "keyed": {}}}}
    assert plan_next_batch(source, before_the_key, False, now_ms=21) is before_the_key
