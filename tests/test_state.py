"""Per-key persistent state: Value/List/Map handles, codecs, persistence across steps, isolation."""

from __future__ import annotations

import random
from dataclasses import dataclass

import datetime
import enum

import pytest

from millstream import (
    Computation,
    JsonCodec,
    ListState,
    MapState,
    PickleCodec,
    Pipeline,
    PipelineError,
    Record,
    ScriptedInjector,
    ValueState,
)
from millstream.core.executor import ComputationFailed
from millstream.core.keystate import JournaledTimers
from millstream.testing import PipelineHarness


class TupleCodec:
    """A user codec: tuples of ints as comma-separated text (JSON would turn them into lists)."""

    def __init__(self) -> None:
        self.encoded = 0
        self.decoded = 0

    def encode(self, value):
        self.encoded += 1
        return ",".join(str(v) for v in value).encode()

    def decode(self, data):
        self.decoded += 1
        text = bytes(data).decode()
        return tuple(int(v) for v in text.split(",")) if text else ()


@dataclass(frozen=True)
class Point:
    x: int
    y: int


TUPLES = TupleCodec()


class Scripted(Computation):
    """record.value names a script entry: fn(ctx, self) -> anything; results are recorded."""

    v_json = ValueState("v_json")
    v_pickle = ValueState("v_pickle", codec=PickleCodec())
    v_custom = ValueState("v_custom", codec=TUPLES, default=())
    v_counter = ValueState("v_counter", default=0)
    v_mutable = ValueState("v_mutable", default=[])
    l_json = ListState("l_json")
    l_pickle = ListState("l_pickle", codec=PickleCodec())
    l_custom = ListState("l_custom", codec=TUPLES)
    m_json = MapState("m_json")
    m_mixed = MapState("m_mixed", key_codec=PickleCodec(), value_codec=TUPLES)

    def __init__(self, script) -> None:
        self.script = script
        self.results: list[tuple[str, str, object]] = []

    def process_record(self, ctx, record):
        self.results.append((ctx.key, record.value, self.script[record.value](ctx, self)))


def harness_for(computation, **kwargs) -> PipelineHarness:
    pipeline = (
        Pipeline("state")
        .add_injector("src", ScriptedInjector("src", []), "in")
        .add_computation("c", computation, ["in"], [], **kwargs)
    )
    return PipelineHarness(pipeline, key_groups=2)


def run(h: PipelineHarness, *commands: tuple[str, str]) -> None:
    h.feed("src", [Record(key, name, 0) for key, name in commands])
    h.run()


def results(comp, name):
    return {key: value for key, cmd, value in comp.results if cmd == name}


def write_all(ctx, c):
    ctx.state(c.v_json).set({"n": 1, "tags": ["a", "b"]})
    ctx.state(c.v_pickle).set({Point(1, 2), (3, 4)})
    ctx.state(c.v_custom).set((7, 8, 9))
    ctx.state(c.l_json).append({"x": 1})
    ctx.state(c.l_json).append([2, 3])
    ctx.state(c.l_pickle).set([Point(0, 0), (1, 2)])
    ctx.state(c.l_custom).append((1,))
    ctx.state(c.l_custom).append((2, 3))
    m = ctx.state(c.m_json)
    m.put("a", 1)
    m.put(2, [3])  # JSON key codec round-trips int keys as ints
    ctx.state(c.m_mixed).put(Point(5, 6), (5, 6))


def read_all(ctx, c):
    return {
        "v_json": ctx.state(c.v_json).get(),
        "v_pickle": ctx.state(c.v_pickle).get(),
        "v_custom": ctx.state(c.v_custom).get(),
        "l_json": ctx.state(c.l_json).get(),
        "l_pickle": ctx.state(c.l_pickle).get(),
        "l_custom": ctx.state(c.l_custom).get(),
        "m_json": dict(ctx.state(c.m_json).items()),
        "m_mixed": dict(ctx.state(c.m_mixed).items()),
    }


EXPECTED = {
    "v_json": {"n": 1, "tags": ["a", "b"]},
    "v_pickle": {Point(1, 2), (3, 4)},
    "v_custom": (7, 8, 9),
    "l_json": [{"x": 1}, [2, 3]],
    "l_pickle": [Point(0, 0), (1, 2)],
    "l_custom": [(1,), (2, 3)],
    "m_json": {"a": 1, 2: [3]},
    "m_mixed": {Point(5, 6): (5, 6)},
}


def test_every_handle_and_codec_round_trips_through_persistence():
    comp = Scripted({"write": write_all, "read": read_all})
    h = harness_for(comp)
    TUPLES.encoded = TUPLES.decoded = 0
    run(h, ("k", "write"))
    assert TUPLES.encoded > 0, "custom codec not used to persist"
    run(h, ("k", "read"))  # a later step: everything comes back from the persisted bytes
    assert TUPLES.decoded > 0, "custom codec not used to restore"
    assert results(comp, "read")["k"] == EXPECTED
    assert h.state("c", "k") == EXPECTED


def test_persisted_bytes_are_the_declared_codecs_output():
    comp = Scripted({"write": write_all})
    h = harness_for(comp)
    run(h, ("k", "write"))
    from millstream.core.keystate import KeyState
    run_ = h._run("c")
    stored = KeyState.loads(h._blob(run_, "k")).values
    assert stored["v_json"] == JsonCodec().encode(EXPECTED["v_json"])
    assert stored["v_custom"] == b"7,8,9"
    assert stored["l_custom"] == [b"1", b"2,3"]
    assert stored["m_mixed"] == {PickleCodec().encode(Point(5, 6)): b"5,6"}


def test_state_of_one_key_is_invisible_to_another():
    comp = Scripted({"write": write_all, "read": read_all})
    h = harness_for(comp)
    run(h, ("a", "write"))
    run(h, ("b", "read"), ("a", "read"))
    assert results(comp, "read")["a"] == EXPECTED
    assert results(comp, "read")["b"] == {
        "v_json": None, "v_pickle": None, "v_custom": (), "l_json": [], "l_pickle": [],
        "l_custom": [], "m_json": {}, "m_mixed": {},
    }
    assert h.state("c", "b") == {}


