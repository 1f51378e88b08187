"""The `millstream` command.

    millstream new NAME                       write a runnable starter project into ./NAME
    millstream run module:pipeline [--root DIR] [--master URL] [--fresh] [--runner spark|harness]
    millstream rescale ROOT --parallelism N [--computation NAME ...]   (the pipeline stopped)
    millstream status ROOT [--watch] [--html PATH]   per computation: watermark, lag, backlog, counters

Options are checked before anything is created, deleted or started; a bad value, an unreachable
master or an unusable directory ends the command in one line with exit code 2 (see
millstream.console.running for the other exit codes).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import sysconfig
import time
import traceback
from importlib import resources
from typing import Any, Sequence

from millstream.console.datadir import check_fresh_start, delete_for_fresh_start
from millstream.console.options import (
    OneLineArgumentParser,
    UsageError,
    check_master,
    check_writable_directory,
    positive_float,
    positive_int,
    quiet_library_warnings,
)
from millstream.console.progress import ProgressDisplay, RateMeter, Snapshot
from millstream.console.running import (
    harness_failure,
    input_records,
    run_command,
    run_on_harness,
    run_on_spark,
    snapshot_of_harness,
    snapshot_of_progress,
)
from millstream.model.pipeline import Pipeline, PipelineError
from millstream.spark.rootfiles import LAYOUT_FILE

PROG = "millstream"
# The widest line `millstream status` writes to a pipe or a file (a table is as wide as its cells).
STATUS_WIDTH_OFF_TERMINAL = 400
_PROJECT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")  # also a valid pipeline name
# What `millstream new` writes: file in the project <- template in millstream/templates.
STARTER_FILES = {"pipeline.py": "starter_pipeline.py.txt", "test_pipeline.py": "starter_test.py.txt",
                 "README.md": "starter_readme.md.txt"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description="MillWheel pipelines on Spark Structured Streaming")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    new = commands.add_parser("new", help="write a runnable starter project (pipeline, test, README)")
    new.add_argument("name", help="project name: letters, digits, '_' or '-', starting with a letter")
    new.add_argument("--directory", default=".", help="where to create the project folder (default: here)")

    run = commands.add_parser("run", help="run a pipeline: module:attribute naming a millstream.Pipeline")
    run.add_argument("target", help="module:attribute, e.g. pipeline:pipeline (the module is imported from "
                                    "the current directory or the installed packages)")
    run.add_argument("--root", default="./millstream-data", help="checkpoints, stream logs and status; reuse it "
                                                                 "to resume (default %(default)s)")
    run.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    run.add_argument("--fresh", action="store_true", help="delete the root first and start over")
    run.add_argument("--runner", choices=("spark", "harness"), default="spark",
                     help="spark (default) or harness: in-process, no Spark, nothing kept")
    run.add_argument("--timeout", type=positive_float, default=None, help="give up after this many seconds")

    rescale = commands.add_parser("rescale", help="change a stopped pipeline's Spark state partitions (tasks) "
                                                  "per computation; the output stays the same")
    rescale.add_argument("root", help="the pipeline's root")
    rescale.add_argument("--parallelism", type=positive_int, required=True, help="state partitions per computation")
    rescale.add_argument("--computation", action="append", default=None,
                         help="only this computation (repeatable; default: all)")
    rescale.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")

    status = commands.add_parser("status", help="per computation of a root: low watermark, lag, backlog, "
                                                "records, late, duplicates, dead letters, timers, idle inputs")
    status.add_argument("root", help="the pipeline's root (running or stopped)")
    status.add_argument("--watch", action="store_true", help="keep the table up to date until Ctrl-C")
    status.add_argument("--interval", type=positive_float, default=2.0,
                        help="seconds between refreshes with --watch (default %(default)s)")
    status.add_argument("--html", metavar="PATH", default=None,
                        help="also write a self-contained page with watermark lag and throughput over time")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_library_warnings()
    return run_command(lambda: _main(argv), PROG)


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    if args.command == "new":
        return new_project(args.name, args.directory)
    if args.command == "rescale":
        return rescale_root(args)
    if args.command == "status":
        return show_status(args)
    return run_pipeline(args)


# -- millstream rescale -------------------------------------------------------------------------------
def rescale_root(args: argparse.Namespace) -> int:
    from millstream.spark.storage import Storage, is_local

    local = is_local(args.root)
    root = os.path.abspath(args.root) if local else args.root
    if not Storage(root).exists(LAYOUT_FILE):
        raise UsageError(f"{args.root} is not a millstream root (no {LAYOUT_FILE})")
    check_master(args.master)
    from millstream.spark.fencing import RootInUse
    from millstream.spark.rescale import RescaleError, check_not_in_use, rescale
    from millstream.spark.session import create_session

    try:
        check_not_in_use(root)  # before Spark starts: it takes seconds
    except RootInUse as error:
        raise UsageError(str(error)) from None
    log_path = os.path.join(root, "spark.log") if local else None
    spark = create_session(args.master, "millstream-rescale", log_path=log_path)
    try:
        done = rescale(spark, root, args.parallelism, args.computation)
    except (RescaleError, RootInUse) as error:
        raise UsageError(str(error)) from None
    finally:
        spark.stop()
    for name, (before, after) in done.items():
        print(f"{name}: {before} -> {after} state partitions")
    return 0


def _raised_at(error: BaseException) -> str:
    """ " (file, line N)" of the innermost frame of `error` in the user's own code: not Python's
    import machinery, its standard library, installed packages or millstream (a mistake in a call
    to millstream, or json.loads of a bad file, is the user's line that made it)."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")]
    paths = sysconfig.get_paths()
    library = tuple(os.path.join(os.path.abspath(path), "") for path in (
        paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"],
        os.path.dirname(os.path.abspath(__file__))))
    own = [frame for frame in frames if not os.path.abspath(frame.filename).startswith(library)] or frames
    return f" ({own[-1].filename}, line {own[-1].lineno})" if own else ""


# -- millstream status --------------------------------------------------------------------------------
def show_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from millstream.console.status import read_root, render_html, status_table

    root = args.root
    view = read_root(root, with_history=bool(args.html))  # refuses a missing or empty root in one line
    if args.html:
        _write_html(args.html, render_html(view))
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:  # a pipe or a file: the table's own width,
        console = Console(width=STATUS_WIDTH_OFF_TERMINAL)       # not rich's 80 columns, which cut every title
    if not args.watch:
        console.print(status_table(view))
        if args.html:
            print(f"wrote {args.html}")
        return 0
    from rich.live import Live

    def refreshed() -> Any:
        view = read_root(root, with_history=bool(args.html))
        if args.html:
            _write_html(args.html, render_html(view))
        return status_table(view)

    # Ctrl-C sets a flag the loop checks rather than raising where it lands: a KeyboardInterrupt
    # raised inside a finalizer is printed and swallowed, and the watch would go on. A second
    # Ctrl-C raises at once (a refresh stuck on a slow file system).
    interrupts: list[int] = []

    def interrupted(signum: int, frame: Any) -> None:
        if interrupts:
            raise KeyboardInterrupt
        interrupts.append(signum)

    def wait_or_stop() -> bool:
        """Wait for the next refresh; True once Ctrl-C was pressed."""
        deadline = time.monotonic() + args.interval
        while not interrupts and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        return bool(interrupts)

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        if not console.is_terminal:  # a pipe or a file: one table after another
            table = status_table(view)
            while True:
                console.print(table)
                sys.stdout.flush()
                if wait_or_stop():
                    return 0
                table = refreshed()
        with Live(status_table(view), console=console, auto_refresh=False) as live:
            while not wait_or_stop():
                live.update(refreshed(), refresh=True)
        return 0
    except KeyboardInterrupt:
        return 0  # the way out of --watch
    finally:
        signal.signal(signal.SIGINT, previous)


def _write_html(path: str, page: str) -> None:
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            out.write(page)
        os.replace(path + ".tmp", path)
    except OSError as error:
        raise UsageError(f"--html {path}: {error.strerror or error}") from None


# -- millstream new ---------------------------------------------------------------------------------
def new_project(name: str, directory: str) -> int:
    """Write the starter project `name` into directory/name, refusing to overwrite anything."""
    if not _PROJECT_NAME.match(name):
        raise UsageError(f"project name {name!r}: use 1-64 letters, digits, '_' or '-', starting with a letter")
    parent = check_writable_directory(directory, "--directory")
    target = os.path.join(parent, name)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise UsageError(f"{target} already exists and is not empty; pick another name or --directory")
    templates = resources.files("millstream") / "templates"
    os.makedirs(target, exist_ok=True)
    for filename, template in STARTER_FILES.items():
        text = (templates / template).read_text(encoding="utf-8").format(name=name)
        with open(os.path.join(target, filename), "w", encoding="utf-8") as out:
            out.write(text)
    shown = os.path.relpath(target)
    print(f"created {shown}/ ({', '.join(STARTER_FILES)})")
    print(f"next:  cd {shown} && python -m pytest test_pipeline.py && millstream run pipeline:pipeline")
    return 0


# -- millstream run ---------------------------------------------------------------------------------
# `millstream run module:pipeline --root --master --fresh`: any user pipeline, validated like the
# demos, on the SparkRunner (or the harness) with the demos' progress display.

def load_pipeline(target: str) -> Pipeline:
    """The Pipeline named by "module:attribute", or UsageError in one line.

    >>> load_pipeline("millstream:Pipeline")
    Traceback (most recent call last):
    ...
    millstream.console.options.UsageError: millstream:Pipeline is a type, not a millstream.Pipeline (call it in the module and name the result)
    """
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"{target!r}: expected module:attribute, e.g. pipeline:pipeline")
    # Like `python -m`: modules in the current directory come first.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise UsageError(f"cannot import {module_name!r}: no such module here ({os.getcwd()}) or installed") from None
        raise UsageError(f"cannot import {module_name!r}: {type(error).__name__}: {error}"
                         f"{_raised_at(error)}") from None
    except SyntaxError as error:
        raise UsageError(f"cannot import {module_name!r}: SyntaxError: {error.msg} ({error.filename}, line "
                         f"{error.lineno})") from None
    except Exception as error:
        raise UsageError(f"cannot import {module_name!r}: {type(error).__name__}: {error}"
                         f"{_raised_at(error)}") from None
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            names = sorted(n for n, v in vars(module).items() if isinstance(v, Pipeline))
            hint = f"; it has the pipeline(s) {', '.join(names)}" if names else ""
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}{hint}")
        value = getattr(value, part)
    if not isinstance(value, Pipeline):
        hint = " (call it in the module and name the result)" if callable(value) else ""
        kind = type(value).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise UsageError(f"{target} is {article} {kind}, not a millstream.Pipeline{hint}")
    try:
        value.validate()
    except PipelineError as error:
        raise UsageError(f"{target}: {error}") from None
    return value


