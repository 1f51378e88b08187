"""What a resumed computation or sink cannot pick up where it left off is refused at start
(spark/resume.py), on checkpoints and logs laid out as Spark and the publisher leave them; no Spark
needed. tests/spark/test_resume_spark.py shows the same refusals on real runs."""

import json
import os

import pytest

from millstream import (Computation, GeneratorInjector, MapState, Pipeline, PipelineError, Record, ScriptedInjector,
                        StrCodec, ValueState)
from millstream.core.plan import DEFAULT_KEY_GROUPS, plan_computation
from millstream.spark.commit import Checkpoint, ComputationCommit
from millstream.spark.publog import BATCH, CLAIM, FencedWriter, PublicationLog
from millstream.spark.rescale import state_partitions
from millstream.spark.resume import computation_refusals, missing_entries, parallelism_kept, sink_refusals
from millstream.spark.rootfiles import sink_progress
from millstream.spark.runner import SparkRunner
from millstream.spark.storage import Storage


class Echo(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "out")


def pipeline(*injectors: str, reads_up: bool = False) -> Pipeline:
    built = Pipeline("p")
    for name in injectors:
        built.add_injector(name, ScriptedInjector(name, []), name)
    built.add_computation("up", Echo(), list(injectors), ["out"])
    if reads_up:
        built.add_computation("down", Echo(), ["out"], ["end"]).add_sink("sink", "end", "/tmp/never-written")
    return built


def checkpoint(tmp_path, senders: dict, committed: bool = True) -> Checkpoint:
    """A checkpoint whose batch 0 ended at `senders` (Spark's offsets file: version, metadata,
    then the source's offset)."""
    location = tmp_path / "checkpoint"
    os.makedirs(location / "offsets", exist_ok=True)
    offset = {"senders": senders, "watermark": 0}
    (location / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(offset) + "\n")
    if committed:
        os.makedirs(location / "commits", exist_ok=True)
        (location / "commits" / "0").write_text("v1\n{}\n")
    return Checkpoint(str(location))


def commit_of(plan, checkpoint: Checkpoint, last_published: int = 0) -> ComputationCommit:
    """What the runner knows of a strong computation's query after its claim."""
    writer = FencedWriter(PublicationLog(checkpoint.location, plan.name), 1, 0)
    return ComputationCommit(plan, checkpoint, writer, (), last_published)


def log_with(root, producer: str, kinds: list[str], pruned_below: int) -> None:
    log = PublicationLog(str(root), producer)
    for position, kind in enumerate(kinds):
        assert log.append(position, {"type": kind, "batch": position})
    claims = [p for p in range(pruned_below) if kinds[p] == CLAIM]
    log.mark_pruned(pruned_below, claims)
    for position in range(pruned_below):
        if position not in claims:
            log.delete(position)


def test_missing_entries_are_the_deleted_batches_after_a_position():
    assert missing_entries(-1, 0, []) == []  # never pruned
    assert missing_entries(-1, 4, [0]) == [1, 2, 3]  # a reader with nothing read yet
    assert missing_entries(3, 4, [0]) == []  # past everything deleted
    assert missing_entries(1, 6, [2, 5]) == [3, 4]  # kept claims are no loss


def test_a_computation_whose_inputs_changed_is_refused_naming_them(tmp_path):
    plan = plan_computation(pipeline("web"), "up", 4)
    mark = {"offset": {"step": 1}, "watermark": 10}
    held = checkpoint(tmp_path, {"web/web#0": mark, "mobile/mobile#0": mark})
    (problem,) = computation_refusals(str(tmp_path), commit_of(plan, held))
    assert "'up' reads from other inputs than its checkpoint holds (no longer read: mobile/mobile#0)" in problem
    assert "new name" in problem
    more = plan_computation(pipeline("web", "mobile", "tv"), "up", 4)
    (problem,) = computation_refusals(str(tmp_path), commit_of(more, held))
    assert "(new: tv/tv#0)" in problem
    reordered = plan_computation(pipeline("mobile", "web"), "up", 4)
    assert computation_refusals(str(tmp_path), commit_of(reordered, held)) == []
    assert computation_refusals(str(tmp_path / "new"), commit_of(plan, Checkpoint(str(tmp_path / "none")))) == []


