"""python -m millstream.apps.zeitgeist: generate a search log, find its spikes and dips on Spark.

    python -m millstream.apps.zeitgeist                      # default: ~300k searches, local[*] Spark
    python -m millstream.apps.zeitgeist --queries 40 --minutes 12
    python -m millstream.apps.zeitgeist --fresh              # delete the data dir and start over

Everything lives in --data-dir (default ./zeitgeist-data): config.json (the generator's settings),
run/ (Spark checkpoints and stream logs), anomalies-jsonl/ and anomalies-parquet/ (the sinks),
progress.jsonl, evaluation.json and report.html. Ctrl-C stops cleanly; the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from typing import Any, Callable

from millstream.console.datadir import check_fresh_start, delete_for_fresh_start, settings_for_run
from millstream.console.options import (
    OneLineArgumentParser,
    UsageError,
    check_master,
    check_writable_directory,
    non_negative_int,
    positive_float,
    positive_int,
    quiet_library_warnings,
)
from millstream.console.progress import ProgressDisplay, RateMeter, Snapshot
from millstream.console.running import run_command, run_on_harness, run_on_spark, snapshot_of_harness, snapshot_of_progress

from millstream.apps.zeitgeist.evaluate import detections_from_values, evaluate, format_table
from millstream.apps.zeitgeist.generator import (
    ZeitgeistConfig,
    ZeitgeistInjector,
    delayed_bursts,
    describe,
    ground_truth,
)
from millstream.apps.zeitgeist.pipeline import COMPUTATIONS, INJECTOR, PipelineConfig, build_pipeline
from millstream.model.pipeline import PipelineError

CONFIG_FILE = "config.json"
# CLI option -> generator setting; these define the data, so a resumed run must not change them.
GENERATOR_OPTIONS = {"queries": "queries", "minutes": "minutes", "seed": "seed", "rate": "rate",
                     "day_seconds": "day_seconds"}
PROG = "python -m millstream.apps.zeitgeist"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineArgumentParser(
        prog=PROG,
        description="MillWheel's Zeitgeist on Spark: find spiking and dipping search queries in a generated "
                    "log with injected anomalies, then score the detections against the ground truth.")
    defaults = ZeitgeistConfig()
    parser.add_argument("--queries", type=positive_int, help=f"distinct queries (default {defaults.queries})")
    parser.add_argument("--minutes", type=positive_float, help=f"event-time duration in minutes (default {defaults.minutes:g})")
    parser.add_argument("--seed", type=int, help=f"random seed of the log (default {defaults.seed})")
    parser.add_argument("--rate", type=positive_float, help=f"mean searches per second of event time (default {defaults.rate:g})")
    parser.add_argument("--day-seconds", type=positive_int, dest="day_seconds",
                        help=f"length of one compressed day in event-time seconds (default {defaults.day_seconds})")
    parser.add_argument("--data-dir", default="./zeitgeist-data", help="where everything is kept (default %(default)s)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    parser.add_argument("--fresh", action="store_true", help="delete the data dir first and start over")
    parser.add_argument("--runner", choices=("spark", "harness"), default="spark",
                        help="spark (default) or harness: the in-process test harness, no Spark, no resume")
    parser.add_argument("--records-per-second", type=positive_float, default=None,
                        help="pace the injector in wall time (default: as fast as the pipeline goes)")
    parser.add_argument("--timeout", type=positive_float, default=None, help="give up after this many seconds")
    parser.add_argument("--weak-windower", action="store_true", dest="weak_windower",
                        help="fuse the Windower into the ModelCalculator's query (weak productions, no durable hop)")
    parser.add_argument("--report-queries", type=non_negative_int, default=16, help="queries plotted in report.html")
    return parser.parse_args(argv)


# -- the data directory -----------------------------------------------------------------------------
def asked_generator_options(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, option) for option, name in GENERATOR_OPTIONS.items()
            if getattr(args, option) is not None}


def validate(args: argparse.Namespace) -> None:
    """Every check that needs no change on disk, before anything is deleted, created or started."""
    args.data_dir = check_writable_directory(args.data_dir, "--data-dir")
    if args.fresh:
        check_fresh_start(args.data_dir, CONFIG_FILE, "a Zeitgeist data dir")
    try:
        replace(ZeitgeistConfig(), **asked_generator_options(args))
    except ValueError as error:  # the generator's own limits (e.g. --day-seconds below 12), named as options
        message = str(error)
        for option, name in GENERATOR_OPTIONS.items():
            if message.startswith(name + " "):
                message = f"argument --{option.replace('_', '-')}: {message[len(name) + 1:]}"
        raise UsageError(message) from None
    if args.runner == "spark":
        check_master(args.master)
        try:
            import millstream.spark.runner  # noqa: F401
        except ImportError as error:
            raise UsageError(f"the Spark runner is not available ({error}); try --runner harness") from None


def prepare_data_dir(args: argparse.Namespace) -> tuple[ZeitgeistConfig, bool]:
    """Returns the generator config to run and whether an earlier run is being resumed."""
    if args.fresh:
        delete_for_fresh_start(args.data_dir, CONFIG_FILE, "a Zeitgeist data dir")
    settings, resumed = settings_for_run(args.data_dir, CONFIG_FILE, "generator", asked_generator_options(args),
                                         ZeitgeistConfig().to_json(), "a Zeitgeist data dir",
                                         options=list(GENERATOR_OPTIONS.values()))
    try:
        return ZeitgeistConfig.from_json(settings), resumed
    except (ValueError, TypeError) as error:
        raise UsageError(f"{os.path.join(args.data_dir, CONFIG_FILE)} is unreadable ({error}); add --fresh to "
                         "start over") from None


# -- progress ---------------------------------------------------------------------------------------
def _count_episodes(values: list[dict[str, Any]]) -> tuple[int, int]:
    episodes = {(v["query"], v["kind"], v["episode"]) for v in values}
    spikes = sum(1 for e in episodes if e[1] == "spike")
    return spikes, len(episodes) - spikes


class AnomalyCounter:
    """Spikes and dips found so far, read at most every `every_s` seconds (on Spark it reads the
    committed stream log), and once more at the end."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]], every_s: float = 2.0) -> None:
        self.read = read
        self.every_s = every_s
        self.last = 0.0
        self.counts = (0, 0)

    def __call__(self, force: bool = False) -> tuple[tuple[str, str], ...]:
        now = time.time()
        if force or now - self.last >= self.every_s:
            self.last = now
            try:
                self.counts = _count_episodes(self.read())
            except Exception:  # a half-written log is read again next time
                pass
        return (("spikes", f"{self.counts[0]}"), ("dips", f"{self.counts[1]}"))