def test_counter_survives_steps_per_key():
    def incr(ctx, c):
        handle = ctx.state(c.v_counter)
        handle.set(handle.get() + 1)
        return handle.get()

    comp = Scripted({"incr": incr})
    h = harness_for(comp)
    for _ in range(5):
        run(h, ("a", "incr"), ("b", "incr"), ("a", "incr"))
    assert h.state("c", "a") == {"v_counter": 10}
    assert h.state("c", "b") == {"v_counter": 5}


def test_clear_works_for_every_handle_and_removes_persisted_data():
    def clear(ctx, c):
        for spec in (c.v_json, c.v_pickle, c.v_custom, c.l_json, c.l_pickle, c.l_custom, c.m_json, c.m_mixed):
            ctx.state(spec).clear()
        return read_all(ctx, c)  # read after clear in the same step

    comp = Scripted({"write": write_all, "clear": clear, "read": read_all})
    h = harness_for(comp)
    run(h, ("k", "write"))
    run(h, ("k", "clear"))
    empty = {"v_json": None, "v_pickle": None, "v_custom": (), "l_json": [], "l_pickle": [],
             "l_custom": [], "m_json": {}, "m_mixed": {}}
    assert results(comp, "clear")["k"] == empty
    assert h.state("c", "k") == {}
    run(h, ("k", "read"))
    assert results(comp, "read")["k"] == empty


def test_clear_then_write_in_the_same_step_keeps_only_the_new_data():
    def rewrite(ctx, c):
        ctx.state(c.l_json).clear()
        ctx.state(c.l_json).append("fresh")
        ctx.state(c.m_json).clear()
        ctx.state(c.m_json).put("only", 1)
        ctx.state(c.v_json).clear()
        ctx.state(c.v_json).set("new")

    comp = Scripted({"write": write_all, "rewrite": rewrite})
    h = harness_for(comp)
    run(h, ("k", "write"))
    run(h, ("k", "rewrite"))
    state = h.state("c", "k")
    assert state["l_json"] == ["fresh"] and state["m_json"] == {"only": 1} and state["v_json"] == "new"


def test_write_then_clear_in_the_same_step_leaves_nothing_of_either():
    # Entries put in the step that clears, before the clear, go too: in a map stored before (a new
    # entry beside the stored ones) and in one that was never stored.
    def write_then_clear(ctx, c):
        write_all(ctx, c)
        ctx.state(c.m_json).put("new", 2)
        for spec in (c.v_json, c.l_json, c.m_json, c.m_mixed):
            ctx.state(spec).clear()
        return read_all(ctx, c)

    comp = Scripted({"write": write_all, "write_then_clear": write_then_clear, "read": read_all})
    h = harness_for(comp)
    run(h, ("stored", "write"))
    run(h, ("stored", "write_then_clear"), ("fresh", "write_then_clear"))
    for key in ("stored", "fresh"):
        seen = results(comp, "write_then_clear")[key]
        assert (seen["v_json"], seen["l_json"], seen["m_json"], seen["m_mixed"]) == (None, [], {}, {}), key
        assert not {"v_json", "l_json", "m_json", "m_mixed"} & set(h.state("c", key)), key


def test_in_place_mutation_is_persisted_and_mutable_defaults_are_not_shared():
    def mutate(ctx, c):
        ctx.state(c.v_mutable).get().append(ctx.key)
        ctx.state(c.l_json).get().append("in-place")

    comp = Scripted({"mutate": mutate})
    h = harness_for(comp)
    run(h, ("a", "mutate"))
    run(h, ("b", "mutate"))
    run(h, ("a", "mutate"))
    assert h.state("c", "a") == {"v_mutable": ["a", "a"], "l_json": ["in-place", "in-place"]}
    assert h.state("c", "b") == {"v_mutable": ["b"], "l_json": ["in-place"]}
    assert Scripted.v_mutable.default == []


def test_map_handle_operations():
    def ops(ctx, c):
        m = ctx.state(c.m_json)
        m.put("a", 1)
        m.put("b", 2)
        m.put("a", 3)
        m.remove("b")
        m.remove("never")
        return (m.get("a"), m.get("b"), m.get("b", "dflt"), m.contains("a"), m.contains("b"),
                sorted(m.keys()), sorted(m.items()), len(m))

    comp = Scripted({"ops": ops})
    h = harness_for(comp)
    run(h, ("k", "ops"))
    assert results(comp, "ops")["k"] == (3, None, "dflt", True, False, ["a"], [("a", 3)], 1)
    assert h.state("c", "k") == {"m_json": {"a": 3}}


def test_a_map_key_the_codec_refuses_reads_as_absent_and_fails_only_when_stored():
    """A key JSON cannot encode can never be stored, so reading it answers "absent" whether or not the
    map holds anything; storing it is the error, and naming the state."""
    def peek(ctx, c):
        m = ctx.state(c.m_json)
        return m.get((1, 2)), m.get((1, 2), "dflt"), m.contains((1, 2))

    def keep(ctx, c):
        ctx.state(c.m_json).put("a", 1)

    def put_then_remove(ctx, c):
        m = ctx.state(c.m_json)
        m.put((1, 2), 3)
        m.remove((1, 2))

    def put(ctx, c):
        ctx.state(c.m_json).put((1, 2), 3)

    comp = Scripted({"peek": peek, "keep": keep, "put_then_remove": put_then_remove, "put": put})
    h = harness_for(comp)
    run(h, ("k", "peek"))  # nothing stored
    assert results(comp, "peek")["k"] == (None, "dflt", False)
    comp.results.clear()
    run(h, ("k", "keep"), ("k", "peek"), ("k", "put_then_remove"))  # something stored
    assert results(comp, "peek")["k"] == (None, "dflt", False)
    assert h.state("c", "k") == {"m_json": {"a": 1}}
    h.feed("src", [Record("k", "put", 0)])
    with pytest.raises(ComputationFailed, match=r"state 'm_json'.*tuple \(1, 2\)"):
        h.run()


def test_reading_defaults_stores_nothing():
    comp = Scripted({"peek": read_all})
    h = harness_for(comp)
    run(h, ("k", "peek"))
    assert h.state("c", "k") == {}


