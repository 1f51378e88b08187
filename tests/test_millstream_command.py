"""`millstream new` writes a project whose own tests pass; `millstream run` refuses what is not a
pipeline in one line, and runs one (on the harness here: no Spark in this suite)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType

from clitools import assert_refused, call, run
from millstream.cli import main as millstream_main


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("generated_pipeline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_new_writes_a_project_whose_tests_pass(tmp_path) -> None:
    made = run("millstream", "new", "clicks", "--directory", str(tmp_path))
    assert made.code == 0, made.output
    project = tmp_path / "clicks"
    assert sorted(os.listdir(project)) == ["README.md", "pipeline.py", "test_pipeline.py"]
    tested = run("pytest", "-q", "-p", "no:cacheprovider", "test_pipeline.py", cwd=str(project))
    assert tested.code == 0, tested.output
    assert "3 passed" in tested.stdout
    ran = run("millstream", "run", "pipeline:pipeline", "--runner", "harness", cwd=str(project))
    assert ran.code == 0, ran.output
    assert "done in" in ran.stdout and "6,000 records in this run" in ran.stdout
    sample = _load(project / "pipeline.py")
    minutes = {(c.key, c.timestamp // sample.MINUTE_MS) for c in map(sample.sample_click, range(6_000))}
    assert f"clicks_per_minute: {len(minutes)} records" in ran.stdout  # one per page and minute with clicks
    # Refuses to write over it.
    assert_refused(run("millstream", "new", "clicks", "--directory", str(tmp_path)), "already exists")


def test_run_refuses_what_is_not_a_pipeline(tmp_path) -> None:
    (tmp_path / "jobs.py").write_text("from millstream import Pipeline\nnot_a_pipeline = 42\n"
                                      "def build():\n    return None\n")
    (tmp_path / "broken.py").write_text("x = (\n")
    (tmp_path / "raises.py").write_text("import json\n\n\ndef rate():\n    return 1 / 0\n\n\nr = rate()\n")
    (tmp_path / "imports.py").write_text("import no_such_helper_module\n")
    (tmp_path / "config.py").write_text("import json\n\nsettings = json.loads('{bad')\n")
    cwd = str(tmp_path)
    # The real command once; the other refusals in process (same main, same output, no new interpreter).
    assert_refused(run("millstream", "run", "nosuch:pipeline", cwd=cwd), "cannot import 'nosuch'")
    assert_refused(call(millstream_main, "run", "broken:x", cwd=cwd), "SyntaxError")
    # Code that fails as the module imports: where, in the user's file.
    raises = str(tmp_path / "raises.py")
    assert_refused(call(millstream_main, "run", "raises:r", cwd=cwd),
                   f"cannot import 'raises': ZeroDivisionError: division by zero ({raises}, line 5)")
    assert_refused(call(millstream_main, "run", "imports:p", cwd=cwd),
                   f"No module named 'no_such_helper_module' ({tmp_path / 'imports.py'}, line 1)")
    # The user's line that called the library, not the library's line that raised.
    assert_refused(call(millstream_main, "run", "config:p", cwd=cwd),
                   f"JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1) "
                   f"({tmp_path / 'config.py'}, line 3)")
    assert_refused(call(millstream_main, "run", "jobs:missing", cwd=cwd), "has no attribute 'missing'")
    assert_refused(call(millstream_main, "run", "jobs:not_a_pipeline", cwd=cwd),
                   "is an int, not a millstream.Pipeline")
    assert_refused(call(millstream_main, "run", "jobs:build", cwd=cwd), "is a function")
    assert_refused(call(millstream_main, "run", "jobs", cwd=cwd), "expected module:attribute")
    assert_refused(call(millstream_main, "run", "jobs:x", "--master", "spark://127.0.0.1:1", cwd=cwd),
                   "has no attribute")


def test_run_checks_master_and_root_before_starting(tmp_path) -> None:
    made = run("millstream", "new", "shop", "--directory", str(tmp_path))
    assert made.code == 0, made.output
    cwd = str(tmp_path / "shop")
    assert_refused(run("millstream", "run", "pipeline:pipeline", "--master", "spark://127.0.0.1:1", cwd=cwd),
                   "cannot reach Spark master")
    assert_refused(run("millstream", "run", "pipeline:pipeline", "--root", "/proc/nope", cwd=cwd), "--root /proc/nope")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert_refused(run("millstream", "run", "pipeline:pipeline", "--fresh", "--root", str(tmp_path / "mine"), cwd=cwd),
                   "not a millstream root")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_run_refuses_an_empty_root_and_never_deletes_the_directory_it_runs_in(tmp_path) -> None:
    """An empty --root once made the project folder the root, and --fresh then deleted the project."""
    made = run("millstream", "new", "shop", "--directory", str(tmp_path))
    assert made.code == 0, made.output
    project = tmp_path / "shop"
    cwd, before = str(project), sorted(os.listdir(project))
    for empty in ("", "  "):
        assert_refused(call(millstream_main, "run", "pipeline:pipeline", "--root", empty, cwd=cwd), "--root")
        assert_refused(call(millstream_main, "run", "pipeline:pipeline", "--fresh", "--root", empty, cwd=cwd),
                       "--root")
    (project / "pipeline.json").write_text("{}")  # as if a run had made the project folder its root
    for here in (".", cwd, str(tmp_path)):  # the folder itself, or a folder holding it
        assert_refused(call(millstream_main, "run", "pipeline:pipeline", "--fresh", "--root", here, cwd=cwd),
                       "current directory")
    assert sorted(os.listdir(project)) == sorted(before + ["pipeline.json"])
    assert_refused(call(millstream_main, "run", "pipeline:pipeline", "--root", "foo://bucket/x", cwd=cwd),
                   "local directory")
    assert not os.path.exists(project / "foo:")


def test_status_refuses_an_empty_root(tmp_path) -> None:
    assert_refused(call(millstream_main, "status", "", cwd=str(tmp_path)), "the root is empty")


def test_a_harness_run_follows_the_wall_clock(tmp_path) -> None:
    """`millstream run --runner harness` fires the wall-time timers due soon, lets a quiet input
    declare itself idle, and waits for a paced input, as SparkRunner.run does, before it reports done
    (it never moved the clock, and stopped when nothing was there yet)."""
    (tmp_path / "wallpipes.py").write_text('''
from millstream import (Computation, Count, GeneratorInjector, ListState, Pipeline, Record, ScriptedInjector,
                        TimeDomain, TumblingWindows, WindowAggregate)


class Buffer(Computation):
    """Flushes a key's records 100 ms of wall time after its first."""

    buf = ListState("buf")

    def process_record(self, ctx, record):
        if not ctx.state(self.buf).get():
            ctx.set_timer("flush", ctx.wall_time + 100, TimeDomain.WALL_TIME)
        ctx.state(self.buf).append(record.value)

    def process_timer(self, ctx, timer):
        ctx.produce(Record(ctx.key, ctx.state(self.buf).get(), ctx.low_watermark), "flushed")
        ctx.state(self.buf).clear()


