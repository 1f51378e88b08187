"""Pipeline wiring errors surface as PipelineError with messages naming the user's own objects."""

from __future__ import annotations

import functools
import re

import pytest

from millstream.core.executor import ComputationFailed

from millstream import Computation, PickleCodec, Pipeline, PipelineError, Record, ScriptedInjector
from millstream.testing import PipelineHarness


class Noop(Computation):
    pass


def base() -> Pipeline:
    return Pipeline("p").add_injector("src", ScriptedInjector("src", []), "events")


def test_a_well_wired_pipeline_validates_and_orders_topologically():
    p = (
        base()
        .add_computation("last", Noop(), ["mid"])
        .add_computation("first", Noop(), ["events"], ["mid"])
        .add_sink("out", "mid", "/tmp/x")
    )
    p.validate()
    assert p.topological_order() == ["first", "last"]
    assert p.producers("mid") == ["first"] and p.consumers("events") == ["first"]


@pytest.mark.parametrize("build, message", [
    (lambda p: p.add_computation("src", Noop(), ["events"]), r"name 'src' is used twice in pipeline 'p'"),
    (lambda p: p.add_computation("c", Noop(), ["events"]).add_computation("c", Noop(), ["events"]),
     r"name 'c' is used twice"),
    (lambda p: p.add_computation("c", Noop(), ["events"]).add_sink("c", "events", "/tmp/x"), r"'c' is used twice"),
    (lambda p: p.add_injector("src", ScriptedInjector("x", []), "other"), r"'src' is used twice"),
])
def test_duplicate_names(build, message):
    with pytest.raises(PipelineError, match=message):
        build(base())


@pytest.mark.parametrize("bad", ["", "1abc", "has space", "slash/name", "dot.name", "x" * 65, None, 7])
def test_bad_names_are_rejected_everywhere(bad):
    msg = r"name .* is invalid: use 1-64 letters"
    with pytest.raises(PipelineError, match=msg):
        Pipeline(bad)
    with pytest.raises(PipelineError, match=msg):
        base().add_computation(bad, Noop(), ["events"])
    with pytest.raises(PipelineError, match=msg):
        base().add_computation("c", Noop(), [bad])
    with pytest.raises(PipelineError, match=msg):
        base().add_computation("c", Noop(), ["events"], [bad])
    with pytest.raises(PipelineError, match=msg):
        base().add_injector("i2", ScriptedInjector("i2", []), bad)
    with pytest.raises(PipelineError, match=msg):
        base().add_sink(bad, "events", "/tmp/x")
    with pytest.raises(PipelineError, match=msg):
        base().declare_stream(bad, PickleCodec())


def test_name_limits_accept_valid_names():
    Pipeline("a").add_injector("A-b_9", ScriptedInjector("x", []), "s" + "x" * 63)


def test_bad_stream_name_of_a_sink_is_rejected():
    with pytest.raises(PipelineError, match=r"stream name 'bad name' is invalid"):
        base().add_sink("sink", "bad name", "/tmp/x")


def test_unknown_input_stream_names_computation_stream_and_known_streams():
    p = base().add_computation("counter", Noop(), ["evnets"])  # typo
    with pytest.raises(PipelineError, match=r"computation 'counter' reads stream 'evnets', which no injector or "
                                            r"computation produces \(known streams: \['events'\]\)"):
        p.validate()


def test_stream_with_no_producer_in_a_chain():
    p = base().add_computation("a", Noop(), ["events"], ["mid"]).add_computation("b", Noop(), ["nobody"])
    with pytest.raises(PipelineError, match=r"'b' reads stream 'nobody'.*known streams: \['events', 'mid'\]"):
        p.validate()


def test_harness_refuses_an_invalid_pipeline():
    with pytest.raises(PipelineError, match="'nobody'"):
        PipelineHarness(base().add_computation("b", Noop(), ["nobody"]))


def test_no_injector():
    with pytest.raises(PipelineError, match=r"pipeline 'empty' has no injector"):
        Pipeline("empty").validate()


def test_sink_on_unknown_stream():
    p = base().add_sink("out", "nothing", "/tmp/x")
    with pytest.raises(PipelineError, match=r"sink 'out' reads stream 'nothing', which nothing produces "
                                            r"\(known streams: \['events'\]\)"):
        p.validate()