class SetsNone(Computation):
    """"none" sets each value state to None, "read" reports what they hold."""

    with_default = ValueState("with_default", default="unset")
    without = ValueState("without")

    def process_record(self, ctx, record):
        cells = ctx.state(self.with_default), ctx.state(self.without)
        if record.value == "none":
            for cell in cells:
                cell.set(None)
        ctx.produce(Record(ctx.key, [record.value] + [cell.get() for cell in cells], record.timestamp), "out")


def test_a_value_set_to_none_reads_the_default_in_later_steps_as_in_its_own():
    """Whatever the batching: set(None) clears the value (it read None in its own step and the
    default in later ones)."""
    def outputs(steps: list[list[str]]) -> tuple[list, PipelineHarness]:
        h = PipelineHarness(Pipeline("none").add_injector("src", ScriptedInjector("src", []), "in")
                            .add_computation("c", SetsNone(), ["in"], ["out"]))
        at = 0
        for step in steps:
            for command in step:
                at += 1
                h.feed("src", [Record("k", command, at)], watermark=at)
            h.run()
        return [r.value for r in h.output("out")], h

    # The contract, read plainly: set(None) clears, and a cleared value reads as the default.
    expected = [["read", "unset", None], ["none", "unset", None], ["read", "unset", None]]
    for steps in ([["read"], ["none"], ["read"]], [["read", "none", "read"]], [["read"], ["none", "read"]]):
        got, h = outputs(steps)
        assert got == expected, steps
        assert h.state("c", "k") == {}  # nothing stored: a key reset by set(None) can go


def test_unserializable_value_with_json_codec_names_the_fix():
    def bad(ctx, c):
        ctx.state(c.v_json).set({1, 2})

    h = harness_for(Scripted({"bad": bad}))
    h.feed("src", [Record("k", "bad", 0)])
    with pytest.raises(ComputationFailed, match=r"state 'v_json'.*set \{1, 2\}.*PickleCodec"):
        h.run()


def test_of_two_values_no_codec_takes_the_error_names_the_state_declared_first():
    # Used in the other order: the message does not depend on which the step touched first.
    def bad(ctx, c):
        ctx.state(c.m_json).put("k", {3, 4})
        ctx.state(c.v_json).set({1, 2})

    h = harness_for(Scripted({"bad": bad}))
    h.feed("src", [Record("k", "bad", 0)])
    with pytest.raises(ComputationFailed, match=r"state 'v_json'.*set \{1, 2\}"):
        h.run()


def test_undeclared_state_is_a_computation_error_naming_the_computation():
    stray = ValueState("stray")
    h = harness_for(Scripted({"stray": lambda ctx, c: ctx.state(stray)}))
    h.feed("src", [Record("k", "stray", 0)])
    with pytest.raises(ComputationFailed, match=r"computation 'c'.*stray.*not declared"):
        h.run()


def test_state_declared_on_a_base_class_is_usable_and_duplicate_names_are_rejected():
    class Base(Computation):
        total = ValueState("total", default=0)

    class Child(Base):
        items = ListState("items")

        def process_record(self, ctx, record):
            ctx.state(self.total).set(ctx.state(self.total).get() + record.value)
            ctx.state(self.items).append(record.value)

    h = harness_for(Child())
    h.feed("src", [Record("k", 2, 0), Record("k", 3, 0)])
    h.run()
    assert h.state("c", "k") == {"total": 5, "items": [2, 3]}

    class Clash(Computation):
        one = ValueState("same")
        two = ListState("same")

    with pytest.raises(PipelineError, match=r"Clash.*two states named 'same'"):
        harness_for(Clash())


@pytest.mark.parametrize("seed", range(3))
def test_randomized_state_operations_match_a_plain_model(seed):
    rng = random.Random(seed)
    model: dict[str, dict] = {}

    def apply(ctx, c):
        op = c.ops.pop(0)
        key = ctx.key
        mine = model.setdefault(key, {"v": 0, "l": [], "m": {}})
        kind = op[0]
        if kind == "add":
            ctx.state(c.v_counter).set(ctx.state(c.v_counter).get() + op[1])
            mine["v"] += op[1]
        elif kind == "append":
            ctx.state(c.l_json).append(op[1])
            mine["l"].append(op[1])
        elif kind == "put":
            ctx.state(c.m_json).put(op[1], op[2])
            mine["m"][op[1]] = op[2]
        elif kind == "remove":
            ctx.state(c.m_json).remove(op[1])
            mine["m"].pop(op[1], None)
        elif kind == "clear_list":
            ctx.state(c.l_json).clear()
            mine["l"] = []
        elif kind == "clear_value":
            ctx.state(c.v_counter).clear()
            mine["v"] = 0
        elif kind == "clear_map":  # also entries put earlier in the same step, never stored yet
            ctx.state(c.m_json).clear()
            mine["m"] = {}
        return None

    comp = Scripted({"apply": apply})
    comp.ops = []
    h = harness_for(comp)
    keys = [f"k{i}" for i in range(25)]
    for _ in range(30):
        batch = []
        for _ in range(rng.randint(1, 20)):
            kind = rng.choice(["add", "append", "put", "remove", "clear_list", "clear_value", "clear_map"])
            comp.ops.append((kind, rng.randint(1, 9), rng.randint(0, 99)) if kind != "put"
                            else (kind, rng.choice("abcde"), rng.randint(0, 99)))
            if kind == "remove":
                comp.ops[-1] = (kind, rng.choice("abcde"))
            batch.append(Record(rng.choice(keys), "apply", 0))
        # The harness groups deliveries per key, so apply ops in the order user code will see them.
        h.feed("src", batch)
        h.run()
    assert comp.ops == []
    for key in keys:
        mine = model.get(key, {"v": 0, "l": [], "m": {}})
        expected = {}
        if mine["v"]:
            expected["v_counter"] = mine["v"]
        if mine["l"]:
            expected["l_json"] = mine["l"]
        if mine["m"]:
            expected["m_json"] = mine["m"]
        assert h.state("c", key) == expected, key


class Tally(Computation):
    """Module level, so the computation (and a plan holding it) pickles like on Spark workers."""

    pairs = ValueState("pairs", codec=TUPLES, default=())
    names = MapState("names", value_codec=PickleCodec())

    def process_record(self, ctx, record):
        ctx.state(self.pairs).set(ctx.state(self.pairs).get() + (record.value,))
        ctx.state(self.names).put(record.value, Point(record.value, record.value))


