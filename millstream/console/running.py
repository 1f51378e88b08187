"""Running a pipeline from a command: on Spark or on the in-process harness, with the progress
display, and every way it can end turned into one line and an exit code.

Exit codes: 0 done; 1 the run failed (the line says why and which log has the details: on the
harness, which keeps nothing, errors.log in a directory of the pipeline's own under the system's temporary
directory); 2 refused
before anything ran (options.UsageError); 130 interrupted (Ctrl-C; a Spark run resumes when the
same command is run again).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from millstream.console.options import EXIT_USAGE, UsageError
from millstream.console.progress import ComputationStatus, ProgressDisplay, Snapshot
from millstream.model.locations import temporary_log_dir
from millstream.model.pipeline import WALL_TIMER_DRAIN_S, Pipeline, PipelineError
from millstream.model.records import BEGINNING_OF_TIME

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


# The runner's refusals to start (by name: this module does not import Spark): a root another driver
# holds (spark/fencing.py), a rescale to finish first (spark/rescale.py).
REFUSALS_TO_START = ("RootInUse", "UnfinishedRescale")


class RunFailed(Exception):
    """The run failed; the message is one line, naming the log to read."""


def run_command(body: Callable[[], int], program: str) -> int:
    """Call a command's body and turn how it ends into (one line on stderr, exit code)."""
    try:
        return body()
    except UsageError as error:
        print(f"{program}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except RunFailed as error:
        print(f"{program}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{program}: stopped", file=sys.stderr)
        return EXIT_INTERRUPTED


# -- snapshots --------------------------------------------------------------------------------------
def input_records(pipeline: Pipeline, records_of: Callable[[str], int]) -> int:
    """Records read from the injectors so far, counted where they are delivered: per injector stream,
    the most any of its consumers has received (consumers of one stream receive the same records)."""
    total = 0
    for stream in sorted({node.stream for node in pipeline.injectors.values()}):
        consumers = pipeline.consumers(stream)
        total += max((records_of(name) for name in consumers), default=0)
    return total


def snapshot_of_progress(progress: Any, computations: Sequence[str] | None = None, **fields: Any) -> Snapshot:
    """A Snapshot of a SparkRunner PipelineProgress (dead letters shown once the runner reports them)."""
    names = list(computations) if computations is not None else list(progress.computations)
    rows = []
    for name in names:
        c = progress.computations.get(name)
        if c is None:
            rows.append(ComputationStatus(name, BEGINNING_OF_TIME, 0, 0))
            continue
        rows.append(ComputationStatus(name, c.low_watermark, c.records, c.late, getattr(c, "dead_letters", None)))
    return Snapshot(computations=tuple(rows), **fields)


def snapshot_of_harness(harness: Any, computations: Sequence[str] | None = None, **fields: Any) -> Snapshot:
    """A Snapshot of a PipelineHarness."""
    names = list(computations) if computations is not None else harness.pipeline.topological_order()
    rows = tuple(ComputationStatus(name, harness.low_watermark(name), harness.metrics(name).records,
                                   harness.metrics(name).late, harness.metrics(name).dead_letters)
                 for name in names)
    return Snapshot(computations=rows, **fields)


# -- running ----------------------------------------------------------------------------------------
def log_files(runner: Any) -> tuple[str, str]:
    """Where the Spark runner keeps the JVM's output and the failures' full traces."""
    directory = str(getattr(runner, "log_dir", None) or getattr(runner, "root", "."))
    return os.path.join(directory, "spark.log"), os.path.join(directory, "errors.log")


def run_on_spark(runner: Any, display: ProgressDisplay, snapshot: Callable[[Any, int], Snapshot],
                 records_of: Callable[[Any], int], timeout: float | None = None) -> Snapshot:
    """Run `runner` (a SparkRunner) to the end under `display`; returns the final snapshot.

    `records_of(progress)` counts the input records in a progress report; `snapshot(progress,
    records_at_start)` makes the display's snapshot. The records already read before this process
    (a resumed run) are taken from the stored progress before Spark starts, so rates cover this run.
    """
    spark_log, errors_log = log_files(runner)
    try:
        at_start = records_of(runner.progress())
    except Exception:  # nothing stored yet, or unreadable: count from zero
        at_start = 0
    final: Snapshot | None = None
    try:
        with display:
            def on_progress(progress: Any) -> None:
                display.update(snapshot(progress, at_start))

            progress = runner.run(on_progress=on_progress, progress_interval=1.0, timeout=timeout)
            final = snapshot(progress, at_start)
            display.update(final)
    except KeyboardInterrupt:
        raise
    except TimeoutError:
        raise RunFailed(f"not finished after {timeout:g} s; run the same command again to continue") from None
    except Exception as error:
        if type(error).__name__ in REFUSALS_TO_START:  # nothing failed: the message says what to do
            raise RunFailed(_first_line(error)) from None
        if isinstance(error, PipelineError):  # refused as it starts (what cannot be sent to Spark's workers)
            raise UsageError(_first_line(error)) from None
        if type(error).__name__ == "MillstreamRunError":  # the runner's own report: what failed, where the trace is
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            pointer = f" {lines[-1]}" if len(lines) > 1 and "errors.log" in lines[-1] else ""
            raise RunFailed(f"{_first_line(error)}{pointer}; the checkpoint is intact: fix it and run the same "
                            "command again to resume") from None
        _append_trace(errors_log, error)
        raise RunFailed(f"Spark failed: {_first_line(error)} (details in {spark_log} and {errors_log})") from None
    return final


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = text[0].strip() if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _append_trace(path: str, error: BaseException) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"--- run failed at {time.ctime()}\n")
            log.write("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    except OSError:
        pass


def run_on_harness(harness: Any, display: ProgressDisplay, snapshot: Callable[[Any], Snapshot],
                   records_per_step: int = 5_000, timeout: float | None = None,
                   wall_timer_drain_s: float = WALL_TIMER_DRAIN_S) -> Snapshot:
    """Pull the harness's injectors and step it until everything settled, under `display`, its wall
    clock following the real one (create the harness with `wall_time=` now): settled means every
    injector partition finished or declared itself idle (a rate-limited input is waited for), nothing
    moves, and nothing would within `wall_timer_drain_s` (a wall-time timer falling due, an input
    declaring itself idle), as SparkRunner.run waits (which also waits for idle inputs to finish)."""
    try:
        return _run_on_harness(harness, display, snapshot, records_per_step, timeout, wall_timer_drain_s)
    except (KeyboardInterrupt, RunFailed):
        raise
    except Exception as error:
        raise harness_failure(harness.pipeline, error) from None


def harness_log(pipeline: Pipeline) -> str:
    """Where a harness run of `pipeline` keeps the full traces of its failures (it has no root)."""
    return os.path.join(temporary_log_dir(pipeline.name), "errors.log")


def harness_failure(pipeline: Pipeline, error: Exception) -> RunFailed:
    """A run of `pipeline` on the harness failed with `error` (user code raised, a value its codec
    refused, an injector's bad record, ...): its full trace appended to harness_log, and one line
    saying what failed (millstream's own errors name the computation, key and record) and where the
    trace is, as on Spark."""
    errors_log = harness_log(pipeline)
    _append_trace(errors_log, error)
    line = _first_line(error)
    if not type(error).__module__.startswith("millstream."):  # the user's own exception, as it was raised
        line = f"{type(error).__name__}: {line}"
    return RunFailed(f"{line} (full trace in {errors_log})")


def _run_on_harness(harness: Any, display: ProgressDisplay, snapshot: Callable[[Any], Snapshot],
                    records_per_step: int, timeout: float | None, wall_timer_drain_s: float) -> Snapshot:
    started = time.time()
    last = 0.0
    with display:
        while True:
            harness.advance_wall_time(max(harness.wall_time, int(time.time() * 1000)))
            moved = harness.pull_injectors(records_per_step)
            busy = harness.step()
            now = time.time()
            if now - last >= 0.5:
                last = now
                display.update(snapshot(harness))
            if not moved and not busy:
                due = harness.next_wall_change()
                if due is not None and due <= now * 1000 + wall_timer_drain_s * 1000:
                    time.sleep(min(0.2, max(0.0, due / 1000 - now)))
                elif harness.inputs_to_come():
                    time.sleep(0.05)  # an input with more to come later (a rate, a live source)
                else:
                    break
            if timeout is not None and now - started > timeout:
                raise RunFailed(f"not finished after {timeout:g} s")
        final = snapshot(harness)
        display.update(final)
    return final