def run_pipeline(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.target)
    if args.runner == "harness":
        return _run_on_harness(pipeline, args)
    from millstream.spark.storage import CredentialsInLocation, check_no_credentials

    try:  # before anything else: the refusal must not repeat them, nor a directory be made of them
        check_no_credentials(args.root, "--root")
    except CredentialsInLocation as error:
        raise UsageError(str(error)) from None
    root = check_writable_directory(args.root, "--root")
    check_master(args.master)
    if args.fresh:
        check_fresh_start(root, LAYOUT_FILE, "a millstream root")
    try:
        from millstream.spark.runner import SparkRunner
    except ImportError as error:
        raise UsageError(f"the Spark runner is not available ({error}); try --runner harness") from None
    if args.fresh:
        delete_for_fresh_start(root, LAYOUT_FILE, "a millstream root")
    try:
        runner = SparkRunner(pipeline, root=root, master=args.master)
    except PipelineError as error:  # e.g. the root holds a run of another pipeline
        raise UsageError(str(error)) from None
    print(f"running {args.target} on Spark ({args.master}); root {root}", flush=True)

    def records_of(progress: Any) -> int:
        return input_records(pipeline, lambda name: progress.computations[name].records
                             if name in progress.computations else 0)

    def snapshot(progress: Any, at_start: int) -> Snapshot:
        injected = [i.low_watermark for i in progress.injectors.values()]
        return snapshot_of_progress(progress, pipeline.topological_order(), records=records_of(progress),
                                    records_at_start=at_start, newest_event=max(injected) if injected else None)

    display = ProgressDisplay(waiting="starting Spark")
    final = run_on_spark(runner, display, snapshot, records_of, timeout=args.timeout)
    _print_summary(pipeline, final, display.elapsed())
    return 0