def test_state_works_with_a_pickled_plan_as_on_spark_workers():
    import pickle

    from millstream.core.executor import Delivery, KeyGroupExecutor, inspect_key
    from millstream.core.plan import plan_computation
    from millstream.core.store import MemoryKeyStore
    from millstream.core.watermarks import Segment

    p = Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in").add_computation("c", Tally(), ["in"])
    store = MemoryKeyStore()
    for step in range(3):
        # A fresh copy of the plan every step, as a worker deserializes it: its specs are copies,
        # not the class attributes user code passes to ctx.state.
        plan = pickle.loads(pickle.dumps(plan_computation(p, "c", 1)))
        KeyGroupExecutor(plan, store).step([Delivery("k", "in", Record("k", step, 0, f"r{step}"), 0, True)],
                                           [Segment(0, 0)], 0)
    values, _ = inspect_key(plan, store.load(["k"])["k"])
    assert values["pairs"] == (0, 1, 2)
    assert values["names"] == {0: Point(0, 0), 1: Point(1, 1), 2: Point(2, 2)}


def test_a_same_named_spec_uses_the_declared_codec():
    inline = ValueState("v_custom")  # same name and kind as the declared one, default JSON codec

    def write(ctx, c):
        ctx.state(c.v_custom).set((1, 2))

    def read(ctx, c):
        return ctx.state(inline).get()

    comp = Scripted({"write": write, "read": read})
    h = harness_for(comp)
    run(h, ("k", "write"))
    run(h, ("k", "read"))
    assert results(comp, "read")["k"] == (1, 2)


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def test_json_codec_round_trips_exactly_and_writes_equal_values_as_equal_bytes():
    codec = JsonCodec()
    values = [0, -1, 2**63 - 1, 2**64 - 1, 2**70, -(2**90), 1.5, 1e300, "é✓", None, True,
              {"b": [1, {"z": 2, "a": 3}], "a": "x"}]
    for value in values:
        assert codec.decode(codec.encode(value)) == value
        assert type(codec.decode(codec.encode(value))) is type(value)
    assert codec.encode({"a": 1, "b": 2}) == codec.encode({"b": 2, "a": 1})
    # What JSON would hand back changed is refused, never stored silently changed.
    for changed in [(1, (2, 3)), {1: "x"}, {1: "a", "1": "b"}, float("nan"), float("inf"), {1, 2}, b"x",
                    [1, (2,)], {"nested": {"deep": [datetime.date(2020, 1, 1)]}}, Color.RED, Level.HIGH,
                    Point(1, 2)]:
        with pytest.raises(TypeError, match="PickleCodec"):
            codec.encode(changed)