def test_a_reader_whose_unread_entries_retention_deleted_is_refused(tmp_path):
    plan = plan_computation(pipeline("web", reads_up=True), "down", 4)
    log_with(tmp_path, "up", [CLAIM, BATCH, BATCH, CLAIM, BATCH, BATCH, BATCH], pruned_below=5)
    for position, refused in [(1, True), (-1, True), (3, True), (4, False), (6, False)]:
        held = checkpoint(tmp_path / str(position), {"out/up": {"position": position, "watermark": 0}})
        problems = computation_refusals(str(tmp_path), commit_of(plan, held))
        assert bool(problems) is refused, (position, problems)
    (problem,) = computation_refusals(str(tmp_path), commit_of(plan, checkpoint(
        tmp_path / "p1", {"out/up": {"position": 1, "watermark": 0}})))
    assert "'down' goes on reading 'up''s log after entry 1, but retention deleted entries 2-4" in problem
    # A batch planned but never committed: a restart runs it from the batch before (here, none).
    uncommitted = checkpoint(tmp_path / "u", {"out/up": {"position": 1, "watermark": 0}}, committed=False)
    assert computation_refusals(str(tmp_path), commit_of(plan, uncommitted)) == []


def test_a_sink_whose_undelivered_batches_retention_deleted_is_refused(tmp_path):
    built = pipeline("web", reads_up=True)
    log_with(tmp_path, "down", [CLAIM, BATCH, BATCH, BATCH, BATCH], pruned_below=4)
    storage = Storage(str(tmp_path))
    assert sink_refusals(str(tmp_path), built, {"up", "down"}) == []  # new to the root: from what is retained
    storage.write_json(sink_progress("sink", "down"), {"batch": 1, "position": 1})
    (problem,) = sink_refusals(str(tmp_path), built, {"up", "down"})
    assert ("sink 'sink' goes on delivering 'down''s output after batch 1, but retention deleted log entries 2-3"
            in problem)
    assert sink_refusals(str(tmp_path), built, {"up"}) == []  # 'down' weak: no log of its own
    storage.write_json(sink_progress("sink", "down"), {"batch": 3, "position": 3})
    assert sink_refusals(str(tmp_path), built, {"up", "down"}) == []


def test_a_checkpoint_gone_or_elsewhere_is_refused(tmp_path):
    plan = plan_computation(pipeline("web"), "up", 4)
    gone = Checkpoint(str(tmp_path / "checkpoints" / "up" / "g0000"))  # nothing there
    (problem,) = computation_refusals(str(tmp_path), commit_of(plan, gone, last_published=5))
    assert "'up' published batches up to 5, but its checkpoint at" in problem and "holds no committed batch" in problem
    assert computation_refusals(str(tmp_path), commit_of(plan, gone, last_published=0)) == []  # may be uncommitted
    held = checkpoint(tmp_path / "checkpoints" / "up", {"web/web#0": {"offset": {}, "watermark": 0}})
    assert computation_refusals(str(tmp_path), commit_of(plan, held, 5), str(tmp_path / "checkpoints")) == []
    (problem,) = computation_refusals(str(tmp_path), commit_of(plan, held, 5), str(tmp_path / "elsewhere"))
    assert "not under checkpoint_root=" in problem and "leave checkpoint_root out" in problem


def test_a_computation_added_while_running_may_not_produce_to_a_stream_already_read(tmp_path):
    # The running readers' inputs are fixed: the new producer's output would reach none of them (and a
    # restart would refuse them). Refused before anything is claimed or started.
    running = pipeline("web").add_computation("down", Echo(), ["out"], ["end"])
    runner = SparkRunner(running, root=str(tmp_path / "root"), key_groups=4)
    with pytest.raises(PipelineError, match=r"'second' would produce to 'out' \(read by 'down'\).*new stream"):
        runner.add_computation("second", Echo(), ["web"], ["out"])
    assert PublicationLog(str(tmp_path / "root"), "second").head() == -1


