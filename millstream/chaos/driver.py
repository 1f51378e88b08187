"""One driver of the chaos pipeline (started, and killed, by `python -m millstream.chaos`)."""

from __future__ import annotations

import argparse
import os
import sys

from millstream.chaos.pipeline import ChaosSpec, build_pipeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m millstream.chaos.driver")
    parser.add_argument("--root", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--accounts", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--lottery-exactly-once-off", action="store_true")
    args = parser.parse_args(argv)
    from millstream.spark.runner import BatchPacing, SparkRunner

    spec = ChaosSpec(events=args.events, accounts=args.accounts, seed=args.seed, records_per_second=args.rate)
    pipeline = build_pipeline(spec, os.path.join(args.root, "sinks"), not args.lottery_exactly_once_off)
    # Small paced batches: many batches to kill between. The input is paced, so only the backlog a
    # restart finds fills them: the batches after each kill are the ones pacing resizes (pacing.py).
    runner = SparkRunner(pipeline, root=os.path.join(args.root, "run"), master=args.master,
                         batch_pacing=BatchPacing(target_ms=1_000, first=200, floor=50, ceiling=2_000))
    runner.run(timeout=3_600, wall_timer_drain_s=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