def test_sink_format_and_kind():
    with pytest.raises(PipelineError, match=r"sink 'out': format must be a format name such as 'jsonl' or "
                                            r"'parquet', got 'no such'"):
        base().add_sink("out", "events", "/tmp/x", format="no such")
    with pytest.raises(PipelineError, match=r"sink 'out': give exactly one of path=, writer= or table="):
        base().add_sink("out", "events", "/tmp/x", writer=lambda df, batch: None)
    with pytest.raises(PipelineError, match=r"sink 'out': give exactly one of path=, writer= or table="):
        base().add_sink("out", "events")
    with pytest.raises(PipelineError, match=r"sink 'out': writer must be callable"):
        base().add_sink("out", "events", writer="not callable")
    # A writer that cannot take (dataframe, batch_id) failed only at the first delivery.
    with pytest.raises(PipelineError, match=r"sink 'out': writer must take two arguments, writer\(dataframe, "
                                            r"batch_id\); 'one' takes \(frame\)"):
        def one(frame):
            pass
        base().add_sink("out", "events", writer=one)
    base().add_sink("out", "events", writer=lambda frame, batch, *more, option=1: None)

    def deliver(frame):
        pass

    @functools.wraps(deliver)
    def adapter(frame, batch_id):  # takes what a writer takes, whatever it wraps
        deliver(frame)

    base().add_sink("out", "events", writer=adapter)
    assert base().add_sink("out", "events", "/tmp/x", format="csv").sinks["out"].is_file_sink is False
    assert base().add_sink("out", "events", "/tmp/x").sinks["out"].is_file_sink is True


def test_two_sinks_replacing_each_others_batches_are_refused():
    """Each sink replaces its own (producer, batch) where it writes (files named by producer and
    batch, a Spark writer's producer=/batch= directories, a table's partitions, a JDBC table's
    rows): two sinks of one producer in one place overwrote each other's, and a run kept about
    half of their records, exit code 0."""

    def two(*sinks):
        p = base().add_computation("split", Noop(), ["events"], ["a", "b"])
        p.add_computation("other", Noop(), ["events"], ["c"])
        for name, stream, kwargs in sinks:
            p.add_sink(name, stream, **kwargs)
        return p

    collide = r"sinks 'one' and 'two' both write 'split'\'s batches to {}: each replaces its own batches there"
    for first, second, where in (
            ({"path": "/tmp/shared"}, {"path": "/tmp/shared/"}, "path '/tmp/shared'"),
            ({"path": "/tmp/shared"}, {"path": "file:///tmp/x/../shared"}, "path '/tmp/shared'"),
            ({"path": "s3a://bucket/out", "format": "csv"}, {"path": "s3://bucket/out/", "format": "csv"},
             "path 's3://bucket/out'"),
            ({"table": "events_a"}, {"table": "`Default`.EVENTS_A"}, "table 'events_a'"),
            ({"format": "jdbc", "options": {"url": "jdbc:derby:memory:x", "dbtable": "windows"}},
             {"format": "jdbc", "options": {"URL": "jdbc:derby:memory:x", "dbTable": "WINDOWS"}},
             "JDBC table 'windows' at 'jdbc:derby:memory:x'")):
        with pytest.raises(PipelineError, match=collide.format(re.escape(where))):
            two(("one", "a", first), ("two", "b", second)).validate()
    # Beside each other, nothing replaced: another producer, another format's files, a Spark writer's
    # directories beside files, users' own writers.
    two(("one", "a", {"path": "/tmp/shared"}), ("two", "c", {"path": "/tmp/shared"})).validate()
    two(("one", "a", {"table": "t"}), ("two", "c", {"table": "t"})).validate()
    two(("one", "a", {"path": "/tmp/shared"}), ("two", "b", {"path": "/tmp/shared", "format": "parquet"})).validate()
    two(("one", "a", {"path": "/tmp/shared"}), ("two", "b", {"path": "/tmp/shared", "format": "csv"})).validate()
    two(("one", "a", {"writer": lambda frame, batch: None}), ("two", "b", {"writer": lambda frame, batch: None})
        ).validate()