class History:
    """progress.jsonl: one sample per progress report (searches in, watermarks, late counts), the
    data of the report's watermark-lag plot."""

    def __init__(self, path: str, injector: ZeitgeistInjector) -> None:
        self.path = path
        self.injector = injector

    def add(self, snapshot: Snapshot, injector_wm: int) -> None:
        sample = {"wall_ms": int(time.time() * 1000), "records": snapshot.records, "max_event": snapshot.newest_event,
                  "injector_wm": injector_wm,
                  "watermarks": {c.name: c.low_watermark for c in snapshot.computations},
                  "late": {c.name: c.late for c in snapshot.computations}}
        with open(self.path, "a", encoding="utf-8") as history:
            history.write(json.dumps(sample) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]


# -- runners ----------------------------------------------------------------------------------------
def run_spark(args: argparse.Namespace, pipeline: Any, injector: ZeitgeistInjector, history: History,
              display: ProgressDisplay) -> dict[str, Any]:
    from millstream.spark.runner import SparkRunner

    try:
        runner = SparkRunner(pipeline, root=os.path.join(args.data_dir, "run"), master=args.master)
    except PipelineError as error:  # e.g. a run made with(out) --weak-windower
        raise UsageError(f"{error}; add --fresh to start over") from None
    anomalies = AnomalyCounter(lambda: [r.value for r in runner.read_stream("anomalies")])

    def searches(progress: Any) -> int:
        # Searches consumed = the Windower's records (the SpikeDetector receives the same searches).
        computation = progress.computations.get("windower")
        return computation.records if computation is not None else 0

    def snapshot(progress: Any, at_start: int) -> Snapshot:
        records = searches(progress)
        shown = snapshot_of_progress(progress, COMPUTATIONS, records=records, total=len(injector.log),
                                     records_at_start=at_start, newest_event=injector.max_emitted(records),
                                     totals=anomalies(force=progress.done))
        history.add(shown, injector.low_watermark("0", {"next": records, "started_ms": None}))
        return shown

    final = run_on_spark(runner, display, snapshot, searches, timeout=args.timeout)
    return {"anomalies": [r.value for r in runner.read_stream("anomalies")],
            "model": [(r.key, r.value) for r in runner.read_stream("model")], "final": final}


