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
import shutil
import sys
import time
import warnings
from dataclasses import replace
from typing import Any, Callable

from millstream.apps.zeitgeist.evaluate import detections_from_values, evaluate, format_table
from millstream.apps.zeitgeist.generator import (
    ZeitgeistConfig,
    ZeitgeistInjector,
    delayed_bursts,
    describe,
    ground_truth,
)
from millstream.apps.zeitgeist.pipeline import COMPUTATIONS, INJECTOR, PipelineConfig, build_pipeline
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME

CONFIG_FILE = "config.json"
# CLI option -> generator setting; these define the data, so a resumed run must not change them.
GENERATOR_OPTIONS = {"queries": "queries", "minutes": "minutes", "seed": "seed", "rate": "rate",
                     "day_seconds": "day_seconds"}
SHORT = {"windower": "win", "model_calculator": "model", "spike_detector": "spike", "dip_detector": "dip"}


class UsageError(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m millstream.apps.zeitgeist",
        description="MillWheel's Zeitgeist on Spark: find spiking and dipping search queries in a generated "
                    "log with injected anomalies, then score the detections against the ground truth.")
    defaults = ZeitgeistConfig()
    parser.add_argument("--queries", type=int, help=f"distinct queries (default {defaults.queries})")
    parser.add_argument("--minutes", type=float, help=f"event-time duration in minutes (default {defaults.minutes:g})")
    parser.add_argument("--seed", type=int, help=f"random seed of the log (default {defaults.seed})")
    parser.add_argument("--rate", type=float, help=f"mean searches per second of event time (default {defaults.rate:g})")
    parser.add_argument("--day-seconds", type=int, dest="day_seconds",
                        help=f"length of one compressed day in event-time seconds (default {defaults.day_seconds})")
    parser.add_argument("--data-dir", default="./zeitgeist-data", help="where everything is kept (default %(default)s)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    parser.add_argument("--fresh", action="store_true", help="delete the data dir first and start over")
    parser.add_argument("--runner", choices=("spark", "harness"), default="spark",
                        help="spark (default) or harness: the in-process test harness, no Spark, no resume")
    parser.add_argument("--records-per-second", type=float, default=None,
                        help="pace the injector in wall time (default: as fast as the pipeline goes)")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    parser.add_argument("--weak-windower", action="store_true", dest="weak_windower",
                        help="fuse the Windower into the ModelCalculator's query (weak productions, no durable hop)")
    parser.add_argument("--report-queries", type=int, default=16, help="queries plotted in report.html")
    return parser.parse_args(argv)


# -- the data directory -----------------------------------------------------------------------------
def _flags(config: dict[str, Any]) -> str:
    return " ".join(f"--{option.replace('_', '-')} {config[name]:g}" if isinstance(config[name], float)
                    else f"--{option.replace('_', '-')} {config[name]}" for option, name in GENERATOR_OPTIONS.items())


def prepare_data_dir(args: argparse.Namespace) -> tuple[ZeitgeistConfig, bool]:
    """Returns the generator config to run and whether an earlier run is being resumed."""
    data_dir = args.data_dir
    if args.fresh and os.path.exists(data_dir):
        # Only ever delete what this app made: a data dir has our config file (or is empty).
        if os.path.isdir(data_dir) and os.listdir(data_dir) and not os.path.exists(os.path.join(data_dir, CONFIG_FILE)):
            raise UsageError(f"--fresh would delete {data_dir}, which is not a Zeitgeist data dir (no {CONFIG_FILE} "
                             "in it); delete it yourself or pick another --data-dir")
        shutil.rmtree(data_dir)
    asked = {name: getattr(args, option) for option, name in GENERATOR_OPTIONS.items()
             if getattr(args, option) is not None}
    path = os.path.join(data_dir, CONFIG_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as stored_file:
            stored = ZeitgeistConfig.from_json(json.load(stored_file)["generator"])
        stored_json = stored.to_json()
        different = {name: value for name, value in asked.items() if stored_json[name] != value}
        if different:
            raise UsageError(
                f"{data_dir} holds a run made with {_flags(stored_json)}, but this command asks for "
                + ", ".join(f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
                            for k, v in different.items())
                + ".\nRun the same options again to resume it (or no generator options at all), or add --fresh to "
                  "delete it and start over, or pick another --data-dir.")
        return stored, True
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        raise UsageError(f"{data_dir} is not empty and holds no {CONFIG_FILE}: it is not a Zeitgeist data dir; "
                         "pick another --data-dir")
    config = replace(ZeitgeistConfig(), **asked)
    os.makedirs(data_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump({"generator": config.to_json(), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}, out, indent=1)
    os.replace(tmp, path)
    return config, False


# -- progress ---------------------------------------------------------------------------------------
def _seconds(ms: float) -> str:
    return f"{ms / 1000:.1f}s"


class ProgressDisplay:
    """One line, refreshed in place on a terminal; a plain line every `plain_every` s otherwise.
    Also appends a sample per call to progress.jsonl (for the report's watermark-lag plot)."""

    def __init__(self, injector: ZeitgeistInjector, total: int, history_path: str,
                 count_anomalies: Callable[[], tuple[int, int]], stream: Any = None, plain_every: float = 10.0):
        self.injector = injector
        self.total = total
        self.history_path = history_path
        self.count_anomalies = count_anomalies
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.plain_every = plain_every
        self.started = time.time()
        self.last_plain = 0.0
        self.samples: list[tuple[float, int]] = []
        self.rate = 0.0
        self.anomalies = (0, 0)
        self.last_anomaly_check = 0.0

    def update(self, records: int, injector_wm: int, watermarks: dict[str, int], late: dict[str, int],
               force: bool = False) -> None:
        now = time.time()
        # records/s over the last ~30 s (Spark reports progress per micro-batch, in steps)
        self.samples.append((now, records))
        while len(self.samples) > 2 and now - self.samples[1][0] >= 30.0:
            self.samples.pop(0)
        first_time, first_records = self.samples[0]
        self.rate = (records - first_records) / (now - first_time) if now > first_time else 0.0
        max_event = self.injector.max_emitted(records)
        with open(self.history_path, "a", encoding="utf-8") as history:
            history.write(json.dumps({"wall_ms": int(now * 1000), "records": records, "max_event": max_event,
                                      "injector_wm": injector_wm, "watermarks": watermarks, "late": late}) + "\n")
        if now - self.last_anomaly_check >= 2.0 or force:
            self.last_anomaly_check = now
            try:
                self.anomalies = self.count_anomalies()
            except Exception:  # a half-written log is read again next time
                pass
        parts = [f"{_seconds((now - self.started) * 1000)}",
                 f"in {records:,}/{self.total:,} ({records / max(1, self.total):.0%})", f"{self.rate:,.0f} rec/s"]
        start = self.injector.config.start_ms
        for name, wm in watermarks.items():
            if wm >= END_OF_TIME:
                shown = "done"
            elif wm <= BEGINNING_OF_TIME or records == 0 or wm < start:
                shown = "-"
            else:  # the low watermark as event time since the log's start, and its lag
                at = (wm - start) // 1000
                shown = f"{at // 60}:{at % 60:02d} lag {_seconds(max(0, max_event - wm))}"
            parts.append(f"{SHORT.get(name, name)} {shown}")
        parts.append(f"late {sum(late.values())}")
        parts.append(f"anomalies {self.anomalies[0]} spikes {self.anomalies[1]} dips")
        line = " | ".join(parts)
        if self.tty:
            width = shutil.get_terminal_size((160, 20)).columns - 1
            self.stream.write("\r" + line[:width].ljust(width))
            self.stream.flush()
        elif force or now - self.last_plain >= self.plain_every:
            self.last_plain = now
            self.stream.write(line + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _count_episodes(values: list[dict[str, Any]]) -> tuple[int, int]:
    episodes = {(v["query"], v["kind"], v["episode"]) for v in values}
    spikes = sum(1 for e in episodes if e[1] == "spike")
    return spikes, len(episodes) - spikes


# -- runners ----------------------------------------------------------------------------------------
def run_spark(args: argparse.Namespace, pipeline: Any, display_factory: Callable[..., ProgressDisplay]) -> dict[str, Any]:
    from millstream.spark.runner import SparkRunner

    runner = SparkRunner(pipeline, root=os.path.join(args.data_dir, "run"), master=args.master)
    display = display_factory(lambda: _count_episodes([r.value for r in runner.read_stream("anomalies")]))

    injector = pipeline.injectors[INJECTOR].injector

    def on_progress(progress: Any) -> None:
        # Searches consumed = the Windower's records (the runner's per-injector count also includes
        # the SpikeDetector's other input); the injector's watermark is the one after those searches.
        records = progress.computations["windower"].records if "windower" in progress.computations else 0
        display.update(records, injector.low_watermark({"next": records, "started_ms": None}),
                       {name: progress.computations[name].low_watermark for name in COMPUTATIONS},
                       {name: progress.computations[name].late for name in COMPUTATIONS})

    started = time.time()
    try:
        final = runner.run(on_progress=on_progress, progress_interval=1.0, timeout=args.timeout)
        display.last_anomaly_check = 0.0  # count the anomalies once more, all committed now
        on_progress(final)
    finally:
        display.finish()
    elapsed = time.time() - started
    anomalies = [r.value for r in runner.read_stream("anomalies")]
    model = [(r.key, r.value) for r in runner.read_stream("model")]
    progress = runner.progress()
    late = {name: progress.computations[name].late for name in COMPUTATIONS}
    return {"anomalies": anomalies, "model": model, "elapsed": elapsed, "late": late}


def run_harness(args: argparse.Namespace, pipeline: Any, display_factory: Callable[..., ProgressDisplay],
                step_records: int = 5_000) -> dict[str, Any]:
    from millstream.testing import PipelineHarness

    harness = PipelineHarness(pipeline)
    display = display_factory(lambda: _count_episodes([r.value for r in harness.output("anomalies")]))
    injector = pipeline.injectors[INJECTOR].injector
    started = time.time()
    last = 0.0
    try:
        for _ in range(1_000_000):
            moved = harness.pull_injectors(step_records)
            busy = harness.step()
            now = time.time()
            if now - last >= 1.0:
                last = now
                records = harness.metrics("windower").records
                display.update(records, injector.low_watermark({"next": records}),
                               {name: harness.low_watermark(name) for name in COMPUTATIONS},
                               {name: harness.metrics(name).late for name in COMPUTATIONS})
            if not moved and not busy:
                break
            if args.timeout is not None and now - started > args.timeout:
                raise TimeoutError(f"not finished after {args.timeout} s")
        records = harness.metrics("windower").records
        display.update(records, END_OF_TIME, {name: harness.low_watermark(name) for name in COMPUTATIONS},
                       {name: harness.metrics(name).late for name in COMPUTATIONS}, force=True)
    finally:
        display.finish()
    anomalies = [r.value for r in harness.output("anomalies")]
    out_dir = os.path.join(args.data_dir, "harness")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "anomalies.jsonl"), "w", encoding="utf-8") as out:
        for value in anomalies:
            out.write(json.dumps(value, sort_keys=True) + "\n")
    return {"anomalies": anomalies, "model": [(r.key, r.value) for r in harness.output("model")],
            "elapsed": time.time() - started, "late": {name: harness.metrics(name).late for name in COMPUTATIONS}}


# -- main -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
    args = parse_args(argv)
    args.data_dir = os.path.abspath(args.data_dir)
    try:
        config, resumed = prepare_data_dir(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.runner == "spark":
        try:
            import millstream.spark.runner  # noqa: F401
        except ImportError as error:
            print(f"error: the Spark runner is not available ({error}); try --runner harness", file=sys.stderr)
            return 2
    pipeline = build_pipeline(PipelineConfig(generator=config, output_dir=args.data_dir if args.runner == "spark" else None,
                                             records_per_second=args.records_per_second,
                                             weak_windower=args.weak_windower))
    injector: ZeitgeistInjector = pipeline.injectors[INJECTOR].injector
    print(f"Zeitgeist: {describe(config)}")
    resuming = resumed and os.path.exists(os.path.join(args.data_dir, "run"))
    print(f"data dir {args.data_dir}" + (" (resuming from its checkpoint)" if resuming and args.runner == "spark"
                                          else ""))
    truth = ground_truth(config)
    if not truth:
        need = math.ceil((1.1 * config.day_seconds + 150) / 60)
        print(f"note: no anomaly fits in {config.minutes:g} minutes: the model learns for a day "
              f"({config.day_seconds} s) first; use --minutes {need} or more, or a shorter --day-seconds")
    total = len(injector.log)
    history_path = os.path.join(args.data_dir, "progress.jsonl")
    if args.runner == "harness" and os.path.exists(history_path):
        os.remove(history_path)

    if args.runner == "spark":
        print(f"starting Spark ({args.master}); the first micro-batches take a while")

    def display_factory(count: Callable[[], tuple[int, int]]) -> ProgressDisplay:
        return ProgressDisplay(injector, total, history_path, count)

    try:
        if args.runner == "spark":
            result = run_spark(args, pipeline, display_factory)
        else:
            result = run_harness(args, pipeline, display_factory)
    except KeyboardInterrupt:
        print("\nstopped; run the same command again to resume" if args.runner == "spark" else "\nstopped",
              file=sys.stderr)
        return 130
    except TimeoutError as error:
        print(f"\nerror: {error}; run the same command again to continue", file=sys.stderr)
        return 1
    except Exception as error:
        if type(error).__name__ != "MillstreamRunError":
            raise
        print(f"\nerror: {error}\nThe checkpoint is intact: run the same command again to resume.", file=sys.stderr)
        return 1

    detections = detections_from_values(result["anomalies"])
    bursts = delayed_bursts(config)
    evaluation = evaluate(truth, detections, bursts)
    print(f"\nfinished in {result['elapsed']:.0f} s ({total / max(result['elapsed'], 1e-9):,.0f} searches/s); "
          f"late searches dropped: {result['late'].get('windower', 0)}")
    print(format_table(evaluation))
    with open(os.path.join(args.data_dir, "evaluation.json"), "w", encoding="utf-8") as out:
        json.dump({"config": config.to_json(), "elapsed_s": result["elapsed"], "late": result["late"],
                   "detections": [d.to_json() for d in detections], **evaluation.to_json()}, out, indent=1)
    history = []
    if os.path.exists(history_path):
        with open(history_path, encoding="utf-8") as lines:
            history = [json.loads(line) for line in lines if line.strip()]
    from millstream.apps.zeitgeist.report import write_report

    report = os.path.join(args.data_dir, "report.html")
    write_report(report, config, evaluation, detections, truth, bursts, result["model"], history, COMPUTATIONS,
                 {"runner": args.runner, "master": args.master if args.runner == "spark" else None,
                  "elapsed_s": round(result["elapsed"], 1), "searches": total},
                 max_queries=args.report_queries)
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
