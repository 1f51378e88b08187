"""A driver for the fencing tests: counts records per key, runs until told to stop or taken over."""

import argparse
import json
import sys

from millstream import Computation, GeneratorInjector, Pipeline, Record, ValueState

KEYS = 6


class RunningCount(Computation):
    n = ValueState[int]("n", default=0)

    def process_record(self, ctx, record):
        ctx.state(self.n).set(ctx.state(self.n).get() + 1)
        ctx.produce(Record(ctx.key, ctx.state(self.n).get(), record.timestamp), "counts")


def pipeline(events: int, rate: float) -> Pipeline:
    injector = GeneratorInjector(lambda i: Record(f"k{i % KEYS}", i, i), events, lambda n: n,
                                 records_per_second=rate, max_records_per_read=200)
    return (Pipeline("fenced").add_injector("src", injector, "in")
            .add_computation("count", RunningCount(), ["in"], ["counts"]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--checkpoint-root", default=None)
    parser.add_argument("--takeover", action="store_true")
    parser.add_argument("--events", type=int, default=3_000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from millstream.spark.runner import SparkRunner

    try:
        runner = SparkRunner(pipeline(args.events, args.rate), root=args.root, master="local[2]",
                             checkpoint_root=args.checkpoint_root, takeover=args.takeover)
        runner.run(timeout=args.timeout)
    except Exception as error:
        with open(args.out, "w") as out:
            json.dump({"error": f"{type(error).__name__}: {error}"}, out)
        return 3
    with open(args.out, "w") as out:
        json.dump({"ok": True}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