def run_harness(args: argparse.Namespace, pipeline: Any, injector: ZeitgeistInjector, history: History,
                display: ProgressDisplay) -> dict[str, Any]:
    from millstream.testing import PipelineHarness

    harness = PipelineHarness(pipeline, wall_time=int(time.time() * 1000))  # run_on_harness follows the clock
    anomalies = AnomalyCounter(lambda: [r.value for r in harness.output("anomalies")], every_s=0.0)

    def snapshot(harness: Any) -> Snapshot:
        records = harness.metrics("windower").records
        shown = snapshot_of_harness(harness, COMPUTATIONS, records=records, total=len(injector.log),
                                    newest_event=injector.max_emitted(records), totals=anomalies())
        history.add(shown, injector.low_watermark("0", {"next": records, "started_ms": None}))
        return shown

    final = run_on_harness(harness, display, snapshot, records_per_step=5_000, timeout=args.timeout)
    values = [r.value for r in harness.output("anomalies")]
    out_dir = os.path.join(args.data_dir, "harness")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "anomalies.jsonl"), "w", encoding="utf-8") as out:
        for value in values:
            out.write(json.dumps(value, sort_keys=True) + "\n")
    return {"anomalies": values, "model": [(r.key, r.value) for r in harness.output("model")], "final": final}


def summary_lines(final: Snapshot, elapsed: float) -> list[str]:
    """The end-of-run summary, from the same snapshot the display showed last."""
    rate = RateMeter.overall_of(elapsed, final.records_this_run)
    resumed = f" ({final.records:,} with the earlier runs)" if final.records_at_start else ""
    late = ", ".join(f"{c.name} {c.late:,}" for c in final.computations if c.name in ("windower", "spike_detector"))
    return [f"finished in {elapsed:.0f} s: {final.records_this_run:,} searches in this run{resumed}, "
            f"{rate:,.0f} searches/s",
            f"late searches dropped: {late} (both receive every search)"]


# -- main -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    quiet_library_warnings()
    return run_command(lambda: _main(argv), PROG)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    validate(args)
    config, resumed = prepare_data_dir(args)
    pipeline = build_pipeline(PipelineConfig(generator=config, output_dir=args.data_dir if args.runner == "spark" else None,
                                             records_per_second=args.records_per_second,
                                             weak_windower=args.weak_windower))
    injector = pipeline.injectors[INJECTOR].injector
    assert isinstance(injector, ZeitgeistInjector)
    total = len(injector.log)  # generated here, counted exactly
    print(f"Zeitgeist: {describe(config, events=total)}")
    resuming = resumed and args.runner == "spark" and os.path.exists(os.path.join(args.data_dir, "run"))
    print(f"data dir {args.data_dir}" + (" (resuming from its checkpoint)" if resuming else ""))
    truth = ground_truth(config)
    if not truth:
        need = math.ceil((1.1 * config.day_seconds + 150) / 60)
        print(f"note: no anomaly fits in {config.minutes:g} minutes: the model learns for a day "
              f"({config.day_seconds} s) first; use --minutes {need} or more, or a shorter --day-seconds")
    history = History(os.path.join(args.data_dir, "progress.jsonl"), injector)
    if args.runner == "harness" and os.path.exists(history.path):
        os.remove(history.path)
    if args.runner == "spark":
        print(f"starting Spark ({args.master}); its log: {os.path.join(args.data_dir, 'run', 'spark.log')}", flush=True)
    display = ProgressDisplay(unit="searches", waiting="starting Spark" if args.runner == "spark" else "starting")
    try:
        if args.runner == "spark":
            result = run_spark(args, pipeline, injector, history, display)
        else:
            result = run_harness(args, pipeline, injector, history, display)
    except KeyboardInterrupt:
        if args.runner == "spark":
            print("\nstopped; run the same command again to resume", file=sys.stderr)
            return 130
        raise
    final: Snapshot = result["final"]
    elapsed = display.elapsed()
    detections = detections_from_values(result["anomalies"])
    bursts = delayed_bursts(config)
    evaluation = evaluate(truth, detections, bursts)
    print()
    for line in summary_lines(final, elapsed):
        print(line)
    print(format_table(evaluation))
    late = {c.name: c.late for c in final.computations}
    with open(os.path.join(args.data_dir, "evaluation.json"), "w", encoding="utf-8") as out:
        json.dump({"config": config.to_json(), "elapsed_s": elapsed, "searches": final.records,
                   "searches_this_run": final.records_this_run, "late": late,
                   "detections": [d.to_json() for d in detections], **evaluation.to_json()}, out, indent=1)
    from millstream.apps.zeitgeist.report import write_report

    report = os.path.join(args.data_dir, "report.html")
    write_report(report, config, evaluation, detections, truth, bursts, result["model"], history.read(), COMPUTATIONS,
                 {"runner": args.runner, "master": args.master if args.runner == "spark" else None,
                  "elapsed_s": round(elapsed, 1), "searches": final.records},
                 max_queries=args.report_queries)
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