def _random_json_value(rnd: random.Random, depth: int = 0):
    """A value JSON holds exactly: ints of every length (the 64-bit edges above all), floats, text
    with non-ASCII and lone surrogates, nested lists and dicts."""
    kind = rnd.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rnd.choice([2**63, 2**64]) + rnd.randrange(-3, 4) * rnd.choice([1, -1])
    if kind == 1:
        digits = rnd.randrange(1, 26)
        return rnd.choice([1, -1]) * rnd.randrange(10 ** (digits - 1), 10**digits)
    if kind == 2:
        return rnd.choice([0.0, -0.0, 1e300, -2.5e-300, rnd.uniform(-1e20, 1e20), float(rnd.randrange(10**19))])
    if kind == 3:
        return "".join(rnd.choice(["a", "é", "✓", "\ud800", "\udfff", '"', "\\", "\n", "😀"])
                       for _ in range(rnd.randrange(4)))
    if kind == 4:
        return rnd.choice([None, True, False])
    if kind in (5, 6):
        return [_random_json_value(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    return {f"{_random_json_value(rnd, 9)}{i}": _random_json_value(rnd, depth + 1) for i in range(rnd.randrange(4))}


def _exact_form(value) -> str:
    """The value's text with every scalar's type shown, dict keys in order (JSON's are sorted): equal
    texts, equal values of equal types all the way down."""
    if isinstance(value, list):
        return "[" + ",".join(map(_exact_form, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_exact_form(v)}" for k, v in sorted(value.items())) + "}"
    return f"{type(value).__name__}:{value!r}"


def _texts(value) -> list[str]:
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [key, *_texts(item)]]
    return [value] if isinstance(value, str) else []


def test_json_codec_round_trips_random_values_exactly_or_refuses_them():
    """Exact, or refused: a high surrogate followed by a low one is the one text JSON cannot hold (its
    two escapes read back as one character)."""
    from millstream.model.codecs import CodecError

    codec, rnd, refused = JsonCodec(), random.Random(7), 0
    for _ in range(5_000):
        value = _random_json_value(rnd)
        pair = any(0xD800 <= ord(a) < 0xDC00 <= ord(b) < 0xE000 for t in _texts(value) for a, b in zip(t, t[1:]))
        if pair:
            with pytest.raises(CodecError, match="surrogate pair"):
                codec.encode(value)
            refused += 1
            continue
        assert _exact_form(codec.decode(codec.encode(value))) == _exact_form(value), value
        assert codec.encode(value) == codec.encode(codec.decode(codec.encode(value)))
    assert 0 < refused < 1_000


def test_str_codec_refuses_text_utf8_cannot_hold_with_a_codec_error():
    from millstream.model.codecs import CodecError, StrCodec

    with pytest.raises(CodecError, match="surrogate.*JsonCodec"):
        StrCodec().encode("a\ud800b")
    assert StrCodec().decode(StrCodec().encode("é✓")) == "é✓"


def test_json_encoded_values_hold_only_their_own_bytes():
    """Encoded values live on in productions and state until a step ends: each must take about its
    own length in memory (orjson's result object keeps its whole output buffer, kilobytes)."""
    import tracemalloc

    codec = JsonCodec()
    values = [v for i in range(2_000) for v in ({"bucket": i, "count": 1}, f"a string {i}", [i, 2.5, None])]
    tracemalloc.start()
    try:
        kept = [codec.encode(v) for v in values]
        per_value = tracemalloc.get_traced_memory()[0] / len(kept)
    finally:
        tracemalloc.stop()
    assert per_value < 200, f"{per_value:.0f} bytes of memory per encoded value"


@pytest.mark.parametrize("indexed_entries", [32, 0], ids=["indexed", "not-indexed"])
@pytest.mark.parametrize("key_codec", [JsonCodec(), PickleCodec()], ids=["json", "pickle"])
@pytest.mark.parametrize("pool", [[0, 1, 2, 3, "1", "a", "b", "", 10**30], [0, 1, 2.5, -7.25, "1", "a"]],
                         ids=["ints-and-strs", "with-floats"])
def test_map_cells_agree_with_a_plain_dict_over_many_steps(key_codec, pool, indexed_entries, monkeypatch):
    """A map state's cell against a plain dict, step after step over the same stored entries: random
    get, contains, put and remove, keys of several types, up to 30 operations per step, now and then
    flushed and used on. Small maps
    are looked up through an index of their decoded keys (JSON keys): with it, and without."""
    from millstream.core import keystate
    from millstream.core.keystate import MapCell

    monkeypatch.setattr(keystate, "INDEXED_MAP_ENTRIES", indexed_entries)

    rng = random.Random(11)
    spec = MapState("m", key_codec=key_codec)
    stored: dict[bytes, bytes] = {}
    model: dict = {}
    for _ in range(300):
        cell = MapCell(spec, stored)
        for _ in range(rng.randrange(0, 30)):
            key, op = rng.choice(pool), rng.random()
            if op < 0.4:
                assert cell.get(key, "dflt") == model.get(key, "dflt"), key
                assert type(cell.get(key)) is type(model.get(key)), key
            elif op < 0.55:
                assert cell.contains(key) == (key in model), key
            elif op < 0.78:
                value = rng.randrange(100)
                cell.put(key, value)
                model[key] = value
            elif op < 0.97:
                cell.remove(key)
                model.pop(key, None)
            else:  # flushed in the middle of a step (as after each invocation, to find a state that fails)
                cell.encode()
        encoded = cell.encode()  # the entries to store, None for none, or a marker: nothing changed
        stored = encoded if isinstance(encoded, dict) else {} if encoded is None else stored
        decoded = {key_codec.decode(k): spec.value_codec.decode(v) for k, v in stored.items()}
        assert decoded == model and {type(k) for k in decoded} == {type(k) for k in model}


class LooseKeyCodec:
    """A user's key codec that does not round-trip exactly: ints are stored as their text and come
    back as str."""

    def encode(self, value):
        return str(value).encode()

    def decode(self, data):
        return bytes(data).decode()


def test_a_map_key_stored_by_a_codec_that_decodes_it_differently_is_still_found():
    """A stored key is found by its encoding: a decoded-key index (kept for JSON keys) would miss an
    int key this codec gives back as str."""
    from millstream.core.keystate import MapCell

    spec = MapState("m", key_codec=LooseKeyCodec())
    cell = MapCell(spec, {})
    cell.put(5, "five")
    stored = cell.encode()
    later = MapCell(spec, stored)  # the next step, over the stored entries
    assert (later.get(5), later.contains(5), later.get(6)) == ("five", True, None)
    later.remove(5)
    assert later.encode() is None  # removed from what is stored


class CountingJson(JsonCodec):
    """JSON, counting its encodes and decodes (class-wide: reset them in the test)."""

    encodes = decodes = 0

    def encode(self, value):
        CountingJson.encodes += 1
        return super().encode(value)

    def decode(self, data):
        CountingJson.decodes += 1
        return super().decode(data)


def test_a_step_looking_up_few_keys_of_a_stored_map_decodes_none_of_its_keys(monkeypatch):
    """The index of a map's stored keys costs a decode per entry: it is built only once a step has
    looked up as many keys as the map holds, after which keys not stored cost no encoding."""
    from millstream.core import keystate
    from millstream.core.keystate import MapCell

    monkeypatch.setattr(keystate, "_EXACT_KEY_CODECS", (CountingJson,))
    codec = CountingJson()
    stored = {codec.encode(k): b"1" for k in range(10)}
    CountingJson.encodes = CountingJson.decodes = 0
    cell = MapCell(MapState("m", key_codec=codec), stored)
    assert cell.get(100) is None
    assert (CountingJson.encodes, CountingJson.decodes) == (1, 0)  # one key looked up: by its encoding alone
    assert [cell.get(k) for k in range(3, 12)] == [1] * 7 + [None] * 2
    assert CountingJson.decodes == 0  # ten keys looked up, as many as stored: no index yet
    assert cell.get(12) is None
    assert CountingJson.decodes == 10  # the eleventh built it
    encodes = CountingJson.encodes
    assert [cell.get(k) for k in range(200, 220)] == [None] * 20
    assert CountingJson.encodes == encodes  # keys not stored: found absent without encoding them
    assert cell.get(1) == 1


def test_repeated_lookups_of_one_absent_key_build_no_index(monkeypatch):
    """The index waits for as many distinct keys as the map holds: looking one absent key up again
    and again must not make a step pay a decode per stored entry."""
    from millstream.core import keystate
    from millstream.core.keystate import MapCell

    monkeypatch.setattr(keystate, "_EXACT_KEY_CODECS", (CountingJson,))
    codec = CountingJson()
    cell = MapCell(MapState("m", key_codec=codec), {codec.encode(k): b"1" for k in range(10)})
    CountingJson.encodes = CountingJson.decodes = 0
    for _ in range(33):
        assert cell.get(100) is None and not cell.contains(100)
    assert (CountingJson.encodes, CountingJson.decodes) == (1, 0)


def _reloaded_map(key, value):
    """A KeyState whose map state "m" holds one entry, flushed and read back (the next step's view)."""
    from millstream.core.keystate import KeyState

    spec = MapState("m")
    state = KeyState()
    state.cell(spec).put(key, value)
    state.flush({"m": spec})
    return KeyState.loads(state.dumps()), spec


def _map_steps(*steps):
    """Each function applied to map state "m" in a step of its own (flushed, stored, read back for the
    next): what each returned."""
    from millstream.core.keystate import KeyState

    spec, blob, answers = MapState("m"), None, []
    for step in steps:
        state = KeyState.loads(blob) if blob else KeyState()
        answers.append(step(state.cell(spec)))
        state.flush({"m": spec})
        state.end_step()
        blob = state.dumps()
    return answers


def test_map_keys_equal_in_python_but_encoded_differently_are_distinct_keys():
    """Under JSON 1, 1.0 and True are three encodings, so three keys, in every step: a lookup of one
    never answers with another's entry, whatever the step looked up before."""
    answers = _map_steps(lambda m: m.put(1.0, "a"),
                         lambda m: [m.get(1), m.get(1.0), m.contains(1.0), m.contains(True), len(m)])
    assert answers[1] == [None, "a", True, False, 1]
    # Put and read in one step as in two.
    assert _map_steps(lambda m: (m.put(1.0, "a"), m.get(1))[1], lambda m: m.get(1)) == [None, None]
    answers = _map_steps(lambda m: m.put(1.0, "a"), lambda m: (list(m.items()), m.put(1, "b")),
                         lambda m: [m.get(1), m.get(1.0), sorted(map(repr, m.items())), len(m)])
    assert answers[2] == ["b", "a", ["(1, 'b')", "(1.0, 'a')"], 2]
    answers = _map_steps(lambda m: (m.put(1, "i"), m.put(True, "t"), m.remove(1.0)),
                         lambda m: (m.remove(True), [repr(k) for k in m.keys()]))
    assert answers[1] == (None, ["1"])


def test_map_keys_of_other_codecs_are_their_encodings_too():
    from millstream.core.keystate import MapCell
    from millstream.model.codecs import StrCodec

    class Name(str):
        pass

    cell = MapCell(MapState("m", key_codec=PickleCodec()), {})
    cell.put((1,), "int")
    cell.put((1.0,), "float")  # equal to (1,) in Python, pickled apart
    assert (cell.get((1,)), cell.get((1.0,)), len(cell)) == ("int", "float", 2)
    later = MapCell(MapState("m", key_codec=PickleCodec()), cell.encode())
    assert (later.get((1.0,)), later.get((1,)), sorted(map(repr, later.keys()))) == ("float", "int", ["(1,)", "(1.0,)"])
    cell = MapCell(MapState("m", key_codec=StrCodec()), {b"a": b"1"})
    assert cell.get(Name("a")) == 1  # a str subclass: encoded as its text, so the key "a"
    cell.put(Name("b"), 2)
    assert (cell.get("b"), list(cell.keys())) == (2, ["a", "b"])


# Keys equal in Python across types (and 0.0 == -0.0), each a key of its own under JSON; last, one
# JSON refuses.
_MIXED_KEYS = [1, 1.0, True, 0, 0.0, -0.0, False, 2, 2.5, "1", "a", None, (1, 2)]


class MapOps(Computation):
    """Applies a record's operation (op, index into _MIXED_KEYS, value) to its key's map, producing the
    answer's repr (1 and 1.0 print apart)."""

    entries = MapState("entries")

    def process_record(self, ctx, record):
        entries = ctx.state(self.entries)
        op, index, value = record.value
        key = _MIXED_KEYS[index]
        if op == "put":
            answer = entries.put(key, value)
        elif op == "remove":
            answer = entries.remove(key)
        elif op == "get":
            answer = entries.get(key, "absent")
        elif op == "contains":
            answer = entries.contains(key)
        elif op == "len":
            answer = len(entries)
        elif op == "clear":
            answer = entries.clear()
        else:
            answer = list(entries.items())
        ctx.produce(Record(ctx.key, repr(answer), record.timestamp), "out")


@pytest.mark.parametrize("seed", range(3))
def test_map_keys_are_their_encodings_whatever_the_steps(seed):
    """Random map operations over keys equal in Python but encoded apart, split into steps in several
    ways, against a plain dict keyed by the key's JSON encoding (what is stored): every answer as the
    dict gives it, with the key a listing shows decoded from that encoding."""
    codec = JsonCodec()
    rng = random.Random(seed)
    ops, model, expected = [], {}, []
    for i in range(250):
        op = rng.choice(["put", "put", "get", "get", "contains", "remove", "items", "len", "clear"] if i % 60
                        else ["clear"])
        index = rng.randrange(len(_MIXED_KEYS) - 1)  # the refused key: below
        key, value = _MIXED_KEYS[index], rng.randrange(100)
        encoded = codec.encode(key)
        ops.append((op, index, value))
        if op == "put":
            model[encoded] = value
            answer = None
        elif op == "remove":
            answer = model.pop(encoded, None) and None
        elif op == "get":
            answer = model.get(encoded, "absent")
        elif op == "contains":
            answer = encoded in model
        elif op == "len":
            answer = len(model)
        elif op == "clear":
            answer = model.clear()
        else:
            answer = [(codec.decode(k), v) for k, v in model.items()]
        expected.append(repr(answer))
    refused = len(_MIXED_KEYS) - 1  # never stored: absent to every lookup, and removing it changes nothing
    for position in sorted(rng.sample(range(len(ops)), 12)):
        ops.insert(position, (rng.choice(["get", "contains", "remove"]), refused, 0))
        expected.insert(position, repr({"get": "absent", "contains": False, "remove": None}[ops[position][0]]))
    for steps in (1, 2, 9, len(ops)):
        h = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                            .add_computation("m", MapOps(), ["in"], ["out"]))
        cuts = sorted(rng.sample(range(1, len(ops)), steps - 1))
        for start, end in zip([0, *cuts], [*cuts, len(ops)]):
            h.feed("src", [Record("k", list(op), i, f"r{i}") for i, op in enumerate(ops[start:end], start)])
            h.run()
        assert [r.value for r in h.output("out")] == expected, steps