def test_a_state_or_injector_declared_another_way_on_an_existing_root_is_refused(tmp_path):
    # Stored values are read by the declaration they were written with: a MapState's key codec
    # changed read none of them back (a count started over beside its old entry), a ValueState's codec
    # or kind changed failed in user code. Refused when the runner is made, naming the state; a new
    # state, a TTL changed, a computation or an injector left out for a run are fine.
    def counting(map_state, injector=None):
        class Count(Computation):
            totals = map_state

            def process_record(self, ctx, record):
                ctx.state(self.totals).put("total", ctx.state(self.totals).get("total", 0) + 1)

        return (Pipeline("declared").add_injector("src", injector or ScriptedInjector("src", []), "in")
                .add_computation("count", Count(), ["in"]))

    root = str(tmp_path / "root")
    SparkRunner(counting(MapState("totals")), root=root, key_groups=4)  # the root's first layout
    with pytest.raises(PipelineError, match=r"'count' stores state 'totals' as MapState\(key=millstream.model.codecs."
                                            r"JsonCodec, .* this run declares it MapState\(key=millstream.model.codecs."
                                            r"StrCodec, .*new name"):
        SparkRunner(counting(MapState("totals", key_codec=StrCodec())), root=root, key_groups=4)
    with pytest.raises(PipelineError, match=r"stores state 'totals' as MapState.*declares it ValueState"):
        SparkRunner(counting(ValueState("totals")), root=root, key_groups=4)
    generator = GeneratorInjector(lambda i: Record("k", i, i), 10, lambda n: n)
    with pytest.raises(PipelineError, match=r"injector 'src' is a millstream.injectors.scripted.ScriptedInjector on "
                                            r"this root, this run makes it a millstream.injectors.generator."
                                            r"GeneratorInjector"):
        SparkRunner(counting(MapState("totals"), generator), root=root, key_groups=4)
    SparkRunner(counting(MapState("totals", ttl_ms=1_000)), root=root, key_groups=4)  # a TTL may change

    # A run without the computation keeps its declarations for when it comes back.
    without = SparkRunner(Pipeline("declared").add_injector("src", ScriptedInjector("src", []), "in")
                          .add_computation("other", Echo(), ["in"], ["out"]), root=root, key_groups=4)
    without.claim()
    without.lease.release()
    with pytest.raises(PipelineError, match=r"'count' stores state 'totals' as MapState"):
        SparkRunner(counting(MapState("totals", key_codec=StrCodec())), root=root, key_groups=4)