paced = (Pipeline("paced")
         .add_injector("gen", GeneratorInjector(lambda i: Record("k", i, i), total=20, low_watermark=lambda n: n,
                                                records_per_second=40), "in")
         .add_computation("buffer", Buffer(), ["in"], ["flushed"]))
wall = (Pipeline("wall").add_injector("in", ScriptedInjector("in", [([Record("k", i, i) for i in range(10)], 10)]), "ev")
        .add_computation("buffer", Buffer(), ["ev"], ["flushed"]))
counts = WindowAggregate(TumblingWindows(1_000), Count(), "counts")
idle = (Pipeline("idle")
        .add_injector("busy", ScriptedInjector("busy", [([Record("k", i, i * 100) for i in range(30)], 3_000)]), "ev")
        .add_injector("quiet", ScriptedInjector("quiet", [], finish=False), "ev", idle_after_ms=300)
        .add_computation("count", counts, ["ev"], counts.outputs))
''')
    flushed = call(millstream_main, "run", "wallpipes:wall", "--runner", "harness", cwd=str(tmp_path))
    assert flushed.code == 0 and "flushed: 1 records" in flushed.stdout, flushed.output
    counted = call(millstream_main, "run", "wallpipes:idle", "--runner", "harness", cwd=str(tmp_path))
    assert counted.code == 0 and "counts: 3 records" in counted.stdout, counted.output  # [0, 3000) once quiet is idle
    # An input paced at 40 records/s is read to its end (the run stopped at once, 0 of 20 read).
    paced = call(millstream_main, "run", "wallpipes:paced", "--runner", "harness", cwd=str(tmp_path))
    assert paced.code == 0 and "in: 20 records" in paced.stdout, paced.output


def test_run_refuses_a_cycle_before_touching_the_root(tmp_path) -> None:
    """A pipeline whose streams loop back is refused in one line, on either runner, and the Spark
    runner's root is not made (it was made, with its pipeline.json, before the cycle was found)."""
    (tmp_path / "loops.py").write_text('''
from millstream import Computation, GeneratorInjector, Pipeline, Record

loop = (Pipeline("loop").add_injector("src", GeneratorInjector(lambda i: Record("k", i, i), 5, lambda n: n), "in")
        .add_computation("a", Computation(), ["in", "back"], ["out"])
        .add_computation("b", Computation(), ["out"], ["back"]))
''')
    root = tmp_path / "root"
    cycle = ("loops:loop: cycle through computation 'a': 'a' produces 'out', read by 'b'; 'b' produces 'back', "
             "read by 'a'")
    assert_refused(call(millstream_main, "run", "loops:loop", "--root", str(root), cwd=str(tmp_path)), cycle)
    assert not root.exists()
    assert_refused(call(millstream_main, "run", "loops:loop", "--runner", "harness", cwd=str(tmp_path)), cycle)


MISTAKES = '''
import datetime