def _map_session(seed: int, keys: list, monkeypatch, indexed: bool) -> list:
    """Random map operations over steps (flushes mid-step, clear, removal), every answer and blob."""
    import pickle
    from millstream.core import keystate

    monkeypatch.setattr(keystate.MapCell, "_lookups_before_index",
                        (lambda self: 0 if len(self.stored) <= keystate.INDEXED_MAP_ENTRIES else -1) if indexed
                        else (lambda self: -1))
    rnd, spec, out, blob = random.Random(seed), MapState("m"), [], None
    for _ in range(5):
        state = keystate.KeyState.loads(blob) if blob else keystate.KeyState()
        cell = state.cell(spec)
        for _ in range(rnd.randrange(1, 20)):
            op, key = rnd.random(), rnd.choice(keys)
            if op < 0.35:
                out.append(repr(cell.get(key, "absent")))
            elif op < 0.6:
                cell.put(key, rnd.randrange(5))
            elif op < 0.75:
                cell.remove(key)
            elif op < 0.85:
                out.append(cell.contains(key))
            elif op < 0.9:
                out.append(sorted(map(repr, cell.items())))
            elif op < 0.93:
                cell.clear()
            else:
                state.flush({"m": spec})
        state.flush({"m": spec})
        blob = state.dumps()
        out.append(sorted(pickle.loads(blob)[0].get("m", {}).items()))
    return out