def test_state_partitions_are_read_from_the_newest_offsets_not_the_state_directories(tmp_path):
    # A repartition 2 -> 1 leaves partition 1's state directory behind: counting directories read 2,
    # so `millstream rescale` reported "2 -> 2" and a later rescale back to 2 did nothing.
    location = tmp_path / "checkpoint"
    for partition in ("0", "1"):
        os.makedirs(location / "state" / "0" / partition)
    assert state_partitions(str(location)) == 2  # no offsets: the directories tell
    os.makedirs(location / "offsets")
    for batch, partitions in ((3, 2), (4, 1)):
        metadata = {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": str(partitions)}}
        (location / "offsets" / str(batch)).write_text("v1\n" + json.dumps(metadata) + "\n{}\n")
    assert state_partitions(str(location)) == 1


def test_a_parallelism_other_than_the_roots_is_told_to_go_through_rescale(tmp_path):
    plan = plan_computation(pipeline("web"), "up", 4)
    held = checkpoint(tmp_path, {"web/web#0": {"offset": {}, "watermark": 0}})
    metadata = {"conf": {"spark.sql.shuffle.partitions": "2"}}
    (tmp_path / "checkpoint" / "offsets" / "0").write_text(
        "v1\n" + json.dumps(metadata) + "\n" + json.dumps({"senders": {"web/web#0": {}}}) + "\n")
    assert parallelism_kept(str(tmp_path), commit_of(plan, held), 2) is None
    assert parallelism_kept(str(tmp_path), commit_of(plan, held), None) is None  # left out: the root's
    assert parallelism_kept(str(tmp_path), commit_of(plan_computation(pipeline("web"), "up", 2), held), 8) is None
    note = parallelism_kept(str(tmp_path), commit_of(plan, held), 3)
    assert "'up' keeps its state in 2 partitions on this root" in note and "millstream rescale" in note


def test_a_runner_without_key_groups_takes_the_roots(tmp_path):
    # Made with 4 key groups, the root was refused to a runner (and to `millstream run`, which has no
    # such option) that left key_groups out: it compared the default, 32, and advised deleting the root.
    root = str(tmp_path / "root")
    SparkRunner(pipeline("web"), root=root, key_groups=4)
    assert SparkRunner(pipeline("web"), root=root).key_groups == 4
    assert SparkRunner(pipeline("web"), root=str(tmp_path / "new")).key_groups == DEFAULT_KEY_GROUPS


def test_removing_a_computation_that_feeds_a_sink_says_how(tmp_path):
    fed = pipeline("web").add_sink("lines", "out", str(tmp_path / "lines"))
    runner = SparkRunner(fed, root=str(tmp_path / "root"), key_groups=4)
    with pytest.raises(PipelineError, match=r"'up' feeds sink\(s\) \['lines'\], which cannot be removed while the "
                                            r"pipeline runs: stop it and run the pipeline without them"):
        runner.remove_computation("up")


def test_a_computation_fused_elsewhere_or_made_weak_or_strong_is_refused_naming_the_change(tmp_path):
    # A weak computation keeps its state in its consumer's query's checkpoint, a strong one in its
    # own. Fused into another consumer, it was refused saying it "changed between weak and strong
    # productions" (it had not); and after one run without it, the root forgot where its state was:
    # brought back fused into another consumer, or made strong, it started over with empty state.
    def fused_into(consumer, production="weak"):
        return (Pipeline("fusions").add_injector("src", ScriptedInjector("src", []), "in")
                .add_computation("lottery", Echo(), ["in"], ["draws"], production=production)
                .add_computation(consumer, Echo(), ["draws"], ["out"]))

    root = str(tmp_path / "root")
    SparkRunner(fused_into("auditor"), root=root, key_groups=4)  # the root's first layout
    moved = r"'lottery' is fused into 'auditor' on this root .* this run fuses it into 'auditor2'"
    with pytest.raises(PipelineError, match=moved):
        SparkRunner(fused_into("auditor2"), root=root, key_groups=4)
    with pytest.raises(PipelineError, match=r"'lottery' ran with weak productions .* this run makes it strong"):
        SparkRunner(fused_into("auditor", "strong"), root=root, key_groups=4)

    # A run without it keeps where its state is for when it comes back.
    without = SparkRunner(Pipeline("fusions").add_injector("src", ScriptedInjector("src", []), "in")
                          .add_computation("other", Echo(), ["in"], ["out"]), root=root, key_groups=4)
    without.claim()
    without.lease.release()
    with pytest.raises(PipelineError, match=moved):
        SparkRunner(fused_into("auditor2"), root=root, key_groups=4)
    with pytest.raises(PipelineError, match=r"'other' ran with strong productions .* this run makes it weak"):
        SparkRunner(Pipeline("fusions").add_injector("src", ScriptedInjector("src", []), "in")
                    .add_computation("other", Echo(), ["in"], ["mid"], production="weak")
                    .add_computation("after", Echo(), ["mid"], ["out"]), root=root, key_groups=4)
    SparkRunner(fused_into("auditor"), root=root, key_groups=4)  # as it was: fine