from millstream import Computation, GeneratorInjector, Pipeline, Record


class Raises(Computation):
    def process_record(self, ctx, record):
        raise ValueError("boom")


class RaisesInTimer(Computation):
    def process_record(self, ctx, record):
        ctx.set_timer("t", record.timestamp + 1)

    def process_timer(self, ctx, timer):
        raise KeyError("tick")


class SetupRaises(Computation):
    def setup(self, info):
        raise RuntimeError("no database")


class Undeclared(Computation):
    def process_record(self, ctx, record):
        ctx.produce(record, "nowhere")


class Tuples(Computation):
    def process_record(self, ctx, record):
        ctx.produce(Record(record.key, (1, 2), record.timestamp), "out")


def one(computation, make=lambda i: Record("k", i, i), key=None):
    injector = GeneratorInjector(make, total=5, low_watermark=lambda n: n)
    return (Pipeline("mistakes").add_injector("src", injector, "in")
            .add_computation("c", computation, {"in": key} if key else ["in"], ["out"]))


def bad_input(i):
    return 1 / 0


raises = one(Raises())
timer = one(RaisesInTimer())
undeclared = one(Undeclared())
float_time = one(Computation(), lambda i: Record("k", i, float(i)))
datetime_time = one(Computation(), lambda i: Record("k", i, datetime.datetime(2024, 1, 1)))
tuples = one(Tuples())
int_key = one(Computation(), key=lambda record: 5)
raising_key = one(Computation(), key=lambda record: 1 / 0)
raising_injector = one(Computation(), bad_input)
setup_raises = one(SetupRaises())
'''


def test_a_harness_run_ends_a_users_mistake_in_one_line(tmp_path, monkeypatch) -> None:
    """User code raising (in process_record, in process_timer, in a key extractor, in an injector's
    function), producing to an undeclared stream, an injector's float or datetime timestamps, a value
    its stream's codec cannot store: one line naming the computation, key and record and where the
    full trace is, exit code 1, as on Spark (a 35-56 line traceback before, after "starting" twice)."""
    (tmp_path / "mistakes.py").write_text(MISTAKES)
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))  # where the harness leaves the full traces
    errors_log = logs / "millstream-logs" / "mistakes" / "errors.log"
    record = "record 'b7fb4f0c7c6c14f365c4722f' from stream 'in' (timestamp 0)"
    expected = {
        "raises": f"computation 'c' failed on key 'k', {record}: ValueError: boom",
        "timer": "computation 'c' failed on key 'k', timer 't' at 5: KeyError: 'tick'",
        "undeclared": f"computation 'c' failed on key 'k', {record}: ComputationError: computation 'c' produced to "
                      "stream 'nowhere', which is not among its declared outputs ['out']",
        "float_time": "injector 'src' gave a record whose timestamp is a float (0.0); timestamps are int "
                      "milliseconds since the epoch",
        "datetime_time": "injector 'src' gave a record whose timestamp is a datetime",
        "tuples": f"computation 'c' failed on key 'k', {record}: CodecError: stream 'out': JSON cannot store a "
                  "tuple (1, 2)",
        "int_key": "computation 'c': key extractor for stream 'in' failed: TypeError: returned int 5; keys must "
                   "be str, on record 'b7fb4f0c7c6c14f365c4722f'",
        "raising_key": "computation 'c': key extractor for stream 'in' failed: ZeroDivisionError: division by zero",
        "raising_injector": "ZeroDivisionError: division by zero",
    }
    for name, message in expected.items():
        ran = call(millstream_main, "run", f"mistakes:{name}", "--runner", "harness", cwd=str(tmp_path))
        assert ran.code == 1, (name, ran.output)
        assert "Traceback" not in ran.output, ran.output
        assert ran.error_lines() == [ran.stderr.strip()], ran.stderr
        line = ran.stderr.strip()
        assert line.startswith("millstream: error: ") and message in line, (name, line)
        assert line.endswith(f"(full trace in {errors_log})"), line
        assert ran.stdout.count("starting") == 1, ran.stdout
        assert "done in" not in ran.stdout, ran.stdout
    # A computation's setup() raising, as the harness is made: the same, before anything started.
    ran = call(millstream_main, "run", "mistakes:setup_raises", "--runner", "harness", cwd=str(tmp_path))
    assert ran.code == 1 and "Traceback" not in ran.output, ran.output
    assert ran.error_lines() == [f"millstream: error: RuntimeError: no database (full trace in {errors_log})"]
    trace = errors_log.read_text()
    assert trace.count("Traceback") >= len(expected) + 1
    assert 'raise ValueError("boom")' in trace and "return 1 / 0" in trace  # the user's own lines