def test_the_map_index_changes_nothing_for_keys_equal_across_types(monkeypatch):
    """1, 1.0 and True are one dict key but three JSON encodings: which one a step stores depends on the
    form its first lookup took, index or not."""
    keys = [0, 1, 1.0, True, False, 0.0, -0.0, 2, "a", "1", None, "\ud800", -(2**63) - 1]
    for seed in range(400):
        assert _map_session(seed, keys, monkeypatch, True) == _map_session(seed, keys, monkeypatch, False), seed


class ReprKeyCodec:
    """A user's key codec: a key's repr (1, 1.0 and True apart, as are 0.0 and -0.0), read back by
    literal_eval. No int or str key is kept as itself under it: every key takes the encoded path."""

    def encode(self, value):
        return repr(value).encode()

    def decode(self, data):
        import ast

        return ast.literal_eval(bytes(data).decode())


def _fresh(value):
    """An object equal to `value`, of its type and (floats, strs, bytes, tuples) not `value` itself:
    a key built anew for each record, as user code builds them."""
    kind = type(value)
    if kind is float:
        return float(repr(value))
    if kind is str:
        return "".join(list(value))
    if kind is bytes:
        return bytes(list(value))
    if kind is tuple:
        return tuple(_fresh(item) for item in value)
    return value


_AB = "".join(["a", "b"])
# Keys equal in Python across types (1 == 1.0 == True, 0.0 == -0.0, (1, 2) == (1.0, 2)) and keys whose
# pickle depends on what they share: ("ab", "ab") pickles one str twice or two equal strs apart.
_FORM_KEYS = [0, 1, 1.0, True, False, -0.0, 0.0, 2.5, -7.25, 1e300, None, "1", "a", 10**30, b"xy", (1, 2), (1.0, 2),
              (True, 2), (0.0,), (-0.0,), ((1,), 1.0), ((1.0,), 1), ("a", 1), ("a", 1.0), ("a", True), ("a", 0.0),
              ("a", -0.0), ("a", "b"), (None, b"xy", 2.5), (_AB, _AB), (_AB, "".join(_AB)), (b"xy", b"xy")]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("key_codec", [JsonCodec(), PickleCodec(), ReprKeyCodec()], ids=["json", "pickle", "repr"])
def test_map_keys_are_their_encodings_across_steps_flushes_and_failures(key_codec, seed, monkeypatch):
    """Random map operations against a plain dict keyed by each key's encoding (what is stored), keys
    looked up as the same object again and as equal objects built anew, over steps (the KeyState kept
    or read back from its blob), flushes within a step, and failures that go back to a checkpoint
    taken within it. Keys the codec refuses are absent to every lookup; unhashable keys raise. Odd
    seeds: a map remembers few key forms at a time (it forgets them all when full)."""
    import math

    from millstream.core import keystate
    from millstream.core.keystate import KeyState
    from millstream.model.codecs import CodecError

    if seed % 2:
        monkeypatch.setattr(keystate, "MAX_REMEMBERED_FORMS", 3, raising=False)  # also runs before the cache

    def encoding(key):
        try:
            return key_codec.encode(key)
        except CodecError:
            return None  # refused: never stored

    keys = _FORM_KEYS + ([math.nan, (math.nan, 1)] if type(key_codec) is PickleCodec else [])
    rng = random.Random(seed)
    spec, model, blob, state = MapState("m", key_codec=key_codec), {}, None, None
    for _ in range(40):
        state = KeyState.loads(blob) if blob is not None and rng.random() < 0.7 else state or KeyState()
        checkpoint = None
        for _ in range(rng.randrange(1, 40)):
            cell = state.cell(spec)
            key = rng.choice(keys)
            key = _fresh(key) if rng.random() < 0.5 else key
            encoded, op = encoding(key), rng.random()
            if op < 0.3:
                expected = model.get(encoded, "absent") if encoded is not None else "absent"
                assert repr(cell.get(key, "absent")) == repr(expected), key
            elif op < 0.4:
                assert cell.contains(key) == (encoded in model), key
            elif op < 0.6:
                if encoded is not None:
                    value = rng.randrange(100)
                    cell.put(key, value)
                    model[encoded] = value
            elif op < 0.72:
                cell.remove(key)
                model.pop(encoded, None)
            elif op < 0.76:
                listed = [(key_codec.decode(k), v) for k, v in model.items()]
                assert repr(list(cell.items())) == repr(listed) and len(cell) == len(model)
            elif op < 0.78:
                cell.clear()
                model.clear()
            elif op < 0.8:
                unhashable, method = rng.choice([[1], (1, [2])]), rng.choice(["get", "put", "remove", "contains"])
                with pytest.raises(TypeError, match="must be hashable"):
                    cell.put(unhashable, 0) if method == "put" else getattr(cell, method)(unhashable)
            elif op < 0.86:  # a flush within the step (the checkpoint before it is spent)
                state.flush({"m": spec})
                checkpoint = None
            elif op < 0.93:
                checkpoint = state.checkpoint(), dict(model)
            elif checkpoint is not None:  # a failure: back to the checkpoint
                state, model = KeyState.restored(checkpoint[0]), checkpoint[1]
                checkpoint = None
        state.flush({"m": spec})
        state.end_step()
        assert list(state.values.get("m", {}).items()) == [(k, spec.value_codec.encode(v)) for k, v in model.items()]
        blob = state.dumps()



class Box:
    """Hashable by identity, pickled with what it holds."""

    def __init__(self, content) -> None:
        self.content = content