def test_a_jdbc_sink_takes_a_url_and_a_table_and_no_path():
    """Spark's JDBC writer under a path, with overwrite, would replace the whole table each batch."""
    db = {"url": "jdbc:derby:memory:x", "dbtable": "windows"}
    with pytest.raises(PipelineError, match=r"sink 'out': a JDBC sink takes options url= and dbtable=, not path="):
        base().add_sink("out", "events", "/tmp/x", format="jdbc", options=db)
    with pytest.raises(PipelineError, match=r"sink 'out': a JDBC sink needs options url= and dbtable="):
        base().add_sink("out", "events", format="jdbc", options={"url": db["url"]})
    with pytest.raises(PipelineError, match=r"sink 'out': a JDBC sink's dbtable= names a table, not a query"):
        base().add_sink("out", "events", format="jdbc", options={"url": db["url"], "dbtable": " (SELECT 1) t"})
    sink = base().add_sink("out", "events", format="jdbc", options=db).sinks["out"]
    assert sink.is_jdbc and not sink.is_file_sink
    assert base().add_sink("out", "events", format="jdbc", options={"URL": db["url"], "dbTable": "w"}).sinks["out"]


@pytest.mark.parametrize("obj, shown", [
    (Noop, "ABCMeta"),  # the class instead of an instance
    (lambda ctx, r: None, "function"),
    (object(), "object"),
])
def test_non_computation_objects(obj, shown):
    with pytest.raises(PipelineError, match=rf"computation 'c' must be an instance of a millstream.Computation "
                                            rf"subclass, got {shown}"):
        base().add_computation("c", obj, ["events"])


def test_non_injector_object():
    with pytest.raises(PipelineError, match=r"injector 'i' must be a millstream.Injector, got list"):
        Pipeline("p").add_injector("i", [Record("k", 1, 1)], "s")


@pytest.mark.parametrize("kwargs, message", [
    ({"inputs": "events"}, r"inputs of 'c' must be a list or mapping of stream names, not a string"),
    ({"inputs": []}, r"computation 'c' has no input stream"),
    ({"inputs": {"events": "not callable"}}, r"key extractor of 'c' for stream 'events' is not callable"),
    ({"inputs": ["events"], "outputs": "out"}, r"outputs of 'c' must be a list of stream names, not a string"),
    ({"inputs": ["events"], "outputs": ["o", "o"]}, r"computation 'c' lists an output stream twice"),
    ({"inputs": ["events"], "production": "medium"}, r"production of 'c' must be 'strong' or 'weak', got 'medium'"),
    ({"inputs": ["events"], "dedup_horizon_ms": -1}, r"dedup_horizon_ms of 'c' must be an int >= 0"),
])
def test_add_computation_argument_errors(kwargs, message):
    with pytest.raises(PipelineError, match=message):
        base().add_computation("c", Noop(), **kwargs)


def test_cycle_is_refused_by_validate_naming_its_computations_and_streams():
    p = base().add_computation("a", Noop(), ["events", "back"], ["fwd"]).add_computation("b", Noop(), ["fwd"], ["back"])
    cycle = "cycle through computation 'a': 'a' produces 'fwd', read by 'b'; 'b' produces 'back', read by 'a'"
    for refused in (p.validate, p.topological_order, lambda: PipelineHarness(p)):
        with pytest.raises(PipelineError, match=re.escape(cycle)):
            refused()


def test_self_loop_is_a_cycle():
    p = base().add_computation("a", Noop(), ["events", "loop"], ["loop"])
    with pytest.raises(PipelineError, match=re.escape(
            "cycle through computation 'a': 'a' produces 'loop', read by 'a'; a computation cannot read what it "
            "produces, directly or through others")):
        p.validate()


def test_a_cycle_downstream_of_the_first_computation_and_a_dead_letter_reader():
    p = (base().add_computation("a", Noop(), ["events"], ["ab"]).add_computation("b", Noop(), ["ab", "cb"], ["bc"])
         .add_computation("c", Noop(), ["bc"], ["cb"]))
    with pytest.raises(PipelineError, match=re.escape(
            "cycle through computation 'b': 'b' produces 'bc', read by 'c'; 'c' produces 'cb', read by 'b'")):
        p.validate()
    # A computation reading the dead letters does not receive its own: no cycle.
    fine = base().add_computation("a", Noop(), ["events"], ["out"]).add_computation("errors", Noop(), ["dead_letters"])
    fine.validate()
    assert fine.topological_order() == ["a", "errors"]


def test_a_cycle_is_refused_before_the_spark_runner_writes_its_root(tmp_path):
    from millstream.spark.runner import SparkRunner

    p = base().add_computation("a", Noop(), ["events", "loop"], ["loop"])
    with pytest.raises(PipelineError, match="cycle through computation 'a'"):
        SparkRunner(p, root=str(tmp_path / "root"))
    assert not (tmp_path / "root").exists()


