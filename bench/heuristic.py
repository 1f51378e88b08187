"""Heuristic vs strict low watermarks on Zeitgeist's search log (MillWheel section 8.2's "99%").

The log (millstream.apps.zeitgeist.generator, default config: 24 min of event time, ~290k searches)
is out of order by a few hundred ms, 0.2% of it is delayed by 2-25 s, one burst of a few queries is
held back by minutes, and 0.005% is deliberately late (no watermark waits for it). Its injector's
strict watermark is honest: the smallest timestamp still to come.

Each injector is read the way a runner reads it, `--per-read` records at a time (200 ~ one second of
event time, one micro-batch of live input), through the Injector contract alone. Per mode:

- watermark lag: newest event time read so far minus the published watermark, after every read
  (event time stands in for the wall clock: the log is replayed, not live); p50, p95, max;
- late: records stamped behind the watermark published before the read that brings them, as a
  fraction of all records, and how many of them are the deliberately late ones (late under any mode).

Modes: strict (honest), fixed (newest - 2 s, the generator's "naive" mode: a bound chosen by hand),
and HeuristicWatermark at each `--quantile`.

    python -m bench.heuristic [--minutes 24] [--per-read 200] [--quantile 0.99 --quantile 0.999] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import numpy as np

from millstream import HeuristicWatermark
from millstream.apps.zeitgeist.generator import ZeitgeistConfig, ZeitgeistInjector, cached_log
from millstream.model.injector import Injector, Malformed
from millstream.model.records import BEGINNING_OF_TIME, END_OF_TIME


def measure(injector: Injector, late_flags: np.ndarray, per_read: int) -> dict[str, Any]:
    """Read `injector` to the end, `per_read` records at a time; lag and late counts."""
    offset = injector.initial_offset("0")
    watermark = max(BEGINNING_OF_TIME, injector.low_watermark("0", offset))
    newest = None
    lags: list[int] = []
    late = late_deliberate = total = 0
    started = time.perf_counter()
    while True:
        end = injector.latest_offset("0", offset, per_read)
        if end == offset:
            break
        for record in injector.read("0", offset, end):
            if isinstance(record, Malformed):
                continue  # the generated log has none
            index = int(record.id.rsplit("-", 1)[1])  # zq-<n>: the n-th event of the log
            total += 1
            if record.timestamp < watermark:
                late += 1
                late_deliberate += bool(late_flags[index])
            newest = record.timestamp if newest is None else max(newest, record.timestamp)
        watermark = max(watermark, injector.low_watermark("0", end))  # never back, as runners keep it
        if newest is not None and watermark < END_OF_TIME:
            lags.append(newest - watermark)
        offset = end
    seconds = time.perf_counter() - started
    values = np.array(lags, dtype=np.int64)
    return {"records": total, "late": late, "late_deliberate": late_deliberate,
            "late_fraction": late / total if total else 0.0,
            "lag_p50_ms": int(np.percentile(values, 50)), "lag_p95_ms": int(np.percentile(values, 95)),
            "lag_max_ms": int(values.max()), "reads": len(lags), "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=24.0, help="event time of the log (default 24)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-read", type=int, default=200, help="records per read (default 200)")
    parser.add_argument("--quantile", type=float, action="append", default=None,
                        help="heuristic quantile (repeatable; default 0.99 and 0.999)")
    parser.add_argument("--half-life-ms", type=int, default=300_000)
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    quantiles = args.quantile or [0.99, 0.999]
    config = ZeitgeistConfig(minutes=args.minutes, seed=args.seed)
    log = cached_log(config)
    flags = log.late
    modes: dict[str, Injector] = {
        "strict": ZeitgeistInjector(config, max_records_per_read=args.per_read),
        "fixed 2 s": ZeitgeistInjector(config, max_records_per_read=args.per_read, watermark="naive",
                                       naive_bound_ms=2_000),
    }
    for q in quantiles:
        modes[f"heuristic {q:g}"] = HeuristicWatermark(ZeitgeistInjector(config, max_records_per_read=args.per_read),
                                                      q, half_life_ms=args.half_life_ms)
    results = {name: measure(injector, flags, args.per_read) for name, injector in modes.items()}
    print(f"Zeitgeist log: {len(log):,} searches, {config.minutes:g} min of event time, seed {config.seed}; "
          f"{int(log.delayed.sum()):,} delayed on the wire, {int(flags.sum())} deliberately late; "
          f"{args.per_read} records per read")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [("watermark lag p50", lambda r: f"{r['lag_p50_ms'] / 1000:,.2f} s"),
            ("watermark lag p95", lambda r: f"{r['lag_p95_ms'] / 1000:,.2f} s"),
            ("watermark lag max", lambda r: f"{r['lag_max_ms'] / 1000:,.2f} s"),
            ("late records", lambda r: f"{r['late']:,}"),
            ("late fraction", lambda r: f"{100 * r['late_fraction']:.3f}%"),
            ("  of them deliberately late", lambda r: f"{r['late_deliberate']:,}"),
            ("time to read the log", lambda r: f"{r['seconds']:.1f} s")]
    width = max(len(n) for n in results) + 2
    print(f"{'':30}" + "".join(f"{name:>{width}}" for name in results))
    for label, cell in rows:
        print(f"{label:30}" + "".join(f"{cell(r):>{width}}" for r in results.values()))
    report = {"config": config.to_json(), "per_read": args.per_read, "half_life_ms": args.half_life_ms,
              "results": results}
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)
    return report


if __name__ == "__main__":
    main()