def test_a_map_key_holding_an_object_that_changes_is_encoded_as_it_is_at_each_use():
    """A key's form may be remembered within a step only where its encoding cannot change."""
    from millstream.core.keystate import MapCell

    cell = MapCell(MapState("m", key_codec=PickleCodec()), {})
    box = Box(1)
    key = ("k", box)
    cell.put(key, "one")
    box.content = 2
    assert (cell.get(key, "absent"), cell.contains(key)) == ("absent", False)
    cell.put(key, "two")
    assert [(k[1].content, v) for k, v in cell.items()] == [(1, "one"), (2, "two")]

def test_json_codec_decodes_negative_ints_of_nineteen_digits_exactly():
    from millstream.model.codecs import JsonCodec

    codec = JsonCodec()
    for value in (-(2**63) - 1, -9999999999999999999, {"n": -9999999999999999999}):
        assert codec.decode(codec.encode(value)) == value


def test_a_big_negative_int_map_key_is_found_and_removed_once_the_index_is_built():
    key = -9999999999999999999
    state, spec = _reloaded_map(key, "v")
    cell = state.cell(spec)
    cell.get("x")  # one stored entry: the second lookup builds the index
    assert cell.get(key, "absent") == "v" and cell.contains(key)
    cell.remove(key)
    state.flush({"m": spec})
    assert not state.values.get("m")


def test_a_failed_flush_leaves_no_stale_map_index():
    from millstream.model.codecs import CodecError

    state, spec = _reloaded_map("a", 0)
    cell = state.cell(spec)
    cell.get("y"), cell.get("z")  # the second lookup of a one-entry map builds the index
    cell.put("b", 1)
    cell.put((1, 2), 2)  # refused by JSON at the flush, after "b" was stored
    with pytest.raises(CodecError):
        state.flush({"m": spec})
    cell.clear()
    state.flush({"m": spec})
    assert not state.values.get("m") and len(cell) == 0


@pytest.mark.parametrize("declare, message", [
    (lambda: ValueState("v", codec="json"), "state 'v': codec must be a codec object"),
    (lambda: ListState("l", codec=JsonCodec), "state 'l': codec must be a codec object"),
    (lambda: MapState("m", key_codec=None), "state 'm': key_codec must be a codec object"),
    (lambda: MapState("m", value_codec=5), "state 'm': value_codec must be a codec object"),
    (lambda: ValueState(""), "a state's name must be a non-empty str"),
])
def test_a_state_declared_with_no_codec_or_name_is_refused_where_declared(declare, message):
    with pytest.raises(TypeError, match=message):
        declare()


def test_journaled_timers_undo_to_the_mark_as_a_copy_taken_there_would():
    """Random changes between marks, undone at random: the timers, in their order, as a plain copy
    taken at the mark (what checkpoints took before the journal)."""
    rng = random.Random(5)
    for _ in range(300):
        timers = JournaledTimers({f"t{n}": (n, False, "s", "") for n in range(rng.randrange(6))})
        at_mark = dict(timers)
        for _ in range(rng.randrange(1, 40)):
            tag, fields = f"t{rng.randrange(8)}", (rng.randrange(100), False, "s", "")
            op = rng.choice(["set", "set", "pop", "pop_default", "del", "setdefault", "update", "popitem",
                             "clear", "mark", "undo"])
            if op == "set":
                timers[tag] = fields
            elif op == "pop":
                if tag in timers:
                    timers.pop(tag)
            elif op == "pop_default":
                timers.pop(tag, None)
            elif op == "del":
                if tag in timers:
                    del timers[tag]
            elif op == "setdefault":
                timers.setdefault(tag, fields)
            elif op == "update":
                timers.update({tag: fields})
            elif op == "popitem":
                if timers:
                    timers.popitem()
            elif op == "clear" and rng.random() < 0.2:
                timers.clear()
            elif op == "mark":
                timers.mark()
                at_mark = dict(timers)
            elif op == "undo":
                timers.undo()
                assert list(timers.items()) == list(at_mark.items())
        timers.undo()
        assert list(timers.items()) == list(at_mark.items())
    with pytest.raises(KeyError):
        del JournaledTimers({})["absent"]
    with pytest.raises(KeyError):
        JournaledTimers({}).popitem()


class MapOrder(Computation):
    """Applies a record's map operation to its key's map; "keys" and "items" produce what it lists."""

    entries = MapState("entries")

    def process_record(self, ctx, record):
        entries = ctx.state(self.entries)
        op, name, value = record.value
        if op == "put":
            entries.put(name, value)
        elif op == "remove":
            entries.remove(name)
        elif op == "get":
            entries.get(name)
        elif op == "clear":
            entries.clear()
        elif op == "keys":
            ctx.produce(Record(ctx.key, list(entries.keys()), record.timestamp), "out")
        else:
            ctx.produce(Record(ctx.key, [list(pair) for pair in entries.items()], record.timestamp), "out")


@pytest.mark.parametrize("seed", range(4))
def test_a_map_lists_its_entries_in_dict_order_whatever_the_steps(seed):
    # A plain dict's order over the map's whole history (a put of a new or removed key goes last, of
    # a present one keeps its place; reads move nothing), however the operations fall into steps: it
    # listed the entries its step had touched first, so a read, or where a step began, reordered
    # keys() and items() (and the productions made from them, whose ids follow their order).
    rng = random.Random(seed)
    ops, model, expected = [], {}, []
    for i in range(300):
        op = rng.choice(["put", "put", "put", "remove", "get", "get", "keys", "items", "clear"] if i % 50
                        else ["clear"])
        name, value = rng.choice("abcdefg"), rng.randrange(100)
        ops.append((op, name, value))
        if op == "put":
            model[name] = value
        elif op == "remove":
            model.pop(name, None)
        elif op == "clear":
            model.clear()
        elif op == "keys":
            expected.append(list(model))
        elif op == "items":
            expected.append([[k, v] for k, v in model.items()])
    for steps in (1, 7, 300):  # everything in one step, a step every ~43 operations, one per operation
        h = PipelineHarness(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                            .add_computation("m", MapOrder(), ["in"], ["out"]))
        cuts = sorted(rng.sample(range(1, len(ops)), steps - 1))
        for start, end in zip([0, *cuts], [*cuts, len(ops)]):
            h.feed("src", [Record("k", list(op), i, f"r{i}") for i, op in enumerate(ops[start:end], start)])
            h.run()
        assert [r.value for r in h.output("out")] == expected, steps