def _run_on_harness(pipeline: Pipeline, args: argparse.Namespace) -> int:
    from millstream.testing import PipelineHarness

    try:  # run_on_harness follows the clock
        harness = PipelineHarness(pipeline, wall_time=int(time.time() * 1000))
    except PipelineError as error:
        raise UsageError(str(error)) from None
    except Exception as error:  # a computation's setup() raised
        raise harness_failure(pipeline, error) from None
    print(f"running {args.target} in-process (harness: no Spark, sinks not written)", flush=True)

    def snapshot(harness: Any) -> Snapshot:
        return snapshot_of_harness(harness, records=input_records(pipeline, lambda n: harness.metrics(n).records))

    display = ProgressDisplay()
    final = run_on_harness(harness, display, snapshot, timeout=args.timeout)
    _print_summary(pipeline, final, display.elapsed(), sinks_written=False)
    for stream in sorted(s for s in pipeline.streams() if pipeline.producers(s)):
        print(f"  {stream}: {len(harness.output(stream)):,} records")
    return 0


def _print_summary(pipeline: Pipeline, final: Snapshot, elapsed: float, sinks_written: bool = True) -> None:
    rate = RateMeter.overall_of(elapsed, final.records_this_run)
    late = ", ".join(f"{c.name} {c.late:,}" for c in final.computations)
    dead = sum(c.dead_letters or 0 for c in final.computations)
    print(f"done in {elapsed:.0f} s: {final.records_this_run:,} records in this run ({rate:,.0f}/s); "
          f"late: {late}; dead letters: {dead:,}")
    for sink in pipeline.sinks.values() if sinks_written else ():
        print(f"  {sink.stream} -> {sink.path or sink.table or 'writer'}")


if __name__ == "__main__":
    sys.exit(main())