def test_codec_for_unused_stream():
    p = base().declare_stream("ghost", PickleCodec())
    with pytest.raises(PipelineError, match=r"codec declared for stream 'ghost', which no node uses"):
        p.validate()
    for not_a_codec in (object(), PickleCodec):  # the class where an object was meant, too
        with pytest.raises(PipelineError, match=r"stream 'x': the codec must be a codec object with encode\(\) "
                                                r"and decode\(\), such as .*PickleCodec\(\), got"):
            base().declare_stream("x", not_a_codec)


def test_weak_productions_need_exactly_one_consumer_and_no_sink():
    ok = base().add_computation("a", Noop(), ["events"], ["mid"], production="weak").add_computation(
        "b", Noop(), ["mid"])
    ok.validate()
    fan_out = base().add_computation("a", Noop(), ["events"], ["mid"], production="weak")
    fan_out.add_computation("b", Noop(), ["mid"]).add_computation("c", Noop(), ["mid"])
    with pytest.raises(PipelineError, match=r"weak productions of 'a' need exactly one consuming computation.*"
                                            r"\['b', 'c'\]"):
        fan_out.validate()
    sunk = base().add_computation("a", Noop(), ["events"], ["mid"], production="weak")
    sunk.add_computation("b", Noop(), ["mid"]).add_sink("s", "mid", "/tmp/x")
    with pytest.raises(PipelineError, match=r"weak productions of 'a'.*no sink"):
        sunk.validate()


def test_weak_shapes_spark_cannot_fuse_are_refused_by_the_harness_too():
    """A pipeline its harness tests pass on must run on Spark, which fuses a weak computation into a
    strong consumer reading nothing else."""
    mixed = base().add_computation("a", Noop(), ["events"], ["mid"], production="weak")
    mixed.add_computation("b", Noop(), ["mid", "events"])
    with pytest.raises(PipelineError, match=r"weak computation 'a' must be the only producer of every stream its "
                                            r"consumer 'b' reads"):
        PipelineHarness(mixed)
    chain = base().add_computation("a", Noop(), ["events"], ["mid"], production="weak")
    chain.add_computation("b", Noop(), ["mid"], ["last"], production="weak").add_computation("c", Noop(), ["last"])
    with pytest.raises(PipelineError, match=r"weak computations 'a' -> 'b'.*make one of them strong"):
        PipelineHarness(chain)


# -- key extractors --------------------------------------------------------------------------------
def _extractor_harness(extractor):
    p = base().add_computation("counter", Noop(), {"events": extractor})
    return PipelineHarness(p)


def test_key_extractor_returning_a_non_str_names_computation_and_stream():
    h = _extractor_harness(lambda r: r.value["user"])
    h.feed("src", [Record("k", {"user": 42}, 0)])
    with pytest.raises(ComputationFailed, match=r"computation 'counter': key extractor for stream 'events' failed: "
                                                r"TypeError: returned int 42; keys must be str"):
        h.run()


def test_raising_key_extractor_names_computation_stream_and_record():
    h = _extractor_harness(lambda r: r.value["user"])
    h.feed("src", [Record("k", {"name": "x"}, 0, "rec-1")])
    with pytest.raises(ComputationFailed, match=r"computation 'counter': key extractor for stream 'events' failed: "
                                                r"KeyError: 'user', on record 'rec-1'") as info:
        h.run()
    assert isinstance(info.value.__cause__, KeyError)


def test_bad_extractor_on_a_computation_output_is_reported_when_produced():
    class Fwd(Computation):
        def process_record(self, ctx, record):
            ctx.produce(Record(record.key, None, record.timestamp), "mid")

    p = base().add_computation("fwd", Fwd(), ["events"], ["mid"]).add_computation(
        "down", Noop(), {"mid": lambda r: r.value})
    h = PipelineHarness(p)
    h.feed("src", [Record("k", 1, 0)])
    with pytest.raises(ComputationFailed, match=r"computation 'down': key extractor for stream 'mid' failed: "
                                                r"TypeError: returned NoneType"):
        h.run()


def test_default_key_extractor_uses_the_record_key():
    seen = []

    class Keys(Computation):
        def process_record(self, ctx, record):
            seen.append(ctx.key)

    h = PipelineHarness(base().add_computation("c", Keys(), {"events": None}))
    h.feed("src", [Record("alpha", 1, 0), Record("beta", 2, 0)])
    h.run()
    assert sorted(seen) == ["alpha", "beta"]


def test_a_sink_on_an_injectors_stream_is_refused_by_the_harness_as_by_spark():
    pipeline = base().add_computation("c", Noop(), ["events"]).add_sink("raw", "events", "/tmp/x")
    with pytest.raises(PipelineError, match="sink 'raw' reads stream 'events', which an injector produces"):
        PipelineHarness(pipeline)


class _Echo(Computation):
    def __init__(self, output: str = "out") -> None:
        self.output = output

    def process_record(self, ctx, record):
        ctx.produce(record, self.output)


def _two_generators(clicks_name: str, views_name: str, same_consumer: bool = True) -> Pipeline:
    from millstream import GeneratorInjector

    def generator(kind: str, name: str) -> GeneratorInjector:
        return GeneratorInjector(lambda i: Record("user1", {kind: i}, i), total=3, low_watermark=lambda n: n,
                                 name=name)
    pipeline = (Pipeline("p").add_injector("clicks", generator("click", clicks_name), "clicks")
                .add_injector("views", generator("view", views_name), "views"))
    if same_consumer:
        return pipeline.add_computation("c", _Echo(), ["clicks", "views"], ["out"])
    return (pipeline.add_computation("c", _Echo(), ["clicks"], ["out"])
            .add_computation("d", _Echo("out2"), ["views"], ["out2"]))


def test_injectors_making_ids_from_one_name_cannot_feed_one_computation():
    """Their ids collide, and deduplication would drop one input's records as the other's."""
    with pytest.raises(PipelineError, match=r"injectors 'clicks' and 'views' both feed computation 'c'.*"
                                            r"'generator'.*GeneratorInjector\(\.\.\., name='views'\)"):
        PipelineHarness(_two_generators("generator", "generator"))
    harness = PipelineHarness(_two_generators("clicks", "views"))  # named apart: every record arrives
    harness.run_injectors()
    assert sorted(str(r.value) for r in harness.output("out")) == sorted(
        str({kind: i}) for kind in ("click", "view") for i in range(3))
    PipelineHarness(_two_generators("generator", "generator", same_consumer=False)).run_injectors()  # apart: fine


def test_injectors_sharing_a_name_whose_ids_cannot_collide_are_accepted():
    from millstream import GeneratorInjector, HeuristicWatermark

    def pipeline(clicks, views, exactly_once=True):
        return (Pipeline("p").add_injector("clicks", clicks, "clicks").add_injector("views", views, "views")
                .add_computation("c", _Echo(), ["clicks", "views"], ["out"], exactly_once=exactly_once))

    def generator(kind, own_ids=False):
        return GeneratorInjector(lambda i: Record("u", {kind: i}, i, f"{kind}-{i}" if own_ids else ""), total=3,
                                 low_watermark=lambda n: n)

    accepted = [
        pipeline(generator("click", own_ids=True), generator("view", own_ids=True)),  # ids of their own
        pipeline(ScriptedInjector("src", []), ScriptedInjector("src", [])),  # fed by the harness, ids by input
        pipeline(ScriptedInjector("src", [([Record("u", 1, 1, "a")], 5)]),
                 ScriptedInjector("src", [([Record("u", 2, 1, "b")], 5)])),  # explicit ids
        pipeline(ScriptedInjector("generator", [([Record("u", 1, 1)], 5)]), generator("view")),  # other rules
        pipeline(generator("click"), generator("view"), exactly_once=False),  # no deduplication: nothing dropped
    ]
    for built in accepted:
        harness = PipelineHarness(built)
        harness.run_injectors()
    # And the ones that do collide, also behind a wrapper that passes the records through.
    with pytest.raises(PipelineError, match=r"both feed computation 'c'.*the same name 'generator'"):
        pipeline(HeuristicWatermark(generator("click")), HeuristicWatermark(generator("view"))).validate()
    with pytest.raises(PipelineError, match=r"both feed computation 'c'.*the same name 'src'"):
        pipeline(ScriptedInjector("src", [([Record("u", 1, 1)], 5)]),
                 ScriptedInjector("src", [([Record("u", 2, 1)], 5)])).validate()
